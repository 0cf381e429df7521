"""Attacks on the sandbox's path rules (profiles, grants, no-access paths and globs, protected and
credential paths), judged by what the host observes afterwards: file contents, what the next run
and the file API can reach. Bounded and quick; run as root in CI, the hard case for bubblewrap."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import PathDenied, RunProgramSpec
from execspace.backends.sandbox import SandboxPolicy
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(60)

Engine = execspace.BaseEngine
Ws = execspace.Workspace


@asynccontextmanager
async def sandbox(tmp_path: Path, mode: Mapping[str, Any], policy: SandboxPolicy) -> AsyncIterator[tuple[Engine, Ws]]:
    probe = await probe_backend("sandbox", **mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", policy=policy, **mode) as engine:
        yield engine, await engine.manager.create_workspace("red/profiles")


async def sh(box: tuple[Engine, Ws], script: str) -> execspace.RunResult:
    engine, ws = box
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script]))


def host(box: tuple[Engine, Ws]) -> Path:
    assert box[1].host_path is not None
    return box[1].host_path


def plant_secret(root: Path, rel: str, text: str = "TOP SECRET") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def test_renaming_a_parent_does_not_carry_a_secret_out_of_its_rule(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_no_access("work/p/secret")) as box:
        plant_secret(host(box), "work/p/secret/key")
        r1 = await sh(box, "mv p p2; mv p/secret s2; cp -r p/secret s3; echo done")
        r2 = await sh(box, "cat p2/secret/key s2/key s3/key p/secret/key")
        assert "done" in r1.stdout and "TOP SECRET" not in r2.stdout
        assert (host(box) / "work/p/secret/key").read_text() == "TOP SECRET"
        with pytest.raises(PathDenied):
            await box[0].fs.read_file(box[1], "work/p/secret/key")


async def test_renaming_a_parent_does_not_make_read_only_data_writable(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_read_paths("work/ref/data")) as box:
        data = plant_secret(host(box), "work/ref/data/table.csv", "a,b\n")
        await sh(box, "mv ref r2; mv ref/data d2")
        await sh(box, "echo pwned > ref/data/table.csv; echo pwned > r2/data/table.csv; echo pwned > d2/table.csv")
        assert data.read_text() == "a,b\n"


async def test_masks_cannot_be_undone_from_inside(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> None:
    async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_no_access("work/secret", "work/key.txt")) as box:
        plant_secret(host(box), "work/secret/key")
        plant_secret(host(box), "work/key.txt")
        r = await sh(
            box,
            "chmod 777 secret key.txt; umount secret; umount -l key.txt; mount -o remount,rw secret; "
            "ln key.txt hard; ln -s secret/key soft; cat soft hard; "
            "cat /proc/self/root/workspace/work/key.txt /proc/1/root/workspace/work/secret/key; "
            "rm -f key.txt; echo x > key.txt; stat -c '%a %s' key.txt",
        )
        assert "TOP SECRET" not in r.stdout
        assert r.stdout.strip().endswith("0 0")  # an empty, mode-000 file stands in for it
        assert (host(box) / "work/key.txt").read_text() == "TOP SECRET"
        assert not (host(box) / "work/hard").exists()


async def test_workspace_is_not_reachable_at_its_host_path_through_a_grant(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    # a read grant on a directory that contains the engine's workspaces (this one and others)
    async with sandbox(
        tmp_path, sandbox_mode, SandboxPolicy().with_no_access("work/secret").with_read_paths(tmp_path)
    ) as box:
        plant_secret(host(box), "work/secret/key")
        other = await box[0].manager.create_workspace("red/other")
        assert other.host_path is not None
        plant_secret(other.host_path, "work/theirs.txt", "OTHER SESSION")
        (other.host_path / "work/theirs.txt").chmod(0o644)
        (tmp_path / "visible.txt").write_text("granted")
        r = await sh(box, f"cat {tmp_path}/visible.txt; cat {host(box)}/work/secret/key; cat {other.host_path}/work/*")
        assert "granted" in r.stdout
        assert "TOP SECRET" not in r.stdout and "OTHER SESSION" not in r.stdout


async def test_write_grant_over_the_workspace_cannot_write_protected_paths(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    grant = tmp_path / "ws"
    async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_write_paths(grant)) as box:
        git = host(box) / ".git"
        git.mkdir()
        (git / "config").write_text("[core]\n")
        await sh(box, f"echo evil >> {git}/config; mkdir {git}/hooks; echo x > {host(box)}/metadata.json")
        assert (git / "config").read_text() == "[core]\n" and not (git / "hooks").exists()


async def test_planted_symlink_at_a_protected_path_is_never_mounted(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_write_paths(".")) as box:
        target = tmp_path / "elsewhere"
        target.mkdir()
        (host(box) / ".git").symlink_to(target)
        with pytest.raises(PathDenied, match="symlink"):
            await sh(box, "true")


async def test_program_cannot_plant_protected_paths_for_a_later_run(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_write_paths(".")) as box:
        plant = "cd $WORKSPACE_DIR; ln -s /etc .agents; ln -s /etc .git; mkdir .vscode; echo '{}' > .mcp.json"
        r = await sh(box, f"{plant}; echo end")
        assert r.stdout.endswith("end\n") and r.stderr.count("File exists") + r.stderr.count("Read-only") == 4, r
        if sandbox_mode:
            # a session holds its placeholders while it lives: end it (the next run starts a new one)
            await box[0].runner.stop_programs(box[1])  # type: ignore[attr-defined]
        # nothing planted, and the run's own placeholders are gone: the next run plans on a clean root
        for name in (".git", ".agents", ".vscode", ".mcp.json"):
            p = host(box) / name
            assert not p.exists() and not p.is_symlink(), name
        r = await sh(box, f"{plant}; echo end")
        assert r.exit_code == 0 and r.stdout.endswith("end\n")


async def test_glob_denied_files_stay_hidden_when_moved(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> None:
    async with sandbox(
        tmp_path, sandbox_mode, SandboxPolicy().with_no_access_globs("**/*.pem", "work/vault/**")
    ) as box:
        plant_secret(host(box), "work/certs/site.pem", "PEM KEY")
        plant_secret(host(box), "work/vault/token", "VAULT TOKEN")
        await sh(box, "mv certs c2; mv vault v2; mv vault/token t; cp certs/site.pem x.txt")
        r = await sh(box, "cat certs/site.pem c2/site.pem vault/token v2/token t x.txt")
        assert "PEM KEY" not in r.stdout and "VAULT TOKEN" not in r.stdout
        names = [f.name for f in await box[0].fs.collect(box[1], ["work/**"])]
        assert names == []


async def test_symlink_to_a_denied_path_reads_nothing(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> None:
    async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_no_access("work/secret")) as box:
        plant_secret(host(box), "work/secret/key")
        r = await sh(box, 'ln -s ../work/secret/key "$OUTPUT_DIR/link"; cat "$OUTPUT_DIR/link"')
        assert "TOP SECRET" not in r.stdout
        assert await box[0].fs.collect(box[1], ["out/**"]) == []
        with pytest.raises(PathDenied):
            await box[0].fs.read_file(box[1], "out/link")


async def test_no_access_host_file_inside_the_system_view(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> None:
    # /var is part of the read-only system view; /var/tmp lets any user (root or not) plant a file there
    var_tmp = Path("/var/tmp")
    if not var_tmp.is_dir():
        pytest.skip("no /var/tmp on this host")
    secret_dir = Path(tempfile.mkdtemp(prefix="execspace-redteam-", dir=var_tmp))
    secret = secret_dir / "secret.txt"
    secret.write_text("SYSTEM SECRET")
    secret_dir.chmod(0o755)
    secret.chmod(0o644)  # world-readable on the host: only the policy hides it
    (secret_dir / "public.txt").write_text("public")
    (secret_dir / "public.txt").chmod(0o644)
    try:
        async with sandbox(tmp_path, sandbox_mode, SandboxPolicy().with_no_access(secret)) as box:
            r = await sh(box, f"cat {secret}; cat {secret_dir}/public.txt")
    finally:
        shutil.rmtree(secret_dir)
    assert "SYSTEM SECRET" not in r.stdout and "public" in r.stdout


async def test_credential_directory_under_a_write_grant_is_pinned(
    tmp_path: Path, sandbox_mode: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    plant_secret(home, ".config/gcloud/credentials.json", "GCLOUD TOKEN")
    for p in (home, home / ".config"):
        p.chmod(0o777)
    (home / ".config/gcloud").chmod(0o755)
    (home / ".config/gcloud/credentials.json").chmod(0o644)
    monkeypatch.setenv("HOME", str(home))
    policy = SandboxPolicy(credential_paths=(".config/gcloud",)).with_write_paths(home)
    async with sandbox(tmp_path, sandbox_mode, policy) as box:
        await sh(box, f"mv {home}/.config {home}/c2; mv {home}/.config/gcloud {home}/g2")
        r = await sh(box, f"cat {home}/c2/gcloud/credentials.json {home}/g2/credentials.json {home}/.config/gcloud/*")
    assert "GCLOUD TOKEN" not in r.stdout
    assert (home / ".config/gcloud/credentials.json").read_text() == "GCLOUD TOKEN"
