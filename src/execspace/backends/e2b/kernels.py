"""Code blocks in the sandbox's code interpreter (E2B's port 49999, ``e2b-code-interpreter``'s ``run_code``).

One context per workspace and language, working in the workspace's ``work/``: variables persist across blocks.
Rich results become files under ``out/`` (``out/cell-<n>-<k>.<ext>``), stdout and stderr stay apart, an error
keeps its name, value and traceback.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
import time
from typing import TYPE_CHECKING, Any

from ...audit import AuditSink, cell_executed
from ...errors import BackendError, UnsupportedLanguage, WorkspaceNotFound
from ...models import (
    DEFAULT_OUTPUT_BYTES,
    DEFAULT_TIMEOUT,
    BlockResult,
    CellResult,
    CodeBlock,
    PutFile,
    ResourceLimits,
    Workspace,
)
from ...process.capture import HeadTailBuffer
from ...protocols import WorkspaceFS
from .sandboxes import Box, Sandboxes, workspace_key

if TYPE_CHECKING:
    from e2b_code_interpreter import Execution

__all__ = ["LANGUAGES", "LANGUAGE_NAMES", "E2BKernels", "kernel_language"]

#: Fence tag → the code interpreter's language name.
LANGUAGES = {
    **dict.fromkeys(("python", "py", "python3"), "python"),
    **dict.fromkeys(("javascript", "js", "node", "nodejs"), "js"),
    **dict.fromkeys(("typescript", "ts"), "ts"),
    **dict.fromkeys(("bash", "sh", "shell"), "bash"),
    "r": "r",
    "java": "java",
}

#: The code interpreter's language name → the executor's.
LANGUAGE_NAMES = {"python": "python", "js": "javascript", "ts": "typescript", "bash": "bash", "r": "r", "java": "java"}

#: Result field → (file extension, base64 payload). Text results stay in the output text.
_FILES = {
    "png": (".png", True),
    "jpeg": (".jpg", True),
    "pdf": (".pdf", True),
    "svg": (".svg", False),
    "latex": (".tex", False),
    "html": (".html", False),
    "markdown": (".md", False),
    "json": (".json", False),
}


_CELL_FILE = re.compile(r"^out/cell-(\d+)-")

#: IPython colours tracebacks; the reader of the result is a model or a log, not a terminal.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


def kernel_language(tag: str) -> str:
    """The code interpreter's name for fence tag ``tag``; ``UnsupportedLanguage`` for one it has no kernel of."""
    words = tag.split()
    found = LANGUAGES.get(words[0].lower()) if words else None
    if found is None:
        raise UnsupportedLanguage(
            f"language {tag!r} has no kernel in the E2B code interpreter; use one of: {', '.join(LANGUAGES)}"
        )
    return found


class E2BKernels:
    """The workspaces' kernels in the code interpreter (``engine.kernels``): a :class:`~execspace.CellKernels`, the
    jupyter backend's surface, and the executor's :class:`~execspace.protocols.Kernels`."""

    def __init__(self, boxes: Sandboxes, fs: WorkspaceFS, audit: AuditSink | None = None) -> None:
        self.audit = audit
        """Where a ``cell.execute`` line of each cell goes (its language and size, never its code)."""
        self._languages = {kernel_language(tag) for tag in boxes.options.code_languages}
        self._boxes = boxes
        self._fs = fs
        self._contexts: dict[tuple[str, str, str], Any] = {}
        self._cells: dict[str, int] = {}

    def handles(self, tag: str) -> bool:
        words = tag.split()
        return bool(words) and LANGUAGES.get(words[0].lower()) in self._languages

    async def run_block(
        self,
        ws: Workspace,
        block: CodeBlock,
        index: int,
        *,
        timeout: float | None,  # noqa: ASYNC109 - a deadline for the cell, not for our task
        limits: ResourceLimits,
    ) -> tuple[BlockResult, str]:
        unenforced = sorted(limits.requested() - {"output_bytes"})
        if unenforced:
            why = f"the E2B code interpreter does not enforce {', '.join(unenforced)} per cell; drop these limits"
            return BlockResult(index, block.language, 127, "", "", 0.0, error=why), f"[error: {why}]\n"
        cell = await self.execute(
            ws, block.code, timeout=timeout, output_bytes=limits.output_bytes, language=block.language
        )
        return cell.as_block(index, block.language), cell.text

    async def execute(
        self,
        ws: Workspace,
        code: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - a deadline for the cell, not for our task
        output_bytes: int | None = DEFAULT_OUTPUT_BYTES,
        language: str = "python",
    ) -> CellResult:
        """Run ``code`` in the workspace's kernel of ``language`` (a fence tag: ``python``, ``js``…; started on first
        use, in the workspace's ``work/``), as the jupyter backend's ``kernels.execute`` does: rich results saved
        under ``out/cell-<n>-<k>.<ext>``, an error with its name, value and traceback (exit 1), a cell past its
        timeout ``timed_out`` (exit 124).

        Raises:
            UnsupportedLanguage: no kernel of ``language`` in the code interpreter.
            BackendError: the service has no kernel of it (501), or cannot be reached.
            SandboxLost: the workspace's sandbox is gone.
        """
        kernel = kernel_language(language)
        cell = self._cells[ws.path] = self._cells.get(ws.path) or await self.next_cell_number(ws)
        self._cells[ws.path] += 1
        started = time.monotonic()
        execution, timed_out = await self._run(ws, kernel, code, timeout)
        duration = time.monotonic() - started
        files = _files(execution, cell)
        if files:
            await self._fs.put_files(ws, files)
        stdout, stderr, text = (HeadTailBuffer(output_bytes) for _ in range(3))
        for chunk in execution.logs.stdout:
            _write(chunk, stdout, text)
        for result in execution.results:
            if result.text and result.is_main_result:
                _write(result.text + "\n", stdout, text)
        if files:
            _write(f"[saved {', '.join(f.path for f in files)}]\n", stdout, text)
        for chunk in execution.logs.stderr:
            _write(chunk, stderr, text)
        code_ = 0
        error = execution.error
        if error is not None:
            _write(f"{_ANSI.sub('', error.traceback) or f'{error.name}: {error.value}'}\n", stderr, text)
            code_ = 1
        if timed_out:
            _write(f"[timed out after {timeout:g}s]\n", stderr, text)
            code_ = 124
        return CellResult(
            exit_code=code_,
            text=text.getvalue().decode("utf-8", "replace"),
            stdout=stdout.getvalue().decode("utf-8", "replace"),
            stderr=stderr.getvalue().decode("utf-8", "replace"),
            files=tuple(f.path for f in files),
            duration=duration,
            timed_out=timed_out,
            error=None if error is None else (error.name, error.value),
            truncated=text.truncated,
        )

    async def next_cell_number(self, ws: Workspace) -> int:
        """One past the highest ``out/cell-N-*`` already in ``ws``, so that a kernel of this engine never
        overwrites the outputs of an earlier one (a workspace found again per session)."""
        found = [_CELL_FILE.match(e.path) for e in await self._fs.list(ws, ["out/cell-*"])]
        return max((int(m.group(1)) for m in found if m), default=0) + 1

    async def shutdown(self, ws: Workspace) -> None:
        """Remove the workspace's contexts from the code interpreter: their state is lost, the next cell starts a
        fresh one. Idempotent; a sandbox that is gone has none left to remove."""
        try:
            box: Box | None = self._boxes.box(workspace_key(ws.id))
        except WorkspaceNotFound:
            box = None  # cleaned up already: its sandbox's kernels went with it, or with its directory
        for key in [key for key in self._contexts if key[1] == ws.id]:
            context = self._contexts.pop(key)
            if box is not None and key[0] == box.id:  # an older sandbox of the workspace took its kernels along
                with contextlib.suppress(BackendError):
                    await box.call(f"stopping a {key[2]} kernel", box.sandbox.remove_code_context(context))

    async def _run(
        self,
        ws: Workspace,
        language: str,
        code: str,
        timeout: float | None,  # noqa: ASYNC109 - the cell's
    ) -> tuple[Execution, bool]:
        from e2b import TimeoutException
        from e2b_code_interpreter import Execution

        box = self._boxes.box(workspace_key(ws.id))
        if self.audit is not None:
            self.audit.record("cell.execute", {**cell_executed(ws.id, language, code), "sandbox": box.id})
        key = (box.id, ws.id, language)  # a fresh sandbox (per turn, or after a loss) has fresh kernels
        context = self._contexts.get(key)
        if context is None:
            work = box.sdk_path(f"{ws.path}/work")
            what = f"starting a {language} kernel"
            context = await box.call(what, box.sandbox.create_code_context(cwd=work, language=language))
            self._contexts[key] = context
        try:
            run = box.sandbox.run_code(code, context=context, timeout=timeout or 0)
            return await box.call(f"running a {language} cell", run), False
        except BackendError as exc:
            if isinstance(exc.__cause__, TimeoutException) and timeout is not None:
                return Execution(), True
            raise


def _write(text: str, *into: HeadTailBuffer) -> None:
    data = text.encode("utf-8", "replace")
    for buffer in into:
        buffer.write(data)


def _files(execution: Execution, cell: int) -> list[PutFile]:
    files = []
    for k, result in enumerate(execution.results, 1):
        for field_name, (ext, is_b64) in _FILES.items():
            payload = getattr(result, field_name, None)
            if payload is None:
                continue
            files.append(PutFile(f"out/cell-{cell}-{k}{ext}", _decode(payload, is_b64)))
    return files


def _decode(payload: Any, is_b64: bool) -> bytes:
    if not isinstance(payload, str):
        return json.dumps(payload, indent=2).encode()
    if is_b64:
        try:
            return base64.b64decode(payload, validate=False)
        except (binascii.Error, ValueError):
            pass  # keep what the kernel sent rather than lose the output
    return payload.encode("utf-8", "replace")
