"""The CPU time of a process tree read from ``/proc`` (:func:`tree_cpu_seconds`, what tells an idle sandbox from a busy
one where no cgroup counts it): it stands still while the tree waits, grows while any process of it computes, and
keeps what a child used after that child ended and was reaped."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from execspace.process.proctree import children, tree_cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

#: A parent that waits on a FIFO, then forks a child that computes for a second of its own CPU time and is reaped;
#: then it waits on the FIFO again.
_TREE = """
import os, sys, time
gate = sys.argv[1]
print("ready", flush=True)
open(gate).read()
if os.fork() == 0:
    while time.process_time() < 1: pass
    os._exit(0)
os.wait()
print("reaped", flush=True)
open(gate).read()
"""


def test_a_trees_cpu_time_stands_still_while_it_waits_and_keeps_a_reaped_childs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    subprocess.run(["mkfifo", str(gate)], check=True)
    tree = subprocess.Popen([sys.executable, "-c", _TREE, str(gate)], stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout is not None and tree.stdout.readline() == "ready\n"
        waiting = tree_cpu_seconds([tree.pid])
        assert tree_cpu_seconds([tree.pid]) - waiting < 0.05  # blocked on the FIFO: nothing used since
        gate.write_text("go\n")
        assert tree.stdout.readline() == "reaped\n"
        assert children(tree.pid) == []  # the child is gone: only its parent remembers it
        assert tree_cpu_seconds([tree.pid]) - waiting > 0.9
        gate.write_text("done\n")
    finally:
        tree.kill()
        tree.communicate()
    assert tree_cpu_seconds([tree.pid]) == 0  # gone: nothing to count
    assert children(tree.pid) == []


def test_children_are_every_threads_children() -> None:
    code = "import subprocess, threading, time\n"
    code += "t = threading.Thread(target=lambda: subprocess.run(['sleep', '30']))\nt.start()\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while not any(_cmdline(c).startswith(b"sleep") for c in children(parent.pid)):
            assert time.monotonic() < deadline, "the thread's child never showed"
            time.sleep(0.02)
    finally:
        parent.kill()
        parent.wait()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
