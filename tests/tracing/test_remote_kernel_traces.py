"""The jupyter backend's cells on a real Jupyter Server (started here) are spans as a host kernel's are, in both
remote modes: workspaces this host shares with the server, and workspaces on the server alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

from execspace import InputSpec, open_engine
from execspace.backends.jupyter import ServerKernels
from execspace.backends.jupyter.remote_server import start_local_server
from execspace.tracing import from_environment
from tests.tracing.receiver import otlp_receiver

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jupyter_server") is None, reason="jupyter_server is not installed"
)

MARKER = "remote-cell-marker-2b7d"


@pytest.mark.parametrize("shared", [True, False], ids=["shared-filesystem", "server-workspaces"])
async def test_a_remote_kernels_cells_are_spans_without_their_code(tmp_path: Path, shared: bool) -> None:
    (tmp_path / "jroot").mkdir()
    async with start_local_server(tmp_path / "jroot") as server:
        with otlp_receiver() as receiver:
            tracer = from_environment("remote-kernels", receiver.env())
            assert tracer is not None
            mode = ServerKernels(
                url=server.url, token=server.token, shared_filesystem=shared, server_root=server.root_dir
            )
            try:
                async with open_engine(
                    "jupyter", workspace_root=server.root_dir / "ws", mode=mode, tracer=tracer
                ) as engine:
                    ws = await engine.manager.create_workspace("far")
                    await engine.fs.stage_inputs(ws, [InputSpec(MARKER.encode(), "work/in.txt")])
                    cell = await engine.kernels.execute(ws, f"print(open('in.txt').read(), '{MARKER}')")
                    failed = await engine.kernels.execute(ws, "raise ValueError(1)")
                    await engine.manager.cleanup(ws)
            finally:
                tracer.close()
            cells = receiver.named("execspace.kernel.execute")
            staged = receiver.named("execspace.stage")
    assert MARKER in cell.stdout and failed.exit_code != 0
    assert [c.attributes["execspace.kernel.exit_code"] for c in cells] == [0, failed.exit_code]
    assert {c.attributes["execspace.backend"] for c in cells} == {"jupyter"}
    assert {c.attributes["execspace.workspace.id"] for c in cells} == {"far"}
    assert cells[0].attributes["execspace.kernel.language"] == "python"
    assert [s.attributes["execspace.stage.inputs"] for s in staged] == [1]
    assert all(MARKER not in str(v) for c in cells for v in c.attributes.values())
