"""Security round 3, points 7 and 10: what a sandbox can write outside its workspace and grants is bounded, and the
runtime environment store is out of every sandbox's reach but for the environment it runs in, read-only.

7. The sandbox's ``/`` and ``/dev`` were writable tmpfs of no size: as root a program wrote past a session's disk
   bound there, and without root past its memory limit (``RLIMIT_AS`` does not count tmpfs pages). Each attack fills
   ``/``, ``/dev``, ``/dev/shm`` and ``/tmp`` (stopping at the first error, or at three times the bound) and the host
   reads each filesystem of the running sandbox through ``/proc/<pid>/root``: ``/`` and ``/dev`` read-only,
   ``/dev/shm`` no larger than its share of the bound, and ``/tmp`` the workspace's own ``tmp/`` (on its disk, under
   its disk bound: a session's ``disk_bytes`` stops the fill), never a tmpfs of its own.
10. A normal user's store is in their HOME: with a write grant over it, a program of one workspace planted a ``.pth``
   that the next run in that environment, in another workspace, executed. The attack plants through such a grant (as
   root the store is made writable by every uid, so only the mask stands in the way) and the host checks that
   another workspace's run never executes it and that no file of the store changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import PolicyViolation, ResourceLimits, RunProgramSpec
from execspace.backends.sandbox import SandboxPolicy, SessionConfig
from execspace.backends.sandbox.bwrap import tmpfs_sizes
from execspace.environments import Environment, EnvironmentSpec, EnvironmentStore
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(180)

#: The memory limit of the fill attacks: its tmpfs together hold at most this much.
MEMORY = 48 << 20
#: How far past the bound an attack writes before it stops by itself.
OVERSHOOT = 3


@pytest.fixture(autouse=True)
async def _sandbox_works() -> None:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")


# -- 7: bounded tmpfs

#: Fills each directory up to ``LIMIT`` bytes, reports ``dir|bytes written|error``, empties it again (under a cgroup
#: the tmpfs pages count against the memory limit: two full ones would bring its OOM killer), then waits, polling,
#: for the host to have read the sandbox's filesystems.
_FILL = """
for d in / /dev /dev/shm /tmp; do
  head -c LIMIT /dev/zero 2> "$HOME/err" > "$d/fill"; code=$?
  echo "$d|$(wc -c < "$d/fill" 2>/dev/null || echo 0)|$code|$(cat "$HOME/err")"
  rm -f "$d/fill"
done
echo TOKEN > "$OUTPUT_DIR/held"
while [ ! -e "$HOME/done" ]; do sleep 0.02; done
"""


def _sandbox_pid(token: str) -> int:
    """The host pid of the attack's shell (inside the sandbox: its root is the sandbox's), found by its token;
    bwrap's own command line names the token too, but its root is the host's."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"sh") and any(token.encode() in arg for arg in argv):
            return int(entry)
    raise AssertionError(f"no sandboxed shell with {token} is running")


def _fs(pid: int, path: str) -> tuple[bool, int]:
    """Whether the sandbox's ``path`` is read-only, and its size, as the host's kernel has it."""
    st = os.statvfs(f"/proc/{pid}/root{path}")
    return bool(st.f_flag & os.ST_RDONLY), st.f_blocks * st.f_frsize


async def _fill_and_observe(
    engine: execspace.Engine, ws: execspace.Workspace, bound: int, limits: ResourceLimits
) -> tuple[dict[str, tuple[int, int, str]], dict[str, tuple[bool, int]]]:
    """The attack's report per directory (bytes, exit code, error) and the host's view of each filesystem (and of
    the workspace's ``tmp/``, as ``"ws tmp"``)."""
    assert ws.host_path is not None
    token = f"held-{secrets.token_hex(6)}"
    script = _FILL.replace("LIMIT", str(OVERSHOOT * bound)).replace("TOKEN", token)
    spec = RunProgramSpec("sh", ["-c", script], limits=limits, timeout=120)
    run = asyncio.ensure_future(engine.runner.run_program(ws, spec))
    held = ws.host_path / "out" / "held"
    try:
        while not held.exists():
            if run.done():
                raise AssertionError(f"the attack ended before the host looked at it: {run.result()}")
            await asyncio.sleep(0.02)
        pid = _sandbox_pid(token)
        seen = {d: _fs(pid, d) for d in ("/", "/dev", "/dev/shm", "/tmp")}
        tmp = os.statvfs(ws.host_path / "tmp")
        seen["ws tmp"] = (bool(tmp.f_flag & os.ST_RDONLY), tmp.f_blocks * tmp.f_frsize)
    finally:
        (ws.host_path / "home" / "done").touch()
        result = await run
    assert result.exit_code == 0, (result.stdout, result.stderr)
    report = {}
    for line in result.stdout.splitlines():
        d, written, code, error = line.split("|", 3)
        report[d] = (int(written), int(code), error)
    return report, seen


def _assert_bounded(
    report: dict[str, tuple[int, int, str]], seen: dict[str, tuple[bool, int]], bound: int, *, disk: bool = False
) -> None:
    """``/`` and ``/dev`` read-only, ``/dev/shm`` a tmpfs within the bound, ``/tmp`` the workspace's filesystem (with
    ``disk``: one of the bound's size, which the fill cannot pass)."""
    _, shm_size = tmpfs_sizes(bound)
    for d in ("/", "/dev"):
        assert seen[d][0], f"{d} is writable in the sandbox"
        written, code, error = report[d]
        assert (written, code) == (0, 2) and "Read-only file system" in error, report[d]
    assert seen["/dev/shm"] == (False, shm_size) and shm_size <= bound, seen
    written, code, error = report["/dev/shm"]
    assert code != 0 and "No space left on device" in error, report["/dev/shm"]
    assert written <= shm_size, (written, shm_size)
    assert seen["/tmp"] == seen["ws tmp"], seen  # the workspace's tmp/, not a tmpfs of the sandbox's
    written, code, error = report["/tmp"]
    if disk:  # the error itself is lost: the fill's stderr file is on the same full disk
        assert code != 0 and written <= bound, report["/tmp"]


@pytest.fixture
async def filled(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> AsyncIterator[tuple[Any, ResourceLimits]]:
    """An engine and the limits of a run bounded by ``MEMORY``: the run's own in per-run mode; in session mode the
    session's (the run sets none, so it runs in the session whose tmpfs it fills)."""
    make_traversable(tmp_path)
    options = dict(sandbox_mode)
    limits = ResourceLimits(memory_bytes=MEMORY)
    session = options.get("session")
    if isinstance(session, SessionConfig):
        options["session"] = dataclasses.replace(session, memory_bytes=MEMORY)
        limits = ResourceLimits()
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **options) as engine:
        yield engine, limits


async def test_root_and_dev_are_read_only_and_tmpfs_hold_at_most_the_memory_limit(
    filled: tuple[Any, ResourceLimits],
) -> None:
    engine, limits = filled
    ws = await engine.manager.create_workspace("fill")
    report, seen = await _fill_and_observe(engine, ws, MEMORY, limits)
    _assert_bounded(report, seen, MEMORY)
    # the sizes are what the engine says it enforces
    assert "/dev/shm" in engine.describe().details["tmpfs"]


async def test_a_session_disk_bound_bounds_its_tmp_and_tmpfs_too(tmp_path: Path) -> None:
    """As root a session's workspace is a filesystem of ``disk_bytes``: its ``/tmp`` (the workspace's) is on it, its
    tmpfs stay within the same bound."""
    if os.geteuid() != 0:
        pytest.skip("a session's disk bound needs root")
    make_traversable(tmp_path)
    bound = 16 << 20
    config = SessionConfig(pool_size=0, disk_bytes=bound)
    try:
        engine = execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", mode="session", session=config)
        async with engine as eng:
            ws = await eng.manager.create_workspace("disk")
            try:
                report, seen = await _fill_and_observe(eng, ws, bound, ResourceLimits())
            finally:
                await eng.manager.cleanup(ws)  # its disk unmounted: no loop mount outlives the test
    except execspace.CapabilityError as exc:
        pytest.skip(f"no disk bound here: {exc}")
    _assert_bounded(report, seen, bound, disk=True)


# -- 10: the environment store under a grant

_PTH = "import os; os.write(1, b'PWNED\\n')\n"
#: From workspace A: plant a .pth in the tree, a new tree beside it, and list the store; each outcome printed.
_PLANT = """
import errno, os, sys
store, tree = sys.argv[1], sys.argv[2]
site = next(os.path.join(tree, "lib", d, "site-packages") for d in ["PYVER"])
def attempt(label, fn):
    try:
        fn(); print(label, "OK")
    except OSError as exc:
        print(label, errno.errorcode[exc.errno])
def plant(path):
    with open(path, "w") as f:
        f.write(PTH)
attempt("pth", lambda: plant(os.path.join(site, "zz-planted.pth")))
attempt("tree", lambda: os.makedirs(os.path.join(store, "fake-0123456789abcdef", "lib")))
attempt("list", lambda: print(sorted(os.listdir(store))))
"""


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of the caller's own (a normal user's is under ~/.cache) in a directory a grant can cover."""
    base = tmp_path_factory.mktemp("round3-store")
    make_traversable(base)
    return base / "cache" / "execspace" / "environments"


@pytest.fixture(scope="module")
def environment(store_root: Path) -> Environment:
    env = asyncio.run(EnvironmentStore(store_root).build(EnvironmentSpec(name="planted-target")))
    # every directory writable by every uid: as root only the mask, not the modes, keeps the sandbox's uid out
    for top, dirs, _files in os.walk(store_root):
        for name in [".", *dirs]:
            os.chmod(os.path.join(top, name), 0o777)
    return env


def _store_digest(root: Path) -> dict[str, str]:
    """Every entry of the store (a name, a link or a file's content), the build's lock files aside."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                found[rel] = "link:" + os.readlink(path)
            elif os.path.isfile(path) and not name.startswith(".lock-"):
                found[rel] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                found[rel] = "dir" if os.path.isdir(path) else "file"
    return found


def _open(root: Path, mode: Mapping[str, Any], **options: Any) -> Any:
    return execspace.open_engine("sandbox", workspace_root=root, **mode, **options)


async def _plant(engine: Any, ws: execspace.Workspace, env: Environment, python: str) -> dict[str, str]:
    pyver = next((env.path / "lib").iterdir()).name
    script = _PLANT.replace("PYVER", pyver).replace("PTH", repr(_PTH))
    argv = ["-c", script, str(env.path.parent), str(env.path)]
    result = await engine.runner.run_program(ws, RunProgramSpec(python, argv))
    assert result.exit_code == 0, result.stderr
    words = [line.split(" ", 1) for line in result.stdout.splitlines()]
    return {w[0]: w[1] for w in words if w[0] in ("pth", "tree", "list") and len(w) == 2}


async def test_a_grant_over_the_store_cannot_plant_code_another_workspace_runs(
    tmp_path: Path, store_root: Path, environment: Environment, sandbox_mode: Mapping[str, Any], monkeypatch: Any
) -> None:
    monkeypatch.setenv("EXECSPACE_ENVIRONMENTS", str(store_root))
    make_traversable(tmp_path)
    before = _store_digest(store_root)
    grant = SandboxPolicy().with_write_paths(str(store_root.parents[1]))  # the store's ~/.cache
    # workspace A: outside any environment, then in the very environment it attacks
    async with _open(tmp_path / "a", sandbox_mode, policy=grant) as a:
        outside = await _plant(a, await a.manager.create_workspace("a"), environment, "python3")
    async with _open(tmp_path / "a2", sandbox_mode, policy=grant, environment=environment.name) as a2:
        inside = await _plant(a2, await a2.manager.create_workspace("a2"), environment, "python")
    # the store is an empty mode-000 mask: nothing to plant into, no tree to add, nothing listed
    assert outside == {"pth": "EACCES", "tree": "EACCES", "list": "EACCES"}, outside
    # the environment in use is there read-only, the rest of the store cannot even be listed
    assert inside == {"pth": "EROFS", "tree": "EROFS", "list": "EACCES"}, inside
    # workspace B runs in the environment: nothing planted runs, nothing of the store changed
    async with _open(tmp_path / "b", sandbox_mode, environment=environment.name) as b:
        ws = await b.manager.create_workspace("b")
        result = await b.runner.run_program(ws, RunProgramSpec("python", ["-c", "import sys; print(sys.prefix)"]))
    assert result.exit_code == 0 and result.stdout.strip() == str(environment.path), result
    assert "PWNED" not in result.stdout + result.stderr
    assert _store_digest(store_root) == before


@pytest.mark.parametrize(
    ("grant", "says"),
    [
        ("write_tree", "shown read-only"),
        ("read_inside_tree", "lies inside"),
        ("write_inside_store", "lies inside"),
    ],
)
async def test_grants_inside_the_store_are_refused(
    tmp_path: Path,
    store_root: Path,
    environment: Environment,
    sandbox_mode: Mapping[str, Any],
    monkeypatch: Any,
    grant: str,
    says: str,
) -> None:
    monkeypatch.setenv("EXECSPACE_ENVIRONMENTS", str(store_root))
    make_traversable(tmp_path)
    tree = str(environment.path)
    policy = {
        "write_tree": SandboxPolicy().with_write_paths(tree),
        "read_inside_tree": SandboxPolicy().with_read_paths(f"{tree}/lib"),
        "write_inside_store": SandboxPolicy().with_write_paths(str(store_root / "fake-0123456789abcdef")),
    }[grant]
    before = _store_digest(store_root)
    async with _open(tmp_path / "ws", sandbox_mode, policy=policy) as engine:
        ws = await engine.manager.create_workspace("g")
        with pytest.raises(PolicyViolation, match=says):
            await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", f"echo x > {tree}/planted"]))
    assert _store_digest(store_root) == before
