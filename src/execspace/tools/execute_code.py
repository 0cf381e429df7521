"""The ``execute_code`` tool: code blocks in, output text (within a byte budget) and files out.

::

    executor = CodeExecutor(engine, timeout=30)
    tool = ExecuteCodeTool(executor, execution_id="app/user/session")   # the app picks the workspace
    tools = [tool.spec.openai()]                                         # or .anthropic()
    result = await tool.call({"code_blocks": [{"language": "python", "code": "print(6*7)"}]})
    # {"status": "ok", "output": "42\\n", "output_truncated": False, "output_total_bytes": 3,
    #  "blocks": [{"index": 0, "language": "python", "exit_code": 0}], "files": []}

The model never chooses the workspace: ``execution_id`` is set by the application
(per tool or per call), so one model cannot reach another session's files. The exact
argument rules and result fields are in ``docs/tools/execute_code.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import ExecspaceError, InvalidSpec, UnsupportedLanguage
from ..executor import CodeExecutor
from ..languages import NON_EXECUTABLE, Language, resolve_language
from ..models import BlockResult, CodeBlock, CodeExecutionInput, CodeExecutionResult, File
from ..process.capture import clip_text
from .schema import InvalidArguments, ToolArguments, ToolSpec, check_arguments, decode_arguments, error_result

__all__ = [
    "DEFAULT_CODE_LANGUAGES",
    "DEFAULT_OUTPUT_BUDGET",
    "MAX_CODE_BLOCKS",
    "MAX_FILES_LISTED",
    "ExecuteCodeTool",
    "files_report",
    "render_result",
    "resolve_languages",
]

#: Languages the tool offers when none are given.
DEFAULT_CODE_LANGUAGES = ("python", "bash")
#: Bytes of output text kept (head + tail) in what the model sees.
DEFAULT_OUTPUT_BUDGET = 16 * 1024
MAX_CODE_BLOCKS = 16
MAX_FILES_LISTED = 20

_DESCRIPTION = (
    "Execute code and return its output and the files it wrote. Use it for computation, data analysis "
    "or checking logic. Blocks run in order in one workspace: the working directory is work/ (inputs in "
    "work/inputs/); write files to keep to $OUTPUT_DIR (out/). Give `code_blocks`, or one `code` with "
    "its `language`. Output beyond the budget is cut in the middle, with a marker."
)


def resolve_languages(languages: Sequence[str] | None, default: Sequence[str]) -> tuple[Language, ...]:
    """The :class:`Language` of each name or alias, in order, without duplicates.

    Raises:
        InvalidSpec: a name is unknown or names data (``json``, ``yaml``… never run).
    """
    if isinstance(languages, str):
        raise InvalidSpec("languages must be a list of names, not one string")
    found: list[Language] = []
    for name in default if languages is None else languages:
        if name.strip().lower() in NON_EXECUTABLE:
            raise InvalidSpec(f"{name!r} is not an executable language")
        try:
            lang = resolve_language(name)
        except UnsupportedLanguage as exc:
            raise InvalidSpec(str(exc)) from None
        if lang not in found:
            found.append(lang)
    if not found:
        raise InvalidSpec("at least one language is needed")
    return tuple(found)


def files_report(files: Sequence[File], max_listed: int = MAX_FILES_LISTED) -> dict[str, Any]:
    """``{"files": [{path, size, mime_type}]}`` (the keys ``workspace_exec`` uses), plus
    ``files_not_listed`` past ``max_listed``."""
    listed = [{"path": f.name, "size": f.size_bytes, "mime_type": f.mime_type} for f in files[:max_listed]]
    report: dict[str, Any] = {"files": listed}
    if len(files) > max_listed:
        report["files_not_listed"] = len(files) - max_listed
    return report


def render_result(result: CodeExecutionResult, budget: int) -> tuple[str, bool, int]:
    """The model-facing text of ``result`` with its output cut to ``budget`` bytes.

    Returns the text (``Code execution result:``, the output, the output files), whether
    the output was cut, and the output's full size in bytes. The file list is never cut.
    """
    output, truncated, total = clip_text(result.output, budget)
    return str(replace(result, output=output)), truncated, total


class ExecuteCodeTool:
    """The ``execute_code`` function tool over a :class:`~execspace.executor.CodeExecutor`.

    Args:
        executor: runs the blocks (its engine, timeout and limits apply).
        languages: names or aliases offered to the model (default ``python``, ``bash``).
        output_budget: bytes of output text kept for the model (head + tail, plus a marker).
        execution_id: the workspace the blocks run in; ``None`` runs each call in a fresh
            workspace that is removed afterwards. A call may override it.
        name, description: what the model sees.
    """

    def __init__(
        self,
        executor: CodeExecutor,
        *,
        languages: Sequence[str] | None = None,
        output_budget: int = DEFAULT_OUTPUT_BUDGET,
        execution_id: str | None = None,
        name: str = "execute_code",
        description: str = _DESCRIPTION,
    ) -> None:
        if output_budget <= 0:
            raise InvalidSpec(f"output_budget must be positive, got {output_budget!r}")
        self.executor = executor
        self.languages = resolve_languages(languages, DEFAULT_CODE_LANGUAGES)
        self.output_budget = output_budget
        self.execution_id = execution_id
        self.spec = ToolSpec(name, description, self._parameters())

    def _parameters(self) -> dict[str, Any]:
        names = [lang.name for lang in self.languages]
        language = {"type": "string", "enum": names, "description": "Language of the code."}
        code = {"type": "string", "minLength": 1, "description": "The source code."}
        return {
            "type": "object",
            "properties": {
                "code_blocks": {
                    "type": "array",
                    "maxItems": MAX_CODE_BLOCKS,
                    "description": "Code blocks, run in order in the same workspace.",
                    "items": {
                        "type": "object",
                        "properties": {"language": language, "code": code},
                        "required": ["language", "code"],
                        "additionalProperties": False,
                    },
                },
                "language": {**language, "description": "Language of `code` (when not using code_blocks)."},
                "code": {**code, "description": "One block of source code (instead of code_blocks)."},
            },
            "additionalProperties": False,
        }

    async def call(self, arguments: ToolArguments, *, execution_id: str | None = None) -> dict[str, Any]:
        """Run the blocks; return JSON-ready data. Mistakes in the arguments come back as
        ``{"status": "error", ...}`` with nothing run, never as exceptions."""
        try:
            blocks = self.parse_blocks(arguments)
            result = await self.executor.execute_code(
                CodeExecutionInput(blocks, execution_id=execution_id or self.execution_id)
            )
        except ExecspaceError as exc:
            return error_result(exc)
        output, truncated, total = clip_text(result.output, self.output_budget)
        return {
            "status": "ok" if result.ok else "failed",
            "output": output,
            "output_truncated": truncated,
            "output_total_bytes": total,
            "blocks": [_block_report(b) for b in result.blocks],
            **files_report(result.output_files),
        }

    def parse_blocks(self, arguments: ToolArguments) -> list[CodeBlock]:
        """The code blocks of a call, checked against the schema.

        Lenient where models commonly slip: ``code_blocks`` may also be one object or a
        JSON-encoded string, and languages may be any alias in any case (``py``, ``Python``).

        Raises:
            InvalidArguments: the arguments break the schema or give no code.
        """
        args = check_arguments(self.spec.parameters, self._normalise(dict(decode_arguments(arguments))))
        if "code_blocks" in args and ("code" in args or "language" in args):
            raise InvalidArguments("give either code_blocks or code with language, not both")
        if "code_blocks" in args:
            raw = args["code_blocks"]
        elif "code" in args:
            if "language" not in args:
                raise InvalidArguments(f"code needs a language (one of {[lang.name for lang in self.languages]})")
            raw = [{"language": args["language"], "code": args["code"]}]
        else:
            raise InvalidArguments("missing code_blocks (or code with language): nothing to run")
        if not raw:
            raise InvalidArguments("code_blocks is empty: nothing to run")
        return [CodeBlock(b["language"], b["code"]) for b in raw]

    def _normalise(self, args: dict[str, Any]) -> dict[str, Any]:
        blocks = args.get("code_blocks")
        if isinstance(blocks, str):
            try:
                blocks = json.loads(blocks)
            except ValueError:
                raise InvalidArguments("code_blocks is a string that is not JSON; pass an array") from None
        if isinstance(blocks, Mapping):
            blocks = [blocks]
        if isinstance(blocks, list):
            blocks = [self._canonical_language(b) for b in blocks]
            args["code_blocks"] = blocks
        if "language" in args:
            args["language"] = self._canonical(args["language"])
        return args

    def _canonical_language(self, block: Any) -> Any:
        if isinstance(block, Mapping) and "language" in block:
            return {**block, "language": self._canonical(block["language"])}
        return block

    def _canonical(self, tag: Any) -> Any:
        """An alias of an offered language becomes its name; anything else is left for the schema to refuse."""
        if not isinstance(tag, str):
            return tag
        key = tag.strip().lower()
        return next((lang.name for lang in self.languages if key in lang.aliases), tag)


def _block_report(b: BlockResult) -> dict[str, Any]:
    report: dict[str, Any] = {"index": b.index, "language": b.language, "exit_code": b.exit_code}
    if b.timed_out:
        report["timed_out"] = True
    if b.error is not None:
        report["error"] = b.error
    return report
