"""The file agent's shipped text, as both of its backends run it: a long-lived ``python3`` reading JSON lines (the
e2b backend) and a kernel cell that publishes its answer (the jupyter backend's server-side workspaces)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from execspace.workspace.fileagent import MIME, agent_text


def _requests(ws: Path) -> list[dict[str, Any]]:
    data = base64.b64encode(b"hello").decode()
    piece = {"path": "work/a.txt", "b64": data, "mode": 0o640, "tmp": None, "final": True}
    return [
        {"op": "layout", "args": {"ws": str(ws), "dirs": ["work", "out"]}},
        {"op": "write", "args": {"ws": str(ws), "items": [piece]}},
        {"op": "read", "args": {"ws": str(ws), "path": "work/a.txt", "offset": 1, "n": 3}},
        {"op": "readable", "args": {"ws": str(ws), "paths": ["work/a.txt"]}},
        {"op": "make_dir", "args": {"ws": str(ws), "path": "work/d"}},
        {"op": "rename", "args": {"ws": str(ws), "src": "work/a.txt", "dst": "work/d/b.txt"}},
        {"op": "walk", "args": {"ws": str(ws), "starts": [["work"]]}},
        {"op": "stat", "args": {"ws": str(ws), "path": "work/escape"}},
        {"op": "stat", "args": {"ws": str(ws), "path": "work/escape/passwd"}},
        {"op": "read", "args": {"ws": str(ws), "path": "work/d/missing", "offset": 0, "n": 1}},
        {"op": "remove_path", "args": {"ws": str(ws), "path": "work/d"}},
        {"op": "stat", "args": {"ws": str(ws) + "-gone", "path": "work"}},
    ]


def _as_process(text: Path, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = subprocess.run([sys.executable, str(text), "5"], input=lines, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _as_cell(text: str, request: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The cell the jupyter backend sends, run here with IPython's publisher caught (no kernel to publish to)."""
    ipython_display = pytest.importorskip("IPython.display")
    published: list[dict[str, Any]] = []
    monkeypatch.setattr(ipython_display, "publish_display_data", lambda data, **_: published.append(data))
    exec(text, {"__name__": "__execspace_remotefs__", "__package__": "", "_ARGS": json.dumps(request)})
    (data,) = published
    answer: dict[str, Any] = data[MIME]
    return answer


def _plant(ws: Path) -> None:
    (ws / "work").mkdir(parents=True, exist_ok=True)
    os.symlink("/etc", ws / "work" / "escape")


def test_both_transports_answer_alike_and_follow_no_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = agent_text()
    program = tmp_path / "agent.py"
    program.write_text(text)
    _plant(tmp_path / "by-process")
    _plant(tmp_path / "by-cell")
    by_process = _as_process(program, _requests(tmp_path / "by-process"))
    by_cell = [_as_cell(text, r, monkeypatch) for r in _requests(tmp_path / "by-cell")]

    def same(answer: dict[str, Any]) -> str:
        """The answer without what differs between two trees: their names, mtimes and inode numbers."""

        def plain(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items() if k != "id"}
            if isinstance(value, list):
                return [plain(v) for v in value]
            return None if isinstance(value, float) else value

        return json.dumps(plain(answer)).replace("by-process", "X").replace("by-cell", "X")

    assert [same(a) for a in by_process] == [same(a) for a in by_cell]
    layout, write, read, readable, make_dir, rename, walk, link, through, missing, remove, gone = by_process
    assert read["ok"]["b64"] == base64.b64encode(b"ell").decode() and read["ok"]["size"] == 5
    assert readable == {"ok": [5]}
    names = [(e[0], e[3]) for e in walk["ok"]]
    assert names == [("work/d", "dir"), ("work/d/b.txt", "file"), ("work/escape", "symlink")]
    assert link["ok"][3] == "symlink" and link["ok"][6] == "/etc"
    assert through["error"][0] == "PathDenied"  # the link is refused, never followed
    assert missing["error"][0] == "FileNotFoundError"
    assert gone["error"][0] == "WorkspaceGone"
    assert not (tmp_path / "by-process" / "work" / "d").exists()
    assert (tmp_path / "by-cell" / "work" / "escape").is_symlink()
    assert all("ok" in a for a in (layout, write, make_dir, rename, remove))


def test_metadata_and_a_move_across_filesystems_follow_no_link(tmp_path: Path) -> None:
    """What serve's whole view asks of the agent: ``user.e2b.`` attributes read and set on the entry itself, and a
    move between two filesystems (here the host's /dev/shm and the test's tmp) copied then removed, as mv does."""
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    program = tmp_path / "agent.py"
    program.write_text(agent_text())
    (tmp_path / "f").write_text("f")
    os.symlink("f", tmp_path / "link")
    away = Path(os.path.relpath(tmp_path, "/"))
    shm = Path(os.path.relpath(other, "/")) / f"execspace-agent-test-{os.getpid()}"
    ws = "/"
    try:
        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "a").write_text("a")
        os.chmod(tree / "sub" / "a", 0o640)
        os.symlink("sub/a", tree / "l")
        answers = _as_process(
            program,
            [
                {"op": "set_metadata", "args": {"ws": ws, "path": str(away / "f"), "metadata": {"k": "v"}}},
                {"op": "set_metadata", "args": {"ws": ws, "path": str(away / "link"), "metadata": {"k": "l"}}},
                {"op": "metadata", "args": {"ws": ws, "paths": [str(away / "f"), str(away / "link"), "no/such"]}},
                {"op": "rename", "args": {"ws": ws, "src": str(away / "f"), "dst": str(shm / "f")}},
                {"op": "rename", "args": {"ws": ws, "src": str(away / "tree"), "dst": str(shm / "tree")}},
                {"op": "metadata", "args": {"ws": ws, "paths": [str(shm / "f")]}},
            ],
        )
        tagged, on_link, read, moved, moved_tree, after = answers
        if tagged == {"ok": False}:
            pytest.skip("this filesystem keeps no user attributes")
        assert on_link == {"ok": False}  # a link holds none and is never followed
        assert read == {"ok": [{"k": "v"}, {}, {}]}
        assert "ok" in moved and "ok" in moved_tree, (moved, moved_tree)
        assert after == {"ok": [{"k": "v"}]}  # the attributes went with the file
        assert not (tmp_path / "f").exists() and not tree.exists()
        assert Path("/", shm, "f").read_text() == "f"
        assert os.stat(Path("/", shm, "tree/sub/a")).st_mode & 0o777 == 0o640
        assert os.readlink(Path("/", shm, "tree/l")) == "sub/a"
    finally:
        subprocess.run(["rm", "-rf", str(Path("/", shm))], check=False)
