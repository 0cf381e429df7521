"""The sandbox probe's cache: only successes, keyed by what the verdict depends on, private, expiring."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from execspace.backends.sandbox.probecache import BpfCache, ProbeCache
from execspace.backends.sandbox.seccomp import KernelSeccompFilters, SeccompFilters
from execspace.registry import Probe

BWRAP = shutil.which("bwrap") or "/bin/sh"  # any existing binary works for the key


def test_success_is_remembered_failure_is_not(tmp_path: Path) -> None:
    cache = ProbeCache(tmp_path / "c")
    key = cache.key(BWRAP, b"filter")
    assert cache.get(key) is None
    cache.put(key, Probe(False, "userns disabled"))
    assert cache.get(key) is None
    cache.put(key, Probe(True, "ok here"))
    hit = cache.get(key)
    assert hit is not None and hit.ok and "cached" in hit.reason
    assert stat.S_IMODE((tmp_path / "c" / "sandbox-probe.json").stat().st_mode) == 0o600


def test_key_follows_filter_and_binary(tmp_path: Path) -> None:
    cache = ProbeCache(tmp_path)
    assert cache.key(BWRAP, b"a") != cache.key(BWRAP, b"b")
    other = tmp_path / "bwrap-copy"
    shutil.copy(BWRAP, other)
    assert cache.key(str(other), b"a") != cache.key(BWRAP, b"a")


def test_entries_expire(tmp_path: Path) -> None:
    cache = ProbeCache(tmp_path, ttl=0.0)
    key = cache.key(BWRAP, b"f")
    cache.put(key, Probe(True, "ok"))
    assert cache.get(key) is None


def test_planted_symlink_is_not_read(tmp_path: Path) -> None:
    cache = ProbeCache(tmp_path)
    key = cache.key(BWRAP, b"f")
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({"key": key, "at": 9e99, "reason": "forged"}))
    os.symlink(forged, tmp_path / "sandbox-probe.json")
    assert cache.get(key) is None


@pytest.mark.parametrize("content", ["not json", "[]", '{"key": 1}'])
def test_garbage_is_a_miss(tmp_path: Path, content: str) -> None:
    cache = ProbeCache(tmp_path)
    (tmp_path / "sandbox-probe.json").write_text(content)
    assert cache.get(cache.key(BWRAP, b"f")) is None


# -- compiled seccomp programs ---------------------------------------------------------------

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="seccomp filters are built on Linux only")

_WARM = """
import sys
from pathlib import Path
from execspace.backends.sandbox.probecache import BpfCache
from execspace.backends.sandbox.seccomp import SeccompFilters
data = SeccompFilters(BpfCache(Path(sys.argv[1]))).bpf(network_restricted=True)
sys.stdout.write(f"{'pyseccomp' in sys.modules} {data.hex()}")
"""


@linux_only
def test_a_new_process_reuses_the_compiled_filter_without_libseccomp(tmp_path: Path) -> None:
    built = SeccompFilters(BpfCache(tmp_path)).bpf(network_restricted=True)
    [file] = tmp_path.glob("seccomp-*.bpf")
    assert stat.S_IMODE(file.stat().st_mode) == 0o600 and file.read_bytes() == built
    run = subprocess.run([sys.executable, "-c", _WARM, str(tmp_path)], capture_output=True, text=True, check=True)
    loaded, data = run.stdout.split()
    assert (loaded, bytes.fromhex(data)) == ("False", built)


@linux_only
def test_each_rule_set_has_its_own_entry(tmp_path: Path) -> None:
    cache = BpfCache(tmp_path)
    plain, kernel = SeccompFilters(cache), KernelSeccompFilters(cache)
    programs = {plain.bpf(True), plain.bpf(False), kernel.bpf(True), kernel.unix_lock_bpf()}
    assert len(programs) == 4 and len(list(tmp_path.glob("seccomp-*.bpf"))) == 4


@linux_only
@pytest.mark.parametrize("damage", ["truncated", "expired", "symlink"])
def test_a_damaged_entry_is_rebuilt_not_used(tmp_path: Path, damage: str) -> None:
    good = SeccompFilters(BpfCache(tmp_path)).bpf(True)
    [file] = tmp_path.glob("seccomp-*.bpf")
    if damage == "truncated":
        file.write_bytes(good[:-3])  # not a whole number of instructions
    elif damage == "expired":
        os.utime(file, (0, 0))
    else:
        forged = tmp_path / "forged"
        forged.write_bytes(b"\x06\x00\x00\x00\x00\x00\xff\x7f")  # one instruction: allow everything
        file.unlink()
        file.symlink_to(forged)
    assert SeccompFilters(BpfCache(tmp_path)).bpf(True) == good
    assert not file.is_symlink() and file.read_bytes() == good
