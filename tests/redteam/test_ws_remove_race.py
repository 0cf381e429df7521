"""`execspace ws rm|gc` against a workspace whose directories are swapped for symlinks while it is removed: the
removal costs the links, never what they point at (hundreds of rounds of a real race, no sleeps)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.errors import PathDenied
from execspace.workspace.stored import remove_stored, stored_workspaces

ROUNDS = 300

pytestmark = pytest.mark.asyncio


async def _template(root: Path) -> Path:
    async with execspace.open_engine("local", workspace_root=root) as engine:
        ws = await engine.manager.create_workspace("tpl")
        script = "mkdir -p a/b/c && for i in 1 2 3 4 5 6 7 8; do echo $i > a/b/c/f$i; echo $i > a/g$i; done"
        await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script]))
        assert ws.host_path is not None
        return ws.host_path


def _victim(tmp_path: Path, template: Path) -> Path:
    """What the swapped links point at: the user's files, made to look like a workspace too."""
    victim = tmp_path / "victim"
    shutil.copytree(template, victim, symlinks=True)
    (victim / "work" / "precious").write_text("keep me")
    return victim


def _swapper(target: Path, victim: Path, stop: threading.Event) -> None:
    """Swap ``target`` for a link to ``victim`` and back, as fast as it can, until told to stop."""
    aside = target.with_name(target.name + ".aside")
    while not stop.is_set():
        try:
            os.rename(target, aside)
            os.symlink(victim, target)
            os.unlink(target)
            os.rename(aside, target)
        except OSError:
            return  # the removal took the tree (or the link) away: the race is over for this round


@pytest.mark.parametrize("swapped", ["workspace", "subdirectory"])
async def test_swapping_a_directory_for_a_link_during_removal_never_reaches_the_target(
    tmp_path: Path, swapped: str
) -> None:
    template = await _template(tmp_path / "tpl")
    victim = _victim(tmp_path, template)
    before = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    root = tmp_path / "root"
    outcomes = {"removed": 0, "refused": 0}
    for n in range(ROUNDS):
        ws_dir = root / f"w{n}"
        shutil.copytree(template, ws_dir, symlinks=True)
        listed = next(w for w in stored_workspaces(root) if w.path == ws_dir)
        target = ws_dir if swapped == "workspace" else ws_dir / "work" / "a"
        stop = threading.Event()
        t = threading.Thread(
            target=_swapper, args=(target, victim / "work" if swapped == "subdirectory" else victim, stop)
        )
        t.start()
        try:
            remove_stored(listed)
            outcomes["removed"] += 1
        except PathDenied:
            outcomes["refused"] += 1  # changed since it was listed: refused, nothing removed through the link
        finally:
            stop.set()
            t.join()
        assert (victim / "work" / "precious").read_text() == "keep me"
        assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == before, f"round {n}"
        for leftover in (ws_dir, ws_dir.with_name(ws_dir.name + ".aside"), target.with_name(target.name + ".aside")):
            if leftover.is_symlink():
                leftover.unlink()
            elif leftover.exists():
                shutil.rmtree(leftover)
    # every round may end refused (a loaded machine can let the swapper win all 300, as it did once): that
    # the refusals are the race's, not a removal that refuses everything, is what the same removal without a
    # swapper shows
    control = root / "control"
    shutil.copytree(template, control, symlinks=True)
    remove_stored(next(w for w in stored_workspaces(root) if w.path == control))
    assert not control.exists(), outcomes
