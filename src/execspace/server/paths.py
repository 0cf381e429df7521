"""The paths the E2B SDK speaks (``/home/user/...``) and the workspace paths the Engine speaks (``work/...``).

An E2B sandbox has one user, ``user``, whose home is ``/home/user``; relative paths and ``~`` are taken from
there, as envd does. Here that home is the workspace's ``work/`` directory, so ``/home/user/a.txt`` is the
workspace file ``work/a.txt``. Only the file API is translated: a program started in the sandbox still sees the
backend's own paths (the workspace at ``/workspace``) unless the backend shows ``work/`` at ``/home/user`` too (the
sandbox backend's ``program_binds``, as serve configures it): then a command's cwd and a kernel's directory are
named by the home's own path, so that ``pwd`` prints ``/home/user``. Paths outside the home are refused with
:class:`PathOutsideHome`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection

from ..errors import UsageError
from ..models import Workspace

__all__ = [
    "HOME",
    "HOME_DIR",
    "USER",
    "PathOutsideHome",
    "check_user",
    "program_dir",
    "sandbox_dir",
    "to_sdk",
    "to_view",
    "to_workspace",
]

USER = "user"
HOME = "/home/user"
#: The workspace directory that plays the home.
HOME_DIR = "work"


class PathOutsideHome(UsageError):
    """An SDK path that is not under ``/home/user``: execspace sandboxes expose only the home."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path!r} is outside {HOME}: execspace sandboxes expose only the user's home; "
            f"use a path under {HOME} (or a relative one)"
        )


def to_workspace(path: str) -> str:
    """The workspace-relative path of an SDK path; raise :class:`PathOutsideHome` outside the home."""
    if path in ("", "~") or path.startswith("~/"):
        path = HOME + path[1:]
    absolute = posixpath.normpath(posixpath.join(HOME, path))
    if absolute == HOME:
        return HOME_DIR
    if not absolute.startswith(HOME + "/"):
        raise PathOutsideHome(path)
    return HOME_DIR + absolute[len(HOME) :]


def to_view(path: str, whole: bool) -> str:
    """:func:`to_workspace` of an SDK path under the home; another one, where the sandbox serves its ``whole``
    view (:mod:`.wholeview`), as its absolute path (``/tmp/a``), else :class:`PathOutsideHome`."""
    try:
        return to_workspace(path)
    except PathOutsideHome:
        if not whole:
            raise
    return "/" + posixpath.normpath(posixpath.join(HOME, path)).lstrip("/")


def to_sdk(workspace_path: str) -> str:
    """The SDK path of a workspace path under the home (``work/a`` → ``/home/user/a``); an absolute one (a path of
    the sandbox's whole view, :func:`to_view`) is its own."""
    if workspace_path.startswith("/"):
        return workspace_path
    if workspace_path == HOME_DIR:
        return HOME
    return HOME + workspace_path[len(HOME_DIR) :]


def program_dir(ws: Workspace, path: str) -> str:
    """An SDK directory under the home as a run's ``cwd`` or a kernel's directory: its path under ``/home/user``
    where the program sees the home there (``program_binds``), else its workspace path (``work/...``); raise
    :class:`PathOutsideHome` outside the home."""
    rel = to_workspace(path)
    return to_sdk(rel) if (HOME, HOME_DIR) in ws.program_binds else rel


def sandbox_dir(ws: Workspace, path: str, whole: bool) -> str:
    """:func:`program_dir` of a directory under the home; another one, where the sandbox serves its ``whole`` view,
    as its absolute path (a kernel's directory: the kernel enters it itself), else :class:`PathOutsideHome`."""
    found = to_view(path, whole)
    return found if found.startswith("/") else program_dir(ws, path)


def check_user(user: str | None, users: Collection[str] = (USER,)) -> None:
    """Refuse any user but ``users``: an execspace sandbox's files are ``user``'s; a machine sandbox's commands may
    run as ``root`` too."""
    if user not in (None, "", *users):
        if len(users) > 1:
            raise UsageError(f"user {user!r} does not exist in this sandbox; its users are {sorted(users)}")
        raise UsageError(
            f"user {user!r} does not exist in execspace sandboxes here; the only user is {USER!r} (a server run as "
            "root gives commands 'root' too: machine mode)"
        )
