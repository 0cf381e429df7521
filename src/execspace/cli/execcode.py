"""``execspace exec-code``: run a file of code, or the fenced blocks of a Markdown text."""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ..engine import open_engine_from
from ..errors import UsageError
from ..executor import CodeExecutor, extract_code_blocks
from ..languages import LANGUAGES
from ..models import DEFAULT_TIMEOUT, CodeBlock, CodeExecutionResult, File
from .console import human_size, print_json, printable, progress, warn_if_unisolated
from .outputs import Brought, InlineContent, inline, new_run_name, save_outputs
from .roots import in_cli_root
from .run import (
    KERNELS_REFUSAL,
    EngineRequest,
    InputArg,
    add_environment_option,
    add_image_option,
    add_input_option,
    add_workspace_options,
    host_path,
    open_workspace,
    parse_input,
    parse_timeout,
    with_environment,
    with_image,
    with_input_roots,
)

__all__ = ["add_parser", "code_blocks", "command"]

EXIT_BLOCK_FAILED = 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "exec-code",
        help="run code blocks (a Markdown text) or a code file in a fresh workspace",
        description=(
            "Run the fenced code blocks of FILE in order; a file without fences (or named like code: "
            ".py, .sh, .js, .ts) is one block. Exit status: 0 when every block succeeded, 1 otherwise, "
            "125 when execspace itself failed."
        ),
    )
    p.add_argument("--backend", help="backend to use (default: the safest that works here, never 'local')")
    add_image_option(p)
    add_environment_option(p)
    p.add_argument(
        "--kernels",
        choices=("sandbox", "host"),
        help="jupyter: where kernels run (default sandbox, which fails where the sandbox cannot run them; "
        "host: on this host as you, NO isolation, trusted code only); implies --backend jupyter",
    )
    p.add_argument("--language", "-l", help="language of an unfenced file (default: from its extension, else python)")
    p.add_argument(
        "--timeout",
        type=parse_timeout,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds per block; 'none' for no limit (default {DEFAULT_TIMEOUT:g})",
    )
    add_workspace_options(p)
    add_input_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--out",
        type=host_path,
        metavar="DIR",
        help="copy the output files into DIR (out/x lands as DIR/x); default: when the workspace is removed, into "
        "a new ./execspace-out/<run>/",
    )
    p.add_argument("--no-out", action="store_true", help="do not copy the output files of a removed workspace")
    p.add_argument("file", metavar="FILE|-", help="file to run, or - for stdin")
    p.set_defaults(handler=command)


def with_kernels(request: EngineRequest, kernels: str | None) -> EngineRequest:
    """``--kernels``: the jupyter backend's mode, named by the user (host kernels are never a fallback)."""
    if kernels is None:
        return request
    from ..backends.jupyter import HostKernels, SandboxedKernels

    mode = HostKernels() if kernels == "host" else SandboxedKernels()
    return request.implying("jupyter", KERNELS_REFUSAL, mode=mode)


def engine_request(args: argparse.Namespace, inputs: list[InputArg]) -> EngineRequest:
    """The engine ``execspace exec-code``'s flags ask for."""
    request = with_image(with_environment(EngineRequest(args.backend), args, args.kernels), args)
    if args.environment is None:  # with one, the kernels are sandboxed kernels of it
        request = with_kernels(request, args.kernels)
    return with_input_roots(request, inputs)


def _language_of(suffix: str) -> str | None:
    return next((lang.name for lang in LANGUAGES if suffix and lang.extension == suffix.lower()), None)


def read_source(name: str) -> tuple[str, str]:
    """The text to run and the file's extension ('' for stdin)."""
    if name == "-":
        return sys.stdin.read(), ""
    path = Path(name)
    try:
        return path.read_text(encoding="utf-8"), path.suffix
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {name}: {exc}; pass a readable UTF-8 file, or - for stdin") from exc


def code_blocks(text: str, suffix: str, language: str | None) -> list[CodeBlock]:
    """Fenced blocks of ``text``; else all of it as one block.

    A file named like code is never searched for fences: a ``` inside a Python
    string must not turn the program into a fragment of itself.
    """
    by_extension = _language_of(suffix)
    if by_extension is None:
        fenced = extract_code_blocks(text)
        if fenced:
            return fenced
    return [CodeBlock(language or by_extension or "python", text)]


async def command(args: argparse.Namespace) -> int:
    text, suffix = read_source(args.file)
    blocks = code_blocks(text, suffix, args.language)
    inputs = [parse_input(v) for v in args.input]
    request = engine_request(args, inputs)
    if request.backend is None and sys.stderr.isatty():
        progress("looking for an isolating backend...")
    opener = functools.partial(open_engine_from, *await in_cli_root(request.backend, request.options))
    async with CodeExecutor(opener=opener, timeout=args.timeout) as ex:
        engine = ex.engine
        assert engine is not None  # entering the executor opened it
        caps = engine.describe()
        warn_if_unisolated(caps)
        ws, remove = await open_workspace(engine, args)
        try:
            await engine.fs.stage_inputs(ws, [i.spec for i in inputs])
            result = await ex.execute_in(ws, blocks)
        finally:
            if remove:
                await engine.manager.cleanup(ws)
    kept = None if remove else str(ws.host_path or ws.path)
    brought = await _bring(args, result.output_files, removed=remove)
    if args.json:
        report = as_json(result)
        for row in report["files"]:
            saved = brought.saved.get(row["name"])
            row["saved_path"] = str(saved) if saved is not None else None
        print_json({"backend": caps.backend, "isolation": str(caps.isolation), "workspace": kept, **report})
    else:
        sys.stdout.write(result.output)
        sys.stdout.flush()
        _report_files(result, brought, kept)
    return 0 if result.ok else EXIT_BLOCK_FAILED


async def _bring(args: argparse.Namespace, files: Sequence[File], *, removed: bool) -> Brought:
    """The output files copied to ``--out DIR``, or out of a removed workspace into a new
    ./execspace-out/<run>/ unless ``--no-out``."""
    if args.out is None and (not removed or args.no_out or not files):
        return Brought()
    return await asyncio.to_thread(save_outputs, files, None, args.out, new_run_name())


class FileRow(InlineContent):
    """One output file in ``--json`` (``files``)."""

    name: str
    mime: str
    size: int
    truncated: bool
    saved_path: NotRequired[str | None]


class BlockRow(TypedDict):
    """One block's run in ``--json`` (``blocks``)."""

    index: int
    language: str
    exit_code: int
    timed_out: bool
    duration_s: float
    error: str | None
    stdout: str
    stderr: str


class Report(TypedDict):
    """What ``--json`` prints of the blocks' run (with the backend, isolation and workspace)."""

    ok: bool
    output: str
    blocks: list[BlockRow]
    files: list[FileRow]


def as_json(result: CodeExecutionResult) -> Report:
    return {
        "ok": result.ok,
        "output": result.output,
        "blocks": [
            {
                "index": b.index,
                "language": b.language,
                "exit_code": b.exit_code,
                "timed_out": b.timed_out,
                "duration_s": round(b.duration, 3),
                "error": b.error,
                "stdout": b.stdout,
                "stderr": b.stderr,
            }
            for b in result.blocks
        ],
        "files": [_file_row(f) for f in result.output_files],
    }


def _file_row(f: File) -> FileRow:
    content = inline(f)
    return {
        "name": f.name,
        "mime": f.mime_type,
        "size": f.size_bytes,
        "truncated": f.truncated,
        "content_base64": content["content_base64"],
        "content_truncated": content["content_truncated"],
    }


def _report_files(result: CodeExecutionResult, brought: Brought, kept: str | None) -> None:
    if result.output_files:
        if brought.out_dir is not None:
            where = f"copied to {printable(str(brought.out_dir))}"
        elif kept:
            where = "in the kept workspace"
        else:
            where = "the workspace was removed, --no-out: not kept; drop --no-out, or pass --out DIR or --keep"
        progress(f"{len(result.output_files)} output file(s) ({where}):")
        for f in result.output_files:
            saved = brought.saved.get(f.name)
            copy = f"  {printable(str(saved))}" if saved is not None else ""
            print(f"  {printable(f.name)}  {human_size(f.size_bytes)}  {f.mime_type}{copy}", file=sys.stderr)
        sys.stderr.flush()
    if kept:
        progress(f"workspace kept at {printable(kept)}")
