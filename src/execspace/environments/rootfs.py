"""Debian root filesystems for ``base = "rootfs"`` environments: where from (the host's own apt sources), which
suite, and the ``mmdebstrap`` command that makes one (docs/environments.md "Rootfs environments").

Nothing here names a mirror: the packages come from whatever the host's apt is configured with, so a host behind a
mirror or a snapshot builds from that.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvironmentBuildFailed

__all__ = ["DEBIAN_PATH", "ROOTFS_DIR", "DebianTarget", "debian_target", "lookup_in_root", "mmdebstrap_argv"]

#: Where in a rootfs environment's directory the root filesystem is (its marker and sources list lie beside it).
ROOTFS_DIR = "rootfs"
#: The PATH of a program in a rootfs: Debian's own default (login.defs), nothing of the host's.
DEBIAN_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
_APT_DIR = Path("/etc/apt")
#: Paths left out of the tree: nothing runs them, and they are a quarter of a minimal root (copyrights are kept).
_EXCLUDE = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
#: mmdebstrap's hook that merges /usr itself: without it apt installs ``usrmerge``, which brings all of Perl (50 MB).
_MERGED_USR = "/usr/share/mmdebstrap/hooks/maybe-merged-usr"
_MISSING_PACKAGE = re.compile(r"Unable to locate package (\S+)|Package '?(\S+?)'? has no installation candidate")


@dataclass(frozen=True, slots=True)
class DebianTarget:
    """What a rootfs is built from: a suite, an architecture, and the host's apt sources for that suite."""

    suite: str
    arch: str
    sources: str
    """One-line apt sources (``deb [signed-by=…] URI SUITE COMPONENTS``), the host's entries for ``suite``."""

    @property
    def runtime(self) -> str:
        """What the tree's address depends on besides the spec (not the mirror: where from is not what)."""
        return f"debian {self.suite} {self.arch}"


def debian_target(suite: str, apt_dir: Path = _APT_DIR, os_release: Path = Path("/etc/os-release")) -> DebianTarget:
    """The suite (``suite``, or the host's own), the host's architecture and its apt sources rewritten for it.

    Raises:
        EnvironmentBuildFailed: the host is no Debian (no dpkg, no codename) or its apt has no Debian sources.
    """
    host_suite = _host_codename(os_release)
    if not host_suite:
        raise EnvironmentBuildFailed(
            f"a rootfs environment is built from the host's apt sources, and {os_release} names no VERSION_CODENAME",
            "build rootfs environments on a Debian host (or one whose apt reaches Debian's archive)",
        )
    dpkg = shutil.which("dpkg")
    if dpkg is None:
        raise EnvironmentBuildFailed("a rootfs environment needs dpkg on the host", "build it on a Debian host")
    arch = subprocess.run([dpkg, "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    wanted = suite or host_suite
    lines = [_for_suite(line, host_suite, wanted) for line in host_sources(apt_dir)]
    kept = [line for line in lines if line is not None]
    if not kept:
        raise EnvironmentBuildFailed(
            f"the host's apt sources ({apt_dir}/sources.list, sources.list.d/*.list|*.sources) have no entry for "
            f"Debian {host_suite}, which a rootfs is built from",
            "configure apt with Debian's archive (or a mirror of it) for this host's suite",
        )
    return DebianTarget(wanted, arch, "".join(f"{line}\n" for line in kept))


def _host_codename(os_release: Path) -> str:
    try:
        text = os_release.read_text(encoding="utf-8")
    except OSError:
        return ""
    found = re.search(r"^VERSION_CODENAME=\"?([a-z0-9-]+)\"?$", text, re.MULTILINE)
    return found.group(1) if found else ""


def host_sources(apt_dir: Path = _APT_DIR) -> list[str]:
    """The host's binary apt sources, one-line form, in apt's order: ``sources.list``, then ``sources.list.d``'s
    ``*.list`` and ``*.sources`` (deb822 stanzas turned into one line per URI and suite)."""
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    lines: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if path.name.endswith(".list"):
            lines += [
                ln.split("#")[0].strip() for ln in text.splitlines() if ln.split("#")[0].strip().startswith("deb ")
            ]
        elif path.name.endswith(".sources"):
            lines += _deb822_lines(text)
    return lines


def _deb822_lines(text: str) -> list[str]:
    lines: list[str] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for raw in stanza.splitlines():
            if raw.startswith("#") or not raw.strip():
                continue
            if raw[0] in " \t" and key:  # a continuation line (a multi-line field)
                fields[key] += " " + raw.strip()
            elif ":" in raw:
                key, _, value = raw.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        options = [f"{opt}={fields[name]}" for name, opt in _DEB822_OPTIONS if name in fields]
        prefix = f"deb [{' '.join(options)}]" if options else "deb"
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                lines.append(f"{prefix} {uri} {suite} {fields.get('components', '')}".rstrip())
    return lines


#: deb822 fields → their one-line option names.
_DEB822_OPTIONS = (("signed-by", "signed-by"), ("architectures", "arch"), ("trusted", "trusted"))


def _for_suite(line: str, host_suite: str, suite: str) -> str | None:
    """``line`` if it serves the host's suite (``bookworm``, ``bookworm-updates``…), with ``suite`` in its place;
    None for other entries (a vendor's repository, whose packages are no part of a Debian root)."""
    words = line.split()
    at = next((i for i, w in enumerate(words) if "://" in w or w.startswith("file:")), None)
    if at is None or at + 1 >= len(words):
        return None
    entry = words[at + 1]
    if entry != host_suite and not entry.startswith(f"{host_suite}-"):
        return None
    words[at + 1] = suite + entry[len(host_suite) :]
    return " ".join(words)


def mmdebstrap_argv(
    target: DebianTarget, packages: tuple[str, ...], tree: Path, sources: Path, *, dry_run: bool = False
) -> list[str]:
    """The command that builds ``tree`` (a new directory): a minbase root of ``target`` with ``packages``;
    ``dry_run``: only resolves them (apt's index and a simulated install: a missing package fails in seconds).

    As root it runs in a mount and PID namespace of its own (``mmdebstrap --mode=root`` mounts /proc, /dev and /sys
    inside the tree while packages install): whatever kills the build, the kernel takes the mounts and every process
    with it, so a half-built tree never holds a host mount for the next build's sweep to walk into. A normal user gets
    mmdebstrap's ``unshare`` mode (it needs subordinate uids, ``/etc/subuid``).

    Raises:
        EnvironmentBuildFailed: mmdebstrap is not installed.
    """
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise EnvironmentBuildFailed(
            "a rootfs environment is built with mmdebstrap, which this host does not have",
            "apt-get install mmdebstrap",
        )
    root = os.geteuid() == 0
    build = [
        mmdebstrap,
        "--mode=root" if root else "--mode=unshare",
        "--variant=minbase",
        *(["--dry-run"] if dry_run else []),
        *(f"--dpkgopt=path-exclude={p}" for p in _EXCLUDE),
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        *([f"--hook-dir={_MERGED_USR}"] if os.path.isdir(_MERGED_USR) else []),
        *([f"--include={','.join(packages)}"] if packages else []),
        target.suite,
        str(tree),
        str(sources),
    ]
    if not root:
        return build
    # pdeathsig: our own death (even SIGKILL) takes the namespace's first process, hence the whole namespace
    isolate = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--mount", "--propagation", "private"]
    return [*isolate, "--pid", "--fork", "--kill-child", "--mount-proc", *build]


def missing_packages(output: str) -> list[str]:
    """The packages apt said it cannot find, in ``output`` (mmdebstrap's)."""
    return sorted({a or b for a, b in _MISSING_PACKAGE.findall(output)})


def lookup_in_root(root: Path, cmd: str, path: str) -> str | None:
    """The program a sandbox whose ``/`` is ``root`` starts for ``cmd`` (a path inside it), looked up on ``path``
    as it is inside; a ``cmd`` with a slash is started as given."""
    if "/" in cmd:
        return cmd
    for entry in path.split(":"):
        if entry.startswith("/") and os.path.lexists(f"{root}{entry}/{cmd}"):
            return f"{entry}/{cmd}"
    return None
