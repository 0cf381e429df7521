"""smolagents: a remote Python executor whose code runs in an execspace workspace's stateful kernel.

::

    with execspace.sync.open_engine("jupyter") as engine:  # kernels in the OS sandbox by default
        agent = CodeAgent(tools=[], model=model, executor=ExecspacePythonExecutor(engine))
        agent.run("What is the 10th Fibonacci number?")
        agent.cleanup()

smolagents runs its executors synchronously, so this one takes the blocking facade (:mod:`execspace.sync`) of an
engine with kernels (``describe().kernels``: the jupyter backend's sandboxed or server kernels, e2b's code
interpreter). Each code action is one cell in the workspace's kernel: variables, imports and tools persist between
actions, as in smolagents' E2B and Docker executors. Tools and variables are sent by smolagents' own code
(``send_tools``, ``send_variables``); ``final_answer`` raises smolagents' ``FinalAnswerException`` in the kernel,
which this executor reads back from the kernel (``sys.last_value``) rather than from the traceback's text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from ..errors import CapabilityError
from ..models import DEFAULT_TIMEOUT, CodeBlock, ResourceLimits, Workspace
from ..protocols import Engine, SupportsKernels
from ..sync import SyncEngine
from . import MissingExtra

try:
    from smolagents.local_python_executor import CodeOutput
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.utils import AgentError
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise MissingExtra("smolagents", "smolagents", exc) from exc

__all__ = ["ExecspacePythonExecutor"]

#: Run after a failed cell: the exception the cell ended with, by IPython's own record of it, then forgotten.
_LAST_ERROR = """
import sys as _execspace_sys, json as _execspace_json
_execspace_error = getattr(_execspace_sys, "last_value", None)
_execspace_sys.last_value = None
print(_execspace_json.dumps(None if _execspace_error is None else
      [type(_execspace_error).__name__, str(getattr(_execspace_error, "value", ""))]))
del _execspace_error, _execspace_sys, _execspace_json
"""


class ExecspacePythonExecutor(RemotePythonExecutor):  # type: ignore[misc]  # smolagents ships no type hints
    """Runs a CodeAgent's code actions in the kernel of one workspace of ``engine``.

    Args:
        engine: the blocking facade of an engine with Python kernels (``execspace.sync.open_engine("jupyter")``).
        workspace_id: the workspace's id (default ``smolagents/<uuid>``); :meth:`cleanup` removes it.
        additional_imports: packages to ``pip install`` in the kernel first (the engine's network policy applies).
        logger: smolagents' logger (default: one at ``INFO``).
        timeout: deadline of each code action, in seconds (the kernel is interrupted, then restarted).
        allow_pickle: as for smolagents' remote executors (unsafe: off by default).
    """

    def __init__(
        self,
        engine: SyncEngine,
        *,
        workspace_id: str | None = None,
        additional_imports: Sequence[str] = (),
        logger: AgentLogger | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        allow_pickle: bool = False,
    ) -> None:
        _require_kernels(engine.async_engine)
        super().__init__(list(additional_imports), logger or AgentLogger(level=LogLevel.INFO), allow_pickle)
        self.engine = engine
        self.timeout = timeout
        self.workspace: Workspace = engine.manager.create_workspace(workspace_id or f"smolagents/{uuid.uuid4()}")
        self._cells = 0
        self.installed_packages = self.install_packages(list(additional_imports))

    def _run_cell(self, code: str) -> tuple[int, str, str, bool]:
        """Exit code, stdout (displayed values included), stderr and whether the deadline stopped it."""
        index, self._cells = self._cells, self._cells + 1

        async def run(engine: Engine) -> Any:
            assert isinstance(engine, SupportsKernels)
            block = CodeBlock("python", code)
            return await engine.kernels.run_block(self.workspace, block, index, timeout=self.timeout, limits=_LIMITS)

        result, _text = self.engine.call(run)
        if result.error is not None:
            raise AgentError(result.error, self.logger)
        return result.exit_code, result.stdout, result.stderr, result.timed_out

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        exit_code, stdout, stderr, timed_out = self._run_cell(code)
        if timed_out:
            raise AgentError(
                f"{stdout}\nExecuting code timed out after {self.timeout:g}s: the kernel was restarted, "
                "so variables, imports and tools defined before are gone",
                self.logger,
            )
        if exit_code == 0:
            return CodeOutput(output=None, logs=stdout, is_final_answer=False)
        name, value = self._last_error()
        if name == self.FINAL_ANSWER_EXCEPTION:
            answer = self._deserialize_final_answer(value, self.allow_pickle)
            return CodeOutput(output=answer, logs=stdout, is_final_answer=True)
        raise AgentError(f"{stdout}\nExecuting code yielded an error:\n{stderr}", self.logger)

    def _last_error(self) -> tuple[str | None, str]:
        exit_code, stdout, _stderr, _timed_out = self._run_cell(_LAST_ERROR)
        lines = stdout.strip().splitlines()
        found = json.loads(lines[-1]) if exit_code == 0 and lines else None
        return (found[0], found[1]) if isinstance(found, list) else (None, "")

    def cleanup(self) -> None:
        """Remove the workspace, its kernel and its files."""
        if not self.engine.closed:
            self.engine.manager.cleanup(self.workspace)


_LIMITS = ResourceLimits()


def _require_kernels(engine: Engine) -> None:
    if not isinstance(engine, SupportsKernels) or not engine.kernels.handles("python"):
        raise CapabilityError(
            "a stateful Python kernel",
            engine.name,
            "Open the engine with execspace.sync.open_engine('jupyter') (sandboxed kernels by default).",
        )
