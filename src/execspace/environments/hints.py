"""What to say when a program failed for want of the data stack the ``code-interpreter`` environment has: a
``ModuleNotFoundError`` for one of its modules, or ``python`` not found where ``python3`` is."""

from __future__ import annotations

import re

from ..errors import EnvironmentNotFound
from .spec import canonical_name
from .store import EnvironmentStore

__all__ = ["BUILD_COST", "DATA_STACK", "PYTHON_HINT", "missing_module_hint"]

DATA_STACK = "code-interpreter"
#: What a first ``execspace env build code-interpreter`` costs (measured: 82 s and 757 MB with a fast link).
BUILD_COST = "once, about 1-2 minutes and 750 MB from PyPI"
#: The import names of what ``code-interpreter`` holds: its requirements and their best-known dependencies.
MODULES = frozenset(
    {
        *("numpy", "pandas", "matplotlib", "scipy", "PIL", "openpyxl", "ipykernel", "IPython", "e2b_charts"),
        *("dateutil", "pytz", "tzdata", "et_xmlfile", "kiwisolver", "cycler", "fontTools", "pyparsing", "contourpy"),
    }
)
#: Added to "command not found: 'python'" where ``python3`` is there.
PYTHON_HINT = (
    f"; here Python is python3 (run python3), or run in the {DATA_STACK} environment, which has python and a data "
    f"stack (CLI: --environment {DATA_STACK}; library: environment={DATA_STACK!r}; build it {BUILD_COST}: "
    f"execspace env build {DATA_STACK})"
)

_MISSING = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_]+)")


def missing_module_hint(stderr: str, environment: str | None, *, option: str = "--environment") -> str | None:
    """The hint for a run whose ``stderr`` says Python found no module that ``code-interpreter`` has (and that ran
    outside it), naming ``option`` and whether the environment must be built first; None for any other failure."""
    names = _MISSING.findall(stderr)
    if not names or names[-1] not in MODULES or canonical_name(environment or "") == DATA_STACK:
        return None
    module = names[-1]
    where = "" if environment is None else f" (not in the environment {environment!r})"
    hint = f"{module}{where} is in the {DATA_STACK} runtime environment: run with {option} {DATA_STACK}"
    try:
        EnvironmentStore().get(DATA_STACK)
    except EnvironmentNotFound:
        return f"{hint}, after building it {BUILD_COST}: execspace env build {DATA_STACK}"
    return hint
