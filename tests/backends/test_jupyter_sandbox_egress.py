"""Sandboxed Jupyter kernels with a network allow-list: a kernel's sandbox reaches only the policy's destinations,
through an egress proxy of its own outside it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

import execspace
from execspace import NetworkPolicy
from execspace.backends.jupyter import SandboxedKernels
from tests.backends.jupyter_support import kernels_of, require_sandboxed_kernels
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nupstream")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def test_a_kernel_reaches_only_its_allow_list(tmp_path: Path, upstream: int) -> None:
    await require_sandboxed_kernels()
    make_traversable(tmp_path)
    net = NetworkPolicy.allow([f"allowed.test:{upstream}"], resolve={"allowed.test": "127.0.0.1"})
    mode = SandboxedKernels(pool_size=0, network=net)
    async with execspace.open_engine("jupyter", workspace_root=tmp_path / "ws", mode=mode) as engine:
        if not engine.describe().network_domains:
            pytest.skip("no C compiler: the egress bridge cannot be built here")
        assert "allow-list" in engine.describe().details["kernel_network"]
        ws = await engine.manager.create_workspace("nb/egress")
        kernels = kernels_of(engine)
        cell = (
            "import urllib.request as u, urllib.error as e\n"
            f"print(u.urlopen('http://allowed.test:{upstream}/').read())\n"
            "try:\n"
            f"    u.urlopen('http://denied.test:{upstream}/')\n"
            "except e.HTTPError as exc:\n"
            "    print('refused', exc.code)\n"
        )
        result = await kernels.execute(ws, cell, timeout=30)
        assert result.text == "b'upstream'\nrefused 403\n", result
        assert ws.host_path is not None
        audits = [
            json.loads(line) for f in ws.host_path.glob("runs/*/network.jsonl") for line in f.read_text().splitlines()
        ]
        assert [(a["host"], a["allowed"]) for a in audits] == [("allowed.test", True), ("denied.test", False)]
