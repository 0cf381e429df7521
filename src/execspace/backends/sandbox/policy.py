"""Permission profiles and path rules of the sandbox backend, one model for every enforcer.

The same :class:`SandboxPolicy` decides what a sandboxed program may do (bubblewrap mounts on
Linux, a Seatbelt profile on macOS) and what the backend's file API may do on its behalf
(``put_files``, ``stage_*``, ``read_file``, ``collect``), so a model-driven file tool cannot do
what the program itself may not.

Resolution of one path (:meth:`SandboxPolicy.decide`):

1. a workspace path matching a ``no_access_globs`` pattern, or lying under a match, has no
   access: globs are hard denies that no grant reopens (their depth is not a meaningful
   "specificity", and Seatbelt can only express them as hard denies: one meaning everywhere);
2. otherwise the matching rule with the most path components wins; ties go
   none > write > read; write implies read; no matching rule means no access;
3. a protected path (``.git``… relative to the workspace root, or to a host write grant over a
   directory (a project root), children included; :mod:`execspace.workspace.protected`) is never
   writable, whatever wins in 2: it stays readable unless a rule says none.

Workspace paths are relative (``work/data``); absolute paths inside the workspace are
workspace paths; other absolute paths are host paths. The profile contributes rules of its own
(the workspace root readable; in ``WORKSPACE_WRITE`` the layout directories writable and
``skills/`` and ``metadata.json`` read-only). The platform's read-only system view (``/usr``…)
is not a rule: the enforcer adds it.
"""

from __future__ import annotations

import enum
import functools
import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from wcmatch import glob as wglob

from ...errors import PathDenied, PolicyViolation, UsageError
from ...models import Workspace
from ...workspace.protected import DEFAULT_PROTECTED, INTERNAL_DIR

__all__ = [
    "CREDENTIAL_PATHS",
    "DEFAULT_PROTECTED",
    "INTERNAL_DIR",
    "Access",
    "Decision",
    "FileAccessHook",
    "Profile",
    "Resolver",
    "Resolvers",
    "Rule",
    "SandboxPolicy",
    "Target",
    "file_access_hook",
    "is_under",
    "path_parts",
]


class Profile(enum.StrEnum):
    """How much of the host a program may touch."""

    READ_ONLY = "read-only"
    """The workspace is read-only to the program; nothing on the host is writable."""
    WORKSPACE_WRITE = "workspace-write"
    """The default: the layout directories are writable, the rest of the workspace read-only."""
    DANGER_FULL_ACCESS = "danger-full-access"
    """No sandbox at all: the program runs like the ``local`` backend, network on."""
    EXTERNAL = "external"
    """Isolation is provided elsewhere: this engine refuses to run programs; file rules still apply."""


class Access(enum.StrEnum):
    NONE = "none"
    READ = "read"
    WRITE = "write"

    @property
    def can_read(self) -> bool:
        return self is not Access.NONE

    @property
    def can_write(self) -> bool:
        return self is Access.WRITE


#: Tie-break between rules of equal specificity: the most restrictive wins.
_TIE_RANK = {Access.READ: 1, Access.WRITE: 2, Access.NONE: 3}

#: Credential stores, relative to the host HOME: no access by default, even where the rest of
#: the host is readable. A more specific explicit grant reopens one (see the module docs).
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

#: Layout directories the program may write under ``WORKSPACE_WRITE``.
WRITABLE_LAYOUT = ("work", "work/inputs", "out", "runs", "home", "tmp", "src")
#: Layout entries the program only reads (the host stages skills and keeps the record).
READ_ONLY_LAYOUT = ("skills", "metadata.json")

_GLOB_FLAGS = wglob.GLOBSTAR | wglob.DOTGLOB


def _check_chars(path: str, what: str) -> None:
    # control characters would break bwrap's argv parsing of paths and Seatbelt strings alike
    if not path or any(ord(c) < 32 or c == "\x7f" for c in path):
        raise PolicyViolation(f"{what} {path!r}: empty, or contains a control character")


def _norm_path(path: str | os.PathLike[str], what: str) -> str:
    """An absolute host path, or a workspace-relative one ("." for the root); never escaping."""
    p = os.fspath(path).strip()
    _check_chars(p, what)
    if p.startswith("/"):
        return posixpath.normpath(p) if p != "/" else "/"
    if ".." in p.split("/"):
        raise PolicyViolation(f"{what} {p!r} leaves the workspace ('..'); use an absolute host path instead")
    return posixpath.normpath(p)


def _norm_glob(pattern: str) -> str | None:
    p = pattern.strip()
    if not p:
        return None  # a blank entry (e.g. from a config list) adds nothing
    _check_chars(p, "no-access glob")
    if p.startswith("/") or ".." in p.split("/"):
        raise PolicyViolation(
            f"no-access glob {p!r} must be relative to the workspace and stay inside it; "
            "deny host paths with with_no_access('/abs/path')"
        )
    if p.startswith("!"):
        raise PolicyViolation(f"no-access glob {p!r}: negated patterns are not supported")
    parts = [c for c in p.split("/") if c not in ("", ".")]
    if not parts:
        raise PolicyViolation(f"no-access glob {p!r} names the workspace root; use with_no_access('.')")
    return "/".join(parts)


def path_parts(path: str) -> tuple[str, ...]:
    if path in (".", "/"):
        return ()
    return tuple(c for c in path.split("/") if c)


def is_under(path: str, base: str) -> bool:
    """``path`` is ``base`` or inside it (both relative, or both absolute)."""
    if base in (".", "/"):
        return True
    return path == base or path.startswith(base + "/")


@dataclass(frozen=True, slots=True)
class Rule:
    """One grant or denial: ``target`` is workspace-relative ("." = root) or an absolute host path."""

    target: str
    access: Access
    origin: str

    @property
    def specificity(self) -> int:
        return len(path_parts(self.target))


@dataclass(frozen=True, slots=True)
class Decision:
    access: Access
    reason: str


@dataclass(frozen=True, slots=True)
class Target:
    """A path some rule names, with the access resolved there: what an enforcer mounts or emits."""

    path: str
    """Absolute host path."""
    rel: str | None
    """Workspace-relative path, or None for a host path outside the workspace."""
    access: Access
    protected: bool = False


def _tuple(values: Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    if isinstance(values, str | bytes):
        raise PolicyViolation(f"expected a list of paths, got one string {values!r}")
    return tuple(os.fspath(v) for v in values)


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What a sandboxed program may read and write, and whether it reaches the network.

    Immutable; the ``with_*`` builders return changed copies. Paths are absolute host paths
    or workspace-relative paths; globs are workspace-relative only.

    Args:
        profile: the baseline (default ``WORKSPACE_WRITE``).
        network: None = the profile's default (off for managed profiles, on for
            ``DANGER_FULL_ACCESS``, which cannot turn it off).
        read_paths / write_paths / no_access_paths: extra rules (write on ``/`` is refused).
        no_access_globs: hard denies on workspace paths (and everything below a match).
        protected: workspace paths that stay read-only whatever is granted.
        credential_paths: host paths with no access by default; relative ones are under ``home``.
        home: the host HOME for ``credential_paths`` (the engine fills in ``$HOME`` when opened).
    """

    profile: Profile = Profile.WORKSPACE_WRITE
    network: bool | None = None
    read_paths: tuple[str, ...] = ()
    write_paths: tuple[str, ...] = ()
    no_access_paths: tuple[str, ...] = ()
    no_access_globs: tuple[str, ...] = ()
    protected: tuple[str, ...] = DEFAULT_PROTECTED
    credential_paths: tuple[str, ...] = CREDENTIAL_PATHS
    home: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        try:
            set_(self, "profile", Profile(self.profile))
        except ValueError:
            raise PolicyViolation(
                f"unknown sandbox profile {self.profile!r}; use one of {', '.join(p.value for p in Profile)}"
            ) from None
        set_(self, "read_paths", tuple(_norm_path(p, "read path") for p in _tuple(self.read_paths)))
        writes = tuple(_norm_path(p, "write path") for p in _tuple(self.write_paths))
        if "/" in writes:
            raise PolicyViolation("a write grant on '/' would make the whole host writable; grant narrower paths")
        set_(self, "write_paths", writes)
        set_(self, "no_access_paths", tuple(_norm_path(p, "no-access path") for p in _tuple(self.no_access_paths)))
        globs = (_norm_glob(g) for g in _tuple(self.no_access_globs))
        set_(self, "no_access_globs", tuple(g for g in globs if g is not None))
        protected = tuple(_norm_path(p, "protected path") for p in _tuple(self.protected))
        if any(p.startswith("/") or p == "." for p in protected):
            raise PolicyViolation("protected paths are relative to the workspace root (e.g. '.git'), not the root")
        set_(self, "protected", protected)
        set_(self, "credential_paths", tuple(_norm_path(p, "credential path") for p in _tuple(self.credential_paths)))
        if self.home is not None:
            set_(self, "home", _norm_path(self.home, "home"))
            if not self.home.startswith("/"):
                raise PolicyViolation(f"home must be an absolute path, got {self.home!r}")
        if self.profile is Profile.DANGER_FULL_ACCESS and self.network is False:
            raise PolicyViolation(
                "danger-full-access runs without a sandbox and cannot turn the network off; "
                "use read-only or workspace-write with network off"
            )

    # -- builders --------------------------------------------------------------------

    def with_read_paths(self, *paths: str | os.PathLike[str]) -> SandboxPolicy:
        return replace(self, read_paths=self.read_paths + _tuple(paths))

    def with_write_paths(self, *paths: str | os.PathLike[str]) -> SandboxPolicy:
        return replace(self, write_paths=self.write_paths + _tuple(paths))

    def with_no_access(self, *paths: str | os.PathLike[str]) -> SandboxPolicy:
        return replace(self, no_access_paths=self.no_access_paths + _tuple(paths))

    def with_no_access_globs(self, *patterns: str) -> SandboxPolicy:
        return replace(self, no_access_globs=self.no_access_globs + _tuple(patterns))

    def without_protected(self, *paths: str) -> SandboxPolicy:
        """The named opt-out: ``paths`` (entries of :attr:`protected`, e.g. ``"Makefile"``) become writable where a
        grant makes them so (execspace's own ``.execspace`` stays protected)."""
        unknown = sorted(set(paths) - set(self.protected))
        if unknown:
            raise PolicyViolation(
                f"not protected, nothing to remove: {unknown}; protected: {', '.join(self.protected)}"
            )
        return replace(self, protected=tuple(p for p in self.protected if p not in paths))

    def with_network(self, enabled: bool) -> SandboxPolicy:
        return replace(self, network=enabled)

    def with_home(self, home: str | os.PathLike[str] | None) -> SandboxPolicy:
        """Bind to a host: set ``home`` (unless set) and canonicalise host paths (symlinks resolved),
        so that rules compare with the real paths enforcers and the file API see."""
        home_s = self.home or (os.fspath(home) if home else None)
        real_home = os.path.realpath(home_s) if home_s else None

        def canon(paths: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(os.path.realpath(p) if p.startswith("/") else p for p in paths)

        creds = tuple(
            os.path.realpath(c if c.startswith("/") else posixpath.join(real_home or "", c))
            for c in self.credential_paths
            if c.startswith("/") or real_home
        )
        return replace(
            self,
            read_paths=canon(self.read_paths),
            write_paths=canon(self.write_paths),
            no_access_paths=canon(self.no_access_paths),
            credential_paths=creds,
            home=real_home,
        )

    # -- facts -------------------------------------------------------------------------

    @property
    def managed(self) -> bool:
        """Whether this engine itself enforces the rules on programs (an OS sandbox runs)."""
        return self.profile in (Profile.READ_ONLY, Profile.WORKSPACE_WRITE)

    @property
    def network_enabled(self) -> bool:
        return self.network if self.network is not None else self.profile is Profile.DANGER_FULL_ACCESS

    def summary(self) -> str:
        parts = [str(self.profile), "network on" if self.network_enabled else "network off"]
        for name, values in (
            ("read grants", self.read_paths),
            ("write grants", self.write_paths),
            ("no-access paths", self.no_access_paths),
            ("no-access globs", self.no_access_globs),
        ):
            if values:
                parts.append(f"{name}: {', '.join(values)}")
        parts.append(f"protected: {', '.join(self.all_protected())}")
        return "; ".join(parts)

    def all_protected(self) -> tuple[str, ...]:
        # execspace's own directory holds the mask files: never left writable
        return tuple(dict.fromkeys((*self.protected, INTERNAL_DIR)))

    # -- rules -------------------------------------------------------------------------

    def _profile_rules(self) -> list[Rule]:
        rules = [Rule(".", Access.READ, "the workspace root is readable")]
        if self.profile is Profile.READ_ONLY:
            return rules
        rules += [Rule(d, Access.WRITE, f"{self.profile} makes {d}/ writable") for d in WRITABLE_LAYOUT]
        rules += [Rule(d, Access.READ, f"{d} is read-only to programs") for d in READ_ONLY_LAYOUT]
        return rules

    def rules(self, ws_root: str) -> tuple[list[Rule], list[Rule]]:
        """The workspace rules and the host rules for the workspace at ``ws_root``."""
        root = posixpath.normpath(ws_root)
        ws_rules = self._profile_rules()
        host_rules: list[Rule] = []
        named = (
            (self.read_paths, Access.READ, "read grant"),
            (self.write_paths, Access.WRITE, "write grant"),
            (self.no_access_paths, Access.NONE, "no-access path"),
            (self._credentials(), Access.NONE, "credential store"),
        )
        for paths, access, origin in named:
            for p in paths:
                if p.startswith("/") and is_under(p, root) and p != "/":
                    rel = posixpath.relpath(p, root)
                    ws_rules.append(Rule(rel, access, f"{origin} {p}"))
                elif p.startswith("/"):
                    host_rules.append(Rule(p, access, f"{origin} {p}"))
                else:
                    ws_rules.append(Rule(p, access, f"{origin} {p}"))
        return ws_rules, host_rules

    def _credentials(self) -> tuple[str, ...]:
        home = self.home
        if home is None:
            return tuple(c for c in self.credential_paths if c.startswith("/"))
        return tuple(c if c.startswith("/") else posixpath.join(home, c) for c in self.credential_paths)

    def glob_hit(self, rel: str) -> str | None:
        """The no-access glob that ``rel`` (or one of its parents) matches, if any."""
        if not self.no_access_globs or rel == ".":
            return None
        parts = path_parts(rel)
        for n in range(1, len(parts) + 1):
            prefix = "/".join(parts[:n])
            for g in self.no_access_globs:
                if wglob.globmatch(prefix, g, flags=_GLOB_FLAGS):
                    return g
        return None

    def protected_hit(self, rel: str) -> str | None:
        for p in self.all_protected():
            if is_under(rel, p):
                return p
        return None

    def host_protected(self, host_rules: Iterable[Rule]) -> tuple[str, ...]:
        """The protected paths under each host write grant over a directory (a project root), absolute."""
        roots = [r.target for r in host_rules if r.access is Access.WRITE and os.path.isdir(r.target)]
        names = [p for p in self.protected if p != INTERNAL_DIR]  # execspace keeps nothing of its own there
        return tuple(dict.fromkeys(posixpath.join(root, p) for root in roots for p in names))

    def resolver(self, ws_root: str) -> Resolver:
        """Resolution for one workspace, with its rules built once (for many queries)."""
        root = posixpath.normpath(ws_root)
        ws_rules, host_rules = self.rules(root)
        return Resolver(self, root, tuple(ws_rules), tuple(host_rules))

    def decide(self, ws_root: str, path: str, *, host_default: Access = Access.NONE, globs: bool = True) -> Decision:
        """The access a program has to ``path`` under this policy, and why (see :meth:`Resolver.decide`)."""
        return self.resolver(ws_root).decide(path, host_default=host_default, globs=globs)

    def access(self, ws_root: str, path: str, *, host_default: Access = Access.NONE) -> Access:
        return self.decide(ws_root, path, host_default=host_default).access

    def targets(self, ws_root: str) -> tuple[Target, ...]:
        """Every path a rule names (see :attr:`Resolver.targets`)."""
        return self.resolver(ws_root).targets


@dataclass(frozen=True)
class Resolver:
    """A policy's rules for one workspace root, built once: answers many queries cheaply."""

    policy: SandboxPolicy
    root: str
    ws_rules: tuple[Rule, ...]
    host_rules: tuple[Rule, ...]

    @functools.cached_property
    def targets(self) -> tuple[Target, ...]:
        """Every path a rule names (workspace ones first, then host ones), by depth then name,
        with the access resolved there (glob denies left out)."""
        root = self.root
        rels = {r.target for r in self.ws_rules} | set(self.policy.all_protected())
        out = [
            Target(
                root if rel == "." else posixpath.join(root, rel),
                rel,
                self.decide(rel, globs=False).access,
                self.policy.protected_hit(rel) is not None,
            )
            for rel in sorted(rels, key=lambda r: (len(path_parts(r)), r))
        ]
        hosts = sorted(
            {r.target for r in self.host_rules} | set(self.host_protected), key=lambda p: (len(path_parts(p)), p)
        )
        out += [Target(p, None, self.decide(p, globs=False).access, p in self.host_protected) for p in hosts]
        return tuple(out)

    @functools.cached_property
    def host_protected(self) -> tuple[str, ...]:
        return self.policy.host_protected(self.host_rules)

    def decide(self, path: str, *, host_default: Access = Access.NONE, globs: bool = True) -> Decision:
        """The access a program has to ``path``, and why.

        ``path`` is workspace-relative, or absolute (inside the workspace: a workspace path;
        elsewhere: a host path). ``host_default`` is the access of a host path no rule names
        (NONE: the enforcer's system view is not a rule). ``globs=False`` leaves the glob
        denies out (enforcers apply them separately, as masks or regex denies).

        Raises:
            PathDenied: a relative path that leaves the workspace.
        """
        policy = self.policy
        if policy.profile is Profile.DANGER_FULL_ACCESS:
            return Decision(Access.WRITE, "danger-full-access: no sandbox")
        rel = self._relative(path)
        if rel is None:
            host = posixpath.normpath(path)
            best = _best(self.host_rules, host)
            if best is None:
                return Decision(host_default, "no rule names this host path")
            if best.access is Access.WRITE and (p := next((h for h in self.host_protected if is_under(host, h)), None)):
                return Decision(Access.READ, f"{p!r} is protected (under a write grant): readable, never writable")
            return Decision(best.access, best.origin)
        if globs and (g := policy.glob_hit(rel)):
            return Decision(Access.NONE, f"matches the no-access glob {g!r}")
        best = _best(self.ws_rules, rel)
        if best is None:
            return Decision(Access.NONE, "no rule grants access")
        if best.access is Access.WRITE and (p := policy.protected_hit(rel)):
            return Decision(Access.READ, f"{p!r} is protected: readable, never writable")
        return Decision(best.access, best.origin)

    def access(self, path: str) -> Access:
        return self.decide(path).access

    def file_api_access(self, rel: str) -> Decision:
        """What the backend's file API may do at workspace path ``rel``: the program's access,
        except that the host may write what it manages itself (staged skills, the workspace
        record) where the program may only read it, and never touches execspace's own directory."""
        if is_under(rel, INTERNAL_DIR):
            return Decision(Access.NONE, f"{INTERNAL_DIR}/ holds execspace's own files (masks), not workspace content")
        d = self.decide(rel)
        if d.access is Access.READ and _engine_managed(rel) and not self.policy.protected_hit(rel):
            return Decision(Access.WRITE, "staged by the host (read-only to programs)")
        return d

    def _relative(self, path: str) -> str | None:
        if path.startswith("/"):
            p = posixpath.normpath(path)
            return posixpath.relpath(p, self.root) if is_under(p, self.root) else None
        p = posixpath.normpath(path) if path else "."
        if p == ".." or p.startswith("../"):
            raise PathDenied(path, "relative path leaves the workspace")
        return p


def _best(rules: tuple[Rule, ...], path: str) -> Rule | None:
    matching = [r for r in rules if is_under(path, r.target)]
    if not matching:
        return None
    return max(matching, key=lambda r: (r.specificity, _TIE_RANK[r.access]))


def _engine_managed(rel: str) -> bool:
    return is_under(rel, "skills") or rel == "metadata.json" or rel.startswith("metadata.json.")


def file_access_hook(policy: SandboxPolicy) -> FileAccessHook | None:
    """The check the backend's file API runs before each access (None: no checks, for
    ``DANGER_FULL_ACCESS``, where nothing is enforced on the program either)."""
    if policy.profile is Profile.DANGER_FULL_ACCESS:
        return None
    return FileAccessHook(policy)


class Resolvers:
    """Resolvers per workspace root, built on first use: a small cache owned by one engine."""

    _SIZE = 64

    def __init__(self, policy: SandboxPolicy) -> None:
        self.policy = policy
        self._by_root: dict[str, Resolver] = {}

    def __call__(self, root: str) -> Resolver:
        res = self._by_root.get(root)
        if res is None:
            if len(self._by_root) >= self._SIZE:
                self._by_root.clear()
            res = self._by_root[root] = self.policy.resolver(root)
        return res


class FileAccessHook:
    """Callable ``(ws, path, mode)`` raising ``PathDenied`` when the policy forbids the access.

    ``path`` is workspace-relative, or an absolute host path the operation reads from (a
    staged host tree): host paths are refused only where a rule denies them, since
    ``host_roots`` already decides which host paths may be read at all.
    """

    def __init__(self, policy: SandboxPolicy) -> None:
        self.policy = policy
        self._resolvers = Resolvers(policy)  # collect() asks once per file

    def __call__(self, ws: Workspace, path: str, mode: Literal["read", "write"]) -> None:
        if ws.host_path is None:
            raise UsageError(f"workspace {ws.id!r} has no host path; sandbox file rules need one")
        res = self._resolvers(os.path.realpath(ws.host_path))
        if path.startswith("/"):
            d = res.decide(os.path.realpath(path), host_default=Access.READ)
        else:
            d = res.file_api_access(path)
        allowed = d.access.can_write if mode == "write" else d.access.can_read
        if not allowed:
            raise PathDenied(path, f"the sandbox policy ({self.policy.profile}) forbids {mode}: {d.reason}")
