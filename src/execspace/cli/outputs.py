"""Outputs brought to the host: copied into a directory (``--out DIR``, or by default ``./execspace-out/<run>/``
when the workspace goes), or inlined in ``--json``. Names come from the program: each file is written through a
confined root (no component is followed through a link, nothing lands outside the directory). The files are
written by this process: they belong to whoever ran the command, never to a sandbox's uid."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from ..engine import BaseEngine
from ..errors import PathDenied
from ..models import File, RunResult, Workspace
from ..workspace import ConfinedRoot

__all__ = [
    "AUDIT_FILE",
    "DEFAULT_OUT",
    "INLINE_BYTES",
    "Brought",
    "InlineContent",
    "bring_outputs",
    "inline",
    "new_run_name",
    "save_files",
    "save_outputs",
]

#: Bytes of one file inlined in ``--json`` (base64); the rest is cut and marked ``content_truncated``.
INLINE_BYTES = 1024 * 1024
#: Where a removed workspace's outputs go by default, one directory per run, under the current directory.
DEFAULT_OUT = "execspace-out"
#: The network audit of a run, in its run directory (and as copied beside the outputs).
AUDIT_FILE = "network.jsonl"


@dataclass(slots=True)
class Brought:
    """What was brought to the host before the workspace went: files copied (``saved``, by workspace name, into
    ``out_dir``), the network audit copied (``audit``), or the files read to inline in --json (``files``)."""

    saved: dict[str, Path] = field(default_factory=dict)
    out_dir: Path | None = None
    files: dict[str, File] | None = None
    audit: Path | None = None
    clashes: list[str] = field(default_factory=list)
    """Files not copied because a file of that name was already there (two globs giving the same name)."""


async def bring_outputs(
    engine: BaseEngine,
    ws: Workspace,
    globs: list[str],
    result: RunResult,
    *,
    out: Path | None,
    kept: bool,
    no_out: bool,
    json: bool,
) -> Brought:
    """Copy the collected files to ``out`` (replacing files of the same name: the caller named the directory), or,
    when the workspace is removed and neither ``out`` nor ``no_out`` is given, to a new ``./execspace-out/<run>/``
    (never over a file); with the run's network audit beside them when the workspace goes. Files copied nowhere
    out of a removed workspace are read for inlining when ``json``."""
    if out is None and (kept or no_out):
        return Brought(files=await _by_name(engine, ws, globs) if json and not kept else None)
    files = await engine.fs.collect(ws, globs)
    audit = None if kept else await _audit(engine, ws, result)
    if out is None and not files and audit is None:
        return Brought()  # nothing to keep: no directory is made
    return await asyncio.to_thread(save_outputs, files, audit, out, _run_name(result))


async def _by_name(engine: BaseEngine, ws: Workspace, globs: list[str]) -> dict[str, File]:
    return {f.name: f for f in await engine.fs.collect(ws, globs)}


async def _audit(engine: BaseEngine, ws: Workspace, result: RunResult) -> bytes | None:
    """The run's ``network.jsonl`` (None when it made no network attempt, or the run has no directory)."""
    if not result.network_audit or not result.run_dir:
        return None
    with contextlib.suppress(FileNotFoundError, PathDenied):  # none written, or not one we can read
        return (await engine.fs.read_file(ws, f"{result.run_dir}/{AUDIT_FILE}")).content
    return None


def _run_name(result: RunResult) -> str:
    return result.run_dir.rsplit("/", 1)[-1] or new_run_name()


def new_run_name() -> str:
    """A name for the copies of something that has no run directory of its own (``exec-code``'s blocks)."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


def _fresh_dir(parent: Path, name: str) -> Path:
    """A new directory ``parent/name`` (``name-<hex>`` when that is taken): a run's copies never mix with
    another's."""
    parent.mkdir(parents=True, exist_ok=True)
    for candidate in (name, f"{name}-{secrets.token_hex(3)}", f"{name}-{secrets.token_hex(8)}"):
        with contextlib.suppress(FileExistsError):
            (parent / candidate).mkdir()
            return parent / candidate
    raise FileExistsError(f"{parent / name}: taken, and so were two fresh names; remove old runs from {parent}")


def save_outputs(files: Sequence[File], audit: bytes | None, out: Path | None, run: str) -> Brought:
    """Into ``out`` (replacing files of the same name), or a new ``./execspace-out/<run>/`` (never over a file)."""
    dest = out if out is not None else _fresh_dir(Path(DEFAULT_OUT).absolute(), run)
    brought = Brought(out_dir=dest)
    brought.saved = save_files(files, dest, replace=out is not None, clashes=brought.clashes)
    if audit is not None:
        brought.audit = _save_audit(audit, dest)
    return brought


def _dest_name(name: str) -> str:
    # out/ is what the program wrote its results into: out/plot.png lands as DIR/plot.png
    return name.removeprefix("out/") if name.startswith("out/") else name


def save_files(
    files: Sequence[File], dest: Path, *, replace: bool = True, clashes: list[str] | None = None
) -> dict[str, Path]:
    """Write each readable file under ``dest`` (created, parents too), replacing a file of the same name, or
    without ``replace`` never writing over anything (a file whose name is taken is left out, its workspace name
    added to ``clashes``); return where each went, by workspace name."""
    dest.mkdir(parents=True, exist_ok=True)
    saved: dict[str, Path] = {}
    with ConfinedRoot(str(dest)) as root:
        for f in files:
            if f.skipped is None:
                name = _dest_name(f.name)
                try:
                    root.write_file(name, f.content, replace=replace)
                except FileExistsError:
                    if clashes is None:
                        raise
                    clashes.append(f.name)
                    continue
                saved[f.name] = dest / name
    return saved


def _save_audit(audit: bytes, dest: Path) -> Path:
    """The audit beside the outputs, under the first of ``network.jsonl``, ``network-2.jsonl``... that is free
    (the program may have written a file of that name)."""
    stem, _, ext = AUDIT_FILE.rpartition(".")
    with ConfinedRoot(str(dest)) as root:
        for name in (AUDIT_FILE, *(f"{stem}-{n}.{ext}" for n in range(2, 100))):
            with contextlib.suppress(FileExistsError):
                root.write_file(name, audit, 0o600, replace=False)
                return dest / name
    raise FileExistsError(f"{dest}: no free name for the network audit")


class InlineContent(TypedDict):
    """A file's content in ``--json``."""

    content_base64: str
    content_truncated: bool


def inline(f: File) -> InlineContent:
    """The file's content for ``--json``: base64 of at most :data:`INLINE_BYTES`."""
    data = f.content[:INLINE_BYTES]
    return {
        "content_base64": base64.b64encode(data).decode("ascii"),
        "content_truncated": f.truncated or len(data) < f.size_bytes,
    }
