"""The README's first-screen example must run as printed."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from execspace.errors import SetupFailed
from execspace.registry import choose_default_backend

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path: Path) -> None:
    try:
        asyncio.run(choose_default_backend())
    except SetupFailed as exc:
        pytest.skip(f"the example needs an isolating default backend: {exc}")
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None, "README lost its example"
    assert len(code.group(1).strip().splitlines()) <= 12, "the first-screen example should stay about ten lines"
    proc = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "0 ['out/n.txt']\n"
