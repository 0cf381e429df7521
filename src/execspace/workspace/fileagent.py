"""The file agent: file operations run where the files are, when they are not on this host.

Not imported to run here: its *text*, after that of :mod:`.confinecore` (:func:`agent_text`), is shipped to the
other side, so it uses only the standard library (and IPython in a kernel). Two backends ship it:

* the e2b backend uploads it once to each sandbox and runs it as ``python3 <file> <idle seconds>``: one
  long-lived process per sandbox, one JSON request per stdin line, one JSON answer per stdout line (:func:`serve`);
* the jupyter backend's server mode (``ServerKernels(shared_filesystem=False)``) runs it as a cell of its file
  kernel, in fresh globals named ``__execspace_remotefs__`` with ``_ARGS`` the request as a JSON string (a
  ``repr()`` literal, never code built from data); the answer is published as display data of type :data:`MIME`.

A request is ``{"op": name, "args": {...}}``, an answer ``{"ok": value}`` or ``{"error": [kind, path, why]}``
(``kind`` an ``OSError`` subclass's name, ``PathDenied``, ``WorkspaceGone`` or ``PermissionError`` for a file the
agent's user may not write). The rules are the core's: paths are relative with no ``..``; every component is
opened from a directory fd with ``O_NOFOLLOW``; reads take only regular files with one hard link, opened
non-blocking; writes go to a fresh temp file renamed into place; removal works by directory fds.
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
import sys
from typing import Any

with contextlib.suppress(ImportError):  # shipped as text: the core's text ran first, in these globals
    from .confinecore import (
        DIR_FLAGS,
        PathDenied,
        copy_fd,
        create_temp,
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


def agent_text() -> str:
    """The text to ship: the core's, then this module's, as one program."""
    from importlib import resources

    here = resources.files("execspace.workspace")
    core = here.joinpath("confinecore.py").read_text(encoding="utf-8")
    agent = here.joinpath("fileagent.py").read_text(encoding="utf-8")
    # one text: the agent's own __future__ import may not follow the core's code
    return core + "\n" + agent.replace("from __future__ import annotations\n", "", 1)


class Refused(Exception):
    """A path rule said no: an execspace error (or the error ``kind`` names) on the caller's side."""

    def __init__(self, kind: str, path: str, why: str) -> None:
        super().__init__(why)
        self.kind, self.path, self.why = kind, path, why


def open_root(ws: str) -> int:
    try:
        return os.open(ws, DIR_FLAGS)
    except FileNotFoundError:
        raise Refused("WorkspaceGone", ws, "the workspace directory does not exist") from None
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


def entry(path: str, st: os.stat_result) -> list[Any]:
    """``[path, size, mtime, kind, nlinks, mode]`` of an lstat result (the kinds of execspace's FileKind)."""
    if stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "other"
    size = st.st_size if kind in ("file", "symlink") else 0
    return [path, size, st.st_mtime, kind, st.st_nlink, stat.S_IMODE(st.st_mode)]


def op_root(args: dict[str, Any]) -> str:
    """Create a root of workspaces (private to the agent's user) and say where it is."""
    root = os.path.abspath(os.path.expanduser(str(args["root"])))
    os.makedirs(root, mode=0o700, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise Refused("PathDenied", root, "the workspace root is a symlink, not a directory, or not ours")
    return root


def op_layout(args: dict[str, Any]) -> str:
    """Create a workspace (0700) with its layout directories and, if given, its first record, unless they
    exist."""
    ws = str(args["ws"])
    os.makedirs(ws, mode=0o700, exist_ok=True)
    for d in args["dirs"]:
        os.close(open_dir(ws, split_relpath(d), d, create=True))
    if args.get("record") is None:
        return ws
    fd = open_root(ws)
    try:
        tmp = write_temp(fd, args["record"], base64.b64decode(args["data"]), 0o600)
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
    try:
        fd = open_root(args["ws"])
    except Refused as exc:
        if exc.kind == "WorkspaceGone":
            return False
        raise
    try:
        os.stat(args["record"], dir_fd=fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


def op_remove(args: dict[str, Any]) -> None:
    """Remove a whole workspace."""
    if os.path.lexists(args["ws"]):
        shutil.rmtree(args["ws"], onerror=_writable_retry)


def _writable_retry(func: Any, path: str, exc: object) -> None:
    # read-only staged trees: give the owner write access back, then retry once
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o700)
        func(path)


def op_stat(args: dict[str, Any]) -> list[Any]:
    """``[path, size, mtime, kind, nlinks, mode, link target or None]``."""
    path = args["path"]
    parts = split_relpath(path)
    fd = open_dir(args["ws"], parts[:-1], path)
    try:
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            target = os.readlink(parts[-1], dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
        except FileNotFoundError:
            raise Refused("FileNotFoundError", path, "no such file or directory") from None
        return [*entry("/".join(parts), st), target]
    finally:
        os.close(fd)


def op_walk(args: dict[str, Any]) -> list[list[Any]]:
    """Every entry below each start (never through a link), sorted, as :func:`entry`; at most ``max_entries``
    if given. A start that is missing or a link has nothing below it; a missing workspace is an error."""
    budget = args.get("max_entries")
    found: list[list[Any]] = []
    for start in args["starts"]:
        prefix = "/".join(start)
        try:
            fd = open_dir(args["ws"], list(start), prefix or ".")
        except (Refused, PathDenied) as exc:
            if isinstance(exc, Refused) and exc.kind == "WorkspaceGone":
                raise
            continue
        dirs = {prefix}
        for rel, st, unreadable in scan_tree(fd, prefix):
            if unreadable and rel in dirs:
                continue  # a directory listed already, whose entries we may not see
            if budget is not None:
                budget -= 1
                if budget < 0:
                    return found
            if stat.S_ISDIR(st.st_mode):
                dirs.add(rel)
            found.append(entry(rel, st))
    return found


def op_list(args: dict[str, Any]) -> list[list[Any]]:
    """The entries below the directory ``start`` (its components; none: the root), ``descend`` levels down, as
    :func:`entry`, never through a link but across mount points (a machine's ``/tmp``, ``/proc``); at most
    ``max_entries``. A directory we may not list has nothing below it."""
    budget, descend = args["max_entries"], args["descend"]
    found: list[list[Any]] = []
    pending: list[list[str]] = [list(args["start"])]
    while pending:
        parts = pending.pop()
        prefix = "/".join(parts)
        try:
            fd = open_dir(args["ws"], parts, prefix or ".")
        except (Refused, PathDenied, OSError):
            if not found and parts == args["start"]:
                raise
            continue
        try:
            names = sorted(os.listdir(fd))
        except OSError:
            names = []
        try:
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    found.append(entry(f"{prefix}/{name}" if prefix else name, st))
                    if len(found) >= budget:
                        return found
                    if stat.S_ISDIR(st.st_mode) and len(parts) - len(args["start"]) + 1 < descend:
                        pending.append([*parts, name])
        finally:
            os.close(fd)
    return found


def op_readable(args: dict[str, Any]) -> list[int]:
    """The size of each path when it is a regular file with one link reached through no link."""
    sizes = []
    for path in args["paths"]:
        fd, st = _open_readable(args["ws"], path)
        os.close(fd)
        sizes.append(st.st_size)
    return sizes


def op_read(args: dict[str, Any]) -> dict[str, Any]:
    """Up to ``n`` bytes at ``offset`` of a regular, singly linked file; with its size and identity."""
    fd, st = _open_readable(args["ws"], args["path"])
    try:
        data = os.pread(fd, args["n"], args["offset"])
    finally:
        os.close(fd)
    return {"b64": base64.b64encode(data).decode(), "size": st.st_size, "id": [st.st_dev, st.st_ino]}


def _open_readable(ws: str, path: str) -> tuple[int, os.stat_result]:
    parts = split_relpath(path)
    dfd = open_dir(ws, parts[:-1], path)
    try:
        return open_regular(dfd, parts[-1], path)
    except FileNotFoundError:
        raise Refused("FileNotFoundError", path, "no such file or directory") from None
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise Refused("IsADirectoryError", path, "is a directory") from None
        raise
    finally:
        os.close(dfd)


def op_write(args: dict[str, Any]) -> list[str | None]:
    """Write pieces of files: a piece with no ``tmp`` starts a temp file, ``final`` renames it into place."""
    tmps = []
    for item in args["items"]:
        parts = split_relpath(item["path"])
        dfd = open_dir(args["ws"], parts[:-1], item["path"], create=True)
        try:
            tmps.append(_write_piece(dfd, parts[-1], item))
        finally:
            os.close(dfd)
    return tmps


def _write_piece(dfd: int, name: str, item: dict[str, Any]) -> str | None:
    data = base64.b64decode(item["b64"])
    tmp: str | None = item["tmp"]
    if tmp is None:
        refuse_dir(dfd, name, item["path"])
        tmp = write_temp(dfd, name, data, item["mode"])
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


def op_install(args: dict[str, Any]) -> None:
    """Move uploaded files from the private staging directory into place (a planted link is replaced, never
    written through), then remove the staging directory."""
    stage = str(args["stage"])
    try:
        for _, dest, _ in args["files"]:  # every refusal before anything moves
            parts = split_relpath(dest)
            try:
                fd = open_dir(args["ws"], parts[:-1], dest)
            except Refused as exc:
                if exc.kind != "FileNotFoundError":
                    raise
                continue  # a parent missing: nothing there to refuse
            try:
                refuse_dir(fd, parts[-1], dest)
                _refuse_unwritable(fd, parts[-1], dest)
            finally:
                os.close(fd)
        for name, dest, mode in args["files"]:
            parts = split_relpath(dest)
            os.chmod(os.path.join(stage, name), mode & 0o777)
            fd = open_dir(args["ws"], parts[:-1], dest, create=True)
            try:
                refuse_dir(fd, parts[-1], dest)
                os.rename(os.path.join(stage, name), parts[-1], dst_dir_fd=fd)
            finally:
                os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            for leftover in os.listdir(stage):
                os.unlink(os.path.join(stage, leftover))
            os.rmdir(stage)


def _refuse_unwritable(dfd: int, name: str, display: str) -> None:
    """A file the program may not write (we run as it) is not replaced either, as opening it to write would fail:
    renaming over it would not."""
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and not os.access(name, os.W_OK, dir_fd=dfd, follow_symlinks=False):
            raise Refused("PermissionError", display, "permission denied: the program may not write it")


def op_make_dir(args: dict[str, Any]) -> None:
    path = args["path"]
    os.close(open_dir(args["ws"], split_relpath(path), path, create=True))


def op_rename(args: dict[str, Any]) -> None:
    ws, src = args["ws"], args["src"]
    try:
        rename_path(lambda parts, create, display: open_dir(ws, parts, display, create), src, args["dst"])
    except FileNotFoundError:
        raise Refused("FileNotFoundError", src, "no such file or directory") from None
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _move_across(ws, src, args["dst"])


def _move_across(ws: str, src: str, dst: str) -> None:
    """A move between two of the sandbox's filesystems (its ``/tmp`` and its home), as ``mv`` makes it: a copy
    (a link as a link, a tree entry by entry, each file with its mode and ``user.e2b.`` attributes, nothing
    followed), then the source removed. A directory goes where nothing is; a file replaces a file."""
    sp, dp = split_relpath(src), split_relpath(dst)
    sfd = open_dir(ws, sp[:-1], src)
    try:
        _refuse_unremovable(sfd, sp[-1], src)  # before a byte is copied: a move that cannot end never starts
        dfd = open_dir(ws, dp[:-1], dst, create=True)
        try:
            _copy_entry(sfd, sp[-1], dfd, dp[-1], dst)
            remove_tree(sfd, sp[-1], src)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _refuse_unremovable(dfd: int, name: str, display: str) -> None:
    """Whether the program may remove ``name`` from the directory ``dfd``: it may write the directory, and where the
    directory is sticky (``/tmp``) it owns the entry or the directory."""
    here, entry_st = os.fstat(dfd), os.stat(name, dir_fd=dfd, follow_symlinks=False)
    uid = os.geteuid()
    sticky_other = here.st_mode & stat.S_ISVTX and uid not in (here.st_uid, entry_st.st_uid)
    if not os.access(".", os.W_OK, dir_fd=dfd) or sticky_other:
        raise Refused("PermissionError", display, "permission denied: the program may not move it away")


def _copy_entry(sfd: int, name: str, dfd: int, target: str, display: str) -> None:
    st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(target, 0o700, dir_fd=dfd)
        src_dir = os.open(name, DIR_FLAGS, dir_fd=sfd)
        try:
            dst_dir = os.open(target, DIR_FLAGS, dir_fd=dfd)
            try:
                for child in os.listdir(src_dir):
                    _copy_entry(src_dir, child, dst_dir, child, f"{display}/{child}")
                _copy_xattrs(src_dir, dst_dir)
                os.fchmod(dst_dir, stat.S_IMODE(st.st_mode))
            finally:
                os.close(dst_dir)
        finally:
            os.close(src_dir)
        return
    refuse_dir(dfd, target, display)
    if stat.S_ISLNK(st.st_mode):
        tmp = f".{target[:40]}.{os.urandom(6).hex()}.tmp"
        os.symlink(os.readlink(name, dir_fd=sfd), tmp, dir_fd=dfd)
    elif stat.S_ISREG(st.st_mode):
        fd, _ = open_regular(sfd, name, display)
        try:
            tmp, out = create_temp(dfd, target)
            try:
                copy_fd(fd, out)
                _copy_xattrs(fd, out)
                os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)
            except BaseException:
                os.unlink(tmp, dir_fd=dfd)  # a full disk leaves no half copy behind
                raise
            finally:
                os.close(out)
        finally:
            os.close(fd)
    else:
        raise Refused("PathDenied", display, "only files, directories and links move between filesystems")
    os.rename(tmp, target, src_dir_fd=dfd, dst_dir_fd=dfd)


def _copy_xattrs(src: int, dst: int) -> None:
    """The ``user.e2b.`` attributes go with a moved entry (a filesystem without them keeps none)."""
    with contextlib.suppress(OSError):
        for name in os.listxattr(src):
            if name.startswith(_XATTR_PREFIX):
                os.setxattr(dst, name, os.getxattr(src, name))


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


_XATTR_PREFIX = "user.e2b."


def _entry_path(ws: str, path: str) -> int:
    """An ``O_PATH`` descriptor of the entry at ``path`` itself (a link is not followed); nothing there:
    ``FileNotFoundError``."""
    parts = split_relpath(path)
    dfd = open_dir(ws, parts[:-1], path)
    try:
        return os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)


def _keeps_xattrs(fd: int) -> bool:
    """Only files and directories hold ``user.`` attributes."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


def op_metadata(args: dict[str, Any]) -> list[dict[str, str]]:
    """The ``user.e2b.`` attributes of each path's entry, keys without the prefix: none where nothing is there, for
    a link (never followed), where the filesystem keeps none or the program may not look. Called by its
    ``/proc/self/fd`` name, the attributes are the opened inode's, whatever the path names meanwhile."""
    found = []
    for path in args["paths"]:
        pairs: dict[str, str] = {}
        with contextlib.suppress(OSError, Refused):
            fd = _entry_path(args["ws"], path)
            try:
                if _keeps_xattrs(fd):
                    proc = f"/proc/self/fd/{fd}"
                    for name in os.listxattr(proc):
                        if name.startswith(_XATTR_PREFIX):
                            with contextlib.suppress(OSError, UnicodeError):
                                pairs[name[len(_XATTR_PREFIX) :]] = os.getxattr(proc, name).decode()
            finally:
                os.close(fd)
        found.append(pairs)
    return found


def op_set_metadata(args: dict[str, Any]) -> bool:
    """Make ``metadata`` the whole ``user.e2b.`` set of the entry at ``path`` (keys it lacks removed), with the
    program's own permissions; False where the entry or its filesystem keeps none."""
    path, metadata = args["path"], args["metadata"]
    try:
        fd = _entry_path(args["ws"], path)
    except FileNotFoundError:
        raise Refused("FileNotFoundError", path, "no such file or directory") from None
    try:
        if not _keeps_xattrs(fd):
            return False
        proc = f"/proc/self/fd/{fd}"
        try:
            for name in os.listxattr(proc):
                if name.startswith(_XATTR_PREFIX) and name[len(_XATTR_PREFIX) :] not in metadata:
                    try:
                        os.removexattr(proc, name)
                    except OSError as exc:
                        if exc.errno != errno.ENODATA:  # removed meanwhile
                            raise
            for key, value in metadata.items():
                os.setxattr(proc, _XATTR_PREFIX + key, value.encode())
        except OSError as exc:
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                return False
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise Refused("PermissionError", path, "permission denied: the program may not write it") from None
            raise
        return True
    finally:
        os.close(fd)


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
    "stat": op_stat,
    "walk": op_walk,
    "list": op_list,
    "readable": op_readable,
    "read": op_read,
    "write": op_write,
    "install": op_install,
    "make_dir": op_make_dir,
    "rename": op_rename,
    "remove_path": op_remove_path,
    "next_cell": op_next_cell,
    "metadata": op_metadata,
    "set_metadata": op_set_metadata,
}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": OPS[request["op"]](request["args"])}
    except Refused as exc:
        return {"error": [exc.kind, exc.path, exc.why]}
    except IsADirectoryError as exc:  # before PathDenied: PathIsDirectory is both
        return {"error": ["IsADirectoryError", str(exc.filename or ""), "is a directory"]}
    except PathDenied as exc:  # before OSError: it is a PermissionError
        return {"error": ["PathDenied", exc.path, exc.reason]}
    except OSError as exc:
        return {"error": [type(exc).__name__, str(exc.filename or ""), exc.strerror or str(exc)]}


def serve(idle: float) -> None:
    """One request per stdin line, one answer per stdout line, until stdin ends or stays quiet for ``idle`` s
    (a client that went away leaves no agent behind for long)."""
    import select

    while select.select([sys.stdin], [], [], idle)[0]:
        line = sys.stdin.readline()
        if not line:
            return
        sys.stdout.write(json.dumps(answer(json.loads(line))) + "\n")
        sys.stdout.flush()


def publish(request: dict[str, Any]) -> None:
    """Answer ``request`` as the display data of the kernel cell that runs this text."""
    from IPython.display import publish_display_data

    publish_display_data({MIME: answer(request)})  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    serve(float(sys.argv[1]))
elif __name__ == "__execspace_remotefs__":
    publish(json.loads(_ARGS))  # type: ignore[name-defined]  # noqa: F821 - set by the caller
