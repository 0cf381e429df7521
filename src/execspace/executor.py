"""Run fenced code blocks in a workspace on any Engine; return their text *and* their files.

::

    async with execspace.code_executor("local") as ex:
        blocks = extract_code_blocks(llm_reply)
        result = await ex.execute_code(CodeExecutionInput(blocks, execution_id="chat-42"))
        print(result)            # text of every block, then the files written to out/

Each block is written to ``src/code_<call>_<i><ext>`` and run by its language's
runtime with ``work/`` as the working directory. A block whose language has no
runtime becomes an error block (exit code 127); the next block still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import re
import secrets
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from types import TracebackType

from wcmatch import glob as wglob

from .engine import open_engine_from
from .errors import InvalidSpec, UnsupportedLanguage, UsageError
from .languages import LANGUAGES, Language, pick_runtime, resolve_language
from .models import (
    DEFAULT_TIMEOUT,
    BlockResult,
    CodeBlock,
    CodeExecutionInput,
    CodeExecutionResult,
    File,
    FileKind,
    Persistence,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    Workspace,
    WorkspacePolicy,
)
from .protocols import Engine, SupportsKernels, WorkspaceFS

__all__ = ["CodeBlockDelimiter", "CodeExecutor", "EngineOpener", "code_executor", "extract_code_blocks"]

#: A zero-argument callable giving an async context manager that yields an Engine
#: (``lambda: open_engine("local")``); the executor enters it on first use.
EngineOpener = Callable[[], AbstractAsyncContextManager[Engine]]

#: Exit code of a block that could not run, as a shell reports a missing command.
NOT_RUN_EXIT_CODE = 127

#: What a call's output files looked like: ``path -> (size, mtime)``.
_Listing = dict[str, tuple[int, float]]
#: Most changed files collected by their literal paths; more are collected by the executor's globs.
_MAX_LITERAL_PATHS = 64


@dataclass(frozen=True, slots=True)
class CodeBlockDelimiter:
    """The fences around a code block. Both are matched literally (never as regex)."""

    start: str = "```"
    end: str = "```"

    def __post_init__(self) -> None:
        if not self.start or not self.end:
            raise InvalidSpec("code block delimiters must not be empty")


def extract_code_blocks(text: str, delimiter: CodeBlockDelimiter | None = None) -> list[CodeBlock]:
    """All non-overlapping fenced blocks of ``text``, in order.

    The opening fence is followed by the language tag (the rest of that line,
    trimmed; may be empty) and a newline (``\\n`` or ``\\r\\n``). The code is kept
    verbatim up to the closing fence. A fence that is never closed yields nothing.
    Fences used inline (```x``` within a line of prose) open no block.
    """
    d = delimiter or CodeBlockDelimiter()
    start, end = re.escape(d.start), re.escape(d.end)
    opening = re.compile(rf"{start}((?:(?!{end})[^\n])*)\n")
    blocks: list[CodeBlock] = []
    pos = after_block = 0
    while (m := opening.search(text, pos)) is not None:
        # prose before the fence, on its line and after the previous block
        before = text[max(text.rfind("\n", 0, m.start()) + 1, after_block) : m.start()]
        if d.start in before or d.end in before:
            pos = m.start() + 1
            continue
        close = text.find(d.end, m.end())
        if close < 0:
            break  # nothing after this point is closed either
        blocks.append(CodeBlock(m.group(1).strip(), text[m.end() : close]))
        pos = after_block = close + len(d.end)
    return blocks


class CodeExecutor:
    """Runs code blocks in workspaces of one Engine.

    Give either an ``engine`` (closed by :meth:`close` only when ``owns_engine``)
    or an ``opener`` (entered on first use, always closed by :meth:`close`).
    ``timeout`` and ``limits`` apply to each block; the engine must enforce them,
    or :class:`~execspace.errors.CapabilityError` is raised before anything runs.
    ``collect_globs`` select the output files reported (those new or changed by a call).
    """

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        limits: ResourceLimits | None = None,
        workspace_policy: WorkspacePolicy | None = None,
        owns_engine: bool = False,
        collect_globs: Sequence[str] = ("out/**",),
        opener: EngineOpener | None = None,
    ) -> None:
        if (engine is None) == (opener is None):
            raise UsageError("CodeExecutor needs exactly one of engine= or opener=")
        self.timeout = timeout
        self.limits = limits or ResourceLimits()
        self.workspace_policy = workspace_policy or WorkspacePolicy()
        self.collect_globs = tuple(collect_globs)
        # validates timeout and limits once, so that a bad value fails here and not per block
        self._probe_spec = RunProgramSpec("true", timeout=timeout, limits=self.limits)
        self._engine = engine
        self._opener = opener
        self._owns_engine = owns_engine or opener is not None
        self._stack: contextlib.AsyncExitStack | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        if engine is not None:
            engine.describe().require(self._probe_spec)

    # -- engine lifetime ---------------------------------------------------------------

    @property
    def engine(self) -> Engine | None:
        """The engine in use; ``None`` until an opener has been entered."""
        return self._engine

    async def _acquire(self) -> Engine:
        if self._closed:
            raise UsageError("this code executor is closed; create a new one")
        if self._engine is not None:
            return self._engine
        async with self._open_lock:
            if self._engine is None:
                self._engine = await self._open()
        if self._closed and self._stack is not None:  # close() ran while the engine opened: do not leak it
            await self._stack.aclose()
            raise UsageError("this code executor was closed while it opened its engine")
        return self._engine

    async def _open(self) -> Engine:
        assert self._opener is not None
        stack = contextlib.AsyncExitStack()
        engine = await stack.enter_async_context(self._opener())
        try:
            engine.describe().require(self._probe_spec)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return engine

    async def close(self) -> None:
        """Close the engine if this executor owns it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._stack is not None:
            await self._stack.aclose()
        elif self._owns_engine and self._engine is not None:
            await self._engine.aclose()

    async def __aenter__(self) -> CodeExecutor:
        await self._acquire()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- execution -----------------------------------------------------------------------

    async def execute_code(self, input: CodeExecutionInput) -> CodeExecutionResult:
        """Run every block of ``input`` in order, in the workspace of ``input.execution_id``.

        Without an id the blocks run in a fresh workspace that is removed afterwards;
        with one, files (and anything the blocks leave in ``work/``) persist across calls.
        """
        engine = await self._acquire()
        policy = self.workspace_policy
        exec_id = input.execution_id
        if exec_id is None:
            exec_id = f"exec-{secrets.token_hex(8)}"
            policy = replace(policy, persistence=Persistence.TURN)
        ws = await engine.manager.create_workspace(exec_id, policy)
        try:
            return await self.execute_in(ws, input.code_blocks)
        finally:
            if policy.persistence is Persistence.TURN:  # a turn workspace can never be found again
                await engine.manager.cleanup(ws)

    async def execute_in(self, ws: Workspace, blocks: Sequence[CodeBlock]) -> CodeExecutionResult:
        """Run ``blocks`` in order in ``ws``, a workspace of this executor's engine that the caller made (and
        removes, or keeps): the output files are those the blocks created or changed."""
        engine = await self._acquire()
        before = await self._snapshot(engine.fs, ws)
        call_tag = secrets.token_hex(4)  # keeps repeated calls in one workspace from overwriting sources
        results: list[BlockResult] = []
        texts: list[str] = []
        for i, block in enumerate(blocks):
            result, text = await self._run_block(engine, ws, block, i, call_tag)
            results.append(result)
            texts.append(text)
        files = await self._changed_files(engine.fs, ws, before)
        return CodeExecutionResult(output="".join(texts), output_files=tuple(files), blocks=tuple(results))

    async def _run_block(
        self, engine: Engine, ws: Workspace, block: CodeBlock, index: int, call_tag: str
    ) -> tuple[BlockResult, str]:
        in_kernel = await self._run_in_kernel(engine, ws, block, index)
        if in_kernel is not None:
            return in_kernel
        try:
            lang, runtime = self._runtime_for(engine, ws, block.language)
        except UnsupportedLanguage as exc:
            error = f"{exc}; {hint}" if (hint := block.swap_hint()) else str(exc)
            result = BlockResult(index, block.language, NOT_RUN_EXIT_CODE, "", "", 0.0, error=error)
            return result, f"[error: {error}]\n"
        rel = f"src/code_{call_tag}_{index}{lang.extension}"
        await engine.fs.put_files(ws, [PutFile(rel, _lf_newlines(block.code), lang.file_mode)])
        spec = RunProgramSpec(
            runtime[0],
            [*runtime[1:], posixpath.join(ws.path, rel)],
            cwd="work",
            timeout=self.timeout,
            limits=self.limits,
        )
        run = await engine.runner.run_program(ws, spec)
        result = BlockResult(index, block.language, run.exit_code, run.stdout, run.stderr, run.duration, run.timed_out)
        return result, self._block_text(run)

    async def _run_in_kernel(
        self, engine: Engine, ws: Workspace, block: CodeBlock, index: int
    ) -> tuple[BlockResult, str] | None:
        """Run the block in the engine's stateful kernel when it has one for this language."""
        if not isinstance(engine, SupportsKernels) or not engine.kernels.handles(block.language):
            return None
        return await engine.kernels.run_block(ws, block, index, timeout=self.timeout, limits=self.limits)

    def _runtime_for(self, engine: Engine, ws: Workspace, tag: str) -> tuple[Language, tuple[str, ...]]:
        """The language of a fence tag and the command prefix that runs it on this engine."""
        words = tag.split()
        if not words:
            known = ", ".join(a for lang in LANGUAGES for a in lang.aliases)
            raise UnsupportedLanguage(f"code block has no language tag; tag it with one of: {known}")
        lang = resolve_language(words[0])  # CommonMark: the first word of the info string is the language
        caps = engine.describe()
        if lang.name not in caps.languages:
            programs = " or ".join(r[0] for r in lang.runtimes)
            raise UnsupportedLanguage(
                f"no runtime for {lang.name} on backend {caps.backend!r}: none of {programs} is on "
                f"the program's PATH; install one, or use a language this backend has "
                f"({', '.join(caps.languages) or 'none'})"
            )
        # only host-path workspaces share this host's PATH; elsewhere trust the first choice
        found = pick_runtime(lang, None) if ws.host_path is not None else None
        return lang, found or lang.runtimes[0]

    def _block_text(self, run: RunResult) -> str:
        parts = [s if s.endswith("\n") else s + "\n" for s in (run.stdout, run.stderr) if s]
        if run.timed_out:
            parts.append(f"[timed out after {self.timeout:g}s; output so far is shown]\n")
        elif run.limit_hit is not None:
            parts.append(f"[stopped by the {run.limit_hit} limit, exit code {run.exit_code}]\n")
        elif run.exit_code != 0:
            parts.append(f"[exit code {run.exit_code}]\n")
        return "".join(parts)

    # -- output files ------------------------------------------------------------------

    async def _snapshot(self, fs: WorkspaceFS, ws: Workspace) -> _Listing:
        return await _listing(fs, ws, self.collect_globs)

    async def _changed_files(self, fs: WorkspaceFS, ws: Workspace, before: _Listing) -> list[File]:
        """The files new or changed since ``before``, by their listing: only those are read."""
        after = await _listing(fs, ws, self.collect_globs)
        changed = {p for p, key in after.items() if before.get(p) != key}
        if not changed:
            return []
        # literal paths when few changed (one glob per file costs a match per walked entry)
        few = len(changed) <= _MAX_LITERAL_PATHS and len(changed) < len(after)
        patterns = [str(wglob.escape(p)) for p in sorted(changed)] if few else self.collect_globs
        files = await fs.collect(ws, patterns)
        return sorted((f for f in files if f.name in changed), key=lambda f: f.name)


async def _listing(fs: WorkspaceFS, ws: Workspace, globs: Sequence[str]) -> _Listing:
    """``path -> (size, mtime)`` of the regular files matching ``globs``, without reading them.

    A rewrite changes the mtime even at the same size (only one in the same clock tick as the
    listed write could pass unseen: Linux >= 6.13 stamps it finer once the mtime was read).
    """
    return {e.path: (e.size, e.mtime) for e in await fs.list(ws, globs) if e.kind is FileKind.FILE}


def _lf_newlines(code: str) -> str:
    # bash reads a CR as part of the command; python and node treat CRLF and LF alike
    return code.replace("\r\n", "\n")


def code_executor(
    backend: str | None = None,
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    limits: ResourceLimits | None = None,
    workspace_policy: WorkspacePolicy | None = None,
    collect_globs: Sequence[str] = ("out/**",),
    **engine_options: object,
) -> CodeExecutor:
    """A :class:`CodeExecutor` with its own engine, opened on first use (or on ``async with``)
    by :func:`~execspace.open_engine` with ``backend`` and ``engine_options``, and closed by
    :meth:`CodeExecutor.close`."""
    return CodeExecutor(
        opener=lambda: open_engine_from(backend, engine_options),
        timeout=timeout,
        limits=limits,
        workspace_policy=workspace_policy,
        collect_globs=collect_globs,
    )
