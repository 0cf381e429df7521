"""Attacks on a host write grant ("sandbox my repo"), judged by what the host observes afterwards: owners, modes,
contents and link counts of the user's files and of files beside them.

As root a write grant is an idmapped clone of the user's tree (``backends/sandbox/grants.py``): the program's uid
owns there what the tree's owner owns, and what it makes lands as the owner's. The attacks try to take that further:
out of the tree through symbolic links (planted by the program, or found there), a grant path swapped for a link
between the policy and the run, hard links in and out, chmod and chown, set-user-ID files made or found in the
grant, and files of other owners in it. As a normal user the sandbox runs as the user, and the same attacks must
get no further (the set-ID rules hold there too). Bounded and quick; per-run and session.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import PathDenied, RunProgramSpec
from execspace.backends.sandbox import SandboxPolicy
from execspace.registry import probe_backend
from tests.support import ATTEMPTS, make_traversable

pytestmark = pytest.mark.timeout(120)

ROOT = os.geteuid() == 0
#: A uid and gid no account has: the owner of a user's tree that is not root's (as root) or of a stranger's file.
STRANGER = 42_4242

Engine = execspace.BaseEngine
Ws = execspace.Workspace


@asynccontextmanager
async def granted(
    tmp_path: Path, mode: Mapping[str, Any], write: list[Path], read: list[Path] | None = None
) -> AsyncIterator[tuple[Engine, Ws]]:
    probe = await probe_backend("sandbox", **mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    policy = SandboxPolicy().with_write_paths(*write).with_read_paths(*(read or []))
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", policy=policy, **mode) as engine:
        yield engine, await engine.manager.create_workspace("red/grants")


async def run(box: tuple[Engine, Ws], script: str, cwd: str | None = None) -> execspace.RunResult:
    engine, ws = box
    spec = RunProgramSpec("sh", ["-c", script], **({"cwd": cwd} if cwd else {}))
    return await engine.runner.run_program(ws, spec)


async def attempt(box: tuple[Engine, Ws], body: str) -> dict[str, str]:
    """Run the Python ``body`` (``attempt(label, fn)`` lines) in the sandbox: each label's outcome."""
    engine, ws = box
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", ATTEMPTS + body]))
    assert r.exit_code == 0, (r.stdout, r.stderr)
    found: dict[str, str] = {}
    for line in r.stdout.splitlines():  # "label OK" or "label ErrorType ERRNO"; a label may have spaces
        words = line.split(" ")
        n = 1 if words[-1] == "OK" else 2
        found[" ".join(words[:-n])] = " ".join(words[-n:])
    return found


def project_in_closed_dir(tmp_path: Path) -> Path:
    """A root-owned project (as the user who runs execspace owns it) in a 0700 directory, itself 0700: the case
    that failed as root (the sandbox's uid could neither pass the parent nor write the tree)."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    project = closed / "proj"
    project.mkdir(mode=0o700)
    (project / "main.py").write_text("print('hi')\n")
    (project / "main.py").chmod(0o600)
    (project / "src").mkdir(mode=0o750)
    (project / "src" / "lib.py").write_text("X = 1\n")
    return project


def owners_and_modes(tree: Path) -> dict[str, tuple[int, int, int]]:
    out: dict[str, tuple[int, int, int]] = {}
    for top, dirs, files in os.walk(tree):
        for name in (*dirs, *files):
            p = os.path.join(top, name)
            st = os.lstat(p)
            out[os.path.relpath(p, tree)] = (st.st_uid, st.st_gid, st.st_mode)
    return out


async def test_a_write_grant_in_a_closed_directory_is_written_as_its_owner(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    project = project_in_closed_dir(tmp_path)
    before = owners_and_modes(project)
    me = (os.geteuid(), os.getegid())
    async with granted(tmp_path, sandbox_mode, [project]) as box:
        r = await run(
            box,
            "cat main.py && echo more >> src/lib.py && echo new > made.txt && mkdir -p pkg/sub && "
            "echo x > pkg/sub/m.py && ln -s main.py link.py && pwd",
            cwd=str(project),
        )
        assert r.exit_code == 0 and r.stdout == f"print('hi')\n{project}\n", (r.stdout, r.stderr)
    # what it made is the tree owner's, with ordinary modes; what was there keeps its owner and mode
    after = owners_and_modes(project)
    for rel in ("made.txt", "pkg", "pkg/sub", "pkg/sub/m.py", "link.py"):
        assert after[rel][:2] == me, (rel, after[rel])
        assert not after[rel][2] & (stat.S_ISUID | stat.S_ISGID), rel
    assert {rel: after[rel] for rel in before} == before
    assert (project / "src/lib.py").read_text() == "X = 1\nmore\n"
    assert stat.S_IMODE(os.stat(project.parent).st_mode) == 0o700 and os.stat(project.parent).st_uid == me[0]


@pytest.mark.skipif(not ROOT, reason="an owner other than the caller needs root")
async def test_a_grant_of_another_owners_tree_is_written_as_that_owner(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    """The program's uid is the tree's owner there (not root's): its new files are the owner's, root's own files in
    the tree stay out of its reach, and so does a third owner's."""
    project = tmp_path / "alice"
    project.mkdir()
    (project / "root-owned").write_text("root's\n")
    (project / "root-owned").chmod(0o644)
    (project / "stranger").write_text("someone's\n")
    os.chown(project / "stranger", STRANGER + 1, STRANGER + 1)
    os.chown(project, STRANGER, STRANGER)
    async with granted(tmp_path, sandbox_mode, [project]) as box:
        got = await attempt(
            box,
            f"base = {str(project)!r}\n"
            "import os\n"
            "attempt('made', lambda: open(base + '/new', 'w').write('x'))\n"
            "attempt('root-owned', lambda: open(base + '/root-owned', 'a').write('x'))\n"
            "attempt('stranger', lambda: open(base + '/stranger', 'a').write('x'))\n"
            "attempt('chown', lambda: os.chown(base + '/new', 0, 0))\n",
        )
    assert got["made"] == "OK", got
    assert got["root-owned"] == got["stranger"] == "PermissionError EACCES", got
    assert got["chown"] in ("PermissionError EPERM", "OSError EINVAL"), got  # EINVAL: root is no uid in there
    assert os.lstat(project / "new").st_uid == STRANGER and os.lstat(project / "new").st_gid == STRANGER
    assert (project / "root-owned").read_text() == "root's\n" and (project / "stranger").read_text() == "someone's\n"


async def test_links_out_of_the_grant_reach_nothing_of_the_host(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    project = project_in_closed_dir(tmp_path)
    beside = tmp_path / "closed" / "secret"  # beside the grant, the owner's, 0600
    beside.write_text("TOP SECRET\n")
    beside.chmod(0o600)
    (project / "found-link").symlink_to(beside)  # a link the user's tree already has
    passwd = Path("/etc/passwd").read_bytes()
    async with granted(tmp_path, sandbox_mode, [project]) as box:
        got = await attempt(
            box,
            f"base, beside = {str(project)!r}, {str(beside)!r}\n"
            "import os\n"
            "os.symlink('/etc/passwd', base + '/pw'); os.symlink(beside, base + '/out'); os.symlink('/', base + '/r')\n"
            "attempt('write passwd by a link', lambda: open(base + '/pw', 'a').write('evil::0:0::/:/bin/sh\\n'))\n"
            "attempt('write /etc by a dir link', lambda: open(base + '/r/etc/evil', 'w').write('x'))\n"
            "attempt('read beside by a link', lambda: open(base + '/out').read())\n"
            "attempt('read the found link', lambda: open(base + '/found-link').read())\n"
            "attempt('write the found link', lambda: open(base + '/found-link', 'w').write('evil'))\n"
            "attempt('list the parent', lambda: os.listdir(os.path.dirname(base)))\n",
        )
    assert got["write passwd by a link"].startswith("OSError EROFS") or "EACCES" in got["write passwd by a link"], got
    assert got["write /etc by a dir link"].startswith(("OSError EROFS", "PermissionError EACCES")), got
    for label in ("read beside by a link", "read the found link"):
        assert got[label] == "FileNotFoundError ENOENT", (label, got)
    # a write through the found link lands where its target is in the sandbox's own view (the directories bwrap
    # made to mount the grant on), never at the host's file: checked below
    assert "secret" not in got["list the parent"], got
    assert Path("/etc/passwd").read_bytes() == passwd and not Path("/etc/evil").exists()
    assert beside.read_text() == "TOP SECRET\n" and stat.S_IMODE(beside.stat().st_mode) == 0o600


async def test_a_grant_swapped_for_a_link_is_refused_never_followed(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    """A program with a grant over a parent (another workspace's: in its own sandbox the inner grant is a mount
    point, which cannot be renamed) swaps the inner grant for a link to a directory of the host's: the next
    sandbox granted the inner path must not show the link's target writable (as root: idmapped to the program).
    It refuses to start, naming the grant."""
    outer = tmp_path / "outer"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("host's\n")
    before = owners_and_modes(victim)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with granted(tmp_path / "b", sandbox_mode, [inner]) as victim_box:  # its policy is made now
        async with granted(tmp_path / "a", sandbox_mode, [outer]) as attacker:
            r = await run(attacker, f"cd {outer} && mv inner inner.x && ln -s {victim} inner && echo swapped")
            assert r.stdout == "swapped\n", (r.stdout, r.stderr)
        with pytest.raises(PathDenied, match="changed since the policy was made"):
            await run(victim_box, f"echo evil > {inner}/keep; echo evil > {victim}/new")
    assert (victim / "keep").read_text() == "host's\n" and owners_and_modes(victim) == before


async def test_hard_links_into_the_grant_from_outside_fail(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> None:
    project = project_in_closed_dir(tmp_path)
    async with granted(tmp_path, sandbox_mode, [project]) as box:
        engine, ws = box
        assert ws.host_path is not None
        (ws.host_path / "work" / "mine").write_text("the workspace's\n")
        got = await attempt(
            box,
            f"base = {str(project)!r}\n"
            "import os\n"
            "attempt('link /etc/shadow', lambda: os.link('/etc/shadow', base + '/shadow'))\n"
            "attempt('link /etc/passwd', lambda: os.link('/etc/passwd', base + '/passwd'))\n"
            "attempt('link from the workspace', lambda: os.link('/workspace/work/mine', base + '/mine'))\n"
            "attempt('link within', lambda: os.link(base + '/main.py', base + '/main2.py'))\n",
        )
    for label in ("link /etc/shadow", "link /etc/passwd", "link from the workspace"):
        assert got[label] in ("OSError EXDEV", "PermissionError EPERM", "PermissionError EACCES"), (label, got)
    assert got["link within"] == "OK", got
    assert os.stat("/etc/shadow").st_nlink == 1 and os.stat("/etc/passwd").st_nlink == 1
    assert sorted(p.name for p in project.iterdir()) == ["main.py", "main2.py", "src"]


async def test_no_set_id_file_comes_out_of_a_grant(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> None:
    """Every way to make a set-user-ID or set-group-ID file in the grant is refused: as root such a file of a
    root-owned tree would run as root for every user of the host."""
    project = project_in_closed_dir(tmp_path)
    shell = shutil.which("sh")
    assert shell is not None
    async with granted(tmp_path, sandbox_mode, [project]) as box:
        got = await attempt(
            box,
            f"base = {str(project)!r}\n"
            "import os, shutil, stat\n"
            f"shutil.copy({shell!r}, base + '/sh')\n"
            "attempt('chmod u+s', lambda: os.chmod(base + '/sh', 0o4755))\n"
            "attempt('chmod g+s', lambda: os.chmod(base + '/sh', 0o2755))\n"
            "attempt('fchmod u+s', lambda: os.fchmod(os.open(base + '/sh', os.O_RDONLY), 0o4755))\n"
            "attempt('chmod g+s dir', lambda: os.chmod(base + '/src', 0o2775))\n"
            "attempt('create u+s', lambda: os.close(os.open(base + '/c', os.O_CREAT | os.O_WRONLY, 0o4755)))\n"
            "attempt('tmpfile g+s', lambda: os.close(os.open(base, os.O_TMPFILE | os.O_WRONLY, 0o2755)))\n"
            "attempt('mknod u+s', lambda: os.mknod(base + '/n', stat.S_IFREG | 0o4755))\n"
            "attempt('plain chmod', lambda: os.chmod(base + '/sh', 0o750))\n",
        )
        r = await run(box, f"cd {project} && install -m 4755 sh sh2; chmod 6755 sh; ls -l sh sh2 2>&1; true")
    for label in ("chmod u+s", "chmod g+s", "fchmod u+s", "chmod g+s dir", "create u+s", "tmpfile g+s", "mknod u+s"):
        assert got[label] == "PermissionError EPERM", (label, got)
    assert got["plain chmod"] == "OK", got
    set_id = {rel for rel, (_, _, mode) in owners_and_modes(project).items() if mode & (stat.S_ISUID | stat.S_ISGID)}
    assert set_id == set(), (set_id, r.stdout)


@pytest.mark.skipif(not ROOT, reason="a root-owned set-user-ID program in the grant needs root to plant")
async def test_a_set_uid_program_found_in_the_grant_runs_unprivileged_and_loses_its_bit(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> None:
    project = project_in_closed_dir(tmp_path)
    python = shutil.which("python3", path="/usr/bin:/bin")  # the system's: the sandbox has its libraries
    if python is None:
        pytest.skip("no python3 in /usr/bin")
    suid = project / "py-suid"
    shutil.copy(Path(python).resolve(), suid)
    suid.chmod(0o4755)
    async with granted(tmp_path, sandbox_mode, [project]) as box:
        r = await run(box, f"{suid} -c 'import os; print(os.geteuid() == os.getuid(), os.geteuid())'")
        assert r.stdout.startswith("True "), (r.stdout, r.stderr)  # nosuid and no_new_privs: not root's
        assert r.stdout.split()[1] != "0"
        w = await run(box, f"printf x >> {suid} && echo appended")
        assert w.stdout == "appended\n", (w.stdout, w.stderr)
    st = os.stat(suid)
    assert st.st_uid == 0 and not st.st_mode & stat.S_ISUID, oct(st.st_mode)  # the kernel took the bit away


@pytest.mark.skipif(not ROOT, reason="root's files beside and inside read grants")
async def test_the_owners_powers_end_at_the_write_grant(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> None:
    """Root's files outside the write grant stay root's: in a read grant (shown as it is, not idmapped), in the
    system, and in a directory the sandbox does not show."""
    project = project_in_closed_dir(tmp_path)
    docs = tmp_path / "closed" / "docs"  # a read grant under the same 0700 parent
    docs.mkdir(mode=0o755)
    (docs / "public.txt").write_text("public\n")
    (docs / "private.txt").write_text("private\n")
    (docs / "private.txt").chmod(0o600)
    async with granted(tmp_path, sandbox_mode, [project], read=[docs]) as box:
        got = await attempt(
            box,
            f"docs = {str(docs)!r}\n"
            "attempt('read public', lambda: open(docs + '/public.txt').read())\n"
            "attempt('read private', lambda: open(docs + '/private.txt').read())\n"
            "attempt('write public', lambda: open(docs + '/public.txt', 'a').write('x'))\n"
            "attempt('read shadow', lambda: open('/etc/shadow').read())\n"
            "attempt('write hostname', lambda: open('/etc/hostname', 'a').write('x'))\n",
        )
    assert got["read public"] == "OK", got
    assert got["read private"] == "PermissionError EACCES", got
    assert got["write public"].startswith(("OSError EROFS", "PermissionError")), got
    assert got["read shadow"] == "PermissionError EACCES", got
    assert got["write hostname"].startswith(("OSError EROFS", "PermissionError")), got
    assert (docs / "public.txt").read_text() == "public\n"


@pytest.mark.skipif(not ROOT, reason="mounting a filesystem that cannot be idmapped needs root")
async def test_a_write_grant_that_cannot_be_idmapped_fails_closed(tmp_path: Path) -> None:
    """ramfs keeps no idmappings: the grant is not shown as it is (read-only to the program, or worse), the run
    fails before the program starts, naming why, and nothing is written."""
    tree = tmp_path / "ramfs"
    tree.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "ramfs", str(tree)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a ramfs here")
    try:
        tree.chmod(0o755)
        async with granted(tmp_path, {}, [tree]) as box:
            r = await run(box, f"echo hi > {tree}/x; echo ran")
        assert (r.exit_code, r.stdout) == (126, ""), (r.exit_code, r.stdout, r.stderr)
        assert "cannot be idmapped" in r.stderr and "grant a directory on one" in r.stderr, r.stderr
        assert list(tree.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tree)], check=True)
