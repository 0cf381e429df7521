"""A sandbox's disk bound (a template's ``disk_mb``, serve's ``--sandbox-disk-mb``) with the official SDK against a
real ``execspace serve``: its workspace is a filesystem of that size of its own, so a write past it fails in the
sandbox with "No space left on device" while the sandbox and the others go on; ``/tmp`` is bounded too; ``get_info``
reports it; kill, shutdown and the next server after a killed one leave no mount and no image behind."""

from __future__ import annotations

import io
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import CommandExitException, NotEnoughSpaceException, Sandbox

from tests.support import mount_points_under, until

from .conftest import Server, configured_server, running_server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox's disk bound is a filesystem mounted as root")

CONFIG = """
[templates.disky]
disk_mb = 20
"""
_FILL = "dd if=/dev/zero of={} bs=1M count={} 2>&1"


def _sdk(server: Server) -> dict[str, str]:
    return {"api_key": server.key, "api_url": server.url, "sandbox_url": server.url}


def _disk_size_mb(server: Server, sandbox: Sandbox) -> int:
    """``diskSizeMB`` of the sandbox's info, as served (the SDK's ``SandboxInfo`` does not carry it)."""
    url = f"{server.url}/sandboxes/{sandbox.sandbox_id}"
    with urllib.request.urlopen(urllib.request.Request(url, headers={"X-API-KEY": server.key}), timeout=10) as answer:
        size: int = json.load(answer)["diskSizeMB"]
    return size


def _laid_out(ws_dir: str) -> bool:
    return os.path.exists(f"{ws_dir}/metadata.json")


def _images(root: Path) -> set[str]:
    disks = root / ".disks"
    return set(os.listdir(disks)) if disks.exists() else set()


@pytest.fixture(scope="module")
def disky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with configured_server(tmp_path_factory.mktemp("disky"), CONFIG, "--pool-size", "disky=1") as server:
        yield server
    assert mount_points_under(server.root) == set() and _images(server.root) == set()  # shutdown: the pooled one's too


def test_an_upload_past_the_disk_bound_is_507_and_leaves_nothing(disky: Server) -> None:
    sbx = Sandbox.create(template="disky", **_sdk(disky))
    try:
        with pytest.raises(NotEnoughSpaceException, match="disk is full"):
            sbx.files.write("big.bin", io.BytesIO(bytes(30 * 1024 * 1024)))
        assert [e.name for e in sbx.files.list("/home/user") if e.name.startswith((".big", "big"))] == []
        sbx.files.write("small.bin", io.BytesIO(bytes(5 * 1024 * 1024)))  # the space is back
        assert sbx.files.get_info("small.bin").size == 5 * 1024 * 1024
    finally:
        sbx.kill()


def test_a_templates_disk_bound_holds_and_is_reported(disky: Server) -> None:
    sbx = Sandbox.create(template="disky", **_sdk(disky))
    other = Sandbox.create(template="disky", **_sdk(disky))
    try:
        assert _disk_size_mb(disky, sbx) == 20
        with pytest.raises(CommandExitException) as full:
            sbx.commands.run(_FILL.format("big", 30), timeout=60)
        assert full.value.exit_code == 1 and "No space left on device" in full.value.stdout
        refill = "rm big; dd if=/dev/zero of=f bs=1M count=5 2>/dev/null; wc -c < f"
        assert sbx.commands.run(refill).stdout == "5242880\n"  # the sandbox goes on
        with pytest.raises(CommandExitException) as tmp:
            sbx.commands.run(_FILL.format("/tmp/big", 30), timeout=60)
        assert "No space left on device" in tmp.value.stdout
        assert other.commands.run(_FILL.format("g", 15), timeout=60).exit_code == 0  # a disk of its own
    finally:
        other.kill()
    assert len(mount_points_under(disky.root)) == len(_images(disky.root)) >= 2  # the live one and the pooled one
    ws = {p for p in mount_points_under(disky.root) if sbx.sandbox_id in p}
    assert len(ws) == 1
    sbx.kill()
    until("the killed sandbox's disk removed", lambda: not ws & mount_points_under(disky.root))
    assert not any(sbx.sandbox_id in name for name in _images(disky.root))
    assert len(mount_points_under(disky.root)) == len(_images(disky.root))


def test_a_killed_servers_disks_are_removed_by_the_next_one(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    with running_server(root, "--sandbox-disk-mb", "20") as first:
        sandbox = Sandbox.create(**_sdk(first))
        assert _disk_size_mb(first, sandbox) == 20
        sandbox.files.write("/home/user/kept.txt", "left behind")
        # ours and the pool's two, each on its disk and laid out (one killed before is test_session_limits')
        until("the pool filled", lambda: len({p for p in mount_points_under(root) if _laid_out(p)}) >= 3)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=20)
    assert len(mount_points_under(root)) == len(_images(root)) == 3  # killed: nothing of it could remove anything
    with running_server(root, "--pool-size", "0"):
        until("the dead server's disk removed", lambda: not mount_points_under(root) and not _images(root))
    assert not any(sandbox.sandbox_id in name for name in os.listdir(root))
