"""The blocking facade: the same async objects, driven from a loop thread it owns."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import execspace.sync
from execspace import (
    CodeBlock,
    CodeExecutionInput,
    Engine,
    PathDenied,
    PutFile,
    RunProgramSpec,
    UsageError,
    Workspace,
)
from execspace.sync import SyncEngine


def loop_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("execspace-sync")}


def pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_run_program_put_and_collect_files(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        assert engine.describe().backend == "local" and engine.name == "local"
        ws = engine.manager.create_workspace("sync/run")
        assert engine.manager.get_workspace("sync/run") == ws
        engine.fs.put_files(
            ws,
            [
                PutFile(
                    "work/hi.py",
                    "import os\nopen(os.environ['OUTPUT_DIR'] + '/r.txt', 'w').write('R')\nprint('hi')",
                )
            ],
        )
        result = engine.runner.run_program(ws, RunProgramSpec("python3", ["hi.py"]))
        assert result.exit_code == 0 and result.stdout == "hi\n"
        files = engine.fs.collect(ws, ["out/**"])
        assert [(f.name, f.content) for f in files] == [("out/r.txt", b"R")]
        assert engine.fs.read_file(ws, "work/hi.py").text.endswith("print('hi')")
        manifest = engine.fs.collect_outputs(ws)
        assert [f.name for f in manifest.files] == ["out/r.txt"]
        assert (tmp_path / Path(ws.path).name / "out" / "r.txt").read_text() == "R"


def test_errors_cross_the_thread_unchanged(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/errors")
        with pytest.raises(FileNotFoundError):
            engine.fs.read_file(ws, "work/missing.txt")
        with pytest.raises(PathDenied):
            engine.fs.put_files(ws, [PutFile("../escape.txt", "x")])
        assert not (tmp_path / "escape.txt").exists()


def test_backend_specific_coroutine_methods_are_proxied_by_name(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/extra")
        engine.fs.put_files(ws, [PutFile("out/a.txt", "abc")])
        assert engine.fs.disk_usage(ws) > 0
        with pytest.raises(AttributeError):
            _ = engine.fs.host_roots  # plain attributes of the async object are not exposed


def test_start_program_streams_and_takes_stdin(tmp_path: Path) -> None:
    upper = (
        "import sys\nfor line in sys.stdin:\n    print(line.strip().upper(), flush=True)\nprint('bye', file=sys.stderr)"
    )
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/stream")
        with engine.runner.start_program(ws, RunProgramSpec("python3", ["-u", "-c", upper], timeout=30)) as handle:
            assert handle.pid is not None
            chunks = handle.iter_output()
            handle.write_stdin("hello\n")
            seen = b""
            while not seen.endswith(b"\n"):  # arrives while the program still waits for more stdin
                chunk = next(chunks)
                assert chunk.stream == "stdout"
                seen += chunk.data
            assert seen == b"HELLO\n"
            assert pid_alive(handle.pid)
            handle.write_stdin(b"world\n")
            handle.close_stdin()
            rest = list(chunks)
            result = handle.wait()
        assert b"".join(c.data for c in rest if c.stream == "stdout") == b"WORLD\n"
        assert b"".join(c.data for c in rest if c.stream == "stderr") == b"bye\n"
        assert result.exit_code == 0 and result.stdout == "HELLO\nWORLD\n"


def test_output_produced_before_iteration_is_not_lost(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/late")
        handle = engine.runner.start_program(ws, RunProgramSpec("python3", ["-c", "print('early')"]))
        result = handle.wait()
        assert result.stdout == "early\n"
        assert b"".join(c.data for c in handle.iter_output()) == b"early\n"
        handle.close()


def test_kill_stops_a_started_program(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/kill")
        handle = engine.runner.start_program(ws, RunProgramSpec("sleep", ["30"], timeout=60))
        started = time.monotonic()
        handle.kill()
        result = handle.wait()
        assert time.monotonic() - started < 10
        assert result.exit_code < 0
        handle.close()


def test_leaving_the_block_kills_programs_still_running(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/leftover")
        handle = engine.runner.start_program(ws, RunProgramSpec("sleep", ["30"], timeout=60))
        pid = handle.pid
        assert pid is not None and pid_alive(pid)
    assert not pid_alive(pid)
    handle.close()  # already reaped by the engine: a no-op


def test_sync_api_refuses_to_run_inside_its_own_loop_thread(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:

        async def reenter(_: Engine) -> Workspace:
            return engine.manager.create_workspace("sync/inner")

        with pytest.raises(UsageError, match="deadlock"):
            engine.call(reenter)
        # the loop survives the refused call
        assert engine.manager.create_workspace("sync/after").id == "sync/after"


def test_call_runs_coroutines_on_the_engine(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:

        async def make(e: Engine) -> Workspace:
            return await e.manager.create_workspace("sync/call")

        ws = engine.call(make)
        assert Path(ws.path).is_dir()


def test_engine_and_loop_thread_are_closed_after_the_block(tmp_path: Path) -> None:
    before = loop_threads()
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        assert len(loop_threads() - before) == 1
        ws = engine.manager.create_workspace("sync/closed")
    assert engine.closed
    assert loop_threads() == before
    with pytest.raises(UsageError):
        _ = engine.async_engine.manager  # the async engine itself was closed
    with pytest.raises(UsageError, match="closed"):
        engine.manager.create_workspace("again")
    with pytest.raises(UsageError, match="closed"):
        engine.fs.put_files(ws, [PutFile("work/x", "x")])
    engine.close()  # idempotent


def test_engine_is_closed_when_the_block_raises(tmp_path: Path) -> None:
    before = loop_threads()
    holder: list[SyncEngine] = []
    with (
        pytest.raises(RuntimeError, match="boom"),
        execspace.sync.open_engine("local", workspace_root=tmp_path) as engine,
    ):
        holder.append(engine)
        raise RuntimeError("boom")
    assert holder[0].closed and loop_threads() == before


def test_failed_open_leaves_no_thread() -> None:
    before = loop_threads()
    with pytest.raises(execspace.UnsupportedBackend), execspace.sync.open_engine("no-such-backend"):
        pass
    assert loop_threads() == before


def test_two_engines_have_separate_loops(tmp_path: Path) -> None:
    with (
        execspace.sync.open_engine("local", workspace_root=tmp_path / "a") as a,
        execspace.sync.open_engine("local", workspace_root=tmp_path / "b") as b,
    ):
        assert len(loop_threads()) == 2
        ws_a = a.manager.create_workspace("x")
        b.close()
        assert a.runner.run_program(ws_a, RunProgramSpec("sh", ["-c", "echo still"])).stdout == "still\n"


def test_sync_code_executor(tmp_path: Path) -> None:
    before = loop_threads()
    with execspace.sync.code_executor("local", workspace_root=tmp_path, timeout=20) as ex:
        blocks = [
            CodeBlock(
                "python",
                "import os\nopen(os.environ['OUTPUT_DIR'] + '/f.txt', 'w').write('F')\nprint('sync')",
            )
        ]
        result = ex.execute_code(CodeExecutionInput(blocks, execution_id="s"))
        assert result.output == "sync\n"
        assert [(f.name, f.content) for f in result.output_files] == [("out/f.txt", b"F")]
    assert loop_threads() == before
    with pytest.raises(UsageError):
        ex.execute_code(CodeExecutionInput(blocks))


def test_sync_code_executor_close_without_use(tmp_path: Path) -> None:
    before = loop_threads()
    ex = execspace.sync.code_executor("local", workspace_root=tmp_path)
    ex.close()
    ex.close()
    assert loop_threads() == before


def test_code_executor_over_a_sync_engine_shares_its_loop(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        with engine.code_executor(timeout=20) as ex:
            result = ex.execute_code(CodeExecutionInput([CodeBlock("sh", "echo $((1+2)) > state")], "shared"))
            assert result.ok
        # the executor did not own the engine: it still works, and sees the same workspace
        ws = engine.manager.create_workspace("shared")
        assert engine.fs.read_file(ws, "work/state").content == b"3\n"
    assert os.path.isdir(tmp_path)


def test_unread_output_never_blocks_the_program_and_is_capped(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/flood")
        spec = RunProgramSpec("python3", ["-c", "import sys; sys.stdout.write('x' * 5_000_000)"], timeout=30)
        with engine.runner.start_program(ws, spec, buffer_bytes=100_000) as handle:
            result = handle.wait()  # nobody iterates: the program must still run to the end
            kept = sum(len(c.data) for c in handle.iter_output())
        assert result.exit_code == 0 and not result.timed_out
        assert result.stdout_total_bytes == 5_000_000
        assert kept <= 100_000
        assert kept + handle.dropped_bytes == 5_000_000


def test_started_programs_are_listed_signalled_and_inspected(tmp_path: Path) -> None:
    import signal

    with execspace.sync.open_engine("local", workspace_root=tmp_path / "ws") as engine:
        ws = engine.manager.create_workspace("procs")
        script = 'trap "echo bye; exit 5" TERM; echo up; while :; do sleep 0.05; done'
        with engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", script], tag="loop")) as handle:
            assert next(handle.iter_output()).data == b"up\n"
            assert [p.tag for p in engine.runner.list_programs(ws)] == ["loop"]
            assert handle.info.tag == "loop" and handle.info.pid == handle.pid
            engine.runner.signal_program(ws, "loop", signal.SIGTERM)
            result = handle.wait()
            # stdout only: the shell may say on stderr that the signal also ended its sleep
            rest = b"".join(c.data for c in handle.iter_output() if c.stream == "stdout")
            assert (result.exit_code, rest, result.stdout) == (5, b"bye\n", "up\nbye\n")
        with pytest.raises(execspace.ProgramNotFound):
            engine.runner.signal_program(ws, "loop", signal.SIGTERM)


def test_sandbox_session_mode_through_the_facade(tmp_path: Path) -> None:
    import asyncio

    from execspace.registry import probe_backend
    from execspace.testing.processes import pids_with, tagged, wait_no_process
    from tests.support import make_traversable

    probe = asyncio.run(probe_backend("sandbox", mode="session"))
    if not probe.ok:
        pytest.skip(f"sandbox session mode does not work here: {probe.reason}")
    make_traversable(tmp_path)  # as root, the workspace's sandbox uid must reach it
    tag = f"sync-session-{os.getpid()}"
    with execspace.sync.open_engine("sandbox", mode="session", workspace_root=tmp_path / "ws") as engine:
        assert engine.describe().details["mode"].startswith("session:")
        ws = engine.manager.create_workspace("sync/session")
        server = engine.runner.start_program(ws, RunProgramSpec("sleep", ["60"], env=tagged(tag)))
        # a program of one call is there for the next: the same session's PID namespace
        seen = engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", f"kill -0 {server.pid} && echo $$"]))
        assert seen.exit_code == 0, seen
        assert int(seen.stdout) < 100  # a pid of the session's namespace, not of the host
        assert pids_with(tag)
    assert not wait_no_process(tag), "a program of the session outlived the engine"


# every public member of the seam's protocols, and what its blocking twin is called where the name differs
_SYNC_TWINS: list[tuple[type, type]] = [
    (execspace.protocols.Engine, execspace.sync.SyncEngine),
    (execspace.protocols.SupportsKernels, execspace.sync.SyncEngine),
    (execspace.protocols.WorkspaceManager, execspace.sync.SyncWorkspaceManager),
    (execspace.protocols.SupportsSnapshots, execspace.sync.SyncWorkspaceManager),
    (execspace.protocols.WorkspaceFS, execspace.sync.SyncWorkspaceFS),
    (execspace.protocols.SupportsFileStreams, execspace.sync.SyncWorkspaceFS),
    (execspace.protocols.FileReader, execspace.sync.SyncFileReader),
    (execspace.protocols.ProgramRunner, execspace.sync.SyncProgramRunner),
    (execspace.protocols.SupportsFreezing, execspace.sync.SyncProgramRunner),
    (execspace.protocols.ProgramHandle, execspace.sync.SyncProgramHandle),
    (execspace.protocols.Kernels, execspace.sync.SyncKernels),
]
_RENAMED = {"stream": "iter_output", "aclose": "close", "__aenter__": "__enter__", "__aexit__": "__exit__"}
# the fs's plain attributes and its synchronous path check belong to the async object (engine.async_engine.fs)
_NOT_TWINNED = {"WorkspaceFS": {"artifacts", "host_roots", "locks", "check"}}


def _public_members(protocol: type) -> set[str]:
    names = {n for n in vars(protocol) if not n.startswith("_") or n in _RENAMED}
    names |= set(getattr(protocol, "__annotations__", {}))
    return names - {"__annotations__"} - _NOT_TWINNED.get(protocol.__name__, set())


def _has(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in cls.__annotations__


@pytest.mark.parametrize(("protocol", "twin"), _SYNC_TWINS, ids=lambda c: c.__name__)
def test_every_member_of_the_seam_has_a_blocking_twin_with_its_parameters(protocol: type, twin: type) -> None:
    import inspect

    members = _public_members(protocol)
    assert members, protocol
    missing = sorted(n for n in members if not _has(twin, _RENAMED.get(n, n)))
    assert not missing, f"{twin.__name__} lacks twins of {protocol.__name__}.{missing}"
    for name in members - set(_RENAMED):
        async_member, sync_member = getattr(protocol, name, None), getattr(twin, name, None)
        if not callable(async_member) or not callable(sync_member):  # attributes and properties
            continue
        async_params = list(inspect.signature(async_member).parameters)
        # a twin may add keywords of its own (start_program's buffer_bytes), never drop or reorder one
        sync_params = list(inspect.signature(sync_member).parameters)[: len(async_params)]
        assert sync_params == async_params, f"{twin.__name__}.{name}"


def test_every_sync_class_is_exported() -> None:
    classes = {twin.__name__ for _, twin in _SYNC_TWINS}
    assert classes <= set(execspace.sync.__all__)


def test_snapshots_fork_and_restore_through_the_facade(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/snap")
        engine.fs.put_files(ws, [PutFile("work/a.txt", "one")])
        snap = engine.manager.snapshot(ws, "first")
        engine.fs.put_files(ws, [PutFile("work/a.txt", "two")])
        [fork] = engine.manager.fork(snap, ids=["sync/fork"])
        assert engine.fs.read_file(fork, "work/a.txt").content == b"one"
        engine.manager.restore(ws, "first")
        assert engine.fs.read_file(ws, "work/a.txt").content == b"one"
        assert [s.name for s in engine.manager.list_snapshots()] == ["first"]
        engine.manager.remove_snapshot(snap)
        assert engine.manager.list_snapshots() == []


def test_files_stream_in_and_out_through_the_facade(tmp_path: Path) -> None:
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/streams")
        parts = [b"x" * 100_000, b"y" * 7]
        assert engine.fs.write_stream(ws, "work/big.bin", iter(parts), max_bytes=1 << 20) == 100_007
        with engine.fs.open_reader(ws, "work/big.bin") as reader:
            assert reader.size == 100_007
            assert b"".join(reader.chunks()) == b"".join(parts)
        with pytest.raises(execspace.LimitExceeded):
            engine.fs.write_stream(ws, "work/big.bin", iter(parts), max_bytes=1000)
        assert engine.fs.read_file(ws, "work/big.bin").content == b"".join(parts)  # left as it was


def test_get_program_attach_and_frozen_through_the_facade(tmp_path: Path) -> None:
    script = "import sys, time\nprint('up', flush=True)\nfor line in sys.stdin:\n    print(line.strip(), flush=True)"
    with execspace.sync.open_engine("local", workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/get")
        with engine.runner.start_program(ws, RunProgramSpec("python3", ["-c", script], tag="echo")) as started:
            assert next(started.iter_output()).data == b"up\n"
            other = engine.runner.get_program(ws, "echo")
            assert other.pid == started.pid
            attached = started.attach(from_start=False)  # registered now: sees only what comes next
            with engine.runner.frozen(ws):
                state = Path(f"/proc/{started.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                assert state in "Tt", state
            started.write_stdin("again\n")
            assert next(attached).data == b"again\n"
            history = b""
            for chunk in other.iter_output():  # the other handle reads from the program's start
                history += chunk.data
                if history == b"up\nagain\n":
                    break
            assert history == b"up\nagain\n"
            started.close_stdin()
            assert started.wait().exit_code == 0
            other.close()
        with pytest.raises(execspace.CapabilityError):
            _ = engine.kernels


def test_kernels_through_the_facade(tmp_path: Path) -> None:
    pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")
    from execspace import ResourceLimits
    from execspace.backends.jupyter import HostKernels

    with execspace.sync.open_engine("jupyter", mode=HostKernels(pool_size=0), workspace_root=tmp_path) as engine:
        ws = engine.manager.create_workspace("sync/kernel")
        assert engine.kernels.handles("python")
        limits = ResourceLimits()
        first, _ = engine.kernels.run_block(ws, CodeBlock("python", "x = 20"), 0, timeout=60, limits=limits)
        second, _ = engine.kernels.run_block(ws, CodeBlock("python", "print(x * 2 + 2)"), 1, timeout=60, limits=limits)
        assert (first.exit_code, second.exit_code, second.stdout) == (0, 0, "42\n"), (first, second)
