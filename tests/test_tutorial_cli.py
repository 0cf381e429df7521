"""The shell steps of docs/tutorial.md run as printed, in order, in one directory (a newcomer types them).

Each ```bash block runs with ``set -e`` and must succeed; where a plain ``` block follows it, that is what the
step prints, and each of its lines that names no host path (those differ per machine) must be in the output.
A block that cannot run here (it installs something) carries ``<!-- not run: why -->`` above its fence, like the
Python snippets that tests/test_doc_snippets.py runs."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from execspace.registry import probe_backend
from tests.support import make_traversable, run_as_printed

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"
_STEP = re.compile(
    r"(?:<!-- not run: (?P<why>[^>]*?) -->\n)?```bash\n(?P<script>.*?)```\n(?:\s*```\n(?P<prints>.*?)```)?", re.S
)


def _steps() -> list[tuple[str, str, str | None]]:
    text = TUTORIAL.read_text()
    return [(m["script"], m["prints"] or "", m["why"]) for m in _STEP.finditer(text)]


def _checked_lines(prints: str) -> list[str]:
    return [line.strip() for line in prints.splitlines() if line.strip() and "/" not in line]


def test_the_tutorial_has_shell_steps_and_each_skipped_one_says_why() -> None:
    steps = _steps()
    assert sum(why is None for _, _, why in steps) >= 5
    assert sum(len(_checked_lines(prints)) for _, prints, why in steps if why is None) >= 5
    assert all(why is None or len(why.split()) >= 4 for _, _, why in steps)


def test_the_shell_steps_run_as_printed(tmp_path: Path) -> None:
    if not asyncio.run(probe_backend("sandbox")).ok:
        pytest.skip("the tutorial uses the default backend, and the sandbox does not work here")
    tmp = tmp_path / "tmpdir"  # the workspaces the steps keep and list: this test's own
    tmp.mkdir()
    make_traversable(tmp)
    home = tmp_path / "home"
    home.mkdir()
    # `execspace` as installed here, alone: the runs' own python3 stays the one on the machine's PATH
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "execspace").symlink_to(Path(sys.executable).parent / "execspace")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXECSPACE_")}
    path = [d for d in env.get("PATH", "/usr/bin:/bin").split(":") if Path(d) != Path(sys.executable).parent]
    env.update(
        PATH=":".join([str(bin_dir), *path]),
        TMPDIR=str(tmp),
        EXECSPACE_DAEMON="off",
    )
    for script, prints, why in _steps():
        if why is not None:
            continue
        proc = run_as_printed(script, home, env, timeout=120)
        assert proc.returncode == 0, f"{script}\nfailed with {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        for line in _checked_lines(prints):
            assert line in proc.stdout + proc.stderr, f"{script}\ndid not print {line!r}:\n{proc.stdout}{proc.stderr}"
    assert (home / "results" / "sorted.csv").read_text().splitlines()[1:] == ["Oslo,4", "Lima,19", "Cairo,27"]
    assert [p.name for p in (home / "execspace-out").glob("*/hot.txt")] == ["hot.txt"]
    assert (
        "tutorial/first"
        not in subprocess.run(
            ["execspace", "ws", "list"], capture_output=True, text=True, cwd=home, env=env, check=True
        ).stdout
    ), "the tutorial's `ws rm` left its kept workspace"
