"""Paths as the program sees them: the file API and ``cwd`` take the absolute paths programs print.

A program in a sandbox sees its workspace at ``/workspace`` (on local, at its host directory; on an E2B sandbox,
where the server put it): ``ws.path``. Agents and the protocols they speak (E2B, the OpenAI Agents SDK's sandboxes,
inspect_ai) name files by those absolute paths, so an absolute path under ``ws.path`` means the same file as its
workspace-relative remainder, with the same confinement after the mapping. Any other absolute path is refused with
the root it should lie under: the host-side file API never reaches outside the workspace.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PathDenied
from ..models import Workspace
from .confinecore import split_relpath

__all__ = ["checked_relative", "workspace_relative", "workspace_relatives"]


def workspace_relative(ws: Workspace, path: str) -> str:
    """``path`` relative to the workspace: a relative path as given (it is checked where it is used), an absolute
    one under ``ws.path`` without that prefix (``"."`` for the root itself).

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
    raise PathDenied(
        path,
        f"an absolute path must lie in the workspace as the program sees it ({root or '/'}/...); "
        "give that, or a path relative to the workspace",
    )


def workspace_relatives(ws: Workspace, paths: Sequence[str]) -> list[str]:
    """:func:`workspace_relative` of each (glob patterns included: ``/workspace/out/**`` is ``out/**``)."""
    return [workspace_relative(ws, p) for p in paths]


def checked_relative(ws: Workspace, path: str) -> str:
    """:func:`workspace_relative`, normalised and refused when it escapes (``..``, NUL, the root itself)."""
    return "/".join(split_relpath(workspace_relative(ws, path)))
