"""Code blocks in the sandbox's code interpreter (E2B's port 49999, ``e2b-code-interpreter``'s ``run_code``).

One context per workspace and language, working in the workspace's ``work/``: variables persist across blocks.
Rich results become files under ``out/`` (``out/cell-<n>-<k>.<ext>``), stdout and stderr stay apart, an error
keeps its name, value and traceback.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from typing import TYPE_CHECKING, Any

from ...errors import BackendError, UnsupportedLanguage
from ...models import BlockResult, CodeBlock, PutFile, ResourceLimits, Workspace
from ...process.capture import HeadTailBuffer
from .sandboxes import Sandboxes, workspace_key

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
    """The executor's kernels for the e2b engine (``engine.kernels``)."""

    def __init__(self, boxes: Sandboxes, put_files: Any) -> None:
        self._languages = {kernel_language(tag) for tag in boxes.options.code_languages}
        self._boxes = boxes
        self._put_files = put_files
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
        language = kernel_language(block.language)
        unenforced = sorted(limits.requested() - {"output_bytes"})
        if unenforced:
            why = f"the E2B code interpreter does not enforce {', '.join(unenforced)} per cell; drop these limits"
            return BlockResult(index, block.language, 127, "", "", 0.0, error=why), f"[error: {why}]\n"
        cell = self._cells[ws.id] = self._cells.get(ws.id, 0) + 1
        started = time.monotonic()
        execution, timed_out = await self._run(ws, language, block.code, timeout)
        duration = time.monotonic() - started
        files = _files(execution, cell)
        if files:
            await self._put_files(ws, files)
        stdout, stderr, text = (HeadTailBuffer(limits.output_bytes) for _ in range(3))
        for chunk in execution.logs.stdout:
            _write(chunk, stdout, text)
        for result in execution.results:
            if result.text and result.is_main_result:
                _write(result.text + "\n", stdout, text)
        if files:
            _write(f"[saved {', '.join(f.path for f in files)}]\n", stdout, text)
        for chunk in execution.logs.stderr:
            _write(chunk, stderr, text)
        code = 0
        if execution.error is not None:
            e = execution.error
            _write(f"{_ANSI.sub('', e.traceback) or f'{e.name}: {e.value}'}\n", stderr, text)
            code = 1
        if timed_out:
            _write(f"[timed out after {timeout:g}s]\n", stderr, text)
            code = 124
        out, err = stdout.getvalue().decode("utf-8", "replace"), stderr.getvalue().decode("utf-8", "replace")
        result = BlockResult(index, block.language, code, out, err, duration, timed_out)
        return result, text.getvalue().decode("utf-8", "replace")

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
