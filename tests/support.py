"""Helpers shared by test modules (not fixtures: those live in conftest.py files)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from execspace import BaseEngine, RunResult, Snapshot, SupportsSnapshots, Workspace
from execspace.testing.binding import make_traversable

__all__ = [
    "ATTEMPTS",
    "CLI",
    "FORKS",
    "audit_file",
    "daemon_served",
    "held_still",
    "make_traversable",
    "running_daemon",
    "served_directory",
]

CLI = [sys.executable, "-m", "execspace"]

#: The head of a Python probe run in a sandbox: ``attempt(label, fn)`` prints ``label OK`` or the OSError's errno.
ATTEMPTS = """import errno, socket
def attempt(label, fn):
    try:
        fn(); print(label, "OK")
    except OSError as exc:
        print(label, type(exc).__name__, errno.errorcode.get(exc.errno, exc.errno))
"""

#: A Python program that forks up to 60 children at once (as many as a pids limit lets it), ends them and prints how
#: many it had: a bounded fork bomb.
FORKS = """
import os, signal, time
children = []
for _ in range(60):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(len(children))
"""


@contextlib.contextmanager
def running_daemon() -> Iterator[dict[str, str]]:
    """The environment of a caller that reaches a fresh warm daemon of its own (stopped afterwards)."""
    # unix socket paths must fit in 107 bytes: pytest's tmp_path may not
    with tempfile.TemporaryDirectory(prefix="xdg", dir="/tmp") as runtime:
        env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
        env.pop("EXECSPACE_DAEMON", None)
        started = subprocess.run([*CLI, "daemon", "start", "--idle-timeout", "120"], env=env, capture_output=True)
        assert started.returncode == 0, started.stderr
        try:
            yield env
        finally:
            subprocess.run([*CLI, "daemon", "stop"], env=env, capture_output=True, check=False)


def daemon_served(env: dict[str, str]) -> int:
    """How many commands the daemon reached with ``env`` has run."""
    out = subprocess.run([*CLI, "daemon", "status"], env=env, capture_output=True, text=True, check=True).stdout
    return int(out.split("served=")[1].split()[0])


@contextlib.contextmanager
def served_directory(root: Path) -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on the host's loopback serving the files under ``root``: its port, and a list of what reached
    it (``GET /path Host=...``)."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, fmt: str, *args: object) -> None:
            requests.append(f"{self.command} {self.path} Host={self.headers.get('Host')}")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], requests
    finally:
        server.shutdown()
        server.server_close()


def audit_file(ws: Workspace, result: RunResult) -> list[dict[str, object]]:
    """The egress audit a run left in its run directory (``network.jsonl``), one attempt per line."""
    assert ws.host_path is not None
    text = (ws.host_path / result.run_dir / "network.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def mount_points_under(root: Path) -> set[str]:
    """The mount points below ``root`` in this process's mount table (``/proc/self/mountinfo``)."""
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4] for line in f}
    return {p for p in points if p.startswith(f"{root}/")}


def held_still(pid: int) -> bool:
    """Whether ``pid`` is held still the way a freeze holds it: stopped by a signal (``T``), or in a cgroup the
    kernel froze (v1 ``freezer.state`` FROZEN, v2 ``cgroup.events`` frozen 1). False once it is gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        groups = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    if state == "T":
        return True
    for line in groups:
        _, names, path = line.split(":", 2)
        with contextlib.suppress(OSError):
            if names == "freezer":
                return Path("/sys/fs/cgroup/freezer", path.lstrip("/"), "freezer.state").read_text().strip() == "FROZEN"
            if names == "" and path != "/":
                events = Path("/sys/fs/cgroup/unified", path.lstrip("/"), "cgroup.events").read_text()
                if "frozen 1" in events.splitlines():
                    return True
    return False


@contextlib.asynccontextmanager
async def snapshot_files(engine: BaseEngine, snap: Snapshot) -> AsyncIterator[Path]:
    """A snapshot's whole tree, read the public way (its ``path`` may hold only its own layer): a fork of it,
    removed after."""
    assert isinstance(engine.manager, SupportsSnapshots)
    (view,) = await engine.manager.fork(snap)
    try:
        assert view.host_path is not None
        yield view.host_path
    finally:
        await engine.manager.cleanup(view)


def run_as_printed(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """A shell line or block of the docs run as a reader pastes it (bash, stopping at the first failure, no stdin);
    what it printed and its exit code."""
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def files_named(root: Path, name: str) -> list[Path]:
    """The files called ``name`` under ``root``, walked while a server makes and removes directories there (a pool's
    refills): a directory gone mid-walk is passed over, where ``Path.rglob`` raises."""
    return [Path(top, name) for top, _, files in os.walk(root) if name in files]


def write_wheel(directory: Path, name: str, version: str = "1.0", source: str = "VALUE = 42\n") -> Path:
    """A pure-Python wheel of one module ``name`` (``source``) in ``directory``: a package pip installs offline
    (``PIP_FIND_LINKS=directory PIP_NO_INDEX=1``), so that an environment's build takes seconds and needs no
    registry."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: execspace-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    record = "".join(f"{path},{digest(text)},{len(text.encode())}\n" for path, text in files.items())
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    partial = directory / f".{wheel.name}.part"  # renamed into place: pip never sees half a wheel
    with zipfile.ZipFile(partial, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{info}/RECORD", record + f"{info}/RECORD,,\n")
    partial.rename(wheel)
    return wheel


def create_when_built(template: str, within: float = 180.0, **sdk: Any) -> Any:
    """``Sandbox.create(template=...)`` of the official SDK, created again while the server answers that the
    template's environment is being built (503, ``ServiceBusyException``, once the SDK's own retries are spent: a
    build on a loaded machine can outlast them); any other failure is raised."""
    import time

    from e2b import Sandbox
    from e2b.exceptions import ServiceBusyException

    deadline = time.monotonic() + within
    while True:
        try:
            return Sandbox.create(template=template, **sdk)
        except ServiceBusyException as exc:
            if "is being built" not in str(exc) or time.monotonic() > deadline:
                raise


def until(what: str, check: Callable[[], object], within: float = 20.0) -> None:
    """Poll ``check`` until it is true; fail saying ``what`` did not happen within ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        time.sleep(0.05)


def audit_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of an audit file, each parsed (a torn or malformed line fails the test)."""
    text = path.read_text()
    assert text == "" or text.endswith("\n"), "the file ends inside a line"
    return [json.loads(line) for line in text.splitlines()]


def audit_entries(audit: Path, event: str, **fields: object) -> list[dict[str, Any]]:
    """The audit file's lines of ``event`` that hold ``fields``."""
    return [line for line in audit_lines(audit) if line["event"] == event and fields.items() <= line.items()]
