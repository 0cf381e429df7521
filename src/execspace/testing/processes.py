"""Whether any process of a run is left, as the host sees it: the observable a test polls instead of sleeping.

A test puts a fresh tag in the run's environment (:func:`tagged`); every process of the run inherits it,
daemons that escaped into a session of their own included, and keeps it across ``exec``. When no process in
``/proc`` carries the tag, nothing of the run can write a file any more, so the test can assert on its files
at once. Linux only (it reads ``/proc``); no pytest needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import selectors
import signal
import subprocess
import time
from typing import IO

__all__ = [
    "TAG_VARIABLE",
    "new_tag",
    "pids_with",
    "read_until",
    "tagged",
    "terminate",
    "wait_no_process",
    "wait_processes",
]

#: The environment variable :func:`tagged` sets.
TAG_VARIABLE = "EXECSPACE_TEST_RUN_TAG"


def new_tag(prefix: str = "run") -> str:
    """A tag no other process carries (random, so concurrent tests never see each other's)."""
    return f"{prefix}-{secrets.token_hex(6)}"


def tagged(tag: str) -> dict[str, str]:
    """The run environment entry that marks every process of the run with ``tag``."""
    return {TAG_VARIABLE: tag}


def pids_with(tag: str) -> list[int]:
    """Host pids whose environment or command line carries ``tag``; sandboxed and containerised ones included
    (``/proc`` shows every PID namespace). A zombie carries nothing: it is dead, its parent just has not
    reaped it yet. Processes we may not inspect (another uid, when we are not root) are not seen."""
    needle = tag.encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and any(needle in _read(f"/proc/{name}/{part}") for part in ("environ", "cmdline")):
            found.append(int(name))
    return found


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone meanwhile, or not ours to read
        return b""


def wait_no_process(tag: str, within: float = 5.0) -> list[int]:
    """Poll until no process carries ``tag``, for at most ``within`` seconds; return the survivors then.

    Survivors are killed before returning, so that a failing test does not leave them to the next one.
    Blocking on purpose, also in async tests: once the engine's call has returned, the run's processes must
    die without more work of the engine's event loop (the kernel may still be tearing them down).
    """
    deadline = time.monotonic() + within
    while (left := pids_with(tag)) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


async def wait_processes(tag: str, at_least: int, within: float = 10.0) -> list[int]:
    """Poll until ``at_least`` processes carry ``tag`` (a run is up to where a test wants it); ``TimeoutError``
    after ``within`` seconds. Awaits between polls: the engine may need its event loop to start them."""
    deadline = time.monotonic() + within
    while len(found := pids_with(tag)) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(found)} of {at_least} processes tagged {tag} after {within} s")
        await asyncio.sleep(0.01)
    return found


def read_until(stream: IO[bytes], pattern: bytes, within: float) -> tuple[re.Match[bytes] | None, bytes]:
    """Read ``stream`` (a child's pipe) line by line until a line matches the regex ``pattern``, the stream ends
    or ``within`` seconds pass: the match (None without one) and everything read (for the failure message). How a
    test or a benchmark learns where the server it started listens."""
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    deadline = time.monotonic() + within
    seen = b""
    try:
        while (left := deadline - time.monotonic()) > 0 and selector.select(timeout=left):
            line = stream.readline()
            if not line:
                break
            seen += line
            if (found := re.search(pattern, line)) is not None:
                return found, seen
        return None, seen
    finally:
        selector.close()


def terminate(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """Stop a child as a user stops a server (SIGTERM), then SIGKILL it if it has not exited within ``grace``
    seconds; reaped either way."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
