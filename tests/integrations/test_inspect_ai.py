"""The inspect_ai sandbox provider, run through inspect_ai's own sandbox self-check (its conformance suite for
providers) and found by name through the entry point, as an eval finds it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="needs the inspect-ai extra (pip install 'execspace[inspect-ai]')")

from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - the checks are collected from here

from execspace import UsageError
from execspace.integrations.inspect_ai import ExecspaceSandboxConfig, ExecspaceSandboxEnvironment

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox backend here is bubblewrap")

#: Checks this provider cannot pass on every backend, and why.
UNSUPPORTED = {
    "test_exec_as_user": "one user per workspace: exec(user=...) raises SandboxUserUnsupportedError",
}
#: On local, run by root: its programs are root, which no mode bit stops (as the file checks expect).
ROOT_ON_LOCAL = {
    name: "local runs programs as the caller, and root ignores mode bits"
    for name in (
        "test_read_file_not_allowed",
        "test_write_text_file_without_permissions",
        "test_write_binary_file_without_permissions",
    )
}


# the provider's default (the sandbox in session mode), the sandbox per run (a sandbox per command: /tmp is the
# workspace's, so what one command leaves there the next finds), and local
@pytest.fixture(params=["sandbox", "sandbox-per-run", "local"])
async def sandbox_env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SandboxEnvironment]:
    local = request.param == "local"
    waived = {**UNSUPPORTED, **(ROOT_ON_LOCAL if local and os.geteuid() == 0 else {})}
    if request.node.originalname in waived:
        request.node.add_marker(pytest.mark.xfail(reason=waived[request.node.originalname], strict=True))
    config = None
    if local:  # its own root: a local workspace is a host directory, here under the test's own
        config = ExecspaceSandboxConfig(backend="local", options={"workspace_root": str(tmp_path / "ws")})
    if request.param == "sandbox-per-run":
        config = ExecspaceSandboxConfig(backend="sandbox", options={"mode": "per-run"})
    environments = await ExecspaceSandboxEnvironment.sample_init("self-check", config, {})
    try:
        yield environments["default"]
    finally:
        await ExecspaceSandboxEnvironment.sample_cleanup("self-check", None, environments, False)


async def test_cleanup_removes_the_sample_workspace() -> None:
    config = ExecspaceSandboxConfig(backend="sandbox", options={"mode": "per-run"})
    environments = await ExecspaceSandboxEnvironment.sample_init("cleanup", config, {})
    env = environments["default"].as_type(ExecspaceSandboxEnvironment)
    await env.write_file("kept.txt", "x")
    assert env.workspace.host_path is not None and (env.workspace.host_path / "work/kept.txt").exists()
    await ExecspaceSandboxEnvironment.sample_cleanup("cleanup", config, environments, False)
    assert not env.workspace.host_path.exists()
    with pytest.raises(UsageError, match="closed"):  # the sample's engine is closed with it
        await env.engine.manager.get_workspace(env.workspace.id)


def test_the_entry_point_registers_the_provider_by_name() -> None:
    script = (
        "from inspect_ai._util.entrypoints import ensure_entry_points\n"
        "from inspect_ai.util._sandbox.registry import registry_find_sandboxenv\n"
        "ensure_entry_points()\n"
        "print(registry_find_sandboxenv('execspace').__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ExecspaceSandboxEnvironment"
