"""The optional extras are optional for the tests too: where one is not installed its tests skip, naming the extra to
install, and collection never errors. The PEP 735 groups of pyproject.toml pin what the extras pin."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: Run in a fresh interpreter: every import of a blocked top-level module fails as a missing one does, then pytest.
_WITHOUT = """
import importlib.abc, sys
blocked = frozenset(sys.argv[1].split(","))
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed, for this test)", name=name)
        return None
sys.meta_path.insert(0, Absent())
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _optional_modules() -> set[str]:
    """The top-level modules of every distribution an extra names that neither the core nor the ``test`` group
    installs: what a contributor with ``pip install -e . --group test`` does not have."""
    project = PYPROJECT["project"]
    kept = {_name(r) for r in [*project["dependencies"], *PYPROJECT["dependency-groups"]["test"]]} | {"execspace"}
    optional = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs} - kept
    return {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(_name(d) in optional for d in dists)
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_without_the_extras_their_tests_skip_and_nothing_errors_at_collection() -> None:
    blocked = _optional_modules()
    assert {"jupyter_client", "docker", "e2b", "mcp", "httpx", "starlette"} <= blocked  # what the dev venv has
    argv = [sys.executable, "-c", _WITHOUT, ",".join(sorted(blocked))]
    argv += ["--collect-only", "-q", "-rs", "-p", "no:cacheprovider", "tests"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=540)
    summary = done.stdout[done.stdout.find("short test summary") :]
    assert done.returncode == 0 and " error" not in summary, done.stdout[-3000:] + done.stderr[-2000:]
    for extra in ("jupyter", "serve", "agent", "langchain", "smolagents"):
        assert f"needs the {extra} extra" in summary, extra  # the blocker did block: those modules skipped


def test_the_groups_pin_what_the_extras_pin() -> None:
    def spaced(requirement: str) -> str:
        return requirement.replace(" ", "")

    pinned = {_name(r): spaced(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values() for r in reqs}
    differ = [
        f"{group}: {r} (an extra: {pinned[_name(r)]})"
        for group, reqs in PYPROJECT["dependency-groups"].items()
        for r in reqs
        if _name(r) in pinned and spaced(r) != pinned[_name(r)]
    ]
    assert differ == []
