"""A template's environment built by ``execspace serve`` the first time a create needs it, with the official SDK: the
create that waits past ``--build-wait`` answers 503 naming the build (the SDK's ``ServiceBusyException``), and the
SDK's own retry (after ``Retry-After``) gets the sandbox in the new environment; concurrent creates wait for one
build; a failed build fails its create naming where and the build's log, and the next create builds again. Each
server has its own store (``EXECSPACE_ENVIRONMENTS``) and its packages come from a directory of wheels
(``PIP_FIND_LINKS``, no index): builds take seconds and need no registry."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxException
from e2b.exceptions import ServiceBusyException

from execspace.errors import InvalidSpec
from execspace.server import load_environments
from execspace.testing.binding import make_traversable
from execspace.testing.processes import terminate
from tests.server.conftest import API_KEY
from tests.support import create_when_built, write_wheel

pytestmark = [pytest.mark.timeout(180)]

CONFIG = """
[templates.tiny]
environment = "tiny"

[environments.tiny]
requirements = ["tinyenvpkg"]
[environments.tiny.env]
TINY = "yes"
"""
PROBE = "python -c 'import tinyenvpkg, sys; print(tinyenvpkg.VALUE, sys.prefix)'; echo $TINY"


@dataclass
class BuildingServer:
    url: str
    log: Path
    store: Path
    wheels: Path

    def sdk(self) -> dict[str, str]:
        return {"api_key": API_KEY, "api_url": self.url, "sandbox_url": self.url}

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def building_server(
    directory: Path, *flags: str, config: str = CONFIG, index: bool = False
) -> Iterator[BuildingServer]:
    """``execspace serve`` with the config above, its own environment store and wheel directory, its output in a
    file (read by the test while it runs)."""
    make_traversable(directory)  # as root, the sandboxes' uids pass to their workspaces and the store's trees
    for name in ("ws", "store", "wheels"):
        (directory / name).mkdir(mode=0o755)
    (directory / "serve.toml").write_text(config)
    env = {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1"}
    env |= {"EXECSPACE_ENVIRONMENTS": str(directory / "store"), "PIP_FIND_LINKS": str(directory / "wheels")}
    env |= {} if index else {"PIP_NO_INDEX": "1"}
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", API_KEY, "--pool-size", "0"]
    argv += ["--workspace-root", str(directory / "ws"), "--config", str(directory / "serve.toml")]
    argv += [*(() if "--kernel-environment" in flags else ("--kernel-environment", "none")), *flags]
    log = directory / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        server = BuildingServer("", log, directory / "store", directory / "wheels")
        until_found = time.monotonic() + 60
        while (found := re.search(r"listening on (\S+)", server.output())) is None:
            assert process.poll() is None and time.monotonic() < until_found, server.output()
            time.sleep(0.05)
        server.url = found.group(1)
        yield server
    finally:
        terminate(process, grace=20)


def trees(store: Path) -> list[str]:
    """The complete environment trees of a store (a build's half tree is a dot-directory)."""
    return sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) if store.exists() else []


def test_a_create_that_waits_for_the_first_build_says_so_and_a_retry_gets_the_environment(tmp_path: Path) -> None:
    with building_server(tmp_path, "--build-wait", "0") as server:
        write_wheel(server.wheels, "tinyenvpkg")
        with pytest.raises(ServiceBusyException) as busy:  # the SDK's own retries off: its first answer
            Sandbox.create(template="tiny", retries=0, **server.sdk())
        message = str(busy.value)
        assert "environment 'tiny' is being built on host" in message and "retry" in message, message
        assert str(server.store / ".logs" / "tiny.log") in message, message
        box = create_when_built("tiny", **server.sdk())  # the SDK retries after Retry-After, then we do
        try:
            value, prefix, tiny = box.commands.run(PROBE).stdout.split()
            assert (value, tiny) == ("42", "yes") and Path(prefix).parent == server.store, prefix
        finally:
            box.kill()
        assert trees(server.store) == [Path(prefix).name]
        output = server.output()
        for step in ("python", "venv", "pip", "compile", "publish"):
            assert re.search(rf"environment tiny on host \S+: \[ *[\d.]+s\] {step}: ", output), (step, output)
        assert output.count("building environment tiny") == 1, output


def test_concurrent_creates_wait_for_one_build(tmp_path: Path) -> None:
    with building_server(tmp_path) as server:
        write_wheel(server.wheels, "tinyenvpkg")
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            boxes = list(pool.map(lambda _: create_when_built("tiny", **server.sdk()), range(4)))
        try:
            for box in boxes:
                assert box.commands.run(PROBE).stdout.split()[0] == "42"
        finally:
            for box in boxes:
                box.kill()
        assert len(trees(server.store)) == 1
        assert server.output().count("building environment tiny") == 1, server.output()
        assert (server.store / ".logs" / "tiny.log").read_text().count("=== build of tiny") == 1


def test_a_failed_build_fails_its_create_naming_the_log_and_the_next_create_builds_again(tmp_path: Path) -> None:
    with building_server(tmp_path) as server:
        with pytest.raises(SandboxException) as failed:  # no wheel yet: pip finds no tinyenvpkg
            create_when_built("tiny", **server.sdk())
        message, log = str(failed.value), server.store / ".logs" / "tiny.log"
        assert message.startswith("500: ") and "environment 'tiny' could not be built on host" in message, message
        assert str(log) in message and "tinyenvpkg" in message, message
        assert "=== failed" in log.read_text() and trees(server.store) == []
        write_wheel(server.wheels, "tinyenvpkg")
        box = create_when_built("tiny", **server.sdk())
        try:
            assert box.commands.run(PROBE).stdout.split()[0] == "42"
        finally:
            box.kill()
        assert log.read_text().count("=== build of tiny") == 2
        assert len(trees(server.store)) == 1


def test_an_environment_spec_in_the_config_is_checked_as_a_spec_file_is(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('[environments.data]\nrequirements = ["pandas"]\n[environments.data.env]\nMY = "1"\n')
    (spec,) = load_environments(config).values()
    assert (spec.name, spec.requirements, dict(spec.env)) == ("data", ("pandas",), {"MY": "1"})
    config.write_text('[environments.data]\nrequirement = ["pandas"]\n')
    with pytest.raises(InvalidSpec, match=r"environments\.data.*requirement"):
        load_environments(config)
    config.write_text('[environments.data]\nrequirements = ["--index-url=http://elsewhere/ pandas"]\n')
    with pytest.raises(InvalidSpec, match="not a plain requirement"):
        load_environments(config)


def test_run_code_takes_the_kernels_environment_once_its_first_create_built_it(tmp_path: Path) -> None:
    from e2b_code_interpreter import Sandbox as CodeSandbox

    config = '[environments.kern]\nrequirements = ["ipykernel", "tinyenvpkg"]\n'  # ipykernel from the registry
    with building_server(tmp_path, "--kernel-environment", "kern", config=config, index=True) as server:
        write_wheel(server.wheels, "tinyenvpkg")
        deadline = time.monotonic() + 240
        while True:  # code-interpreter-v1 is in the kernels' environment: its first create builds it
            try:
                box = CodeSandbox.create(**server.sdk())
                break
            except ServiceBusyException:
                assert time.monotonic() < deadline, server.output()
        try:
            run = box.run_code("import sys, tinyenvpkg; print(tinyenvpkg.VALUE, sys.prefix)")
            assert run.error is None, run.error
            value, prefix = "".join(run.logs.stdout).split()
            assert value == "42" and Path(prefix).parent == server.store, prefix
        finally:
            box.kill()
