"""Round 2 attacks on sandboxed Jupyter kernels, judged by what the host observes.

* The kernel's ``socket(AF_UNIX)`` lock must be in force before anything a program planted in the workspace
  runs: IPython startup/config files in the writable HOME, modules in ``work/`` shadowing the launcher's
  imports (F3).
* A kernel's death must not take the shared host process (and every other tenant's session) down; a
  reconnect must never reach anything but the kernel's own socket (F4).
* Rich outputs are capped per cell and per message; the host's memory stays bounded (F13).
* A read grant on ``/tmp`` replaces the sandbox's private ``/tmp``: kernels still start.

The engine runs in a child process where a crash or its memory must be observed (exit status, VmHWM).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

import execspace
from execspace import BaseEngine, RunProgramSpec, Workspace
from execspace.backends.jupyter import SandboxedKernels
from execspace.backends.sandbox import SandboxPolicy
from execspace.errors import SetupFailed
from tests.backends.jupyter_support import kernels_of, require_sandboxed_kernels
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(240)

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
async def _sandbox_works() -> None:
    await require_sandboxed_kernels()


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "ws", mode=SandboxedKernels(pool_size=0)
    ) as eng:
        yield eng


def _host_child(tmp_path: Path, body: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (the inside of ``async def main(root)``) in a child Python with an engine at ``root``."""
    make_traversable(tmp_path)
    head = "import asyncio, os, sys\nimport execspace\nfrom execspace.backends.jupyter import SandboxedKernels\n"
    script = head + "\nasync def main(root):\n" + textwrap.indent(body, "    ")
    script += "\n\nasyncio.run(main(sys.argv[1]))\n"
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "ws")],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


# -- F3: nothing planted runs before the lock ---------------------------------------------------------------

#: Records whether ``socket(AF_UNIX)`` worked where it ran; the launcher or IPython imported/ran it pre-lock
#: if it says "unlocked".
_PROBE = """
import socket
try:
    socket.socket(socket.AF_UNIX).close()
    state = "unlocked"
except PermissionError:
    state = "locked"
with open("/workspace/work/ran-{name}", "a") as f:
    f.write(state + "\\n")
"""

#: Appended to a planted module: hand over to the real one, so that the start-up goes on (and runs the rest).
_DELEGATE = """
import importlib.machinery, importlib.util, sys
_spec = importlib.machinery.PathFinder.find_spec(__name__, [p for p in sys.path if p not in ("", "/workspace/work")])
_real = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _real
_spec.loader.exec_module(_real)
"""

#: Modules the launcher, site, IPython or ipykernel import early, shadowed in the kernel's cwd (``work/``).
_SHADOWED = ("json", "base64", "ctypes", "time", "site", "sitecustomize", "usercustomize", "zmq", "traitlets")


async def test_planted_startup_files_and_modules_never_run_before_the_lock(engine: BaseEngine) -> None:
    ws = await engine.manager.create_workspace("red/f3")
    profile = "/workspace/home/.ipython/profile_default"
    user_site = "/workspace/home/.local/lib/python3.11/site-packages"
    planted = {
        f"{profile}/startup/00-escape.py": "startup",
        f"{profile}/ipython_config.py": "ipython_config",
        f"{profile}/ipython_kernel_config.py": "kernel_config",
        f"{user_site}/escape.pth": None,
        **{f"/workspace/work/{mod}.py": mod for mod in _SHADOWED},
    }
    # planted by a program of the workspace, as the sandbox's uid (the attacker's position)
    plant = "import os, sys\nfor path, src in PLANTED.items():\n"
    plant += "    os.makedirs(os.path.dirname(path), exist_ok=True)\n    open(path, 'w').write(src)\n"
    pth = "import os; os.system('touch /workspace/work/ran-pth')\n"
    sources = {
        p: _PROBE.format(name=n) + (_DELEGATE if "/work/" in p else "") if n else pth for p, n in planted.items()
    }
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", f"PLANTED = {sources!r}\n" + plant]))
    assert r.exit_code == 0, r.stderr
    (Path(str(ws.host_path)) / "work" / "helper_mod.py").write_text("X = 7\n")

    try:
        cell = await kernels_of(engine).execute(ws, "import helper_mod, json\nprint(helper_mod.X, json.dumps([1]))")
    except SetupFailed as exc:
        cell, why = None, str(exc)
    work = Path(str(ws.host_path)) / "work"
    ran = {p.name: p.read_text() for p in work.glob("ran-*")}
    # before: every planted file ran with unix sockets open ("unlocked")
    assert not any("unlocked" in state for state in ran.values()), ran
    assert ran == {}, f"planted code ran in the kernel's start-up: {ran}"
    assert cell is not None, why
    assert cell.exit_code == 0 and cell.text == "7 [1]\n", cell.text  # the workspace's modules import in cells


# -- F4: a kernel's death never takes the host down ---------------------------------------------------------

_DEATHS = """
async with execspace.open_engine("jupyter", workspace_root=root, mode=SandboxedKernels(pool_size=1)) as eng:
    ks = eng.kernels
    other = await eng.manager.create_workspace("tenant/other")
    assert (await ks.execute(other, "x = 41")).exit_code == 0
    died = 0
    for i in range(ROUNDS):
        ws = await eng.manager.create_workspace(f"tenant/t{i}")
        if i % 2:  # mid-output: messages still queued for us when it dies
            code = "import os\\nfor _ in range(300): print('x' * 4000, flush=True)\\nos._exit(4)"
        else:  # the new workspace's first cell
            code = "import os; os._exit(3)"
        r = await ks.execute(ws, code)
        died += r.kernel_died
        await eng.manager.cleanup(ws)
    r = await ks.execute(other, "x + 1")
    print("deaths", died, "other", r.text.strip(), flush=True)
"""


@pytest.mark.slow
async def test_dying_kernels_never_abort_the_host_process(tmp_path: Path) -> None:
    rounds = 36
    child = _host_child(tmp_path, _DEATHS.replace("ROUNDS", str(rounds)), timeout=220)
    # before: SIGABRT (-6) in libzmq ("Assertion failed: !_more (src/fq.cpp:80)") within a few deaths
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert f"deaths {rounds} other 42" in child.stdout, child.stdout + child.stderr[-2000:]


@pytest.mark.slow
async def test_a_swapped_socket_file_never_redirects_our_reconnect(engine: BaseEngine, tmp_path: Path) -> None:
    """The kernel replaces its socket files by links to a host socket and cuts our connections: whatever we
    reconnect to must be the kernel's own socket, never the host's."""
    host_sock = tmp_path / "host-daemon.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(host_sock))
        listener.listen(16)
        listener.setblocking(False)
        await _swap_and_cut(engine, str(host_sock))
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected to the host's socket through the swapped links


async def _swap_and_cut(engine: BaseEngine, host_sock: str) -> None:
    ws = await engine.manager.create_workspace("red/f4")
    kernels = kernels_of(engine)
    assert (await kernels.execute(ws, "x = 1")).exit_code == 0
    attack = f"""
import glob, os, socket
for k in glob.glob("/workspace/runs/*/k-[1-5]"):
    os.rename(k, k + ".old")
    os.symlink({host_sock!r}, k)
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if s.family == socket.AF_UNIX and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        s.shutdown(socket.SHUT_RDWR)
    s.detach()
"""
    cut = await kernels.execute(ws, attack, timeout=10)
    after = await kernels.execute(ws, "print('fresh')", timeout=30)
    assert after.exit_code == 0 and "fresh" in after.text, (cut.text, after.text)


# -- F13: rich outputs are capped, host memory stays bounded -----------------------------------------------

_FLOOD = """
def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

async with execspace.open_engine("jupyter", workspace_root=root, mode=SandboxedKernels(pool_size=0)) as eng:
    ks = eng.kernels
    ws = await eng.manager.create_workspace("red/f13")
    warm = await ks.execute(ws, "from IPython.display import display, Image\\nprint('warm')")
    assert warm.exit_code == 0, warm.text
    before = hwm()
    code = (
        "import base64\\n"
        "blob = base64.b64encode(bytes(15 * 2**20)).decode()\\n"
        "for _ in range(30): display({'image/png': blob, 'text/plain': 'img'}, raw=True)\\n"
        "for _ in range(20): print('y' * (8 * 2**20))\\n"
    )
    r = await ks.execute(ws, code, timeout=120)
    grown = hwm() - before
    out = sum(p.stat().st_size for p in (ws.host_path / "out").iterdir())
    print("RESULT", r.exit_code, len(r.files), out, grown, repr(r.text[-600:]), flush=True)
    big = "display({'text/html': 'h' * (40 * 2**20)}, raw=True)"
    kept = await ks.execute(ws, big + "\\nprint('alive')", timeout=60)
    print("KEPT", kept.kernel_died, repr(kept.text[-400:]), flush=True)
    # a hostile kernel undoes its own launcher's guard: our socket refuses the frame, which ends the kernel
    raw = await ks.execute(ws, "get_ipython().kernel.session.__dict__.pop('serialize')\\n" + big, timeout=60)
    print("RAW", raw.kernel_died, repr(raw.text[-400:]), flush=True)
    again = await ks.execute(ws, "print(6 * 7)")
    print("AGAIN", again.text.strip().replace("\\n", " "), flush=True)
"""


@pytest.mark.slow
async def test_rich_output_flood_is_capped_and_host_memory_bounded(tmp_path: Path) -> None:
    child = _host_child(tmp_path, _FLOOD, timeout=220)
    assert child.returncode == 0, child.stderr[-3000:]
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in child.stdout.splitlines() if " " in ln}
    code, files, out_bytes, grown, text = lines["RESULT"].split(" ", 4)
    cap = 64 * MiB  # RichOutputLimits().bytes_per_cell
    assert code == "0", text
    # 30 images of 15 MiB: 450 MiB asked, 64 MiB allowed
    assert int(out_bytes) <= cap and int(files) == cap // (15 * MiB), text
    assert "more rich outputs of this cell were not saved" in text
    # before: the host grew by about 1.1 GiB; each message is now held once, files go to disk as they come
    assert int(grown) < 300 * MiB, f"host grew by {int(grown) // MiB} MiB"
    died, kept_text = lines["KEPT"].split(" ", 1)
    assert died == "False" and "was not sent: over max_message_bytes" in kept_text and "alive" in kept_text
    died, raw_text = lines["RAW"].split(" ", 1)
    assert died == "True" and "max_message_bytes" in raw_text, raw_text
    assert lines["AGAIN"].endswith("42")  # a fresh kernel answers


# -- a /tmp read grant ---------------------------------------------------------------------------------------


async def test_kernels_start_with_a_read_grant_on_tmp(tmp_path: Path) -> None:
    make_traversable(tmp_path)
    policy = SandboxPolicy().with_read_paths("/tmp")
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "ws", mode=SandboxedKernels(pool_size=0, policy=policy)
    ) as eng:
        ws: Workspace = await eng.manager.create_workspace("red/tmp")
        cell = await kernels_of(eng).execute(ws, "import os\nprint(os.access('/tmp', os.W_OK))")
    # before: "the sandboxed kernel did not start" (its connection file went to the read-only /tmp)
    assert cell.exit_code == 0 and cell.text == "False\n", cell.text
