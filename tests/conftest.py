"""Shared fixtures: a local engine rooted in the test's tmp dir, one workspace in it, and a Jupyter Server; and, as
root, a base temporary directory of the session's own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import execspace
from execspace import BaseEngine, Workspace

if TYPE_CHECKING:
    from execspace.backends.jupyter.remote_server import LocalServer

#: The base temporary directory :func:`pytest_configure` made for the session (absent: pytest's own, or --basetemp).
_OWN_BASETEMP = pytest.StashKey[Path]()


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    """As root, without --basetemp, the session's temporary files go to a directory of its own.

    pytest's default parent, ``/tmp/pytest-of-root``, is shared by every pytest session on the machine, and each one
    resets it to 0700 as it starts. As root every workspace's sandbox runs as a uid of its own, which must pass each
    directory on the way to the workspace (``make_traversable`` opens them): a test whose workspace lies there fails
    with SetupFailed ("cannot pass /tmp/pytest-of-root") whenever another session starts during it."""
    if config.option.basetemp is not None or os.geteuid() != 0:
        return
    own = Path(tempfile.mkdtemp(prefix="execspace-pytest-"))
    config.stash[_OWN_BASETEMP] = own
    config.option.basetemp = str(own / "pytest")


@pytest.hookimpl(trylast=True)  # after the session-scoped fixtures' teardown
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session's own base temporary directory when nothing failed; a failure's files stay to look at."""
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own is not None and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        yield eng


@pytest.fixture
async def ws(engine: BaseEngine) -> Workspace:
    return await engine.manager.create_workspace("test/session")


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """One Jupyter Server for the session (about 2.5 s to start), for the conformance kit's remote modes.

    Served from a thread with a loop of its own: the bindings ask for it from inside a running test loop.
    """
    if importlib.util.find_spec("jupyter_server") is None:
        pytest.skip("jupyter_server is not installed (pip install jupyter_server)")
    # imported here: the jupyter package costs every other test run 0.3 s
    from execspace.backends.jupyter.remote_server import start_local_server

    started: concurrent.futures.Future[LocalServer] = concurrent.futures.Future()
    stop = threading.Event()

    async def serve() -> None:
        try:
            async with start_local_server(tmp_path_factory.mktemp("jupyter-server")) as server:
                started.set_result(server)
                await asyncio.to_thread(stop.wait)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="jupyter-server")
    thread.start()
    try:
        yield started.result(timeout=60)
    finally:
        stop.set()
        thread.join(30)


# tests/test_testing_kit.py runs pytest on a binding of the kit
pytest_plugins = ["pytester"]

# the daemon and image fixtures serve both the container tests and the conformance suite
from tests.backends.docker_fixture import docker_daemon, test_image  # noqa: E402

__all__ = ["docker_daemon", "engine", "jupyter_server", "test_image", "ws"]


@pytest.fixture(scope="session")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One ``execspace serve`` for the session, for the e2b backend's conformance mode (tests/server has its own)."""
    if importlib.util.find_spec("e2b") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip("the e2b mode needs the e2b SDK and the server's extra (pip install 'execspace[serve,e2b]')")
    from tests.server.conftest import running_server

    with running_server(tmp_path_factory.mktemp("e2b-serve")) as server:
        yield server


def _overlay_mounts() -> set[str]:
    """The mount points of overlays in this mount namespace (copy-on-write forks, restored workspaces)."""
    try:
        with open("/proc/self/mountinfo") as f:
            return {line.split()[4] for line in f if " - overlay " in line}
    except OSError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def no_mount_outlives_the_suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Overlays a test left mounted (a fork it never cleaned up, a server killed with its forks) are detached at the
    end: every new mount namespace copies them all, so left behind they slow each later sandbox start (500 left
    mounts took a bare bwrap from 8 to 60 ms). Counted in the output, so that a test that leaks shows up. Only this
    session's own (under its base temporary directory): another run of the tests beside it keeps its mounts."""
    base = f"{tmp_path_factory.getbasetemp()}/"
    before = _overlay_mounts()
    yield
    left = sorted(m for m in _overlay_mounts() - before if m.startswith(base))
    for mount in left:
        with contextlib.suppress(OSError):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    if left:
        note = f"\n{len(left)} overlay mounts outlived the tests that made them (detached): {left[:5]}\n"
        os.write(2, note.encode())  # past pytest's capture
