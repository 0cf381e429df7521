"""The sandbox probe's cache: only successes, keyed by what the verdict depends on, private, expiring."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from execspace.backends.sandbox.probecache import ProbeCache
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


@pytest.mark.parametrize("where", ["file", "directory"])
def test_entry_others_could_write_is_not_read(tmp_path: Path, where: str) -> None:
    cache = ProbeCache(tmp_path / "c")
    key = cache.key(BWRAP, b"f")
    cache.put(key, Probe(True, "ok"))
    target = cache.directory / "sandbox-probe.json" if where == "file" else cache.directory
    target.chmod(target.stat().st_mode | stat.S_IWGRP)
    assert cache.get(key) is None


@pytest.mark.parametrize("content", ["not json", "[]", '{"key": 1}'])
def test_garbage_is_a_miss(tmp_path: Path, content: str) -> None:
    cache = ProbeCache(tmp_path)
    (tmp_path / "sandbox-probe.json").write_text(content)
    assert cache.get(cache.key(BWRAP, b"f")) is None
