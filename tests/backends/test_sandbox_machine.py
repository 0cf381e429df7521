"""Machine mode (``machine=True``): programs run as ``user`` with ``sudo`` to the sandbox's own root, over a system
they can write whose changes are the workspace's (per run and in session mode); the host, the environment store
and other workspaces never see them."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import execspace
from execspace import PutFile, RunProgramSpec
from execspace.backends.sandbox.bwrap import machine_uid, sandbox_uid
from execspace.engine import BaseEngine
from execspace.environments import Environment, build, builtin_spec
from execspace.errors import CapabilityError
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.asyncio

NOT_ROOT = "machine mode maps two host uids into each sandbox's user namespace: root only here"


def wheel(name: str) -> bytes:
    """A pure-Python wheel of the package ``name`` (``name.X`` says it was installed)."""
    buf = io.BytesIO()
    info = f"{name}-0.1.dist-info"
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{name}/__init__.py", "X = 'installed at run time'\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return buf.getvalue()


def tree_digest(top: Path) -> str:
    """Every path, mode, owner, size and mtime under ``top``: any change to the tree changes it."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            st = os.lstat(os.path.join(dirpath, name))
            h.update(f"{dirpath}/{name}:{st.st_mode}:{st.st_uid}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


async def _require_sandbox() -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"no sandbox here: {probe.reason}")


async def _require_machine() -> None:
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)
    await _require_sandbox()


@pytest.fixture(scope="module")
def base_environment() -> Environment:
    import asyncio

    spec = builtin_spec("base")
    assert spec is not None
    return asyncio.run(build(spec))


@pytest_asyncio.fixture(params=["per-run", "session"])
async def machine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseEngine]:
    await _require_machine()
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "sandbox", machine=True, mode=request.param, workspace_root=tmp_path / "ws"
    ) as eng:
        yield eng


async def sh(eng: BaseEngine, ws: execspace.Workspace, script: str) -> tuple[int, str, str]:
    r = await eng.runner.run_program(ws, RunProgramSpec("/bin/bash", ["-c", script], timeout=120))
    return r.exit_code, r.stdout, r.stderr


async def test_the_program_is_user_with_a_home_and_sudo_makes_it_root(machine: BaseEngine) -> None:
    ws = await machine.manager.create_workspace("who")
    script = (
        "whoami; id -u; id -gn; echo $HOME $USER; python3 -c 'import os,pwd; print(pwd.getpwuid(os.getuid()).pw_dir)';"
        "echo hi > ~/a.txt; sudo -n whoami; sudo -u root id -u; sudo -E -H -n -- sh -c 'id -un'"
    )
    code, out, err = await sh(machine, ws, script)
    assert code == 0, err
    assert out.split() == ["user", "1000", "user", "/home/user", "user", "/home/user", "root", "0", "root"]
    # ~ is the workspace's work/, the file API's /home/user
    assert (await machine.fs.read_file(ws, "/home/user/a.txt")).content == b"hi\n"
    assert ws.host_path is not None
    assert (ws.host_path / "work" / "a.txt").stat().st_uid == sandbox_uid(ws.host_path)


async def test_a_run_names_its_user_and_root_runs_as_root_without_sudo(machine: BaseEngine) -> None:
    """``RunProgramSpec.user``: ``root`` runs as the sandbox's root (its home /root), ``user`` as user; another name
    is refused before anything runs, as it is by a sandbox without machine mode."""
    ws = await machine.manager.create_workspace("users")
    script = "id -un; echo $HOME $USER; echo x > /etc/by-root && cat /etc/by-root"
    as_root = await machine.runner.run_program(ws, RunProgramSpec("/bin/sh", ["-c", script], user="root"))
    assert (as_root.exit_code, as_root.stdout) == (0, "root\n/root root\nx\n"), as_root.stderr
    as_user = await machine.runner.run_program(ws, RunProgramSpec("/bin/sh", ["-c", "id -un; echo $HOME"], user="user"))
    assert (as_user.exit_code, as_user.stdout) == (0, "user\n/home/user\n"), as_user.stderr
    assert machine.describe().users == ("user", "root")
    with pytest.raises(CapabilityError, match="running as 'nobody'"):
        await machine.runner.run_program(ws, RunProgramSpec("/bin/true", user="nobody"))


async def test_without_machine_mode_a_run_cannot_name_a_user(tmp_path: Path) -> None:
    await _require_sandbox()
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as eng:
        ws = await eng.manager.create_workspace("plain")
        with pytest.raises(CapabilityError, match="running as 'root'"):
            await eng.runner.run_program(ws, RunProgramSpec("/bin/true", user="root"))
        assert not (ws.host_path / "runs").exists() or not any((ws.host_path / "runs").iterdir())


async def test_root_writes_etc_usr_opt_and_the_next_run_sees_it_not_the_host(machine: BaseEngine) -> None:
    ws = await machine.manager.create_workspace("writes")
    marker = "execspace-machine-test-marker"
    assert not Path(f"/etc/{marker}").exists()
    hosts = Path("/etc/hosts").read_bytes()
    script = (
        f"sudo sh -c 'echo etc > /etc/{marker} && mkdir -p /usr/local/share/{marker} /opt/{marker} && "
        f"echo usr > /usr/local/share/{marker}/f && echo opt > /opt/{marker}/f && "
        "sed -i 1s/$/-machine/ /etc/hosts'"
    )
    code, _, err = await sh(machine, ws, script)
    assert code == 0, err
    code, out, err = await sh(
        machine, ws, f"cat /etc/{marker} /usr/local/share/{marker}/f /opt/{marker}/f; head -1 /etc/hosts"
    )
    assert code == 0, err
    assert out.splitlines()[:3] == ["etc", "usr", "opt"] and out.splitlines()[3].endswith("-machine")
    # the user cannot write what is root's, and the host saw nothing
    code, _, err = await sh(machine, ws, f"echo x > /etc/{marker}")
    assert code != 0 and "Permission denied" in err
    for path in (f"/etc/{marker}", f"/usr/local/share/{marker}", f"/opt/{marker}"):
        assert not Path(path).exists()
    assert Path("/etc/hosts").read_bytes() == hosts
    # another workspace of the engine has a system of its own
    other = await machine.manager.create_workspace("other")
    code, _, _ = await sh(machine, other, f"test -e /etc/{marker} || test -e /opt/{marker}")
    assert code == 1


async def test_root_inside_reads_no_more_of_the_host_than_others_may(machine: BaseEngine) -> None:
    secrets = [p for p in ("/etc/shadow", "/etc/gshadow") if os.path.exists(p) and not os.stat(p).st_mode & 0o004]
    if not secrets:
        pytest.skip("this host has no root-only /etc/shadow to try")
    ws = await machine.manager.create_workspace("secrets")
    for path in secrets:
        code, out, err = await sh(machine, ws, f"sudo cat {path}; sudo cp {path} /tmp/x; sudo chmod 644 {path}")
        assert code != 0 and out == "" and "Permission denied" in err, (out, err)
        assert not os.stat(path).st_mode & 0o004


async def test_sudo_pip_installs_for_the_next_run_and_only_this_workspace(
    tmp_path: Path, base_environment: Environment
) -> None:
    await _require_machine()
    make_traversable(tmp_path)
    store_before = tree_digest(base_environment.path)
    site_before = tree_digest(Path("/usr/local/lib"))
    async with execspace.open_engine(
        "sandbox", machine=True, workspace_root=tmp_path / "ws", environment="base"
    ) as eng:
        ws = await eng.manager.create_workspace("pip")
        await eng.fs.put_files(
            ws,
            [
                PutFile("work/machpkg-0.1-py3-none-any.whl", wheel("machpkg")),
                PutFile("work/syspkg-0.1-py3-none-any.whl", wheel("syspkg")),
            ],
        )
        install = (
            'sudo /usr/bin/python3 -m pip --python "$(command -v python)" install -q --no-index --no-cache-dir '
            "machpkg-0.1-py3-none-any.whl && sudo /usr/bin/python3 -m pip install -q --no-index --no-cache-dir "
            "--break-system-packages syspkg-0.1-py3-none-any.whl"
        )
        code, out, err = await sh(eng, ws, install)
        assert code == 0, (out, err)
        imports = "python -c 'import machpkg; print(machpkg.X)'; /usr/bin/python3 -c 'import syspkg; print(syspkg.X)'"
        code, out, err = await sh(eng, ws, imports)
        assert (code, out) == (0, "installed at run time\n" * 2), err
        other = await eng.manager.create_workspace("pip-other")
        code, _, err = await sh(eng, other, "python -c 'import machpkg' || /usr/bin/python3 -c 'import syspkg'")
        assert code != 0 and "No module named" in err
        await eng.manager.cleanup(ws)
        again = await eng.manager.create_workspace("pip")
        code, _, err = await sh(eng, again, "python -c 'import machpkg' || /usr/bin/python3 -c 'import syspkg'")
        assert code != 0 and "No module named" in err
    assert tree_digest(base_environment.path) == store_before
    assert tree_digest(Path("/usr/local/lib")) == site_before


async def test_the_system_python_installs_without_pep_668s_refusal(machine: BaseEngine) -> None:
    """The host's python refuses ``pip install`` outside a venv (PEP 668's marker); a machine's system is its own,
    so pip installs there as in E2B's templates (``python`` and ``pip`` by those names): as user into its home, with
    sudo into the system, and the host's marker and site-packages stay as they were."""
    markers = sorted(Path("/usr/lib").glob("python3*/EXTERNALLY-MANAGED"))
    if not markers:
        pytest.skip("this host's python has no PEP 668 marker")
    before = tree_digest(Path("/usr/local/lib")), [m.read_bytes() for m in markers]
    ws = await machine.manager.create_workspace("pep668")
    await machine.fs.put_files(
        ws,
        [
            PutFile("work/mine-0.1-py3-none-any.whl", wheel("mine")),
            PutFile("work/ours-0.1-py3-none-any.whl", wheel("ours")),
        ],
    )
    pip = "pip install -q --no-index --no-cache-dir"
    code, out, err = await sh(machine, ws, f"{pip} mine-0.1-py3-none-any.whl && sudo {pip} ours-0.1-py3-none-any.whl")
    assert code == 0, (out, err)
    imports = "cd / && python -c 'import mine, ours; print(mine.__file__); print(ours.__file__)'"  # E2B's name
    code, out, err = await sh(machine, ws, imports)
    assert code == 0, err
    py = markers[0].parent.name
    mine, ours = f"/home/user/.local/lib/{py}/site-packages", f"/usr/local/lib/{py}/dist-packages"
    assert out.split() == [f"{mine}/mine/__init__.py", f"{ours}/ours/__init__.py"]
    assert (tree_digest(Path("/usr/local/lib")), [m.read_bytes() for m in markers]) == before


async def test_the_upper_layers_live_in_the_workspace_out_of_the_programs_and_file_apis_reach(
    machine: BaseEngine,
) -> None:
    ws = await machine.manager.create_workspace("layers")
    code, _, err = await sh(machine, ws, "sudo sh -c 'echo x > /etc/in-upper'")
    assert code == 0, err
    assert ws.host_path is not None
    upper = ws.host_path / ".execspace" / "machine" / "host-etc" / "upper"
    assert (upper / "in-upper").read_text() == "x\n"
    assert not (upper / "passwd").exists()  # the shared seed's, below the upper layer: every sandbox's alike
    seeds = ws.host_path.parent / ".machine-seeds"
    (etc,) = seeds.glob("host-etc-*")
    assert (etc / "passwd").read_text().endswith("user:x:1000:1000:user:/home/user:/bin/bash\n")
    assert (os.stat(seeds).st_uid, os.stat(seeds).st_mode & 0o777) == (0, 0o700)
    seeded = (etc / "passwd").read_bytes()
    code, _, err = await sh(machine, ws, "sudo sh -c 'echo extra:x:2000:2000::/:/bin/sh >> /etc/passwd'")
    assert code == 0, err
    other = await machine.manager.create_workspace("layers-other")
    code, out, err = await sh(machine, other, "grep -c ^extra: /etc/passwd; grep ^user: /etc/passwd")
    assert (code, out) == (0, "0\nuser:x:1000:1000:user:/home/user:/bin/bash\n"), err
    assert (etc / "passwd").read_bytes() == seeded and b"extra:" in (upper / "passwd").read_bytes()
    st = os.stat(ws.host_path / ".execspace" / "machine")
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    code, out, err = await sh(
        machine, ws, "ls /workspace/.execspace/machine; sudo ls /workspace/.execspace/machine; echo done"
    )
    assert out.strip() == "done" and err.count("Permission denied") == 2, (out, err)
    with pytest.raises(execspace.errors.PathDenied):
        await machine.fs.read_file(ws, ".execspace/machine/host-etc/upper/in-upper")


async def test_machine_mode_fails_closed_without_root(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("as root machine mode is available")
    with pytest.raises(CapabilityError, match="root"):
        async with execspace.open_engine("sandbox", machine=True, workspace_root=tmp_path / "ws"):
            pass


async def test_forks_and_snapshots_carry_the_system_with_its_deletions(machine: BaseEngine) -> None:
    if not Path("/etc/debian_version").exists() or not Path("/etc/apt").is_dir():
        pytest.skip("needs a Debian /etc (debian_version, apt/) to delete from")
    ws = await machine.manager.create_workspace("forked")
    script = (
        "sudo sh -c 'echo kept > /etc/fork-marker && rm /etc/debian_version && rm -rf /etc/apt && mkdir /etc/apt "
        "&& echo only > /etc/apt/only'"
    )
    code, _, err = await sh(machine, ws, script)
    assert code == 0, err
    check = (
        "cat /etc/fork-marker; test -e /etc/debian_version && echo VERSION; ls /etc/apt; stat -c %U /etc/fork-marker"
    )
    want = "kept\nonly\nroot\n"
    (fork,) = await machine.manager.fork(ws)
    code, out, err = await sh(machine, fork, check)
    assert (code, out) == (0, want), err
    # the fork's layers are its own copy, root's inside it; its changes stay there
    assert fork.host_path is not None
    upper = fork.host_path / ".execspace" / "machine" / "host-etc" / "upper"
    assert (upper / "fork-marker").stat().st_uid == machine_uid(sandbox_uid(fork.host_path))
    code, _, err = await sh(machine, fork, "sudo rm /etc/fork-marker")
    assert code == 0, err
    code, out, _ = await sh(machine, ws, "cat /etc/fork-marker")
    assert out == "kept\n"
    snapshot = await machine.manager.snapshot(ws)
    code, _, err = await sh(machine, ws, "sudo sh -c 'echo changed > /etc/fork-marker'")
    await machine.manager.restore(ws, snapshot)
    code, out, err = await sh(machine, ws, check)
    assert (code, out) == (0, want), err


async def test_programs_are_found_where_they_run(machine: BaseEngine) -> None:
    ws = await machine.manager.create_workspace("found")
    code, _, err = await sh(
        machine,
        ws,
        "sudo sh -c 'printf \"#!/bin/sh\\necho upper-only\\n\" > /usr/local/bin/mine && chmod 755 /usr/local/bin/mine'",
    )
    assert code == 0, err
    r = await machine.runner.run_program(ws, RunProgramSpec("mine"))
    assert (r.exit_code, r.stdout) == (0, "upper-only\n"), r.stderr
    r = await machine.runner.run_program(ws, RunProgramSpec("no-such-program-anywhere"))
    assert r.exit_code == 127
