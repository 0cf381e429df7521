"""Behaviour every backend must show, written once (the conformance kit; fsspec's ``tests/abstract`` is the model).

Bind it in a test module of yours, and every case here (new ones too) runs on your engine::

    from execspace.testing.binding import backend_binding, bind
    from execspace.testing.conformance import *  # noqa: F403 - the cases and their fixtures

    engine_binding = bind(backend_binding("mybackend", options={"region": "test"}))

A case that needs more than the file API says so with ``@needs(Feature.…)``; a binding declares what its engine
lacks (``lacks={Feature.PROGRAMS: "why"}``) and those cases are skipped with that reason. Needs pytest and
pytest-asyncio; cases take the ``any_engine`` and ``any_ws`` fixtures.

No ``__all__``: the star import takes every public name, so a case appended here needs no other edit (the
helpers it brings along are harmless: cases resolve names in this module).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import execspace
from execspace import (
    CapabilityError,
    InputSpec,
    OutputSpec,
    PathDenied,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
)

# the fixtures, for binding modules to star-import with the cases
from execspace.testing.binding import Feature, any_engine, any_ws, needs, needs_programs

pytestmark = pytest.mark.asyncio

Engine = execspace.BaseEngine
Ws = execspace.Workspace


async def run(engine: Engine, ws: Ws, script: str, **kw: object) -> execspace.RunResult:
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], **kw))  # type: ignore[arg-type]


@needs(Feature.PROGRAMS)
async def test_exit_code_and_streams(any_engine: Engine, any_ws: Ws) -> None:
    r = await run(any_engine, any_ws, "echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert not r.timed_out and r.run_dir.startswith("runs/")


@needs(Feature.PROGRAMS)
async def test_workspace_variables_and_cwd(any_engine: Engine, any_ws: Ws) -> None:
    r = await run(any_engine, any_ws, 'echo "$WORKSPACE_DIR|$OUTPUT_DIR|$WORK_DIR|$HOME|$TMPDIR"; pwd')
    root = any_ws.path
    first, cwd = r.stdout.splitlines()
    assert first == f"{root}|{root}/out|{root}/work|{root}/home|{root}/tmp"
    assert cwd == f"{root}/work"


@needs(Feature.PROGRAMS)
async def test_files_round_trip(any_engine: Engine, any_ws: Ws) -> None:
    await any_engine.fs.put_files(any_ws, [PutFile("work/in.txt", b"abc\n")])
    r = await run(any_engine, any_ws, 'tr a-z A-Z < in.txt > "$OUTPUT_DIR/up.txt"')
    assert r.exit_code == 0, r.stderr
    files = await any_engine.fs.collect(any_ws, ["out/**"])
    assert [(f.name, f.content) for f in files] == [("out/up.txt", b"ABC\n")]


async def test_put_refuses_escape(any_engine: Engine, any_ws: Ws) -> None:
    for bad in ("../x", "/etc/x", "work/../../x"):
        with pytest.raises(PathDenied):
            await any_engine.fs.put_files(any_ws, [PutFile(bad, b"x")])


async def test_files_round_trip_without_a_program(any_engine: Engine, any_ws: Ws) -> None:
    """The file API alone (what an engine that runs no programs still offers)."""
    await any_engine.fs.put_files(any_ws, [PutFile("out/a.txt", b"a\n"), PutFile("out/sub/b.bin", b"\0\1")])
    written = await any_engine.fs.stage_inputs(any_ws, [InputSpec(b"1,2\n", dest="work/inputs/d.csv")])
    assert written == ["work/inputs/d.csv"]
    staged = await any_engine.fs.collect(any_ws, ["work/inputs/*"])
    assert [(f.name, f.content) for f in staged] == [("work/inputs/d.csv", b"1,2\n")]
    manifest = await any_engine.fs.collect_outputs(any_ws, OutputSpec(inline=True))
    assert sorted((f.name, f.content) for f in manifest.files) == [("out/a.txt", b"a\n"), ("out/sub/b.bin", b"\0\1")]


@needs(Feature.PROGRAMS)
async def test_collect_ignores_planted_symlink(any_engine: Engine, any_ws: Ws, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    secret.chmod(0o644)
    r = await run(any_engine, any_ws, f'ln -s {secret} "$OUTPUT_DIR/leak"; ln -s /etc "$OUTPUT_DIR/etc"; echo ok')
    assert r.exit_code == 0
    files = await any_engine.fs.collect(any_ws, ["out/**"])
    assert all(b"host secret" not in f.content for f in files)
    assert files == []


@needs(Feature.PROGRAMS)
async def test_timeout_kills_tree_and_keeps_output(any_engine: Engine, any_ws: Ws) -> None:
    r = await run(any_engine, any_ws, "echo started; (sleep 30 &); sleep 30", timeout=0.5)
    assert r.timed_out and r.limit_hit == "timeout"
    assert r.stdout == "started\n"
    assert r.duration < 10


@needs(Feature.PROGRAMS)
async def test_output_is_capped(any_engine: Engine, any_ws: Ws) -> None:
    r = await run(
        any_engine, any_ws, "head -c 3000000 /dev/zero | tr '\\0' x", limits=ResourceLimits(output_bytes=1000)
    )
    assert r.stdout_truncated and r.stdout_total_bytes == 3_000_000
    assert "bytes omitted" in r.stdout and len(r.raw_stdout) < 1200


@needs(Feature.PROGRAMS)
async def test_stdin(any_engine: Engine, any_ws: Ws) -> None:
    r = await any_engine.runner.run_program(any_ws, RunProgramSpec("cat", stdin=b"x" * 300_000))
    assert r.stdout_total_bytes == 300_000


@needs(Feature.PROGRAMS)
async def test_clean_env_drops_host_variables(any_engine: Engine, any_ws: Ws, monkeypatch: pytest.MonkeyPatch) -> None:
    r = await run(any_engine, any_ws, "env", clean_env=True, env={"MINE": "1"})
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
    assert "MINE" in names and "LANG" not in names and "WORKSPACE_DIR" in names


@needs(Feature.PROGRAMS)
async def test_secrets_not_inherited(any_engine: Engine, any_ws: Ws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANG", "C.UTF-8")
    os.environ["EXECSPACE_TEST_API_KEY"] = "s3cr3t"
    try:
        r = await run(any_engine, any_ws, "env")
    finally:
        del os.environ["EXECSPACE_TEST_API_KEY"]
    assert "s3cr3t" not in r.stdout


@needs(Feature.PROGRAMS)
async def test_streaming_chunks_arrive_before_exit(any_engine: Engine, any_ws: Ws) -> None:
    spec = RunProgramSpec("sh", ["-c", "echo first; sleep 1; echo second"])
    async with await any_engine.runner.start_program(any_ws, spec) as handle:
        stream = handle.stream()
        first = await asyncio.wait_for(anext(stream), 0.9)
        assert first.data == b"first\n"
        rest = [c.data async for c in stream]
        result = await handle.wait()
    assert b"".join(rest) == b"second\n" and result.exit_code == 0


@needs(Feature.PROGRAMS)
async def test_interactive_stdin(any_engine: Engine, any_ws: Ws) -> None:
    async with await any_engine.runner.start_program(any_ws, RunProgramSpec("cat")) as handle:
        await handle.write_stdin("hello\n")
        await handle.close_stdin()
        result = await handle.wait()
    assert result.stdout == "hello\n"


@needs(Feature.PROGRAMS)
async def test_unenforceable_request_fails_closed(any_engine: Engine, any_ws: Ws) -> None:
    caps = any_engine.describe()
    if "pids" in caps.enforced_limits:
        pytest.skip("this backend enforces pids")
    with pytest.raises(CapabilityError):
        await run(any_engine, any_ws, "echo should-not-run", limits=ResourceLimits(pids=10))


@needs(Feature.PROGRAMS)
async def test_stage_bytes_and_collect_outputs(any_engine: Engine, any_ws: Ws) -> None:
    written = await any_engine.fs.stage_inputs(any_ws, [InputSpec(b"1,2\n", dest="work/inputs/d.csv")])
    assert written == ["work/inputs/d.csv"]
    r = await run(any_engine, any_ws, 'cp inputs/d.csv "$OUTPUT_DIR/copy.csv"')
    assert r.exit_code == 0, r.stderr
    manifest = await any_engine.fs.collect_outputs(any_ws, OutputSpec(inline=True))
    assert [(f.name, f.content, f.mime_type) for f in manifest.files] == [("out/copy.csv", b"1,2\n", "text/csv")]


@needs(Feature.PROGRAMS)
async def test_missing_command_is_127(any_engine: Engine, any_ws: Ws) -> None:
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
async def test_unrunnable_program_exit_codes_as_a_shell(any_engine: Engine, any_ws: Ws, cmd: str, code: int) -> None:
    """Every backend reports a program that cannot be started as sh does: 127 not found, 126 not executable."""
    r = await any_engine.runner.run_program(any_ws, RunProgramSpec(cmd))
    assert r.exit_code == code, (r.exit_code, r.stderr)
    assert cmd in r.stderr
