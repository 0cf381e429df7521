"""inspect_ai: the ``execspace`` sandbox environment provider, so that evals run in execspace workspaces.

::

    @task
    def ctf() -> Task:
        return Task(dataset=..., solver=basic_agent(tools=[bash()]), sandbox="execspace")

Registered by the ``inspect_ai`` entry point (installing ``execspace[inspect-ai]`` is enough). Each sample gets
its own engine and workspace, opened in ``sample_init`` and removed with everything in it in ``sample_cleanup``;
by default the bubblewrap sandbox in session mode (one sandbox per sample: background state lasts across the
sample's commands; ``/tmp`` is the workspace's in either mode, so it lasts too).
``sandbox=("execspace", ExecspaceSandboxConfig(backend=..., options={...}))`` picks another backend or options
(those of :func:`execspace.open_engine`).

Commands run in the workspace's ``work/`` (the sample's working directory), with stdin, env, cwd and a timeout;
files are read and written by ``cat`` inside the boundary, as the sandbox's user, so that a path means the same
to ``read_file`` as to the sample's commands (``/tmp/x`` included) and file modes are honoured. There is one user:
``exec(user=...)`` raises ``SandboxUserUnsupportedError``.
"""

from __future__ import annotations

import contextlib
import errno
import uuid
from typing import Any, Literal, overload

from ..engine import open_engine_from
from ..models import ResourceLimits, RunProgramSpec, RunResult, Workspace
from ..protocols import Engine
from . import MissingExtra

try:
    from inspect_ai.util import (
        ExecResult,
        OutputLimitExceededError,
        SandboxEnvironment,
        SandboxEnvironmentConfigType,
        SandboxEnvironmentLimits,
        SandboxUserUnsupportedError,
        sandboxenv,
    )
    from pydantic import BaseModel, Field
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise MissingExtra("inspect-ai", "inspect_ai", exc) from exc

__all__ = ["ExecspaceSandboxConfig", "ExecspaceSandboxEnvironment"]

#: Runs ``cmd`` in ``cwd`` (absolute, or relative to the working directory); the shell by its absolute path.
_IN_CWD = ("/bin/sh", "-c", 'cd -- "$1" || exit 1; shift; exec "$@"', "sh")
_WRITE = ("/bin/sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh")
_READ = ("/bin/cat", "--")


class ExecspaceSandboxConfig(BaseModel):
    """Which engine each sample opens: ``open_engine(backend, **options)``."""

    backend: str = "sandbox"
    options: dict[str, Any] = Field(default_factory=lambda: {"mode": "session"})
    """Options of :func:`execspace.open_engine` for ``backend`` (checked by the backend when a sample starts)."""


@sandboxenv(name="execspace")
class ExecspaceSandboxEnvironment(SandboxEnvironment):
    """One sample's workspace on its own engine."""

    def __init__(self, engine: Engine, workspace: Workspace, stack: contextlib.AsyncExitStack) -> None:
        super().__init__()
        self.engine = engine
        self.workspace = workspace
        self._stack = stack

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return ExecspaceSandboxConfig(**config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        settings = _settings(config)
        stack = contextlib.AsyncExitStack()
        try:
            engine = await stack.enter_async_context(open_engine_from(settings.backend, settings.options))
            ws = await engine.manager.create_workspace(f"inspect/{task_name}/{uuid.uuid4()}")
            stack.push_async_callback(engine.manager.cleanup, ws)
        except BaseException:
            await stack.aclose()
            raise
        return {"default": cls(engine, ws, stack)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            await environment.as_type(ExecspaceSandboxEnvironment)._stack.aclose()

    # -- commands ------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109 - inspect's signature; a deadline for the program
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if user is not None:
            raise SandboxUserUnsupportedError(
                f"the execspace sandbox runs every command as the workspace's one user, not as {user!r}"
            )
        argv = [*_IN_CWD, cwd, *cmd] if cwd is not None else cmd
        result = await self._run(argv, input, env or {}, timeout, SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)
        if result.timed_out:
            raise TimeoutError(f"command timed out after {timeout} seconds: {cmd[:1]}")
        if result.stdout_truncated or result.stderr_truncated:
            truncated = result.stdout if result.stdout_truncated else result.stderr
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, truncated)
        if result.exit_code == 126 and not result.stdout:
            raise PermissionError(errno.EACCES, result.stderr.strip() or "permission denied", cmd[0])
        # a signal as a shell reports it (128 + N), as inspect's other providers do
        code = 128 - result.exit_code if result.exit_code < 0 else result.exit_code
        return ExecResult(success=code == 0, returncode=code, stdout=result.stdout, stderr=result.stderr)

    async def _run(
        self,
        argv: list[str],
        stdin: str | bytes | None,
        env: dict[str, str],
        deadline: float | None,
        output_bytes: int,
    ) -> RunResult:
        spec = RunProgramSpec(
            argv[0],
            argv[1:],
            env=env,
            stdin=stdin,
            timeout=deadline,
            limits=ResourceLimits(output_bytes=output_bytes),
        )
        return await self.engine.runner.run_program(self.workspace, spec)

    # -- files ---------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        result = await self._run([*_WRITE, file], data, {}, None, 64 * 1024)
        if not result.ok:
            raise _file_error(file, result)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        # one byte over the limit tells "exactly the limit" from "more" (the cap keeps a head and a tail)
        result = await self._run([*_READ, file], None, {}, None, limit + 1)
        if not result.ok:
            raise _file_error(file, result)
        if result.stdout_total_bytes > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return result.raw_stdout.decode("utf-8") if text else result.raw_stdout


def _settings(config: SandboxEnvironmentConfigType | None) -> ExecspaceSandboxConfig:
    if config is None:
        return ExecspaceSandboxConfig()
    if isinstance(config, ExecspaceSandboxConfig):
        return config
    raise TypeError(
        f"the execspace sandbox takes an ExecspaceSandboxConfig (backend=..., options={{...}}), not {config!r}"
    )


def _file_error(file: str, result: RunResult) -> OSError:
    """The OSError inspect expects for a failed ``cat``, by the reason the tool gave."""
    message = result.stderr.strip()
    for needle, kind, code in (
        ("No such file", FileNotFoundError, errno.ENOENT),
        ("Is a directory", IsADirectoryError, errno.EISDIR),
        ("Permission denied", PermissionError, errno.EACCES),
        ("Read-only file system", PermissionError, errno.EROFS),
    ):
        if needle in message:
            return kind(code, f"{needle.lower()} ({message})", file)
    return OSError(errno.EIO, f"exit code {result.exit_code}: {message}", file)
