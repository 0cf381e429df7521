"""ProgramRunner for programs started as host processes (local, and wrapped by the sandbox).

A subclass only changes how the prepared command is wrapped (``wrap``) and what
the program sees as its workspace path; the spawn, supervision, environment
policy and post-run checks are shared.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..capabilities import Capabilities, Isolation
from ..envpolicy import EnvPolicy
from ..errors import PathDenied, UsageError
from ..models import RunProgramSpec, RunResult, Workspace
from ..protocols import ProgramHandle
from ..workspace.confine import ConfinedRoot, split_relpath
from ..workspace.layout import new_run_name, workspace_env
from .rlimits import classify_rlimit_exit, rlimit_preexec
from .supervisor import RUN_MARKER_VAR, Launch, MarkerSweeper, SupervisedProcess, spawn

__all__ = ["DISK_BYTES_DETAIL", "HostRunner", "Prepared", "unisolated_capabilities"]

#: How ``max_disk_bytes`` is enforced by every host-directory backend (no quota stops the writes themselves).
DISK_BYTES_DETAIL = (
    "allocated blocks of the whole tree (fallocate reservations included, hard links once), measured after "
    "each run: a run can go over while it writes, then gets limit_hit=disk_bytes"
)


@dataclass(slots=True)
class Prepared:
    """A run after policy checks, before wrapping: everything a wrapper needs."""

    ws: Workspace
    root: Path
    spec: RunProgramSpec
    argv: list[str]
    env: dict[str, str]
    host_cwd: str
    run_dir: str
    marker: str


class HostRunner:
    """Runs programs as supervised host processes in host-directory workspaces."""

    def __init__(
        self,
        capabilities: Callable[[], Capabilities],
        env_policy: EnvPolicy | None = None,
        *,
        host_env: Mapping[str, str] | None = None,
        kill_grace: float = 2.0,
        owner: Callable[[Workspace], tuple[int, int] | None] | None = None,
    ) -> None:
        self._caps = capabilities
        # uid/gid for the directories we create for a run (the sandbox uid when we run as root)
        self._owner_of = owner
        self.env_policy = env_policy or EnvPolicy()
        self._host_env = host_env
        self.kill_grace = kill_grace
        self._sweeper = MarkerSweeper()
        # programs still running, by workspace directory: cleanup kills them before removing the tree
        self._live: dict[Path, set[asyncio.Future[SupervisedProcess]]] = {}

    # -- hooks for wrapping backends -------------------------------------------------------

    def _owner(self, ws: Workspace) -> tuple[int, int] | None:
        return self._owner_of(ws) if self._owner_of is not None else None

    def program_root(self, ws: Workspace) -> str:
        """The workspace root as the program sees it."""
        return str(ws.host_path)

    def wrap(self, prep: Prepared) -> Launch:
        """Turn a prepared run into what to spawn. The local backend spawns it as is."""
        return self._launch(prep, prep.argv, prep.env, prep.host_cwd)

    def after_run(self, prep: Prepared, result: RunResult) -> RunResult:
        return result

    # -- ProgramRunner -----------------------------------------------------------------

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        prep = self.prepare(ws, spec)
        if isinstance(prep, RunResult):
            return prep
        try:
            proc = await self._spawn(prep.root, self.wrap(prep))
        except OSError as exc:
            failed = _exec_failure(prep, exc)
            if failed is None:
                raise
            return failed
        async with proc:
            result = await proc.wait()
        return await self._post_run(prep, result)

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> ProgramHandle:
        prep = self.prepare(ws, spec)
        if isinstance(prep, RunResult):
            raise FileNotFoundError(prep.stderr.strip())
        launch = self.wrap(prep)
        launch.interactive = True
        return await self._spawn(prep.root, launch)

    async def stop_programs(self, ws: Workspace) -> None:
        """Kill every program this runner started in ``ws`` that still runs (or is being started), and wait
        for them to end: for ``HostWorkspaceManager(stop_programs=...)``, as nothing may change a tree while
        it is removed."""
        if ws.host_path is None:
            return
        live = self._live.pop(ws.host_path, set())
        await asyncio.gather(*(_kill_started(started) for started in live))

    async def _spawn(self, root: Path, launch: Launch) -> SupervisedProcess:
        # known before it exists: a program already running may not have been handed back to us yet
        started = asyncio.ensure_future(spawn(launch))
        live = self._live.setdefault(root, set())
        live.add(started)

        def forget() -> None:
            live.discard(started)
            if not live and self._live.get(root) is live:
                del self._live[root]

        launch.on_exit.append(forget)
        try:
            return await started
        except BaseException:
            forget()
            raise

    # -- shared steps ------------------------------------------------------------------

    def prepare(self, ws: Workspace, spec: RunProgramSpec) -> Prepared | RunResult:
        """Check the spec against capabilities, set up cwd and run dir, build env and argv.

        Returns a 127 :class:`RunResult` when the command does not exist, as a shell would.
        """
        self._caps().require(spec)
        if ws.host_path is None:
            raise UsageError(f"workspace {ws.id!r} is not a host workspace")
        root = ws.host_path
        host_cwd = self._host_cwd(ws, spec.cwd)
        run_dir = new_run_name()
        with ConfinedRoot(str(root), self._owner(ws)) as cr:
            # fd-relative: a program that swapped runs/ for a symlink cannot make us create dirs elsewhere
            os.close(cr.open_dir(split_relpath(run_dir), create=True))
        marker = secrets.token_hex(8)
        env = self.env_policy.build(
            self._host_env if self._host_env is not None else os.environ,
            spec.env,
            workspace_env(self.program_root(ws), run_dir),
            clean=spec.clean_env,
        )
        env[RUN_MARKER_VAR] = marker
        program = self.resolve_program(spec.cmd, env["PATH"], host_cwd)
        if program is None:
            msg = f"execspace: command not found: {spec.cmd!r} (searched PATH={env['PATH']})\n"
            return RunResult(127, "", msg, 0.0, raw_stderr=msg.encode(), run_dir=run_dir)
        return Prepared(ws, root, spec, [program, *spec.args], env, host_cwd, run_dir, marker)

    def resolve_program(self, cmd: str, path: str, cwd: str) -> str | None:
        """Look a bare name up on the *run's* PATH, never the caller's."""
        if "/" in cmd:
            return cmd
        return shutil.which(cmd, path=path)

    def _host_cwd(self, ws: Workspace, cwd: str) -> str:
        root = ws.host_path
        assert root is not None
        if not cwd or cwd in (".", "./"):
            return str(root)
        try:
            parts = split_relpath(cwd)
        except PathDenied as exc:
            raise PathDenied(cwd, f"cwd must stay inside the workspace ({exc.reason})") from exc
        with ConfinedRoot(str(root), self._owner(ws)) as cr:
            os.close(cr.open_dir(parts, create=True))
        return str(root.joinpath(*parts))

    def _launch(self, prep: Prepared, argv: list[str], env: dict[str, str], cwd: str) -> Launch:
        spec = prep.spec
        return Launch(
            argv=argv,
            env=env,
            cwd=cwd,
            marker=prep.marker,
            stdin=spec.stdin.encode() if isinstance(spec.stdin, str) else spec.stdin,
            timeout=spec.timeout,
            output_limit=spec.limits.output_bytes,
            kill_grace=self.kill_grace,
            preexec_fn=rlimit_preexec(spec.limits),
            run_dir=prep.run_dir,
            classify_exit=classify_rlimit_exit,
            sweeper=self._sweeper,
        )

    async def _post_run(self, prep: Prepared, result: RunResult) -> RunResult:
        result = self.after_run(prep, result)
        cap = prep.ws.policy.max_disk_bytes
        if cap is not None:
            used = await asyncio.to_thread(_disk_usage, str(prep.root))
            if used > cap and result.limit_hit is None:
                result = replace(result, limit_hit="disk_bytes")
        return result


async def _kill_started(started: asyncio.Future[SupervisedProcess]) -> None:
    await asyncio.wait([started])
    if not started.cancelled() and started.exception() is None:
        await started.result().kill_now()


def _exec_failure(prep: Prepared, exc: OSError) -> RunResult | None:
    """A program that cannot be executed is a 127/126 result, as a shell reports it."""
    if exc.errno == errno.ENOENT:
        code, hint = 127, " (if the file exists, the interpreter on its #! line is missing)"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ENOTDIR):
        code, hint = 126, " (is it executable, with a valid #! line?)"
    else:
        return None
    msg = f"execspace: cannot execute {prep.spec.cmd!r}: {exc.strerror}{hint}\n"
    return RunResult(code, "", msg, 0.0, raw_stderr=msg.encode(), run_dir=prep.run_dir)


def _disk_usage(root: str) -> int:
    with ConfinedRoot(root) as cr:
        return cr.disk_usage()


def unisolated_capabilities(
    backend: str,
    env_policy: EnvPolicy | None,
    does_not_protect: tuple[str, ...],
    details: dict[str, str] | None = None,
) -> Capabilities:
    """What a :class:`HostRunner` enforces when it runs programs as plain host processes (no boundary)."""
    from ..languages import available_languages
    from .rlimits import RLIMIT_ENFORCED

    path = (env_policy or EnvPolicy()).program_path(os.environ)
    return Capabilities(
        backend=backend,
        isolation=Isolation.NONE,
        network_control=False,
        network_default=True,
        clean_env=True,
        read_only_mounts=False,
        streaming=True,
        host_paths=True,
        enforced_limits=frozenset({"timeout", "output_bytes", "disk_bytes"} | RLIMIT_ENFORCED),
        languages=available_languages(path),
        does_not_protect=does_not_protect,
        details={"memory_bytes": "RLIMIT_AS per process", "disk_bytes": DISK_BYTES_DETAIL, **(details or {})},
    )
