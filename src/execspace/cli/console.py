"""Writing to the terminal: errors with a next step, warnings, progress, sizes, JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..capabilities import Capabilities, Isolation
from ..errors import (
    ArtifactNotFound,
    CapabilityError,
    ExecspaceError,
    InputError,
    LimitExceeded,
    PathDenied,
    UnsupportedBackend,
    UnsupportedLanguage,
    UsageError,
    WorkspaceNotFound,
)
from ..workspace.layout import LAYOUT_DIRS, METADATA_FILE

__all__ = [
    "EXIT_EXECSPACE_ERROR",
    "ago",
    "error",
    "error_message",
    "human_size",
    "print_json",
    "printable",
    "progress",
    "warn",
    "warn_if_unisolated",
    "workspace_dir",
]

#: Exit status for execspace's own failures (as ``docker run`` does), distinct from the program's.
EXIT_EXECSPACE_ERROR = 125

# Errors whose message says what went wrong but not always what to type next.
_HINTS: tuple[tuple[type[ExecspaceError], str], ...] = (
    (UnsupportedBackend, "Run `execspace doctor` to see which backends work here."),
    (PathDenied, "Use a path relative to the workspace that stays inside it."),
    (
        InputError,
        "Check the --input source: a host path that exists, or artifact://name with --artifacts DIR.",
    ),
    (ArtifactNotFound, "List what exists in the --artifacts directory, or drop the @version."),
    (LimitExceeded, "Narrow the --collect globs or stage fewer/smaller inputs."),
    (WorkspaceNotFound, "Pass --workspace DIR to create one there."),
    (UnsupportedLanguage, "Pass --language with one of the supported languages."),
)


# The library's own hints speak Python (network='on'); say the same in flags.
_CAPABILITY_FLAGS = {
    "network off": "On the command line: --network on allows the network; --backend sandbox can turn it off.",
    "a timeout": "On the command line: --timeout none.",
    "a network allow-list (NetworkPolicy)": "On the command line: --allow-domain needs --backend sandbox "
    "(or container, as root); elsewhere use --network off or on.",
}


def _hint(exc: ExecspaceError) -> str:
    if isinstance(exc, CapabilityError):
        return _CAPABILITY_FLAGS.get(exc.capability, "")
    return next((hint for kind, hint in _HINTS if isinstance(exc, kind)), "")


def error_message(exc: ExecspaceError) -> str:
    """The error's own message, plus what to do next when the message lacks it."""
    msg = str(exc) or type(exc).__name__
    hint = _hint(exc)
    if not hint or hint in msg:
        return msg
    return f"{msg} {hint}" if msg.endswith(".") else f"{msg}. {hint}"


def workspace_dir(path: Path, flag: str, *, adopt: bool = False) -> Path:
    """``path`` as an absolute directory to use as a workspace: a new or empty directory, or a workspace execspace
    made; a directory of the user's own only when ``adopt`` (it gets the layout, and as root a sandbox owner)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a directory; pass a new or existing directory")
    if not adopt and path.is_dir() and not (path / METADATA_FILE).exists() and any(path.iterdir()):
        layout = ", ".join(f"{d}/" for d in LAYOUT_DIRS if "/" not in d)
        raise UsageError(
            f"{flag} {path}: not an execspace workspace, and not empty: using it would add {layout} and "
            f"{METADATA_FILE} to it, run the program in its work/, and as root hand the directory to a sandbox "
            "uid. Nothing was changed. Copy it in instead (--input DIR:work/src), name a new or empty directory, "
            "or pass --adopt to make it a workspace anyway"
        )
    return path.absolute()


# C0 and C1 controls, DEL, and the stand-ins of undecodable bytes (surrogateescape would write them back raw)
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)
}


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``): names a program chose (its files) may hold
    terminal escape sequences, which must reach the user's terminal as text, never as commands."""
    return text.translate(_CONTROLS)


def _lines(message: str) -> str:
    return "\n".join(printable(line) for line in message.split("\n"))


def error(message: str) -> None:
    print(f"execspace: error: {_lines(message)}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"warning: {_lines(message)}", file=sys.stderr, flush=True)


def progress(message: str) -> None:
    print(f"execspace: {_lines(message)}", file=sys.stderr, flush=True)


def warn_if_unisolated(caps: Capabilities) -> None:
    if caps.isolation is Isolation.NONE:
        warn(f"backend {caps.backend!r} runs WITHOUT isolation: the program acts as you on this host")


def ago(seconds: float) -> str:
    """A duration the way a person reads an age: ``45s``, ``12m``, ``3h``, ``9d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
