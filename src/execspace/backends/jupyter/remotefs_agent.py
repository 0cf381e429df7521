"""The file operations remote mode runs inside a kernel on a server that does not share our filesystem.

This file is not imported by execspace: its *text* is sent to the kernel (see :mod:`.serverworkspaces`), so it uses
only the standard library (and IPython, which every ipykernel has). Each call runs it in fresh globals with
``_ARGS`` set to a JSON string (a ``repr()`` literal, never code built from data); it publishes one result
as a display message of type :data:`MIME`, ``{"ok": value}`` or ``{"error": [kind, path, why]}``.

The rules are those of :mod:`execspace.workspace.confinecore`, whose text runs first in the same globals
(see :mod:`.remotefs`): paths are relative with no ``..``; every component is opened from a directory fd with
``O_NOFOLLOW``; reads take only regular files with one hard link, opened non-blocking; writes go to a fresh
temp file renamed into place; removal works by directory fds. This file maps their refusals to error kinds.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import re
import shutil
import stat
from typing import Any

with contextlib.suppress(ImportError):  # shipped as text: the core's text ran first, in these globals
    from ...workspace.confinecore import (
        DIR_FLAGS,
        PathDenied,
        open_regular,
        refuse_dir,
        remove_tree,
        rename_path,
        scan_tree,
        split_relpath,
        step_dir,
        write_temp,
    )

MIME = "application/vnd.execspace.remotefs+json"
_CELL_FILE = re.compile(r"^cell-(\d+)-")


class Refused(Exception):
    """A path rule said no: becomes execspace's ``PathDenied`` (or the error ``kind`` names) on our side."""

    def __init__(self, kind: str, path: str, why: str) -> None:
        super().__init__(why)
        self.kind, self.path, self.why = kind, path, why


def open_root(ws: str) -> int:
    try:
        return os.open(ws, DIR_FLAGS)
    except FileNotFoundError:
        raise Refused("FileNotFoundError", ws, "the workspace does not exist on the server") from None
    except OSError as exc:
        raise Refused("PathDenied", ws, f"workspace root cannot be opened safely ({exc.strerror})") from None


def open_dir(ws: str, parts: list[str], display: str, create: bool = False) -> int:
    fd = open_root(ws)
    try:
        for name in parts:
            try:
                fd = step_dir(fd, name, create, display)
            except FileNotFoundError:
                raise Refused("FileNotFoundError", display, "no such file or directory") from None
        return fd
    except BaseException:
        os.close(fd)
        raise


def op_root(args: dict[str, Any]) -> str:
    """Create the workspace root (private to the server's user) and say where it is."""
    root = os.path.abspath(os.path.expanduser(str(args["root"])))
    os.makedirs(root, mode=0o700, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise Refused("PathDenied", root, "the workspace root is a symlink, not a directory, or not ours")
    return root


def op_layout(args: dict[str, Any]) -> str:
    """Create a workspace (0700) with the layout directories and its first record, unless it exists."""
    ws = str(args["ws"])
    with contextlib.suppress(FileExistsError):
        os.mkdir(ws, 0o700)
    for d in args["dirs"]:
        os.close(open_dir(ws, split_relpath(d), d, create=True))
    fd = open_root(ws)
    try:
        tmp = write_new(fd, args["record"], base64.b64decode(args["data"]), 0o600)
        try:
            os.link(tmp, args["record"], src_dir_fd=fd, dst_dir_fd=fd)  # fails if a record exists: keep it
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp, dir_fd=fd)
    finally:
        os.close(fd)
    return ws


def op_exists(args: dict[str, Any]) -> bool:
    fd = open_root(args["ws"])
    try:
        os.stat(args["record"], dir_fd=fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def op_remove(args: dict[str, Any]) -> None:
    if os.path.lexists(args["ws"]):
        shutil.rmtree(args["ws"], onerror=_writable_retry)
    return None


def _writable_retry(func: Any, path: str, exc: object) -> None:
    # read-only staged trees: give the owner write access back, then retry once
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o700)
        func(path)


def write_new(dfd: int, name: str, data: bytes, mode: int) -> str:
    return write_temp(dfd, name, data, mode)


def op_write(args: dict[str, Any]) -> list[str | None]:
    """Write pieces of files: a piece with no ``tmp`` starts a temp file, ``final`` renames it into place."""
    tmps = []
    for item in args["items"]:
        parts = split_relpath(item["path"])
        dfd = open_dir(args["ws"], parts[:-1], item["path"], create=True)
        try:
            tmps.append(write_piece(dfd, parts[-1], item))
        finally:
            os.close(dfd)
    return tmps


def write_piece(dfd: int, name: str, item: dict[str, Any]) -> str | None:
    data = base64.b64decode(item["b64"])
    tmp: str | None = item["tmp"]
    if tmp is None:
        refuse_dir(dfd, name, item["path"])
        tmp = write_new(dfd, name, data, item["mode"])
    else:
        if not re.fullmatch(r"\.[^/]{1,40}\.[0-9a-f]{12}\.tmp", tmp):
            raise Refused("PathDenied", item["path"], "not one of our temp files")
        fd = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        with os.fdopen(fd, "ab") as f:
            f.write(data)
    if item["final"]:
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return None
    return tmp


def op_read(args: dict[str, Any]) -> dict[str, Any]:
    """Up to ``n`` bytes at ``offset`` of a regular, singly linked file; with its size and identity."""
    path = args["path"]
    parts = split_relpath(path)
    dfd = open_dir(args["ws"], parts[:-1], path)
    try:
        fd, st = open_regular(dfd, parts[-1], path)
    except FileNotFoundError:
        raise Refused("FileNotFoundError", path, "no such file") from None
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise Refused("IsADirectoryError", path, "is a directory") from None
        raise
    finally:
        os.close(dfd)
    try:
        data = os.pread(fd, args["n"], args["offset"])
    finally:
        os.close(fd)
    return {"b64": base64.b64encode(data).decode(), "size": st.st_size, "id": [st.st_dev, st.st_ino]}


def op_walk(args: dict[str, Any]) -> list[list[Any]]:
    """Every entry below each start, sorted, without following symlinks: [path, size, nlinks, kind, mtime]."""
    budget = args["max_entries"]
    found: list[list[Any]] = []
    for start in args["starts"]:
        try:
            fd = open_dir(args["ws"], start, "/".join(start)) if start else open_root(args["ws"])
        except (Refused, PathDenied):
            continue
        dirs = {"/".join(start)}
        for rel, st, unreadable in scan_tree(fd, "/".join(start)):
            if unreadable and rel in dirs:
                continue  # a directory listed already, whose entries we may not see
            budget -= 1
            if budget < 0:
                return found
            if stat.S_ISDIR(st.st_mode):
                dirs.add(rel)
            found.append(entry(rel, st))
    return found


def entry(rel: str, st: os.stat_result) -> list[Any]:
    """[path, size, nlinks, kind, mtime] of an lstat result (the kinds of execspace's FileKind)."""
    if stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "other"
    size = st.st_size if kind in ("file", "symlink") else 0
    return [rel, size, st.st_nlink, kind, st.st_mtime]


def op_stat(args: dict[str, Any]) -> list[Any]:
    path = args["path"]
    parts = split_relpath(path)
    dfd = open_dir(args["ws"], parts[:-1], path)
    try:
        return entry("/".join(parts), os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False))
    except FileNotFoundError:
        raise Refused("FileNotFoundError", path, "no such file or directory") from None
    finally:
        os.close(dfd)


def op_make_dir(args: dict[str, Any]) -> None:
    path = args["path"]
    os.close(open_dir(args["ws"], split_relpath(path), path, create=True))


def op_rename(args: dict[str, Any]) -> None:
    ws, src = args["ws"], args["src"]
    try:
        rename_path(lambda parts, create, display: open_dir(ws, parts, display, create), src, args["dst"])
    except FileNotFoundError:
        raise Refused("FileNotFoundError", src, "no such file or directory") from None


def op_remove_path(args: dict[str, Any]) -> None:
    """Remove a file, link or tree inside the workspace by directory fds (a link is removed, never followed)."""
    path = args["path"]
    parts = split_relpath(path)
    dfd = open_dir(args["ws"], parts[:-1], path)
    try:
        try:
            os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise Refused("FileNotFoundError", path, "no such file or directory") from None
        remove_tree(dfd, parts[-1], path)
    finally:
        os.close(dfd)


def op_next_cell(args: dict[str, Any]) -> int:
    """One past the highest ``cell-N-*`` in ``out/``, so a new kernel never overwrites older outputs."""
    try:
        fd = open_dir(args["ws"], ["out"], "out")
    except (Refused, PathDenied):
        return 1
    try:
        numbers = [int(m.group(1)) for name in os.listdir(fd) if (m := _CELL_FILE.match(name))]
    finally:
        os.close(fd)
    return max(numbers, default=0) + 1


OPS: dict[str, Any] = {
    "root": op_root,
    "layout": op_layout,
    "exists": op_exists,
    "remove": op_remove,
    "write": op_write,
    "read": op_read,
    "walk": op_walk,
    "stat": op_stat,
    "make_dir": op_make_dir,
    "rename": op_rename,
    "remove_path": op_remove_path,
    "next_cell": op_next_cell,
}


def main(request: dict[str, Any]) -> None:
    try:
        result = {"ok": OPS[request["op"]](request["args"])}
    except Refused as exc:
        result = {"error": [exc.kind, exc.path, exc.why]}
    except IsADirectoryError as exc:  # before PathDenied: PathIsDirectory is both
        result = {"error": ["IsADirectoryError", str(exc.filename or ""), "is a directory"]}
    except PathDenied as exc:  # before OSError: it is a PermissionError
        result = {"error": ["PathDenied", exc.path, exc.reason]}
    except OSError as exc:
        result = {"error": ["OSError", str(exc.filename or ""), f"{type(exc).__name__}: {exc.strerror or exc}"]}
    from IPython.display import publish_display_data

    publish_display_data({MIME: result})  # type: ignore[no-untyped-call]


if __name__ == "__execspace_remotefs__":
    main(json.loads(_ARGS))  # type: ignore[name-defined]  # noqa: F821 - set by the caller
