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
