"""The file checks the e2b backend runs inside the sandbox, where the paths are: containment decided there.

Not imported by execspace: its *text*, after that of :mod:`execspace.workspace.confinecore`, is uploaded once to
each sandbox and run as ``python3 <file> <idle seconds>``: one long-lived process per sandbox (see
:mod:`.sandboxes`). It never moves file content (that goes through the SDK's files API); it walks, stats, removes,
renames and installs uploaded files, every path opened from a directory fd with ``O_NOFOLLOW``, and answers each
JSON request of a stdin line with one JSON line: ``{"ok": value}`` or ``{"error": [kind, path, why]}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
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
    )


class Refused(Exception):
    def __init__(self, kind: str, path: str, why: str) -> None:
        super().__init__(why)
        self.kind, self.path, self.why = kind, path, why


def open_dir(ws: str, parts: list[str], display: str, create: bool = False) -> int:
    try:
        fd = os.open(ws, DIR_FLAGS)
    except FileNotFoundError:
        raise Refused("WorkspaceGone", ws, "the workspace directory does not exist in the sandbox") from None
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


def kind_of(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "dir" if stat.S_ISDIR(st.st_mode) else "other"


def entry(path: str, st: os.stat_result) -> list[Any]:
    kind = kind_of(st)
    size = st.st_size if kind in ("file", "symlink") else 0
    return [path, size, st.st_mtime, kind, st.st_nlink, stat.S_IMODE(st.st_mode)]


def op_root(args: dict[str, Any]) -> str:
    root = str(args["ws"])
    os.makedirs(root, mode=0o700, exist_ok=True)
    for rel in args["layout"]:
        os.close(open_dir(root, split_relpath(rel), rel, create=True))
    return root


def op_stat(args: dict[str, Any]) -> list[Any]:
    """``[path, size, mtime, kind, nlinks, mode, link target or None]``."""
    parts = split_relpath(args["path"])
    fd = open_dir(args["ws"], parts[:-1], args["path"])
    try:
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            target = os.readlink(parts[-1], dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
        except FileNotFoundError:
            raise Refused("FileNotFoundError", args["path"], "no such file or directory") from None
        return [*entry(args["path"], st), target]
    finally:
        os.close(fd)


def op_scan(args: dict[str, Any]) -> list[list[Any]]:
    """Every entry below each start (never through a link), ``[path, size, mtime, kind, nlinks, mode]``."""
    out: list[list[Any]] = []
    for start in args["starts"]:
        prefix = "/".join(start)
        try:
            fd = open_dir(args["ws"], list(start), prefix or ".")
        except (Refused, PathDenied) as exc:
            if isinstance(exc, Refused) and exc.kind == "WorkspaceGone":
                raise
            continue  # a start that is missing or a link: nothing to match below it
        out.extend(entry(rel, st) for rel, st, _ in scan_tree(fd, prefix))
    return out


def op_readable(args: dict[str, Any]) -> list[int]:
    """The size of each path when it is a regular file with one link reached through no link."""
    sizes = []
    for path in args["paths"]:
        parts = split_relpath(path)
        fd = open_dir(args["ws"], parts[:-1], path)
        try:
            try:
                ffd, st = open_regular(fd, parts[-1], path)
            except FileNotFoundError:
                raise Refused("FileNotFoundError", path, "no such file or directory") from None
            except IsADirectoryError:
                raise Refused("IsADirectoryError", path, "is a directory") from None
            os.close(ffd)
            sizes.append(st.st_size)
        finally:
            os.close(fd)
    return sizes


def op_remove(args: dict[str, Any]) -> None:
    parts = split_relpath(args["path"])
    fd = open_dir(args["ws"], parts[:-1], args["path"])
    try:
        try:
            os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise Refused("FileNotFoundError", args["path"], "no such file or directory") from None
        remove_tree(fd, parts[-1], args["path"])
    finally:
        os.close(fd)


def op_mkdir(args: dict[str, Any]) -> None:
    os.close(open_dir(args["ws"], split_relpath(args["path"]), args["path"], create=True))


def op_rename(args: dict[str, Any]) -> None:
    rename_path(lambda parts, create, display: open_dir(args["ws"], parts, display, create), args["src"], args["dst"])


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
                refuse_unwritable(fd, parts[-1], dest)
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


def refuse_unwritable(dfd: int, name: str, display: str) -> None:
    """A file the program may not write (we run as it) is not replaced either, as opening it to write would fail:
    renaming over it would not."""
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and not os.access(name, os.W_OK, dir_fd=dfd, follow_symlinks=False):
            raise Refused("PermissionError", display, "permission denied: the program may not write it")


OPS = {
    "root": op_root,
    "stat": op_stat,
    "scan": op_scan,
    "readable": op_readable,
    "remove": op_remove,
    "mkdir": op_mkdir,
    "rename": op_rename,
    "install": op_install,
}


def answer(raw: str) -> dict[str, Any]:
    args = json.loads(raw)
    try:
        return {"ok": OPS[args["op"]](args)}
    except Refused as exc:
        return {"error": [exc.kind, exc.path, exc.why]}
    except IsADirectoryError as exc:  # before PathDenied: PathIsDirectory is both
        return {"error": ["IsADirectoryError", str(exc.filename or ""), "is a directory"]}
    except PathDenied as exc:
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
        sys.stdout.write(json.dumps(answer(line)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(float(sys.argv[1]))
