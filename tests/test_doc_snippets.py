"""Every Python snippet in docs/ runs as printed (issue 12: a newcomer copies them).

A snippet that cannot run here (it needs an account, a server of the reader's, or is a test module) carries a
``<!-- not run: why -->`` line right above its fence, saying where the same calls are tested instead. The README's
example is run by test_readme.py, which also checks its output."""

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

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def _snippets() -> list[tuple[str, str, str | None]]:
    found = []
    for doc in sorted(DOCS.rglob("*.md")):
        text = doc.read_text()
        for m in _BLOCK.finditer(text):
            line = text[: m.start("code")].count("\n")
            found.append((f"{doc.relative_to(DOCS)}:{line}", m.group("code"), m.group("why")))
    return found


SNIPPETS = _snippets()


def test_the_docs_have_snippets_and_each_skipped_one_says_why() -> None:
    assert len(SNIPPETS) >= 10
    for where, _code, why in SNIPPETS:
        assert why is None or len(why.split()) >= 4, f"{where}: say why it is not run and where it is tested"
    assert sum(why is None for _, _, why in SNIPPETS) >= 6


@pytest.mark.parametrize(("where", "code"), [pytest.param(w, c, id=w) for w, c, why in SNIPPETS if why is None])
def test_snippet_runs_as_printed(where: str, code: str, tmp_path: Path) -> None:
    if not asyncio.run(probe_backend("sandbox")).ok:
        pytest.skip("the snippets use the default backend, and the sandbox does not work here")
    tmp = tmp_path / "tmpdir"  # their default workspaces and temporary files: this test's own
    tmp.mkdir()
    make_traversable(tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXECSPACE_")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**env, "TMPDIR": str(tmp), "EXECSPACE_DAEMON": "off"},
    )
    assert proc.returncode == 0, f"{where}:\n{proc.stderr}"
    assert proc.stdout.strip(), f"{where} printed nothing: a snippet shows what it gives"
