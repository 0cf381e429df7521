"""The seccomp filter that bubblewrap loads before it runs the program (``bwrap --seccomp FD``).

Namespaces and dropped capabilities already stop most escapes; this filter closes the routes they leave
open and removes kernel attack surface that sandboxed code has no use for. Design choices:

* **Default allow, deny by rule.** An allow-list of syscalls breaks ordinary programs with every new libc
  or runtime; the rules below name what is refused and why (:data:`ALWAYS`, :data:`RESTRICTED_NETWORK`).
* **EPERM, not kill**, so a program gets a clear ``Operation not permitted`` it can report or work around.
  ``clone3`` is the exception: ENOSYS, because its flags live in memory seccomp cannot read, and libc and
  language runtimes fall back to ``clone``, whose flags the filter can check.
* **Only the native ABI** (x86_64 or aarch64). A syscall through another ABI (x32 or 32-bit compat on
  x86_64, arm32 on aarch64) has other numbers that these rules do not check, so it kills the process.
* **Integer arguments are compared on their low 32 bits**: the kernel truncates ``int`` arguments, so a
  program passing ``AF_UNIX | 1 << 32`` would slip past a 64-bit comparison (the TIOCSTI filter bypass).
* ``personality()`` is left alone: its flags (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC…) weaken only the
  calling process, the setuid exec where they mattered is moot under bwrap's no_new_privs, and tools such as
  ``setarch`` need it.

The BPF program is built with libseccomp, called through ctypes, once per :class:`SeccompFilters`, and handed
to each run in a sealed memfd. It is never kept on disk: a compiled filter in a file is trusted by every later
run, and a sandbox granted write access over that file (a ``/tmp`` grant, as the same uid) could swap in a
weaker one. Building takes about half a millisecond; only ``pyseccomp``'s import was slow (it runs
``ctypes.util.find_library`` twice, ~90 ms), so it is not used.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shlex
from dataclasses import dataclass

from ...errors import SetupFailed
from ...registry import Probe

__all__ = [
    "ALWAYS",
    "LOAD_FAILED_FIX",
    "RESTRICTED_NETWORK",
    "SET_ID_BITS",
    "Deny",
    "KernelSeccompFilters",
    "SeccompFilters",
    "build_bpf",
    "build_unix_lock_bpf",
    "check_probe",
    "describe",
    "probe_script",
    "rules",
    "sealed_memfd",
]

_INT = 0xFFFF_FFFF
_AF_UNIX = 1
_AF_VSOCK = 40
_SOCK_STREAM = 1
_SOCK_SEQPACKET = 5
_SOCK_TYPE_MASK = 0xF  # the rest of the type argument is SOCK_NONBLOCK / SOCK_CLOEXEC
_FALLOC_KEEP_SIZE = 0x01  # punching holes (KEEP_SIZE | PUNCH_HOLE) frees blocks and stays allowed
_FALLOC_ZERO_RANGE = 0x10
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_S_ISUID = 0o4000
_S_ISGID = 0o2000
_O_CREAT = 0o100
_O_TMPFILE = 0o20000000  # __O_TMPFILE: O_TMPFILE without O_DIRECTORY, the bit that says "make a file"
_CLONE_NEW_FLAGS = (
    0x0002_0000,  # CLONE_NEWNS
    0x0200_0000,  # CLONE_NEWCGROUP
    0x0400_0000,  # CLONE_NEWUTS
    0x0800_0000,  # CLONE_NEWIPC
    0x1000_0000,  # CLONE_NEWUSER
    0x2000_0000,  # CLONE_NEWPID
    0x4000_0000,  # CLONE_NEWNET
)


@dataclass(frozen=True, slots=True)
class Deny:
    """Calls of ``syscalls`` whose arguments match every ``when`` condition fail with ``error``.

    A condition ``(index, mask, value)`` matches when ``args[index] & mask == value``.
    """

    label: str
    syscalls: tuple[str, ...]
    why: str
    when: tuple[tuple[int, int, int], ...] = ()
    error: int = errno.EPERM


_MOUNT_API = (
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
)
_HOST_ADMIN = (
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "syslog",
)

#: Rules applied whatever the network mode: they guard kernel objects no namespace separates, or kernel
#: attack surface that has nothing to do with the network.
ALWAYS: tuple[Deny, ...] = (
    Deny(
        "socket/socketpair(AF_VSOCK)",
        ("socket", "socketpair"),
        "vsock talks to the hypervisor and the VM host, outside every network namespace",
        ((0, _INT, _AF_VSOCK),),
    ),
    Deny(
        "io_uring",
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
        "io_uring runs socket and file operations that seccomp never sees, and is a rich source of kernel bugs",
    ),
    Deny("bpf", ("bpf",), "eBPF loading is kernel attack surface (verifier bugs) with no use in a sandbox"),
    Deny("perf_event_open", ("perf_event_open",), "performance counters leak timing and kernel addresses"),
    Deny("userfaultfd", ("userfaultfd",), "userfaultfd stalls kernel copies at will: the classic race widener"),
    Deny(
        "keyctl/add_key/request_key",
        ("keyctl", "add_key", "request_key"),
        "keyrings are not namespaced: the keys of the host user would be reachable",
    ),
    Deny(
        "ptrace/process_vm_*/process_madvise/pidfd_getfd",
        ("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd"),
        "reading, writing or steering another process's memory (or stealing its fds) is not needed to run "
        "code, and ptrace has a long history of kernel bugs",
    ),
    Deny(
        "kexec/reboot/modules/acct/swap/syslog",
        _HOST_ADMIN,
        "kexec, reboot, modules, accounting, swap and the kernel log belong to the host; refused before "
        "any capability check can go wrong (syslog would otherwise read the kernel log where dmesg is open)",
    ),
    Deny(
        "the mount API (mount, umount2, pivot_root, fs*, move_mount, open_tree, mount_setattr)",
        _MOUNT_API,
        "the sandbox's mount table is final: no remount, new mount or mount-fd tricks over bound host paths",
    ),
    Deny(
        "unshare/setns",
        ("unshare", "setns"),
        "new namespaces (above all user namespaces) open kernel surface that bwrap deliberately withheld",
    ),
    Deny(
        "clone3",
        ("clone3",),
        "its flags are in memory and cannot be checked; ENOSYS makes libc and runtimes fall back to clone",
        error=errno.ENOSYS,
    ),
    *(
        Deny(
            "clone(CLONE_NEW*)",
            ("clone",),
            "clone with a namespace flag is unshare by another name",
            ((0, flag, flag),),
        )
        for flag in _CLONE_NEW_FLAGS
    ),
    Deny(
        "ioctl(TIOCSTI)",
        ("ioctl",),
        "pushes characters into a terminal's input: commands typed into the user's shell",
        ((1, _INT, _TIOCSTI),),
    ),
    Deny(
        "ioctl(TIOCLINUX)",
        ("ioctl",),
        "console selection paste is the same injection on a Linux virtual console",
        ((1, _INT, _TIOCLINUX),),
    ),
    *(
        Deny(
            "fallocate(FALLOC_FL_KEEP_SIZE)",
            ("fallocate",),
            "reserves blocks past the end of a file without growing it: RLIMIT_FSIZE never sees them, so "
            "file_size_bytes would not bound the disk a file takes (EOPNOTSUPP, as on a filesystem without it)",
            ((1, _INT, mode),),
            errno.EOPNOTSUPP,
        )
        for mode in (_FALLOC_KEEP_SIZE, _FALLOC_KEEP_SIZE | _FALLOC_ZERO_RANGE)
    ),
)


def _mode_rules(label: str, syscalls: tuple[str, ...], mode_arg: int, *also: tuple[int, int, int]) -> tuple[Deny, ...]:
    """Calls of ``syscalls`` whose mode argument (index ``mode_arg``) has the set-user-ID or set-group-ID bit,
    each bit a rule of its own (seccomp's conditions are all-of), with the conditions ``also``."""
    why = (
        "a set-user-ID or set-group-ID file made in a write grant runs as its owner for every user of the host: as "
        "root the files a program makes in a grant are the tree's owner's (root's, for a root-owned project)"
    )
    return tuple(Deny(label, syscalls, why, ((mode_arg, bit, bit), *also)) for bit in (_S_ISUID, _S_ISGID))


#: Rules that keep a program from making set-user-ID or set-group-ID files: in every sandbox but a machine's
#: (whose root installs packages that have such programs; its files are its own layers', never a host tree's).
#: ``openat2`` is refused outright (its mode is in memory seccomp cannot read; ENOSYS makes libc fall back).
SET_ID_BITS: tuple[Deny, ...] = (
    *_mode_rules("chmod/fchmod/fchmodat(S_ISUID|S_ISGID)", ("chmod", "fchmod"), 1),
    *_mode_rules("chmod/fchmod/fchmodat(S_ISUID|S_ISGID)", ("fchmodat", "fchmodat2"), 2),
    *_mode_rules("creat/mknod(S_ISUID|S_ISGID)", ("creat", "mknod"), 1),
    *_mode_rules("creat/mknod(S_ISUID|S_ISGID)", ("mknodat",), 2),
    *(
        rule
        for flag in (_O_CREAT, _O_TMPFILE)
        for rule in (
            *_mode_rules("open/openat(O_CREAT, S_ISUID|S_ISGID)", ("open",), 2, (1, flag, flag)),
            *_mode_rules("open/openat(O_CREAT, S_ISUID|S_ISGID)", ("openat",), 3, (2, flag, flag)),
        )
    ),
    Deny(
        "openat2",
        ("openat2",),
        "its mode is in memory and cannot be checked for set-ID bits; ENOSYS makes libc and runtimes fall back to "
        "openat",
        error=errno.ENOSYS,
    ),
)


#: Rules added when the network is restricted. With the network on, the sandbox shares the host's network
#: namespace, so host loopback services and abstract unix sockets are reachable anyway, and tools expect
#: AF_UNIX (nscd, syslog, D-Bus clients).
RESTRICTED_NETWORK: tuple[Deny, ...] = (
    Deny(
        "socket(AF_UNIX)",
        ("socket",),
        "the empty network namespace hides abstract sockets but not path ones: host daemons' sockets in a "
        "bound directory (the workspace, a granted path) would stay reachable",
        ((0, _INT, _AF_UNIX),),
    ),
    *(
        Deny(
            "socketpair(AF_UNIX, datagram)",
            ("socketpair",),
            "a datagram unix socket, even one from socketpair(), can sendto() any named unix socket; the kernel "
            "turns SOCK_RAW into SOCK_DGRAM, so only stream and seqpacket pairs (which cannot address a third "
            "socket; Python's multiprocessing and asyncio use them) are let through",
            ((0, _INT, _AF_UNIX), (1, _SOCK_TYPE_MASK, sock_type)),
        )
        for sock_type in range(_SOCK_TYPE_MASK + 1)
        if sock_type not in (_SOCK_STREAM, _SOCK_SEQPACKET)
    ),
)


_UNIX_SOCKET_RULE = RESTRICTED_NETWORK[0]


def rules(network_restricted: bool, *, set_id_bits: bool = False) -> tuple[Deny, ...]:
    """The rules of one filter; ``set_id_bits`` leaves out :data:`SET_ID_BITS` (a machine's)."""
    chosen = ALWAYS if set_id_bits else ALWAYS + SET_ID_BITS
    return chosen + RESTRICTED_NETWORK if network_restricted else chosen


def describe() -> str:
    """What the filter refuses, in one line for ``Capabilities.details``."""
    off_only = dict.fromkeys(f"{r.label} (network off only)" for r in RESTRICTED_NETWORK)
    every = ALWAYS + SET_ID_BITS
    eperm = dict.fromkeys(r.label for r in every if r.error == errno.EPERM)
    enosys = dict.fromkeys(r.label for r in every if r.error == errno.ENOSYS)
    unsupported = dict.fromkeys(r.label for r in every if r.error == errno.EOPNOTSUPP)
    return (
        f"seccomp (libseccomp, loaded by bwrap): EPERM for {', '.join([*off_only, *eperm])}; "
        f"ENOSYS for {', '.join(enosys)}; EOPNOTSUPP for {', '.join(unsupported)}; "
        "a syscall of another ABI (x32, 32-bit compat) kills the process; "
        "a machine's filter lets set-ID bits (and openat2) through"
    )


# libseccomp's ABI (seccomp.h): the actions, filter attribute and comparison used here
_SCMP_ACT_ALLOW = 0x7FFF_0000
_SCMP_ACT_KILL_PROCESS = 0x8000_0000
_SCMP_ACT_ERRNO = 0x0005_0000
_SCMP_FLTATR_ACT_BADARCH = 2
_SCMP_CMP_MASKED_EQ = 7
_SCMP_ARCH_NATIVE = 0
_SCMP_ARCHES = (0xC000_003E, 0xC000_00B7)  # AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64


class _ArgCmp(ctypes.Structure):
    """``struct scmp_arg_cmp``."""

    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


def _libseccomp() -> ctypes.CDLL:
    """libseccomp with the prototypes of the calls made here (loading it takes well under a millisecond)."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError as exc:
        raise SetupFailed(
            "sandbox",
            f"cannot build the seccomp filter: {exc}",
            "install libseccomp (apt-get install libseccomp2, dnf install libseccomp)",
        ) from exc
    ctx, u32 = ctypes.c_void_p, ctypes.c_uint32
    for name, args, result in (
        ("seccomp_arch_native", (), u32),
        ("seccomp_init", (u32,), ctx),
        ("seccomp_release", (ctx,), None),
        ("seccomp_attr_set", (ctx, ctypes.c_int, u32), ctypes.c_int),
        ("seccomp_syscall_resolve_name_arch", (u32, ctypes.c_char_p), ctypes.c_int),
        ("seccomp_rule_add_array", (ctx, u32, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p), ctypes.c_int),
        ("seccomp_export_bpf", (ctx, ctypes.c_int), ctypes.c_int),
    ):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


def _check(result: int, call: str) -> None:
    if result < 0:  # libseccomp returns -errno
        raise SetupFailed(
            "sandbox",
            f"libseccomp's {call} failed: {os.strerror(-result)}",
            "report this as a bug, with `uname -rm` and the libseccomp version",
        )


def build_bpf(network_restricted: bool, *, allow_unix_socket: bool = False, set_id_bits: bool = False) -> bytes:
    """The classic-BPF program for one network mode, as ``bwrap --seccomp`` reads it.

    ``allow_unix_socket`` leaves out the ``socket(AF_UNIX)`` rule: only for a process that stacks
    :func:`build_unix_lock_bpf` on itself before it runs untrusted code (a sandboxed Jupyter kernel binds
    its IPC sockets first). ``set_id_bits`` leaves out :data:`SET_ID_BITS` (machine mode).
    """
    chosen = rules(network_restricted, set_id_bits=set_id_bits)
    if allow_unix_socket:
        chosen = tuple(r for r in chosen if r is not _UNIX_SOCKET_RULE)
    return _export(chosen)


def build_unix_lock_bpf() -> bytes:
    """A filter refusing only ``socket(AF_UNIX)``, for a process to stack on itself (``SECCOMP_FILTER_FLAG_TSYNC``)
    once it needs no new unix socket: with :func:`build_bpf` ``(True, allow_unix_socket=True)`` underneath, the
    stack refuses what the network-restricted filter alone refuses."""
    return _export((_UNIX_SOCKET_RULE,))


def _export(chosen: tuple[Deny, ...]) -> bytes:
    lib = _libseccomp()
    if lib.seccomp_arch_native() not in _SCMP_ARCHES:
        raise SetupFailed(
            "sandbox",
            f"the seccomp filter is only built for x86_64 and aarch64, not {os.uname().machine}",
            "use the container backend on this machine",
        )
    filt = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not filt:
        _check(-errno.ENOMEM, "seccomp_init")
    try:
        _check(lib.seccomp_attr_set(filt, _SCMP_FLTATR_ACT_BADARCH, _SCMP_ACT_KILL_PROCESS), "seccomp_attr_set")
        for rule in chosen:
            conditions = (_ArgCmp * len(rule.when))(
                *(_ArgCmp(index, _SCMP_CMP_MASKED_EQ, mask, value) for index, mask, value in rule.when)
            )
            for name in rule.syscalls:
                added = lib.seccomp_rule_add_array(
                    filt, _SCMP_ACT_ERRNO | rule.error, _syscall_number(lib, name), len(rule.when), conditions
                )
                _check(added, "seccomp_rule_add_array")
        with open(os.memfd_create("execspace-seccomp-export", os.MFD_CLOEXEC), "w+b") as out:
            _check(lib.seccomp_export_bpf(filt, out.fileno()), "seccomp_export_bpf")
            out.seek(0)
            return out.read()
    finally:
        lib.seccomp_release(filt)


#: Syscalls newer than some libseccomp releases that still run here, by their number (the same on x86_64 and
#: aarch64: added after the tables were unified).
_NEWER_SYSCALLS = {"fchmodat2": 452}
#: libseccomp's answer for a name it does not know at all (other negative numbers are its pseudo numbers for
#: a syscall of another arch, e.g. ``open`` on aarch64: a rule on one is left out of this arch's filter).
_NR_SCMP_ERROR = -1


def _syscall_number(lib: ctypes.CDLL, name: str) -> int:
    nr: int = lib.seccomp_syscall_resolve_name_arch(_SCMP_ARCH_NATIVE, name.encode())
    if nr == _NR_SCMP_ERROR and name in _NEWER_SYSCALLS:
        return _NEWER_SYSCALLS[name]
    if nr == _NR_SCMP_ERROR:
        # every rule names a syscall of both supported arches: an unknown name means an old libseccomp,
        # and skipping the rule would leave that syscall open
        raise SetupFailed(
            "sandbox",
            f"libseccomp does not know the syscall {name!r}",
            "upgrade libseccomp to 2.5.2 or later",
        )
    return nr


def sealed_memfd(data: bytes, name: str = "execspace-seccomp") -> int:
    """A read-only-forever memfd holding ``data``, positioned at offset 0; the caller closes it.

    Sealed so that nothing holding the fd (bwrap runs as the sandbox's uid) can change the program between
    our write and bwrap's read. Close-on-exec: only ``pass_fds`` hands it to bwrap, never to other programs
    started meanwhile.
    """
    import fcntl  # here, not at the top: the seal constants exist on Linux only, and macOS imports this module

    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class SeccompFilters:
    """The filters of one engine: each mode's BPF is built on first use and reused for every run.

    ``set_id_bits``: programs may make set-user-ID and set-group-ID files (a machine's root, which installs
    packages); elsewhere :data:`SET_ID_BITS` refuses them."""

    __slots__ = ("_bpf", "set_id_bits")

    def __init__(self, *, set_id_bits: bool = False) -> None:
        self._bpf: dict[bool, bytes] = {}
        self.set_id_bits = set_id_bits

    def bpf(self, network_restricted: bool) -> bytes:
        cached = self._bpf.get(network_restricted)
        if cached is None:
            # two threads racing here build the same bytes twice, which is harmless
            cached = self._bpf[network_restricted] = build_bpf(network_restricted, set_id_bits=self.set_id_bits)
        return cached

    def open_filter_fd(self, network_restricted: bool) -> int:
        """A sealed memfd with the BPF for ``bwrap --seccomp FD``; the caller closes it after the spawn."""
        return sealed_memfd(self.bpf(network_restricted))


class KernelSeccompFilters(SeccompFilters):
    """Filters for a process that binds its own unix sockets, then locks them out (a sandboxed Jupyter kernel):
    bwrap loads the network-restricted filter without the ``socket(AF_UNIX)`` rule, and the process stacks
    :meth:`unix_lock_bpf` before it runs untrusted code. With the network on both are the ordinary filter."""

    __slots__ = ("_lock",)

    def __init__(self, *, set_id_bits: bool = False) -> None:
        super().__init__(set_id_bits=set_id_bits)
        self._lock: bytes | None = None

    def bpf(self, network_restricted: bool) -> bytes:
        cached = self._bpf.get(network_restricted)
        if cached is None:
            cached = self._bpf[network_restricted] = build_bpf(
                network_restricted, allow_unix_socket=True, set_id_bits=self.set_id_bits
            )
        return cached

    def unix_lock_bpf(self) -> bytes:
        if self._lock is None:
            self._lock = build_unix_lock_bpf()
        return self._lock


#: The fix to name when bwrap cannot load the filter.
LOAD_FAILED_FIX = (
    "use a kernel built with CONFIG_SECCOMP_FILTER=y; in a container, allow seccomp() and prctl(PR_SET_SECCOMP) "
    "(Docker's and Podman's default profiles do)"
)

_AF_UNIX_TRY = """import socket
try:
    socket.socket(socket.AF_UNIX).close()
except OSError as exc:
    print("AF_UNIX", exc.errno)
else:
    print("AF_UNIX", 0)
"""


def probe_script(python: str | None) -> str:
    """Shell commands for the boundary probe: show the seccomp mode and try the call the filter must refuse.

    Without a Python visible in the sandbox only the mode is shown; bwrap itself fails if the kernel refuses the
    filter, so the probe still fails closed.
    """
    script = "grep '^Seccomp:' /proc/self/status"
    if python is not None:
        script += f"; {shlex.quote(python)} -c {shlex.quote(_AF_UNIX_TRY)}"
    return script + "; true"


def check_probe(stdout: str) -> Probe:
    """Judge the output of :func:`probe_script` (run with the network-restricted filter)."""
    found = dict(parts for parts in (line.split() for line in stdout.splitlines()) if len(parts) == 2)
    if found.get("Seccomp:") != "2":
        return Probe(False, "no seccomp filter was active inside the sandbox", LOAD_FAILED_FIX)
    unix = found.get("AF_UNIX")
    if unix is None:
        return Probe(True, "seccomp filter active (not exercised: no working python3 inside the sandbox)")
    if unix != str(errno.EPERM):
        return Probe(
            False,
            f"the seccomp filter did not refuse socket(AF_UNIX) inside the sandbox (errno {unix})",
            "report this as a bug, with `uname -rm` and the libseccomp version",
        )
    return Probe(True, "seccomp filter active (socket(AF_UNIX) refused with EPERM)")
