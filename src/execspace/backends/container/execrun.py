"""One program run through the Engine API's ``exec``: blocking steps, driven from a thread.

The exec's stream is the daemon's multiplexed format (8-byte frame headers); output
goes straight into head+tail buffers, so memory stays bounded whatever the program prints.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...process.capture import HeadTailBuffer

__all__ = ["KILL_GRACE", "KILL_SCRIPT", "SIGNAL_SCRIPT", "ExecRun"]

#: Seconds a timed-out or killed program has between SIGTERM and SIGKILL (its handlers' time to clean up).
KILL_GRACE = 2.0

#: Run as the program's own user in a second exec: kills every process that carries the run's
#: marker, with its process group (each exec starts as a session leader, so that catches the
#: children that dropped the marker but stayed in the group). The group is read from each marked
#: process's stat: the exec's own shell is not always readable in /proc (seen with ``sh -c``
#: whose children are), and its children are not group leaders. Twice, for forks in flight.
KILL_SCRIPT = r"""
m="$1=$2"
group_of() { s=$(cat "$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -- $s; echo "$3"; }
for pass in 1 2; do
  for d in /proc/[0-9]*; do
    if grep -qzx -- "$m" "$d/environ" 2>/dev/null; then
      p=${d#/proc/}
      g=$(group_of "$d") && [ "$g" -gt 1 ] && kill -9 "-$g" 2>/dev/null
      kill -9 "$p" 2>/dev/null
    fi
  done
done
exit 0
"""

#: Run like KILL_SCRIPT: sends signal ``$3`` once to each process group of the run's marked processes (the exec's
#: main one is a session leader; its children share its group unless they left it).
SIGNAL_SCRIPT = r"""
m="$1=$2"; seen=" "
for d in /proc/[0-9]*; do
  if grep -qzx -- "$m" "$d/environ" 2>/dev/null; then
    s=$(cat "$d/stat" 2>/dev/null) || continue; s=${s##*) }; set -- "$1" "$2" "$3" $s; g=$6
    case "$seen" in *" $g "*) continue ;; esac
    [ "$g" -gt 1 ] && kill -s "$3" -- "-$g" 2>/dev/null; seen="$seen$g "
  fi
done
exit 0
"""

_HEADER = 8
_STDOUT = 1


class ExecRun:
    """A started exec: feed stdin, pump output, kill its processes, read its exit code."""

    def __init__(
        self,
        api: Any,
        container_id: str,
        output_limit: int | None,
        on_chunk: Callable[[int, bytes], None] | None = None,
    ) -> None:
        self._api = api
        # called from the pumping thread with (1 or 2, data) for each frame, after it is captured
        self._on_chunk = on_chunk
        self._container = container_id
        self.stdout = HeadTailBuffer(output_limit)
        self.stderr = HeadTailBuffer(output_limit)
        self._exec_id = ""
        self._reader: Any = None
        self._response: Any = None
        self._sock: socket.socket | None = None
        self.started = 0.0
        self.ended = 0.0

    def start(self, argv: Sequence[str], env: dict[str, str], workdir: str, user: str) -> None:
        # the environment travels in the API request body, never on a command line
        created = self._api.exec_create(
            self._container,
            list(argv),
            stdin=True,
            stdout=True,
            stderr=True,
            environment=[f"{k}={v}" for k, v in env.items()],
            workdir=workdir,
            user=user,
        )
        self._exec_id = created["Id"]
        self.started = time.monotonic()
        # the SDK's socket=True hands back the raw socket and loses bytes the HTTP reader
        # already buffered; reading through that buffered reader keeps them
        res = self._api._post_json(
            self._api._url("/exec/{0}/start", self._exec_id),
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
            data={"Tty": False, "Detach": False},
            stream=True,
        )
        self._api._raise_for_status(res)
        self._response = res  # keeps the connection alive while we read
        self._reader = res.raw._fp.fp
        self._sock = self._reader.raw._sock

    def feed_stdin(self, data: bytes | None) -> None:
        """Send stdin (if any), then EOF. A program that exits without reading it is not an error."""
        with contextlib.suppress(OSError):
            if data:
                self.send_stdin(data)
            self.end_stdin()

    def send_stdin(self, data: bytes) -> None:
        """Blocks until the daemon took ``data``; raises ``OSError`` once the stream is closed."""
        assert self._sock is not None
        self._sock.sendall(data)

    def end_stdin(self) -> None:
        assert self._sock is not None
        self._sock.shutdown(socket.SHUT_WR)

    def pump(self) -> None:
        """Read frames until the daemon closes the stream (every holder of stdout/stderr is gone)."""
        buf = bytearray()
        try:
            while True:
                chunk = self._reader.read1(65536)
                if not chunk:
                    break
                buf += chunk
                self._split_frames(buf)
        except (OSError, ValueError):  # closed under us after a kill that did not end the stream
            pass
        self.ended = time.monotonic()

    def _split_frames(self, buf: bytearray) -> None:
        while len(buf) >= _HEADER:
            size = int.from_bytes(buf[4:_HEADER], "big")
            if len(buf) < _HEADER + size:
                return
            fd = 1 if buf[0] == _STDOUT else 2
            data = bytes(buf[_HEADER : _HEADER + size])
            del buf[: _HEADER + size]
            (self.stdout if fd == 1 else self.stderr).write(data)
            if self._on_chunk is not None and data:
                self._on_chunk(fd, data)

    def close(self) -> None:
        """Stop the stream; a pump still reading returns. Call :meth:`release` once it has."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        """Free the connection (the socket is shared by the reader, its buffer and the response)."""
        for closable in (self._reader, self._response, self._sock):
            if closable is not None:
                with contextlib.suppress(OSError, ValueError):
                    closable.close()

    def kill(self, marker_var: str, marker: str, user: str) -> None:
        """Kill what the run started, from a second exec in the same container."""
        kill_id = self._api.exec_create(
            self._container, ["sh", "-c", KILL_SCRIPT, "sh", marker_var, marker], user=user
        )["Id"]
        self._api.exec_start(kill_id)

    def signal(self, marker_var: str, marker: str, user: str, signame: str) -> None:
        """Send ``signame`` (e.g. ``TERM``) to the run's process groups, from a second exec."""
        script = ["sh", "-c", SIGNAL_SCRIPT, "sh", marker_var, marker, signame]
        signal_id = self._api.exec_create(self._container, script, user=user)["Id"]
        self._api.exec_start(signal_id)

    def pid(self, wait: float = 1.0) -> int:
        """The exec's main process id as the daemon reports it (0 if it does not within ``wait``)."""
        deadline = time.monotonic() + wait
        while True:
            pid = int(self._api.exec_inspect(self._exec_id).get("Pid") or 0)
            if pid or time.monotonic() > deadline:
                return pid
            time.sleep(0.002)

    def exit_code(self, wait: float = 2.0) -> int | None:
        """The exec's exit status once the daemon has it; ``None`` if it never reports one (or the exec went with
        its container, which stopped under it)."""
        from docker.errors import NotFound  # type: ignore[import-untyped]

        deadline = time.monotonic() + wait
        while True:
            try:
                info = self._api.exec_inspect(self._exec_id)
            except NotFound:
                return None
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                return None
            time.sleep(0.002)  # the stream ended: the daemon records the exit within a few ms
