"""A real ``execspace serve`` subprocess for the official E2B SDK to talk to, and the SDK pointed at it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# the server's own extra, and the official SDK it is tested with
pytest.importorskip("starlette", reason="needs the serve extra (pip install 'execspace[serve]')")
pytest.importorskip("e2b", reason="the server is tested with the official e2b SDK (pip install 'execspace[dev]')")
pytest.importorskip(
    "e2b_code_interpreter", reason="the server is tested with the official SDKs (pip install 'execspace[dev]')"
)

import e2b_code_interpreter as ci
import httpx

from execspace.environments import Environment, build, builtin_spec
from execspace.testing.binding import make_traversable
from execspace.testing.processes import read_until, terminate

API_KEY = "e2b_" + "0123456789abcdef" * 2


@dataclass(frozen=True)
class Server:
    url: str
    key: str
    root: Path
    """The directory the sandboxes' workspaces live in."""
    process: subprocess.Popen[bytes]

    def sdk_env(self) -> dict[str, str]:
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": self.key}


@contextlib.contextmanager
def raw_interpreter(server: Server) -> Iterator[Callable[[dict[str, object]], list[dict[str, Any]]]]:
    """A code-interpreter sandbox of ``server`` spoken to without the SDK (which sends no ``timeout`` of a request's
    own): each call posts one ``/execute`` body and returns its lines, parsed. The sandbox is deleted at the end."""
    with httpx.Client(base_url=server.url, timeout=60) as http:
        made = http.post("/v2/sandboxes", json={"templateID": "code-interpreter-v1"}, headers={"X-API-KEY": API_KEY})
        sandbox_id = made.json()["sandboxID"]
        headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49999"}
        headers["X-Access-Token"] = made.json()["envdAccessToken"]

        def execute(body: dict[str, object]) -> list[dict[str, Any]]:
            answer = http.post("/execute", json=body, headers=headers)
            return [json.loads(line) for line in answer.text.splitlines()]

        try:
            yield execute
        finally:
            http.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": API_KEY})


@functools.cache
def code_interpreter_environment() -> Environment:
    """The environment of the ``code-interpreter-v1`` template (whose creates fail until it is built): built once per
    machine, by whichever test needs it first (tests/environments builds the same tree). On a thread of its own: the
    first to need it may be an async test, whose loop is running on this one."""
    spec = builtin_spec("code-interpreter")
    assert spec is not None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, build(spec)).result()


@contextlib.contextmanager
def running_server(root: Path, *flags: str) -> Iterator[Server]:
    """``execspace serve`` on a free port, stopped with SIGTERM (as a user would) when the block ends."""
    code_interpreter_environment()
    root.mkdir(parents=True, exist_ok=True)
    make_traversable(root)  # as root, each sandbox's own uid must reach its workspace
    env = {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", API_KEY]
    argv += ["--workspace-root", str(root), *flags]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        url = _listening_url(process)
        yield Server(url, API_KEY, root, process)
    finally:
        terminate(process, grace=20)
        assert process.stdout is not None
        process.stdout.close()


@contextlib.contextmanager
def configured_server(directory: Path, config: str, *flags: str) -> Iterator[Server]:
    """:func:`running_server` with the serve config file ``config`` (``--config``), its workspaces in
    ``directory / "ws"``."""
    path = directory / "serve.toml"
    path.write_text(config)
    with running_server(directory / "ws", "--config", str(path), *flags) as server:
        yield server


def in_homes(root: Path, name: str) -> list[Path]:
    """The files ``name`` in the workspaces of the server's sandboxes under ``root``, the homes' tops first (each
    workspace's ``work/``). The walk passes by each workspace's ``.execspace`` (a machine's layers: thousands of
    directories) and what goes while it looks (a pooled sandbox's workspace)."""
    found = sorted(root.glob(f"*/work/{name}"))
    if found:
        return found
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".execspace"]
        found += [Path(top, name)] if name in files else []
    return found


def _listening_url(process: subprocess.Popen[bytes], within: float = 30.0) -> str:
    assert process.stdout is not None
    found, seen = read_until(process.stdout, rb"listening on (\S+)", within)
    if found is None:
        raise AssertionError(f"execspace serve did not start: {seen.decode(errors='replace')}")
    return found.group(1).decode()


@pytest.fixture(scope="session")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve"), "--max-upload-mb", "64") as server:
        yield server


@pytest.fixture(autouse=True)
def sdk_env(e2b_server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """Point the SDK at the server, as a user would with these environment variables."""
    for name, value in e2b_server.sdk_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    return e2b_server


@pytest.fixture
def sbx() -> Iterator[ci.Sandbox]:
    """A code-interpreter sandbox of the session's server, killed after the test (modules with plain sandboxes
    define their own)."""
    sandbox = ci.Sandbox.create(timeout=120)
    try:
        yield sandbox
    finally:
        sandbox.kill()
