"""``read_views``: as root, a host tree under a directory the sandbox's uid cannot pass (a venv under ``/root``) is
shown read-only at its own path, per run and in session mode; the host's files, modes and mount table stay as
they were, and nothing beside the tree is shown. Refusals: a tree others cannot read, a credential store, execspace's
own directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.sandbox import SandboxPolicy
from execspace.errors import PolicyViolation
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="views are mounted by root (a normal user's are grants)")


def _private_tree(tmp_path: Path) -> tuple[Path, Path]:
    """``private`` (0700, like /root) holding ``tree`` (0755, what is shown) and a secret beside it."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    tree = private / "tree"
    (tree / "pkg").mkdir(parents=True, mode=0o755)
    tree.chmod(0o755)
    (tree / "pkg" / "data.txt").write_text("from the view\n")
    (tree / "pkg" / "data.txt").chmod(0o644)
    (private / "secret.txt").write_text("beside the view\n")
    return private, tree


def _snapshot(top: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry under ``top`` (and itself): mode, owner, size-or-0, content of files."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            body = Path(path).read_bytes() if stat.S_ISREG(st.st_mode) else b""
            found[os.path.normpath(path)] = (st.st_mode, st.st_uid, st.st_gid, body)
    return found


def _mounts_under(top: Path) -> set[str]:
    """The host's mount points under ``top`` (the rest of the table is other processes' business)."""
    with open("/proc/self/mountinfo") as f:
        return {p for p in (line.split()[4] for line in f) if p == str(top) or p.startswith(f"{top}/")}


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["per-run", "session"])
async def test_a_tree_under_a_0700_directory_is_shown_read_only_and_nothing_beside_it(
    tmp_path: Path, mode: str
) -> None:
    if not (await probe_backend("sandbox", mode=mode)).ok:
        pytest.skip(f"no working sandbox ({mode}) here")
    private, tree = _private_tree(tmp_path)
    before = _snapshot(private)
    make_traversable(tmp_path)
    private.chmod(0o700)  # make_traversable opened the way to tmp_path only
    async with execspace.open_engine(
        "sandbox", mode=mode, workspace_root=tmp_path / "ws", read_views=(str(tree),)
    ) as eng:
        ws = await eng.manager.create_workspace("views")
        read = await eng.runner.run_program(ws, RunProgramSpec("cat", [f"{tree}/pkg/data.txt"]))
        beside = await eng.runner.run_program(ws, RunProgramSpec("ls", ["-a", str(private)]))
        write = await eng.runner.run_program(
            ws, RunProgramSpec("sh", ["-c", f"echo x > {tree}/pkg/new.txt || echo x > {tree}/pkg/data.txt"])
        )
        uid = await eng.runner.run_program(ws, RunProgramSpec("id", ["-u"]))
    assert (read.exit_code, read.stdout) == (0, "from the view\n"), read.stderr
    assert beside.stdout.split() == [".", "..", "tree"], beside  # the secret is not there
    assert write.exit_code != 0 and "Read-only file system" in write.stderr
    assert int(uid.stdout) != 0  # the sandbox's own uid read it, through "other" bits
    assert _snapshot(private) == before  # no mode, owner or byte of the user's changed
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert _mounts_under(tmp_path) == set()  # the views were in the runs' own mount namespaces
    assert not os.listdir(tmp_path / "ws" / ".grant-stage")  # the clones were in the runs' own namespaces


@pytest.mark.asyncio
async def test_a_tree_others_cannot_read_is_refused_saying_why(tmp_path: Path) -> None:
    private, tree = _private_tree(tmp_path)
    tree.chmod(0o700)
    with pytest.raises(PolicyViolation, match=r"mode 0700\) is not readable and searchable by others"):
        async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", read_views=(str(tree),)):
            pass
    assert stat.S_IMODE(tree.stat().st_mode) == 0o700  # refused, not "fixed"


@pytest.mark.asyncio
async def test_a_view_that_would_show_a_credential_store_or_a_denied_path_is_refused(tmp_path: Path) -> None:
    _private, tree = _private_tree(tmp_path)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    policy = SandboxPolicy(home=str(home)).with_home(None)
    with pytest.raises(PolicyViolation, match=r"\.ssh, which no sandbox may see"):
        async with execspace.open_engine(
            "sandbox", workspace_root=tmp_path / "ws", policy=policy, read_views=(str(home),)
        ):
            pass
    denied = SandboxPolicy().with_no_access(tree / "pkg")
    with pytest.raises(PolicyViolation, match="which no sandbox may see"):
        async with execspace.open_engine(
            "sandbox", workspace_root=tmp_path / "ws", policy=denied, read_views=(str(tree),)
        ):
            pass


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", ["relative/tree", "/proc/self", "/", "WS"])
async def test_a_view_of_what_the_sandbox_makes_or_hides_is_refused(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    with pytest.raises(PolicyViolation, match="read_views"):
        async with execspace.open_engine(
            "sandbox", workspace_root=root, read_views=(str(root) if bad == "WS" else bad,)
        ):
            pass
