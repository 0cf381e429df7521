"""SandboxPolicy: the resolution rules (pure), and each profile and rule kind as the host observes
them through real sandboxes and the engine's file API (run as root in CI, like every sandbox test)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import pytest

import execspace
from execspace import CapabilityError, InputSpec, Isolation, PathDenied, PolicyViolation, PutFile, RunProgramSpec
from execspace.backends.sandbox import Profile, SandboxPolicy
from execspace.backends.sandbox.policy import CREDENTIAL_PATHS, Access
from execspace.errors import InvalidSpec, ProgramNotFound, UnsupportedBackend
from execspace.protocols import SupportsSnapshots
from execspace.registry import probe_backend
from tests.support import make_traversable

WS = "/srv/ws"  # a workspace root for the pure tests: nothing is created there


# -- resolution: most specific rule wins, ties none > write > read ------------------------------------

PRECEDENCE = [
    # (policy, path, expected, why)
    (SandboxPolicy(), ".", Access.READ, "the workspace root is readable"),
    (SandboxPolicy(), "notes.txt", Access.READ, "the root is read-only under workspace-write"),
    (SandboxPolicy(), "work/a/b", Access.WRITE, "layout dirs are writable"),
    (SandboxPolicy(), "work/inputs/x", Access.WRITE, "work/inputs too"),
    (SandboxPolicy(), "skills/s/run.py", Access.READ, "skills are read-only to programs"),
    (SandboxPolicy(), "metadata.json", Access.READ, "the record is read-only to programs"),
    (SandboxPolicy(profile=Profile.READ_ONLY), "out/x", Access.READ, "read-only: nothing writable"),
    (SandboxPolicy(profile=Profile.READ_ONLY).with_write_paths("out"), "out/x", Access.WRITE, "an explicit grant"),
    (SandboxPolicy().with_no_access("work/a"), "work/a/x", Access.NONE, "deeper none beats work's write"),
    (SandboxPolicy().with_no_access("work/a").with_read_paths("work/a/b"), "work/a/b/c", Access.READ, "deeper wins"),
    (SandboxPolicy().with_no_access("work/a").with_read_paths("work/a/b"), "work/a/x", Access.NONE, "sibling"),
    (SandboxPolicy().with_read_paths("work/ref"), "work/ref/x", Access.READ, "deeper read beats work's write"),
    (SandboxPolicy().with_read_paths("work"), "work/x", Access.WRITE, "tie: write beats read"),
    (SandboxPolicy().with_write_paths("d").with_read_paths("d"), "d/x", Access.WRITE, "tie: write beats read"),
    (SandboxPolicy().with_write_paths("d").with_no_access("d"), "d/x", Access.NONE, "tie: none beats write"),
    (SandboxPolicy().with_read_paths("d").with_no_access("d"), "d", Access.NONE, "tie: none beats read"),
    (SandboxPolicy().with_no_access(f"{WS}/work/s"), "work/s/x", Access.NONE, "absolute inside = workspace path"),
    (SandboxPolicy().with_write_paths("."), "notes.txt", Access.WRITE, "a write grant on the root"),
    (SandboxPolicy().with_write_paths("."), ".git/hooks/pre-commit", Access.READ, "protected: never writable"),
    (SandboxPolicy().with_write_paths(".git/hooks"), ".git/hooks/x", Access.READ, "even when granted by name"),
    (SandboxPolicy().with_no_access(".git"), ".git/config", Access.NONE, "protected stays deniable"),
    (SandboxPolicy(protected=("cfg",)).with_write_paths("."), ".git/config", Access.WRITE, "custom protected list"),
    (SandboxPolicy(protected=("cfg",)).with_write_paths("."), ".execspace/x", Access.READ, "ours always protected"),
    (SandboxPolicy().with_no_access_globs("**/*.pem"), "work/k/a.pem", Access.NONE, "glob"),
    (SandboxPolicy().with_no_access_globs("**/*.pem"), "work/k/a.pem.txt", Access.WRITE, "glob anchored"),
    (SandboxPolicy().with_no_access_globs("**/secrets"), "work/secrets/a", Access.NONE, "below a glob match"),
    (
        SandboxPolicy().with_no_access_globs("work/keys/**").with_read_paths("work/keys/pub"),
        "work/keys/pub/a",
        Access.NONE,
        "globs are hard denies: a deeper grant does not reopen them",
    ),
    (SandboxPolicy().with_read_paths("/data"), "/data/x", Access.READ, "host grant"),
    (SandboxPolicy().with_read_paths("/data").with_no_access("/data/s"), "/data/s/k", Access.NONE, "host deeper"),
    (
        SandboxPolicy().with_read_paths("/data", "/data/s/pub").with_no_access("/data/s"),
        "/data/s/pub/k",
        Access.READ,
        "host: deepest wins",
    ),
    (SandboxPolicy(), "/etc/passwd", Access.NONE, "no rule: the system view is the enforcer's, not a rule"),
    (SandboxPolicy(home="/home/u"), "/home/u/.ssh/id_rsa", Access.NONE, "credential store"),
    (SandboxPolicy(home="/home/u").with_read_paths("/home/u"), "/home/u/.aws/creds", Access.NONE, "deeper deny"),
    (SandboxPolicy(home="/home/u").with_read_paths("/home/u/.ssh"), "/home/u/.ssh/k", Access.NONE, "tie: none"),
    (
        SandboxPolicy(home="/home/u").with_read_paths("/home/u/.ssh/known_hosts"),
        "/home/u/.ssh/known_hosts",
        Access.READ,
        "a more specific explicit grant reopens",
    ),
    (SandboxPolicy(profile=Profile.DANGER_FULL_ACCESS), "/etc/shadow", Access.WRITE, "no sandbox at all"),
]


@pytest.mark.parametrize(("policy", "path", "expected", "why"), PRECEDENCE, ids=[p[3] for p in PRECEDENCE])
def test_precedence(policy: SandboxPolicy, path: str, expected: Access, why: str) -> None:
    assert policy.access(WS, path) is expected, policy.decide(WS, path)


def test_decision_names_the_winning_rule() -> None:
    p = SandboxPolicy().with_no_access("work/secret").with_no_access_globs("**/*.key").with_write_paths(".")
    assert "no-access path work/secret" in p.decide(WS, "work/secret/x").reason
    assert "'**/*.key'" in p.decide(WS, "work/a.key").reason
    assert "'.git' is protected" in p.decide(WS, ".git/config").reason


def test_host_default_applies_only_where_no_rule_speaks() -> None:
    p = SandboxPolicy(home="/home/u")
    assert p.access(WS, "/opt/x", host_default=Access.READ) is Access.READ
    assert p.access(WS, "/home/u/.ssh/id", host_default=Access.READ) is Access.NONE


def test_relative_escape_is_refused() -> None:
    with pytest.raises(PathDenied):
        SandboxPolicy().access(WS, "work/../../etc")


def test_file_api_may_stage_what_programs_only_read() -> None:
    p = SandboxPolicy()
    res = p.resolver(WS)
    assert res.file_api_access("skills/s/SKILL.md").access is Access.WRITE
    assert res.file_api_access("metadata.json").access is Access.WRITE
    assert res.file_api_access("notes.txt").access is Access.READ  # the root is not host-managed
    ro = SandboxPolicy(profile=Profile.READ_ONLY).resolver(WS)
    assert ro.file_api_access("work/x").access is Access.READ
    assert ro.file_api_access("metadata.json").access is Access.WRITE  # records are still kept
    assert res.file_api_access(".execspace/denied").access is Access.NONE  # ours, not content
    denied = SandboxPolicy().with_no_access("skills/private").resolver(WS)
    assert denied.file_api_access("skills/private/x").access is Access.NONE


# -- construction ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: SandboxPolicy().with_read_paths("../etc"),
        lambda: SandboxPolicy().with_write_paths("/"),
        lambda: SandboxPolicy().with_no_access_globs("/etc/*"),
        lambda: SandboxPolicy().with_no_access_globs("../x/*"),
        lambda: SandboxPolicy().with_no_access_globs("!keep"),
        lambda: SandboxPolicy(protected=("/etc",)),
        lambda: SandboxPolicy(protected=(".",)),
        lambda: SandboxPolicy().with_no_access("work/a\nb"),
        lambda: SandboxPolicy(profile="sideways"),  # type: ignore[arg-type]
        lambda: SandboxPolicy(profile=Profile.DANGER_FULL_ACCESS, network=False),
        lambda: SandboxPolicy(read_paths="work"),  # type: ignore[arg-type]
        lambda: SandboxPolicy(home="relative/home"),
    ],
    ids=[
        "dotdot",
        "write-root",
        "abs-glob",
        "dotdot-glob",
        "negated-glob",
        "abs-protected",
        "root-protected",
        "control-char",
        "unknown-profile",
        "danger-without-network",
        "string-not-list",
        "relative-home",
    ],
)
def test_impossible_policies_are_refused(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyViolation):
        build()


def test_normalisation_and_builders_copy() -> None:
    base = SandboxPolicy(profile="read-only")  # type: ignore[arg-type]
    assert base.profile is Profile.READ_ONLY
    grown = base.with_read_paths("./work//ref/", Path("/data/")).with_no_access_globs(" ", "./a/*.key")
    assert grown.read_paths == ("work/ref", "/data")
    assert grown.no_access_globs == ("a/*.key",)  # blanks dropped, "./" removed
    assert base.read_paths == () and base.no_access_globs == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.network = True  # type: ignore[misc]


def test_network_defaults_per_profile() -> None:
    assert SandboxPolicy().network_enabled is False
    assert SandboxPolicy(profile=Profile.READ_ONLY).network_enabled is False
    assert SandboxPolicy(profile=Profile.DANGER_FULL_ACCESS).network_enabled is True
    assert SandboxPolicy().with_network(True).network_enabled is True


def test_with_home_resolves_credentials_canonically(tmp_path: Path) -> None:
    real = tmp_path / "real-home"
    real.mkdir()
    link = tmp_path / "home-link"
    link.symlink_to(real)
    bound = SandboxPolicy(credential_paths=(".ssh", "/etc/secret")).with_home(link)
    assert bound.home == str(real)
    assert bound.credential_paths == (str(real / ".ssh"), "/etc/secret")
    assert bound.access(WS, str(real / ".ssh" / "id")) is Access.NONE
    assert SandboxPolicy().with_home(None).credential_paths == ()  # no HOME: nothing relative to resolve


def test_default_credential_stores_cover_the_usual_suspects() -> None:
    for name in (".ssh", ".aws", ".config/gcloud", ".kube", ".docker", ".netrc", ".gnupg"):
        assert name in CREDENTIAL_PATHS


# -- real sandboxes ----------------------------------------------------------------------------------


@asynccontextmanager
async def sandbox(tmp_path: Path, policy: SandboxPolicy | None = None, **kw: object) -> AsyncIterator[Engine]:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", policy=policy, **kw) as engine:
        yield engine


Engine = execspace.BaseEngine


async def sh(engine: Engine, ws: execspace.Workspace, script: str, **kw: object) -> execspace.RunResult:
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], **kw))  # type: ignore[arg-type]


def host(ws: execspace.Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


async def test_workspace_write_profile(tmp_path: Path) -> None:
    async with sandbox(tmp_path) as engine:
        ws = await engine.manager.create_workspace("p/ww")
        before = (host(ws) / "metadata.json").read_bytes()
        r = await sh(
            engine,
            ws,
            'echo o > "$OUTPUT_DIR/o.txt"; echo w > w.txt; echo x > "$WORKSPACE_DIR/top.txt"; '
            'touch "$SKILLS_DIR/s"; echo j > "$WORKSPACE_DIR/metadata.json"; echo "tmp=$TMPDIR"',
        )
        assert (host(ws) / "out/o.txt").read_text() == "o\n"
        assert (host(ws) / "work/w.txt").read_text() == "w\n"
        assert not (host(ws) / "top.txt").exists() and not (host(ws) / "skills/s").exists()
        assert (host(ws) / "metadata.json").read_bytes() == before
        assert f"tmp={ws.path}/tmp" in r.stdout
        await engine.fs.put_files(ws, [PutFile("skills/s/SKILL.md", b"staged by the host")])
        assert (host(ws) / "skills/s/SKILL.md").exists()
        with pytest.raises(PathDenied):
            await engine.fs.put_files(ws, [PutFile("top.txt", b"x")])
        caps = engine.describe()
        assert caps.isolation is Isolation.PROCESS and caps.read_only_mounts and not caps.network_default
        assert caps.details["profile"].startswith("workspace-write; network off")


async def test_read_only_profile(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy(profile=Profile.READ_ONLY)) as engine:
        ws = await engine.manager.create_workspace("p/ro")
        (host(ws) / "work/f.txt").write_text("orig")
        r = await sh(
            engine,
            ws,
            'echo x > f.txt; echo o > "$OUTPUT_DIR/o"; touch "$HOME/h"; '
            'echo "tmp=$TMPDIR"; echo t > "$TMPDIR/t" && cat "$TMPDIR/t"; cat f.txt',
        )
        assert (host(ws) / "work/f.txt").read_text() == "orig"
        assert not (host(ws) / "out/o").exists() and not (host(ws) / "home/h").exists()
        assert "tmp=/tmp" in r.stdout and "\nt\n" in r.stdout  # a private tmpfs instead
        assert r.stdout.endswith("orig")
        with pytest.raises(PathDenied, match="read-only"):
            await engine.fs.put_files(ws, [PutFile("work/x", b"x")])
        assert (await engine.fs.read_file(ws, "work/f.txt")).content == b"orig"
        assert engine.describe().details["profile"].startswith("read-only")


async def test_read_only_with_a_write_grant(tmp_path: Path) -> None:
    policy = SandboxPolicy(profile=Profile.READ_ONLY).with_write_paths("out")
    async with sandbox(tmp_path, policy) as engine:
        ws = await engine.manager.create_workspace("p/ro-out")
        await sh(engine, ws, 'echo o > "$OUTPUT_DIR/o"; echo w > w')
        assert (host(ws) / "out/o").read_text() == "o\n"
        assert not (host(ws) / "work/w").exists()


async def test_danger_full_access_runs_unsandboxed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    outside.chmod(0o600)  # readable only by us: no sandbox uid could read it
    async with sandbox(tmp_path, SandboxPolicy(profile=Profile.DANGER_FULL_ACCESS)) as engine:
        ws = await engine.manager.create_workspace("p/danger")
        r = await sh(engine, ws, f"cat {outside}; echo; id -u")
        assert r.stdout.splitlines() == ["host file", str(os.getuid())]
        caps = engine.describe()
        assert caps.isolation is Isolation.NONE and caps.network_default and not caps.network_control
        assert "pids" not in caps.enforced_limits
        with pytest.raises(CapabilityError):
            await sh(engine, ws, "true", network="off")


async def test_danger_needs_the_profile_by_name(tmp_path: Path) -> None:
    async with sandbox(tmp_path) as engine:
        assert engine.describe().isolation is Isolation.PROCESS  # the default is never unsandboxed


async def test_external_profile_refuses_to_run(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy(profile=Profile.EXTERNAL).with_write_paths(".")) as engine:
        ws = await engine.manager.create_workspace("p/ext")
        with pytest.raises(UnsupportedBackend, match="isolation is provided elsewhere"):
            await sh(engine, ws, "true")
        with pytest.raises(UnsupportedBackend):
            await engine.runner.start_program(ws, RunProgramSpec("true"))
        await engine.fs.put_files(ws, [PutFile("notes.txt", b"x")])  # the file rules still apply
        with pytest.raises(PathDenied, match="protected"):
            await engine.fs.put_files(ws, [PutFile(".git/config", b"x")])
        assert engine.describe().details["runs"].startswith("refused")


async def test_external_profile_has_no_programs_to_list_stop_or_hold(tmp_path: Path) -> None:
    """Its runner is no host runner: nothing is listed, a program asked for is not found, and the manager's
    snapshot (which holds programs still) and clean-up (which stops them) work on a workspace that has none."""
    async with sandbox(tmp_path, SandboxPolicy(profile=Profile.EXTERNAL).with_write_paths(".")) as engine:
        ws = await engine.manager.create_workspace("p/ext-programs")
        assert await engine.runner.list_programs(ws) == []
        with pytest.raises(ProgramNotFound, match="isolation is provided elsewhere"):
            await engine.runner.get_program(ws, 1)
        await engine.fs.put_files(ws, [PutFile("notes.txt", b"x")])
        snapshots = cast(SupportsSnapshots, engine.manager)
        snap = await snapshots.snapshot(ws)
        assert snap.id in {s.id for s in await snapshots.list_snapshots()}
        await engine.manager.cleanup(ws)
        assert ws.host_path is not None and not ws.host_path.exists()


async def test_network_option_and_policy_must_agree(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy().with_network(True), network=True) as engine:
        assert engine.describe().network_default
    with pytest.raises(InvalidSpec):
        async with sandbox(tmp_path, SandboxPolicy().with_network(False), network=True):
            pass


async def test_host_read_and_write_grants(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("input")
    drop = tmp_path / "drop"
    drop.mkdir()
    drop.chmod(0o777)  # as root the program runs as the workspace's uid: file permissions still apply
    async with sandbox(tmp_path, SandboxPolicy().with_read_paths(data).with_write_paths(drop)) as engine:
        ws = await engine.manager.create_workspace("p/grants")
        r = await sh(engine, ws, f"cat {data}/in.txt; echo x > {data}/in.txt; echo out > {drop}/out.txt; ls /")
        assert r.stdout.startswith("input")
        assert (data / "in.txt").read_text() == "input"
        assert (drop / "out.txt").read_text() == "out\n"


async def test_missing_or_impossible_grants_fail_closed(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy().with_read_paths(tmp_path / "nope")) as engine:
        ws = await engine.manager.create_workspace("p/missing")
        with pytest.raises(PathDenied, match="does not exist"):
            await sh(engine, ws, "true")
    async with sandbox(tmp_path, SandboxPolicy().with_read_paths("/proc/1")) as engine:
        ws = await engine.manager.create_workspace("p/proc")
        with pytest.raises(PolicyViolation, match="/proc"):
            await sh(engine, ws, "true")


async def test_no_access_path_in_file_api_and_process(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy().with_no_access("work/secret")) as engine:
        ws = await engine.manager.create_workspace("p/noaccess")
        secret = host(ws) / "work/secret"
        secret.mkdir()
        (secret / "key").write_text("TOP SECRET")
        (host(ws) / "work/public.txt").write_text("public")
        r = await sh(engine, ws, "cat secret/key; ls secret; cat public.txt; rm -rf secret; mv secret s2; echo end")
        assert "TOP SECRET" not in r.stdout and "public" in r.stdout and r.stdout.endswith("end\n")
        assert (secret / "key").read_text() == "TOP SECRET"
        with pytest.raises(PathDenied):
            await engine.fs.read_file(ws, "work/secret/key")
        with pytest.raises(PathDenied):
            await engine.fs.put_files(ws, [PutFile("work/secret/new", b"x")])
        names = [f.name for f in await engine.fs.collect(ws, ["work/**"])]
        assert names == ["work/public.txt"]


async def test_no_access_globs_in_file_api_and_process(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy().with_no_access_globs("**/*.pem")) as engine:
        ws = await engine.manager.create_workspace("p/globs")
        (host(ws) / "work/sub").mkdir()
        (host(ws) / "work/a.pem").write_text("PEM-A")
        (host(ws) / "work/sub/b.pem").write_text("PEM-B")
        (host(ws) / "work/ok.txt").write_text("fine")
        r = await sh(engine, ws, "cat a.pem sub/b.pem ok.txt; mv sub s2; cat s2/b.pem; echo mine > $OUTPUT_DIR/c.pem")
        assert "PEM-" not in r.stdout and "fine" in r.stdout
        assert (host(ws) / "work/a.pem").read_text() == "PEM-A"
        # files a run makes are its own; the file API still never hands them out
        assert (host(ws) / "out/c.pem").exists()
        assert [f.name for f in await engine.fs.collect(ws, ["**/*"]) if f.name.startswith(("work", "out"))] == [
            "work/ok.txt"
        ]
        for bad in ("work/a.pem", "out/c.pem"):
            with pytest.raises(PathDenied):
                await engine.fs.read_file(ws, bad)
        with pytest.raises(PathDenied):
            await engine.fs.put_files(ws, [PutFile("out/new.pem", b"x")])


async def test_protected_git_readable_not_writable(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy().with_write_paths(".")) as engine:
        ws = await engine.manager.create_workspace("p/git")
        git = host(ws) / ".git"
        git.mkdir()
        (git / "config").write_text("[core]\n")
        r = await sh(
            engine,
            ws,
            "cd $WORKSPACE_DIR; cat .git/config; echo evil >> .git/config; mkdir .git/hooks; "
            "mv .git g2; rm -rf .git; echo root > top.txt; echo end",
        )
        assert r.stdout.startswith("[core]") and r.stdout.endswith("end\n")
        assert (git / "config").read_text() == "[core]\n" and not (git / "hooks").exists()
        assert (host(ws) / "top.txt").exists()  # the root grant itself works
        assert (await engine.fs.read_file(ws, ".git/config")).content == b"[core]\n"
        with pytest.raises(PathDenied, match="protected"):
            await engine.fs.put_files(ws, [PutFile(".git/hooks/pre-commit", b"#!/bin/sh\n")])


async def test_missing_protected_dir_cannot_be_created(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy().with_write_paths(".")) as engine:
        ws = await engine.manager.create_workspace("p/git-missing")
        r = await sh(
            engine,
            ws,
            "cd $WORKSPACE_DIR; mkdir -p .agents || echo no-dir; echo x > .agents/AGENTS.md || echo no-file; "
            "echo x > .mcp.json || echo no-mcp; echo x > top.txt",
        )
        assert r.stdout.split() == ["no-dir", "no-file", "no-mcp"], r
        assert (host(ws) / "top.txt").exists()  # the root grant itself works
        # the run's placeholders (empty read-only files mounted read-only) are gone after it
        for name in (".agents", ".mcp.json"):
            assert not (host(ws) / name).exists()


async def test_credential_store_of_home_is_not_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_rsa").write_text("PRIVATE KEY")
    (home / ".netrc").write_text("machine x password y")
    (home / "notes.txt").write_text("visible")
    for p in (home, home / ".ssh"):
        p.chmod(0o755)  # world-readable on the host: only the policy keeps them out
    monkeypatch.setenv("HOME", str(home))
    async with sandbox(tmp_path, SandboxPolicy().with_read_paths(home), host_roots=[home]) as engine:
        ws = await engine.manager.create_workspace("p/creds")
        r = await sh(engine, ws, f"cat {home}/notes.txt; cat {home}/.ssh/id_rsa; ls {home}/.ssh; cat {home}/.netrc")
        assert "visible" in r.stdout
        assert "PRIVATE" not in r.stdout and "id_rsa" not in r.stdout and "password" not in r.stdout
        # nor through the file API: a staged home leaves its credential stores behind
        await engine.fs.stage_directory(ws, home, "work/home-copy")
        staged = sorted(p.name for p in (host(ws) / "work/home-copy").iterdir())
        assert staged == ["notes.txt"]
        with pytest.raises(PathDenied):
            await engine.fs.stage_directory(ws, home / ".ssh", "work/ssh")
        # single files staged as host:// inputs obey the same rules
        for cred in (home / ".ssh/id_rsa", home / ".netrc"):
            with pytest.raises(PathDenied):
                await engine.fs.stage_inputs(ws, [InputSpec(f"host://{cred}", dest="work/k")])
        assert not (host(ws) / "work/k").exists()
        assert await engine.fs.stage_inputs(ws, [InputSpec(f"host://{home}/notes.txt")]) == ["work/inputs/notes.txt"]


async def test_missing_credential_store_under_a_write_grant_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    monkeypatch.setenv("HOME", str(home))
    policy = SandboxPolicy(credential_paths=(".ssh",)).with_write_paths(home)
    async with sandbox(tmp_path, policy) as engine:
        ws = await engine.manager.create_workspace("p/creds-w")
        with pytest.raises(PolicyViolation, match="could create it"):
            await sh(engine, ws, "true")
        (home / ".ssh").mkdir()
        r = await sh(engine, ws, f"echo key > {home}/.ssh/authorized_keys; echo x > {home}/ok; echo end")
        assert r.stdout == "end\n"
        assert not (home / ".ssh/authorized_keys").exists() and (home / "ok").exists()


async def test_cwd_the_policy_hides_is_refused(tmp_path: Path) -> None:
    async with sandbox(tmp_path, SandboxPolicy().with_no_access("work")) as engine:
        ws = await engine.manager.create_workspace("p/cwd")
        with pytest.raises(PathDenied, match="working directory"):
            await sh(engine, ws, "true")
        r = await sh(engine, ws, "ls work; echo end", cwd="out")
        assert r.stdout == "end\n"
