"""Round 2 attacks on the command policy's environment (F9), protected project files (F10 and the write-grant
case) and artifact scopes, judged by what the host observes: marker files that must not appear, bytes that must
not change, paths that must not be created, and a real ``git status`` that must not run a planted fsmonitor.

The env attacks use the real programs of this machine (less, shasum, git): each is shown to run the attacker's
shell when the application deliberately allows the variable (a control, so that the attack is real here), and
not to when the model alone supplies it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace.registry import probe_backend
from execspace.tools import WorkspaceExecTool
from execspace.tools.shellpolicy import CommandPolicy
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(120)

Engine = execspace.BaseEngine
Ws = execspace.Workspace


def _need(*programs: str) -> None:
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        pytest.skip(f"not installed on this machine: {missing}")


@asynccontextmanager
async def engine_for(backend: str, tmp_path: Path) -> AsyncIterator[Engine]:
    if backend == "sandbox":
        probe = await probe_backend("sandbox")
        if not probe.ok:
            pytest.skip(f"sandbox unavailable: {probe.reason}")
        make_traversable(tmp_path)
    async with execspace.open_engine(backend, workspace_root=tmp_path / "ws") as engine:
        yield engine


# -- F9: the model's env in policy mode --------------------------------------------------

#: (allowed program, command, the model's env with "{m}" for the marker path inside the workspace)
ENV_ATTACKS = [
    pytest.param("less", "less notes.txt", {"LESSOPEN": "|sh -c 'touch {m}' %s"}, id="less-LESSOPEN"),
    pytest.param(
        "shasum", "shasum notes.txt", {"PERL5OPT": "-d", "PERL5DB": 'BEGIN{{system("touch {m}")}}'}, id="shasum-PERL5DB"
    ),
    pytest.param(
        "git",
        "git init -q && git status",
        {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "touch {m}; false"},
        id="git-GIT_CONFIG",
    ),
    pytest.param(
        "git",
        "git diff --no-index --ext-diff notes.txt /etc/hostname",
        {"GIT_EXTERNAL_DIFF": "sh -c 'touch {m}'"},
        id="git-GIT_EXTERNAL_DIFF",
    ),
    pytest.param(
        "tar",
        "tar cf /dev/null notes.txt",
        {"TAR_OPTIONS": "--checkpoint=1 --checkpoint-action=exec=touch\\ {m}"},
        id="tar-TAR_OPTIONS",
    ),
]


async def _exec(engine: Engine, program: str, command: str, env: dict[str, str], **tool: Any) -> dict[str, Any]:
    policy = CommandPolicy(allow=[program, "touch"])
    async with WorkspaceExecTool(engine, workspace_id="red/policy", policy=policy, **tool) as shell:
        return await shell.call({"command": command, "env": env})


@pytest.mark.parametrize("backend", ["local", "sandbox"])
@pytest.mark.parametrize(("program", "command", "env"), ENV_ATTACKS)
async def test_model_env_does_not_turn_an_allowed_program_into_a_shell(
    tmp_path: Path, backend: str, program: str, command: str, env: dict[str, str]
) -> None:
    _need(program)
    async with engine_for(backend, tmp_path) as engine:
        ws = await engine.manager.create_workspace("red/policy")
        assert ws.host_path is not None
        (ws.host_path / "work" / "notes.txt").write_text("hello\n")
        marker = ws.host_path / "out" / "marker"
        model_env = {k: v.format(m=f"{ws.path}/out/marker") for k, v in env.items()}

        r = await _exec(engine, program, command, model_env)
        assert r["status"] == "exited", r
        assert not marker.exists(), f"{program} ran the model's shell through {sorted(env)}"
        assert r["env_dropped"] == sorted(env)
        assert "env_allow" in r["env_note"]

        # control: the same call with the variables deliberately allowed does run the shell here
        r = await _exec(engine, program, command, model_env, env_allow=sorted(env))
        assert marker.exists(), f"control failed, the attack is not real on this machine: {r}"


@pytest.mark.parametrize("backend", ["local", "sandbox"])
async def test_host_env_does_not_reach_a_policy_run(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _need("less", "shasum")
    async with engine_for(backend, tmp_path) as engine:
        ws = await engine.manager.create_workspace("red/policy")
        assert ws.host_path is not None
        (ws.host_path / "work" / "notes.txt").write_text("hello\n")
        marker = ws.host_path / "out" / "marker"
        m = f"{ws.path}/out/marker"
        for name, value in {
            "LESSOPEN": f"|sh -c 'touch {m}' %s",
            "PERL5OPT": "-d",
            "PERL5DB": f'BEGIN{{system("touch {m}")}}',
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "core.pager",
            "GIT_CONFIG_VALUE_0": f"sh -c 'touch {m}'",
        }.items():
            monkeypatch.setenv(name, value)
        for program, command in (("less", "less notes.txt"), ("shasum", "shasum notes.txt")):
            r = await _exec(engine, program, command, {})
            assert r["status"] == "exited" and r["exit_code"] == 0, r
            assert not marker.exists(), f"the host's environment reached {program} in policy mode"


def test_shell_and_loader_variables_can_never_be_allowed() -> None:
    engine: Any = object()
    for name in ("BASH_ENV", "LD_PRELOAD", "PATH", "BASH_FUNC_ls%%", "A-B"):
        with pytest.raises(execspace.InvalidSpec, match="can never be passed"):
            WorkspaceExecTool(engine, workspace_id="x", policy=CommandPolicy(allow=["ls"]), env_allow=[name])
