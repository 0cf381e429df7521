"""The example command lines of docs/cli.md's `execspace run` and `execspace exec-code` sections run as printed, one
by one, in a project holding the files they name (issue 31: a newcomer copies them; one of them could not run).

A section's examples are its ``bash`` block of more than one line (the one-line block is the synopsis). The files
are the ones a reader would have; each line must exit 0 and leave what it says it makes."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from execspace.registry import probe_backend
from tests.support import make_traversable, run_as_printed
from tests.test_cli_reference import CLI_MD, section

pytestmark = pytest.mark.timeout(180)

PROJECT = {
    "temps.csv": "city,temp\nOslo,4\nLima,19\n",
    "data.csv": "a,b\n1,2\n",
    "analyse.py": "rows = open('inputs/temps.csv').read().splitlines()[1:]\nprint(len(rows), 'cities')\n",
    "src/Makefile": "all:\n\techo built\n",
    "Makefile": "test:\n\techo tested > report.txt\n",
    "lint.py": "print('lint ok')\n",
    ".env": "API_TOKEN=not-for-the-sandbox\n",
    "trusted-script.sh": "#!/bin/sh\necho trusted\n",
    "notes.md": "```python\nprint('from notes')\n```\n\n```bash\necho from bash\n```\n",
    "analysis.md": "```python\nx = 6 * 7\nprint(x)\n```\n",
    "script.py": "print(open('inputs/data.csv').read().count('\\n'), 'lines')\n",
}


def _examples(command: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", section(CLI_MD.read_text(), command), re.S)
    lines = [line for block in blocks if block.count("\n") > 1 for line in block.splitlines()]
    assert lines, f"docs/cli.md, section `{command}`, lost its examples"
    return lines


EXAMPLES = [(c, line) for c in ("execspace run", "execspace exec-code") for line in _examples(c)]


@pytest.fixture(scope="module")
def sandbox() -> None:
    if not asyncio.run(probe_backend("sandbox")).ok:
        pytest.skip("the examples use the default backend, and the sandbox does not work here")


@pytest.mark.parametrize("line", [pytest.param(line, id=line.split("#")[0].strip()) for _, line in EXAMPLES])
def test_example_runs_as_printed(line: str, sandbox: None, tmp_path: Path) -> None:
    if "--backend jupyter" in line and not asyncio.run(probe_backend("jupyter")).ok:
        pytest.skip("this example needs the jupyter backend (the jupyter extra)")
    project = tmp_path / "project"
    for name, text in PROJECT.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / "trusted-script.sh").chmod(0o755)
    tmp = tmp_path / "tmpdir"  # the runs' workspaces: this test's own
    tmp.mkdir()
    make_traversable(tmp_path)
    bin_dir = str(Path(sys.executable).parent)  # `execspace` as installed here
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXECSPACE_")}
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", TMPDIR=str(tmp), EXECSPACE_DAEMON="off")
    proc = run_as_printed(line, project, env, timeout=150)
    assert proc.returncode == 0, f"{line}\nfailed with {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    assert "API_TOKEN" not in proc.stdout
    said = {
        "trusted-script.sh": "trusted",
        "lint.py": "lint ok",
        "make -C src": "built",
        "analyse.py": "2 cities",
        "notes.md": "from notes\nfrom bash",
        "analysis.md": "42",
        "echo hi from bash": "hi from bash",
        "script.py": "2 lines",
    }
    for mark, text in said.items():
        if mark in line:
            assert text in proc.stdout, f"{line}\nprinted:\n{proc.stdout}{proc.stderr}"
    if "--write . --cwd ." in line:  # it ran in the project and wrote it, as the caller's file
        report = project / "report.txt"
        assert report.read_text() == "tested\n" and report.stat().st_uid == os.getuid()
    if "--out results" in line:
        assert [p.name for p in (project / "results").iterdir()] == ["now.txt"]
