"""The conformance kit as a backend author outside this repository binds it (execspace.testing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from execspace import RunProgramSpec
from execspace.testing import conformance
from execspace.testing.processes import new_tag, tagged, wait_no_process, wait_processes
from tests.bindings import open_backend

BINDING = """
from execspace.testing.binding import Feature, backend_binding, bind
from execspace.testing.conformance import *  # noqa: F403

engine_binding = bind(backend_binding("local", name="fileonly", lacks={Feature.PROGRAMS: "this one runs no programs"}))
"""


def test_a_binding_of_a_few_lines_runs_every_case_and_skips_what_it_lacks(pytester: pytest.Pytester) -> None:
    # no ini: nothing but the kit's own marks and fixtures (pytest-asyncio in its default, strict mode)
    pytester.makepyfile(test_mine=BINDING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "-v")
    cases = {name for name in dir(conformance) if name.startswith("test_")}
    assert len(cases) >= 15
    ran = {line.split("::")[1].split("[")[0].split()[0] for line in result.stdout.lines if "test_mine.py::" in line}
    assert ran == cases  # every case of the kit, a new one too, with no edit here
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, result.stdout.str()
    # the file-API cases run; those that need programs are skipped with the binding's reason
    assert outcomes["passed"] >= 2 and outcomes["skipped"] >= len(cases) - 2
    assert "fileonly has no programs: this one runs no programs" in result.stdout.str()


def test_pytest_stays_optional() -> None:
    """The library never imports the kit, and the kit's pytest-free part imports no pytest."""
    code = (
        "import sys, execspace, execspace.cli.main, execspace.testing.private_daemon;"
        "assert 'pytest' not in sys.modules, 'pytest imported';"
        "assert 'execspace.testing.conformance' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ["local", "sandbox"])
async def test_the_tag_marks_every_process_of_a_run_until_it_ends(
    request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    """What the redteam and runner tests poll for reaches a sandboxed run's escaped daemon, and goes with it."""
    tag = new_tag()
    script = "(setsid sleep 30 &); echo up; sleep 30"
    async with open_backend(request, name, tmp_path) as engine:
        ws = await engine.manager.create_workspace("tag/session")
        spec = RunProgramSpec("sh", ["-c", script], env=tagged(tag))
        async with await engine.runner.start_program(ws, spec) as handle:
            assert (await anext(handle.stream())).data == b"up\n"
            # the shell and its escaped daemon, at least: polled, as the daemon may be between its execs (setsid,
            # then sleep) when "up" comes, and a process in the middle of an exec shows no environment
            assert len(await wait_processes(tag, 2)) >= 2
            await handle.kill()
            await handle.wait()
        assert wait_no_process(tag) == []
