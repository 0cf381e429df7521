"""The e2b backend against a real ``execspace serve`` and the official SDK: what only a remote service can do.

Persistence per session (across engines and client processes), sandboxes given by id (never killed by us), which
sandboxes close and cleanup kill, expiry while in use, a server that dies mid-call, back-pressure and a wrong key.
The conformance kit (tests/conformance, mode ``e2b-serve``) covers the Engine contract itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import IO

import pytest

import execspace
from execspace import BackendError, PutFile, RunProgramSpec, SandboxLost, SetupFailed
from execspace.envpolicy import CORE_VARIABLES, EnvPolicy
from execspace.testing.conformance import read_until
from execspace.workspace.layout import workspace_env

pytest.importorskip("e2b", reason="the e2b backend needs the official SDK (pip install 'execspace[e2b]')")
pytest.importorskip("uvicorn", reason="the tests run against execspace serve (pip install 'execspace[serve]')")

from e2b import AsyncSandbox, SandboxQuery

from tests.server.conftest import Server, running_server

WS_KEY = "execspace.workspace"


def _connection(server: Server) -> dict[str, str]:
    return {"api_url": server.url, "sandbox_url": server.url, "api_key": server.key}


def _engine(server: Server, **options: object) -> AbstractAsyncContextManager[execspace.BaseEngine]:
    return execspace.open_engine("e2b", **_connection(server), template="base", kill_grace=1.0, **options)


async def _running(server: Server, **metadata: str) -> dict[str, str]:
    """The sandboxes the server reports running (id → workspace key), with that metadata."""
    query = SandboxQuery(metadata=metadata or None)
    listed = await AsyncSandbox.list(query=query, **_connection(server)).next_items()
    return {s.sandbox_id: (s.metadata or {}).get(WS_KEY, "") for s in listed}


async def _until(what: str, check: object, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        await asyncio.sleep(0.1)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A server of this test's own (killed, or made to refuse)."""
    with running_server(tmp_path / "serve") as server:
        yield server


@pytest.fixture
async def mark(request: pytest.FixtureRequest, e2b_server: Server) -> AsyncIterator[str]:
    """Metadata unique to this test; its sandboxes are killed when it ends, whatever it left."""
    tag = f"{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"
    yield tag
    for sandbox_id in await _running(e2b_server, **{"execspace.test": tag}):
        await AsyncSandbox.kill(sandbox_id, **_connection(e2b_server))


async def test_session_persists_across_engines(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as first:
        ws = await first.manager.create_workspace("persist-a")
        await first.fs.put_files(ws, [PutFile("work/state.txt", b"kept\n")])
    # the first engine is closed: its session sandbox stays, found again by metadata
    (sandbox_id,) = await _running(e2b_server, **{"execspace.test": mark})
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as second:
        again = await second.manager.get_workspace("persist-a")
        result = await second.runner.run_program(again, RunProgramSpec("cat", ["state.txt"], cwd="work"))
        assert result.stdout == "kept\n"
        assert list(await _running(e2b_server, **{"execspace.test": mark})) == [sandbox_id]
        await second.manager.cleanup(again)  # ours: cleanup kills it
    assert await _running(e2b_server, **{"execspace.test": mark}) == {}


_CLIENT = textwrap.dedent(
    """
    import asyncio, json, sys
    import execspace
    from execspace import PutFile

    async def main(url, key, mark, step):
        async with execspace.open_engine(
            "e2b", api_url=url, sandbox_url=url, api_key=key, template="base", metadata={"execspace.test": mark}
        ) as engine:
            if step == "create":
                ws = await engine.manager.create_workspace("restart")
                await engine.fs.put_files(ws, [PutFile("work/note.txt", b"from the first process")])
            else:
                ws = await engine.manager.get_workspace("restart")
            note = (await engine.fs.read_file(ws, "work/note.txt")).content.decode()
            print(json.dumps({"path": ws.path, "note": note}))

    asyncio.run(main(*sys.argv[1:]))
    """
)


def _client(server: Server, mark: str, step: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT, server.url, server.key, mark, step],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


async def test_session_persists_across_client_processes(e2b_server: Server, mark: str) -> None:
    made = await asyncio.to_thread(_client, e2b_server, mark, "create")
    running = await _running(e2b_server, **{"execspace.test": mark})
    found = await asyncio.to_thread(_client, e2b_server, mark, "find")
    assert found == made == {"path": made["path"], "note": "from the first process"}
    assert await _running(e2b_server, **{"execspace.test": mark}) == running
    assert len(running) == 1


async def test_sandbox_given_by_id_is_never_killed(e2b_server: Server, mark: str) -> None:
    theirs = await AsyncSandbox.create(template="base", metadata={"execspace.test": mark}, **_connection(e2b_server))
    async with _engine(e2b_server, sandbox_id=theirs.sandbox_id) as engine:
        ws = await engine.manager.create_workspace("guest")
        await engine.fs.put_files(ws, [PutFile("work/in.txt", b"x")])
        result = await engine.runner.run_program(ws, RunProgramSpec("ls"))
        assert "in.txt" in result.stdout.split()
        await engine.manager.cleanup(ws)
        # the workspace went, the sandbox stayed
        parent, name = ws.path.rsplit("/", 1)
        assert name not in (await theirs.commands.run(f"ls {parent}")).stdout.split()
    assert theirs.sandbox_id in await _running(e2b_server, **{"execspace.test": mark})
    assert await theirs.is_running()


async def test_turn_sandboxes_are_killed_at_close(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, persistence="turn", metadata={"execspace.test": mark}) as engine:
        await engine.manager.create_workspace("turn-a")
        await engine.manager.create_workspace("turn-b")
        assert len(await _running(e2b_server, **{"execspace.test": mark})) == 2
    assert await _running(e2b_server, **{"execspace.test": mark}) == {}


async def test_a_turn_sandbox_cleaned_up_is_not_killed_again_at_close(tmp_path: Path) -> None:
    """A job that kills its hundreds of sandboxes as it goes (examples/rl_rollouts.py) does not wait at close for as
    many kill calls again: the server sees one DELETE per sandbox."""
    import httpx

    with running_server(tmp_path / "serve", "--verbose", "--pool-size", "0") as server:
        async with _engine(server, persistence="turn") as engine:
            for ws in [await engine.manager.create_workspace(f"turn-{i}") for i in range(3)]:
                await engine.manager.cleanup(ws)
        httpx.get(f"{server.url}/sandboxes/afterclose", headers={"X-API-KEY": server.key}, timeout=30)  # a 404 logged
        assert server.process.stdout is not None
        log = _log_until(server.process.stdout, b"afterclose")
    assert len(re.findall(rb"DELETE /sandboxes/", log)) == 3, log.decode(errors="replace")


def _log_until(stream: IO[bytes], marker: bytes, within: float = 30.0) -> bytes:
    """What a server's log pipe holds up to a line with ``marker`` (the pipe read without blocking)."""
    os.set_blocking(stream.fileno(), False)
    seen = b""
    deadline = time.monotonic() + within
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} in the server's log within {within}s: {seen!r}"
        try:
            chunk = stream.read1(65536)  # type: ignore[attr-defined]
        except BlockingIOError:
            chunk = None
        if not chunk:
            time.sleep(0.05)
        seen += chunk or b""
    return seen


async def test_a_pool_hands_out_sandboxes_made_ahead_and_kills_the_rest_at_close(e2b_server: Server, mark: str) -> None:
    tagged = {"execspace.test": mark, "execspace.pool": "1"}
    async with _engine(e2b_server, persistence="turn", metadata={"execspace.test": mark}, pool_size=2) as engine:
        pool = engine.manager.pool  # type: ignore[attr-defined]
        assert pool is not None and await pool.ready(30)  # each made ahead, its file agent installed
        assert await _count(e2b_server, tagged, 2)
        ws = await engine.manager.create_workspace("pooled")
        await engine.fs.put_files(ws, [PutFile("work/a.txt", b"in a pooled sandbox")])
        assert (await engine.fs.read_file(ws, "work/a.txt")).content == b"in a pooled sandbox"
        assert (await engine.runner.run_program(ws, RunProgramSpec("cat", ["a.txt"]))).stdout == "in a pooled sandbox"
        await _until("the pool topped up", lambda: _count(e2b_server, tagged, 3))  # 2 waiting + the taken one
        # taken from the pool: no sandbox was created for the workspace (that one would be named in its metadata)
        assert "pooled" not in (await _running(e2b_server, **{"execspace.test": mark})).values()
    assert await _running(e2b_server, **{"execspace.test": mark}) == {}


async def test_a_pooled_sandbox_past_its_age_is_killed_and_the_next_create_refills(
    e2b_server: Server, mark: str
) -> None:
    tagged = {"execspace.test": mark, "execspace.pool": "1"}
    options = {"persistence": "turn", "metadata": {"execspace.test": mark}, "pool_size": 1, "pool_max_age": 1.0}
    async with _engine(e2b_server, **options) as engine:
        await _until("the pool filled", lambda: _count(e2b_server, tagged, 1))
        first = set(await _running(e2b_server, **tagged))
        await _until("the pooled sandbox killed at its age", lambda: _count(e2b_server, tagged, 0))
        await engine.manager.create_workspace("later")  # made cold (the pool was empty); it refills the pool

        async def refilled() -> bool:
            now = set(await _running(e2b_server, **tagged))
            return len(now) == 1 and not now & first

        await _until("the pool refilled with a new one", refilled)


async def _count(server: Server, metadata: dict[str, str], n: int) -> bool:
    return len(await _running(server, **metadata)) == n


def test_a_pool_is_refused_where_it_cannot_serve() -> None:
    from execspace import InvalidSpec
    from execspace.backends.e2b import E2BOptions

    with pytest.raises(InvalidSpec, match="pool_size needs persistence='turn'"):
        E2BOptions(pool_size=2)  # per session: found again by the workspace in its metadata
    with pytest.raises(InvalidSpec, match="less than sandbox_timeout"):
        E2BOptions(persistence="turn", pool_size=1, pool_max_age=600, sandbox_timeout=300)


async def test_session_sandboxes_outlive_close_and_die_at_cleanup(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        kept = await engine.manager.create_workspace("kept")
        gone = await engine.manager.create_workspace("gone")
        await engine.manager.cleanup(gone)
    assert set((await _running(e2b_server, **{"execspace.test": mark})).values()) == {kept.path.rsplit("/", 1)[-1]}


async def test_expiry_mid_session_names_what_was_lost(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, sandbox_timeout=3, metadata={"execspace.test": mark}) as engine:
        ws = await engine.manager.create_workspace("expiring")
        await engine.fs.put_files(ws, [PutFile("work/data.txt", b"precious")])
        started = time.monotonic()
        with pytest.raises(SandboxLost, match=r"gone \(expired.*workspace 'expiring.*was lost.*create_workspace"):
            await engine.runner.run_program(ws, RunProgramSpec("sleep", ["30"]))
        assert time.monotonic() - started < 20
        # the next create_workspace starts afresh, in a new sandbox
        fresh = await engine.manager.create_workspace("expiring")
        assert "work/data.txt" not in [e.path for e in await engine.fs.list(fresh, ["work/*"])]


async def test_expiry_per_turn_recreates_the_sandbox(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, persistence="turn", sandbox_timeout=2, metadata={"execspace.test": mark}) as engine:
        ws = await engine.manager.create_workspace("turn-expiring")
        (first,) = await _running(e2b_server, **{"execspace.test": mark})

        async def expired() -> bool:
            return first not in await _running(e2b_server, **{"execspace.test": mark})

        await _until("the sandbox's expiry", expired)
        with pytest.raises(SandboxLost, match=r"A fresh sandbox .* now holds the workspace, empty"):
            await engine.fs.put_files(ws, [PutFile("work/a.txt", b"a")])
        await engine.fs.put_files(ws, [PutFile("work/a.txt", b"a")])
        result = await engine.runner.run_program(ws, RunProgramSpec("cat", ["a.txt"], cwd="work"))
        assert result.stdout == "a"
        assert list(await _running(e2b_server, **{"execspace.test": mark})) not in ([], [first])


async def test_server_killed_mid_call_is_a_clear_error(own_server: Server) -> None:
    async with _engine(own_server, persistence="turn", request_timeout=5.0) as engine:
        ws = await engine.manager.create_workspace("doomed")
        program = await engine.runner.start_program(ws, RunProgramSpec("sleep", ["60"]))
        own_server.process.send_signal(signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(BackendError, match="cannot reach the E2B service"):
            await program.wait()
        assert time.monotonic() - started < 5.0  # the SDK's connection retries, within the request timeout
        started = time.monotonic()
        with pytest.raises(BackendError, match="cannot reach the E2B service"):
            await engine.fs.read_file(ws, "work/x")
        assert time.monotonic() - started < 5.0


async def test_stopped_server_fails_within_the_request_timeout(own_server: Server) -> None:
    async with _engine(own_server, persistence="turn", request_timeout=2.0) as engine:
        ws = await engine.manager.create_workspace("frozen")
        os.kill(own_server.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(BackendError, match="no answer within the timeout"):
                await engine.fs.put_files(ws, [PutFile("work/x", b"x")])
            assert time.monotonic() - started < 2.0 * 4
            started = time.monotonic()
            with pytest.raises(BackendError, match="no answer within"):
                await engine.fs.stat(ws, "work")  # a request to the file agent
            assert time.monotonic() - started < 2.0 * 4
        finally:
            os.kill(own_server.process.pid, signal.SIGCONT)


async def test_back_pressure_says_retry_later(tmp_path: Path) -> None:
    with running_server(tmp_path / "serve", "--max-sandboxes", "1") as server:
        async with _engine(server, persistence="turn") as engine:
            await engine.manager.create_workspace("fits")
            with pytest.raises(BackendError, match=r"at capacity \(429.*retry later"):
                await engine.manager.create_workspace("one-too-many")


async def test_wrong_api_key_is_setup_failed(e2b_server: Server) -> None:
    async with execspace.open_engine(
        "e2b", api_url=e2b_server.url, sandbox_url=e2b_server.url, api_key="e2b_" + "f" * 32, template="base"
    ) as engine:
        with pytest.raises(SetupFailed, match="refused the API key") as caught:
            await engine.manager.create_workspace("locked-out")
        assert "f" * 32 not in str(caught.value)


async def _agents(server: Server, sandbox_id: str) -> list[int]:
    """The pids of our file agents in that sandbox, as envd lists its processes."""
    sandbox = await AsyncSandbox.connect(sandbox_id, **_connection(server))
    return [p.pid for p in await sandbox.commands.list() if ".execspace/agent-" in " ".join([p.cmd, *p.args])]


async def test_file_agent_ends_with_the_engine(e2b_server: Server, mark: str) -> None:
    """A session sandbox outlives the engine; the engine's file agent in it does not."""
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        ws = await engine.manager.create_workspace("agent-ends")
        await engine.fs.put_files(ws, [PutFile("work/a", b"a")])
        (sandbox_id,) = await _running(e2b_server, **{"execspace.test": mark})
        assert len(await _agents(e2b_server, sandbox_id)) == 1

    async def no_agent() -> bool:
        return not await _agents(e2b_server, sandbox_id)

    await _until("the agent's exit", no_agent)


async def test_a_killed_file_agent_is_started_again(e2b_server: Server, mark: str) -> None:
    async with _engine(e2b_server, persistence="turn", metadata={"execspace.test": mark}) as engine:
        ws = await engine.manager.create_workspace("agent-killed")
        await engine.fs.put_files(ws, [PutFile("work/a", b"kept")])
        (sandbox_id,) = await _running(e2b_server, **{"execspace.test": mark})
        (pid,) = await _agents(e2b_server, sandbox_id)
        sandbox = await AsyncSandbox.connect(sandbox_id, **_connection(e2b_server))
        assert await sandbox.commands.kill(pid)  # as a program of the sandbox could

        async def gone() -> bool:
            return pid not in await _agents(e2b_server, sandbox_id)

        await _until("the agent's end", gone)
        assert (await engine.fs.read_file(ws, "work/a")).content == b"kept"
        assert len(await _agents(e2b_server, sandbox_id)) == 1


async def test_many_files_go_up_in_batches_and_their_long_listing_comes_back_whole(e2b_server: Server) -> None:
    """More files than a service takes in one upload; a listing far larger than one chunk of the stream."""
    names = [f"work/d/{'n' * 80}-{i:04}.txt" for i in range(5000)]
    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("long-answer")
        await engine.fs.put_files(ws, [PutFile(name, b"") for name in names])
        listed = [e.path for e in await engine.fs.list(ws, ["work/d/*"])]
        assert sorted(listed) == names


def _env0(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split("\0") if item)


async def _login_env(sandbox: AsyncSandbox) -> dict[str, str]:
    """What ``commands.run`` sees: envd's login shell's environment, less what differs from one command to the next
    (its shell's level and cwd, serve's marker of the command, the shell's ``_``)."""
    got = _env0((await sandbox.commands.run("env -0")).stdout)
    return {k: v for k, v in got.items() if k not in ("_", "SHLVL", "PWD", "EXECSPACE_RUN")}


def _expected(
    engine: execspace.BaseEngine, login: dict[str, str], ws: execspace.Workspace, got: dict[str, str], **run: object
) -> dict[str, str]:
    """The login shell's variables the policy inherits (the template's PATH and VIRTUAL_ENV always), then the
    policy's own over them: what a program gets (its marker checked and left out)."""
    policy: EnvPolicy = engine.runner.env_policy  # type: ignore[attr-defined]
    clean = bool(run.get("clean_env"))
    extra: dict[str, str] = run.get("env", {})  # type: ignore[assignment]
    names = ["PATH", "VIRTUAL_ENV", *policy.inherited_names(login, clean=clean)]
    inherited = {k: login[k] for k in names if k in login}
    run_dir = got["RUN_DIR"].removeprefix(ws.path + "/")
    own = policy.build({}, extra, workspace_env(ws.path, run_dir), clean=clean)
    if "PATH" not in extra:
        del own["PATH"]
    return {**inherited, **own}


@pytest.mark.parametrize("exported", [True, False])
def test_what_bash_sets_for_itself_is_inherited_only_when_exported(exported: bool) -> None:
    """A login shell started without ``SHELL`` gives itself one, unexported (``commands.run`` does not show it): the
    wrapper's words pass it on only when the shell's environment had it. Run by a real bash, as envd runs them."""
    from execspace.backends.e2b.loginenv import FORGET_BASHS_OWN, inherited_words

    words = inherited_words(EnvPolicy(), False, None)
    given = {"SHELL": "/bin/zsh", "PATH": "/usr/bin:/bin"} if exported else {"PATH": "/usr/bin:/bin"}
    bash = shutil.which("bash")
    assert bash is not None
    out = subprocess.run(
        [bash, "-c", f"{FORGET_BASHS_OWN}\nexec env -i{words} /usr/bin/env"],
        env=given,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ("SHELL=/bin/zsh" in out.splitlines()) is exported
    assert "SHELL=" not in out or exported, out


async def test_a_program_inherits_the_login_shells_environment_as_the_policy_says(
    e2b_server: Server, mark: str
) -> None:
    """The program's environment is the policy's over what it inherits of envd's login shell (what commands.run
    sees): its core set by default, all of it with inherit="all" (secret-looking names left out), only the
    template's PATH and VIRTUAL_ENV with clean_env. Nothing of the wrapper's own (a name no shell could export
    included)."""
    theirs = await AsyncSandbox.create(
        template="base",
        metadata={"execspace.test": mark},
        envs={"FROM_TEMPLATE": "t", "SERVICE_TOKEN": "s", "VIRTUAL_ENV": "/opt/venv", "LANG": "C.UTF-8"},
        **_connection(e2b_server),
    )
    login = await _login_env(theirs)
    assert {"FROM_TEMPLATE", "SERVICE_TOKEN", "PATH", "VIRTUAL_ENV", "LANG"} <= login.keys()
    cases: list[tuple[EnvPolicy, dict[str, object]]] = [
        (EnvPolicy(), {"env": {"MINE": "a b 'c'"}}),
        (EnvPolicy(), {"env": {"MINE": "1", "A.B": "dotted", "PATH": "/mine"}}),
        (EnvPolicy(), {"clean_env": True}),
        (EnvPolicy(inherit="all"), {}),
        (EnvPolicy(inherit="all", exclude=["FROM_*"]), {"env": {"LANG": "C"}}),
        (EnvPolicy(inherit="none"), {}),
    ]
    for policy, run in cases:
        async with _engine(e2b_server, sandbox_id=theirs.sandbox_id, env_policy=policy) as engine:
            ws = await engine.manager.create_workspace("env")
            r = await engine.runner.run_program(ws, RunProgramSpec("/usr/bin/env", ["-0"], **run))  # type: ignore[arg-type]
            got = _env0(r.stdout)
            assert len(got.pop("EXECSPACE_RUN", "")) == 16, got  # the run's marker, and only it, is the wrapper's
            if policy.inherit == "all" and not run.get("clean_env"):  # the login shell's own, as it runs the program
                assert got.pop("PWD") == f"{ws.path}/work" and got.pop("SHLVL").isdigit()
            assert got == _expected(engine, login, ws, got, **run), (policy, run)
            if policy.inherit == "all" and not run.get("clean_env"):
                assert "FROM_TEMPLATE" in got or policy.exclude
                assert "SERVICE_TOKEN" not in got
            await engine.manager.cleanup(ws)


async def test_programs_run_in_the_templates_data_stack_as_its_commands_do(e2b_server: Server, mark: str) -> None:
    """code-interpreter-v1: run_program's python3 is commands.run's (the environment's, first on the login PATH,
    VIRTUAL_ENV set), so pandas imports."""
    probe = "import os, sys, pandas; print(sys.executable, sys.prefix, os.environ.get('VIRTUAL_ENV'))"
    options = {"template": "code-interpreter-v1", "metadata": {"execspace.test": mark}, "persistence": "turn"}
    async with execspace.open_engine("e2b", **_connection(e2b_server), **options) as engine:  # type: ignore[arg-type]
        ws = await engine.manager.create_workspace("stack")
        ran = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", probe]))
        (sandbox_id,) = await _running(e2b_server, **{"execspace.test": mark})
        sandbox = await AsyncSandbox.connect(sandbox_id, **_connection(e2b_server))
        command = await sandbox.commands.run(f'python3 -c "{probe}"')
    assert ran.exit_code == 0, ran.stderr
    executable, prefix, venv = ran.stdout.split()
    assert ran.stdout == command.stdout and prefix == venv != "None", (ran.stdout, command.stdout)


async def test_an_exit_code_above_128_is_the_programs_and_a_signal_is_named_by_the_process_api(
    e2b_server: Server,
) -> None:
    """The program is the command envd started (no shell stays as its parent to turn a signal into 128 + N): 137
    is an exit code, and a death by signal is envd's -1 with the signal's name."""
    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("codes")
        exited = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "exit 137"]))
        killed = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "kill -USR2 $$"]))
    assert (exited.exit_code, exited.signal) == (137, None), exited
    assert (killed.exit_code, killed.signal) == (-signal.SIGUSR2, signal.SIGUSR2), killed


async def test_a_run_whose_caller_stops_waiting_ends_in_the_sandbox(e2b_server: Server) -> None:
    """As on every backend, cancelling ``run_program`` ends the program: it does not go on in the sandbox."""
    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("cancelled")
        mark = f"{ws.path}/out/started"
        run = asyncio.ensure_future(
            engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", f"touch {mark}; exec sleep 300"]))
        )
        probe = RunProgramSpec("test", ["-e", mark])

        async def started() -> bool:
            return (await engine.runner.run_program(ws, probe)).exit_code == 0

        await _until("the program started", started, within=30)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        count = "for d in /proc/[0-9]*; do cat $d/cmdline; echo; done | grep -c '^sleep'"
        sleeping = RunProgramSpec("sh", ["-c", count])

        async def gone() -> bool:
            return (await engine.runner.run_program(ws, sleeping)).stdout.strip() == "0"

        await _until("the cancelled run's program ended", gone, within=30)


async def test_every_run_has_its_own_run_directory_even_after_runs_are_removed(e2b_server: Server) -> None:
    """Run directories are made ahead, several at once: each run still gets a fresh one of its own, there when it
    starts, also once a program removed them all."""
    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("runs")
        probe = RunProgramSpec("sh", ["-c", 'test -d "$RUN_DIR" && ! ls -A "$RUN_DIR" | grep -q . && echo "$RUN_DIR"'])
        seen = [(await engine.runner.run_program(ws, probe)).stdout for _ in range(3)]
        await engine.runner.run_program(ws, RunProgramSpec("rm", ["-rf", f"{ws.path}/runs"]))
        seen += [(await engine.runner.run_program(ws, probe)).stdout for _ in range(3)]
    assert all(seen) and len(set(seen)) == len(seen), seen


def test_capabilities_say_how_programs_get_a_pty() -> None:
    from execspace.backends.e2b import E2BBackend, E2BOptions

    caps = E2BBackend.capabilities(E2BOptions())
    assert caps.pty is True
    assert "PROMPT_COMMAND" in caps.details["pty"]
    assert "kill inside the sandbox" in caps.details["signals"]


# -- programs on a terminal (sandbox.pty) -----------------------------------------------------

TERMINAL = execspace.PtySize(rows=30, cols=100)


async def test_a_pty_program_is_the_terminals_process_with_only_its_own_output_and_environment(
    e2b_server: Server,
) -> None:
    """The login bash that sandbox.pty starts becomes the program: it leads the terminal's session and is its
    foreground group, its exit code is the run's, nothing of the shell's (prompt, echoed line, PROMPT_COMMAND)
    comes before its output or reaches its environment, which is inherited as without a terminal."""
    leader = 'set -- $(cat /proc/$$/stat); [ "$1" = "$5" ] && [ "$1" = "$6" ] && [ "$1" = "$8" ] && printf leader'
    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("pty-leader")
        r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", f"{leader}; exit 7"], pty=TERMINAL))
        assert (r.exit_code, r.stdout, r.stderr) == (7, "leader", ""), r
        r = await engine.runner.run_program(ws, RunProgramSpec("/usr/bin/env", ["-0"], env={"MINE": "1"}, pty=TERMINAL))
        got = _env0(r.stdout)
        got.pop("EXECSPACE_RUN")
        # a terminal's login shell is commands.run's with the SDK's terminal variables, which the program inherits
        login = {k: v for k, v in got.items() if k in CORE_VARIABLES}
        assert got == _expected(engine, login, ws, got, env={"MINE": "1"}), got
        assert got["TERM"] == "xterm-256color" and "PROMPT_COMMAND" not in got


async def test_ctrl_c_on_the_terminal_is_sigint_to_the_program(e2b_server: Server) -> None:
    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("pty-int")
        spec = RunProgramSpec("sh", ["-c", "echo ready; exec sleep 30"], pty=TERMINAL)
        async with await engine.runner.start_program(ws, spec) as handle:
            await read_until(handle.attach(), b"ready")
            await handle.write_stdin(b"\x03")
            result = await asyncio.wait_for(handle.wait(), 10)
    assert (result.exit_code, result.signal) == (-signal.SIGINT, signal.SIGINT), result
    assert result.stdout.endswith("^C"), result.stdout


async def test_signal_eof_and_timeout_reach_a_pty_program(e2b_server: Server) -> None:
    """signal() reaches the program's trap, close_stdin() is the terminal's EOF (the terminal stays), a timeout
    gives the program its TERM handler and is reported as one."""
    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("pty-signals")
        trap = 'trap "echo got-usr1" USR1; echo ready; while :; do sleep 0.05; done'
        async with await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", trap], pty=TERMINAL)) as h:
            reader = h.attach()
            await read_until(reader, b"ready")
            await h.signal(signal.SIGUSR1)
            await read_until(reader, b"got-usr1")
            await h.kill()
        async with await engine.runner.start_program(ws, RunProgramSpec("cat", pty=TERMINAL)) as cat:
            await cat.write_stdin("abc\n")
            await cat.close_stdin()
            with pytest.raises(execspace.UsageError):
                await cat.write_stdin("late\n")
            ended = await asyncio.wait_for(cat.wait(), 10)
        script = 'trap "echo cleaned-up; exit 0" TERM; echo up; while :; do sleep 0.05; done'
        timed = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], pty=TERMINAL, timeout=1))
    assert (ended.exit_code, ended.stdout) == (0, "abc\r\nabc\r\n"), ended
    assert timed.timed_out and timed.stdout == "up\r\ncleaned-up\r\n", timed


async def test_workspace_exec_runs_on_a_terminal_in_the_sandbox(e2b_server: Server) -> None:
    from execspace.tools.workspace_exec import WorkspaceExecTool

    async with _engine(e2b_server, persistence="turn") as engine, WorkspaceExecTool(engine, workspace_id="tty") as tool:
        r = await tool.call({"command": "[ -t 0 ] && [ -t 1 ] && stty size", "tty": True})
        assert (r["status"], r["exit_code"], r["stdout"]) == ("exited", 0, "24 80\r\n"), r
        r = await tool.call({"command": 'read -r x; echo "got $x"', "tty": True, "background": True})
        sid = r["session_id"]
        r = await tool.write_stdin({"session_id": sid, "input": "hi", "append_newline": True, "wait_ms": 5000})
        text = r["output"]
        while r["status"] == "running":
            r = await tool.poll({"session_id": sid, "wait_ms": 1000})
            text += r["output"]
    assert (text, r["exit_code"]) == ("hi\r\ngot hi\r\n", 0), r


# -- code execution through the code interpreter ---------------------------------------------

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"
DISPLAYS = (
    "from IPython.display import HTML, JSON, SVG, Latex, Markdown, display\n"
    "display(HTML('<b>x</b>')); display(Markdown('# t')); display(Latex(r'$x^2$')); display(JSON({'a': 1}))\n"
    "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))\n"
    "import base64\n"
    "display({'image/jpeg': base64.b64encode(b'\\xff\\xd8jpeg').decode(),"
    " 'application/pdf': base64.b64encode(b'%PDF-1.4').decode()}, raw=True)"
)


async def test_code_runs_in_the_code_interpreter_with_state_and_rich_results(e2b_server: Server, mark: str) -> None:
    from execspace import CodeBlock, CodeExecutionInput, CodeExecutor

    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        ex = CodeExecutor(engine, timeout=30)
        first = await ex.execute_code(
            CodeExecutionInput(
                [
                    CodeBlock("python", "total = 40\nprint('to stdout')"),
                    CodeBlock("py", PLOT),
                    CodeBlock("python", DISPLAYS),
                    CodeBlock("bash", "echo from-bash; echo $$ > pid.txt"),  # not a kernel language here: a program
                ],
                execution_id="cells",
            )
        )
        assert first.ok, first.output
        assert "to stdout" in first.output and "from-bash" in first.output
        files = {f.name: f.content for f in first.output_files}
        assert files["out/cell-2-1.png"].startswith(b"\x89PNG\r\n\x1a\n")
        assert files["out/cell-3-1.html"] == b"<b>x</b>"
        assert files["out/cell-3-2.md"] == b"# t"
        assert files["out/cell-3-3.tex"] == b"$x^2$"
        assert json.loads(files["out/cell-3-4.json"]) == {"a": 1}
        assert files["out/cell-3-5.svg"].startswith(b"<svg")
        assert files["out/cell-3-6.jpg"] == b"\xff\xd8jpeg"
        assert files["out/cell-3-6.pdf"] == b"%PDF-1.4"
        second = await ex.execute_code(CodeExecutionInput([CodeBlock("python", "total + 2")], execution_id="cells"))
        assert second.output == "42\n" and second.ok


async def test_a_cell_error_keeps_name_value_and_traceback(e2b_server: Server) -> None:
    from execspace import CodeBlock, ResourceLimits

    async with _engine(e2b_server, persistence="turn") as engine:
        ws = await engine.manager.create_workspace("errors")
        assert isinstance(engine, execspace.SupportsKernels)
        block = CodeBlock("python", "import sys\nprint('before', file=sys.stderr)\n1/0")
        result, text = await engine.kernels.run_block(ws, block, 0, timeout=30, limits=ResourceLimits())
        assert result.exit_code == 1 and result.stdout == ""
        assert result.stderr.startswith("before\n")
        assert "ZeroDivisionError: division by zero" in result.stderr and "----> 3 1/0" in result.stderr
        assert "\x1b[" not in text  # no terminal colours for a model to read


def test_languages_map_to_the_code_interpreter() -> None:
    from execspace import UnsupportedLanguage
    from execspace.backends.e2b.kernels import kernel_language

    tags = ["python", "py", "javascript", "js", "node", "typescript", "ts", "bash", "sh", "shell", "r", "java"]
    assert [kernel_language(t) for t in tags] == [
        *["python"] * 2,
        *["js"] * 3,
        *["ts"] * 2,
        *["bash"] * 3,
        "r",
        "java",
    ]
    with pytest.raises(UnsupportedLanguage, match=r"'cobol'.*use one of: python"):
        kernel_language("cobol")


@pytest.mark.skipif(shutil.which("R") is not None, reason="execspace serve runs R here: no language it refuses")
async def test_a_language_the_service_has_no_kernel_for_is_a_clear_error(e2b_server: Server) -> None:
    from execspace import CodeBlock, ResourceLimits

    async with _engine(e2b_server, persistence="turn", code_languages=("python", "r")) as engine:
        ws = await engine.manager.create_workspace("no-r")
        assert isinstance(engine, execspace.SupportsKernels)
        assert engine.kernels.handles("r") and not engine.kernels.handles("bash")
        with pytest.raises(BackendError, match=r"starting a r kernel: 501.*no r kernel"):
            await engine.kernels.run_block(ws, CodeBlock("r", "1 + 1"), 0, timeout=30, limits=ResourceLimits())


@pytest.mark.skipif(shutil.which("R") is None, reason="execspace serve's R contexts run the host's R")
async def test_r_blocks_run_in_the_servers_r_context_with_state(e2b_server: Server) -> None:
    from execspace import CodeBlock, ResourceLimits

    async with _engine(e2b_server, persistence="turn", code_languages=("python", "r")) as engine:
        ws = await engine.manager.create_workspace("r")
        assert isinstance(engine, execspace.SupportsKernels)
        limits = ResourceLimits()
        blocks = [CodeBlock("r", "n <- 6"), CodeBlock("r", "cat(n * 7, '\\n'); n * 7"), CodeBlock("r", "stop('no')")]
        first, second, failed = [
            (await engine.kernels.run_block(ws, block, i, timeout=60, limits=limits))[0]
            for i, block in enumerate(blocks)
        ]
        assert first.exit_code == 0
        assert (second.exit_code, second.stdout) == (0, "42 \n[1] 42\n")  # the output, then the value's text
        assert failed.exit_code == 1 and "Error: no" in failed.stderr


@pytest.mark.skipif(shutil.which("node") is None, reason="execspace serve's JavaScript contexts run on Node.js")
async def test_javascript_blocks_run_in_the_servers_node_context_with_state(e2b_server: Server) -> None:
    from execspace import CodeBlock, ResourceLimits

    async with _engine(e2b_server, persistence="turn", code_languages=("python", "js")) as engine:
        ws = await engine.manager.create_workspace("js")
        assert isinstance(engine, execspace.SupportsKernels)
        limits = ResourceLimits()
        blocks = [CodeBlock("js", "const n = 6"), CodeBlock("node", "console.log(n * 7)"), CodeBlock("js", "null.x")]
        first, second, failed = [
            (await engine.kernels.run_block(ws, block, i, timeout=30, limits=limits))[0]
            for i, block in enumerate(blocks)
        ]
        assert first.exit_code == 0
        assert (second.exit_code, second.stdout) == (0, "42\n")
        assert failed.exit_code == 1 and "TypeError" in failed.stderr
