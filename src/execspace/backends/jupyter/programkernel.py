"""A kernel that is a program of a workspace's runner, its channels relayed over the program's stdin and stdout.

For a caller that starts the kernel like any command of an existing sandbox session (``ProgramRunner.start_program``
on the session's workspace: ``execspace serve``'s code interpreter), so that cells and commands share ``/tmp``,
processes and the network namespace, and the kernel ends with the session. The host cannot reach into the
session's network namespace (it has only its own loopback), and a session without the network refuses
``socket(AF_UNIX)`` to every program, so the kernel cannot bind ZMQ ``ipc`` sockets either: it binds ``tcp`` on the
sandbox's loopback, and a relay thread in the same process carries the ZMQ messages of the shell, control and iopub
channels over its stdin and stdout, as length-prefixed frames (see :data:`LAUNCHER`). The host signs, checks and
parses them with ``jupyter_client``'s :class:`~jupyter_client.session.Session`, the message handling every Jupyter
client uses.

Everything in the sandbox, the kernel's sockets and its key included, belongs to the sandbox's code, so the frames
are untrusted input: a frame longer than the cap ends the connection, one that fails its signature or its parse is
dropped. Interrupts are SIGINT to the kernel's process group (the handle's ``signal``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import SetupFailed
from ...models import OutputChunk, RunProgramSpec, RunResult, Workspace
from ...process.freezing import Hold
from ...protocols import ProgramHandle, ProgramRunner
from .hostkernels import PYTHON_KERNEL_ARGS
from .interpreters import Interpreter
from .outputs import OUTPUT_BOUNDS, RichOutputLimits

if TYPE_CHECKING:
    from jupyter_client.session import Session

__all__ = ["LAUNCHER", "ProgramKernel"]

_HEAD = struct.Struct("=I")
#: Channel numbers of a frame (its first byte).
_SHELL, _IOPUB, _CONTROL = 0, 1, 2
#: Largest message the kernel sends whole (bigger outputs become a note, long prints go in pieces: see LAUNCHER).
MESSAGE_BYTES = RichOutputLimits().message_bytes
#: Largest frame taken from the sandbox: a message and its framing. A longer one ends the connection.
MAX_FRAME = MESSAGE_BYTES + 64 * 1024
#: iopub messages, and bytes of them, read ahead of their reader (one message is always let in, however large):
#: beyond, the kernel's output waits in the sandbox, so that what one kernel makes the host hold stays bounded.
_HELD_MESSAGES = 64
_HELD_BYTES = 4 * 1024 * 1024
#: Shell replies kept for a reader (the oldest go first), and the largest kept: cells read iopub only, and a reply
#: must not hold up the iopub messages behind it.
_SHELL_KEPT = 16
_SHELL_BYTES = 64 * 1024
#: Bytes kept of the kernel's own stderr (C-level output, a failed start's traceback).
_STDERR_TAIL = 4000
#: Seconds between kernel_info requests while the kernel starts: the first is answered once it runs, unless the
#: relay's iopub joined after the answer went out (the first iopub message ends the wait at once).
_PROBE_EVERY = 0.5

#: Runs in the sandbox as ``python -I -c``: reads its configuration (the first frame on stdin), moves the channel off
#: fds 0 and 1 (C-level output and subprocesses write to stderr instead), binds the kernel on the sandbox's loopback
#: and relays its channels over the channel until the host closes it.
LAUNCHER = (
    r"""
import json, os, struct, sys, tempfile, threading

HEAD = struct.Struct("=I")
inp, out = os.dup(0), os.dup(1)  # not inherited by the kernel's subprocesses
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.dup2(2, 1)

def read_exact(n):
    data = b""
    while len(data) < n:
        part = os.read(inp, n - len(data))
        if not part:
            os._exit(0)  # the host is gone: so is the kernel
        data += part
    return data

cfg = json.loads(read_exact(HEAD.unpack(read_exact(4))[0]))
import site
for d in cfg["site"]:
    site.addsitedir(d)
conn = os.memfd_create("execspace-kernel")
os.write(conn, json.dumps(cfg["connection"]).encode())
from ipykernel.kernelapp import IPKernelApp

class Kernel(IPKernelApp):
    # a fresh profile, no config files: the kernel starts the same whatever the sandbox's home holds
    def load_config_file(self, *args, **kwargs):
        pass

    def write_connection_file(self):
        pass  # the relay reads the ports the kernel bound from the app

    def init_path(self):
        # where IPython puts it (-I makes IPython skip this): cells import the workspace's modules
        at = next((i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))), 0)
        sys.path.insert(at, "")

"""
    + OUTPUT_BOUNDS
    + r"""def relay(app):
    import zmq
    ctx = zmq.Context()
    socks = []
    for port, kind in ((app.shell_port, zmq.DEALER), (app.iopub_port, zmq.SUB), (app.control_port, zmq.DEALER)):
        s = ctx.socket(kind)
        if kind == zmq.SUB:
            s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(f"tcp://127.0.0.1:{port}")
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    poller.register(inp, zmq.POLLIN)
    pending = b""
    while True:
        for what, _ in poller.poll():
            if what == inp:
                data = os.read(inp, 1 << 20)
                if not data:
                    os._exit(0)
                pending += data
                while len(pending) >= 4 and len(pending) >= 4 + HEAD.unpack_from(pending)[0]:
                    size = HEAD.unpack_from(pending)[0]
                    frame, pending = pending[4 : 4 + size], pending[4 + size :]
                    parts, at = [], 5
                    for _ in range(HEAD.unpack_from(frame, 1)[0]):
                        n = HEAD.unpack_from(frame, at)[0]
                        parts.append(frame[at + 4 : at + 4 + n])
                        at += 4 + n
                    socks[frame[0]].send_multipart(parts)
            else:
                parts = what.recv_multipart()
                body = bytes([socks.index(what)]) + HEAD.pack(len(parts))
                body += b"".join(HEAD.pack(len(p)) + p for p in parts)
                data = memoryview(HEAD.pack(len(body)) + body)
                while data:
                    data = data[os.write(out, data):]

app = Kernel.instance()
packers = ["--Session.packer=json", "--Session.unpacker=json"]
profile = f"--ProfileDir.location={tempfile.mkdtemp(prefix='execspace-ipython-')}"
app.initialize(["-f", f"/proc/self/fd/{conn}", profile, *packers, *cfg["args"]])
os.close(conn)
bound_outputs(app, cfg["message_bytes"])
if cfg["startup"]:
    try:
        exec(compile(cfg["startup"], "<execspace-startup>", "exec"), {"__name__": "__execspace_startup__"})
    except Exception:
        import traceback
        traceback.print_exc()  # the kernel still serves cells, without what the start-up would have added
threading.Thread(target=relay, args=(app,), name="execspace-relay", daemon=True).start()
app.start()
"""
)


_FIX = "see the kernel's error above; its Python needs ipykernel (execspace env build code-interpreter has it)"


@dataclass(slots=True)
class _Frames:
    """The relay's frames, parsed from its stdout as it comes (untrusted: sizes are checked)."""

    pending: bytearray

    def feed(self, data: bytes) -> list[tuple[int, list[bytes]]]:
        self.pending += data
        found = []
        while len(self.pending) >= 4:
            size = _HEAD.unpack_from(self.pending)[0]
            if size > MAX_FRAME:
                raise ValueError(f"a frame of {size} bytes, over {MAX_FRAME}")
            if len(self.pending) < 4 + size:
                break
            frame = bytes(self.pending[4 : 4 + size])
            del self.pending[: 4 + size]
            found.append(_parts(frame))
        return found


def _parts(frame: bytes) -> tuple[int, list[bytes]]:
    count = _HEAD.unpack_from(frame, 1)[0]
    parts, at = [], 5
    for _ in range(count):
        n = _HEAD.unpack_from(frame, at)[0]
        if at + 4 + n > len(frame):
            raise ValueError("a frame's part runs past its end")
        parts.append(frame[at + 4 : at + 4 + n])
        at += 4 + n
    return frame[0], parts


def _frame(channel: int, parts: list[bytes]) -> bytes:
    body = bytes([channel]) + _HEAD.pack(len(parts)) + b"".join(_HEAD.pack(len(p)) + p for p in parts)
    return _HEAD.pack(len(body)) + body


class ProgramKernel:
    """A started kernel that is a program of a workspace: a :class:`~.kernels.KernelConnection`."""

    def __init__(self, handle: ProgramHandle, key: str) -> None:
        from jupyter_client.session import Session

        self.handle = handle
        self.session: Session = Session(
            key=key.encode(), signature_scheme="hmac-sha256", packer="json", unpacker="json"
        )
        self._iopub: asyncio.Queue[tuple[dict[str, Any], int]] = asyncio.Queue()
        self._shell: asyncio.Queue[tuple[dict[str, Any], int]] = asyncio.Queue()
        self._held = 0
        """Bytes of the messages in ``_iopub``."""
        self._room = asyncio.Event()
        self._out: asyncio.Queue[bytes] = asyncio.Queue()
        self._stderr = b""
        self._lost: str | None = None
        """Why the connection ended while the process may run (a malformed frame)."""
        self._ended = asyncio.Event()
        self._done: asyncio.Future[RunResult] = asyncio.ensure_future(handle.wait())
        self._done.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._reader = asyncio.create_task(self._read(handle.stream()))
        self._writer = asyncio.create_task(self._write())

    @classmethod
    async def start(
        cls,
        runner: ProgramRunner,
        ws: Workspace,
        spec_of: Callable[[str, Sequence[str]], RunProgramSpec],
        interpreter: Interpreter,
        *,
        timeout: float,  # noqa: ASYNC109 - the start-up's deadline
        startup: str = "",
        args: Sequence[str] = (),
    ) -> ProgramKernel:
        """Start a kernel as the program ``spec_of(command, args)`` of ``ws`` (the caller says where and how it
        runs: cwd, environment, tag; this module says what), and wait until its channels answer. ``startup``:
        Python source the kernel runs (with globals of its own) once IPython is set up, before any cell; ``args``:
        more of IPython's options (``--Class.trait=value``)."""
        spec = spec_of(interpreter.path, ("-I", "-c", LAUNCHER))
        key = secrets.token_hex(32)
        kernel = cls(await runner.start_program(ws, spec), key)
        connection = {"transport": "tcp", "ip": "127.0.0.1", "key": key, "signature_scheme": "hmac-sha256"}
        ports = {f"{name}_port": 0 for name in ("shell", "iopub", "stdin", "control", "hb")}
        config = {
            "connection": {**connection, **ports},
            "site": list(interpreter.site_dirs),
            "args": [*PYTHON_KERNEL_ARGS, *args],
            "startup": startup,
            "message_bytes": MESSAGE_BYTES,
        }
        try:
            payload = json.dumps(config).encode()
            await kernel.handle.write_stdin(_HEAD.pack(len(payload)) + payload)
            await kernel._ready(timeout)
        except BaseException:
            await kernel.stop()
            raise
        return kernel

    async def _ready(self, timeout: float) -> None:  # noqa: ASYNC109
        """Ask for kernel_info until an iopub message comes: the relay has then joined the kernel's iopub."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    self._send(_SHELL, "kernel_info_request", {})
                    if await self.next_iopub(_PROBE_EVERY) is not None:
                        break
                    if self._ended.is_set():
                        raise SetupFailed("jupyter", f"the Python kernel did not start: {self._why()}", _FIX)
        except TimeoutError:
            raise SetupFailed("jupyter", f"the Python kernel did not start in {timeout:g}s", _FIX) from None
        while not self._iopub.empty():
            self._taken(self._iopub.get_nowait())
        await self.drain()

    def _why(self) -> str:
        tail = self._stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        return " | ".join(tail) or self._lost or "it exited without a message"

    # -- the KernelConnection ----------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        return 0  # a reader that falls behind holds the kernel up instead

    def hold(self) -> Hold | None:
        return None  # a program of the sandbox's session: held with the session's programs when it is paused

    def execute(self, code: str, *, silent: bool = False) -> str:
        content = {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        return self._send(_SHELL, "execute_request", content)

    async def next_iopub(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        return self._taken(await _next(self._iopub, self._ended, timeout))

    async def next_shell(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        found = await _next(self._shell, self._ended, timeout)
        return found[0] if found is not None else None

    async def drain(self) -> None:
        while not self._shell.empty():
            self._shell.get_nowait()

    async def interrupt(self) -> None:
        with contextlib.suppress(Exception):
            await self.handle.signal(signal.SIGINT)

    async def is_alive(self) -> bool:
        return not self._ended.is_set() and not self._done.done()

    async def exit_status(self) -> tuple[int | None, str]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._done), 1.0)
        if not self._done.done() or self._done.cancelled() or self._done.exception() is not None:
            return None, self._lost or "it stopped responding"
        result = self._done.result()
        how = f"exit code {result.exit_code}"
        if result.limit_hit is not None:
            how += f", the sandbox's {result.limit_hit} limit was exceeded"
        return result.exit_code, how

    async def stop(self, *, wait: bool = True) -> None:
        with contextlib.suppress(Exception):
            await self.handle.kill()
        for task in (self._reader, self._writer, self._done):
            task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    # -- the channel -------------------------------------------------------------------------------

    def _send(self, channel: int, msg_type: str, content: dict[str, Any]) -> str:
        msg = self.session.msg(msg_type, content)
        self._out.put_nowait(_frame(channel, self.session.serialize(msg)))
        return str(msg["header"]["msg_id"])

    async def _write(self) -> None:
        while True:
            frame = await self._out.get()
            try:
                await self.handle.write_stdin(frame)
            except Exception:  # its stdin is gone: so is the kernel
                self._ended.set()
                return

    async def _read(self, chunks: AsyncIterator[OutputChunk]) -> None:
        frames = _Frames(bytearray())
        try:
            async for chunk in chunks:
                if chunk.stream == "stderr":
                    self._stderr = (self._stderr + chunk.data)[-_STDERR_TAIL:]
                    continue
                for channel, parts in frames.feed(chunk.data):
                    await self._deliver(channel, parts)
        except Exception as exc:  # the connection ended either way; a bad frame also ends the kernel (see stop)
            self._lost = f"its channel broke: {exc}"
        finally:
            self._ended.set()

    async def _deliver(self, channel: int, parts: list[bytes]) -> None:
        try:
            _, message = self.session.feed_identities(parts, copy=True)
            msg = self.session.deserialize(message, content=True, copy=True)
        except Exception:  # unsigned, or not a message: nothing the kernel sent
            return
        size = sum(map(len, parts))
        if channel == _SHELL and size <= _SHELL_BYTES:
            if self._shell.qsize() >= _SHELL_KEPT:
                self._shell.get_nowait()
            self._shell.put_nowait((msg, size))
        elif channel == _IOPUB:
            while self._held and (self._held + size > _HELD_BYTES or self._iopub.qsize() >= _HELD_MESSAGES):
                self._room.clear()
                await self._room.wait()
            self._held += size
            self._iopub.put_nowait((msg, size))

    def _taken(self, item: tuple[dict[str, Any], int] | None) -> dict[str, Any] | None:
        if item is None:
            return None
        msg, size = item
        self._held -= size
        self._room.set()
        return msg


async def _next(
    queue: asyncio.Queue[tuple[dict[str, Any], int]],
    ended: asyncio.Event,
    timeout: float,  # noqa: ASYNC109
) -> tuple[dict[str, Any], int] | None:
    if not queue.empty():
        return queue.get_nowait()
    if ended.is_set():
        return None
    getter = asyncio.ensure_future(queue.get())
    end = asyncio.ensure_future(ended.wait())
    try:
        await asyncio.wait((getter, end), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        end.cancel()
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    return None
