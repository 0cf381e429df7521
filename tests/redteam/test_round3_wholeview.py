"""Round 3, ``execspace serve``'s file API over a machine sandbox's whole view (``/tmp``, ``/etc``, ``/opt``):
paths outside ``/home/user`` are served by the file agent run inside the sandbox as ``user``. A tenant plants links,
names ``/proc`` and other sandboxes' paths, and writes where only root may; the host, other sandboxes and the
server process must stay out of reach. Each case observes the host (its files, the server's liveness) or another
sandbox, against a real ``execspace serve`` subprocess driven by the official SDK."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("e2b", reason="the server is attacked through the official e2b SDK (pip install 'execspace[dev]')")

from e2b import Sandbox, SandboxException
from e2b.sandbox.commands.command_handle import CommandExitException

from tests.server.conftest import Server, running_server

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="serve's sandboxes are machines as root only (machine mode)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve")) as found:
        yield found


def _create(server: Server) -> Sandbox:
    return Sandbox.create(api_key=server.key, api_url=server.url, sandbox_url=server.url, timeout=300)


@pytest.fixture
def sbx(server: Server) -> Iterator[Sandbox]:
    sandbox = _create(server)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def _sh(sbx: Sandbox, cmd: str) -> tuple[int, str]:
    try:
        r = sbx.commands.run(cmd, timeout=60)
        return r.exit_code, r.stdout
    except CommandExitException as e:
        return e.exit_code, e.stdout + e.stderr


def test_a_link_planted_outside_the_home_is_never_followed(sbx: Sandbox, tmp_path: Path) -> None:
    host = tmp_path / "host-secret"
    host.write_text("host")
    host.chmod(0o644)
    assert _sh(sbx, f"ln -s / /tmp/root; ln -s /etc/passwd /tmp/file; ln -s /etc /tmp/dir; ln -s {host} /tmp/h")[0] == 0
    for path in ("/tmp/root/etc/passwd", "/tmp/file", "/tmp/h", "/tmp/dir/passwd"):
        with pytest.raises(SandboxException):
            sbx.files.read(path)
    # a write to a link replaces the link, never its target; a write below a linked directory is refused
    sbx.files.write("/tmp/h", "through?")
    assert host.read_text() == "host"
    assert _sh(sbx, "test -L /tmp/h || cat /tmp/h") == (0, "through?")
    with pytest.raises(SandboxException):
        sbx.files.write("/tmp/dir/planted", "no")
    assert _sh(sbx, "test -e /etc/planted")[0] == 1
    # nor is metadata: an upload with it to a link makes a file of its own, the link's target keeps none
    assert _sh(sbx, "echo t > /tmp/target; ln -s target /tmp/tag-link")[0] == 0
    assert sbx.files.write("/tmp/tag-link", "new", metadata={"k": "v"}).metadata == {"k": "v"}
    assert not sbx.files.get_info("/tmp/target").metadata
    assert _sh(sbx, "cat /tmp/target; test -L /tmp/tag-link || cat /tmp/tag-link") == (0, "t\nnew")
    with pytest.raises(SandboxException):
        sbx.files.rename("/tmp/root", "/tmp/root/x")  # into itself through a link: refused, nothing moved
    assert _sh(sbx, "readlink /tmp/root") == (0, "/\n")


def test_root_only_files_and_the_hosts_processes_stay_out_of_reach(sbx: Sandbox, server: Server) -> None:
    shadow = Path("/etc/shadow")
    if shadow.exists() and not shadow.stat().st_mode & 0o004:
        with pytest.raises(SandboxException, match="Permission denied"):
            sbx.files.read("/etc/shadow")
    with pytest.raises(SandboxException):
        sbx.files.read("/proc/1/environ")  # the sandbox's init: masked
    # the server's process is not in the sandbox's pid namespace: whatever has its number there is not the server
    try:
        seen = sbx.files.read(f"/proc/{server.process.pid}/cmdline", format="bytes")
    except SandboxException:
        seen = b""
    assert b"execspace" not in bytes(seen)
    # root's directories are the user's to read, never to write, and the host's never
    for path in ("/etc/by-api", "/usr/by-api", "/opt/by-api"):
        with pytest.raises(SandboxException):
            sbx.files.write(path, "no", metadata={"k": "v"})
        assert not os.path.exists(path)
    with pytest.raises(SandboxException):
        sbx.files.remove("/etc/passwd")
    with pytest.raises(SandboxException):
        sbx.files.rename("/etc/passwd", "/tmp/stolen")
    assert _sh(sbx, "test -e /etc/passwd && test ! -e /tmp/stolen")[0] == 0


def test_another_sandboxs_tmp_and_the_hosts_tmp_are_their_own(sbx: Sandbox, server: Server) -> None:
    sbx.files.write("/tmp/mine", "only here")
    other = _create(server)
    try:
        assert not other.files.exists("/tmp/mine")
        other.files.write("/tmp/mine", "other's")
    finally:
        other.kill()
    assert sbx.files.read("/tmp/mine") == "only here"
    assert not os.path.exists("/tmp/mine") or Path("/tmp/mine").read_text() not in ("only here", "other's")


def test_a_listing_of_the_whole_system_is_bounded_and_the_server_answers_after(sbx: Sandbox) -> None:
    # the agent's answer is capped (2 MiB of output): a huge listing is either given or refused, never held whole
    try:
        entries = sbx.files.list("/", depth=8)
        assert entries
    except SandboxException as exc:
        assert "list a smaller directory or fewer levels" in str(exc), exc
    sbx.files.write("/tmp/after", "still here")
    assert sbx.files.read("/tmp/after") == "still here"
