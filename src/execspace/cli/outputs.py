"""Outputs the user asked for, brought to the host: copied into a directory of theirs (``--out``), or inlined in
``--json``. Names come from the program: each file is written through a confined root (no component is followed
through a link, nothing lands outside the directory)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from ..models import File
from ..workspace import ConfinedRoot

__all__ = ["INLINE_BYTES", "InlineContent", "default_out_dir", "inline", "save_files"]

#: Bytes of one file inlined in ``--json`` (base64); the rest is cut and marked ``content_truncated``.
INLINE_BYTES = 1024 * 1024


def default_out_dir(run_dir: str) -> Path:
    """``./execspace-out/<run>``: where the files of a removed workspace go when ``--collect`` named them."""
    return Path("execspace-out", run_dir.rsplit("/", 1)[-1] or "run").absolute()


def _dest_name(name: str) -> str:
    # out/ is what the program wrote its results into: out/plot.png lands as DIR/plot.png
    return name.removeprefix("out/") if name.startswith("out/") else name


def save_files(files: Sequence[File], dest: Path) -> dict[str, Path]:
    """Write each readable file under ``dest`` (created, parents too), replacing a file of the same name; return
    where each went, by workspace name."""
    dest.mkdir(parents=True, exist_ok=True)
    saved: dict[str, Path] = {}
    with ConfinedRoot(str(dest)) as root:
        for f in files:
            if f.skipped is None:
                name = _dest_name(f.name)
                root.write_file(name, f.content)
                saved[f.name] = dest / name
    return saved


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
