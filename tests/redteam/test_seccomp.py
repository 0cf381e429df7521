"""Attacks that only the sandbox's seccomp filter stops, tried from inside real sandboxes.

Each attack is chosen so that without the filter it would succeed, or fail with another error than the
filter's EPERM (see tests/backends/test_seccomp_filter.py for the kernel's own answers): the assertions can
only pass because the filter is there. Where the host can see the attempt (a unix socket planted in the
workspace), the host side is checked too. The last tests check that ordinary programs are unharmed.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.sandbox import sandbox_of
from execspace.errors import BackendError
from execspace.registry import probe_backend
from tests.support import make_traversable

pyseccomp = pytest.importorskip("pyseccomp", reason="the seccomp filter needs pyseccomp and libseccomp (Linux)")

pytestmark = pytest.mark.timeout(60)

Box = tuple[execspace.BaseEngine, execspace.Workspace]

# Imported by every program below: report(label, result) lines are collected into a dict by the test.
PRELUDE = """
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def attempt(label, fn):
    try:
        fn()
        print(label, "OK", flush=True)
    except OSError as exc:
        print(label, errno.errorcode.get(exc.errno, exc.errno), flush=True)
def report(label, result):
    print(label, result, flush=True)
keep = []
def cstr(text):
    keep.append(ctypes.create_string_buffer(text.encode()))  # alive until exit: the kernel reads it
    return ctypes.addressof(keep[-1])
"""


def nr(name: str) -> int:
    """The syscall number on this machine (the sandbox runs on the same kernel and arch)."""
    number: int = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    return number


@pytest.fixture
async def sandbox(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> AsyncIterator[Box]:
    probe = await probe_backend("sandbox", **sandbox_mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **sandbox_mode) as engine:
        yield engine, await engine.manager.create_workspace("red/team/seccomp")


async def py(box: Box, code: str, **kw: object) -> tuple[execspace.RunResult, dict[str, str]]:
    """Run PRELUDE + ``code`` with python3 in the sandbox; return the result and its report lines."""
    engine, ws = box
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", PRELUDE + code], **kw))  # type: ignore[arg-type]
    lines = (line.split(" ", 1) for line in r.stdout.splitlines())
    return r, {parts[0]: parts[1] for parts in lines if len(parts) == 2}


@contextmanager
def host_unix_socket(directory: Path, name: str, kind: socket.SocketKind) -> Iterator[socket.socket]:
    """A host socket bound in ``directory``, open to everyone: only the filter can keep the sandbox out."""
    sock = socket.socket(socket.AF_UNIX, kind)
    # bind through the directory fd: the tmp path can exceed the 108 bytes of sun_path
    dfd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        sock.bind(f"/proc/self/fd/{dfd}/{name}")
        os.chmod(name, 0o777, dir_fd=dfd)
    finally:
        os.close(dfd)
    if kind == socket.SOCK_STREAM:
        sock.listen(4)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def nothing_arrived(sock: socket.socket) -> bool:
    try:
        if sock.type == socket.SOCK_STREAM:
            sock.accept()[0].close()
        else:
            sock.recv(100)
    except BlockingIOError:
        return True
    return False


# -- local IPC: the routes out of an empty network namespace --------------------------------------------


async def test_unix_socket_planted_in_workspace_is_unreachable(sandbox: Box) -> None:
    _, ws = sandbox
    assert ws.host_path is not None
    with host_unix_socket(ws.host_path / "work", "host.sock", socket.SOCK_STREAM) as server:
        r, got = await py(
            sandbox,
            f"""
path = "/workspace/work/host.sock"
report("visible", os.path.exists(path))
attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect(path))
report("socket_high_bits", raw({nr("socket")}, 1 | 1 << 32, socket.SOCK_STREAM, 0))
""",
        )
        assert nothing_arrived(server)
    assert got["visible"] == "True", r.stderr  # the path was there: only the filter stood in the way
    assert got["connect"] == "EPERM"
    assert got["socket_high_bits"] == "EPERM"  # AF_UNIX with garbage in the upper half of the register


async def test_datagram_socketpair_cannot_send_to_host_socket(sandbox: Box) -> None:
    _, ws = sandbox
    assert ws.host_path is not None
    with host_unix_socket(ws.host_path / "work", "dgram.sock", socket.SOCK_DGRAM) as server:
        r, got = await py(
            sandbox,
            """
path = "/workspace/work/dgram.sock"
report("visible", os.path.exists(path))
for label, kind in (("dgram", socket.SOCK_DGRAM), ("raw", socket.SOCK_RAW)):
    # the kernel turns an AF_UNIX SOCK_RAW into SOCK_DGRAM: both could sendto() any named socket
    attempt(label, lambda: socket.socketpair(socket.AF_UNIX, kind)[0].sendto(b"leak", path))
attempt("dgram_socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"leak", path))
""",
        )
        assert nothing_arrived(server)
    assert got["visible"] == "True", r.stderr
    assert (got["dgram"], got["raw"], got["dgram_socket"]) == ("EPERM", "EPERM", "EPERM")


@pytest.mark.parametrize("network", ["off", "on"])
async def test_vsock_to_the_vm_host_refused(sandbox: Box, network: str) -> None:
    _, got = await py(
        sandbox, "attempt('vsock', lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))", network=network
    )
    assert got["vsock"] == "EPERM"


async def test_network_on_keeps_unix_sockets_and_the_other_rules(sandbox: Box) -> None:
    _, got = await py(
        sandbox,
        f"""
attempt("unix", lambda: socket.socket(socket.AF_UNIX).close())
attempt("dgram_pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))
params = ctypes.create_string_buffer(120)
report("io_uring", raw({nr("io_uring_setup")}, 1, ctypes.addressof(params)))
report("unshare", raw({nr("unshare")}, 0x10000000))
""",
        network="on",
    )
    assert (got["unix"], got["dgram_pair"]) == ("OK", "OK")  # the host's network is open anyway
    assert (got["io_uring"], got["unshare"]) == ("EPERM", "EPERM")


# -- kernel surface -----------------------------------------------------------------------------------------


async def test_kernel_attack_surface_refused(sandbox: Box) -> None:
    # without the filter: io_uring, userfaultfd (user mode only) and the keyring calls succeed here,
    # bpf and perf_event_open fail with EFAULT on the NULL attribute
    _, got = await py(
        sandbox,
        f"""
params = ctypes.create_string_buffer(120)
report("io_uring_setup", raw({nr("io_uring_setup")}, 8, ctypes.addressof(params)))
report("bpf", raw({nr("bpf")}, 0, 0, 8))
report("perf_event_open", raw({nr("perf_event_open")}, 0, 0, -1, -1, 0))
report("userfaultfd", raw({nr("userfaultfd")}, 1))
report("keyctl", raw({nr("keyctl")}, 0, -4, 0))
report("add_key", raw({nr("add_key")}, cstr("user"), cstr("execspace-redteam"), cstr("x"), 1, -2))
""",
    )
    assert got == dict.fromkeys(
        ["io_uring_setup", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key"], "EPERM"
    )


async def test_sibling_process_cannot_be_traced_read_or_robbed(sandbox: Box) -> None:
    # without the filter all three work on a process of the same uid in the same sandbox
    _, got = await py(
        sandbox,
        f"""
import subprocess
victim = subprocess.Popen(["sleep", "10"])
local = ctypes.create_string_buffer(8)
iov = (ctypes.c_uint64 * 4)(ctypes.addressof(local), 8, 0x10000, 8)
report("ptrace_attach", raw({nr("ptrace")}, 16, victim.pid, 0, 0))
report("process_vm_readv", raw({nr("process_vm_readv")}, victim.pid, ctypes.addressof(iov), 1,
       ctypes.addressof(iov) + 16, 1, 0))
pidfd = os.pidfd_open(victim.pid)
report("pidfd_getfd", raw({nr("pidfd_getfd")}, pidfd, 0, 0))
victim.kill()
""",
    )
    assert got == {"ptrace_attach": "EPERM", "process_vm_readv": "EPERM", "pidfd_getfd": "EPERM"}


async def test_new_namespaces_refused(sandbox: Box) -> None:
    # without the filter: ENOSPC (bwrap disables nested user namespaces), EBADF and EINVAL
    r, got = await py(
        sandbox,
        f"""
import subprocess
report("unshare", raw({nr("unshare")}, 0x10000000))
pid = libc.syscall(ctypes.c_long({nr("clone")}), ctypes.c_long(0x10000000 | 17), 0, 0, 0, 0)
if pid == 0:
    os._exit(0)
report("clone", "OK" if pid > 0 else errno.errorcode[ctypes.get_errno()])
report("setns", raw({nr("setns")}, -1, 0))
report("clone3", raw({nr("clone3")}, 0, 0))
tool = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True)
report("unshare_tool", "EPERM" if "Operation not permitted" in tool.stderr else repr(tool.stderr))
""",
    )
    assert got == {"unshare": "EPERM", "clone": "EPERM", "setns": "EPERM", "clone3": "ENOSYS", "unshare_tool": "EPERM"}


async def test_mount_api_refused(sandbox: Box) -> None:
    # without the filter open_tree succeeds (a plain O_PATH-like fd) and the others fail with EFAULT/EINVAL
    _, got = await py(
        sandbox,
        f"""
report("open_tree", raw({nr("open_tree")}, -100, cstr("/tmp"), 0))
report("mount", raw({nr("mount")}, 0, 0, 0, 0, 0))
report("umount2", raw({nr("umount2")}, cstr("/tmp"), 0x100))
report("fsconfig", raw({nr("fsconfig")}, -1, 0, 0, 0, 0))
report("mount_setattr", raw({nr("mount_setattr")}, -1, 0, 0x40000000, 0, 0))
""",
    )
    assert got == dict.fromkeys(["open_tree", "mount", "umount2", "fsconfig", "mount_setattr"], "EPERM")


async def test_terminal_injection_ioctls_refused(sandbox: Box) -> None:
    # stdout is a pipe: without the filter each call fails with ENOTTY
    _, got = await py(
        sandbox,
        f"""
char = ctypes.create_string_buffer(b"x")
report("tiocsti", raw({nr("ioctl")}, 1, 0x5412, ctypes.addressof(char)))
report("tiocsti_high_bits", raw({nr("ioctl")}, 1, 0x5412 | 1 << 32, ctypes.addressof(char)))
report("tioclinux", raw({nr("ioctl")}, 1, 0x541C, ctypes.addressof(char)))
""",
    )
    assert got == {"tiocsti": "EPERM", "tiocsti_high_bits": "EPERM", "tioclinux": "EPERM"}


X32_GETPID = "libc.syscall(0x40000000 | 39)\n"
# mov eax, 20 (getpid in the i386 table); int 0x80; ret
I386_GETPID = """
import mmap
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes.fromhex("b814000000cd80c3"))
ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and i386 are x86_64 ABIs")
@pytest.mark.parametrize("code", [X32_GETPID, I386_GETPID], ids=["x32", "i386"])
async def test_syscalls_of_other_abis_kill_the_program(sandbox: Box, code: str) -> None:
    # without the filter x32 returns ENOSYS here (or works) and i386 getpid works: "survived" is printed
    r, got = await py(
        sandbox,
        "import resource\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        f"report('before', 'yes')\n{code}report('survived', 'yes')\n",
    )
    assert got.get("before") == "yes"  # output from before the kill is kept
    assert "survived" not in got
    assert r.exit_code == -31  # killed by SIGSYS (bwrap says 128 + 31; every backend reports -N, as local does)


# -- ordinary programs are unharmed ---------------------------------------------------------------------


async def test_ordinary_programs_still_work(sandbox: Box) -> None:
    r, got = await py(
        sandbox,
        """
import asyncio, multiprocessing, subprocess, threading

def pool():
    with multiprocessing.Pool(2) as p:
        assert p.map(abs, [-1, -2, -3]) == [1, 2, 3]

def pairs():
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
        a, b = socket.socketpair(socket.AF_UNIX, kind)
        a.sendall(b"ping")
        assert b.recv(4) == b"ping"

def loopback():
    # the sandbox's own network namespace: bwrap brings lo up, nothing else is there
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=5)
    conn, _ = server.accept()
    client.sendall(b"tcp")
    assert conn.recv(3) == b"tcp"

def threads():
    seen = []
    workers = [threading.Thread(target=seen.append, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(seen) == [0, 1, 2, 3]

def pipes():
    out = subprocess.run(["sh", "-c", "cat; echo done >&2"], input=b"in", capture_output=True, check=True)
    assert (out.stdout, out.stderr) == (b"in", b"done\\n")

def event_loop():
    async def main():
        proc = await asyncio.create_subprocess_exec("echo", "hi", stdout=asyncio.subprocess.PIPE)
        return (await proc.communicate())[0]
    assert asyncio.run(main()) == b"hi\\n"

def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7

for check in (pool, pairs, loopback, threads, pipes, event_loop, fork):
    check()
    report(check.__name__, "ok")
""",
    )
    assert r.exit_code == 0, r.stderr
    assert got == dict.fromkeys(["pool", "pairs", "loopback", "threads", "pipes", "event_loop", "fork"], "ok")


async def _settled_filter_fds(engine: execspace.BaseEngine) -> list[str]:
    """The filter fds left open once the engine's session pool has no start in flight: a session it starts
    ahead (the fixture's ``create_workspace`` refills it) holds its filter's fd until its bwrap has it, rightly."""
    pool = getattr(getattr(engine.runner, "spawning", None), "pool", None)
    if pool is not None:
        await pool.ready(30)
    return _open_filter_fds()


def _open_filter_fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "execspace-seccomp" in target:
            found.append(target)
    return found


async def test_filter_fd_is_closed_on_the_host_and_absent_inside(sandbox: Box) -> None:
    engine, ws = sandbox
    r, _ = await py(
        sandbox, "print(os.listdir('/proc/self/fd'), [os.readlink(f'/proc/self/fd/{f}') for f in '0 1 2'.split()])"
    )
    handle = await engine.runner.start_program(ws, RunProgramSpec("ls", ["-l", "/proc/self/fd/"]))
    streamed = await handle.wait()
    assert "memfd" not in r.stdout and "memfd" not in streamed.stdout  # bwrap does not pass it on
    assert await _settled_filter_fds(engine) == []


async def test_filter_fd_is_closed_when_the_spawn_fails(sandbox: Box) -> None:
    engine, ws = sandbox
    # a fake: point the runner at a bwrap that does not exist, so that the spawn itself fails
    sandbox_of(engine.runner).bwrap = "/nonexistent/bwrap"
    if engine.describe().details["mode"].startswith("session"):
        # the workspace's session cannot start: a run in it says so, naming the missing bwrap
        with pytest.raises(BackendError, match="nonexistent/bwrap"):
            await engine.runner.run_program(ws, RunProgramSpec("true"))
    else:
        r = await engine.runner.run_program(ws, RunProgramSpec("true"))
        assert r.exit_code == 127
    assert await _settled_filter_fds(engine) == []
