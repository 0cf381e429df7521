"""The parts of the SDK's surface its own tests define and a user meets at the edges: a killed command or terminal,
a sandbox killed under a running command or cell, and what the SDK observes of each (its exceptions, promptly)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import e2b
import e2b_code_interpreter as ci
import httpx
import pytest
from e2b import AsyncSandbox, CommandExitException, FileType, Sandbox
from e2b.exceptions import SandboxNotRunningException, TimeoutException
from e2b.sandbox.commands.command_handle import PtySize

from .conftest import Server

#: What the SDK says once its health probe confirms the sandbox gone (e2b's ``format_terminated_exception``).
_GONE = "sandbox was killed or reached its end of life"
#: At most this long from the kill to the SDK's exception (a dropped connection is seen at once; a hang is not).
_PROMPT = 5.0


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


@pytest.fixture
async def asbx() -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.create()
    yield sandbox
    await sandbox.kill()


# -- kill: the handle's wait raises CommandExitException with the signal ---------------------------------------------


def test_a_killed_command_or_terminal_makes_wait_raise_command_exit(sbx: Sandbox) -> None:
    command = sbx.commands.run("sleep 60", background=True)
    assert command.kill()
    with pytest.raises(CommandExitException) as killed:
        command.wait()
    assert (killed.value.exit_code, killed.value.error) == (-1, "signal: killed")
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(terminal.pid)
    with pytest.raises(CommandExitException) as ended:
        terminal.wait()
    assert ended.value.exit_code == -1
    assert not sbx.commands.kill(command.pid)  # gone: the SDK's False


async def test_async_a_killed_command_or_terminal_makes_wait_raise_command_exit(asbx: AsyncSandbox) -> None:
    command = await asbx.commands.run("sleep 60", background=True)
    assert await asbx.commands.kill(command.pid)
    with pytest.raises(CommandExitException) as killed:
        await command.wait()
    assert (killed.value.exit_code, killed.value.error) == (-1, "signal: killed")
    terminal = await asbx.pty.create(PtySize(rows=24, cols=80), on_data=lambda _: None)
    assert await terminal.kill()
    with pytest.raises(CommandExitException):
        await terminal.wait()


# -- a sandbox killed under a running command, terminal or cell -----------------------------------------------------


def test_a_command_and_a_terminal_of_a_killed_sandbox_raise_sandbox_gone_at_once() -> None:
    sandbox = Sandbox.create()
    command = sandbox.commands.run("sleep 60", background=True)
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    assert sandbox.kill()
    began = time.monotonic()
    for handle in (command, terminal):
        with pytest.raises(SandboxNotRunningException, match=_GONE):
            handle.wait()
    assert time.monotonic() - began < _PROMPT


async def test_async_a_command_of_a_killed_sandbox_raises_sandbox_gone_at_once() -> None:
    sandbox = await AsyncSandbox.create()
    command = await sandbox.commands.run("sleep 60", background=True)
    assert await sandbox.kill()
    began = time.monotonic()
    with pytest.raises(SandboxNotRunningException, match=_GONE):
        await command.wait()
    assert time.monotonic() - began < _PROMPT


def test_a_cell_of_a_killed_sandbox_raises_the_code_interpreters_killed_error_at_once() -> None:
    sandbox = ci.Sandbox.create(timeout=120)
    began: list[float] = []

    def kill_once_running(_: object) -> None:  # the cell printed: it runs; kill from elsewhere, as a user would
        if not began:
            began.append(time.monotonic())
            threading.Thread(target=sandbox.kill).start()

    with pytest.raises(TimeoutException, match="sandbox was killed while the request was in progress"):
        sandbox.run_code("import time; print('running', flush=True); time.sleep(300)", on_stdout=kill_once_running)
    assert began and time.monotonic() - began[0] < _PROMPT


async def test_async_a_cell_of_a_killed_sandbox_raises_the_code_interpreters_killed_error() -> None:
    sandbox = await ci.AsyncSandbox.create(timeout=120)
    killing: list[asyncio.Future[bool]] = []

    def kill_once_running(_: object) -> None:
        if not killing:
            killing.append(asyncio.ensure_future(sandbox.kill()))

    with pytest.raises(TimeoutException, match="sandbox was killed while the request was in progress"):
        await sandbox.run_code(
            "import time; print('running', flush=True); time.sleep(300)", on_stdout=kill_once_running
        )
    assert await killing[0]


# -- files: what envd answers for a missing path, a directory, a link -----------------------------------------------


def test_removing_a_path_where_nothing_is_succeeds_as_envds_does(sbx: Sandbox) -> None:
    sbx.files.remove("never-there.txt")
    sbx.files.remove("no/such/dir")
    sbx.files.write("there.txt", "x")
    sbx.files.remove("there.txt")
    assert not sbx.files.exists("there.txt")


def test_a_directorys_info_has_its_own_size_and_a_links_is_what_it_points_to(sbx: Sandbox) -> None:
    sbx.files.make_dir("d")
    size = int(sbx.commands.run("stat -c %s /home/user/d").stdout)
    directory = sbx.files.get_info("d")
    assert (directory.type, directory.size, directory.mode, directory.permissions) == (
        FileType.DIR,
        size,
        0o755,
        "drwxr-xr-x",
    )
    assert size > 0
    sbx.files.write("d/f.txt", "four")
    made = sbx.commands.run(
        "ln -s f.txt link && ln -s link chain && ln -s gone dangling && ln -s d sub", cwd="/home/user/d"
    )
    assert made.exit_code == 0
    sbx.commands.run("ln -s /home/user/d /home/user/d-link")
    link = sbx.files.get_info("d/link")
    assert (link.type, link.symlink_target, link.permissions) == (FileType.SYMLINK, "/home/user/d/f.txt", "Lrwxrwxrwx")
    assert sbx.files.get_info("d/chain").symlink_target == "/home/user/d/f.txt"  # followed to its end
    dangling = sbx.files.get_info("d/dangling")
    assert (dangling.type, dangling.symlink_target) == (FileType.SYMLINK, "/home/user/d/gone")
    listed = {e.name: (e.type, e.symlink_target) for e in sbx.files.list("/home/user")}
    assert listed["d-link"] == (FileType.SYMLINK, "/home/user/d")
    assert listed["d"] == (FileType.DIR, None)


async def test_async_remove_of_nothing_and_a_directorys_size(asbx: AsyncSandbox) -> None:
    await asbx.files.remove("never-there.txt")
    await asbx.files.make_dir("d")
    assert (await asbx.files.get_info("d")).size > 0


# -- every route the SDK can call is answered: served, or 501 naming it -----------------------------------------------


def _sdk_routes() -> set[tuple[str, str]]:
    """The control-plane routes the installed SDK's generated API client calls (its ``e2b/api/client/api``)."""
    found: set[tuple[str, str]] = set()
    for module in Path(e2b.__file__).parent.joinpath("api", "client", "api").glob("*/*.py"):
        for m in re.finditer(r'"method": "(\w+)",\s*"url": f?"([^"]+)"', module.read_text()):
            found.add((m.group(1).upper(), m.group(2)))
    return found


def test_every_route_the_sdk_can_call_is_served_or_answers_501_naming_it(sbx: Sandbox, e2b_server: Server) -> None:
    routes = _sdk_routes()
    assert ("POST", "/v2/sandboxes") in routes and len(routes) > 30  # the SDK's client was read
    client = httpx.Client(base_url=e2b_server.url, headers={"X-API-KEY": e2b_server.key}, timeout=30)
    with client:
        _answers_each(client, sbx, routes)


def _answers_each(client: httpx.Client, sbx: Sandbox, routes: set[tuple[str, str]]) -> None:
    for method, route in sorted(routes - {("DELETE", "/sandboxes/{sandbox_id}")}):
        url = re.sub(r"\{[a-z_]+\}", "x1", route.replace("{sandbox_id}", sbx.sandbox_id))
        r = client.request(method, url, json={} if method in ("POST", "PUT", "PATCH") else None)
        if r.status_code >= 400:
            assert r.headers["content-type"] == "application/json", (method, route, r.text)
        if r.status_code == 404:  # a thing that is not there, never a route that is not
            assert "no snapshot" in r.json()["message"], (method, route, r.text)
        else:
            assert r.status_code != 405 and (r.status_code < 500 or r.status_code == 501), (method, route, r.text)
        if r.status_code == 501:
            assert r.json()["message"] == f"{method} {url} is not implemented by execspace serve"
    envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": sbx._envd_access_token}
    for method, path in [("POST", "/filesystem.Filesystem/Chmod"), ("GET", "/process.Process/List")]:
        r = client.request(method, path, headers=envd, json={})  # an RPC of a newer envd, a method not served
        assert (r.status_code, r.json()["code"]) == (501, "unimplemented"), r.text
        assert path in r.json()["message"]
    for method, path in [("GET", "/envs"), ("POST", "/files/compose"), ("PUT", "/files")]:
        r = client.request(method, path, headers=envd)
        assert r.status_code == 501 and f"{method} {path}" in r.json()["message"], r.text
    interpreter = {**envd, "E2b-Sandbox-Port": "49999"}
    r = client.request("PATCH", "/contexts", headers=interpreter)
    assert r.status_code == 501 and "PATCH /contexts" in r.json()["message"], r.text


# -- code contexts: the defaults listed, options kept ----------------------------------------------------------------


def test_a_sandbox_lists_its_default_contexts_and_a_new_one_last_with_its_options() -> None:
    sandbox = ci.Sandbox.create(timeout=120)
    try:
        defaults = sandbox.list_code_contexts()
        assert [(c.language, c.cwd) for c in defaults] == [("python", "/home/user"), ("javascript", "/home/user")]
        assert sandbox.run_code("1 + 1").text == "2"  # the default Python context is the one listed
        assert [c.id for c in sandbox.list_code_contexts()] == [c.id for c in defaults]
        made = sandbox.create_code_context(language="python", cwd="/home/user/project")
        last = sandbox.list_code_contexts()[-1]
        assert (last.id, last.language, last.cwd) == (made.id, "python", "/home/user/project")
        assert sandbox.run_code("import os; print(os.getcwd())", context=made).logs.stdout == ["/home/user/project\n"]
        sandbox.remove_code_context(made.id)
        assert made.id not in [c.id for c in sandbox.list_code_contexts()]
    finally:
        sandbox.kill()


async def test_async_a_sandbox_lists_its_default_contexts() -> None:
    sandbox = await ci.AsyncSandbox.create(timeout=120)
    try:
        assert [c.language for c in await sandbox.list_code_contexts()] == ["python", "javascript"]
        made = await sandbox.create_code_context(cwd="/home/user")
        assert (await sandbox.list_code_contexts())[-1].id == made.id
    finally:
        await sandbox.kill()


def test_a_killed_terminal_or_command_is_gone_when_kill_returns(sbx: Sandbox) -> None:
    """The SDK's own test of kill: ``kill -0 <pid>`` run right after it fails (the process was reaped)."""
    for _ in range(5):
        terminal = sbx.pty.create(PtySize(rows=24, cols=80))
        assert sbx.pty.kill(terminal.pid)
        with pytest.raises(CommandExitException):
            sbx.commands.run(f"kill -0 {terminal.pid}")
        command = sbx.commands.run("sleep 60", background=True)
        assert sbx.commands.kill(command.pid)
        with pytest.raises(CommandExitException):
            sbx.commands.run(f"kill -0 {command.pid}")
