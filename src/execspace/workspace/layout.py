"""The standard workspace layout and the variables a run sees.

::

    <root>/
      work/            the program's working directory
      work/inputs/     staged inputs
      out/             outputs to collect
      runs/<run>/      one directory per run (RUN_DIR)
      skills/          staged skills (read-only to programs where the backend can)
      src/             code blocks written by the code executor
      home/            HOME
      tmp/             TMPDIR
      metadata.json    what was staged and collected (atomic writes, corruption tolerated)
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
import time
from pathlib import Path

from ..errors import InvalidSpec
from .confine import ConfinedRoot

__all__ = [
    "LAYOUT_DIRS",
    "METADATA_FILE",
    "ensure_layout",
    "new_run_name",
    "sanitize_id",
    "workspace_env",
]

LAYOUT_DIRS = ("work", "work/inputs", "out", "runs", "skills", "src", "home", "tmp")
METADATA_FILE = "metadata.json"

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def sanitize_id(exec_id: str) -> str:
    """Turn a logical id (``app/user/session``) into one safe directory name.

    Components are kept readable; a short hash keeps distinct ids distinct even
    when sanitising maps them to the same text (``a/b`` vs ``a_b``).
    """
    if not exec_id:
        raise InvalidSpec("workspace id must not be empty")
    readable = "_".join(p for p in (_UNSAFE.sub("_", c).strip("._") for c in exec_id.split("/")) if p)
    digest = hashlib.sha256(exec_id.encode()).hexdigest()[:10]
    return f"{readable[:80] or 'ws'}-{digest}"


def ensure_layout(root: Path, owner: tuple[int, int] | None = None) -> None:
    """Create the layout directories under ``root`` (which must exist); with ``owner``, give it the root
    and every layout directory (the sandbox's uid, the container's user).

    One walk by directory fds: each directory is opened without following symlinks and created or
    chowned through that fd. Raises ``PathDenied`` when a program replaced one of them with a symlink:
    nothing is ever created or chowned through it, however fast it swaps.
    """
    with ConfinedRoot(str(root), owner) as cr:
        cr.ensure_dir([])
        for d in LAYOUT_DIRS:
            cr.ensure_dir(d.split("/"))


def new_run_name() -> str:
    """A fresh, sortable run directory name under ``runs/``.

    64 random bits: a sandbox session's supervisor makes the directory after the run's environment has named
    it, so a second draw is no longer possible then, and a thousand runs a second must not meet (24 bits met
    about once every half minute at that rate)."""
    return f"runs/{_stamp(int(time.time()))}-{secrets.token_hex(8)}"


@functools.lru_cache(maxsize=1)  # runs that start in the same second: formatted once (strftime costs ~5 µs)
def _stamp(second: int) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(second))


def workspace_env(root: str, run_dir: str) -> dict[str, str]:
    """The variables every run gets; ``root`` is the workspace path as the program sees it."""
    base = root.rstrip("/")  # what os.path.join gives for these relative names, at a fifth of its cost per run
    tmp = f"{base}/tmp"
    return {
        "WORKSPACE_DIR": root,
        "WORK_DIR": f"{base}/work",
        "OUTPUT_DIR": f"{base}/out",
        "RUN_DIR": f"{base}/{run_dir}",
        "SKILLS_DIR": f"{base}/skills",
        "HOME": f"{base}/home",
        "TMPDIR": tmp,
        "TMP": tmp,
        "TEMP": tmp,
    }
