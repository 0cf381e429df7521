"""``execspace daemon start|stop|status``: the warm process that makes each command start fast.

See :mod:`.forkserver` for what the daemon does and :mod:`.launcher` for how a command
reaches it. Nothing uses a daemon unless one was started; ``EXECSPACE_DAEMON=off`` bypasses
a running one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import SetupFailed
from .console import progress
from .daemonwire import daemon_socket_path, encode_request, private_dir_ok, read_key

__all__ = ["add_parser", "command", "ping"]

DEFAULT_IDLE_TIMEOUT = 900.0
_START_TIMEOUT = 20.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "daemon",
        help="start/stop the warm daemon that makes each execspace command start in milliseconds",
        description=(
            "A warm daemon keeps Python, asyncio and the backends imported; each `execspace` command then "
            "forks from it instead of starting from scratch (same user only, private socket and key). "
            "Set EXECSPACE_DAEMON=off to bypass it for one command."
        ),
    )
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="S",
        help=f"start: exit after S seconds without commands (default {DEFAULT_IDLE_TIMEOUT:g})",
    )
    p.set_defaults(handler=command)


async def command(args: argparse.Namespace) -> int:
    path = daemon_socket_path()
    if args.action == "status":
        return _status(path)
    if args.action == "stop":
        return await asyncio.to_thread(_stop, path)
    return await asyncio.to_thread(_start, path, args.idle_timeout)


def ping(path: str, kind: bytes = b"ping") -> str | None:
    """The daemon's answer to a control request, or None if no daemon of ours answers at ``path``."""
    key = read_key(path) if private_dir_ok(os.path.dirname(path)) else None
    if key is None:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(path)
            sock.sendall(key + encode_request(kind, [], {}, b"/", 0o077))
            return b"".join(iter(lambda: sock.recv(4096), b"")).decode()
    except OSError:
        return None


def _status(path: str) -> int:
    answer = ping(path)
    if answer is None:
        print(f"not running (socket {path}); start it with `execspace daemon start`")
        return 1
    print(f"running: {answer.removeprefix('pong ')} socket={path}")
    return 0


def _stop(path: str) -> int:
    if ping(path, b"stop") is None:
        print("not running")
        return 0
    for _ in range(100):
        if not os.path.exists(path):
            break
        time.sleep(0.05)
    print("stopped")
    return 0


def _start(path: str, idle_timeout: float) -> int:
    if not sys.platform.startswith("linux"):
        # the daemon proves who connects with SO_PEERCRED, which only Linux has
        raise SetupFailed(
            "daemon", f"it runs on Linux only, not {sys.platform}", "run without it", component="the warm daemon"
        )
    answer = ping(path)
    if answer is not None:
        print(f"already running: {answer.removeprefix('pong ')} socket={path}")
        return 0
    directory = Path(path).parent
    _make_private_dir(directory)
    if len(path.encode()) > 107:
        raise SetupFailed(
            "daemon",
            f"the socket path {path} is longer than a unix socket allows",
            "set a shorter XDG_RUNTIME_DIR",
            component="the warm daemon",
        )
    progress("starting the execspace daemon (imports the backends once)...")
    with open(directory / (Path(path).stem + ".log"), "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "execspace.cli.forkserver", "--socket", path, "--idle-timeout", str(idle_timeout)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    for _ in range(int(_START_TIMEOUT / 0.05)):
        answer = ping(path)
        if answer is not None:
            print(f"running: {answer.removeprefix('pong ')} socket={path}; stops after {idle_timeout:g} s idle")
            return 0
        time.sleep(0.05)
    raise SetupFailed(
        "daemon", f"it did not answer within {_START_TIMEOUT:g} s", f"see {log.name}", component="the warm daemon"
    )


def _make_private_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise SetupFailed(
            "daemon",
            f"cannot create {directory}: {exc}",
            "set XDG_RUNTIME_DIR to a directory of yours",
            component="the warm daemon",
        ) from exc
    if not private_dir_ok(str(directory)):
        raise SetupFailed(
            "daemon",
            f"{directory} is not a private directory of this user (owner or mode wrong, or a symlink)",
            "remove it if it is not yours to trust, or set XDG_RUNTIME_DIR to a directory only you can enter",
            component="the warm daemon",
        )
