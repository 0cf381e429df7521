"""The file operations remote mode runs inside a kernel on a server that does not share our filesystem.

This file is not imported by execspace: its *text* is sent to the kernel (see :mod:`.serverworkspaces`), so it uses
only the standard library (and IPython, which every ipykernel has). Each call runs it in fresh globals with
``_ARGS`` set to a JSON string (a ``repr()`` literal, never code built from data); it publishes one result
as a display message of type :data:`MIME`, ``{"ok": value}`` or ``{"error": [kind, path, why]}``.

The rules are those of :mod:`execspace.workspace.confine`, by necessity restated here: paths are relative
with no ``..``; every component is opened from a directory fd with ``O_NOFOLLOW`` (a planted symlink is
refused, never followed); reads take only regular files with one hard link, opened non-blocking (a FIFO
cannot hang the kernel); writes go to a fresh temp file renamed into place.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
from typing import Any

MIME = "application/vnd.execspace.remotefs+json"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CELL_FILE = re.compile(r"^cell-(\d+)-")


class Refused(Exception):
    """A path rule said no: becomes execspace's ``PathDenied`` (or the error ``kind`` names) on our side."""

    def __init__(self, kind: str, path: str, why: str) -> None:
        super().__init__(why)
        self.kind, self.path, self.why = kind, path, why


def split_relpath(path: Any) -> list[str]:
    if not isinstance(path, str) or not path or "\0" in path:
        raise Refused("PathDenied", str(path), "empty path or NUL byte")
    if path.startswith("/"):
        raise Refused("PathDenied", path, "absolute paths are not allowed; use a path relative to the workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused("PathDenied", path, "'..' components are not allowed")
    if not parts:
        raise Refused("PathDenied", path, "path names the workspace root itself")
    return parts


def open_root(ws: str) -> int:
    try:
        return os.open(ws, _DIR_FLAGS)
    except FileNotFoundError:
        raise Refused("FileNotFoundError", ws, "the workspace does not exist on the server") from None
    except OSError as exc:
        raise Refused("PathDenied", ws, f"workspace root cannot be opened safely ({exc.strerror})") from None


def open_dir(ws: str, parts: list[str], display: str, create: bool = False) -> int:
    fd = open_root(ws)
    try:
        for name in parts:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise Refused("FileNotFoundError", display, "no such file or directory") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(
                        "PathDenied", display, f"component {name!r} is a symlink or not a directory"
                    ) from None
                raise
            os.close(fd)
            fd = nfd
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
    tmp = f".{name[:40]}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), mode & 0o777)
    return tmp


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
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                raise Refused("PathDenied", item["path"], "a directory exists at this path")
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
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        raise Refused("FileNotFoundError", path, "no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("PathDenied", path, "the file is a symlink") from None
        if exc.errno == errno.EISDIR:
            raise Refused("IsADirectoryError", path, "is a directory") from None
        raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("PathDenied", path, "not a regular file")
        if st.st_nlink > 1:
            raise Refused(
                "PathDenied", path, "the file has several hard links and may alias a file outside the workspace"
            )
        data = os.pread(fd, args["n"], args["offset"])
    finally:
        os.close(fd)
    return {"b64": base64.b64encode(data).decode(), "size": st.st_size, "id": [st.st_dev, st.st_ino]}


def op_walk(args: dict[str, Any]) -> list[list[Any]]:
    """Every entry below each start, sorted, without following symlinks: [path, size, nlinks, kind, mtime]."""
    budget = [args["max_entries"]]
    found: list[list[Any]] = []
    for start in args["starts"]:
        try:
            fd = open_dir(args["ws"], start, "/".join(start)) if start else open_root(args["ws"])
        except Refused:
            continue
        walk_fd(fd, "/".join(start), budget, found)
    return found


def walk_fd(fd: int, prefix: str, budget: list[int], found: list[list[Any]]) -> None:
    try:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            budget[0] -= 1
            if budget[0] < 0:
                return
            rel = f"{prefix}/{e.name}" if prefix else e.name
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            found.append(entry(rel, st))
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                walk_fd(sub, rel, budget, found)
    finally:
        os.close(fd)


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
    src, dst = args["src"], args["dst"]
    src_parts, dst_parts = split_relpath(src), split_relpath(dst)
    if dst_parts[: len(src_parts)] == src_parts:
        raise Refused("PathDenied", dst, f"cannot move {src!r} into itself")
    sfd = open_dir(args["ws"], src_parts[:-1], src)
    try:
        try:
            os.stat(src_parts[-1], dir_fd=sfd, follow_symlinks=False)
        except FileNotFoundError:
            raise Refused("FileNotFoundError", src, "no such file or directory") from None
        dfd = open_dir(args["ws"], dst_parts[:-1], dst, create=True)
        try:
            os.rename(src_parts[-1], dst_parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


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
        remove_entry(dfd, parts[-1], 0)
    finally:
        os.close(dfd)


def remove_entry(dfd: int, name: str, depth: int) -> None:
    """Remove ``name`` below ``dfd``; a directory is opened with ``O_NOFOLLOW`` (a symlink swapped in for it
    is unlinked, never entered) and given back to its owner's write access (read-only staged trees)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EACCES):
            raise
        if exc.errno != errno.EACCES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dfd)
            return
        # a directory its program made unreadable: the server side is one principal, so giving it back is ours
        os.chmod(name, 0o700, dir_fd=dfd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    try:
        if depth > 256:
            raise Refused("PathDenied", name, "more than 256 directory levels; flatten the tree")
        st = os.fstat(fd)
        if st.st_uid == os.getuid() and st.st_mode & 0o700 != 0o700:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)
        for child in os.listdir(fd):
            remove_entry(fd, child, depth + 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def op_next_cell(args: dict[str, Any]) -> int:
    """One past the highest ``cell-N-*`` in ``out/``, so a new kernel never overwrites older outputs."""
    try:
        fd = open_dir(args["ws"], ["out"], "out")
    except Refused:
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
    except OSError as exc:
        result = {"error": ["OSError", str(exc.filename or ""), f"{type(exc).__name__}: {exc.strerror or exc}"]}
    from IPython.display import publish_display_data

    publish_display_data({MIME: result})  # type: ignore[no-untyped-call]


if __name__ == "__execspace_remotefs__":
    main(json.loads(_ARGS))  # type: ignore[name-defined]  # noqa: F821 - set by the caller
