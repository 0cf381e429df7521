"""The one run-preparation step every runner shares, and the exit codes every backend reports alike.

Whatever finally starts the program (a host process, bubblewrap or Seatbelt around one, an exec in a container, a
process on another machine), what it gets is decided here, once: the spec is checked against the backend's
capabilities, the cwd and the run directory are made (fd-relative: the workspace is the program's to change), the
environment is built by the policy, and a bare name is looked up on the run's ``PATH`` as the program will see it:
:class:`~execspace.errors.CommandNotFound` (127) when it is not there, as a shell says. A runner then turns the
:class:`PreparedRun` into what it starts (for host processes, :meth:`~.hostrunner.HostRunner.wrap`).

Exit codes, on every backend: 127 a program that does not exist, 126 one that cannot be executed (both one typed
error, :class:`~execspace.errors.CannotExecute`, which ``start_program`` raises and :func:`not_started` makes the
result of ``run_program``), ``-N`` a program killed by signal N (a wrapper that can only say ``128 + N`` is mapped
back by :func:`signal_status`); the CLI turns ``-N`` into ``128 + N`` and a timeout into 124.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import os
import posixpath
import pwd
import secrets
import shlex
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..capabilities import Capabilities
from ..environments.hints import PYTHON_HINT
from ..envpolicy import EnvPolicy
from ..errors import (
    BackendError,
    CannotExecute,
    CommandNotFound,
    NotExecutable,
    PathDenied,
    UsageError,
    UserNotFound,
    WorkspaceNotFound,
)
from ..models import RunProgramSpec, RunResult, Workspace
from ..workspace.confine import ConfinedRoot, split_relpath
from ..workspace.layers import own_changes
from ..workspace.layout import new_run_name, workspace_env
from ..workspace.programpaths import bound_path, workspace_relative
from .supervisor import RUN_MARKER_VAR

__all__ = [
    "PreparedRun",
    "ProgramLookup",
    "RunPreparation",
    "exec_error",
    "finish_run",
    "host_user_exists",
    "lookup_on_path",
    "lookup_where_it_runs",
    "not_started",
    "signal_status",
]

_RUN_NAME_DRAWS = 8
#: ``(command, the run's PATH) -> program to start``, or None when it is not there (a 127).
ProgramLookup = Callable[[str, str], "str | None"]


def lookup_on_path(cmd: str, path: str) -> str | None:
    """Look a bare name up on the *run's* PATH (never the caller's); a path is started as given."""
    return cmd if "/" in cmd else shutil.which(cmd, path=path)


def _split_hint(spec: RunProgramSpec) -> str:
    """For a command line given as one program name: the way to say it."""
    try:
        words = shlex.split(spec.cmd)
    except ValueError:
        words = spec.cmd.split()
    if len(words) < 2 or spec.args:
        return ""
    return (
        f"; cmd is one program, its arguments go in args: RunProgramSpec({words[0]!r}, {words[1:]!r}), "
        f"or RunProgramSpec('sh', ['-c', {spec.cmd!r}]) for a shell command line"
    )


def host_user_exists(name: str) -> bool:
    """Whether this host's passwd has a user ``name`` (what a local program, or a sandbox showing the host's
    ``/etc``, would find)."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def lookup_where_it_runs(cmd: str, path: str) -> str | None:
    """No lookup here: what starts the program looks it up where it runs (a container runtime reports 127 itself)."""
    return cmd


@dataclass(frozen=True, slots=True)
class PreparedRun:
    """A run after the policy checks, before a runner starts it: everything a wrapper needs."""

    ws: Workspace
    root: Path
    """The workspace's host directory."""
    spec: RunProgramSpec
    argv: list[str]
    """The program (looked up) and its arguments."""
    env: dict[str, str]
    """The run's whole environment (the run marker included)."""
    cwd_rel: str
    """The working directory relative to the workspace root ("" for the root itself), made."""
    run_dir: str
    """Workspace-relative directory of this run (``runs/…``), made (unless ``run_dir_made`` is false)."""
    marker: str
    """The value of ``EXECSPACE_RUN`` in the run's processes: how escaped descendants are found."""
    run_dir_made: bool = True
    """False when what starts the program makes ``run_dir`` (see :meth:`RunPreparation.prepare`)."""
    cwd_view: str = ""
    """The working directory as the program sees it when the run named it through a program bind
    (``/home/user/sub``: see :attr:`~execspace.models.Workspace.program_binds`) or outside the workspace
    (``/usr/bin``, a granted host directory: a runner that shows more than the workspace), else ``""``."""

    cwd_outside: bool = False
    """The working directory is outside the workspace (``cwd_view``, as the program sees it), made by nobody."""

    @property
    def host_cwd(self) -> str:
        """Where a program of the host itself starts (a wrapper starts from the workspace root and enters the
        program's own cwd itself)."""
        if self.cwd_outside:
            return self.cwd_view
        return str(self.root / self.cwd_rel) if self.cwd_rel else str(self.root)

    def program_cwd(self, program_root: str) -> str:
        """The working directory as the program sees it, its workspace being at ``program_root``."""
        if self.cwd_view:
            return self.cwd_view
        return f"{program_root}/{self.cwd_rel}" if self.cwd_rel else program_root


class RunPreparation:
    """Prepares runs in host-directory workspaces: capability check, cwd, run directory, environment, lookup.

    Args:
        capabilities: what the backend enforces (a run asking for more raises ``CapabilityError``).
        env_policy: how the environment is built (default :class:`EnvPolicy`).
        host_env: the variables the policy starts from (default: this process's; ``{}`` where the host's
            environment is not the program's, e.g. a container).
        owner: uid/gid for the directories made for a run (the sandbox uid when we run as root).
        program_root: the workspace root as the program sees it (default: its host path).
        lookup: how the program is found (default :func:`lookup_on_path`, on the run's PATH).
        path_view: the run's PATH as the program sees it (the sandbox drops the entries it hides): what the
            program gets, what the lookup searches and what a "not found" names.
        user_exists: whether a user of that name exists where the program runs (its passwd): a run naming one
            that does not is :class:`~execspace.errors.UserNotFound` (126, as ``docker exec -u`` says); one that
            exists but is not among the backend's ``Capabilities.users`` stays a ``CapabilityError``.
    """

    def __init__(
        self,
        capabilities: Callable[[], Capabilities],
        env_policy: EnvPolicy | None = None,
        *,
        host_env: Mapping[str, str] | None = None,
        owner: Callable[[Workspace], tuple[int, int] | None] | None = None,
        program_root: Callable[[Workspace], str] | None = None,
        lookup: ProgramLookup = lookup_on_path,
        path_view: Callable[[str], str] | None = None,
        user_exists: Callable[[str], bool] | None = None,
    ) -> None:
        self._caps = capabilities
        self._user_exists = user_exists
        self._path_view = path_view
        self.env_policy = env_policy or EnvPolicy()
        self._host_env = host_env
        self._owner_of = owner
        self._program_root = program_root
        self._lookup = lookup

    def with_lookup(self, lookup: ProgramLookup, path_view: Callable[[str], str] | None) -> RunPreparation:
        """The same preparation with another program lookup and PATH view (a run in another environment)."""
        clone = copy.copy(self)
        clone._lookup, clone._path_view = lookup, path_view
        return clone

    def program_root(self, ws: Workspace) -> str:
        """The workspace root as the program sees it."""
        return self._program_root(ws) if self._program_root is not None else str(ws.host_path)

    def owner(self, ws: Workspace) -> tuple[int, int] | None:
        return self._owner_of(ws) if self._owner_of is not None else None

    def prepare(self, ws: Workspace, spec: RunProgramSpec, *, make_run_dir: bool = True) -> PreparedRun:
        """Check ``spec``, make its cwd and run directory, build its environment and find its program.

        ``make_run_dir=False``: only the run directory's name is drawn; what starts the program makes it (a
        sandbox session's supervisor, while the host goes on), or :meth:`make_run_dir` when it cannot.

        Raises:
            CommandNotFound: the command does not exist (its run directory is made all the same).
            UserNotFound: the spec names a user that does not exist where the program runs (``user_exists``).
            CapabilityError: the spec asks for what the backend cannot enforce.
            PathDenied: the cwd leaves the workspace (but for an absolute one where the backend takes one:
                ``Capabilities.absolute_paths``; what starts the program enters it, nothing is made for it).
            UsageError: ``ws`` is not a host-directory workspace.
            WorkspaceNotFound: its directory is gone (the workspace was cleaned up).
        """
        self._check_user(spec)
        self._caps().require(spec)
        if ws.host_path is None:
            raise UsageError(f"workspace {ws.id!r} is not a host workspace")
        root = ws.host_path
        outside = self._outside_cwd(ws, spec.cwd)
        cwd_parts = [] if outside else self._cwd_parts(workspace_relative(ws, spec.cwd))
        try:
            confined = ConfinedRoot(str(root), self.owner(ws))
        except FileNotFoundError:
            raise WorkspaceNotFound(
                f"workspace {ws.id!r} no longer exists at {root} (it was cleaned up): "
                "create it again with manager.create_workspace()"
            ) from None
        with confined as cr:
            # fd-relative: a program that swapped runs/ (or a cwd on the way) for a symlink cannot make us
            # create directories elsewhere
            if cwd_parts:
                os.close(cr.open_dir(cwd_parts, create=True))
            run_dir = _make_run_dir(cr) if make_run_dir else new_run_name()
        marker = secrets.token_hex(8)
        env = self.env_policy.build(
            self._host_env if self._host_env is not None else os.environ,
            spec.env,
            workspace_env(self.program_root(ws), run_dir),
            clean=spec.clean_env,
        )
        env[RUN_MARKER_VAR] = marker
        if self._path_view is not None:
            env["PATH"] = self._path_view(env["PATH"])
        program = self._lookup(spec.cmd, env["PATH"])
        if program is None:
            searched = f"searched the run's PATH={env['PATH']}"
            msg = f"execspace: command not found: {spec.cmd!r} ({searched}){_split_hint(spec)}"
            if spec.cmd == "python" and self._lookup("python3", env["PATH"]) is not None:
                msg += PYTHON_HINT
            if not make_run_dir:
                self._make_named_run_dir(ws, run_dir)
            raise CommandNotFound(spec.cmd, msg, errno.ENOENT, run_dir)
        argv = [program, *spec.args]
        cwd_rel, cwd_view = "/".join(cwd_parts), outside or bound_path(ws, spec.cwd)
        return PreparedRun(ws, root, spec, argv, env, cwd_rel, run_dir, marker, make_run_dir, cwd_view, bool(outside))

    def make_run_dir(self, prep: PreparedRun) -> None:
        """Make the run directory ``prep`` named and did not make (``make_run_dir=False``), fd-relative as
        :meth:`prepare` makes it.

        Raises:
            BackendError: it exists already.
            PathDenied: ``runs/`` is a symlink or not a directory.
        """
        self._make_named_run_dir(prep.ws, prep.run_dir)

    def _make_named_run_dir(self, ws: Workspace, run_dir: str) -> None:
        assert ws.host_path is not None
        with ConfinedRoot(str(ws.host_path), self.owner(ws)) as cr:
            try:
                cr.make_new_dir(split_relpath(run_dir))
            except FileExistsError:
                # its name was drawn, and its environment built, before it was made: too late to draw again
                raise BackendError(
                    f"the run directory {run_dir} of workspace {ws.id!r} exists already (a program made it?); "
                    "run the program again"
                ) from None

    def _check_user(self, spec: RunProgramSpec) -> None:
        user = spec.user
        if user is None or self._user_exists is None or user in self._caps().users or self._user_exists(user):
            return
        raise UserNotFound(
            spec.cmd,
            f"execspace: cannot run {spec.cmd!r} as {user!r}: no such user where the program runs (leave user unset "
            "to run as the backend's own user)",
            errno.EINVAL,
        )

    def _outside_cwd(self, ws: Workspace, cwd: str) -> str:
        """``cwd`` normalised when it is an absolute path outside the workspace (and its program binds) that this
        runner's programs see (``Capabilities.absolute_paths``), else ``""``."""
        if not cwd.startswith("/") or self._caps().absolute_paths == "workspace" or bound_path(ws, cwd):
            return ""
        path = posixpath.normpath(cwd)
        root = ws.path.rstrip("/")
        inside = bool(root) and (path == root or path.startswith(root + "/"))
        return "" if inside else path

    @staticmethod
    def _cwd_parts(cwd: str) -> list[str]:
        if not cwd or cwd in (".", "./"):
            return []
        try:
            return split_relpath(cwd)
        except PathDenied as exc:
            raise PathDenied(cwd, f"cwd must stay inside the workspace ({exc.reason})") from exc


def _make_run_dir(cr: ConfinedRoot) -> str:
    """A new directory under ``runs/``, its own: runs that start in the same second rarely draw the same name,
    and then the later one draws again."""
    for _ in range(_RUN_NAME_DRAWS - 1):
        run_dir = new_run_name()
        with contextlib.suppress(FileExistsError):
            cr.make_new_dir(split_relpath(run_dir))
            return run_dir
    run_dir = new_run_name()
    cr.make_new_dir(split_relpath(run_dir))
    return run_dir


async def finish_run(prep: PreparedRun, result: RunResult) -> RunResult:
    """The checks after every run, whatever ran it: ``max_disk_bytes`` of the whole workspace tree."""
    cap = prep.ws.policy.max_disk_bytes
    if cap is not None:
        used = await asyncio.to_thread(_disk_usage, str(prep.root))
        if used > cap and result.limit_hit is None:
            result = replace(result, limit_hit="disk_bytes")
    return result


def _disk_usage(root: str) -> int:
    # a copy-on-write fork pays for its own changes, not for the snapshot it shares with its siblings
    with ConfinedRoot(str(own_changes(Path(root)))) as cr:
        return cr.disk_usage()


def exec_error(prep: PreparedRun, exc: OSError) -> CannotExecute | None:
    """What an exec's failure (``exc``) means for ``prep``'s program: it does not exist (127) or cannot be executed
    (126), as a shell reports it; a working directory outside the workspace that is not there (126: nothing of the
    program ran, and nothing made that directory); None for other errors."""
    if prep.cwd_outside and exc.errno in (errno.ENOENT, errno.ENOTDIR):
        # what entered the directory and exec'd (a sandbox's supervisor) may not say which of the two failed
        which = "the working directory" if exc.filename == prep.cwd_view else "the working directory, or the program,"
        return NotExecutable(
            prep.spec.cmd,
            f"execspace: cannot start {prep.spec.cmd!r} in {prep.cwd_view}: {exc.strerror} ({which} is missing as the "
            "program sees it; a working directory outside the workspace is never made)",
            exc.errno,
            prep.run_dir,
        )
    if exc.errno == errno.ENOENT:
        error: type[CannotExecute] = CommandNotFound
        hint = _not_found_hint(prep)
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR):
        error, hint = NotExecutable, " (is it executable, with a valid #! line?)"
    else:
        return None
    msg = f"execspace: cannot execute {prep.spec.cmd!r}: {exc.strerror}{hint}"
    return error(prep.spec.cmd, msg, exc.errno, prep.run_dir)


def _not_found_hint(prep: PreparedRun) -> str:
    """Why the exec of ``prep``'s program found no file. A relative path (``./x``) starts from the run's working
    directory, in the workspace: a caller who meant a file of their current directory is told so, rather than sent
    to look at a ``#!`` line."""
    cmd = prep.spec.cmd
    if "/" in cmd and not os.path.isabs(cmd) and not os.path.lexists(os.path.join(prep.host_cwd, cmd)):
        return (
            f" (no such file in the run's working directory {prep.host_cwd}: a relative path starts from there, in "
            "the workspace, not from your current directory; stage the file into the workspace (CLI: --input; library: "
            "stage_inputs), or give its absolute path)"
        )
    return " (if the file exists, the interpreter on its #! line is missing)"


def not_started(error: CannotExecute) -> RunResult:
    """The result of a run whose program could not be started: its exit code, its message as stderr."""
    msg = f"{error}\n"
    return RunResult(error.exit_code, "", msg, 0.0, raw_stderr=msg.encode(), run_dir=error.run_dir)


#: The highest signal number: ``128 + N`` above it is an ordinary exit code.
_MAX_SIGNAL = max(signal.valid_signals())


def signal_status(code: int) -> int:
    """``-N`` for ``128 + N``: what a wrapper that outlives its program (bubblewrap, a container runtime) exits
    with when the program was killed by signal N, reported as the local backend reports it.

    Such a wrapper says ``128 + N`` either way, so a program that itself exits with ``128 + N`` is reported as
    killed by N too (as a shell's ``$?`` cannot tell them apart either).
    """
    return 128 - code if 128 < code <= 128 + _MAX_SIGNAL else code
