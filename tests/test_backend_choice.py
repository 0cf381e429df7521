"""Choosing and opening a backend: options are checked against the backend before it opens, and the default choice
never lands on a backend that cannot open (the container backend without an image crashed with a TypeError)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import execspace
from execspace import InvalidSpec, SetupFailed
from execspace.backends.container import container_image
from execspace.registry import probe_backend
from tests.backends.docker_fixture import Daemon

IMAGE_ENV = "EXECSPACE_CONTAINER_IMAGE"
EXECSPACE = str(Path(sys.executable).with_name("execspace"))


async def test_an_option_the_backend_does_not_take_is_invalid_spec(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec) as info:
        async with execspace.open_engine("local", workspace_root=tmp_path, image="python:3"):
            pass
    message = str(info.value)
    assert "'local' has no option image" in message
    assert "workspace_root" in message  # what it does take


async def test_options_for_another_backend_than_the_default_say_so(tmp_path: Path) -> None:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("the sandbox backend does not work here, so it is not the default")
    with pytest.raises(InvalidSpec, match="chosen as the default: name the backend"):
        async with execspace.open_engine(workspace_root=tmp_path, pool_size=2):
            pass


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user config file, in a config home of this test's (not written yet)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "config" / "execspace" / "config.toml"
    path.parent.mkdir(parents=True)
    return path


async def test_container_probe_without_an_image_fails_with_the_fix(
    docker_daemon: Daemon, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    config_file.write_text("[container]\n# image = 'not set'\n")
    probe = await probe_backend("container", docker_host=docker_daemon.host)
    assert not probe.ok
    assert probe.reason == "no container image is named"
    assert IMAGE_ENV in probe.fix and "--image" in probe.fix
    assert f"under [container] in {config_file}" in probe.fix


def test_the_image_comes_from_the_argument_then_the_environment_then_the_config_file(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text('[container]\nimage = "from-file:1"\n')
    monkeypatch.setenv(IMAGE_ENV, "from-env:1")
    assert container_image("from-argument:1") == "from-argument:1"
    assert container_image(None) == "from-env:1"
    monkeypatch.setenv(IMAGE_ENV, " ")
    assert container_image(None) == "from-file:1"
    config_file.unlink()
    with pytest.raises(SetupFailed, match="no container image is named"):
        container_image(None)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[container]\nimage = from-file\n", " is not valid TOML: Invalid value (at line 2, column 9)"),
        ("[container]\nimage = 3\n", ": container.image must be a string, not an integer"),
        ('container = "img"\n', ": container must be a table, not a string"),
        ("[container]\nimgae = 'x'\n", ": unknown key container.imgae; [container] takes image"),
    ],
)
async def test_a_malformed_config_file_fails_the_probe_naming_it(
    text: str, says: str, docker_daemon: Daemon, config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    config_file.write_text(text)
    probe = await probe_backend("container", docker_host=docker_daemon.host)
    assert not probe.ok
    assert f"the config file {config_file}{says}" in probe.reason
    assert str(config_file) in probe.fix
    with pytest.raises(SetupFailed, match="the config file"):
        container_image(None)
    assert container_image("given:1") == "given:1"  # the file is read only when it is needed


async def test_container_image_comes_from_the_config_file(
    docker_daemon: Daemon, test_image: str, config_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    config_file.write_text(f"[container]\nimage = {test_image!r}\n")
    assert (await probe_backend("container", docker_host=docker_daemon.host)).ok
    async with execspace.open_engine(
        "container", docker_host=docker_daemon.host, workspace_root=tmp_path / "ws", pool_size=0
    ) as engine:
        assert engine.describe().details["image"] == test_image


async def test_container_probe_fails_for_an_image_the_daemon_lacks(docker_daemon: Daemon) -> None:
    probe = await probe_backend("container", docker_host=docker_daemon.host, image="execspace-no-such-image:1")
    assert not probe.ok
    assert "no image 'execspace-no-such-image:1'" in probe.reason
    assert "execspace image build" in probe.fix


async def test_container_open_without_an_image_is_setup_failed(
    docker_daemon: Daemon, config_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    with pytest.raises(SetupFailed, match="no container image is named"):
        async with execspace.open_engine("container", docker_host=docker_daemon.host, workspace_root=tmp_path):
            pass


async def test_container_image_comes_from_the_environment(
    docker_daemon: Daemon, test_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(IMAGE_ENV, test_image)
    assert (await probe_backend("container", docker_host=docker_daemon.host)).ok
    async with execspace.open_engine(
        "container", docker_host=docker_daemon.host, workspace_root=tmp_path, pool_size=0
    ) as engine:
        assert engine.describe().details["image"] == test_image


def _path_without_bwrap(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sh", "true"):
        found = subprocess.run(["sh", "-c", f"command -v {name}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / name).symlink_to(os.path.realpath(found))
    return str(bin_dir)


def test_cli_without_bwrap_and_with_a_daemon_but_no_image_refuses_clearly(
    docker_daemon: Daemon, tmp_path: Path
) -> None:
    """The verified crash: no usable bubblewrap, a reachable daemon, no image → a TypeError and exit 1."""
    env = {k: v for k, v in os.environ.items() if k != IMAGE_ENV}
    env.update(PATH=_path_without_bwrap(tmp_path), DOCKER_HOST=docker_daemon.host, TMPDIR=str(tmp_path))
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-config")
    proc = subprocess.run([EXECSPACE, "run", "--", "true"], capture_output=True, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 125, proc.stderr
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr and "TypeError" not in stderr
    assert "no isolating backend works" in stderr
    assert "container: no container image is named" in stderr
    assert IMAGE_ENV in stderr


def test_cli_image_flag_belongs_to_the_container_backend(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [EXECSPACE, "run", "--backend", "local", "--image", "x", "--", "touch", str(marker)],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 125
    assert b"--image belongs to the container backend, not 'local'" in proc.stderr
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the sandbox as another uid that must reach $TMPDIR")
def test_sandbox_probe_names_an_untraversable_tmpdir(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    code = "import asyncio; from execspace.registry import probe_backend as p; r = asyncio.run(p('sandbox')); "
    code += "print(r.ok); print(r.reason); print(r.fix)"
    env = {**os.environ, "TMPDIR": str(private)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60).stdout
    ok, reason, fix = out.splitlines()
    assert ok == "False"
    assert f"cannot reach a workspace under {private}" in reason
    assert "chmod o+x" in fix and "user namespaces" not in fix
