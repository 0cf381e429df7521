"""The container backend's image as a pip user meets it: ``execspace image build`` makes it, ``execspace doctor``
reads its languages from its label, and an image that cannot run an environment's Python says what it lacks."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.container import ContainerBackend, ContainerOptions
from execspace.backends.container.daemon import connect
from execspace.environments import Environment, EnvironmentSpec, EnvironmentStore
from execspace.errors import SetupFailed
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import TEST_BINDS, Daemon
from tests.support import CLI, make_traversable

pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


async def test_doctor_shows_the_languages_the_image_label_lists(docker_daemon: Daemon, test_image: str) -> None:
    """The newcomer's ``languages: none found`` for an image labelled ``execspace.languages=python,bash``."""
    caps = await ContainerBackend.capabilities(ContainerOptions(image=test_image, docker_host=docker_daemon.host))
    assert {"python", "bash"} <= set(caps.languages)
    assert caps.details["image"] == test_image and caps.details["daemon"].startswith("Docker ")
    env = {**os.environ, "DOCKER_HOST": docker_daemon.host, "EXECSPACE_CONTAINER_IMAGE": test_image}
    r = await asyncio.to_thread(_cli, "doctor", env=env)
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("\ncontainer: ", 1)[1].split("\n\n", 1)[0]
    assert section.startswith("OK"), section
    languages = next(line for line in section.splitlines() if line.strip().startswith("languages:"))
    assert {"python", "bash"} <= set(languages.split(":", 1)[1].replace(",", " ").split()), languages


def test_a_missing_image_names_the_build_command(docker_daemon: Daemon) -> None:
    env = {**os.environ, "DOCKER_HOST": docker_daemon.host}
    r = _cli("run", "--backend", "container", "--image", "execspace-test/none:1", "--", "true", env=env)
    assert r.returncode == 125 and "execspace image build --name execspace-test/none:1" in r.stderr, r.stderr


@pytest.fixture
def bare_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Environment:
    """A venv environment of the host's system Python with no packages (built in a second or two)."""
    make_traversable(tmp_path)  # as root the container's uid must reach the tree, bound at its own path
    monkeypatch.setenv("EXECSPACE_ENVIRONMENTS", str(tmp_path / "envs"))
    return asyncio.run(EnvironmentStore().build(EnvironmentSpec(name="bare")))


async def test_an_image_whose_python_lacks_the_standard_library_says_so(
    docker_daemon: Daemon, test_image: str, tmp_path: Path, bare_environment: Environment
) -> None:
    """What a ``python3-minimal`` image did to the newcomer (``No module named 'contextvars'``), made here by
    hiding two modules of the test image's standard library: the first run says what the image lacks and which image
    to use, and a complete standard library runs."""
    where = [str(bare_environment.python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"]
    stdlib = Path(subprocess.run(where, capture_output=True, text=True, check=True).stdout.strip())
    trimmed = tmp_path / "stdlib"
    skip = shutil.ignore_patterns("site-packages", "dist-packages", "__pycache__", "test", "contextvars.py", "asyncio")
    await asyncio.to_thread(shutil.copytree, stdlib, trimmed, ignore=skip, symlinks=True)
    binds = {**TEST_BINDS, str(trimmed): str(stdlib)}
    async with container_engine(
        docker_daemon,
        test_image,
        tmp_path / "ws",
        pool_size=0,
        environment=bare_environment.name,
        read_only_binds=binds,
    ) as eng:
        ws = await eng.manager.create_workspace("minimal")
        with pytest.raises(SetupFailed) as info:
            await eng.runner.run_program(ws, RunProgramSpec("python", ["-c", "pass"]))
        assert "lacks asyncio, contextvars" in info.value.cause and "execspace image build" in info.value.fix
    async with container_engine(
        docker_daemon, test_image, tmp_path / "ws2", pool_size=0, environment=bare_environment.name
    ) as eng:
        ws = await eng.manager.create_workspace("complete")
        r = await eng.runner.run_program(
            ws, RunProgramSpec("python", ["-c", "import contextvars, sys; print(sys.prefix)"])
        )
        assert (r.exit_code, r.stdout) == (0, f"{bare_environment.path}\n"), r.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_image_build_makes_the_documented_image_both_ways(
    docker_daemon: Daemon, tmp_path: Path, bare_environment: Environment
) -> None:
    """``execspace image build`` as a pip user runs it: a Debian root from this host's apt sources, imported with
    its languages label, that runs Python and an environment with no host binds; then the packaged Dockerfile built
    on top of it by the daemon (its base named, so that no registry is needed here)."""
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip("the rootfs build needs root and mmdebstrap (apt-get install mmdebstrap)")
    name, layered = "execspace-test/python:built", "execspace-test/python:layered"
    env = {**os.environ, "DOCKER_HOST": docker_daemon.host}
    r = await asyncio.to_thread(_cli, "image", "build", "--name", name, env=env, timeout=540)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mmdebstrap" in r.stderr and f"built {name}" in r.stderr  # progress streamed, then the result
    assert "\\x0d" not in r.stderr  # a step's CRLF lines are shown as lines, not with an escaped carriage return
    async with execspace.open_engine(
        "container",
        image=name,
        docker_host=docker_daemon.host,
        workspace_root=tmp_path / "ws",
        pool_size=0,
        environment=bare_environment.name,
    ) as eng:
        assert {"python", "bash"} <= set(eng.describe().languages)
        ws = await eng.manager.create_workspace("built")
        code = "import asyncio, contextvars, sys, platform; print(sys.prefix, platform.python_version())"
        run = await eng.runner.run_program(ws, RunProgramSpec("python", ["-c", code]))
        expected = f"{bare_environment.path} {bare_environment.python_version}\n"
        assert (run.exit_code, run.stdout) == (0, expected), run.stderr
    r = await asyncio.to_thread(
        _cli, "image", "build", "--via", "dockerfile", "--base", name, "--name", layered, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    client = connect(docker_daemon.host)
    try:
        labels = client.images.get(layered).labels
        for image in (name, layered):
            client.images.remove(image, force=True)
    finally:
        client.close()
    assert labels["execspace.languages"] == "python,bash"
