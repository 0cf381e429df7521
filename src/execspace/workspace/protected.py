"""Protected paths: project files that host tools interpret as configuration or code, one list for every backend.

A program that can write ``.git/config`` gets its ``core.fsmonitor`` run by the user's next ``git status`` on the
host; ``.envrc`` runs on ``cd`` (direnv), ``.vscode/tasks.json`` on opening the folder, ``AGENTS.md`` steers the
next agent, ``.github/workflows`` run with the repository's secrets. So wherever a program may write a project
root (the workspace root, a sandbox write grant over a directory), these stay readable and are never writable,
and one that is missing is created first as an empty read-only directory that is mounted read-only, so that
the program cannot create it either (an empty directory is ignored by git and means "no such file" to the tools
that read one). The sandbox mounts enforce it, the container's mounts too, and both backends' file APIs refuse
writes there. The ``local`` backend isolates nothing and protects nothing.

Left out on purpose: build and test files the user runs deliberately (``package.json``, ``pyproject.toml``,
``conftest.py``, ``setup.py``…: project code, like every script a program may change; review the diff),
``.gitattributes`` (its filter and diff drivers run only when configured, and the config is protected), and a
bare ``hooks`` (no host tool reads a ``hooks/`` directory at a project root, and the name is too common).
"""

from __future__ import annotations

import os

from ..errors import PathDenied
from ..models import Workspace
from .confine import ConfinedRoot

__all__ = ["DEFAULT_PROTECTED", "INTERNAL_DIR", "ProtectedPaths", "make_placeholder", "protected_hit"]

#: execspace's own per-workspace directory (mask files); always protected.
INTERNAL_DIR = ".execspace"

#: Project-root-relative paths protected by default (children included).
DEFAULT_PROTECTED = (
    # git: config (core.fsmonitor, pager, aliases), hooks, submodules, and the hook managers
    ".git",
    ".gitmodules",
    ".githooks",
    ".husky",
    ".pre-commit-config.yaml",
    INTERNAL_DIR,
    # agents: instructions, settings, MCP servers
    ".agents",
    ".claude",
    ".codex",
    ".cursor",
    ".gemini",
    ".mcp.json",
    "AGENTS.md",
    "CLAUDE.md",
    "CLAUDE.local.md",
    "GEMINI.md",
    ".cursorrules",
    ".windsurfrules",
    ".clinerules",
    # editors and dev containers that run tasks or build images when the folder is opened
    ".vscode",
    ".idea",
    ".devcontainer",
    # CI (workflows run with the repository's secrets; Copilot instructions) and direnv (runs on cd)
    ".github",
    ".envrc",
    # make reads the first of these it finds
    "GNUmakefile",
    "makefile",
    "Makefile",
)


def _is_under(path: str, base: str) -> bool:
    return path == base or path.startswith(base + "/")


def protected_hit(rel: str, protected: tuple[str, ...]) -> str | None:
    """The protected path ``rel`` (project-root-relative, normalised) is or lies under, if any."""
    for p in protected:
        if _is_under(rel, p):
            return p
    return None


def make_placeholder(root: str, rel: str) -> None:
    """Create a missing protected path under ``root`` as an empty read-only directory, walking by directory fds
    (a symlink on the way refuses: ``PathDenied``), so that it can be mounted read-only: a program with a
    writable parent would otherwise create it and make it its own. Call it only for a path found missing."""
    with ConfinedRoot(root) as cr:
        fd = cr.open_dir(rel.split("/"), create=True)
        try:
            os.fchmod(fd, 0o555)
        finally:
            os.close(fd)


class ProtectedPaths:
    """The file-API check of a backend whose programs cannot write protected paths: ``(ws, path, mode)`` raises
    ``PathDenied`` for a write at or under one (workspace-relative paths; host paths are only read)."""

    def __init__(self, protected: tuple[str, ...] = DEFAULT_PROTECTED) -> None:
        self.protected = tuple(dict.fromkeys((*protected, INTERNAL_DIR)))

    def __call__(self, ws: Workspace, path: str, mode: str) -> None:
        if mode != "write" or path.startswith("/"):
            return
        rel = "/".join(c for c in path.split("/") if c not in ("", "."))
        if hit := protected_hit(rel, self.protected):
            raise PathDenied(
                path,
                f"{hit!r} is protected: host tools run it as configuration or code, so it is never written "
                "into a workspace (open the engine with protected=... to change the list)",
            )
