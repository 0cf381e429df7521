"""The conformance kit as a backend author outside this repository binds it (execspace.testing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from execspace import RunProgramSpec
from execspace.testing.conformance import EngineConformance
from execspace.testing.processes import new_tag, pids_with, tagged, wait_no_process, wait_processes
from tests.bindings import open_backend

BINDING = """
import dataclasses

import pytest_asyncio

import execspace
from execspace.testing.conformance import EngineConformance


class FileOnly:
    \"\"\"The local engine, saying that it runs no programs and has no snapshots.\"\"\"

    name = "fileonly"
    manager = property(lambda self: self._engine.manager)
    fs = property(lambda self: self._engine.fs)
    runner = property(lambda self: self._engine.runner)

    def __init__(self, engine):
        self._engine = engine

    def describe(self):
        return dataclasses.replace(self._engine.describe(), programs=False, fork=None)

    async def aclose(self):
        await self._engine.aclose()


class TestFileOnly(EngineConformance):
    @pytest_asyncio.fixture
    async def engine(self, tmp_path):
        async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as engine:
            yield FileOnly(engine)
"""


def _outcomes(result: pytest.RunResult) -> tuple[set[str], dict[str, int]]:
    ran = {line.split("::")[2].split("[")[0].split()[0] for line in result.stdout.lines if "test_mine.py::" in line}
    return ran, result.parseoutcomes()


def test_one_class_binds_every_case_and_sections_skip_from_describe(pytester: pytest.Pytester) -> None:
    # no ini: nothing but the kit's own marks and fixtures (pytest-asyncio in its default, strict mode)
    pytester.makepyfile(test_mine=BINDING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "-v")
    cases = {name for name in dir(EngineConformance) if name.startswith("test_")}
    assert len(cases) >= 50
    ran, outcomes = _outcomes(result)
    assert ran == cases  # every case of the kit, a new one too, with no edit here
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()
    # the file-API and manager cases run; the sections its describe() says it lacks are skipped, saying why
    assert outcomes["passed"] >= 10 and outcomes["skipped"] >= 40
    text = result.stdout.str()
    for why in ("runs no programs (describe().programs is False)", "has no snapshots or forks", "has no kernels"):
        assert f"fileonly {why}" in text, why


def test_bindings_open_an_engine_per_binding(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mine="""
from execspace.testing.binding import backend_binding
from execspace.testing.conformance import EngineConformance

class TestLocal(EngineConformance):
    bindings = [backend_binding("local"), backend_binding("local", name="again")]
"""
    )
    chosen = "test_create_is_idempotent or test_snapshot_restore_and_fork or test_exit_code_and_streams"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-k", chosen)
    assert result.parseoutcomes().get("passed") == 6, result.stdout.str()
    assert result.stdout.str().count("[local] PASSED") == result.stdout.str().count("[again] PASSED") == 3


def test_a_class_without_an_engine_fails_saying_how_to_bind(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_mine="from execspace.testing.conformance import EngineConformance\n"
        "class TestNothing(EngineConformance):\n    pass\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-k", "unknown_workspace")
    assert "binds no engine: give it an `engine` fixture, or `bindings = [...]`" in result.stdout.str()
    assert result.parseoutcomes().get("errors") == 1


def test_the_guard_fails_a_test_that_leaves_a_process_of_its_runs(pytester: pytest.Pytester) -> None:
    tag_file = pytester.path / "tag"
    pytester.makepyfile(
        test_mine=BINDING
        + f"""

import os, subprocess
from execspace.testing.processes import TAG_VARIABLE


class TestLeaves(TestFileOnly):
    async def test_leaves_one(self, run_tag):
        open({str(tag_file)!r}, "w").write(run_tag)
        subprocess.Popen(["sleep", "60"], env={{**os.environ, TAG_VARIABLE: run_tag}}, start_new_session=True)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-k", "leaves_one")
    assert result.parseoutcomes().get("errors") == 1, result.stdout.str()
    assert "processes of this test's programs outlived it and its engine (now killed)" in result.stdout.str()
    assert pids_with(tag_file.read_text()) == []  # and the guard killed it


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
