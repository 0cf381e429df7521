"""MIME types by content first, then by extension, then by a text check."""

from __future__ import annotations

import mimetypes

import filetype

__all__ = ["SNIFF_BYTES", "guess_mime", "is_text_mime"]

#: How many leading bytes the content check needs.
SNIFF_BYTES = 8192

# Types that mimetypes does not know everywhere but agents produce all the time.
_EXTRA = {
    ".md": "text/markdown",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".ipynb": "application/x-ipynb+json",
    ".svg": "image/svg+xml",
    ".tex": "application/x-tex",
    ".py": "text/x-python",
    ".ts": "text/x-typescript",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".toml": "application/toml",
    ".log": "text/plain",
}


def guess_mime(name: str, head: bytes) -> str:
    """Best MIME type for a file called ``name`` whose first bytes are ``head``."""
    kind = filetype.guess(head) if head else None
    if kind is not None:
        return str(kind.mime)
    dot = name.rfind(".")
    ext = name[dot:].lower() if dot > name.rfind("/") else ""
    if ext in _EXTRA:
        return _EXTRA[ext]
    by_ext, _ = mimetypes.guess_type(name, strict=False)
    if by_ext:
        return by_ext
    return "text/plain" if _looks_like_text(head) else "application/octet-stream"


def _looks_like_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # a multi-byte character cut at the sniff boundary is still text
        return exc.start >= len(head) - 3
    return True


def is_text_mime(mime: str) -> bool:
    """True for ``text/*``, JSON and ``+json``/``+xml`` types (parameters ignored)."""
    base = mime.split(";", 1)[0].strip().lower()
    return (
        base.startswith("text/")
        or base in ("application/json", "application/xml", "application/yaml", "application/toml", "image/svg+xml")
        or base.endswith(("+json", "+xml"))
    )
