"""The one base of the MCP tools' paths: ``work/``, the directory commands run in, so that a path a model sees with
``ls`` in ``workspace_exec`` is the path ``write_file`` and ``read_file`` take (``inputs/data.csv``), and results are
``../out/...``. An absolute path as the program sees it (``/workspace/out/plot.png``) means the same file. The tools
underneath take workspace-relative paths: arguments are mapped in here, and the paths a result names are mapped
back out for the model (:func:`shown`)."""

from __future__ import annotations

import posixpath

from ..errors import PathDenied
from ..models import Workspace
from ..workspace.programpaths import workspace_relative

__all__ = ["BASE", "BASE_RULE", "in_workspace", "shown"]

BASE = "work"
#: What every path argument is relative to, as a model reads it in the tools' descriptions and in a refusal.
BASE_RULE = (
    "paths are relative to work/, the directory commands run in (what ls shows there: inputs/ holds the inputs); "
    "results are in ../out/; an absolute path must be the program's (/workspace/...)"
)


def in_workspace(ws: Workspace, path: str) -> str:
    """``path`` (relative to ``work/``, or absolute as the program sees it) as a workspace-relative path or glob.

    Raises:
        PathDenied: it leaves the workspace.
    """
    if path.startswith("/"):
        return workspace_relative(ws, path)
    joined = posixpath.normpath(posixpath.join(BASE, path))
    if joined == ".." or joined.startswith("../"):
        raise PathDenied(path, f"it leaves the workspace: {BASE_RULE}")
    return joined


def shown(rel: str) -> str:
    """A workspace-relative path as the tools name it to the model (``out/p.png`` → ``../out/p.png``)."""
    return posixpath.relpath(rel, BASE) if rel not in ("", ".") else ".."
