"""Round 2 attacks on the seccomp boundary: a process of the sandbox left with a weaker filter, and the
compiled filter trusted from disk.

F3 (pid 1): bwrap's init is pid 1 of the sandbox. It gets bwrap's filter only, not what a process stacks on
itself (a Jupyter kernel's ``socket(AF_UNIX)`` lock), and as the same uid it was writable through
``/proc/1/mem``. The attacks below write machine code into a process that sits in a syscall, at the address
the syscall returns to (``/proc/<pid>/syscall`` names it), and make the syscall return: the code then makes
one syscall and exits with ``100 + errno`` (refused) or ``200`` (allowed). Where that process is pid 1, its
exit code becomes bwrap's, so the host sees the forged code in the run's result.

F7 (the filter on disk) is at the end of the file.
"""

from __future__ import annotations

import base64
import platform
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.sandbox import SandboxPolicy, sandbox_of
from execspace.backends.sandbox.seccomp import KernelSeccompFilters, build_unix_lock_bpf
from execspace.process.hostrunner import HostRunner
from execspace.registry import probe_backend
from execspace.workspace.hostmanager import default_workspace_root
from tests.support import make_traversable

pyseccomp = pytest.importorskip("pyseccomp", reason="the seccomp filter needs pyseccomp and libseccomp (Linux)")

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the injected code is x86_64 machine code"),
]

Box = tuple[execspace.BaseEngine, execspace.Workspace]

ALLOWED, EPERM = 200, 101  # exit codes of the injected code
SYS_SOCKET, SYS_KEYCTL, SYS_EXIT_GROUP = 41, 250, 231


def injected(nr: int, a: int, b: int) -> bytes:
    """x86_64 code: ``r = syscall(nr, a, b, 0); exit_group(200 if r >= 0 else 100 - r)``."""
    return b"".join(
        [
            b"\xbf" + struct.pack("<I", a & 0xFFFF_FFFF),  # mov edi, a
            b"\xbe" + struct.pack("<I", b & 0xFFFF_FFFF),  # mov esi, b
            b"\x31\xd2",  # xor edx, edx
            b"\xb8" + struct.pack("<I", nr),  # mov eax, nr
            b"\x0f\x05",  # syscall
            b"\x89\xc7",  # mov edi, eax
            b"\xf7\xdf",  # neg edi
            b"\x83\xc7\x64",  # add edi, 100
            b"\x85\xc0",  # test eax, eax
            b"\x78\x05",  # js +5 (failed: keep 100 + errno)
            b"\xbf" + struct.pack("<I", ALLOWED),  # mov edi, 200
            b"\xb8" + struct.pack("<I", SYS_EXIT_GROUP),  # mov eax, exit_group
            b"\x0f\x05",  # syscall
        ]
    )


# Helpers for the programs below: inject(pid, code) writes ``code`` where ``pid`` resumes after its syscall.
PRELUDE = r"""
import base64, ctypes, errno, os, sys, time
def report(label, value):
    print(label, value, flush=True)
def resume_address(pid):
    # "nr args... sp pc" while the process sits in a syscall; "running" otherwise
    for _ in range(200):
        fields = open(f"/proc/{pid}/syscall").read().split()
        if len(fields) > 2:
            return int(fields[-1], 16)
        time.sleep(0.01)
    raise SystemExit(f"{pid} never blocked")
def inject(pid, code):
    try:
        at = resume_address(pid)
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            mem.seek(at)
            mem.write(code)
    except OSError as exc:
        report("inject", errno.errorcode.get(exc.errno, exc.errno))
        return False
    report("inject", "OK")
    return True
def orphan_exits_soon():
    # an orphan is reparented to pid 1, whose wait() then returns into the injected code
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.wait()
"""

# Stacks the Jupyter kernel launcher's lock (sandboxed.LAUNCHER) on this process: what a kernel runs under.
LOCK = r"""
import socket
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
bpf = base64.b64decode(LOCK_BPF)
prog = Prog(len(bpf) // 8, bpf)
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(ctypes.c_long(317), ctypes.c_long(1), ctypes.c_long(1), ctypes.byref(prog)) != 0:
    raise SystemExit("cannot stack the lock")
try:
    socket.socket(socket.AF_UNIX).close()
    report("locked", "no")
except PermissionError:
    report("locked", "yes")
"""

ATTACK_PID1 = r"""
if inject(1, CODE):
    orphan_exits_soon()
    time.sleep(5)  # the namespace dies with pid 1 before this ends, if the code ran
report("pid1", "untouched")
"""


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Box]:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        yield engine, await engine.manager.create_workspace("red/team/round2-seccomp")


async def py(box: Box, code: str, runner: HostRunner | None = None) -> tuple[execspace.RunResult, dict[str, str]]:
    engine, ws = box
    r = await (runner or engine.runner).run_program(ws, RunProgramSpec("python3", ["-c", PRELUDE + code], timeout=30))  # type: ignore[attr-defined]
    lines = (line.split(" ", 1) for line in r.stdout.splitlines())
    return r, {parts[0]: parts[1] for parts in lines if len(parts) == 2}


def kernel_runner(box: Box) -> tuple[HostRunner, str]:
    """The engine's runner with a sandboxed kernel's filters, and the lock the kernel stacks on itself."""
    engine, _ = box
    filters = KernelSeccompFilters()
    return sandbox_of(engine.runner).with_seccomp(filters), base64.b64encode(filters.unix_lock_bpf()).decode()


# -- F3: no process of the sandbox is left with less than the full filter ------------------------------


async def test_kernel_cannot_borrow_pid1_to_open_a_unix_socket(sandbox: Box) -> None:
    # the F3 chain: a locked kernel process writes into pid 1, which lacked the lock, and makes it call
    # socket(AF_UNIX) with the network off (exit 200 from bwrap before the fix)
    runner, lock = kernel_runner(sandbox)
    code = f"LOCK_BPF = {lock!r}\nCODE = {injected(SYS_SOCKET, 1, 1)!r}\n" + LOCK + ATTACK_PID1
    r, got = await py(sandbox, code, runner)
    assert got.get("locked") == "yes", r.stderr
    assert r.exit_code != ALLOWED, "pid 1 created an AF_UNIX socket for a locked kernel"
    assert (r.exit_code, got.get("pid1")) == (0, "untouched"), r
    assert got["inject"] in ("EACCES", "ENOENT")


async def test_program_cannot_write_into_pid1(sandbox: Box) -> None:
    # bwrap's init holds the sandbox's life (--die-with-parent) and reports its exit status: code written
    # into it forged the run's exit code (101: its socket(AF_UNIX) was refused, so the code ran there)
    code = f"CODE = {injected(SYS_SOCKET, 1, 1)!r}\n" + ATTACK_PID1
    r, got = await py(sandbox, code)
    assert (r.exit_code, got.get("pid1")) == (0, "untouched"), r
    assert got["inject"] in ("EACCES", "ENOENT")


async def test_every_process_in_a_kernel_sandbox_carries_the_lock(sandbox: Box) -> None:
    runner, lock = kernel_runner(sandbox)
    code = (
        f"LOCK_BPF = {lock!r}\n"
        + LOCK
        + r"""
def filters(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Seccomp_filters:"):
            return int(line.split()[1])
mine = filters("self")
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
        n = filters(pid)
    except OSError as exc:
        # a process whose status cannot be read must not be writable either
        try:
            open(f"/proc/{pid}/mem", "r+b").close()
            report(f"pid{pid}", "hidden-but-writable")
        except OSError:
            report(f"pid{pid}", "unreachable")
        continue
    report(f"pid{pid}", "full" if n >= mine else f"weaker({n}<{mine})")
"""
    )
    r, got = await py(sandbox, code, runner)
    assert got.get("locked") == "yes", r.stderr
    procs = {k: v for k, v in got.items() if k.startswith("pid")}
    assert procs and set(procs.values()) <= {"full", "unreachable"}, procs


SIBLING = r"""
r, w = os.pipe()
victim = os.fork()
if victim == 0:
    os.read(r, 1)  # returns into the injected code
    os._exit(0)
if inject(victim, CODE):
    os.write(w, b"x")
_, status = os.waitpid(victim, 0)
report("victim", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize(
    ("label", "nr", "a", "b"),
    [("socket(AF_UNIX)", SYS_SOCKET, 1, 1), ("keyctl(GET_KEYRING_ID, USER)", SYS_KEYCTL, 0, -4)],
)
async def test_code_written_into_a_sibling_stays_under_the_filter(
    sandbox: Box, label: str, nr: int, a: int, b: int
) -> None:
    # /proc/<pid>/mem between the program's own processes still works (they are one principal, see
    # docs/security.md); what the injected code can do there is what the filter lets the program do
    r, got = await py(sandbox, f"CODE = {injected(nr, a, b)!r}\n" + SIBLING)
    assert got.get("inject") == "OK", r.stderr
    assert got.get("victim") == str(EPERM), f"{label} in the sibling: {got} {r.stderr}"


async def test_sibling_memory_refused_to_process_vm_and_process_madvise(sandbox: Box) -> None:
    # without the filter: process_vm_writev writes (same uid), process_madvise fails with EINVAL (flags=1)
    code = f"""
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw(nr, *args):
    ctypes.set_errno(0)
    res = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in args])
    return "OK" if res >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
target = ctypes.create_string_buffer(b"intact!!")
r, w = os.pipe()
victim = os.fork()
if victim == 0:
    os.read(r, 1)
    os._exit(0 if target.raw[:8] == b"intact!!" else 9)
src = ctypes.create_string_buffer(b"pwned!!!")
local = (ctypes.c_uint64 * 2)(ctypes.addressof(src), 8)
remote = (ctypes.c_uint64 * 2)(ctypes.addressof(target), 8)
report("process_vm_writev", raw({pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "process_vm_writev")},
       victim, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0))
pidfd = os.pidfd_open(victim)
report("process_madvise", raw({pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "process_madvise")},
       pidfd, ctypes.addressof(remote), 1, 20, 1))
os.write(w, b"x")
report("victim", os.waitstatus_to_exitcode(os.waitpid(victim, 0)[1]))
"""
    r, got = await py(sandbox, code)
    assert got == {"process_vm_writev": "EPERM", "process_madvise": "EPERM", "victim": "0"}, r.stderr


async def test_bwrap_command_line_is_not_visible(sandbox: Box) -> None:
    engine, ws = sandbox
    assert ws.host_path is not None
    r, got = await py(
        sandbox,
        r"""
try:
    report("cmdline", open("/proc/1/cmdline", "rb").read().replace(b"\0", b" ").decode()[:200] or "empty")
except OSError as exc:
    report("cmdline", errno.errorcode[exc.errno])
""",
    )
    assert got.get("cmdline") in ("EACCES", "ENOENT"), got
    assert "bwrap" not in r.stdout


# -- F7: nothing a sandbox can write decides a later sandbox's filter ----------------------------------

F7_ATTACK = r"""
import json
lock = base64.b64decode(LOCK_BPF)  # refuses AF_UNIX only, so the sandbox probe would still pass
try:
    names = os.listdir(PRIVATE)
except OSError as exc:
    report("listing", errno.errorcode[exc.errno])
    names = []
replaced = 0
for name in [*names, "seccomp-planted.bpf"]:
    path = os.path.join(PRIVATE, name)
    if name.endswith(".bpf"):
        data = lock
    elif name == "sandbox-probe.json":
        data = json.dumps({"key": json.load(open(path))["key"], "at": 9e99, "reason": "forged"}).encode()
    else:
        continue
    try:
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)
        replaced += 1
    except OSError as exc:
        report(f"write-{name}", errno.errorcode[exc.errno])
report("replaced", replaced)
open(os.path.join(TMPDIR, "canary"), "w").close()  # the grant itself works
"""

F7_PROBE = r"""
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw(nr, *args):
    ctypes.set_errno(0)
    res = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in args])
    return "OK" if res >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
params = ctypes.create_string_buffer(120)
report("io_uring_setup", raw(425, 8, ctypes.addressof(params)))
report("keyctl", raw(250, 0, -4, 0))
report("ptrace", raw(101, 0, 0, 0, 0))  # PTRACE_TRACEME
"""


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file() and not p.is_symlink()}


async def test_tmp_write_grant_cannot_weaken_later_sandboxes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    # a TMPDIR of this test's own, shared like /tmp: the user's real private directory is never touched
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(mode=0o1777)
    tmpdir.chmod(0o1777)
    make_traversable(tmp_path)
    monkeypatch.setattr("tempfile.tempdir", str(tmpdir))
    private = default_workspace_root().parent
    lock = base64.b64encode(build_unix_lock_bpf()).decode()

    policy = SandboxPolicy().with_write_paths(str(tmpdir))
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", policy=policy) as engine:
        before = snapshot(private)
        ws = await engine.manager.create_workspace("red/team/f7")
        code = f"PRIVATE = {str(private)!r}\nTMPDIR = {str(tmpdir)!r}\nLOCK_BPF = {lock!r}\n" + F7_ATTACK
        r, got = await py((engine, ws), code)
    assert (tmpdir / "canary").exists(), r.stderr
    assert got.get("replaced") == "0", got
    assert snapshot(private) == before

    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws2") as later:
        ws = await later.manager.create_workspace("red/team/f7-later")
        r, got = await py((later, ws), F7_PROBE)
    assert got == {"io_uring_setup": "EPERM", "keyctl": "EPERM", "ptrace": "EPERM"}, r.stderr
