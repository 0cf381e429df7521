"""Older e2b SDKs against the server: each interpreter in EXECSPACE_E2B_MATRIX (``:``-separated paths of Pythons
that have one e2b version installed, e.g. 2.29.5 for the v1 routes and 2.45.1) runs sdk_smoke.py and
sdk_surface.py (as root, whose server's sandboxes are machines, with the machine's checks). The SDK this suite
imports is the newest; the matrix covers the route generations before it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import Server

MATRIX = [p for p in os.environ.get("EXECSPACE_E2B_MATRIX", "").split(":") if p]


@pytest.mark.skipif(not MATRIX, reason="set EXECSPACE_E2B_MATRIX to Pythons with other e2b versions installed")
@pytest.mark.parametrize("script", ["sdk_smoke.py", "sdk_surface.py"])
@pytest.mark.parametrize("python", MATRIX)
def test_older_sdk(python: str, script: str, e2b_server: Server) -> None:
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('e2b'))"], capture_output=True, text=True
    ).stdout.strip()
    env = {**os.environ, **e2b_server.sdk_env(), "EXECSPACE_MACHINE": "1" if os.geteuid() == 0 else "0"}
    run = subprocess.run(
        [python, str(Path(__file__).with_name(script))], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"e2b {version}: {run.stdout}{run.stderr}"
    assert run.stdout.strip() == "ok"
