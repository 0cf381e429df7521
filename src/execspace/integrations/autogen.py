"""AutoGen: an ``autogen_core`` code executor whose blocks run in one execspace workspace.

::

    async with execspace.open_engine("sandbox") as engine, ExecspaceCodeExecutor(engine) as executor:
        result = await executor.execute_code_blocks([CodeBlock("print(6 * 7)", "python")], CancellationToken())

The blocks of a call run in order in the executor's workspace (its files persist across calls, as with AutoGen's
command-line executors), each by its language's runtime with ``work/`` as the working directory, or in the
engine's stateful kernel where it has one; the first block that fails or times out (exit code 124) ends the call.
Files the blocks write under ``out/`` come back in :attr:`ExecspaceCodeResult.files`. Cancelling the token kills
the running block's whole process tree; the blocks after it never run. ``restart`` gives a fresh workspace.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import UsageError
from ..executor import CodeExecutor as BlockRunner
from ..models import DEFAULT_TIMEOUT, CodeExecutionInput, File, ResourceLimits, Workspace
from ..models import CodeBlock as ExecspaceBlock
from ..protocols import Engine
from . import MissingExtra

try:
    from autogen_core import CancellationToken
    from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise MissingExtra("autogen", "AutoGen (autogen-core)", exc) from exc

__all__ = ["TIMEOUT_EXIT_CODE", "ExecspaceCodeExecutor", "ExecspaceCodeResult"]

#: Exit code of a block stopped by its timeout, as AutoGen's command-line executors report it.
TIMEOUT_EXIT_CODE = 124


@dataclass
class ExecspaceCodeResult(CodeResult):
    """AutoGen's result, with the files the blocks wrote under ``out/`` (new or changed by this call)."""

    files: tuple[File, ...] = ()


class ExecspaceCodeExecutor(CodeExecutor):
    """Runs AutoGen code blocks in one workspace of ``engine`` (which the caller opens and closes).

    Args:
        engine: the backend, e.g. ``open_engine("sandbox")``.
        workspace_id: the workspace's id (default ``autogen/<uuid>``).
        timeout: deadline of each block, in seconds; the engine must enforce it.
        limits: resource limits of each block; the engine must enforce them (else ``CapabilityError`` here).
        collect_globs: which new or changed files come back with a result.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        workspace_id: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        limits: ResourceLimits | None = None,
        collect_globs: Sequence[str] = ("out/**",),
    ) -> None:
        self._engine = engine
        self._runner = BlockRunner(engine, timeout=timeout, limits=limits, collect_globs=collect_globs)
        self._workspace_id = workspace_id or f"autogen/{uuid.uuid4()}"
        self._ws: Workspace | None = None

    @property
    def workspace(self) -> Workspace:
        if self._ws is None:
            raise UsageError("the executor has not started: use `async with executor:` or `await executor.start()`")
        return self._ws

    async def start(self) -> None:
        if self._ws is None:
            self._ws = await self._engine.manager.create_workspace(self._workspace_id)

    async def stop(self) -> None:
        """Remove the workspace, its files and anything still running in it."""
        ws, self._ws = self._ws, None
        if ws is not None:
            await self._engine.manager.cleanup(ws)

    async def restart(self) -> None:
        """A fresh workspace of the same id: no file, process or kernel state of before is left."""
        await self.stop()
        await self.start()

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> ExecspaceCodeResult:
        """Run the blocks in order until one fails; ``asyncio.CancelledError`` once the token is cancelled."""
        ws = self.workspace
        texts: list[str] = []
        files: list[File] = []
        exit_code = 0
        for block in code_blocks:
            if cancellation_token.is_cancelled():
                raise asyncio.CancelledError
            request = CodeExecutionInput([ExecspaceBlock(block.language, block.code)], execution_id=ws.id)
            run = asyncio.ensure_future(self._runner.execute_code(request))
            cancellation_token.link_future(run)
            result = await run
            texts.append(result.output)
            files.extend(result.output_files)
            ran = result.blocks[0]
            exit_code = TIMEOUT_EXIT_CODE if ran.timed_out else ran.exit_code
            if exit_code != 0:
                break
        texts.extend(f"[file written: {f.name} ({f.mime_type}, {f.size_bytes} bytes)]\n" for f in files)
        return ExecspaceCodeResult(exit_code=exit_code, output="".join(texts), files=tuple(files))
