"""Templates with the official SDK against a real ``execspace serve``: ``code-interpreter-v1`` runs its commands in the
code-interpreter environment, ``base`` on the host's dirs; templates from the config file carry their own limits (a
CPU quota, memory, processes: reported by ``get_info`` and enforced by the sandbox's cgroup, pooled sandboxes too);
what a template cannot have (an environment not built, an unknown name) fails the create saying why (its disk bound:
test_disk_limits.py)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox, SandboxException

from execspace.backends.sandbox.cgroups import CgroupSupport
from execspace.errors import InvalidSpec
from execspace.server import BUILTIN_TEMPLATES, ServerOptions, Template, load_config
from execspace.server.templates import Profile
from tests.server.conftest import Server, code_interpreter_environment, configured_server, running_server
from tests.support import FORKS

CONFIG = """
[templates.small]
cpu_count = 0.1
memory_mb = 128
pids = 40

[templates.unbuilt]
environment = "no-such-environment"
"""
#: Seconds the CPU-bound loop runs; its CPU time may be at most its quota of that, plus a period's overshoot.
_WINDOW = 2.0
_BUSY = (
    'python3 -c "import time; w, c = time.monotonic(), time.process_time()\n'
    f"while time.monotonic() - w < {_WINDOW}: pass\n"
    'print(time.process_time() - c, time.monotonic() - w)"'
)


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with configured_server(tmp_path_factory.mktemp("templated"), CONFIG, "--pool-size", "small=1") as server:
        yield server


def _sdk(server: Server) -> dict[str, str]:
    return {"api_key": server.key, "api_url": server.url, "sandbox_url": server.url}


def _pool(server: Server) -> dict[str, dict[str, int]]:
    request = urllib.request.Request(f"{server.url}/execspace/pool", headers={"X-API-KEY": server.key})
    with urllib.request.urlopen(request, timeout=10) as response:
        found: dict[str, dict[str, int]] = json.load(response)
    return found


def _limited_here() -> bool:
    return os.geteuid() == 0 and {"cpus", "memory_bytes", "pids"} <= CgroupSupport.detect().enforced


def test_code_interpreter_v1_commands_run_in_its_environment_and_base_on_the_host() -> None:
    code_interpreter = code_interpreter_environment()  # built before the server started
    probe = "python3 -c 'import sys; print(sys.prefix)'; python3 -c 'import pandas; print(pandas.__version__)'"
    sbx = Sandbox.create(template="code-interpreter-v1")
    try:
        prefix, version = sbx.commands.run(probe).stdout.split()
    finally:
        sbx.kill()
    assert prefix == str(code_interpreter.path) and version == code_interpreter.packages["pandas"]
    base = Sandbox.create(template="base")
    try:
        assert base.commands.run("python3 -c 'import sys; print(sys.prefix)'").stdout == "/usr\n"
    finally:
        base.kill()


def test_a_templates_limits_are_reported_and_enforced_pooled_too(templated: Server) -> None:
    if not _limited_here():
        pytest.skip("a sandbox's limits are cgroups (cpu, memory, pids) of its session, made as root")
    deadline = time.monotonic() + 60
    while _pool(templated)["small"]["ready"] < 1:  # the create below takes the pooled one
        assert time.monotonic() < deadline, _pool(templated)
        time.sleep(0.1)
    sbx = Sandbox.create(template="small", **_sdk(templated))
    try:
        assert _pool(templated)["small"]["taken"] == 1
        info = sbx.get_info()
        assert (info.template_id, info.cpu_count, info.memory_mb) == ("small", 1, 128)
        cpu, wall = map(float, sbx.commands.run(_BUSY, timeout=60).stdout.split())
        # one-sided: a quota of 0.1 CPU lets the loop have at most a tenth of its window, and one period (0.1 s)
        # more; without a quota it gets the whole of one core's share (several times that, even on a loaded host)
        assert wall >= _WINDOW and cpu <= 0.1 * wall + 0.15, (cpu, wall)
        hog = "python3 -c \"b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('allocated')\""
        with pytest.raises(CommandExitException) as killed:
            sbx.commands.run(hog, timeout=60)
        assert killed.value.error == "signal: killed" and "allocated" not in killed.value.stdout
        assert (
            0 < int(sbx.commands.run(f"python3 -c '{FORKS}'", timeout=60).stdout) < 40
        )  # the shell and python count too
    finally:
        sbx.kill()
    base = Sandbox.create(template="base", **_sdk(templated))  # the server's own limits: none
    try:
        info = base.get_info()
        assert (info.cpu_count, info.memory_mb) == (os.cpu_count(), templated_memory_mb())
    finally:
        base.kill()


def templated_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def test_what_a_template_cannot_have_fails_its_create_saying_why(templated: Server) -> None:
    with pytest.raises(SandboxException, match=r"500: .*no-such-environment.*execspace env build"):
        Sandbox.create(template="unbuilt", **_sdk(templated))
    with pytest.raises(SandboxException, match=r"400: templateID must be one of base, code-interpreter-v1, small"):
        Sandbox.create(template="no-such-template", **_sdk(templated))


def test_limits_a_backend_cannot_hold_are_refused_at_create(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("[templates.small]\ncpu_count = 0.5\n")
    with running_server(tmp_path / "ws", "--config", str(config), "--sandbox-mode", "per-run") as server:
        with pytest.raises(SandboxException, match=r"501: .*limits per sandbox.*session mode"):
            Sandbox.create(template="small", **_sdk(server))
        Sandbox.create(template="base", **_sdk(server)).kill()  # the rest of the server works


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[templates.x]\ncpu = 1\n", r"unknown key templates\.x\.cpu; \[templates\.x\] takes environment, cpu_count"),
        ("[templates.x]\nmemory_mb = '1G'\n", r"templates\.x\.memory_mb must be an integer, not a string"),
        ("[templates]\nx = 1\n", r"serve\.toml: templates\.x must be a table, not an integer"),
        ("[templates.x]\npids = 0\n", r"template x: pids must be positive"),
        ("[server]\nport = 1\n", r"unknown key server; the top level takes templates"),
        ("[templates.x\n", r"serve config .*serve\.toml"),
    ],
)
def test_a_config_this_server_does_not_understand_is_refused(tmp_path: Path, text: str, error: str) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(text)
    with pytest.raises(InvalidSpec, match=error):
        load_config(config)


def test_server_options_check_their_templates() -> None:
    with pytest.raises(InvalidSpec, match="base included"):
        ServerOptions(api_keys=("k",), templates={"small": Template("small")})
    with pytest.raises(InvalidSpec, match="base included"):
        ServerOptions(api_keys=("k",), templates={**BUILTIN_TEMPLATES, "small": Template("other")})
    with pytest.raises(InvalidSpec, match="pool size for an unknown template 'small'"):
        ServerOptions(api_keys=("k",), pool_sizes=(("small", 1),))
    small = Template("small", cpu_count=0.5, disk_mb=30)
    options = ServerOptions(
        api_keys=("k",), templates={**BUILTIN_TEMPLATES, "small": small}, sandbox_pids=9, sandbox_disk_mb=20
    )
    # the server's limits where the template has none
    assert options.profile("small") == Profile(None, 0.5, None, 9, 30)
    assert options.profile("base") == Profile(None, None, None, 9, 20)
    assert options.resources("small")[0] == 1  # E2B's cpuCount is an integer: rounded up
    assert (options.resources("small")[2], options.resources("base")[2]) == (30, 20)  # diskSizeMB
    with pytest.raises(InvalidSpec, match="sandbox_disk_mb must be at least 1"):
        ServerOptions(api_keys=("k",), sandbox_disk_mb=0)
    assert options.templates["code-interpreter-v1"].environment == "code-interpreter"
    assert ServerOptions(api_keys=("k",), kernel_environment=None).templates["code-interpreter-v1"].environment is None


def test_idle_pause_is_the_templates_else_the_servers(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("[templates.quick]\nidle_pause = 5\n[templates.awake]\nidle_pause = 0\n")
    templates = load_config(config)
    options = ServerOptions(api_keys=("k",), templates=templates, idle_pause=60)
    assert [options.idle_pause_of(t) for t in ("quick", "awake", "base", "a-snapshot")] == [5, None, 60, 60]
    assert ServerOptions(api_keys=("k",), templates=templates).idle_pause_of("base") is None  # off by default
    # the profile (which engine serves it) does not depend on it
    assert options.profile("quick") == options.profile("base")
    with pytest.raises(InvalidSpec, match="idle_pause must be positive"):
        ServerOptions(api_keys=("k",), idle_pause=0)
    with pytest.raises(InvalidSpec, match=r"template x: idle_pause must be 0 \(never\) or more seconds"):
        Template("x", idle_pause=-1)
