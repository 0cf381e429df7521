"""A program bind (``program_binds=(("/home/user", "work"),)``, what ``execspace serve`` gives its sandboxes) shows
a workspace directory the program may have replaced: a sandbox started afterwards must not show, through
``/home/user``, a host directory the program's symlink points at, nor let it write there. The bind carries the
policy's rules for the directory it shows.

The swap is made host-side, as the program would under a policy that lets it write the workspace root (the
default one makes ``work`` a mount point, which no program can rename); what matters is the next sandbox's start.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import PathDenied, RunProgramSpec
from execspace.backends.sandbox import SandboxPolicy
from execspace.registry import probe_backend
from tests.redteam.conftest import SANDBOX_MODES
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(180)

HOME = "/home/user"
BINDS = ((HOME, "work"),)
CANARY = "canary-0b7c"


@pytest.fixture(autouse=True)
async def _sandbox_works() -> None:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")


def victim_dir(tmp_path: Path) -> Path:
    """A host directory outside every workspace that the sandbox's uid could read and write, were it shown."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "canary").write_text(CANARY)
    victim.chmod(0o777)
    (victim / "canary").chmod(0o666)
    return victim


def engine(root: Path, mode: Mapping[str, object], **options: object) -> execspace.Engine:
    return execspace.open_engine("sandbox", workspace_root=root, program_binds=BINDS, **mode, **options)  # type: ignore[arg-type]


async def sh(eng: execspace.Engine, ws: execspace.Workspace, script: str, cwd: str = HOME) -> execspace.RunResult:
    return await eng.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], cwd=cwd))


@pytest.fixture(params=list(SANDBOX_MODES))
def mode(request: pytest.FixtureRequest) -> Mapping[str, object]:
    return SANDBOX_MODES[request.param]


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[Path]:
    make_traversable(tmp_path)
    yield tmp_path / "ws"


async def test_work_swapped_for_a_symlink_is_refused_by_the_next_sandbox(
    tmp_path: Path, root: Path, mode: Mapping[str, object]
) -> None:
    victim = victim_dir(tmp_path)
    async with engine(root, mode) as eng:
        ws = await eng.manager.create_workspace("swap")
        first = await sh(eng, ws, "pwd; echo mine > f")
        assert (first.exit_code, first.stdout) == (0, f"{HOME}\n"), first.stderr
    assert ws.host_path is not None
    work = ws.host_path / "work"
    work.rename(ws.host_path / "old-work")
    work.symlink_to(victim)
    # a new engine: a new sandbox (and, in session mode, a new session) starts on the swapped workspace
    async with engine(root, mode) as eng:
        ws = await eng.manager.get_workspace("swap")
        for cwd in (HOME, "out"):
            with pytest.raises(PathDenied, match=r"work.*symlink"):
                await sh(eng, ws, f"cat {HOME}/canary; echo pwned > {HOME}/canary; echo x > {HOME}/planted", cwd)
        assert (victim / "canary").read_text() == CANARY
        assert sorted(os.listdir(victim)) == ["canary"]
        # as the error says: remove it, and the next sandbox makes an empty work
        work.unlink()
        again = await sh(eng, ws, f"pwd; ls -A {HOME}; echo new > {HOME}/n")
        assert (again.exit_code, again.stdout) == (0, f"{HOME}\n"), again.stderr
        assert (work / "n").read_text() == "new\n" and not work.is_symlink()
    assert sorted(os.listdir(victim)) == ["canary"]


async def test_work_swapped_for_a_file_or_under_a_symlinked_path_is_refused(
    tmp_path: Path, mode: Mapping[str, object]
) -> None:
    victim = victim_dir(tmp_path)
    make_traversable(tmp_path)
    nested = ((HOME, "work/inner"),)
    async with execspace.open_engine(
        "sandbox",
        workspace_root=tmp_path / "ws",
        program_binds=nested,
        **mode,  # type: ignore[arg-type]
    ) as eng:
        ws = await eng.manager.create_workspace("file")
        assert ws.host_path is not None
        (ws.host_path / "work" / "inner").write_text("a file, not a directory")
        with pytest.raises(PathDenied, match="not a directory"):
            await sh(eng, ws, "true", cwd="work")
        (ws.host_path / "work" / "inner").unlink()
        (ws.host_path / "work" / "inner").symlink_to(victim)
        with pytest.raises(PathDenied, match="symlink"):
            await sh(eng, ws, "true", cwd="work")
    assert sorted(os.listdir(victim)) == ["canary"]


async def test_the_bind_carries_the_policy_of_the_directory_it_shows(
    tmp_path: Path, root: Path, mode: Mapping[str, object]
) -> None:
    policy = SandboxPolicy(no_access_paths=("work/secret",), no_access_globs=("**/*.key",))
    async with engine(root, mode, policy=policy) as eng:
        ws = await eng.manager.create_workspace("rules")
        assert ws.host_path is not None
        # the file API keeps to the policy too: the hidden files are the host's own
        for rel, text in (("secret/s.txt", "hidden"), ("sub/id.key", "hidden too"), ("open.txt", "shown")):
            (ws.host_path / "work" / rel).parent.mkdir(exist_ok=True, mode=0o755)
            (ws.host_path / "work" / rel).write_text(text)
        (ws.host_path / "skills" / "s.md").write_text("read-only")
        r = await sh(
            eng,
            ws,
            f"cat {HOME}/open.txt; echo; cat {HOME}/secret/s.txt || echo denied;"
            f" cat {HOME}/sub/id.key || echo denied; echo w > {HOME}/secret/new || echo denied",
        )
        assert r.exit_code == 0 and r.stdout == "shown\ndenied\ndenied\ndenied\n", r.stderr
        # where the policy makes the shown directory read-only, so is the bind
        ro = ((HOME, "work"), ("/srv/skills", "skills"))
    async with execspace.open_engine(
        "sandbox",
        workspace_root=root,
        program_binds=ro,
        **mode,  # type: ignore[arg-type]
    ) as eng:
        ws = await eng.manager.get_workspace("rules")
        script = "cat /srv/skills/s.md; echo; echo w > /srv/skills/s.md || echo refused"
        r = await sh(eng, ws, script, cwd="/srv/skills")
        assert (r.exit_code, r.stdout) == (0, "read-only\nrefused\n"), r.stderr


async def test_the_home_is_bound_from_the_checked_directory_fd_never_by_path(root: Path) -> None:
    """What bwrap is started with: the only mount at the bound path is the fd of the directory the walk opened
    (a bind of ``<ws>/work`` by path would follow whatever the program swapped in before bwrap mounts it)."""
    async with engine(root, {}) as eng:
        ws = await eng.manager.create_workspace("argv")
        assert ws.host_path is not None
        runner: Any = eng.runner
        launch = runner.wrap(runner.preparation.prepare(ws, RunProgramSpec("pwd", cwd=f"{HOME}/sub")))
        try:
            argv = launch.argv
            at_home = [argv[i - 2 : i + 1] for i, a in enumerate(argv) if a == HOME]
            assert len(at_home) == 1 and at_home[0][0] == "--bind-fd", at_home
            fd = int(at_home[0][1])
            assert os.path.samestat(os.fstat(fd), os.stat(ws.host_path / "work", follow_symlinks=False))
            assert fd in launch.pass_fds
            assert argv[argv.index("--chdir") + 1] == f"{HOME}/sub"
        finally:
            launch.stack.abandon()
