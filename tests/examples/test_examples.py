"""Every example runs as printed, offline: the agent ones against the scripted model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from execspace.testing.binding import make_traversable

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    tmp = tmp_path / "tmpdir"  # the examples' default workspaces: this test's own, not the machine's
    tmp.mkdir()
    make_traversable(tmp)
    env = {**os.environ, "TMPDIR": str(tmp), "EXECSPACE_DAEMON": "off"}
    env.pop("OPENAI_API_KEY", None)
    argv = [sys.executable, str(EXAMPLES / name), "--out-dir", str(tmp_path), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=150, cwd=tmp_path)


@pytest.mark.timeout(180)
def test_analyse_csv_gets_the_chart_back(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    done = run_example("analyse_csv.py", tmp_path, "--backend", "sandbox")
    assert done.returncode == 0, done.stderr
    assert "backend sandbox" in done.stdout
    assert "best: 2026-03 172" in done.stdout
    chart = (tmp_path / "chart.svg").read_text()
    assert chart.startswith("<svg") and chart.count("<rect") == 6


@pytest.mark.timeout(180)
def test_mcp_session_runs_code_through_the_sdk_client(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    done = run_example("mcp_session.py", tmp_path, "--backend", "sandbox")
    assert done.returncode == 0, done.stderr
    assert "warmest: Cairo 28" in done.stdout
    assert "examples%2Fweather/out/summary.txt: 3 cities, warmest Cairo" in done.stdout


@pytest.mark.timeout(180)
def test_multi_turn_work_reaches_a_skill_and_the_files_of_earlier_turns(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    done = run_example("multi_turn_skill.py", tmp_path, "--backend", "sandbox")
    assert done.returncode == 0, done.stderr
    assert "11 words, 7 distinct" in done.stdout
    assert "The most frequent: the,4" in done.stdout


@pytest.mark.timeout(240)
def test_the_same_agent_runs_on_the_sandbox_and_on_e2b_against_execspace_serve(tmp_path: Path) -> None:
    pytest.importorskip("e2b")
    pytest.importorskip("uvicorn")
    done = run_example("sandbox_and_e2b.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "backend sandbox" in done.stdout and "backend e2b" in done.stdout
    assert done.stdout.count("best: 2026-03 172") == 2
