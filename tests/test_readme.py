"""The README's first-screen example must run as printed."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from execspace.registry import probe_backend
from tests.support import make_traversable

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path: Path) -> None:
    if not asyncio.run(probe_backend("sandbox")).ok:
        pytest.skip("the example needs an isolating default backend, and the sandbox does not work here")
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None, "README lost its example"
    assert len(code.group(1).strip().splitlines()) <= 12, "the first-screen example should stay about ten lines"
    # its default workspaces go under $TMPDIR: this test's own, not the machine's
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    make_traversable(tmp)
    env = {k: v for k, v in os.environ.items() if k != "EXECSPACE_CONTAINER_IMAGE"}
    proc = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**env, "TMPDIR": str(tmp)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "0 ['out/n.txt']\n"
