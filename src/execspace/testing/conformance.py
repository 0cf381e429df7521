"""Behaviour every backend must show, written once: the conformance kit (fsspec's abstract test classes are the model).

A backend binds it with one class of its own, and every case here (new ones too) runs on its engine::

    import pytest_asyncio

    import execspace
    from execspace.testing.conformance import EngineConformance

    class TestMyBackend(EngineConformance):
        @pytest_asyncio.fixture
        async def engine(self, tmp_path):
            async with execspace.open_engine("mybackend", workspace_root=tmp_path / "ws") as engine:
                yield engine

or, with ``bindings = [backend_binding("mybackend", options={...})]`` (:mod:`execspace.testing.binding`), the class
opens one engine per binding and test, and skips where the binding's probe fails.

The cases come in sections, and each section runs only where the engine's :meth:`~execspace.protocols.Engine.describe`
says the engine has what it needs: programs (``Capabilities.programs``), snapshots and forks
(``Capabilities.fork``, with a :class:`~execspace.protocols.SupportsSnapshots` manager), kernels
(``Capabilities.kernels``, with :class:`~execspace.protocols.SupportsKernels`), file streams
(:class:`~execspace.protocols.SupportsFileStreams`), holding programs still (a
:class:`~execspace.protocols.SupportsFreezing` runner); the file API and the manager's semantics run everywhere. A case
that needs a section says so with ``@needs(Feature.…)``. No list of what a backend lacks is kept by hand.

Every program a case starts carries a tag of its test in its environment (:mod:`execspace.testing.processes`); a test
after which a process with that tag is still alive, once its engine is closed, fails (and the process is killed).

Needs pytest and pytest-asyncio (strict or auto mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import pytest_asyncio

import execspace
from execspace import (
    CapabilityError,
    InputSpec,
    LimitExceeded,
    OutputSpec,
    PathDenied,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
)
from execspace.protocols import (
    SupportsCpuUsage,
    SupportsFileMetadata,
    SupportsFileStreams,
    SupportsFreezing,
    SupportsKernels,
    SupportsSnapshots,
)
from execspace.testing.binding import EngineBinding, Feature, needs, open_bound
from execspace.testing.processes import TAG_VARIABLE, new_tag, pids_with, wait_no_process

__all__ = ["EngineConformance", "Feature", "needs"]

Engine = execspace.BaseEngine
Ws = execspace.Workspace


class TaggedEngine:
    """The bound engine as the cases see it: every program its runner starts carries ``tag`` in its environment, so
    that the guard finds what a test left alive. Everything else is the engine's own."""

    def __init__(self, engine: execspace.Engine, tag: str) -> None:
        self._engine = engine
        self._tag = tag

    @property
    def name(self) -> str:
        return self._engine.name

    @property
    def manager(self) -> execspace.WorkspaceManager:
        return self._engine.manager

    @property
    def fs(self) -> execspace.WorkspaceFS:
        return self._engine.fs

    @property
    def runner(self) -> TaggedRunner:
        return TaggedRunner(self._engine.runner, self._tag)

    def describe(self) -> execspace.Capabilities:
        return self._engine.describe()

    async def aclose(self) -> None:
        await self._engine.aclose()

    def __getattr__(self, name: str) -> Any:  # what a backend adds: kernels, …
        return getattr(self._engine, name)


def untagged(env: Mapping[str, str]) -> dict[str, str]:
    """A program's environment as its case gave it, without the kit's tag."""
    return {k: v for k, v in env.items() if k != TAG_VARIABLE}


class TaggedRunner:
    """A runner that puts the test's tag in each program's environment; the rest is the runner's own."""

    def __init__(self, runner: execspace.ProgramRunner, tag: str) -> None:
        self._runner = runner
        self._tag = tag

    def _tagged(self, spec: RunProgramSpec) -> RunProgramSpec:
        return dataclasses.replace(spec, env={**spec.env, TAG_VARIABLE: self._tag})

    async def run_program(self, ws: Ws, spec: RunProgramSpec) -> execspace.RunResult:
        return await self._runner.run_program(ws, self._tagged(spec))

    async def start_program(self, ws: Ws, spec: RunProgramSpec) -> execspace.ProgramHandle:
        return await self._runner.start_program(ws, self._tagged(spec))

    async def list_programs(self, ws: Ws) -> list[execspace.ProgramInfo]:
        return await self._runner.list_programs(ws)

    async def get_program(self, ws: Ws, key: int | str) -> execspace.ProgramHandle:
        return await self._runner.get_program(ws, key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


async def run(engine: Engine, ws: Ws, script: str, **kw: object) -> execspace.RunResult:
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], **kw))  # type: ignore[arg-type]


def outside_dir(tmp_path: Path) -> Path:
    """A host directory outside the workspace with one file, which no file operation may touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    return outside


def beyond(engine: Engine) -> bool:
    """Whether the engine's file API serves absolute paths of the program's view beyond its workspace."""
    return engine.describe().absolute_paths == "view"


def untouched(outside: Path) -> bool:
    return sorted(p.name for p in outside.iterdir()) == ["keep.txt"] and (outside / "keep.txt").read_text() == "keep"


async def read_until(reader: AsyncIterator[execspace.OutputChunk], needle: bytes, within: float = 10.0) -> bytes:
    """What ``reader`` yields until ``needle`` has appeared (AssertionError with what came, after ``within``)."""
    seen = b""

    async def scan() -> None:
        nonlocal seen
        async for chunk in reader:
            seen += chunk.data
            if needle in seen:
                return
        raise AssertionError(f"the output ended before {needle!r}: {seen!r}")

    try:
        await asyncio.wait_for(scan(), within)
    except TimeoutError:
        raise AssertionError(f"no {needle!r} within {within} s: {seen!r}") from None
    return seen


async def wait_listed(engine: Engine, ws: Ws, count: int, within: float = 10.0) -> list[execspace.ProgramInfo]:
    """Poll ``list_programs`` until it lists ``count`` programs."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        listed = await engine.runner.list_programs(ws)
        if len(listed) == count or asyncio.get_running_loop().time() > deadline:
            return listed
        await asyncio.sleep(0.01)


#: Every byte value, as ``printf`` makes them from octal escapes (NUL included).
_EVERY_BYTE = bytes(range(256))


_PRINTF_EVERY_BYTE = "".join(f"\\{b:03o}" for b in _EVERY_BYTE)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _held(pid: int) -> bool:
    """Whether the host sees ``pid`` held still: stopped by a signal, or in a frozen cgroup (v2, or v1's freezer)."""
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt":
            return True
        groups = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    except (OSError, IndexError):
        return False
    for _, controllers, group in groups:
        if controllers == "" and "frozen 1" in _lines(f"/sys/fs/cgroup{group}/cgroup.events"):
            return True
        if "freezer" in controllers.split(",") and "FROZEN" in _lines(f"/sys/fs/cgroup/freezer{group}/freezer.state"):
            return True
    return False


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


async def stream_of(*chunks: bytes) -> AsyncIterator[bytes]:
    """Chunks as an upload's body brings them, for ``write_stream``."""
    for chunk in chunks:
        yield chunk


def file_streams(engine: Engine) -> SupportsFileStreams:
    """The engine's file system as ``SupportsFileStreams``; the case is skipped where it is not one."""
    fs = engine.fs
    if not isinstance(fs, SupportsFileStreams):
        pytest.skip(f"{type(fs).__name__} has no file streams (SupportsFileStreams)")
    return fs


async def file_metadata(engine: Engine, ws: Ws) -> SupportsFileMetadata:
    """The engine's file system as ``SupportsFileMetadata``; the case is skipped where it is not one, or where the
    workspace's filesystem keeps no metadata (a write of it says so)."""
    fs = engine.fs
    if not isinstance(fs, SupportsFileMetadata):
        pytest.skip(f"{type(fs).__name__} keeps no file metadata (SupportsFileMetadata)")
    await fs.put_files(ws, [PutFile("work/probe.txt", b"")])
    if not await fs.write_metadata(ws, "work/probe.txt", {"probe": "1"}):
        pytest.skip(f"{engine.name}'s workspace filesystem keeps no extended attributes")
    await fs.remove(ws, "work/probe.txt")
    return fs


@pytest.mark.asyncio
class EngineConformance:
    """The kit: subclass it in a test module (``Test…``) and give it an ``engine`` fixture, or ``bindings``."""

    #: The bindings the class runs on (one test id per binding), when it has no ``engine`` fixture of its own.
    bindings: ClassVar[Sequence[EngineBinding]] = ()

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if self.bindings and "engine_binding" in metafunc.fixturenames:
            metafunc.parametrize("engine_binding", self.bindings, ids=[b.name for b in self.bindings])

    @pytest.fixture
    def engine_binding(self) -> EngineBinding:
        pytest.fail(f"{type(self).__name__} binds no engine: give it an `engine` fixture, or `bindings = [...]`")

    @pytest_asyncio.fixture
    async def engine(
        self, engine_binding: EngineBinding, request: pytest.FixtureRequest, tmp_path: Path
    ) -> AsyncIterator[execspace.Engine]:
        """The engine under test, for one test: override it to bind the kit without bindings."""
        async with open_bound(engine_binding, request, tmp_path) as engine:
            yield engine

    @pytest.fixture(autouse=True)
    def run_tag(self) -> Iterator[str]:
        """The tag of this test's programs; once the test and its engine are done, none may be alive."""
        tag = new_tag("conformance")
        yield tag
        if left := wait_no_process(tag, within=10.0):
            pytest.fail(f"processes of this test's programs outlived it and its engine (now killed): pids {left}")

    @pytest.fixture
    def any_engine(self, engine: execspace.Engine, run_tag: str) -> Engine:
        return TaggedEngine(engine, run_tag)  # type: ignore[return-value]  # the cases' view of the engine

    @pytest_asyncio.fixture
    async def any_ws(self, any_engine: Engine) -> Ws:
        return await any_engine.manager.create_workspace("conf/user/session")

    # -- the sections, skipped from describe() (cases take them through @needs) --------------------------------

    @pytest.fixture
    def needs_programs(self, any_engine: Engine) -> None:
        if not any_engine.describe().programs:
            pytest.skip(f"{any_engine.name} runs no programs (describe().programs is False)")

    @pytest.fixture
    def needs_snapshots(self, any_engine: Engine) -> SupportsSnapshots:
        if any_engine.describe().fork is None:
            pytest.skip(f"{any_engine.name} has no snapshots or forks (describe().fork is None)")
        manager = any_engine.manager
        assert isinstance(manager, SupportsSnapshots), "describe().fork is set: the manager must be SupportsSnapshots"
        return manager

    @pytest.fixture
    def needs_kernels(self, any_engine: Engine) -> execspace.Kernels:
        if any_engine.describe().kernels is None:
            pytest.skip(f"{any_engine.name} has no kernels (describe().kernels is None)")
        assert isinstance(any_engine, SupportsKernels), "describe().kernels is set: the engine must have kernels"
        return any_engine.kernels

    # -- the manager: every engine ---------------------------------------------------------------------------

    async def test_create_is_idempotent_and_keeps_the_files(self, any_engine: Engine, any_ws: Ws) -> None:
        """Session persistence: the same id is the same workspace, its files kept; concurrent creates make one."""
        if any_ws.policy.persistence is execspace.Persistence.TURN:
            pytest.skip(f"{any_engine.name} makes a fresh workspace for each creation (persistence turn)")
        await any_engine.fs.put_files(any_ws, [PutFile("work/kept.txt", b"kept")])
        again = await any_engine.manager.create_workspace(any_ws.id)
        assert (again.id, again.path) == (any_ws.id, any_ws.path)
        assert (await any_engine.fs.read_file(again, "work/kept.txt")).content == b"kept"
        assert await any_engine.manager.get_workspace(any_ws.id) == again
        many = await asyncio.gather(*(any_engine.manager.create_workspace("conf/user/racing") for _ in range(8)))
        assert len({(ws.id, ws.path) for ws in many}) == 1

    async def test_an_unknown_workspace_is_not_found(self, any_engine: Engine) -> None:
        with pytest.raises(execspace.WorkspaceNotFound):
            await any_engine.manager.get_workspace("conf/never/created")

    async def test_cleanup_removes_the_workspace_and_twice_is_fine(self, any_engine: Engine, any_ws: Ws) -> None:
        await any_engine.fs.put_files(any_ws, [PutFile("work/gone.txt", b"x")])
        await any_engine.manager.cleanup(any_ws)
        with pytest.raises(execspace.WorkspaceNotFound):
            await any_engine.manager.get_workspace(any_ws.id)
        await any_engine.manager.cleanup(any_ws)  # idempotent
        fresh = await any_engine.manager.create_workspace(any_ws.id)  # the id is free again, and empty
        assert not await any_engine.fs.exists(fresh, "work/gone.txt")

    @needs(Feature.PROGRAMS)
    async def test_cleanup_stops_the_workspaces_programs(self, any_engine: Engine, any_ws: Ws, run_tag: str) -> None:
        handle = await any_engine.runner.start_program(any_ws, RunProgramSpec("sh", ["-c", "echo up; sleep 60"]))
        await read_until(handle.attach(), b"up\n")
        await any_engine.manager.cleanup(any_ws)
        # gone without the engine's closing (where the host sees them: a remote service's are its own)
        assert wait_no_process(run_tag, within=10.0) == []
        with contextlib.suppress(execspace.ExecspaceError):  # a remote handle may say its sandbox is gone
            result = await asyncio.wait_for(handle.wait(), 30)
            assert result.exit_code != 0, result  # stopped, not run to its end

    async def test_use_after_close_is_a_usage_error(self, any_engine: Engine) -> None:
        await any_engine.aclose()
        for part in ("manager", "fs", "runner"):
            with pytest.raises(execspace.UsageError):
                getattr(any_engine, part)
        await any_engine.aclose()  # idempotent

    # -- holding programs still: where the runner is SupportsFreezing -------------------------------------------

    @needs(Feature.PROGRAMS)
    async def test_frozen_holds_the_programs_still_and_lets_them_go(
        self, any_engine: Engine, any_ws: Ws, run_tag: str
    ) -> None:
        runner = any_engine.runner
        if not isinstance(runner, SupportsFreezing):
            pytest.skip(f"{any_engine.name}'s runner cannot hold programs still (no SupportsFreezing)")
        script = 'echo up; while read line; do echo "got:$line"; done'
        async with await runner.start_program(any_ws, RunProgramSpec("sh", ["-c", script])) as handle:
            reader = handle.attach()
            await read_until(reader, b"up\n")
            shells = [pid for pid in pids_with(run_tag) if _comm(pid) == "sh"]  # none where the host cannot see them
            async with runner.frozen(any_ws):
                assert [pid for pid in shells if not _held(pid)] == []
            await handle.write_stdin("after\n")  # it goes on where it was
            assert b"got:after\n" in await read_until(reader, b"got:after\n")
            await handle.close_stdin()
            assert (await handle.wait()).exit_code == 0

    # -- CPU use: where the runner is SupportsCpuUsage ---------------------------------------------------------

    @needs(Feature.PROGRAMS)
    async def test_cpu_seconds_stand_still_while_programs_wait_and_grow_while_they_compute(
        self, any_engine: Engine, any_ws: Ws
    ) -> None:
        runner = any_engine.runner
        if not isinstance(runner, SupportsCpuUsage):
            pytest.skip(f"{any_engine.name}'s runner does not count its programs' CPU (no SupportsCpuUsage)")
        script = 'echo up; read go; i=0; while [ "$i" -lt 100000 ]; do i=$((i+1)); done; echo done; read end; true'
        async with await runner.start_program(any_ws, RunProgramSpec("sh", ["-c", script])) as handle:
            reader = handle.attach()
            await read_until(reader, b"up\n")
            waiting = runner.cpu_seconds(any_ws)
            await asyncio.sleep(0.3)  # a span to measure, not a wait for something
            waited = runner.cpu_seconds(any_ws)
            assert waited - waiting < 0.05, "a program blocked on its stdin used CPU"
            await handle.write_stdin("go\n")
            await read_until(reader, b"done\n")
            assert runner.cpu_seconds(any_ws) - waited > 0.02, "100,000 rounds of a shell loop used no CPU"
            await handle.close_stdin()
            assert (await handle.wait()).exit_code == 0

    # -- snapshots and forks: where describe().fork says so ---------------------------------------------------

    async def test_snapshot_restore_and_fork(self, any_engine: Engine, any_ws: Ws, needs_snapshots: Any) -> None:
        manager: SupportsSnapshots = needs_snapshots
        fs = any_engine.fs
        await fs.put_files(any_ws, [PutFile("work/a.txt", b"one")])
        snap = await manager.snapshot(any_ws, "conf-first")
        await fs.put_files(any_ws, [PutFile("work/a.txt", b"two"), PutFile("work/b.txt", b"new")])
        forks = await manager.fork(snap, 2, ids=["conf/fork/1", "conf/fork/2"])
        made = [*forks]
        try:
            await self._check_forks(any_engine, any_ws, manager, snap, made)
        finally:
            # a copy-on-write fork (and a workspace restored from a snapshot) is a mount on the host: cleaned up
            # here, not left to whoever runs the suite next
            for ws in [*made, any_ws]:
                await any_engine.manager.cleanup(ws)

    async def _check_forks(
        self, any_engine: Engine, any_ws: Ws, manager: SupportsSnapshots, snap: Any, made: list[Ws]
    ) -> None:
        """The snapshot/fork case's checks; the forks it makes are added to ``made``."""
        fs = any_engine.fs
        forks = made[:2]
        assert [ws.id for ws in forks] == ["conf/fork/1", "conf/fork/2"]
        for fork in forks:
            assert (await fs.read_file(fork, "work/a.txt")).content == b"one"
            assert not await fs.exists(fork, "work/b.txt")
        await fs.put_files(forks[0], [PutFile("work/a.txt", b"forked")])  # a fork is its own
        [live] = await manager.fork(any_ws, ids=["conf/fork/live"])  # from a workspace: its files now
        made.append(live)
        assert (await fs.read_file(live, "work/a.txt")).content == b"two"
        await manager.restore(any_ws, "conf-first")
        assert (await fs.read_file(any_ws, "work/a.txt")).content == b"one"
        assert not await fs.exists(any_ws, "work/b.txt")
        assert (await fs.read_file(forks[1], "work/a.txt")).content == b"one"
        assert "conf-first" in [s.name for s in await manager.list_snapshots()]
        await manager.remove_snapshot(snap)
        assert "conf-first" not in [s.name for s in await manager.list_snapshots()]
        with pytest.raises(execspace.SnapshotNotFound):
            await manager.fork(snap)
        with pytest.raises(execspace.InvalidSpec):
            await manager.fork(any_ws, ids=["conf/fork/1"])  # an existing id

    # -- kernels: where describe().kernels says so ------------------------------------------------------------

    async def test_a_kernel_keeps_its_state_between_blocks(
        self, any_engine: Engine, any_ws: Ws, needs_kernels: Any
    ) -> None:
        kernels: execspace.Kernels = needs_kernels
        languages = any_engine.describe().kernels.languages  # type: ignore[union-attr]  # needs_kernels checked it
        if "python" not in languages:
            pytest.skip(f"the kit's kernel case is python; these kernels run {languages}")
        assert kernels.handles("python")
        limits = ResourceLimits()
        first, _ = await kernels.run_block(
            any_ws, execspace.CodeBlock("python", "x = 41"), 0, timeout=60, limits=limits
        )
        assert first.exit_code == 0, first
        second, _ = await kernels.run_block(
            any_ws, execspace.CodeBlock("python", "print(x + 1)"), 1, timeout=60, limits=limits
        )
        assert (second.exit_code, second.stdout) == (0, "42\n"), second
        failed, _ = await kernels.run_block(
            any_ws, execspace.CodeBlock("python", "1 / 0"), 2, timeout=60, limits=limits
        )
        assert failed.exit_code != 0 and "ZeroDivisionError" in failed.stderr + (failed.error or ""), failed

    # -- programs and the file API ----------------------------------------------------------------------------

    @needs(Feature.PROGRAMS)
    async def test_exit_code_and_streams(self, any_engine: Engine, any_ws: Ws) -> None:
        r = await run(any_engine, any_ws, "echo out; echo err >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
        assert not r.timed_out and r.run_dir.startswith("runs/")

    @needs(Feature.PROGRAMS)
    async def test_workspace_variables_and_cwd(self, any_engine: Engine, any_ws: Ws) -> None:
        r = await run(any_engine, any_ws, 'echo "$WORKSPACE_DIR|$OUTPUT_DIR|$WORK_DIR|$HOME|$TMPDIR"; pwd')
        root = any_ws.path
        first, cwd = r.stdout.splitlines()
        assert first == f"{root}|{root}/out|{root}/work|{root}/home|{root}/tmp"
        assert cwd == f"{root}/work"

    @needs(Feature.PROGRAMS)
    async def test_files_round_trip(self, any_engine: Engine, any_ws: Ws) -> None:
        await any_engine.fs.put_files(any_ws, [PutFile("work/in.txt", b"abc\n")])
        r = await run(any_engine, any_ws, 'tr a-z A-Z < in.txt > "$OUTPUT_DIR/up.txt"')
        assert r.exit_code == 0, r.stderr
        files = await any_engine.fs.collect(any_ws, ["out/**"])
        assert [(f.name, f.content) for f in files] == [("out/up.txt", b"ABC\n")]

    async def test_put_refuses_escape(self, any_engine: Engine, any_ws: Ws) -> None:
        for bad in ("../x", "/etc/x", "work/../../x"):
            with pytest.raises(PathDenied):
                await any_engine.fs.put_files(any_ws, [PutFile(bad, b"x")])

    async def test_files_round_trip_without_a_program(self, any_engine: Engine, any_ws: Ws) -> None:
        """The file API alone (what an engine that runs no programs still offers)."""
        await any_engine.fs.put_files(any_ws, [PutFile("out/a.txt", b"a\n"), PutFile("out/sub/b.bin", b"\0\1")])
        written = await any_engine.fs.stage_inputs(any_ws, [InputSpec(b"1,2\n", dest="work/inputs/d.csv")])
        assert written == ["work/inputs/d.csv"]
        staged = await any_engine.fs.collect(any_ws, ["work/inputs/*"])
        assert [(f.name, f.content) for f in staged] == [("work/inputs/d.csv", b"1,2\n")]
        manifest = await any_engine.fs.collect_outputs(any_ws, OutputSpec(inline=True))
        assert sorted((f.name, f.content) for f in manifest.files) == [
            ("out/a.txt", b"a\n"),
            ("out/sub/b.bin", b"\0\1"),
        ]

    @needs(Feature.PROGRAMS)
    async def test_collect_ignores_planted_symlink(self, any_engine: Engine, any_ws: Ws, tmp_path: Path) -> None:
        secret = tmp_path / "secret.txt"
        secret.write_text("host secret")
        secret.chmod(0o644)
        r = await run(any_engine, any_ws, f'ln -s {secret} "$OUTPUT_DIR/leak"; ln -s /etc "$OUTPUT_DIR/etc"; echo ok')
        assert r.exit_code == 0
        files = await any_engine.fs.collect(any_ws, ["out/**"])
        assert all(b"host secret" not in f.content for f in files)
        assert files == []

    @needs(Feature.PROGRAMS)
    async def test_timeout_kills_tree_and_keeps_output(self, any_engine: Engine, any_ws: Ws) -> None:
        r = await run(any_engine, any_ws, "echo started; (sleep 30 &); sleep 30", timeout=0.5)
        assert r.timed_out and r.limit_hit == "timeout"
        assert r.stdout == "started\n"
        assert r.duration < 10

    @needs(Feature.PROGRAMS)
    async def test_output_is_capped(self, any_engine: Engine, any_ws: Ws) -> None:
        r = await run(
            any_engine, any_ws, "head -c 3000000 /dev/zero | tr '\\0' x", limits=ResourceLimits(output_bytes=1000)
        )
        assert r.stdout_truncated and r.stdout_total_bytes == 3_000_000
        assert "bytes omitted" in r.stdout and len(r.raw_stdout) < 1200

    @needs(Feature.PROGRAMS)
    async def test_stdin(self, any_engine: Engine, any_ws: Ws) -> None:
        r = await any_engine.runner.run_program(any_ws, RunProgramSpec("cat", stdin=b"x" * 300_000))
        assert r.stdout_total_bytes == 300_000

    @needs(Feature.PROGRAMS)
    async def test_clean_env_drops_host_variables(
        self, any_engine: Engine, any_ws: Ws, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        r = await run(any_engine, any_ws, "env", clean_env=True, env={"MINE": "1"})
        names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
        assert "MINE" in names and "LANG" not in names and "WORKSPACE_DIR" in names

    @needs(Feature.PROGRAMS)
    async def test_secrets_not_inherited(self, any_engine: Engine, any_ws: Ws, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("LANG", "C.UTF-8")
        os.environ["EXECSPACE_TEST_API_KEY"] = "s3cr3t"
        try:
            r = await run(any_engine, any_ws, "env")
        finally:
            del os.environ["EXECSPACE_TEST_API_KEY"]
        assert "s3cr3t" not in r.stdout

    @needs(Feature.PROGRAMS)
    async def test_streaming_chunks_arrive_before_exit(self, any_engine: Engine, any_ws: Ws) -> None:
        # the program cannot end before its stdin says so: its first chunk arriving first is streaming, on any machine
        spec = RunProgramSpec("sh", ["-c", "echo first; read go; echo second"])
        async with await any_engine.runner.start_program(any_ws, spec) as handle:
            stream = handle.stream()
            first = await asyncio.wait_for(anext(stream), 30)
            assert first.data == b"first\n"
            await handle.write_stdin("go\n")
            rest = [c.data async for c in stream]
            result = await handle.wait()
        assert b"".join(rest) == b"second\n" and result.exit_code == 0

    @needs(Feature.PROGRAMS)
    async def test_streams_end_when_their_programs_end_before_the_start_returned(
        self, any_engine: Engine, any_ws: Ws
    ) -> None:
        # programs started at once, each over before the answer to its start is read: a sandbox session's host saw
        # their output end before it had a queue to tell, and stream() waited forever (5 % of the time at this width)
        async def started() -> tuple[list[bytes], int]:
            async with await any_engine.runner.start_program(any_ws, RunProgramSpec("echo", ["x"])) as handle:
                chunks = [c.data async for c in handle.stream()]
                return chunks, (await handle.wait()).exit_code

        for _ in range(3):
            ends = await asyncio.wait_for(asyncio.gather(*(started() for _ in range(40))), 60)
            assert ends == [([b"x\n"], 0)] * 40

    @needs(Feature.PROGRAMS)
    async def test_interactive_stdin(self, any_engine: Engine, any_ws: Ws) -> None:
        async with await any_engine.runner.start_program(any_ws, RunProgramSpec("cat")) as handle:
            await handle.write_stdin("hello\n")
            await handle.close_stdin()
            result = await handle.wait()
        assert result.stdout == "hello\n"

    @needs(Feature.PROGRAMS)
    async def test_unenforceable_request_fails_closed(self, any_engine: Engine, any_ws: Ws) -> None:
        caps = any_engine.describe()
        if "pids" in caps.enforced_limits:
            pytest.skip("this backend enforces pids")
        with pytest.raises(CapabilityError):
            await run(any_engine, any_ws, "echo should-not-run", limits=ResourceLimits(pids=10))

    @needs(Feature.PROGRAMS)
    async def test_stage_bytes_and_collect_outputs(self, any_engine: Engine, any_ws: Ws) -> None:
        written = await any_engine.fs.stage_inputs(any_ws, [InputSpec(b"1,2\n", dest="work/inputs/d.csv")])
        assert written == ["work/inputs/d.csv"]
        r = await run(any_engine, any_ws, 'cp inputs/d.csv "$OUTPUT_DIR/copy.csv"')
        assert r.exit_code == 0, r.stderr
        manifest = await any_engine.fs.collect_outputs(any_ws, OutputSpec(inline=True))
        assert [(f.name, f.content, f.mime_type) for f in manifest.files] == [("out/copy.csv", b"1,2\n", "text/csv")]

    @needs(Feature.PROGRAMS)
    async def test_missing_command_is_127(self, any_engine: Engine, any_ws: Ws) -> None:
        r = await any_engine.runner.run_program(any_ws, RunProgramSpec("no-such-program-xyz"))
        assert r.exit_code == 127 and "no-such-program-xyz" in r.stderr

    @needs(Feature.PROGRAMS)
    @pytest.mark.parametrize(
        ("cmd", "code"),
        [
            ("no-such-program-xyz", 127),  # a bare name not on PATH
            ("/no/such/program-xyz", 127),  # an absolute path
            ("./no-such-program-xyz", 127),  # relative to the cwd
            ("/etc/passwd", 126),  # exists, not executable
            ("/etc", 126),  # a directory
            ("/etc/passwd/x", 126),  # a file on the way: not a directory
        ],
    )
    async def test_unrunnable_program_exit_codes_as_a_shell(
        self, any_engine: Engine, any_ws: Ws, cmd: str, code: int
    ) -> None:
        """Every backend reports a program that cannot be started as sh does: 127 not found, 126 not executable."""
        r = await any_engine.runner.run_program(any_ws, RunProgramSpec(cmd))
        assert r.exit_code == code, (r.exit_code, r.stderr)
        assert cmd in r.stderr

    @needs(Feature.PROGRAMS)
    @pytest.mark.parametrize("cmd", ["./plain.sh", "/etc/passwd"])
    async def test_exec_of_a_non_executable_file_is_permission_denied(
        self, any_engine: Engine, any_ws: Ws, cmd: str
    ) -> None:
        """A file without the execute bit (one the program wrote, or a system file) is 126 "permission denied", as a
        shell says, on every backend."""
        await any_engine.fs.put_files(any_ws, [PutFile("work/plain.sh", b"#!/bin/sh\necho ran\n")])
        r = await any_engine.runner.run_program(any_ws, RunProgramSpec(cmd))
        assert (r.exit_code, r.stdout) == (126, ""), (r.exit_code, r.stderr)
        assert cmd in r.stderr and "permission denied" in r.stderr.lower(), r.stderr

    @needs(Feature.PROGRAMS)
    async def test_list_gives_typed_entries_and_never_follows_links(self, any_engine: Engine, any_ws: Ws) -> None:
        await any_engine.fs.put_files(any_ws, [PutFile("out/d/f.txt", b"abc")])
        r = await run(any_engine, any_ws, 'cd "$OUTPUT_DIR" && ln -s /etc link && mkfifo fifo && echo ok')
        assert r.exit_code == 0, r.stderr
        entries = {e.path: e for e in await any_engine.fs.list(any_ws, ["out/**"])}
        kinds = {p: (e.kind, e.size) for p, e in entries.items()}
        assert kinds.pop("out/d")[0] is execspace.FileKind.DIR  # its size is its file system's (0: unknown)
        assert kinds == {
            "out/d/f.txt": (execspace.FileKind.FILE, 3),
            "out/fifo": (execspace.FileKind.OTHER, 0),
            "out/link": (execspace.FileKind.SYMLINK, len("/etc")),
        }
        assert entries["out/d/f.txt"].mtime > 0
        assert await any_engine.fs.list(any_ws, ["out/link/**"]) == []  # a link is never walked into
        for bad in (["../**"], ["/etc/*"], ["out/../../x"]):
            with pytest.raises(PathDenied):
                await any_engine.fs.list(any_ws, bad)

    async def test_list_dir_goes_as_deep_as_asked_and_no_deeper(self, any_engine: Engine, any_ws: Ws) -> None:
        fs = any_engine.fs
        await fs.put_files(any_ws, [PutFile("out/a/b/c/d.txt", b"d"), PutFile("out/top.txt", b"t")])
        assert [e.path for e in await fs.list_dir(any_ws, "out")] == ["out/a", "out/top.txt"]
        two = {e.path: e.kind for e in await fs.list_dir(any_ws, "out", depth=2)}
        kinds = execspace.FileKind
        assert two == {"out/a": kinds.DIR, "out/a/b": kinds.DIR, "out/top.txt": kinds.FILE}
        deep = [e.path for e in await fs.list_dir(any_ws, "out/", depth=2**32 - 1)]
        assert deep == [e.path for e in await fs.list(any_ws, ["out/**"])]
        assert await fs.list_dir(any_ws, "out/top.txt") == []
        with pytest.raises(execspace.UsageError):
            await fs.list_dir(any_ws, "out", depth=0)
        with pytest.raises(PathDenied):
            await fs.list_dir(any_ws, "../..")

    @needs(Feature.PROGRAMS)
    async def test_stat_and_exists_see_the_entry_itself(self, any_engine: Engine, any_ws: Ws) -> None:
        await any_engine.fs.put_files(any_ws, [PutFile("work/f.txt", b"12345")])
        r = await run(any_engine, any_ws, "ln -s /etc/passwd p && ln -s /no/such/target dangling")
        assert r.exit_code == 0, r.stderr
        f = await any_engine.fs.stat(any_ws, "work/f.txt")
        assert (f.path, f.size, f.kind) == ("work/f.txt", 5, execspace.FileKind.FILE)
        assert (await any_engine.fs.stat(any_ws, "work/p")).kind is execspace.FileKind.SYMLINK
        assert (await any_engine.fs.stat(any_ws, "work")).kind is execspace.FileKind.DIR
        assert await any_engine.fs.exists(any_ws, "work/dangling")  # the link itself is there
        assert not await any_engine.fs.exists(any_ws, "work/missing")
        with pytest.raises(FileNotFoundError):
            await any_engine.fs.stat(any_ws, "work/missing")
        # read_file names what is missing, and where (a bare FileNotFoundError said neither)
        with pytest.raises(execspace.WorkspaceFileNotFound, match=r"no file 'work/missing' in workspace"):
            await any_engine.fs.read_file(any_ws, "work/missing")
        for bad in ("../x", "work/../../x", *(() if beyond(any_engine) else ("/etc/passwd",))):
            with pytest.raises(PathDenied):
                await any_engine.fs.stat(any_ws, bad)
            with pytest.raises(PathDenied):
                await any_engine.fs.exists(any_ws, bad)
        if beyond(any_engine):  # the program's view: what it sees there
            assert (await any_engine.fs.stat(any_ws, "/etc/passwd")).kind is execspace.FileKind.FILE
            assert (await any_engine.fs.stat(any_ws, "/etc")).kind is execspace.FileKind.DIR
            assert not await any_engine.fs.exists(any_ws, "/etc/no-such-file-xyz")

    @needs(Feature.PROGRAMS)
    async def test_stat_and_list_give_the_mode_the_program_set_and_a_links_target(
        self, any_engine: Engine, any_ws: Ws
    ) -> None:
        r = await run(any_engine, any_ws, "echo x > f && chmod 640 f && mkdir d && chmod 1750 d && ln -s ../x/y link")
        assert r.exit_code == 0, r.stderr
        f = await any_engine.fs.stat(any_ws, "work/f")
        assert (f.mode, f.link_target) == (0o640, None)
        assert (await any_engine.fs.stat(any_ws, "work/d")).mode == 0o1750
        assert (await any_engine.fs.stat(any_ws, "work/link")).link_target == "../x/y"  # as stored, never resolved
        listed = {e.path: (e.mode, e.link_target) for e in await any_engine.fs.list(any_ws, ["work/*"])}
        assert (listed["work/f"], listed["work/d"]) == ((0o640, None), (0o1750, None))

    @needs(Feature.PROGRAMS)
    async def test_a_directory_swapped_for_a_symlink_is_refused(
        self, any_engine: Engine, any_ws: Ws, tmp_path: Path
    ) -> None:
        outside = outside_dir(tmp_path)
        await any_engine.fs.put_files(any_ws, [PutFile("work/sub/keep.txt", b"in"), PutFile("work/a.txt", b"a")])
        r = await run(any_engine, any_ws, f"mv sub gone && ln -s {outside} sub")
        assert r.exit_code == 0, r.stderr
        fs = any_engine.fs
        attempts = [
            fs.stat(any_ws, "work/sub/keep.txt"),
            fs.exists(any_ws, "work/sub/keep.txt"),
            fs.remove(any_ws, "work/sub/keep.txt"),
            fs.make_dir(any_ws, "work/sub/new"),
            fs.rename(any_ws, "work/sub/keep.txt", "work/stolen.txt"),
            fs.rename(any_ws, "work/a.txt", "work/sub/a.txt"),
        ]
        for attempt in attempts:
            with pytest.raises(PathDenied):
                await attempt
        assert await fs.list(any_ws, ["work/sub/**"]) == []
        assert untouched(outside)
        assert await fs.exists(any_ws, "work/gone/keep.txt") and not await fs.exists(any_ws, "work/stolen.txt")

    @needs(Feature.PROGRAMS)
    async def test_remove_takes_links_never_their_targets(self, any_engine: Engine, any_ws: Ws, tmp_path: Path) -> None:
        outside = outside_dir(tmp_path)
        await any_engine.fs.put_files(any_ws, [PutFile("work/t/deep/f.txt", b"x")])
        r = await run(
            any_engine, any_ws, f"ln -s {outside} l && ln -s {outside} t/deep/l2 && ln -s {outside}/keep.txt t/k"
        )
        assert r.exit_code == 0, r.stderr
        await any_engine.fs.remove(any_ws, "work/l")
        await any_engine.fs.remove(any_ws, "work/t")
        assert not await any_engine.fs.exists(any_ws, "work/l") and not await any_engine.fs.exists(any_ws, "work/t")
        assert untouched(outside)
        with pytest.raises(FileNotFoundError):
            await any_engine.fs.remove(any_ws, "work/t")
        for bad in ("../x", "/etc", "work/../.."):
            with pytest.raises(PathDenied):
                await any_engine.fs.remove(any_ws, bad)

    @needs(Feature.PROGRAMS)
    async def test_remove_a_tree_with_a_read_only_staged_dir(
        self, any_engine: Engine, any_ws: Ws, tmp_path: Path
    ) -> None:
        tree = tmp_path / "host" / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "a.txt").write_text("a")
        (tree / "sub" / "b.txt").write_text("b")
        await any_engine.fs.stage_directory(any_ws, tree, "work/ro", read_only=True)
        r = await run(any_engine, any_ws, "chmod -R a-w ro && ls -R ro")
        assert r.exit_code == 0 and "b.txt" in r.stdout, r.stderr
        await any_engine.fs.remove(any_ws, "work/ro")
        assert not await any_engine.fs.exists(any_ws, "work/ro")
        assert (tree / "sub" / "b.txt").read_text() == "b"  # the host source is not touched

    @needs(Feature.PROGRAMS)
    async def test_make_dir_and_rename(self, any_engine: Engine, any_ws: Ws) -> None:
        fs = any_engine.fs
        await fs.make_dir(any_ws, "work/a/b")
        await fs.make_dir(any_ws, "work/a/b")  # already there: fine
        assert (await fs.stat(any_ws, "work/a/b")).kind is execspace.FileKind.DIR
        await fs.put_files(any_ws, [PutFile("work/new.txt", b"new"), PutFile("work/old.txt", b"old")])
        await fs.rename(any_ws, "work/new.txt", "work/old.txt")  # over an existing file: replaced
        assert (await fs.read_file(any_ws, "work/old.txt")).content == b"new"
        assert not await fs.exists(any_ws, "work/new.txt")
        await fs.rename(any_ws, "work/a", "work/x/y/moved")  # a tree, into new parents
        assert (await fs.stat(any_ws, "work/x/y/moved/b")).kind is execspace.FileKind.DIR
        r = await run(any_engine, any_ws, "cat old.txt; test -d x/y/moved/b && echo moved")
        assert r.stdout == "newmoved\n", r.stderr  # the program sees what the file API did
        with pytest.raises(FileNotFoundError):
            await fs.rename(any_ws, "work/missing", "work/z")
        with pytest.raises(PathDenied):
            await fs.rename(any_ws, "work/x", "work/x/y/inside")
        with pytest.raises(PathDenied):
            await fs.make_dir(any_ws, "work/old.txt/sub")  # a file is in the way
        for src, dst in (("../x", "work/z"), ("work/old.txt", "../z"), ("work/old.txt", "/etc/z")):
            with pytest.raises(PathDenied):
                await fs.rename(any_ws, src, dst)

    @needs(Feature.PROGRAMS)
    @pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1])
    async def test_killed_by_signal_is_minus_n(self, any_engine: Engine, any_ws: Ws, sig: signal.Signals) -> None:
        """Every backend reports a program killed by signal N as exit code -N (the CLI exits 128 + N), also where a
        wrapper (bubblewrap, a container runtime) can only say 128 + N."""
        r = await run(any_engine, any_ws, f"echo before; kill -{int(sig)} $$; echo after")
        assert (r.exit_code, r.signal, r.stdout) == (-sig, sig, "before\n"), (r.exit_code, r.stderr)
        assert not r.timed_out and r.limit_hit is None

    @needs(Feature.PROGRAMS)
    async def test_killed_by_signal_is_minus_n_when_started(self, any_engine: Engine, any_ws: Ws) -> None:
        spec = RunProgramSpec("sh", ["-c", "kill -TERM $$"])
        async with await any_engine.runner.start_program(any_ws, spec) as handle:
            result = await handle.wait()
        assert (result.exit_code, result.signal) == (-signal.SIGTERM, signal.SIGTERM), result

    @needs(Feature.PROGRAMS)
    async def test_a_program_exit_code_passes_through(self, any_engine: Engine, any_ws: Ws) -> None:
        for code in (1, 2, 42, 125, 128):
            r = await run(any_engine, any_ws, f"exit {code}")
            assert (r.exit_code, r.signal) == (code, None), r

    @needs(Feature.PROGRAMS)
    async def test_timed_out_program_ends_by_a_signal(self, any_engine: Engine, any_ws: Ws) -> None:
        """A timeout kills the program: the result says ``timed_out`` and the signal (the CLI exits 124)."""
        r = await run(any_engine, any_ws, "sleep 30", timeout=0.5)
        assert r.timed_out and r.limit_hit == "timeout"
        assert r.exit_code < 0 and r.signal in (signal.SIGTERM, signal.SIGKILL), r.exit_code

    @needs(Feature.PROGRAMS)
    @pytest.mark.parametrize("cmd", ["/no/such/program-xyz", "./no-such-program-xyz", "no-such-program-xyz"])
    async def test_missing_program_is_127_when_started(self, any_engine: Engine, any_ws: Ws, cmd: str) -> None:
        """``start_program`` of a program that does not exist: refused with ``FileNotFoundError`` (a bare name, looked
        up before anything starts) or a handle whose result is 127 (a path, found missing where it would run)."""
        try:
            handle = await any_engine.runner.start_program(any_ws, RunProgramSpec(cmd))
        except FileNotFoundError as exc:
            assert cmd in str(exc)
            return
        async with handle:
            result = await handle.wait()
        assert result.exit_code == 127, (result.exit_code, result.stderr)

    @needs(Feature.PROGRAMS)
    async def test_started_programs_are_listed_and_found_until_they_end(self, any_engine: Engine, any_ws: Ws) -> None:
        runner = any_engine.runner
        assert await runner.list_programs(any_ws) == []
        server = await runner.start_program(any_ws, RunProgramSpec("sleep", ["30"], tag="server", env={"K": "v"}))
        other = await runner.start_program(any_ws, RunProgramSpec("sh", ["-c", "read x"], cwd="out"))
        try:
            listed = await runner.list_programs(any_ws)
            assert [(p.cmd, p.args, p.tag, p.cwd) for p in listed] == [
                ("sleep", ("30",), "server", "work"),
                ("sh", ("-c", "read x"), None, "out"),
            ]
            assert untagged(listed[0].env) == {"K": "v"} and listed[0].pid == server.info.pid and server.info.pid > 0
            assert (await runner.get_program(any_ws, "server")).info == server.info
            assert (await runner.get_program(any_ws, other.info.pid)).info == other.info
            other_ws = await any_engine.manager.create_workspace("conformance-other")
            assert await runner.list_programs(other_ws) == []  # another workspace's programs are not its own
            with pytest.raises(execspace.ProgramNotFound):
                await runner.get_program(other_ws, "server")
        finally:
            await server.kill()
            await other.close_stdin()
        await server.wait()
        await other.wait()
        assert await wait_listed(any_engine, any_ws, 0) == []
        for key in ("server", server.info.pid):
            with pytest.raises(execspace.ProgramNotFound):
                await runner.get_program(any_ws, key)

    @needs(Feature.PROGRAMS)
    async def test_attach_from_the_start_and_from_now(self, any_engine: Engine, any_ws: Ws) -> None:
        spec = RunProgramSpec("sh", ["-c", 'echo one; read x; echo "two:$x"'])
        async with await any_engine.runner.start_program(any_ws, spec) as handle:
            early = handle.attach(from_start=True)
            assert b"one\n" in await read_until(early, b"one\n")
            again = await any_engine.runner.get_program(any_ws, handle.info.pid)
            late = again.attach(from_start=False)
            replay = handle.attach(from_start=True)
            await handle.write_stdin("x\n")
            assert await read_until(late, b"two:x\n") == b"two:x\n"  # nothing from before it attached
            assert await read_until(replay, b"two:x\n") == b"one\ntwo:x\n"
            assert await read_until(early, b"two:x\n") == b"two:x\n"
            result = await handle.wait()
        assert (result.exit_code, result.stdout) == (0, "one\ntwo:x\n")

    @needs(Feature.PROGRAMS)
    async def test_signal_reaches_the_program(self, any_engine: Engine, any_ws: Ws) -> None:
        script = 'trap "echo got-usr1; exit 3" USR1; echo ready; while :; do sleep 0.05; done'
        async with await any_engine.runner.start_program(any_ws, RunProgramSpec("sh", ["-c", script])) as handle:
            await read_until(handle.attach(), b"ready\n")
            await handle.signal(signal.SIGUSR1)
            result = await asyncio.wait_for(handle.wait(), 10)
        assert (result.exit_code, result.stdout) == (3, "ready\ngot-usr1\n"), result
        await handle.signal(signal.SIGUSR1)  # once it has ended: nothing, no error

    @needs(Feature.PROGRAMS)
    async def test_binary_output_arrives_as_capabilities_say(self, any_engine: Engine, any_ws: Ws) -> None:
        """With ``Capabilities.binary_output`` a program's output arrives byte for byte, run and streamed; without
        it, as UTF-8 text whose other bytes are U+FFFD, never anything else. Its stdin takes any bytes."""
        want = _EVERY_BYTE if any_engine.describe().binary_output else _EVERY_BYTE.decode(errors="replace").encode()
        script = f"printf '{_PRINTF_EVERY_BYTE}'; printf '{_PRINTF_EVERY_BYTE}' >&2"
        r = await run(any_engine, any_ws, script)
        assert (r.exit_code, r.raw_stdout, r.raw_stderr) == (0, want, want)
        echoed = await any_engine.runner.run_program(any_ws, RunProgramSpec("cat", stdin=_EVERY_BYTE))
        assert (echoed.exit_code, echoed.raw_stdout) == (0, want)  # stdin is bytes everywhere
        async with await any_engine.runner.start_program(any_ws, RunProgramSpec("sh", ["-c", script])) as handle:
            chunks = [chunk async for chunk in handle.stream()]
            await handle.wait()
        for stream in ("stdout", "stderr"):
            assert b"".join(c.data for c in chunks if c.stream == stream) == want, stream

    @needs(Feature.PROGRAMS)
    async def test_stdin_closed_is_closed(self, any_engine: Engine, any_ws: Ws) -> None:
        async with await any_engine.runner.start_program(any_ws, RunProgramSpec("cat")) as handle:
            await handle.close_stdin()
            await handle.close_stdin()  # idempotent
            with pytest.raises(execspace.UsageError):
                await handle.write_stdin("late\n")
            result = await handle.wait()
        assert (result.exit_code, result.stdout) == (0, "")

    @needs(Feature.PROGRAMS)
    async def test_pty_or_a_clear_refusal(self, any_engine: Engine, any_ws: Ws) -> None:
        """With ``Capabilities.pty`` a program runs on a terminal of the size asked (stdin echoed, a tty, resizable);
        without it, asking for one fails closed."""
        script = 'stty size; [ -t 0 ] && [ -t 1 ] && echo is-a-tty; read line; echo "got:$line"'
        spec = RunProgramSpec("sh", ["-c", script], pty=execspace.PtySize(rows=30, cols=100))
        if not any_engine.describe().pty:
            with pytest.raises(CapabilityError):
                await any_engine.runner.start_program(any_ws, spec)
            return
        async with await any_engine.runner.start_program(any_ws, spec) as handle:
            reader = handle.attach()
            await read_until(reader, b"is-a-tty")
            await handle.write_stdin("hello\n")
            await read_until(reader, b"got:hello")
            result = await handle.wait()
        assert result.exit_code == 0 and result.stderr == ""
        assert "30 100\r\n" in result.stdout and "hello\r\n" in result.stdout, result.stdout  # the terminal echoes

    @needs(Feature.PROGRAMS)
    async def test_pty_resize_reaches_the_program(self, any_engine: Engine, any_ws: Ws) -> None:
        if not any_engine.describe().pty:
            pytest.skip("this engine has no pty (test_pty_or_a_clear_refusal checks the refusal)")
        script = 'trap "stty size" WINCH; echo ready; while :; do sleep 0.05; done'
        spec = RunProgramSpec("sh", ["-c", script], pty=execspace.PtySize(rows=24, cols=80))
        async with await any_engine.runner.start_program(any_ws, spec) as handle:
            reader = handle.attach()
            await read_until(reader, b"ready")
            await handle.resize(execspace.PtySize(rows=40, cols=120))
            assert b"40 120" in await read_until(reader, b"40 120")
            await handle.kill()
        with pytest.raises(execspace.UsageError):  # no terminal: nothing to resize
            async with await any_engine.runner.start_program(any_ws, RunProgramSpec("true")) as plain:
                await plain.resize(execspace.PtySize())

    @needs(Feature.PROGRAMS)
    async def test_timeout_and_kill_give_the_program_its_term_handler(self, any_engine: Engine, any_ws: Ws) -> None:
        """A timeout or a kill sends SIGTERM to the program itself first (not to a wrapper that would take it down
        with SIGKILL): its handler runs within the grace period."""
        script = 'trap "echo cleaned-up; exit 0" TERM; echo up; while :; do sleep 0.05; done'
        r = await run(any_engine, any_ws, script, timeout=1)
        assert r.timed_out and r.stdout == "up\ncleaned-up\n", (r.stdout, r.stderr)
        async with await any_engine.runner.start_program(any_ws, RunProgramSpec("sh", ["-c", script])) as handle:
            await read_until(handle.attach(), b"up\n")
            await handle.kill()
            result = await handle.wait()
        assert result.stdout == "up\ncleaned-up\n", (result.stdout, result.stderr)

    async def test_absolute_paths_in_the_programs_view_reach_the_same_files(
        self, any_engine: Engine, any_ws: Ws
    ) -> None:
        """The file API takes the paths a program prints: ``ws.path`` + a workspace path is that file; any other
        absolute path is refused, or, where the file API serves the program's whole view
        (``Capabilities.absolute_paths == "view"``), is what the program sees there."""
        root = any_ws.path
        await any_engine.fs.put_files(any_ws, [PutFile(f"{root}/work/abs.txt", b"by absolute path")])
        got = await any_engine.fs.read_file(any_ws, f"{root}/work/abs.txt")
        assert (got.name, got.content) == ("work/abs.txt", b"by absolute path")
        assert (await any_engine.fs.read_file(any_ws, "work/abs.txt")).content == b"by absolute path"
        assert (await any_engine.fs.stat(any_ws, f"{root}/work/abs.txt")).path == "work/abs.txt"
        assert [e.path for e in await any_engine.fs.list(any_ws, [f"{root}/work/*.txt"])] == ["work/abs.txt"]
        await any_engine.fs.make_dir(any_ws, f"{root}/work/d")
        await any_engine.fs.rename(any_ws, f"{root}/work/abs.txt", f"{root}/work/d/moved.txt")
        assert await any_engine.fs.exists(any_ws, "work/d/moved.txt")
        await any_engine.fs.remove(any_ws, f"{root}/work/d")
        assert not await any_engine.fs.exists(any_ws, "work/d")
        for outside in ("/etc/passwd", f"{root}-other/x", f"{root}/../x", f"{root}/work/../../x"):
            if beyond(any_engine) and outside == "/etc/passwd":
                seen = await run(any_engine, any_ws, "cat /etc/passwd")
                assert (await any_engine.fs.read_file(any_ws, outside)).text == seen.stdout
                continue
            # beyond the workspace a path the program's view lacks is missing; one with ".." is refused everywhere
            missing = beyond(any_engine) and ".." not in outside
            with pytest.raises(FileNotFoundError if missing else PathDenied):
                await any_engine.fs.read_file(any_ws, outside)

    @needs(Feature.PROGRAMS)
    async def test_cwd_and_files_by_the_programs_absolute_paths(self, any_engine: Engine, any_ws: Ws) -> None:
        root = any_ws.path
        r = await run(any_engine, any_ws, 'pwd; echo made > "$PWD/p.txt"', cwd=f"{root}/out")
        assert r.exit_code == 0, r.stderr
        assert r.stdout.splitlines()[0] == f"{root}/out"
        assert (await any_engine.fs.read_file(any_ws, f"{root}/out/p.txt")).content == b"made\n"
        if any_engine.describe().absolute_paths == "workspace":
            with pytest.raises(PathDenied):
                await run(any_engine, any_ws, "pwd", cwd="/etc")
        else:  # a directory the program sees: it starts there, nothing is made for it
            r = await run(any_engine, any_ws, "pwd", cwd="/etc")
            assert (r.exit_code, r.stdout) == (0, "/etc\n"), r.stderr

    async def test_a_directory_is_no_file(self, any_engine: Engine, any_ws: Ws) -> None:
        """Reading a directory, or writing a file where one is, is ``IsADirectoryError`` (still ``PathDenied``)."""
        await any_engine.fs.put_files(any_ws, [PutFile("work/d/f.txt", b"f")])
        if beyond(any_engine):  # a directory of the program's view too
            with pytest.raises(IsADirectoryError, match="directory"):
                await any_engine.fs.read_file(any_ws, "/etc")
        with pytest.raises(IsADirectoryError, match="directory") as read:
            await any_engine.fs.read_file(any_ws, "work/d")
        with pytest.raises(IsADirectoryError, match="directory") as written:
            await any_engine.fs.put_files(any_ws, [PutFile("work/d", b"over a directory")])
        assert isinstance(read.value, PathDenied) and isinstance(written.value, PathDenied)
        assert (await any_engine.fs.read_file(any_ws, "work/d/f.txt")).content == b"f"

    @needs(Feature.PROGRAMS)
    async def test_the_file_api_honours_the_programs_permissions(self, any_engine: Engine, any_ws: Ws) -> None:
        """A file the program made unreadable or read-only is ``PermissionError`` for the file API when it is for the
        program, and readable or writable when the program may anyway (root ignoring mode bits on local; a machine
        sandbox's user, who may read every file of its sandbox); a refused write changes nothing."""
        fs = any_engine.fs
        await fs.put_files(any_ws, [PutFile("work/locked.txt", b"secret"), PutFile("work/ro.txt", b"keep")])
        probe = "cat locked.txt >/dev/null 2>&1 && echo read; { true >> ro.txt; } 2>/dev/null && echo write; true"
        r = await run(any_engine, any_ws, f"chmod 000 locked.txt && chmod 444 ro.txt && {{ {probe}; }}")
        assert r.exit_code == 0, r.stderr
        program_reads, program_writes = "read" in r.stdout.split(), "write" in r.stdout.split()
        if program_reads:
            assert (await fs.read_file(any_ws, "work/locked.txt")).content == b"secret"
        else:
            with pytest.raises(PermissionError):
                await fs.read_file(any_ws, "work/locked.txt")
        if program_writes:
            await fs.put_files(any_ws, [PutFile("work/ro.txt", b"replaced")])
            assert (await fs.read_file(any_ws, "work/ro.txt")).content == b"replaced"
            return
        for target in ("work/ro.txt", "work/locked.txt"):
            with pytest.raises(PermissionError):  # the whole batch: the first file is not written either
                await fs.put_files(any_ws, [PutFile("work/new.txt", b"new"), PutFile(target, b"replaced")])
        back = await run(any_engine, any_ws, "chmod 600 locked.txt && cat locked.txt")
        assert back.stdout == "secret"
        assert (await fs.read_file(any_ws, "work/ro.txt")).content == b"keep"
        assert (await fs.read_file(any_ws, "work/locked.txt")).content == b"secret"
        assert not await fs.exists(any_ws, "work/new.txt")

    async def test_file_streams_move_what_put_and_read_move(self, any_engine: Engine, any_ws: Ws) -> None:
        """Where the file system streams (``SupportsFileStreams``, what ``execspace serve``'s file API runs on), a file
        written and read in chunks is the file ``put_files`` and ``read_file`` see, and the same paths are refused; a
        stream over its cap changes nothing."""
        fs = file_streams(any_engine)
        data = bytes(range(256)) * 4096  # several chunks
        written = await fs.write_stream(
            any_ws, "work/s/big.bin", stream_of(data[:1000], data[1000:]), max_bytes=len(data)
        )
        assert written == len(data)
        assert (await any_engine.fs.read_file(any_ws, "work/s/big.bin")).content == data
        reader = await fs.open_reader(any_ws, f"{any_ws.path}/work/s/big.bin")  # the program's view of the path too
        assert reader.size == len(data) and b"".join([chunk async for chunk in reader.chunks()]) == data
        for bad in ("../escape.txt", "/etc/escape.txt", "work/../../escape.txt"):
            with pytest.raises(PathDenied):
                await fs.write_stream(any_ws, bad, stream_of(b"x"), max_bytes=10)
            with pytest.raises(PathDenied):
                await fs.open_reader(any_ws, bad)
        with pytest.raises(IsADirectoryError):
            await fs.open_reader(any_ws, "work/s")
        with pytest.raises(IsADirectoryError):
            await fs.write_stream(any_ws, "work/s", stream_of(b"x"), max_bytes=10)
        with pytest.raises(FileNotFoundError):
            await fs.open_reader(any_ws, "work/absent.bin")
        with pytest.raises(LimitExceeded):
            await fs.write_stream(any_ws, "work/s/big.bin", stream_of(b"1234", b"5678"), max_bytes=6)
        assert (await any_engine.fs.read_file(any_ws, "work/s/big.bin")).content == data
        assert [e.path for e in await any_engine.fs.list(any_ws, ["work/s/*"])] == ["work/s/big.bin"]

    async def test_file_metadata_stays_with_its_file(self, any_engine: Engine, any_ws: Ws) -> None:
        """Where the file system keeps metadata (``SupportsFileMetadata``), it is the file's: read back as written,
        replaced whole, kept through a rename, gone when the file is written anew; a link, a missing path and a
        file without any have none; envd's rules and the workspace's confinement hold."""
        fs = await file_metadata(any_engine, any_ws)
        await any_engine.fs.put_files(any_ws, [PutFile("work/m/a.txt", b"a"), PutFile("work/m/b.txt", b"b")])
        assert await fs.write_metadata(any_ws, "work/m/a.txt", {"author": "mish", "purpose": "upload"})
        assert await fs.write_metadata(any_ws, "work/m", {"dir": "yes"})
        found = await fs.read_metadata(any_ws, ["work/m/a.txt", "work/m/b.txt", "work/m", "work/absent"])
        assert found == [{"author": "mish", "purpose": "upload"}, {}, {"dir": "yes"}, {}]
        assert await fs.write_metadata(any_ws, "work/m/a.txt", {"author": "mish"})  # the whole set, replaced
        await any_engine.fs.rename(any_ws, "work/m/a.txt", "work/m/renamed.txt")
        assert await fs.read_metadata(any_ws, [f"{any_ws.path}/work/m/renamed.txt"]) == [{"author": "mish"}]
        await any_engine.fs.put_files(any_ws, [PutFile("work/m/renamed.txt", b"anew")])
        assert await fs.read_metadata(any_ws, ["work/m/renamed.txt"]) == [{}]
        for bad in ({"": "v"}, {"tab\tkey": "v"}, {"k": "line\n"}, {"k": "é"}, {"k" * 247: "v"}, {"k": "v" * 4096}):
            with pytest.raises(execspace.UsageError):
                await fs.write_metadata(any_ws, "work/m/b.txt", bad)
        assert await fs.read_metadata(any_ws, ["work/m/b.txt"]) == [{}]
        with pytest.raises(FileNotFoundError):
            await fs.write_metadata(any_ws, "work/absent", {"k": "v"})
        for escape in ("../escape.txt", "/etc/passwd", "work/../../x"):
            with pytest.raises(PathDenied):
                await fs.write_metadata(any_ws, escape, {"k": "v"})
            with pytest.raises(PathDenied):
                await fs.read_metadata(any_ws, [escape])

    @needs(Feature.PROGRAMS)
    async def test_file_metadata_is_what_the_program_sees(self, any_engine: Engine, any_ws: Ws) -> None:
        """The metadata is the file's own: a program reads what was written and what it sets is read back; a link
        it makes holds none (its target's is not read through it), and a file it gave a second name (a hard link,
        which could be a host file's) is neither read nor written."""
        fs = await file_metadata(any_engine, any_ws)
        await any_engine.fs.put_files(any_ws, [PutFile("work/x.txt", b"x")])
        assert await fs.write_metadata(any_ws, "work/x.txt", {"from": "api"})
        await any_engine.fs.put_files(any_ws, [PutFile("work/h.txt", b"h")])
        assert await fs.write_metadata(any_ws, "work/h.txt", {"k": "v"})
        script = (
            "import os; print(os.getxattr('x.txt', 'user.e2b.from').decode());"
            " os.setxattr('x.txt', 'user.e2b.by', b'program'); os.symlink('x.txt', 'link'); os.link('h.txt', 'hard')"
        )
        r = await run(any_engine, any_ws, f'cd "$WORKSPACE_DIR/work" && python3 -c "{script}"')
        if r.exit_code == 127:
            pytest.skip(f"{any_engine.name}'s programs have no python3 to set an attribute with")
        assert (r.exit_code, r.stdout.strip()) == (0, "api"), r.stderr
        found = await fs.read_metadata(any_ws, ["work/x.txt", "work/link", "work/hard", "work/h.txt"])
        assert found == [{"from": "api", "by": "program"}, {}, {}, {}]  # a file with two names: either may be a host's
        with pytest.raises(PathDenied):
            await fs.write_metadata(any_ws, "work/hard", {"k": "w"})

    @needs(Feature.PROGRAMS)
    async def test_file_streams_honour_the_programs_permissions(self, any_engine: Engine, any_ws: Ws) -> None:
        """A file the program made unreadable or read-only is refused to the streams as to ``read_file`` and
        ``put_files`` (where the program may anyway, so may they)."""
        fs = file_streams(any_engine)
        await any_engine.fs.put_files(any_ws, [PutFile("work/locked.txt", b"secret"), PutFile("work/ro.txt", b"keep")])
        probe = "cat locked.txt >/dev/null 2>&1 && echo read; true"
        r = await run(any_engine, any_ws, f"chmod 000 locked.txt && chmod 444 ro.txt && {{ {probe}; }}")
        assert r.exit_code == 0, r.stderr
        if "read" in r.stdout.split():  # root ignoring mode bits (local): the file API may too
            reader = await fs.open_reader(any_ws, "work/locked.txt")
            assert b"".join([chunk async for chunk in reader.chunks()]) == b"secret"
            return
        with pytest.raises(PermissionError):
            await fs.open_reader(any_ws, "work/locked.txt")
        with pytest.raises(PermissionError):
            await fs.write_stream(any_ws, "work/ro.txt", stream_of(b"replaced"), max_bytes=100)
        assert (await any_engine.fs.read_file(any_ws, "work/ro.txt")).content == b"keep"
