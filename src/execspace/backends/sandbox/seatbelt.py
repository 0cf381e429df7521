"""macOS: the Seatbelt (``sandbox-exec``) profile generated from a :class:`SandboxPolicy`.

The profile denies everything by default and allows, in order: process basics, the system
services ordinary programs need, metadata on the ancestors of every granted path, reads of
the platform's system directories and the policy's read roots, writes to its write roots,
and the network only when enabled. Denials never rely on rule order: each allow carries
``require-not`` carve-outs for the less-permitted paths beneath it, so "most specific wins"
holds whatever order Seatbelt evaluates rules in. No-access globs become anchored regex
denies (hard denies, as on Linux), and renames of the directories that lead to a denied or
protected path are refused, because Seatbelt judges paths, not files: moving a parent would
carry the file out from under its rule.

:func:`build_profile` is a pure function (no file system access) so that its output is
deterministic and covered by golden tests on any OS. :func:`seatbelt_runner` and
:func:`probe_seatbelt` run ``/usr/bin/sandbox-exec`` and work on macOS only; they cannot be
exercised on the Linux machines our CI uses.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import posixpath
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ...artifacts import ArtifactService
from ...capabilities import Capabilities, Isolation
from ...engine import BaseEngine
from ...envpolicy import EnvPolicy
from ...errors import PolicyViolation
from ...languages import available_languages
from ...process.hostrunner import HostRunner
from ...process.preparation import PreparedRun
from ...process.rlimits import RLIMIT_ENFORCED
from ...process.supervisor import Launch
from ...registry import Probe
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager
from .policy import Access, SandboxPolicy, Target, file_access_hook, is_under

__all__ = [
    "SANDBOX_EXEC",
    "build_profile",
    "glob_to_regex",
    "in_seatbelt",
    "probe_seatbelt",
    "seatbelt_capabilities",
    "seatbelt_engine",
    "seatbelt_runner",
]

SANDBOX_EXEC = "/usr/bin/sandbox-exec"

#: Read-only system locations programs load code and data from (dyld, frameworks, toolchains).
PLATFORM_READ_ROOTS = (
    "/Applications",
    "/Library/Apple",
    "/Library/Developer",
    "/Library/Filesystems/NetFSPlugins",
    "/Library/Frameworks",
    "/Library/Preferences",
    "/System/Cryptexes",
    "/System/Library/CoreServices",
    "/System/Library/Frameworks",
    "/System/Library/PrivateFrameworks",
    "/System/Library/SubFrameworks",
    "/System/Volumes/Preboot/Cryptexes",
    "/bin",
    "/etc",
    "/opt/homebrew",
    "/opt/local",
    "/private/etc",
    "/private/var/db",
    "/private/var/select",
    "/sbin",
    "/usr/bin",
    "/usr/lib",
    "/usr/libexec",
    "/usr/local/Cellar",
    "/usr/local/bin",
    "/usr/local/lib",
    "/usr/local/opt",
    "/usr/local/share",
    "/usr/sbin",
    "/usr/share",
    "/var/db",
    "/var/select",
)

_READ_OPS = "file-read* file-map-executable file-test-existence"

_BASE = """\
(version 1)
(deny default)

; processes: this sandbox's own only
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))

; system services ordinary programs need (user lookup, preferences, locale)
(allow sysctl-read)
(allow sysctl-write (sysctl-name "kern.grade_cputype"))
(allow iokit-open (iokit-registry-entry-class "RootDomainUserClient"))
(allow mach-lookup
    (global-name "com.apple.PowerManagement.control")
    (global-name "com.apple.bsd.dirhelper")
    (global-name "com.apple.cfprefsd.agent")
    (global-name "com.apple.cfprefsd.daemon")
    (global-name "com.apple.system.DirectoryService.libinfo_v1")
    (global-name "com.apple.system.opendirectoryd.libinfo")
    (global-name "com.apple.system.opendirectoryd.membership"))
(allow user-preference-read)
(allow ipc-posix-sem)
(allow ipc-posix-shm-read* (ipc-posix-name-prefix "apple.cfprefs."))

; terminals and the harmless devices
(allow pseudo-tty)
(allow file-read* file-write-data file-ioctl
    (literal "/dev/null")
    (literal "/dev/zero")
    (literal "/dev/tty")
    (literal "/dev/ptmx")
    (regex "^/dev/ttys[0-9]+$")
    (regex "^/dev/fd/[0-9]+$"))
(allow file-read* (literal "/dev/random") (literal "/dev/urandom"))
(allow file-read-metadata (subpath "/dev"))

; the root directory, and the /var /tmp /etc links into /private
(allow file-read* (literal "/"))
(allow file-read-metadata (literal "/var") (literal "/tmp") (literal "/etc"))"""

_NETWORK_ON = """\
; network: enabled
(allow network-outbound)
(allow network-inbound)
(allow network-bind)
(allow system-socket)
(allow mach-lookup
    (global-name "com.apple.SecurityServer")
    (global-name "com.apple.dnssd.service")
    (global-name "com.apple.SystemConfiguration.DNSConfiguration")
    (global-name "com.apple.SystemConfiguration.configd")
    (global-name "com.apple.networkd")
    (global-name "com.apple.ocspd")
    (global-name "com.apple.trustd")
    (global-name "com.apple.trustd.agent"))
(allow file-read* file-write* (literal "/private/var/run/mDNSResponder"))"""

_NETWORK_OFF = """\
; network: restricted (no socket may reach a network or a host daemon's unix socket)"""

# ERE metacharacters: escaped with a backslash wherever a literal character is meant
_REGEX_SPECIAL = frozenset(".^$*+?()[]{}|\\")


def _sb_string(value: str) -> str:
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise PolicyViolation(f"path {value!r} contains a control character; Seatbelt profiles cannot name it")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def _bracket(component: str, i: int) -> tuple[str, int] | None:
    """Translate the ``[...]`` class at ``component[i]``; None when it does not close (a literal ``[``)."""
    j = i + 1
    negate = j < len(component) and component[j] in "!^"
    if negate:
        j += 1
    start = j
    if j < len(component) and component[j] == "]":
        j += 1  # a leading ']' is a member, not the end
    end = component.find("]", j)
    if end < 0:
        return None
    body = component[start:end]
    if any(c in body for c in "\\[/"):
        raise PolicyViolation(f"no-access glob class {component[i : end + 1]!r}: '\\', '[' and '/' are not supported")
    # a class never matches a separator, negated or not
    return ("[^" + body + "/]" if negate else "[" + body + "]"), end + 1


def _component(component: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(component):
        c = component[i]
        if c == "*":
            while i < len(component) and component[i] == "*":
                i += 1  # '**' inside a name is a plain '*'
            out.append("[^/]*")
            continue
        if c == "?":
            out.append("[^/]")
        elif c == "[" and (cls := _bracket(component, i)) is not None:
            out.append(cls[0])
            i = cls[1]
            continue
        elif c == "\\" and i + 1 < len(component):
            i += 1
            out.append(_regex_literal(component[i]))
        else:
            out.append(_regex_literal(c))
        i += 1
    return "".join(out)


def glob_to_regex(glob: str) -> str:
    """The unanchored regex (POSIX ERE, also valid Python) of a workspace-relative glob, with the
    meaning ``wcmatch`` gives it under GLOBSTAR|DOTGLOB: ``**`` as a whole component spans
    directories (none included), ``*`` and ``?`` stay inside one, ``[...]`` classes never match ``/``."""
    parts = glob.split("/")
    out: list[str] = []
    for n, comp in enumerate(parts):
        last = n == len(parts) - 1
        if comp == "**":
            out.append(".*" if last else "(.*/)?")
        else:
            out.append(_component(comp) + ("" if last else "/"))
    return "".join(out)


def glob_deny_regex(ws_root: str, glob: str) -> str:
    """Anchored regex for the absolute paths a glob denies: a match and everything below it."""
    return f"^{_regex_literal(ws_root.rstrip('/'))}/{glob_to_regex(glob)}(/.*)?$"


def _ancestors(path: str) -> list[str]:
    out = []
    p = posixpath.dirname(path)
    while p not in ("/", ""):
        out.append(p)
        p = posixpath.dirname(p)
    return out


def _nearest(path: str, levels: dict[str, Access]) -> Access | None:
    """Access of the nearest strict ancestor of ``path`` that has a level of its own."""
    for anc in _ancestors(path):
        if anc in levels:
            return levels[anc]
    return levels.get("/") if path != "/" else None


def _filter(root: str, carve: Iterable[str]) -> str:
    holes = sorted(set(carve))
    if not holes:
        return f"(subpath {_sb_string(root)})"
    nots = " ".join(f"(require-not (subpath {_sb_string(h)}))" for h in holes)
    return f"(require-all (subpath {_sb_string(root)}) {nots})"


def _rule(action: str, ops: str, filters: Sequence[str]) -> str:
    return f"({action} {ops}\n" + "\n".join(f"    {f}" for f in filters) + ")"


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    """Targets reduced to the roots a profile grants, with their carve-outs."""

    levels: dict[str, Access]
    read_roots: list[str]
    write_roots: list[str]
    protected: list[str]


def _layout(targets: Sequence[Target], tmpdir: str | None) -> _Layout:
    levels = {t.path: t.access for t in targets}
    for p in PLATFORM_READ_ROOTS:
        # the system view is a default, not a rule: a rule on the path or above it decides instead
        if not any(is_under(p, t) for t in levels):
            levels[p] = Access.READ
    if tmpdir:
        levels[tmpdir] = Access.WRITE
    paths = sorted(levels)
    reads = [p for p in paths if levels[p].can_read and not (_nearest(p, levels) or Access.NONE).can_read]
    writes = [p for p in paths if levels[p].can_write and not (_nearest(p, levels) or Access.NONE).can_write]
    protected = sorted(t.path for t in targets if t.protected)
    return _Layout(levels, reads, writes, protected)


def _carve(root: str, levels: dict[str, Access], *, write: bool) -> list[str]:
    """The outermost paths under ``root`` whose own level does not allow the access ``root`` grants."""

    def allowed(a: Access) -> bool:
        return a.can_write if write else a.can_read

    holes = [p for p, a in levels.items() if p != root and is_under(p, root) and not allowed(a)]
    # a hole inside another hole adds nothing: this allow never reaches below the outer one
    return [h for h in holes if not any(o != h and is_under(h, o) for o in holes)]


def _move_guards(lay: _Layout, ws_root: str, globs: Sequence[str]) -> list[str]:
    """Directories whose rename would move a denied, read-only or protected path out from under its rule."""
    # read-only and denied paths alike: moved elsewhere, they would be writable or readable there
    guarded = [p for p, acc in lay.levels.items() if not acc.can_write] + lay.protected
    for g in globs:
        literal: list[str] = []
        for c in g.split("/")[:-1]:
            if any(ch in c for ch in "*?[\\"):
                break
            literal.append(c)
        guarded.append(posixpath.join(ws_root, *literal, "x"))  # the base itself must not move either
    out: set[str] = set()
    for path in guarded:
        for anc in _ancestors(path):
            if any(is_under(anc, w) for w in lay.write_roots):
                out.add(anc)
    return sorted(out)


def build_profile(policy: SandboxPolicy, ws_root: str, *, home: str | None = None, tmpdir: str | None = None) -> str:
    """The Seatbelt profile enforcing ``policy`` for the workspace at ``ws_root``.

    Pure and deterministic. Pass canonical paths (symlinks resolved, e.g. ``/private/var/...``):
    Seatbelt compares real paths.

    Args:
        home: host HOME for relative ``credential_paths`` (unless the policy has one).
        tmpdir: an extra writable directory for the program's temporary files (the runner
            passes a private one when the workspace's ``tmp/`` is not writable).

    Raises:
        PolicyViolation: a profile that runs nothing here (danger-full-access, external),
            or paths Seatbelt cannot name.
    """
    if not policy.managed:
        raise PolicyViolation(f"the {policy.profile} profile has no Seatbelt profile: nothing is sandboxed")
    if not ws_root.startswith("/"):
        raise PolicyViolation(f"workspace root must be absolute, got {ws_root!r}")
    if home and policy.home is None:
        policy = dataclasses.replace(policy, home=home)
    root = posixpath.normpath(ws_root)
    lay = _layout(policy.targets(root), posixpath.normpath(tmpdir) if tmpdir else None)
    sections = [f"; execspace sandbox profile: {policy.summary()}".replace("\n", " "), _BASE]
    anc = sorted({a for p in [*lay.read_roots, *lay.write_roots] for a in _ancestors(p)})
    if anc:
        lines = ["; metadata on the way to every granted path: realpath() and getcwd() walk it"]
        lines.append(_rule("allow", "file-read-metadata", [f"(literal {_sb_string(a)})" for a in anc]))
        sections.append("\n".join(lines))
    reads = [_filter(r, _carve(r, lay.levels, write=False)) for r in lay.read_roots]
    sections.append(
        "; reads: system directories and read grants, minus no-access paths\n" + _rule("allow", _READ_OPS, reads)
    )
    if lay.write_roots:
        writes = [_filter(w, _carve(w, lay.levels, write=True)) for w in lay.write_roots]
        sections.append(
            "; writes: write grants, minus read-only, protected and no-access paths\n"
            + _rule("allow", "file-write*", writes)
        )
    if policy.no_access_globs:
        rx = [f"(regex {_sb_string(glob_deny_regex(root, g))})" for g in policy.no_access_globs]
        sections.append(
            "; no-access globs: hard denies, whatever is granted\n" + _rule("deny", f"{_READ_OPS} file-write*", rx)
        )
    guards = _move_guards(lay, root, policy.no_access_globs)
    if guards:
        sections.append(
            "; no renaming of the directories leading to denied or protected paths\n"
            + _rule("deny", "file-write-unlink", [f"(literal {_sb_string(g)})" for g in guards])
        )
    sections.append(_NETWORK_ON if policy.network_enabled else _NETWORK_OFF)
    return "\n\n".join(sections) + "\n"


# -- running (macOS only) -------------------------------------------------------------------------


def seatbelt_runner(
    policy: SandboxPolicy,
    *,
    network_default: bool,
    capabilities: Callable[[], Capabilities],
    env_policy: EnvPolicy | None,
    kill_grace: float,
) -> HostRunner:
    """A host runner that runs each program under ``sandbox-exec -p <profile>`` (:func:`in_seatbelt`).

    macOS only, and not exercised by our test suite (CI runs Linux): the profile it passes is
    the one :func:`build_profile` makes, which the golden tests cover. The program sees the
    workspace at its real host path (Seatbelt confines in place; nothing is remounted).
    """
    return HostRunner(
        capabilities,
        env_policy,
        kill_grace=kill_grace,
        program_root=lambda ws: os.path.realpath(str(ws.host_path)),
        wrappers=[functools.partial(in_seatbelt, policy, network_default)],
    )


def in_seatbelt(policy: SandboxPolicy, network_default: bool, prep: PreparedRun, launch: Launch) -> Launch:
    """The wrapper of :func:`seatbelt_runner`: ``launch`` under ``sandbox-exec`` with ``policy``'s profile, for the
    run's network; a read-only workspace's temporary files in a private directory removed after the run."""
    network = network_default if prep.spec.network is None else prep.spec.network == "on"
    root = os.path.realpath(prep.root)
    policy = policy.with_network(network)
    env = dict(launch.env)
    tmpdir = None
    if not policy.access(root, "tmp").can_write:
        tmpdir = os.path.realpath(tempfile.mkdtemp(prefix="execspace-sb-"))
        env.update(TMPDIR=tmpdir, TMP=tmpdir, TEMP=tmpdir)
    profile = build_profile(policy, root, tmpdir=tmpdir)
    if tmpdir is not None:
        launch.stack.callback(functools.partial(shutil.rmtree, tmpdir, ignore_errors=True))
    return dataclasses.replace(launch, argv=[SANDBOX_EXEC, "-p", profile, "--", *launch.argv], env=env)


def probe_seatbelt() -> Probe:
    """Check that ``sandbox-exec`` exists and runs ``/usr/bin/true`` under a generated profile."""
    if not os.path.exists(SANDBOX_EXEC):
        return Probe(False, f"{SANDBOX_EXEC} is missing", "sandbox-exec ships with macOS; reinstall the OS tools")
    with tempfile.TemporaryDirectory(prefix="execspace-probe-") as tmp:
        root = os.path.realpath(tmp)
        for d in ("work", "out", "tmp", "home"):
            Path(root, d).mkdir()
        profile = build_profile(SandboxPolicy(), root)
        try:
            proc = subprocess.run(
                [SANDBOX_EXEC, "-p", profile, "--", "/usr/bin/true"],
                capture_output=True,
                text=True,
                timeout=5,
                cwd=root,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, f"sandbox-exec could not run: {exc}", "check that sandbox-exec is executable")
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return Probe(False, f"sandbox-exec refused the profile: {err[0]}", "report this as a bug")
    return Probe(True, f"Seatbelt via {SANDBOX_EXEC}")


def seatbelt_capabilities(policy: SandboxPolicy, env_policy: EnvPolicy | None) -> Capabilities:
    path = (env_policy or EnvPolicy()).program_path(os.environ)
    # macOS ignores RLIMIT_AS: memory is not claimed; nothing here limits the process count
    limits = {"timeout", "output_bytes", "disk_bytes"} | (RLIMIT_ENFORCED - {"memory_bytes"})
    return Capabilities(
        backend="sandbox",
        isolation=Isolation.PROCESS,
        network_control=True,
        network_default=policy.network_enabled,
        clean_env=True,
        read_only_mounts=True,
        streaming=True,
        host_paths=True,
        enforced_limits=frozenset(limits),
        languages=available_languages(path),
        does_not_protect=(
            "kernel and Seatbelt vulnerabilities: the boundary is the macOS sandbox kext",
            "reading the system directories a program needs (/usr, /System, /Library…)",
            "the program runs as your user: Seatbelt decides by path, not by file ownership",
            "with network on: anything reachable from this host",
            "memory (RLIMIT_AS is ignored by macOS) and process count are not limited",
        ),
        details={"boundary": f"Seatbelt ({SANDBOX_EXEC}), deny by default", "profile": policy.summary()},
    )


def seatbelt_engine(
    policy: SandboxPolicy,
    root: Path,
    caps: Capabilities,
    env_policy: EnvPolicy | None,
    host_roots: Sequence[Path | str],
    artifacts: ArtifactService | None,
    kill_grace: float,
) -> BaseEngine:
    """The sandbox engine on macOS (see :func:`seatbelt_runner`: not exercised by our CI)."""
    fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots, access=file_access_hook(policy))
    runner = seatbelt_runner(
        policy,
        network_default=policy.network_enabled,
        capabilities=lambda: caps,
        env_policy=env_policy,
        kill_grace=kill_grace,
    )
    manager = HostWorkspaceManager("sandbox", root, stop_programs=runner.stop_programs)
    return BaseEngine("sandbox", manager, fs, runner, caps)
