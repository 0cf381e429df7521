"""The sandbox's seccomp filter on its own: it builds, travels in a sealed memfd, and does what its rules say.

The behavioural tests load the exported BPF (the very bytes bwrap gets) into a child Python with
``prctl(PR_SET_SECCOMP)`` and make each syscall twice: before the filter, to show the arguments chosen make
the kernel answer something else than the filter would, and after it. Arguments are invalid on purpose, so
nothing happens even where the filter would not stop the call (the suite runs as root).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyseccomp", reason="the seccomp filter needs pyseccomp and libseccomp (Linux)")

from execspace.backends.sandbox import DOES_NOT_PROTECT, SandboxBackend
from execspace.backends.sandbox import seccomp as sc
from execspace.backends.sandbox.bwrap import BwrapConfig, build_argv, find_bwrap
from execspace.errors import SetupFailed

ROOT = os.geteuid() == 0
ALLOWED = None  # the call must behave exactly as without the filter
CLONE_THREAD = 0x10000
CLONE_NEW = {
    "NEWNS": 0x20000,
    "NEWCGROUP": 0x02000000,
    "NEWUTS": 0x04000000,
    "NEWIPC": 0x08000000,
    "NEWUSER": 0x10000000,
    "NEWPID": 0x20000000,
    "NEWNET": 0x40000000,
}
HIGH = 1 << 32  # the kernel drops these bits of int arguments; the filter must too

# (label, syscall, args, with the network restricted, with it on, needs root to be told apart from the kernel's EPERM)
# "buf" stands for a pointer to a zeroed scratch buffer.
CASES: list[tuple[str, str, list[Any], int | None, int | None, bool]] = [
    ("socket(AF_UNIX)", "socket", [1, 1, 0], errno.EPERM, ALLOWED, False),
    ("socket(AF_UNIX + high bits)", "socket", [1 | HIGH, 1, 0], errno.EPERM, ALLOWED, False),
    ("socketpair(AF_UNIX, SOCK_DGRAM)", "socketpair", [1, 2, 0, "buf"], errno.EPERM, ALLOWED, False),
    (
        "socketpair(AF_UNIX, SOCK_DGRAM|SOCK_CLOEXEC)",
        "socketpair",
        [1, 2 | 0x80000, 0, "buf"],
        errno.EPERM,
        ALLOWED,
        False,
    ),
    ("socketpair(AF_UNIX, SOCK_RAW)", "socketpair", [1, 3, 0, "buf"], errno.EPERM, ALLOWED, False),
    ("socketpair(AF_UNIX, SOCK_STREAM)", "socketpair", [1, 1, 0, "buf"], ALLOWED, ALLOWED, False),
    ("socketpair(AF_UNIX, SOCK_SEQPACKET)", "socketpair", [1, 5, 0, "buf"], ALLOWED, ALLOWED, False),
    ("socket(AF_INET)", "socket", [2, 1, 0], ALLOWED, ALLOWED, False),
    ("socket(AF_VSOCK)", "socket", [40, 1, 0], errno.EPERM, errno.EPERM, False),
    ("socketpair(AF_VSOCK)", "socketpair", [40, 1, 0, "buf"], errno.EPERM, errno.EPERM, False),
    ("io_uring_setup", "io_uring_setup", [1, 0], errno.EPERM, errno.EPERM, False),
    ("io_uring_enter", "io_uring_enter", [-1, 0, 0, 0, 0, 0], errno.EPERM, errno.EPERM, False),
    ("io_uring_register", "io_uring_register", [-1, 0, 0, 0], errno.EPERM, errno.EPERM, False),
    ("bpf", "bpf", [0, 0, 8], errno.EPERM, errno.EPERM, False),
    ("perf_event_open", "perf_event_open", [0, 0, -1, -1, -1], errno.EPERM, errno.EPERM, False),
    ("userfaultfd", "userfaultfd", [3], errno.EPERM, errno.EPERM, False),
    ("keyctl", "keyctl", [0x7FFF, 0, 0, 0, 0], errno.EPERM, errno.EPERM, False),
    ("add_key", "add_key", [0, 0, 0, 0, 0], errno.EPERM, errno.EPERM, False),
    ("request_key", "request_key", [0, 0, 0, 0], errno.EPERM, errno.EPERM, False),
    ("ptrace", "ptrace", [2, 0x3FFFFFFF, 0, 0], errno.EPERM, errno.EPERM, False),
    ("process_vm_readv", "process_vm_readv", [0, 0, 0, 0, 0, 1], errno.EPERM, errno.EPERM, False),
    ("process_vm_writev", "process_vm_writev", [0, 0, 0, 0, 0, 1], errno.EPERM, errno.EPERM, False),
    ("pidfd_getfd", "pidfd_getfd", [-1, 0, 1], errno.EPERM, errno.EPERM, False),
    ("process_madvise", "process_madvise", [-1, 0, 1, 20, 1], errno.EPERM, errno.EPERM, False),
    ("kexec_load", "kexec_load", [0, 0, 0, 0x8000], errno.EPERM, errno.EPERM, True),
    ("kexec_file_load", "kexec_file_load", [-1, -1, 0, 0, 0x8000], errno.EPERM, errno.EPERM, True),
    ("reboot", "reboot", [0, 0, 0, 0], errno.EPERM, errno.EPERM, True),
    ("init_module", "init_module", [0, 0, 0], errno.EPERM, errno.EPERM, True),
    ("finit_module", "finit_module", [-1, 0, 0], errno.EPERM, errno.EPERM, True),
    ("delete_module", "delete_module", [0, 0], errno.EPERM, errno.EPERM, True),
    ("acct", "acct", [1], errno.EPERM, errno.EPERM, True),
    ("swapon", "swapon", [1, 0], errno.EPERM, errno.EPERM, True),
    ("swapoff", "swapoff", [1], errno.EPERM, errno.EPERM, True),
    ("syslog", "syslog", [10, 0, 0], errno.EPERM, errno.EPERM, True),
    ("mount", "mount", [0, 0, 0, 0, 0], errno.EPERM, errno.EPERM, False),
    ("umount2", "umount2", [0, 0x100], errno.EPERM, errno.EPERM, False),
    ("pivot_root", "pivot_root", [0, 0], errno.EPERM, errno.EPERM, True),
    ("fsopen", "fsopen", [0, 0xFF], errno.EPERM, errno.EPERM, True),
    ("fsconfig", "fsconfig", [-1, 0, 0, 0, 0], errno.EPERM, errno.EPERM, False),
    ("fsmount", "fsmount", [-1, 0xFF, 0], errno.EPERM, errno.EPERM, True),
    ("fspick", "fspick", [-1, 0, 0xFF], errno.EPERM, errno.EPERM, True),
    ("move_mount", "move_mount", [-1, 0, -1, 0, 0x40000000], errno.EPERM, errno.EPERM, True),
    ("open_tree", "open_tree", [-1, 0, 0x40000000], errno.EPERM, errno.EPERM, False),
    ("mount_setattr", "mount_setattr", [-1, 0, 0x40000000, 0, 0], errno.EPERM, errno.EPERM, False),
    ("unshare", "unshare", [1], errno.EPERM, errno.EPERM, False),
    ("setns", "setns", [-1, 0], errno.EPERM, errno.EPERM, False),
    ("clone3", "clone3", [0, 0], errno.ENOSYS, errno.ENOSYS, False),
    # CLONE_THREAD without CLONE_SIGHAND is invalid, so no process is ever created
    *(
        (f"clone(CLONE_{name})", "clone", [flag | CLONE_THREAD, 0, 0, 0, 0], errno.EPERM, errno.EPERM, False)
        for name, flag in CLONE_NEW.items()
    ),
    ("clone without namespace flags", "clone", [CLONE_THREAD, 0, 0, 0, 0], ALLOWED, ALLOWED, False),
    ("ioctl(TIOCSTI)", "ioctl", [-1, 0x5412, 0], errno.EPERM, errno.EPERM, False),
    ("ioctl(TIOCSTI + high bits)", "ioctl", [-1, 0x5412 | HIGH, 0], errno.EPERM, errno.EPERM, False),
    ("ioctl(TIOCLINUX)", "ioctl", [-1, 0x541C, 0], errno.EPERM, errno.EPERM, False),
    ("ioctl(FIONREAD)", "ioctl", [-1, 0x541B, 0], ALLOWED, ALLOWED, False),
    # set-ID bits (a file a program makes in a write grant is the tree owner's on the host); NULL paths and bad fds
    # make the kernel's own answer EFAULT or EBADF
    ("fchmod(S_ISUID)", "fchmod", [-1, 0o4755], errno.EPERM, errno.EPERM, False),
    ("fchmod(S_ISGID + high bits)", "fchmod", [-1, 0o2755 | HIGH], errno.EPERM, errno.EPERM, False),
    ("fchmod(0755)", "fchmod", [-1, 0o755], ALLOWED, ALLOWED, False),
    ("fchmodat(S_ISGID)", "fchmodat", [-1, 0, 0o2750], errno.EPERM, errno.EPERM, False),
    ("fchmodat2(S_ISUID)", "fchmodat2", [-1, 0, 0o4700, 0], errno.EPERM, errno.EPERM, False),
    ("fchmodat(1777)", "fchmodat", [-1, 0, 0o1777], ALLOWED, ALLOWED, False),
    ("openat(O_CREAT, S_ISUID)", "openat", [-1, 0, 0o101, 0o4755], errno.EPERM, errno.EPERM, False),
    ("openat(O_TMPFILE, S_ISGID)", "openat", [-1, 0, 0o20200001, 0o2755], errno.EPERM, errno.EPERM, False),
    ("openat(O_CREAT, 0755)", "openat", [-1, 0, 0o101, 0o755], ALLOWED, ALLOWED, False),
    ("openat(no O_CREAT, a mode with S_ISUID)", "openat", [-1, 0, 0, 0o4755], ALLOWED, ALLOWED, False),
    ("mknodat(S_IFREG|S_ISUID)", "mknodat", [-1, 0, 0o104755, 0], errno.EPERM, errno.EPERM, False),
    ("openat2", "openat2", [-1, 0, 0, 24], errno.ENOSYS, errno.ENOSYS, False),
]
if platform.machine() == "x86_64":  # the calls aarch64 has only as their *at forms
    CASES += [
        ("chmod(S_ISUID)", "chmod", [0, 0o4755], errno.EPERM, errno.EPERM, False),
        ("chmod(0644)", "chmod", [0, 0o644], ALLOWED, ALLOWED, False),
        ("creat(S_ISGID)", "creat", [0, 0o2755], errno.EPERM, errno.EPERM, False),
        ("open(O_CREAT, S_ISUID)", "open", [0, 0o101, 0o4755], errno.EPERM, errno.EPERM, False),
        ("open(O_CREAT, 0600)", "open", [0, 0o101, 0o600], ALLOWED, ALLOWED, False),
        ("mknod(S_IFREG|S_ISGID)", "mknod", [0, 0o102755, 0], errno.EPERM, errno.EPERM, False),
    ]

# Loads the BPF file argv[1] as this process's seccomp filter, as bwrap does before exec.
LOADER = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
def load_filter(path):
    data = open(path, "rb").read()
    prog = SockFprog(len(data) // 8, data)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(prog), 0, 0):
        raise OSError(ctypes.get_errno(), "cannot load the seccomp filter")
"""

SYSCALLS = (
    LOADER
    + """
import json, sys
libc.syscall.restype = ctypes.c_long
scratch = ctypes.create_string_buffer(4096)
def call(nr, args):
    values = [ctypes.c_long(ctypes.addressof(scratch) if a == "buf" else a) for a in args]
    ctypes.set_errno(0)
    return 0 if libc.syscall(ctypes.c_long(nr), *values) >= 0 else ctypes.get_errno()
cases = json.loads(sys.argv[2])
before = [call(nr, args) for nr, args in cases]
load_filter(sys.argv[1])
after = [call(nr, args) for nr, args in cases]
print(json.dumps([before, after]))
"""
)


def syscall_number(name: str) -> int:
    import pyseccomp

    nr: int = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    return nr


def write_bpf(tmp_path: Path, network_restricted: bool) -> Path:
    path = tmp_path / f"filter-{network_restricted}.bpf"
    path.write_bytes(sc.SeccompFilters().bpf(network_restricted))
    return path


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=30)


# -- building and handing over -----------------------------------------------------------------------


def test_filter_builds_for_both_modes_and_they_differ() -> None:
    filters = sc.SeccompFilters()
    restricted, open_net = filters.bpf(True), filters.bpf(False)
    for program in (restricted, open_net):
        assert program and len(program) % 8 == 0  # whole sock_filter instructions
    assert restricted != open_net
    assert len(restricted) > len(open_net)  # the AF_UNIX rules come on top


def test_bpf_is_built_once_per_owner() -> None:
    filters = sc.SeccompFilters()
    assert filters.bpf(True) is filters.bpf(True)
    other = sc.SeccompFilters()
    assert other.bpf(True) == filters.bpf(True)
    assert other.bpf(True) is not filters.bpf(True)


def test_memfd_is_sealed_read_only_and_at_offset_zero() -> None:
    filters = sc.SeccompFilters()
    fd = filters.open_filter_fd(network_restricted=True)
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        for seal in (fcntl.F_SEAL_WRITE, fcntl.F_SEAL_GROW, fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_SEAL):
            assert seals & seal
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert os.read(fd, 1 << 20) == filters.bpf(True)
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"\0" * 8, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # F_SEAL_SEAL: the seals themselves are final
    finally:
        os.close(fd)


def test_each_call_gets_its_own_fd() -> None:
    filters = sc.SeccompFilters()
    a, b = filters.open_filter_fd(True), filters.open_filter_fd(True)
    try:
        assert a != b
        os.read(a, 16)
        assert os.lseek(b, 0, os.SEEK_CUR) == 0  # reading one does not move the other
    finally:
        os.close(a)
        os.close(b)


def test_build_argv_passes_the_fd_to_bwrap() -> None:
    cfg = BwrapConfig("bwrap", network=False)
    with_fd = build_argv(cfg, Path("/srv/ws"), "", ["true"], seccomp_fd=7)
    i = with_fd.index("--seccomp")
    assert with_fd[i + 1] == "7" and i < with_fd.index("--")
    assert "--seccomp" not in build_argv(cfg, Path("/srv/ws"), "", ["true"])


def test_unknown_syscall_name_fails_closed() -> None:
    with pytest.raises(SetupFailed, match="libseccomp"):
        sc._syscall_number(sc._libseccomp(), "execspace_no_such_syscall")


def reference_export(chosen: tuple[sc.Deny, ...]) -> bytes:
    """The same rules built through pyseccomp, the maintained binding: ours calls libseccomp directly."""
    import pyseccomp as ps

    filt = ps.SyscallFilter(ps.ALLOW)
    filt.set_attr(ps.Attr.ACT_BADARCH, ps.KILL_PROCESS)
    for rule in chosen:
        conditions = [ps.Arg(index, ps.MASKED_EQ, mask, value) for index, mask, value in rule.when]
        for name in rule.syscalls:
            filt.add_rule(ps.ERRNO(rule.error), ps.resolve_syscall(ps.Arch.NATIVE, name), *conditions)
    with open(os.memfd_create("reference"), "w+b") as out:
        filt.export_bpf(out)
        out.seek(0)
        return out.read()


@pytest.mark.parametrize(
    ("label", "built", "chosen"),
    [
        ("network off", lambda: sc.build_bpf(True), sc.rules(True)),
        ("network on", lambda: sc.build_bpf(False), sc.rules(False)),
        (
            "kernel",
            lambda: sc.build_bpf(True, allow_unix_socket=True),
            sc.ALWAYS + sc.SET_ID_BITS + sc.RESTRICTED_NETWORK[1:],
        ),
        ("machine", lambda: sc.build_bpf(True, set_id_bits=True), sc.ALWAYS + sc.RESTRICTED_NETWORK),
        ("unix lock", sc.build_unix_lock_bpf, sc.RESTRICTED_NETWORK[:1]),
    ],
)
def test_filter_is_byte_for_byte_what_pyseccomp_builds(label: str, built: Any, chosen: tuple[sc.Deny, ...]) -> None:
    assert built() == reference_export(chosen), label


def test_a_new_process_builds_the_filter_quickly_without_pyseccomp_or_files(tmp_path: Path) -> None:
    # F7: nothing compiled is kept on disk (a sandbox with a write grant over it could swap in a weaker filter),
    # and a new process does not pay pyseccomp's import (find_library, ~90 ms) for it either
    code = (
        "import sys, time\n"
        "from execspace.backends.sandbox.seccomp import SeccompFilters\n"
        "t = time.perf_counter(); data = SeccompFilters().bpf(True); took = time.perf_counter() - t\n"
        "sys.stdout.write(f\"{'pyseccomp' in sys.modules} {took} {data.hex()}\")\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    loaded, took, data = run.stdout.split()
    assert (loaded, bytes.fromhex(data)) == ("False", sc.build_bpf(True))
    assert float(took) < 0.05
    assert list(tmp_path.iterdir()) == []


def test_capabilities_describe_the_filter() -> None:
    caps = SandboxBackend.capabilities()
    text = caps.details["seccomp"]
    for word in ("AF_UNIX", "AF_VSOCK", "io_uring", "ptrace", "TIOCSTI", "clone3", "x32"):
        assert word in text
    assert not any("seccomp" in line for line in DOES_NOT_PROTECT)


# -- what the loaded filter does ----------------------------------------------------------------------


@pytest.mark.parametrize("network_restricted", [True, False], ids=["network-off", "network-on"])
def test_loaded_filter_answers_each_rule(tmp_path: Path, network_restricted: bool) -> None:
    bpf = write_bpf(tmp_path, network_restricted)
    calls = [[syscall_number(name), args] for _, name, args, *_ in CASES]
    proc = run_child(SYSCALLS, str(bpf), json.dumps(calls))
    assert proc.returncode == 0, proc.stderr
    before, after = json.loads(proc.stdout)
    wrong, blind = [], []
    for (label, _, _, restricted, on, privileged), was, now in zip(CASES, before, after, strict=True):
        expected = restricted if network_restricted else on
        if expected is ALLOWED:
            if now != was:
                wrong.append(f"{label}: filter changed {errno.errorcode.get(was, was)} to {errno.errorcode.get(now)}")
            continue
        if now != expected:
            wrong.append(f"{label}: got {errno.errorcode.get(now, now)}, want {errno.errorcode[expected]}")
        if was == expected and (ROOT or not privileged):
            blind.append(label)
    assert wrong == []
    # the kernel's own answer must differ from the filter's, or the case proves nothing (without root the
    # kernel refuses the privileged calls itself with EPERM, so those are left out then)
    assert blind == []


def _killed_by(code: str, bpf: Path | None) -> int:
    """Exit status of a child running ``code``, after loading ``bpf`` when given."""
    prelude = LOADER + "import resource\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    if bpf is not None:
        prelude += f"load_filter({str(bpf)!r})\n"
    return run_child(prelude + code).returncode


X32_GETPID = "libc.syscall(0x40000000 | 39)\nprint('survived')\n"
# mov eax, 20 (getpid in the i386 table); int 0x80; ret
I386_GETPID = """
import mmap
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes.fromhex("b814000000cd80c3"))
ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
print("survived")
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and i386 are x86_64 ABIs")
@pytest.mark.parametrize("code", [X32_GETPID, I386_GETPID], ids=["x32", "i386"])
def test_other_abis_kill_the_process(tmp_path: Path, code: str) -> None:
    control = _killed_by(code, None)
    if control != 0:
        pytest.skip(f"this kernel does not run that ABI at all (exit {control})")
    assert _killed_by(code, write_bpf(tmp_path, True)) == -signal.SIGSYS


# -- the probe fails closed -------------------------------------------------------------------------


class _Unloadable(sc.SeccompFilters):
    """A fake: a program the kernel refuses, as on a kernel without seccomp (this one has it)."""

    def bpf(self, network_restricted: bool) -> bytes:
        return struct.pack("=HBBI", 0xFFFF, 0, 0, 0)


class _AllowAll(sc.SeccompFilters):
    """A fake: a filter that loads but stops nothing, as a broken build would."""

    def bpf(self, network_restricted: bool) -> bytes:
        return struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000)


needs_bwrap = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed")


@needs_bwrap
async def test_probe_reports_the_working_filter() -> None:
    probe = await SandboxBackend.probe_boundary(seccomp=sc.SeccompFilters())
    assert probe.ok, probe
    assert "socket(AF_UNIX) refused with EPERM" in probe.reason


@needs_bwrap
async def test_probe_fails_closed_when_seccomp_does_not_load() -> None:
    probe = await SandboxBackend.probe_boundary(seccomp=_Unloadable())
    assert not probe.ok
    assert "seccomp" in probe.reason
    assert probe.fix == sc.LOAD_FAILED_FIX


@needs_bwrap
async def test_probe_fails_closed_when_the_filter_lets_af_unix_through() -> None:
    probe = await SandboxBackend.probe_boundary(seccomp=_AllowAll())
    assert not probe.ok
    assert "did not refuse socket(AF_UNIX)" in probe.reason


def test_probe_verdicts() -> None:
    assert not sc.check_probe("1000\nCapEff:\t0000000000000000\nSeccomp:\t0\n").ok
    assert not sc.check_probe("Seccomp:\t2\nAF_UNIX 0\n").ok
    assert sc.check_probe("Seccomp:\t2\nAF_UNIX 1\n").ok
    unexercised = sc.check_probe("Seccomp:\t2\n")
    assert unexercised.ok and "not exercised" in unexercised.reason
