"""The newcomer's first data-analysis run: ``import pandas`` fails, ``python`` is not found. Each failure says how to
get the data stack (the code-interpreter environment: the flag, the build command and its cost); other failures
get no such hint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from execspace.environments.hints import missing_module_hint
from execspace.registry import probe_backend
from tests.support import CLI, make_traversable

pytestmark = pytest.mark.timeout(120)

MISSING = "Traceback (most recent call last):\nModuleNotFoundError: No module named '{}'\n"


@pytest.fixture
async def sandbox_cli(tmp_path: Path) -> dict[str, str]:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    make_traversable(tmp_path)
    return {**os.environ, "EXECSPACE_DAEMON": "off", "TMPDIR": str(tmp_path)}


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--backend", "sandbox", "--", *argv], capture_output=True, text=True, env=env, timeout=90
    )


def _raising(module: str) -> list[str]:
    """A program that fails as ``import MODULE`` does where MODULE is missing (whatever the host's Python has)."""
    return ["python3", "-c", f"raise ModuleNotFoundError(\"No module named '{module}.sub'\")"]


async def test_a_missing_pandas_names_the_environment_that_has_it(sandbox_cli: dict[str, str]) -> None:
    ran = _run(sandbox_cli, *_raising("pandas"))
    assert ran.returncode == 1
    assert "pandas is in the code-interpreter runtime environment: run with --environment code-interpreter" in (
        ran.stderr
    )


async def test_a_module_the_environment_lacks_gets_no_hint(sandbox_cli: dict[str, str]) -> None:
    ran = _run(sandbox_cli, *_raising("no_such_module_xyz"))
    assert ran.returncode == 1 and "code-interpreter" not in ran.stderr


async def test_python_not_found_says_python3_and_the_environment(sandbox_cli: dict[str, str]) -> None:
    if any(os.path.exists(f"{d}/python") for d in ("/usr/bin", "/bin", "/usr/local/bin")):
        pytest.skip("this system has a python command")
    ran = _run(sandbox_cli, "python", "-c", "print(1)")
    assert ran.returncode == 127
    assert "command not found: 'python'" in ran.stderr and "here Python is python3" in ran.stderr
    assert "--environment code-interpreter" in ran.stderr and "execspace env build code-interpreter" in ran.stderr
    assert "python3" not in _run(sandbox_cli, "no-such-program-xyz").stderr  # only python gets it


def test_the_hint_says_to_build_the_environment_only_where_it_is_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXECSPACE_ENVIRONMENTS", str(tmp_path / "empty-store"))
    hint = missing_module_hint(MISSING.format("matplotlib"), None)
    assert hint is not None and hint.endswith(
        "after building it once, about 1-2 minutes and 750 MB from PyPI: execspace env build code-interpreter"
    )
    assert missing_module_hint(MISSING.format("PIL"), "base") == (
        "PIL (not in the environment 'base') is in the code-interpreter runtime environment: run with --environment "
        "code-interpreter, after building it once, about 1-2 minutes and 750 MB from PyPI: execspace env build "
        "code-interpreter"
    )
    # already in it (or its E2B alias): the module is missing for another reason
    assert missing_module_hint(MISSING.format("pandas"), "code-interpreter-v1") is None
    assert missing_module_hint("ImportError: cannot import name 'x' from 'pandas'", None) is None
