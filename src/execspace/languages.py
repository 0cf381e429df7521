"""Code-block languages: aliases, file names and the runtimes that can run them."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import UnsupportedLanguage

__all__ = ["LANGUAGES", "Language", "available_languages", "resolve_language"]


@dataclass(frozen=True, slots=True)
class Language:
    name: str
    aliases: tuple[str, ...]
    extension: str
    runtimes: tuple[tuple[str, ...], ...]
    """Command prefixes to try in order; the first whose program exists is used."""
    file_mode: int = 0o644


LANGUAGES: tuple[Language, ...] = (
    Language("python", ("python", "py", "python3"), ".py", (("python3",), ("python",))),
    Language("bash", ("bash", "sh", "shell"), ".sh", (("bash",), ("sh",)), 0o755),
    Language("javascript", ("javascript", "js", "node", "nodejs"), ".js", (("node",),)),
    Language(
        "typescript",
        ("typescript", "ts"),
        ".ts",
        (("deno", "run", "--quiet", "--no-prompt"), ("tsx",), ("bun", "run")),
    ),
)

#: Languages that are data or prose, never run (the response processor refuses them by name).
NON_EXECUTABLE = frozenset(
    {
        "",
        "json",
        "yaml",
        "yml",
        "toml",
        "xml",
        "markdown",
        "md",
        "html",
        "css",
        "text",
        "txt",
        "plain",
        "csv",
        "diff",
        "ini",
        "output",
        "console",
    }
)


def resolve_language(tag: str) -> Language:
    """Map a fence tag (``py``, ``Python3``, ``js``…) to a :class:`Language`."""
    key = tag.strip().lower()
    for lang in LANGUAGES:
        if key in lang.aliases:
            return lang
    known = ", ".join(a for lang in LANGUAGES for a in lang.aliases)
    raise UnsupportedLanguage(f"language {tag!r} is not supported; use one of: {known}")


def pick_runtime(lang: Language, path: str | None) -> tuple[str, ...] | None:
    """The first runtime of ``lang`` found on ``path`` (None: none installed)."""
    for runtime in lang.runtimes:
        if shutil.which(runtime[0], path=path):
            return runtime
    return None


def available_languages(path: str | None, languages: Sequence[Language] = LANGUAGES) -> tuple[str, ...]:
    return tuple(lang.name for lang in languages if pick_runtime(lang, path) is not None)
