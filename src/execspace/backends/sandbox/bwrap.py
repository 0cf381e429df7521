"""bubblewrap command lines, and the probe that proves the boundary works here.

Design (see docs/backends/sandbox.md):

* The sandbox root is an empty tmpfs. Only system directories of the host are
  bound into it, read-only (``/usr``, ``/etc``, ``/opt``…); ``/home``, ``/root``,
  ``/mnt``, ``/srv``, ``/run`` and the host's ``/tmp`` are not there at all.
* The workspace is bound read-write at ``/workspace``; its ``skills/`` and
  ``metadata.json`` are bound read-only over it.
* All namespaces are unshared (user, pid, ipc, uts, cgroup, and net unless the
  network is on); nested user namespaces are disabled; a new session stops
  terminal injection; the sandbox dies with its supervisor.
* **Started by root, bwrap is not a boundary** (uid 0 in the sandbox is host
  root with all capabilities of its namespace). So when we are root, bwrap
  itself is started as an unprivileged host uid, derived per workspace; file
  permission checks then are those of that uid, and RLIMIT_NPROC counts the
  processes of that workspace only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SANDBOX_WORKSPACE", "BwrapConfig", "build_argv", "sandbox_uid", "visible_path_entries"]

#: Where the workspace appears inside the sandbox.
SANDBOX_WORKSPACE = "/workspace"

#: Top-level host entries never bound into the sandbox.
HIDDEN_TOP = frozenset(
    {"proc", "dev", "sys", "tmp", "run", "home", "root", "mnt", "media", "srv", "boot", "lost+found", "workspace"}
)

#: Credential stores masked wherever they would be visible (relative to the host HOME).
CREDENTIAL_PATHS = (
    ".ssh",
    ".aws",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".netrc",
    ".gnupg",
    ".azure",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".config/gh",
    ".password-store",
    ".vault-token",
)

_UID_BASE = 1_500_000_000
_UID_SPAN = 100_000_000


def sandbox_uid(ws_root: Path) -> int:
    """A host uid unused by real accounts, distinct per workspace (collisions are negligible)."""
    digest = hashlib.sha256(str(ws_root).encode()).digest()
    return _UID_BASE + int.from_bytes(digest[:8], "big") % _UID_SPAN


@dataclass(frozen=True, slots=True)
class BwrapConfig:
    bwrap: str
    network: bool
    tmp_size: int | None = 256 * 1024 * 1024
    extra_ro: Sequence[str] = ()
    host_home: str | None = None


def _top_level_binds() -> list[str]:
    args: list[str] = []
    for entry in sorted(os.listdir("/")):
        if entry in HIDDEN_TOP:
            continue
        path = f"/{entry}"
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            args += ["--symlink", os.readlink(path), path]
        elif stat.S_ISDIR(st.st_mode):
            args += ["--ro-bind", path, path]
    return args


def _credential_masks(home: str | None) -> list[str]:
    parts = Path(home).parts if home else ()
    # a home under a hidden top-level dir (/root, /home) is not in the sandbox at all
    if len(parts) < 2 or parts[1] in HIDDEN_TOP:
        return []
    args: list[str] = []
    for rel in CREDENTIAL_PATHS:
        p = os.path.join(str(home), rel)
        if os.path.isdir(p) and not os.path.islink(p):
            args += ["--tmpfs", p]
        elif os.path.lexists(p):
            args += ["--ro-bind", "/dev/null", p]
    return args


def _network_files(network: bool) -> list[str]:
    if not network:
        return []
    real = os.path.realpath("/etc/resolv.conf")
    # resolv.conf often points into /run, which is otherwise hidden
    if real.startswith("/run/") and os.path.exists(real):
        return ["--ro-bind", real, real]
    return []


def build_argv(cfg: BwrapConfig, ws_root: Path, cwd_rel: str, argv: Sequence[str], *, as_root_host: bool) -> list[str]:
    """The complete bwrap command line for one run. No environment values appear in it."""
    args = [
        cfg.bwrap,
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "execspace",
    ]
    if not cfg.network:
        args.append("--unshare-net")
    args += _top_level_binds()
    args += ["--dev", "/dev", "--proc", "/proc"]
    if cfg.tmp_size:
        args += ["--size", str(cfg.tmp_size)]
    args += ["--tmpfs", "/tmp"]
    args += _network_files(cfg.network)
    if not as_root_host:
        args += _credential_masks(cfg.host_home)
    for path in cfg.extra_ro:
        args += ["--ro-bind", path, path]
    ws = SANDBOX_WORKSPACE
    args += [
        "--bind", str(ws_root), ws,
        "--ro-bind", str(ws_root / "skills"), f"{ws}/skills",
        "--ro-bind", str(ws_root / "metadata.json"), f"{ws}/metadata.json",
        "--chdir", f"{ws}/{cwd_rel}".rstrip("/"),
        "--",
        *argv,
    ]  # fmt: skip
    return args


def visible_path_entries(path: str) -> str:
    """Keep the PATH entries that exist inside the sandbox (not under hidden top-level dirs)."""
    keep = []
    for entry in path.split(":"):
        parts = Path(entry).parts
        if len(parts) > 1 and parts[0] == "/" and parts[1] not in HIDDEN_TOP:
            keep.append(entry)
    return ":".join(dict.fromkeys(keep))


def find_bwrap(explicit: str | None = None) -> str | None:
    return explicit or shutil.which("bwrap")
