"""The fenced-code response processor: run a model's final reply when it is nothing but one code block.

Opt-in, per agent. Explicit tool calls (:class:`~execspace.tools.execute_code.ExecuteCodeTool`)
are the production path: they carry the model's intent unambiguously, while this
processor has to guess it from prose. It therefore runs a reply only when the whole
trimmed reply is exactly one fenced block in an executable language::

    processor = FencedCodeProcessor(executor)              # enabled=False switches it off
    outcome = await processor.process(reply, execution_id="app/user/session")
    if outcome is not None:                                # None: the reply is not code to run
        emit(outcome.code_event); emit(outcome.result_event)

The exact trigger rules are in :meth:`FencedCodeProcessor.match` and
``docs/tools/response_processor.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import ExecspaceError, InvalidSpec
from ..executor import CodeBlockDelimiter, CodeExecutor
from ..languages import LANGUAGES, NON_EXECUTABLE, Language
from ..models import CodeBlock, CodeExecutionInput, CodeExecutionResult
from .execute_code import DEFAULT_OUTPUT_BUDGET, render_result, resolve_languages

__all__ = ["DEFAULT_PROCESSOR_LANGUAGES", "FencedCodeProcessor", "ProcessorEvent", "ProcessorResult"]

#: Languages the processor runs when none are given: every language with a runtime in execspace.
DEFAULT_PROCESSOR_LANGUAGES = tuple(lang.name for lang in LANGUAGES)

EventKind = Literal["code_execution_code", "code_execution_result"]


@dataclass(frozen=True, slots=True)
class ProcessorEvent:
    """One message to add to the conversation."""

    kind: EventKind
    content: str


@dataclass(frozen=True, slots=True)
class ProcessorResult:
    """What :meth:`FencedCodeProcessor.process` did with a reply that was code."""

    code_event: ProcessorEvent
    """``code_execution_code``: the reply as the model wrote it."""
    result_event: ProcessorEvent
    """``code_execution_result``: the output (cut to the budget) and the files, or why it failed."""
    block: CodeBlock
    """The block that ran, with the canonical language name."""
    result: CodeExecutionResult | None
    """``None`` when execution could not happen (``error`` says why)."""
    error: str | None = None
    truncated: bool = False
    """The output in ``result_event`` was cut to the budget."""

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok


class FencedCodeProcessor:
    """Runs a final reply that is exactly one fenced code block in an allowed language.

    Args:
        executor: runs the block (its engine, timeout and limits apply).
        enabled: ``False`` makes :meth:`process` return ``None`` for every reply; the
            attribute can be changed later.
        languages: names or aliases to run (default: python, bash, javascript,
            typescript). Data languages (``json``, ``yaml``, ``markdown``…) are refused.
        delimiter: the fences (default three backticks).
        output_budget: bytes of output kept in the result event (head + tail, plus a marker).
    """

    def __init__(
        self,
        executor: CodeExecutor,
        *,
        enabled: bool = True,
        languages: Sequence[str] | None = None,
        delimiter: CodeBlockDelimiter | None = None,
        output_budget: int = DEFAULT_OUTPUT_BUDGET,
    ) -> None:
        if output_budget <= 0:
            raise InvalidSpec(f"output_budget must be positive, got {output_budget!r}")
        self.executor = executor
        self.enabled = enabled
        self.languages = resolve_languages(languages, DEFAULT_PROCESSOR_LANGUAGES)
        self.delimiter = delimiter or CodeBlockDelimiter()
        self.output_budget = output_budget

    def match(self, reply: str) -> CodeBlock | None:
        """The block to run, or ``None`` when ``reply`` is not exactly one runnable block.

        With ``t = reply.strip()`` (Python whitespace), ``reply`` matches only when all hold:

        1. ``t`` starts with the opening fence and ends with the closing fence;
        2. the opening fence is followed by the info string, then a newline (``\\n`` or ``\\r\\n``);
        3. the info string, trimmed, is one word naming an allowed language (an alias, any case),
           never a data language (:data:`~execspace.languages.NON_EXECUTABLE`) or empty;
        4. the closing fence starts a line: the code ends with a newline;
        5. the code holds neither fence (so: no second block, no nested fence, no prose after a block);
        6. the code is not blank.

        Whether the processor is enabled plays no part here.
        """
        t = reply.strip()
        start, end = self.delimiter.start, self.delimiter.end
        if len(t) < len(start) + len(end) or not (t.startswith(start) and t.endswith(end)):
            return None
        inner = t[len(start) : len(t) - len(end)]
        info, newline, code = inner.partition("\n")
        if not newline or not code.endswith("\n") or start in code or end in code or not code.strip():
            return None
        lang = self._language(info.strip())
        return None if lang is None else CodeBlock(lang.name, code)

    def _language(self, tag: str) -> Language | None:
        key = tag.lower()
        if len(tag.split()) != 1 or key in NON_EXECUTABLE:
            return None
        return next((lang for lang in self.languages if key in lang.aliases), None)

    async def process(self, reply: str, *, execution_id: str | None = None) -> ProcessorResult | None:
        """Run ``reply`` if it matches (see :meth:`match`) and the processor is enabled.

        Returns ``None`` when nothing ran. Otherwise the code event and the result event;
        when the executor fails (no runtime set-up, backend error) the result event says
        ``Code execution failed: …`` and ``result`` is ``None``. Whether to keep the
        original reply in the conversation is the caller's choice.
        """
        if not self.enabled:
            return None
        block = self.match(reply)
        if block is None:
            return None
        code_event = ProcessorEvent("code_execution_code", reply)
        try:
            result = await self.executor.execute_code(CodeExecutionInput([block], execution_id=execution_id))
        except ExecspaceError as exc:
            failed = ProcessorEvent("code_execution_result", f"Code execution failed: {exc}")
            return ProcessorResult(code_event, failed, block, None, error=str(exc))
        text, truncated, _ = render_result(result, self.output_budget)
        return ProcessorResult(
            code_event, ProcessorEvent("code_execution_result", text), block, result, truncated=truncated
        )
