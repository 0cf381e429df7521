"""Jupyter kernels inside the OS sandbox, reached over IPC sockets in the workspace.

The kernel is a long-lived process of the sandbox backend (its public
:meth:`~execspace.backends.sandbox.Sandbox.start_process`): the same bubblewrap command line, policy,
per-workspace uid, cgroup and rlimits, environment policy and supervision as ``run_program``. What differs:

* **Transport.** The sandbox has its own (empty) network namespace, so the kernel's TCP ports would be
  out of our reach. It binds ZMQ ``ipc`` sockets instead, in its run directory (``runs/<run>/k-1``…
  ``k-5``), which is bound writable into the sandbox. We connect to them through an fd of that directory
  (``/proc/self/fd/N/k-1``): short enough for ``sun_path`` (108 bytes) wherever the workspace lives, and
  pinned to the directory we created even if a program renames things around it.
* **Unix sockets.** The network-restricted seccomp filter refuses ``socket(AF_UNIX)`` (host daemons'
  sockets in bound directories); a kernel needs it to bind its channels. bwrap loads that filter without
  the AF_UNIX rule (:class:`~execspace.backends.sandbox.KernelSeccompFilters`); the launcher
  below binds the channels, then stacks a filter refusing ``socket(AF_UNIX)`` on every thread
  (``SECCOMP_FILTER_FLAG_TSYNC``; bwrap set ``no_new_privs`` already) and checks that it holds, all
  before the kernel reads its first request, so user code never runs without it.
* **Start-up.** The interpreter runs isolated (``-I``: no cwd on sys.path, no user site, no ``PYTHON*``
  variables), IPython reads no config files and gets a fresh profile in the run directory: nothing the
  program could have written runs before the lock (see :data:`LAUNCHER`).
* **Key.** The connection file (it holds the HMAC key) goes to the launcher on stdin and becomes a memfd
  of the kernel, never a file in the workspace, in ``/tmp`` (which a policy grant may replace) or on a
  command line.
* **Reconnects.** We connect once the launcher said it is ready, to ``/proc/self/fd/N`` of an ``O_PATH``
  fd of each socket file, checked to be a socket: a reconnect reaches that inode and nothing else, so code
  in the kernel cannot swap a socket file for a link to a host daemon's socket and have us connect there.
  (Reconnects are not turned off: with ``ZMQ_RECONNECT_IVL=-1`` libzmq 4.3 ends a lost connection like a
  ``zmq_disconnect``, dropping the messages we have not read, and aborts the whole process on
  ``!_more (fq.cpp)`` when that happens between two frames of a message: any kernel's death killed the
  host engine and every other tenant's kernel session.)
* **Message size.** Our sockets refuse frames over ``max_message_bytes`` (``ZMQ_MAXMSGSIZE``): libzmq then
  cuts that connection for good, which we treat as the kernel's end (it is stopped, the cell says why).
  And they queue at most :data:`RECEIVE_QUEUE` messages (``ZMQ_RCVHWM``, 1000 by default): a kernel that
  sends faster than we write its outputs waits with the rest in its own, limited memory, so what one kernel
  makes us hold does not grow with how far ahead of us it runs.
* **Interrupts** go as ``interrupt_request`` messages on the control channel (a signal from the host
  would reach bwrap, not the kernel); ipykernel then signals its own process group.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass, field, replace
from typing import Any, cast

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient

from ...errors import SetupFailed
from ...models import ResourceLimits, RunResult, Workspace
from ...process.freezing import Hold
from ...process.supervisor import SupervisedProcess
from ..sandbox import KernelSeccompFilters, Sandbox
from .hostkernels import PYTHON_KERNEL_ARGS, ZmqConnection
from .interpreters import Interpreter
from .outputs import OUTPUT_BOUNDS, RichOutputLimits

__all__ = [
    "LAUNCHER",
    "SandboxKernelConfig",
    "SandboxedKernel",
    "start_sandboxed",
]

#: Channel → socket file suffix in the run directory (``k-1`` …).
PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
READY = b"execspace-kernel-ready\n"
#: Bytes kept of the launcher's own stdout/stderr pipes (only the ready line is expected there).
_PIPE_BYTES = 64 * 1024
#: Messages each of our sockets holds from a kernel before libzmq stops reading (the kernel then waits).
RECEIVE_QUEUE = 2

#: Runs in the sandbox as ``python -I -c``: reads its configuration from stdin, sends its own output to the
#: kernel log, binds the kernel's channels, locks unix sockets out, says it is ready, serves.
#:
#: Nothing the program can write may run before the lock. ``-I`` keeps the cwd (``work/``), the user site in
#: the writable HOME and ``PYTHON*`` variables off; sys.path then holds read-only directories only. IPython
#: reads no config files (they are code) and its profile is fresh in the kernel's run directory, so startup
#: files planted in ``home/.ipython`` never run. The lock comes as soon as the last channel is bound, before
#: ipykernel puts the cwd on sys.path and runs the shell's start-up; the connection file (it holds the key)
#: is a memfd, so that the kernel needs no writable /tmp.
LAUNCHER = (
    r"""
import base64, ctypes, json, os, socket, sys, time

def lock(bpf):
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    nr = {"x86_64": 317, "aarch64": 277}[os.uname().machine]
    prog = Prog(len(bpf) // 8, bpf)
    libc = ctypes.CDLL(None, use_errno=True)
    # SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC: the kernel's threads are running already
    if libc.syscall(ctypes.c_long(nr), ctypes.c_long(1), ctypes.c_long(1), ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "cannot stack the unix socket filter")
    try:
        socket.socket(socket.AF_UNIX).close()
    except PermissionError:
        return
    raise SystemExit("the unix socket filter did not hold")

cfg = json.loads(sys.stdin.readline())
import site
for d in cfg["site"]:
    site.addsitedir(d)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
log = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
ready = os.dup(1)
os.dup2(log, 1)
os.dup2(log, 2)
conn = os.memfd_create("execspace-kernel")
os.write(conn, json.dumps(cfg["connection"]).encode())
os.mkdir(cfg["profile"], 0o700)
from ipykernel.kernelapp import IPKernelApp

class Kernel(IPKernelApp):
    locked = not cfg["lock"]

    # config files are code, and the profile directory is writable by the program
    def load_config_file(self, *args, **kwargs):
        pass

    def init_heartbeat(self):
        super().init_heartbeat()
        hb = f"{self.ip}-{self.hb_port}"
        deadline = time.monotonic() + 10
        while not os.path.exists(hb):  # the heartbeat thread binds its channel
            if time.monotonic() > deadline:
                raise SystemExit("the heartbeat channel was not bound")
            time.sleep(0.001)
        if not self.locked:
            lock(base64.b64decode(cfg["lock"]))
            self.locked = True

    def init_path(self):
        if not self.locked:
            raise SystemExit("the unix socket filter is not in force before the working directory goes on sys.path")
        # where IPython puts it (-I makes IPython skip this): cells import the workspace's modules
        at = next((i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))), 0)
        sys.path.insert(at, "")

"""
    + OUTPUT_BOUNDS
    + r"""app = Kernel.instance()
# the stdlib's json: jupyter_client packs with orjson where it is installed, and orjson 3.13 crashes the kernel
# (SIGSEGV) on a flood of large outputs in the unprivileged sandbox
packers = ["--Session.packer=json", "--Session.unpacker=json"]
app.initialize(["-f", f"/proc/self/fd/{conn}", f"--ProfileDir.location={cfg['profile']}", *packers, *cfg["args"]])
os.close(conn)
bound_outputs(app, cfg["message_bytes"])
os.write(ready, cfg["ready"].encode())
os.close(ready)
app.start()
"""
)


@dataclass(slots=True)
class SandboxedKernel:
    """The process side of a kernel in the sandbox (the ``KernelProcess`` of :mod:`.local`)."""

    proc: SupervisedProcess
    done: asyncio.Future[RunResult]
    dir_fd: int
    context: zmq.asyncio.Context
    kc: Any = None
    socket_fds: dict[str, int] = field(default_factory=dict)
    """Channel → ``O_PATH`` fd of the kernel's socket file we connect to."""
    monitors: list[zmq.Socket[Any]] = field(default_factory=list)
    """Disconnect events of our shell and iopub sockets: a kernel whose connection dropped is gone for us."""
    max_message_bytes: int = 0

    @property
    def pid(self) -> int | None:
        """The host pid of the sandbox (bwrap, whose death takes the kernel along); not the kernel's own."""
        return self.proc.pid

    def hold(self) -> Hold | None:
        """Its sandbox's processes held the way the sandbox was started with (its cgroup freezer as root)."""
        pid = self.proc.pid
        return None if pid is None else self.proc.freezer([pid], ())

    async def is_alive(self) -> bool:
        return not self.done.done() and not self._cut()

    def _cut(self) -> bool:
        """Whether libzmq dropped a connection for good (a frame over ``max_message_bytes``)."""
        return any(int(m.getsockopt(zmq.EVENTS)) & zmq.POLLIN for m in self.monitors)

    async def interrupt(self) -> None:
        if self.kc is not None and not self.done.done():
            self.kc.control_channel.send(self.kc.session.msg("interrupt_request", content={}))

    async def exit_status(self) -> tuple[int | None, str]:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.done), 1.0)  # a dying kernel cuts its connections first
        if not self.done.done():
            if self._cut():
                return None, f"it sent a message over max_message_bytes ({self.max_message_bytes}), which we refuse"
            return None, "it stopped responding"
        result = self.done.result()
        how = f"exit code {result.exit_code}"
        if result.limit_hit is not None:
            how += f", the sandbox's {result.limit_hit} limit was exceeded"
        return result.exit_code, how

    async def stop(self) -> None:
        if self.kc is not None:
            with contextlib.suppress(Exception):
                self.kc.stop_channels()
        for m in self.monitors:
            m.close(linger=0)
        with contextlib.suppress(Exception):
            await self.proc.kill()
        with contextlib.suppress(Exception):
            await self.done
        self.context.destroy(linger=0)
        for n in PORTS.values():
            with contextlib.suppress(OSError):
                os.unlink(f"k-{n}", dir_fd=self.dir_fd)
        for fd in (*self.socket_fds.values(), self.dir_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True, slots=True)
class SandboxKernelConfig:
    """How an engine starts its sandboxed kernels."""

    sandbox: Sandbox
    """The engine's sandbox (its runs' wrapper, which starts a kernel as a program of its runner)."""
    seccomp: KernelSeccompFilters
    """What bwrap loads for the kernel (the unix socket lock comes from the launcher)."""
    interpreter: Interpreter
    limits: ResourceLimits
    """Applied to the whole kernel sandbox for its lifetime (cgroup or rlimits, as for programs)."""
    network: bool
    max_message_bytes: int = RichOutputLimits().message_bytes
    """Largest frame our sockets take from the kernel (``ZMQ_MAXMSGSIZE``)."""

    async def start(self, ws: Workspace, *, timeout: float) -> ZmqConnection:  # noqa: ASYNC109
        """A kernel in ``ws``'s sandbox (the pool and the launcher are in :mod:`.sandboxpool`)."""
        proc, kc = await start_sandboxed(self, ws, args=PYTHON_KERNEL_ARGS, timeout=timeout)
        return ZmqConnection(proc, kc)


async def start_sandboxed(
    cfg: SandboxKernelConfig,
    ws: Workspace,
    *,
    args: list[str],
    timeout: float,  # noqa: ASYNC109 - start-up deadline handed down
) -> tuple[SandboxedKernel, Any]:
    """Start a kernel in ``ws``'s sandbox and connect a client; return (process, ``AsyncKernelClient``)."""
    from jupyter_client.connect import KernelConnectionInfo

    python = cfg.interpreter
    argv = [python.path, "-I", "-c", LAUNCHER]
    limits = replace(cfg.limits, output_bytes=_PIPE_BYTES)
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_bytes)
    context.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
    try:
        started = await cfg.sandbox.start_process(ws, argv, limits=limits, seccomp=cfg.seccomp)
    except BaseException as exc:
        context.destroy(linger=0)
        if isinstance(exc, FileNotFoundError):  # the interpreter (or bwrap itself) is not there
            raise SetupFailed("jupyter", f"the sandboxed kernel could not be started: {exc}", _FIX) from exc
        raise
    proc, dir_fd, run_dir = started.process, started.run_dir_fd, started.run_dir
    key = secrets.token_hex(32)
    run = started.run_path
    conn = {**PORTS, "transport": "ipc", "ip": f"{run}/k", "key": key, "signature_scheme": "hmac-sha256"}
    payload = {
        "connection": conn,
        "args": args,
        "site": list(python.site_dirs),
        "log": f"{run}/kernel.log",
        "profile": f"{run}/ipython",
        "message_bytes": cfg.max_message_bytes,
        "lock": "" if cfg.network else base64.b64encode(cfg.seccomp.unix_lock_bpf()).decode(),
        "ready": READY.decode(),
    }
    kernel = SandboxedKernel(proc, asyncio.ensure_future(proc.wait()), dir_fd, context)
    kernel.max_message_bytes = cfg.max_message_bytes
    try:
        await proc.write_stdin((json.dumps(payload) + "\n").encode())
        await _wait_ready(kernel, run_dir, time.monotonic() + timeout)
        kernel.socket_fds = _pin_sockets(dir_fd, run_dir)
        kc = _PinnedClient(context=context)
        kc.load_connection_info(cast("KernelConnectionInfo", conn))
        kc.socket_fds = kernel.socket_fds
        kernel.kc = kc
        kc.start_channels(hb=False)
        kernel.monitors = [
            channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            for channel in (kc.shell_channel, kc.iopub_channel)
        ]
        await kc.wait_for_ready(timeout=max(0.1, timeout))
    except BaseException as exc:
        await kernel.stop()
        if not isinstance(exc, Exception) or isinstance(exc, SetupFailed):
            raise
        raise SetupFailed("jupyter", f"the sandboxed kernel did not start: {exc}", _FIX) from exc
    return kernel, kc


async def _wait_ready(kernel: SandboxedKernel, run_dir: str, deadline: float) -> None:
    seen, errors = b"", b""
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            async for chunk in kernel.proc.stream():
                if chunk.stream == "stdout":
                    seen += chunk.data
                else:
                    errors = (errors + chunk.data)[-2000:]
                if READY in seen:
                    break
    except TimeoutError:
        pass
    if READY not in seen:
        why = errors.decode("utf-8", "replace").strip().splitlines()[-3:] or [_log_tail(kernel.dir_fd)]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(kernel.done), 1.0)
        if kernel.done.done():
            why.append(f"it ended: {(await kernel.exit_status())[1]}")
        raise SetupFailed("jupyter", f"the sandboxed kernel did not start: {' | '.join(why)}", _FIX)


def _pin_sockets(dir_fd: int, run_dir: str) -> dict[str, int]:
    """Channel → ``O_PATH`` fd of the kernel's socket file for it (a link or anything else is refused)."""
    fds: dict[str, int] = {}
    try:
        for port, n in PORTS.items():
            fd = os.open(f"k-{n}", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            fds[port.removesuffix("_port")] = fd
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise SetupFailed("jupyter", f"{run_dir}/k-{n} is not the kernel's socket", _FIX)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


class _PinnedClient(AsyncKernelClient):
    """Connects each channel to the socket inode checked at start, reached through its ``O_PATH`` fd."""

    socket_fds: dict[str, int]

    def _make_url(self, channel: str) -> str:
        return f"ipc:///proc/self/fd/{self.socket_fds[channel]}"


def _log_tail(dir_fd: int) -> str:
    """The end of the kernel's log; the sandbox could have put anything there (non-blocking: not a FIFO trap)."""
    try:
        fd = os.open("kernel.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return "no kernel.log"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return "kernel.log is not a file"
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, os.fstat(fd).st_size - 2000))
        lines = f.read().decode("utf-8", "replace").strip().splitlines()
    return " | ".join(lines[-3:]) or "it exited without a message"


_FIX = (
    "see kernel.log in the workspace's runs/ directory; the kernel's Python needs ipykernel and must be readable "
    "by the sandbox (mode=HostKernels() runs kernels on the host without a sandbox)"
)
