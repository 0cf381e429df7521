"""The execspace exception tree.

Every error execspace raises derives from :class:`ExecspaceError`. A non-zero exit
code of the program is *not* an error: it is a :class:`~execspace.models.RunResult`.

::

    ExecspaceError
    ├── UsageError                  misuse of the API: bad argument, engine closed
    │   └── InvalidSpec             a spec/model that cannot be valid (empty cmd, negative limit)
    ├── PolicyViolation             a request that the active policy forbids
    │   ├── CapabilityError         the backend cannot enforce what was asked: fails closed
    │   └── UnsupportedLanguage     no runtime for a code block's language
    ├── PathDenied                  a path leaves the workspace or breaks a file rule (also PermissionError)
    │   └── PathIsDirectory         a file operation met a directory (also IsADirectoryError)
    ├── LimitExceeded               a file-count / byte cap on staging or collection was hit
    ├── SetupFailed                 the backend cannot start here (missing binary, daemon, kernel…)
    ├── UnsupportedBackend          unknown backend, or one that cannot exist on this platform
    ├── EnvironmentNotFound         no environment of that name is built (also LookupError)
    ├── EnvironmentBuildFailed      building an environment failed (a package that does not exist…)
    ├── EnvironmentBuilding         an environment a request needs is being built now: retry shortly
    ├── WorkspaceNotFound           no workspace with that id / path (also LookupError)
    ├── WorkspaceFileNotFound       no file at that path in the workspace (also FileNotFoundError)
    ├── SnapshotNotFound            no snapshot with that id / name on the workspace root (also LookupError)
    ├── ProgramNotFound             no running program with that pid / tag in the workspace (also LookupError)
    ├── ArtifactNotFound            no artifact with that name / version (also LookupError)
    ├── TaskNotFound                execspace mcp: no task with that id, or past its time to live (also LookupError)
    ├── InputError                  an input reference that cannot be resolved (bad scheme, missing source)
    ├── CannotExecute               a run's program could not be started (also OSError); carries its exit code
    │   ├── CommandNotFound         it does not exist where it would run: 127 (also FileNotFoundError)
    │   ├── NotExecutable           it cannot be executed there: 126 (also PermissionError)
    │   └── UserNotFound            the user it names does not exist where it would run: 126 (also LookupError)
    ├── ExecutionTimeout            a run exceeded its deadline (also TimeoutError); carries the partial result
    ├── ProgramFailed               raised only on request (check=True); carries the result
    └── BackendError                the backend failed while running (daemon died, kernel crashed…)
        ├── FreezeFailed            a workspace's programs could not all be held still (snapshot, pause)
        ├── PartialOutputCommit     outputs were collected but their record could not be written
        └── SandboxLost             a remote sandbox expired or was killed: what it held is gone

Each message says what happened and what to do next.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import OutputManifest, RunResult

__all__ = [
    "ArtifactNotFound",
    "BackendError",
    "CannotExecute",
    "CapabilityError",
    "CommandNotFound",
    "EnvironmentBuildFailed",
    "EnvironmentBuilding",
    "EnvironmentNotFound",
    "ExecspaceError",
    "ExecutionTimeout",
    "FreezeFailed",
    "InputError",
    "InvalidSpec",
    "LimitExceeded",
    "NotExecutable",
    "PartialOutputCommit",
    "PathDenied",
    "PathIsDirectory",
    "PolicyViolation",
    "ProgramFailed",
    "ProgramNotFound",
    "SandboxLost",
    "SetupFailed",
    "SnapshotNotFound",
    "TaskNotFound",
    "UnsupportedBackend",
    "UnsupportedLanguage",
    "UsageError",
    "UserNotFound",
    "WorkspaceFileNotFound",
    "WorkspaceNotFound",
]


class ExecspaceError(Exception):
    """Root of every error raised by execspace."""


class UsageError(ExecspaceError):
    """The API was used in a way that can never work (wrong argument, closed engine)."""


class InvalidSpec(UsageError, ValueError):
    """A model or spec holds a value that cannot be valid."""


class PolicyViolation(ExecspaceError):
    """The request is forbidden by the active policy (command policy, file rule, profile)."""


class CapabilityError(PolicyViolation):
    """The backend cannot enforce a requested policy, so nothing was run.

    Raised *before* any side effect. ``capability`` names what is missing and
    ``backend`` which backend lacks it.
    """

    def __init__(self, capability: str, backend: str, hint: str = "") -> None:
        self.capability = capability
        self.backend = backend
        msg = f"backend {backend!r} cannot enforce {capability}; refusing to run without it"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)


class UnsupportedLanguage(PolicyViolation):
    """No runtime is known (or installed) for a code block's language."""


class PathDenied(ExecspaceError, PermissionError):
    """A path would leave the workspace (``..``, absolute, symlink) or breaks a file rule."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"path {path!r} denied: {reason}")

    def __str__(self) -> str:
        return str(self.args[0])


class PathIsDirectory(PathDenied, IsADirectoryError):
    """Reading or writing a file where a directory is: ``IsADirectoryError`` (``errno`` EISDIR) as the program
    would get, and still a :class:`PathDenied` for callers that catch the file API's refusals."""

    def __init__(self, path: str, reason: str = "it is a directory, not a file") -> None:
        super().__init__(path, reason)
        self.errno = errno.EISDIR
        self.filename = path


class LimitExceeded(ExecspaceError):
    """A cap on staging or collection (file count, bytes) was reached."""


class SetupFailed(ExecspaceError):
    """The backend (or ``component``: a server such as ``execspace mcp``, which is no backend) cannot work on this
    host; the message names the cause and the fix."""

    def __init__(self, backend: str, cause: str, fix: str = "", *, component: str | None = None) -> None:
        self.backend = backend
        self.cause = cause
        self.fix = fix
        msg = f"{component} cannot start: {cause}" if component else f"backend {backend!r} is not usable here: {cause}"
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)


class UnsupportedBackend(ExecspaceError):
    """Unknown backend name, or a backend that cannot exist on this platform."""


class EnvironmentNotFound(ExecspaceError, LookupError):
    """No environment of that name is built: the message names the ``execspace env build`` that builds it."""


class EnvironmentBuildFailed(ExecspaceError):
    """Building an environment failed (a package that does not exist, an unreachable registry); nothing is kept."""

    def __init__(self, cause: str, fix: str = "") -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(f"environment build failed: {cause}" + (f"\nFix: {fix}" if fix else ""))


class EnvironmentBuilding(ExecspaceError):
    """An environment a request needs is being built now (``execspace serve`` builds a template's environment the
    first time a create needs it): the message names the environment, where it is built, its step so far and its
    log; retry in a few seconds."""


class WorkspaceNotFound(ExecspaceError, LookupError):
    """No workspace exists for that id or path."""


class TaskNotFound(ExecspaceError, LookupError):
    """``execspace mcp``: no task of that id (it never existed, or it ended longer ago than its time to live)."""


class WorkspaceFileNotFound(ExecspaceError, FileNotFoundError):
    """No file at that path in the workspace (``errno`` ENOENT, as ``open`` would raise); the message names the
    path, relative to the workspace root, and the workspace."""

    def __init__(self, path: str, workspace: str) -> None:
        super().__init__(
            f"no file {path!r} in workspace {workspace}: paths are relative to the workspace root (work/, out/, "
            "...); list what is there with fs.list(ws, ['**'])"
        )
        self.errno = errno.ENOENT
        self.filename = path

    def __str__(self) -> str:
        return str(self.args[0])


class SnapshotNotFound(ExecspaceError, LookupError):
    """No snapshot of that id or name on this workspace root (removed, or never taken): ``list_snapshots()``
    shows them."""


class ProgramNotFound(ExecspaceError, LookupError):
    """No program started in this workspace with that pid or tag is still running (it ended, or never was):
    list the running ones with ``runner.list_programs(ws)``."""


class ArtifactNotFound(ExecspaceError, LookupError):
    """No artifact with that name (and version) in the given scope."""


class InputError(ExecspaceError):
    """An input reference cannot be resolved (unknown scheme, missing source, root not allowed)."""


class CannotExecute(ExecspaceError, OSError):
    """A run's program could not be started where it would run, as a shell reports it with an exit code:
    ``start_program`` raises it, ``run_program`` returns a :class:`~execspace.models.RunResult` with its
    ``exit_code`` and its message as stderr, and the CLI exits with its ``exit_code``."""

    exit_code = 126

    def __init__(self, command: str, message: str, err: int, run_dir: str = "") -> None:
        super().__init__(message)
        self.command = command
        self.errno = err
        self.run_dir = run_dir
        """The run's directory (workspace-relative), made before the program was looked for; "" for none."""

    def __str__(self) -> str:
        return str(self.args[0])


class CommandNotFound(CannotExecute, FileNotFoundError):
    """The command does not exist where the program would run (a bare name not on the run's ``PATH``, a path
    that is not there): exit code 127."""

    exit_code = 127


class NotExecutable(CannotExecute, PermissionError):
    """The program exists but cannot be executed (no ``x`` bit, a directory, not a format the kernel runs, a
    file on the way): exit code 126."""

    exit_code = 126


class UserNotFound(CannotExecute, LookupError):
    """The run names a user (``RunProgramSpec.user``) that does not exist where the program would run, as
    ``docker exec -u`` and ``sudo -u`` report it: exit code 126. A user that exists there but that the backend
    cannot run as is a :class:`CapabilityError` instead."""

    exit_code = 126


class ExecutionTimeout(ExecspaceError, TimeoutError):
    """The run exceeded its deadline. The program tree was killed; ``result`` keeps its partial output."""

    def __init__(self, message: str, result: RunResult | None = None) -> None:
        self.result = result
        super().__init__(message)


class ProgramFailed(ExecspaceError):
    """The program exited non-zero and the caller asked for ``check=True``."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        super().__init__(f"program exited with code {result.exit_code}: {result.stderr[-500:]!r}")


class BackendError(ExecspaceError):
    """The backend failed while working (daemon gone, kernel died, transport broke)."""


class FreezeFailed(BackendError):
    """A workspace's programs could not all be held still (for a snapshot's copy, a pause of ``execspace serve``):
    they kept waking each other or starting new processes past the time allowed. Nothing was frozen: every program
    stopped on the way was let continue."""


class PartialOutputCommit(BackendError):
    """Outputs were collected (and maybe saved) but recording them in metadata failed."""

    def __init__(self, message: str, manifest: OutputManifest, cause: Any = None) -> None:
        self.manifest = manifest
        self.cause = cause
        super().__init__(message)


class SandboxLost(BackendError):
    """A remote sandbox expired or was killed while in use: the files and programs it held are gone."""
