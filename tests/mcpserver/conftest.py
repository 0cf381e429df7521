"""``execspace mcp`` as a real subprocess and the official MCP SDK's client talking to it (stdio, streamable HTTP)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from execspace.testing.binding import make_traversable
from execspace.testing.processes import read_until, terminate

pytest.importorskip("mcp", reason="the MCP server is tested with the official SDK (pip install 'execspace[dev]')")

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

#: The installed SDK's major: the tests of one client API skip under the other (./run test runs this directory in
#: the main venv, mcp 1.x, and in a venv of mcp 2.x).
MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
ONLY_MCP1 = pytest.mark.skipif(
    MCP_MAJOR != 1, reason="drives the server with mcp 1.x's client API (test_revisions.py is the mcp 2.x client's)"
)
#: The stateless revision (mcp 2.x): no session, a workspace handle in every call.
STATELESS = "2026-07-28"
TOKEN = "test-token-" + "0123456789abcdef" * 2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_config(directory: Path, extra: str = "") -> Path:
    """A config whose workspaces live in ``directory/ws`` (so a test sees what is left there)."""
    root = directory / "ws"
    root.mkdir(parents=True, exist_ok=True)
    make_traversable(root)  # as root, each sandbox's own uid must reach its workspace
    path = directory / "mcp.toml"
    path.write_text(f'{extra}\n[backend_options]\nworkspace_root = "{root}"\n')
    return path


def left_in(root: Path) -> list[str]:
    """Workspaces left in a workspace root (the backend's own hidden bookkeeping aside)."""
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def server_env() -> dict[str, str]:
    return {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1"}


@contextlib.asynccontextmanager
async def stdio_session(*flags: str) -> AsyncIterator[ClientSession]:
    """``python -m execspace mcp FLAGS`` spawned by the SDK's stdio client, initialised."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "execspace", "mcp", *flags], env=server_env())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@dataclass(frozen=True)
class HttpServer:
    url: str
    root: Path
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def running_http_server(directory: Path, *flags: str, extra_config: str = "") -> Iterator[HttpServer]:
    """``execspace mcp --transport http`` on a free port with the token ``TOKEN``, stopped with SIGTERM when the
    block ends."""
    config = write_config(directory, extra_config)
    argv = [sys.executable, "-m", "execspace", "mcp", "--transport", "http", "--port", "0"]
    argv += ["--config", str(config), *flags]
    env = {**server_env(), "EXECSPACE_MCP_TOKEN": TOKEN}  # not --token: a flag shows in ps
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    try:
        yield HttpServer(_listening_url(process), directory / "ws", process)
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    terminate(process)
    if process.stderr is not None:
        process.stderr.close()


def _listening_url(process: subprocess.Popen[bytes], within: float = 60.0) -> str:
    assert process.stderr is not None
    found, seen = read_until(process.stderr, rb"streamable HTTP on (http://\S+)", within)
    if found is None:
        raise AssertionError(f"execspace mcp did not start: {seen.decode(errors='replace')}")
    return found.group(1).decode()


@contextlib.asynccontextmanager
async def http_session(url: str, token: str = TOKEN) -> AsyncIterator[ClientSession]:
    """A new MCP session (its own Mcp-Session-Id) with the SDK's streamable HTTP client."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120)) as client,
        streamable_http_client(url, http_client=client) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """One server on the sandbox backend for the module's tests (each opens its own client sessions).

    Stopped with SIGTERM at the end, as a user would: it must exit cleanly and leave none of the workspaces the
    tests made (this teardown is that test: a server start costs seconds, a second one is not worth it)."""
    with running_http_server(tmp_path_factory.mktemp("mcp-http"), "--backend", "sandbox") as s:
        yield s
        assert left_in(s.root) != []  # the tests' workspaces, until the server stops
    assert s.process.returncode == 128 + 15  # the CLI says it was terminated, after its clean-up (not -15)
    assert left_in(s.root) == []
