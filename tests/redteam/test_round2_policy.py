"""Round 2 attacks on the command policy's environment (F9), protected project files (F10 and the write-grant
case) and artifact scopes, judged by what the host observes: marker files that must not appear, bytes that must
not change, paths that must not be created, and a real ``git status`` that must not run a planted fsmonitor.

The env attacks use the real programs of this machine (less, shasum, git): each is shown to run the attacker's
shell when the application deliberately allows the variable (a control, so that the attack is real here), and
not to when the model alone supplies it."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import PathDenied, PutFile, RunProgramSpec
from execspace.artifacts import ArtifactScope, FileArtifactService
from execspace.backends.sandbox import SandboxPolicy, sandbox_of
from execspace.registry import probe_backend
from execspace.tools import WorkspaceExecTool
from execspace.tools.shellpolicy import CommandPolicy
from execspace.workspace.protected import DEFAULT_PROTECTED
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import Daemon
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


# -- F10 and write grants: protected project files ----------------------------------------

#: What the user's project holds before the program runs (the rest of DEFAULT_PROTECTED is absent).
PROJECT = {
    "Makefile": "all:\n\techo hi\n",
    "AGENTS.md": "Be careful.\n",
    ".github/workflows/ci.yml": "on: push\n",
    ".vscode/settings.json": "{}\n",
}


def make_project(path: Path) -> dict[str, bytes]:
    """A git project readable and writable by anyone (so that only the mounts can stop the program, also as
    root); returns the bytes of every file in it."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    for rel, text in PROJECT.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    subprocess.run(["chmod", "-R", "a+rwX", str(path)], check=True)
    return snapshot(path)


def snapshot(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file() and not p.is_symlink()
    }


def _script(project: str, marker: Path, names: str) -> str:
    """Modify, replace, rename away and create every protected path; plant a fsmonitor and a hook."""
    return "\n".join(
        [
            f"cd {project} || exit 9",
            f"for n in {names}; do",
            '  printf evil >> "$n"; mkdir -p "$n"; printf evil > "$n/planted"',
            '  mv "$n" "$n.moved" && { printf evil > "$n" || mkdir "$n"; }',
            '  rm -rf "$n"; printf evil > "$n"',
            "done",
            f"printf '[core]\\n\\tfsmonitor = \"touch {marker}; false\"\\n' >> .git/config",
            f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit",
            "echo done",
        ]
    )


def assert_untouched(
    project: Path, before: dict[str, bytes], marker: Path, creatable: frozenset[str] = frozenset()
) -> None:
    """No protected file of ``before`` changed, none appeared but the ``creatable`` ones (and what the program made
    of them: a host write grant plants nothing to keep a missing one from being created), no planted git config or
    hook runs on the host."""
    after = snapshot(project)
    planted = {rel for rel in after if rel not in before and not rel.startswith(("work/", "out/", "normal.txt"))}
    planted -= {"metadata.json"}
    planted = {rel for rel in planted if rel.split("/")[0].removesuffix(".moved") not in creatable}
    assert not planted, f"the program created protected files on the host: {sorted(planted)}"
    assert {rel: after.get(rel) for rel in before} == before, "the program changed protected files on the host"
    for name in set(DEFAULT_PROTECTED) - creatable:
        assert not (project / f"{name}.moved").exists(), name
    # the user's next git status on the host runs no planted fsmonitor, and git still works
    # (safe.directory: as root the container backend hands the workspace root to its uid; git would refuse it)
    git = ["git", "-c", "safe.directory=*", "-C", str(project)]
    r = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not marker.exists(), "a planted git config or hook ran on the host"


async def test_sandbox_write_grant_over_a_project_cannot_plant_host_config(tmp_path: Path) -> None:
    _need("git")
    project, marker = tmp_path / "proj", tmp_path / "marker"
    before = make_project(project)
    async with engine_for("sandbox", tmp_path) as probe_engine:
        del probe_engine  # skips when the sandbox is unavailable
    make_traversable(tmp_path)
    policy = SandboxPolicy().with_write_paths(project)
    # the names the project lacks: nothing is planted in the user's directory to keep them from being created
    missing = frozenset(p for p in DEFAULT_PROTECTED if p != ".execspace" and not (project / p).exists())
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", policy=policy) as engine:
        ws = await engine.manager.create_workspace("red/protected")
        script = _script(str(project), marker, " ".join(p for p in DEFAULT_PROTECTED if p != ".execspace"))
        with pytest.warns(RuntimeWarning) as warned:
            r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script + "\necho ok > normal.txt"]))
        assert r.stdout.endswith("done\n"), r
        # the grant itself works: the program writes an ordinary file of the project
        assert (project / "normal.txt").read_text() == "ok\n"
        assert_untouched(project, before | {"normal.txt": b"ok\n"}, marker, missing)
        # the run named every missing one it found made afterwards
        assert reported(warned) == {n for n in missing if os.path.lexists(project / n)} != set()
        # the next run (a fresh mount plan) holds too: what the program made is a protected path now
        made = snapshot(project)
        await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script]))
        assert {rel: b for rel, b in snapshot(project).items() if rel.split("/")[0] in missing} == {
            rel: b for rel, b in made.items() if rel.split("/")[0] in missing
        }
    assert_untouched(project, before | {"normal.txt": b"ok\n"}, marker, missing)


def reported(warned: Any) -> set[str]:
    """The protected names the run's warnings say were made during it."""
    return {
        Path(str(w.message).partition(": a protected path")[0]).name
        for w in warned
        if "was missing when the run began" in str(w.message)
    }


async def test_named_opt_out_makes_one_protected_path_writable(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    make_project(project)
    async with engine_for("sandbox", tmp_path):
        pass
    policy = SandboxPolicy().without_protected("Makefile").with_write_paths(project)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", policy=policy) as engine:
        ws = await engine.manager.create_workspace("red/protected")
        await engine.runner.run_program(
            ws, RunProgramSpec("sh", ["-c", f"cd {project}; echo new > Makefile; echo x > AGENTS.md"])
        )
    assert (project / "Makefile").read_text() == "new\n"
    assert (project / "AGENTS.md").read_text() == PROJECT["AGENTS.md"]
    with pytest.raises(execspace.PolicyViolation, match="not protected"):
        SandboxPolicy().without_protected("README.md")


async def test_container_workspace_dir_cannot_plant_host_config(
    tmp_path: Path, docker_daemon: Daemon, test_image: str
) -> None:
    _need("git")
    project, marker = tmp_path / "proj", tmp_path / "marker"
    before = make_project(project)
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0) as engine:
        ws = await engine.manager.create_workspace("red/protected", path=project)
        before = snapshot(project)  # with the layout the engine made
        script = _script("/workspace", marker, " ".join(p for p in DEFAULT_PROTECTED if p != ".execspace"))
        r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script + "\necho ok > work/normal.txt"]))
        assert r.stdout.endswith("done\n"), r
        assert (project / "work/normal.txt").read_text() == "ok\n"
        assert_untouched(project, before | {"work/normal.txt": b"ok\n"}, marker)
        # the host file API refuses the same writes
        for rel in (".git/config", "AGENTS.md", ".envrc", ".git/hooks/pre-commit", ".github/workflows/x.yml"):
            with pytest.raises(PathDenied, match="protected"):
                await engine.fs.put_files(ws, [PutFile(rel, "evil")])
    assert_untouched(project, before | {"work/normal.txt": b"ok\n"}, marker)


async def test_container_pool_workspace_protects_nested_paths(
    tmp_path: Path, docker_daemon: Daemon, test_image: str
) -> None:
    options = {"pool_size": 1, "protected": (*DEFAULT_PROTECTED, "work/repo/.git")}
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", warm=True, **options) as engine:
        ws = await engine.manager.create_workspace("red/pool")
        assert ws.host_path is not None
        script = "cd /workspace; echo x > AGENTS.md; mkdir .git; mv work/repo work/r2; echo x > work/repo/.git/config"
        script += "; echo done"
        r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script]))
        assert r.stdout.endswith("done\n"), r
        assert not (ws.host_path / "AGENTS.md").exists() and not (ws.host_path / ".git").exists()
        # the first missing component is the container's placeholder: an empty file, for the container's life
        repo = ws.host_path / "work/repo"
        assert repo.is_file() and repo.stat().st_size == 0
        assert not (ws.host_path / "work/r2").exists()


async def test_container_workspace_dir_is_left_without_placeholders(
    tmp_path: Path, docker_daemon: Daemon, test_image: str
) -> None:
    project = tmp_path / "proj"
    make_bare_project(project)
    options = {"pool_size": 0, "protected": (*DEFAULT_PROTECTED, "work/repo/.git", "out/.envrc")}
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", **options) as engine:
        ws = await engine.manager.create_workspace("red/dir", path=project)
        before = listing(project, ("runs/",))  # with the layout the engine made
        script = "cd /workspace; mkdir -p work/repo/.git; echo x > out/.envrc; mv work/repo work/r2; echo done"
        r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script]))
        assert r.stdout.endswith("done\n"), r
        assert (project / "work/repo").is_file() and (project / "out/.envrc").stat().st_size == 0
    # the container is gone: so are its placeholders, and the user's DIR has only what the engine laid out
    assert listing(project, ("runs/",)) == before


# -- missing protected paths: a host write grant plants nothing; a writable workspace holds placeholders --------

#: Every protected name the project below lacks (all of them: it has no .git either).
MISSING = tuple(p for p in DEFAULT_PROTECTED if p != ".execspace")


def make_bare_project(path: Path) -> dict[str, tuple[int, int]]:
    """A project with none of the protected paths, writable by anyone (so that only the mounts can stop the
    program, also as root); returns its listing."""
    (path / "src").mkdir(parents=True)
    (path / "README.md").write_text("hello\n")
    (path / "src/main.py").write_text("print('hi')\n")
    subprocess.run(["chmod", "-R", "a+rwX", str(path)], check=True)
    return listing(path)


def listing(path: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
    """Every entry below ``path`` (and ``path`` itself): its type and mode, links not followed."""
    out: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(path):
        for name in (".", *dirs, *files) if top == str(path) else (*dirs, *files):
            rel = os.path.normpath(os.path.relpath(os.path.join(top, name), path))
            if not rel.startswith(skip):
                st = os.lstat(os.path.join(top, name))
                out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
    return out


def create_attempts(project: str, names: tuple[str, ...] = MISSING) -> str:
    """Try every way to create each name (file, directory, a child, a rename over it, a symlink, after removing
    or moving what is there); print CREATED for each that worked, and WROTE when an ordinary file could be made
    (the control: the grant is writable)."""
    return "\n".join(
        [
            f"cd {project} || exit 9",
            "printf x > scratch.txt && echo WROTE; rm -f scratch.txt",
            f"for n in {' '.join(names)}; do",
            '  rm -rf "$n" 2>/dev/null; mv "$n" "$n.moved" 2>/dev/null && echo "MOVED $n"',
            '  { printf evil > "$n"; } 2>/dev/null && echo "CREATED $n file"',
            '  mkdir "$n" 2>/dev/null && echo "CREATED $n dir"',
            '  mkdir -p "$n/hooks" 2>/dev/null && echo "CREATED $n/hooks"',
            '  printf evil > .t && mv -f .t "$n" 2>/dev/null && echo "CREATED $n rename"; rm -f .t',
            '  ln -s /tmp "$n" 2>/dev/null && echo "CREATED $n link"',
            '  if [ -s "$n" ] || [ -d "$n" ] || [ -L "$n" ]; then echo "CREATED $n found"; fi',
            "done",
            "echo attempted",
        ]
    )


def assert_none_created(out: str) -> None:
    assert "WROTE" in out and "attempted" in out, f"control failed (the grant is not writable?): {out!r}"
    assert "CREATED" not in out and "MOVED" not in out, out


@asynccontextmanager
async def write_grant_engine(tmp_path: Path, project: Path, name: str = "ws") -> AsyncIterator[Engine]:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    policy = SandboxPolicy().with_write_paths(project)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / name, policy=policy) as engine:
        yield engine


async def wait_for(path: Path, handle: Any) -> None:
    """Poll until the program created ``path`` (it is ready), failing fast if it exited instead."""
    ended = asyncio.ensure_future(handle.wait())
    for _ in range(3000):
        if path.exists():
            ended.cancel()  # wait() is shielded: the run goes on
            return
        await asyncio.sleep(0.01)
        assert not ended.done(), ended.result()
    raise AssertionError(f"{path} never appeared")


def holding(ws: Ws, ident: str, before: str = "") -> str:
    """Run ``before``, say ready, wait for the go (the host looks meanwhile)."""
    out = f"{ws.path}/out"
    return f"{before}\ntouch {out}/{ident}.ready\nwhile [ ! -e {out}/{ident}.go ]; do sleep 0.01; done"


async def test_a_write_grant_plants_nothing_in_the_users_directory(tmp_path: Path) -> None:
    """While a run holds the grant the user's directory is exactly as it was (no placeholder for a missing protected
    name), and so it is after runs that end every way: exited, timed out, killed, never started."""
    project = tmp_path / "proj"
    before = make_bare_project(project)
    async with write_grant_engine(tmp_path, project) as engine:
        ws = await engine.manager.create_workspace("red/plants")
        assert ws.host_path is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing was made: nothing to report
            h = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", holding(ws, "a")]))
            await wait_for(ws.host_path / "out/a.ready", h)
            assert listing(project) == before, "a running sandbox planted files in the user's directory"
            (ws.host_path / "out/a.go").touch()
            assert (await h.wait()).exit_code == 0
            assert listing(project) == before

            r = await engine.runner.run_program(ws, RunProgramSpec("sleep", ["60"], timeout=1.0))
            assert r.timed_out and listing(project) == before
            h = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", holding(ws, "k")]))
            await wait_for(ws.host_path / "out/k.ready", h)
            await h.kill()
            await h.wait()
            assert listing(project) == before
            sandbox = sandbox_of(engine.runner)
            sandbox.bwrap, sandbox.setpriv = str(tmp_path / "no-bwrap"), None
            r = await engine.runner.run_program(ws, RunProgramSpec("true"))
            assert r.exit_code != 0 and listing(project) == before


async def test_missing_protected_names_a_program_makes_are_the_programs_and_reported(tmp_path: Path) -> None:
    """Nothing planted means nothing keeps a missing protected name from being made: the program can make each
    (documented), the run warns naming each, and from the next run on each is a protected path like any other."""
    project = tmp_path / "proj"
    make_bare_project(project)
    async with write_grant_engine(tmp_path, project) as engine:
        ws = await engine.manager.create_workspace("red/missing")
        with pytest.warns(RuntimeWarning) as warned:
            r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", create_attempts(str(project))]))
        assert "WROTE" in r.stdout and "attempted" in r.stdout, r
        made = {n for n in MISSING if os.path.lexists(project / n)}
        assert made == set(MISSING) and reported(warned) == made
        # as root they are the project owner's (root's): the program's uid is mapped to it in the grant
        assert {os.lstat(project / n).st_uid for n in MISSING} == {os.geteuid()}
        frozen = listing(project)
        r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", create_attempts(str(project))]))
        changed = [line for line in r.stdout.splitlines() if line.startswith(("CREATED", "MOVED"))]
        assert "WROTE" in r.stdout and all(line.endswith(" found") for line in changed), r.stdout
        assert listing(project) == frozen, "a protected path the program made before was changed"


async def test_make_reads_the_projects_makefile_and_cannot_change_it(tmp_path: Path) -> None:
    """No placeholder ``GNUmakefile`` stands in front of the project's ``Makefile`` (one would hide it from make:
    "No targets"), and the ``Makefile`` itself can be neither written, removed, renamed nor replaced."""
    project = tmp_path / "proj"
    make_bare_project(project)
    (project / "Makefile").write_text("all:\n\t@echo built-by-$(firstword $(MAKEFILE_LIST))\n")
    subprocess.run(["chmod", "a+rw", str(project / "Makefile")], check=True)
    before = listing(project)
    async with write_grant_engine(tmp_path, project) as engine:
        ws = await engine.manager.create_workspace("red/make")
        made = await engine.runner.run_program(ws, RunProgramSpec("make", ["-s", "-C", str(project)]))
        assert made.exit_code == 0 and made.stdout.strip() == "built-by-Makefile", made.stdout + made.stderr
        attempts = "; ".join(
            f"{how} 2>/dev/null && echo CHANGED"
            for how in ("echo x >> Makefile", "rm -f Makefile", "mv Makefile M.x", "ln -sf /etc/passwd Makefile")
        )
        r = await engine.runner.run_program(
            ws, RunProgramSpec("sh", ["-c", f"cd {project} && {{ {attempts}; }}; echo done"])
        )
        assert r.stdout.strip().splitlines()[-1] == "done" and "CHANGED" not in r.stdout, r.stdout
    assert listing(project) == before and (project / "Makefile").read_text().startswith("all:")


@asynccontextmanager
async def workspace_dir_engine(tmp_path: Path, project: Path, name: str = "ws") -> AsyncIterator[tuple[Engine, Ws]]:
    """``--workspace DIR`` with the root writable: a user's directory as the workspace, whose missing protected
    names get transient placeholders for each run (the workspace's own rule, unlike a host grant's)."""
    async with engine_for("sandbox", tmp_path):
        pass
    policy = SandboxPolicy().with_write_paths(".")
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / name, policy=policy) as engine:
        ws = await engine.manager.create_workspace("red/dir", path=project)
        subprocess.run(["chmod", "-R", "a+rwX", str(project)], check=True)
        yield engine, ws


#: What a run lays out in a workspace directory: a directory per run, and execspace's own (mask files), kept.
LAYOUT_SKIP = ("runs/", ".execspace")


def waiting(ws: Ws, ident: str) -> str:
    """Attempt, say ready, wait for the go, attempt again (the other run may have ended meanwhile)."""
    attempts = create_attempts(ws.path)
    return holding(ws, ident, attempts) + f"\n{attempts}"


async def test_user_workspace_dir_is_left_as_it_was(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    make_bare_project(project)
    async with workspace_dir_engine(tmp_path, project) as (engine, ws):
        before = listing(project, LAYOUT_SKIP)
        for _ in range(2):  # the second run plans afresh on the same directory
            r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", create_attempts(ws.path)]))
            assert_none_created(r.stdout)
            assert listing(project, LAYOUT_SKIP) == before


@pytest.mark.slow
async def test_concurrent_runs_on_one_workspace_dir_hold_until_both_end(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    make_bare_project(project)
    async with workspace_dir_engine(tmp_path, project) as (engine, ws):
        assert ws.host_path is not None
        before = listing(project, LAYOUT_SKIP)
        for round_ in range(4):
            first, second = ("a", "b") if round_ % 2 == 0 else ("b", "a")
            handles = {
                i: await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", waiting(ws, i)]))
                for i in ("a", "b")
            }
            for i, h in handles.items():
                await wait_for(ws.host_path / f"out/{i}.ready", h)
            # both run: what the host sees at each name is at most an empty file (a placeholder)
            for n in MISSING:
                p = project / n
                assert not p.exists() or (stat.S_ISREG(p.lstat().st_mode) and p.lstat().st_size == 0), n
            (ws.host_path / f"out/{first}.go").touch()
            assert_none_created((await handles[first].wait()).stdout)
            # the first run is over: the second still cannot create anything
            (ws.host_path / f"out/{second}.go").touch()
            r = await handles[second].wait()
            assert_none_created(r.stdout)
            assert r.stdout.count("attempted") == 2, r.stdout
            for i in ("a", "b"):
                for suffix in ("ready", "go"):
                    (ws.host_path / f"out/{i}.{suffix}").unlink()
            assert listing(project, LAYOUT_SKIP) == before, f"round {round_}: the runs left the directory changed"


async def test_runs_of_two_engines_on_one_workspace_dir_hold_while_either_runs(tmp_path: Path) -> None:
    """Another process's run still mounting a placeholder: it is not removed under it (a host unlink would
    detach that run's mount); it is left, with a warning, for the user to remove."""
    project = tmp_path / "proj"
    make_bare_project(project)
    async with (
        workspace_dir_engine(tmp_path, project, "ws1") as (one, ws1),
        workspace_dir_engine(tmp_path, project, "ws2") as (two, ws2),
    ):
        assert ws1.host_path is not None and ws2.host_path is not None
        skip = (*LAYOUT_SKIP, "out/")  # the runs' ready and go files
        before = listing(project, skip)
        a = await one.runner.start_program(ws1, RunProgramSpec("sh", ["-c", waiting(ws1, "a")]))
        await wait_for(ws1.host_path / "out/a.ready", a)
        b = await two.runner.start_program(ws2, RunProgramSpec("sh", ["-c", waiting(ws2, "b")]))
        await wait_for(ws2.host_path / "out/b.ready", b)
        (ws1.host_path / "out/a.go").touch()
        with pytest.warns(RuntimeWarning, match="another execspace process still mounts"):
            assert_none_created((await a.wait()).stdout)
        (ws2.host_path / "out/b.go").touch()
        r = await b.wait()
        assert_none_created(r.stdout)
        assert r.stdout.count("attempted") == 2, r.stdout
        left = set(listing(project, skip)) - set(before)
    assert left == set(MISSING), left
    assert all((project / n).stat().st_size == 0 and not (project / n).is_dir() for n in MISSING)


async def test_a_placeholder_changed_during_the_run_is_left_and_reported(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    make_bare_project(project)
    async with workspace_dir_engine(tmp_path, project) as (engine, ws):
        assert ws.host_path is not None
        h = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", holding(ws, "c")]))
        await wait_for(ws.host_path / "out/c.ready", h)
        envrc = project / ".envrc"
        assert envrc.is_file() and envrc.stat().st_size == 0
        envrc.chmod(0o644)
        envrc.write_text("export A=1\n")  # the user (on the host) writes their own .envrc meanwhile
        (ws.host_path / "out/c.go").touch()
        with pytest.warns(RuntimeWarning, match=r"\.envrc: left in place: it changed"):
            await h.wait()
    assert envrc.read_text() == "export A=1\n"
    assert not (project / "Makefile").exists()


# -- artifact scopes ---------------------------------------------------------------------

SCOPE_IDS = ["app/alice", "app/alice/default", "app/alice/=default", "app", "app/default", "app/default/default"]


def test_distinct_workspace_ids_get_distinct_artifact_scopes() -> None:
    scopes = [ArtifactScope.from_workspace_id(i) for i in SCOPE_IDS]
    assert len(set(scopes)) == len(SCOPE_IDS), dict(zip(SCOPE_IDS, scopes, strict=True))


async def test_one_tenants_artifact_is_not_visible_to_the_other_id(tmp_path: Path) -> None:
    service = FileArtifactService(tmp_path / "artifacts")
    for i in SCOPE_IDS:
        await service.save(ArtifactScope.from_workspace_id(i), "report.txt", i.encode())
    for i in SCOPE_IDS:
        scope = ArtifactScope.from_workspace_id(i)
        assert (await service.load(scope, "report.txt")).data == i.encode()
        assert await service.list_versions(scope, "report.txt") == [1]
