"""Paths as the program sees them: the file API and ``cwd`` take the absolute paths programs print.

A program in a sandbox sees its workspace at ``/workspace`` (on local, at its host directory; on an E2B sandbox,
where the server put it): ``ws.path``. Agents and the protocols they speak (E2B, the OpenAI Agents SDK's sandboxes,
inspect_ai) name files by those absolute paths, so an absolute path under ``ws.path`` means the same file as its
workspace-relative remainder, with the same confinement after the mapping; so is one under a directory the backend
also shows elsewhere (``ws.program_binds``: the sandbox's ``/home/user`` is ``work/``, its ``/tmp`` is ``tmp/``).
Any other absolute path is refused with the roots it should lie under, unless the backend serves the rest of its
programs' view itself (:func:`outside_workspace`; the sandbox runs its file agent as a program there): the host-side
file API never reaches outside the workspace.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from ..errors import PathDenied
from ..models import Workspace
from .confinecore import split_relpath

__all__ = ["bound_path", "checked_relative", "outside_workspace", "workspace_relative", "workspace_relatives"]


def workspace_relative(ws: Workspace, path: str) -> str:
    """``path`` relative to the workspace: a relative path as given (it is checked where it is used), an absolute
    one under ``ws.path`` without that prefix (``"."`` for the root itself), one under a program bind
    (``/home/user/a`` → ``work/a``) as the workspace path of what the bind shows.

    Raises:
        PathDenied: an absolute path outside the workspace as the program sees it.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        return path
    root = ws.path.rstrip("/")
    if path.rstrip("/") == root:
        return "."
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    bound = _bind_of(ws, path)
    if bound is not None:
        target, rest = bound
        return f"{target}/{rest}" if rest else target
    roots = ", ".join(f"{r}/..." for r in (root or "/", *(b for b, _ in ws.program_binds)))
    raise PathDenied(
        path,
        f"an absolute path must lie in the workspace as the program sees it ({roots}); "
        "give that, or a path relative to the workspace",
    )


def outside_workspace(ws: Workspace, path: str) -> bool:
    """Whether ``path`` is absolute and names nothing of the workspace as the program sees it (neither under
    ``ws.path`` nor under a program bind): a path of the program's view beyond it (a system directory, a grant)."""
    if not isinstance(path, str) or not path.startswith("/") or _bind_of(ws, path) is not None:
        return False
    p, root = posixpath.normpath(path), ws.path.rstrip("/")
    return bool(root) and not (p == root or p.startswith(root + "/"))


def bound_path(ws: Workspace, path: str) -> str:
    """``path`` normalised when it names a directory through a program bind (a run's ``cwd`` of
    ``/home/user/sub``: the program starts there, not at ``/workspace/work/sub``), else ``""``."""
    if not isinstance(path, str) or _bind_of(ws, path) is None:
        return ""
    return posixpath.normpath(path)


def _bind_of(ws: Workspace, path: str) -> tuple[str, str] | None:
    """The workspace directory of the program bind ``path`` lies under, and the rest of ``path`` below it."""
    for bound, target in ws.program_binds:
        if path.rstrip("/") == bound:
            return target, ""
        if path.startswith(bound + "/"):
            return target, path[len(bound) + 1 :]
    return None


def workspace_relatives(ws: Workspace, paths: Sequence[str]) -> list[str]:
    """:func:`workspace_relative` of each (glob patterns included: ``/workspace/out/**`` is ``out/**``)."""
    return [workspace_relative(ws, p) for p in paths]


def checked_relative(ws: Workspace, path: str) -> str:
    """:func:`workspace_relative`, normalised and refused when it escapes (``..``, NUL, the root itself)."""
    return "/".join(split_relpath(workspace_relative(ws, path)))
