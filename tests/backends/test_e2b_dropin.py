"""The e2b backend as a drop-in for the sandbox backend: code written against ``open_engine("sandbox",
environment="code-interpreter")`` changes only that line to ``open_engine("e2b", template="code-interpreter-v1")``
(a real ``execspace serve``) and runs the same data-analysis program on the same input, collecting the same files."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

import execspace
from execspace import BaseEngine, PutFile, RunProgramSpec

pytest.importorskip("e2b", reason="the e2b backend needs the official SDK (pip install 'execspace[e2b]')")
pytest.importorskip("uvicorn", reason="the tests run against execspace serve (pip install 'execspace[serve]')")

from tests.server.conftest import Server
from tests.support import make_traversable

SALES = b"region,month,amount\nnorth,1,120.5\nsouth,1,80\nnorth,2,99.5\nsouth,2,140\neast,2,33.25\n"

ANALYSIS = b"""\
import os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

df = pd.read_csv("inputs/sales.csv")
summary = df.groupby("region", as_index=False)["amount"].sum().sort_values("region")
out = os.environ["OUTPUT_DIR"]
summary.to_csv(os.path.join(out, "summary.csv"), index=False)
ax = summary.plot.bar(x="region", y="amount", legend=False)
ax.set_ylabel("amount")
plt.savefig(os.path.join(out, "chart.png"), metadata={"Software": None})
print("regions", len(summary), "total", df["amount"].sum())
"""


async def _analyse(opened: AbstractAsyncContextManager[BaseEngine]) -> tuple[str, dict[str, bytes]]:
    """The user's code, unchanged whatever the engine: put the input and the program, run it, collect out/."""
    async with opened as engine:
        ws = await engine.manager.create_workspace("dropin-analysis")
        await engine.fs.put_files(ws, [PutFile("work/inputs/sales.csv", SALES), PutFile("work/analyse.py", ANALYSIS)])
        result = await engine.runner.run_program(ws, RunProgramSpec("python3", ["analyse.py"], cwd="work", timeout=120))
        assert result.exit_code == 0, result.stderr
        files = {f.name: f.content for f in await engine.fs.collect(ws, ["out/**"])}
        await engine.manager.cleanup(ws)
    return result.stdout, files


async def test_swapping_the_sandbox_for_e2b_runs_the_same_analysis_and_collects_the_same_files(
    e2b_server: Server, tmp_path: Path
) -> None:
    probe = await execspace.registry.probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"the sandbox backend does not run here: {probe.reason}")
    make_traversable(tmp_path)
    here = execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", environment="code-interpreter")
    connection = {"api_url": e2b_server.url, "sandbox_url": e2b_server.url, "api_key": e2b_server.key}
    there = execspace.open_engine("e2b", template="code-interpreter-v1", **connection)

    local_out, local_files = await _analyse(here)
    remote_out, remote_files = await _analyse(there)

    assert local_out == remote_out == "regions 3 total 473.25\n"
    assert sorted(local_files) == sorted(remote_files) == ["out/chart.png", "out/summary.csv"]
    assert (
        local_files["out/summary.csv"]
        == remote_files["out/summary.csv"]
        == (b"region,amount\neast,33.25\nnorth,220.0\nsouth,220.0\n")
    )
    assert remote_files["out/chart.png"].startswith(b"\x89PNG\r\n\x1a\n")
    assert remote_files["out/chart.png"] == local_files["out/chart.png"]  # the same stack draws the same pixels
