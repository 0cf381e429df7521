"""What a newcomer did with the command line in their first hours (issue 31), as they did it: the outputs of a run
are kept under the current directory and named, Ctrl-C and a network refusal keep what they say they keep, ``--id``
resumes a workspace, ``ws`` sees only what the command line made and handles snapshots, and a bad option or a busy
port is one clear line."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execspace.cli.outputs import save_files
from execspace.models import File
from execspace.registry import probe_backend
from tests.support import make_traversable

EXECSPACE = str(Path(sys.executable).with_name("execspace"))

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    make_traversable(tmp)  # as root, the sandbox's uid must reach workspaces under $TMPDIR
    return {**os.environ, "TMPDIR": str(tmp), "EXECSPACE_DAEMON": "off"}


@pytest.fixture
def cli(tmp_path: Path, env: dict[str, str]) -> Cli:
    """``execspace ARGS`` in ``tmp_path/cwd`` (the user's directory), with ``$TMPDIR`` the test's own."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EXECSPACE, *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    return run


@pytest.fixture
def sandbox() -> None:
    if not asyncio.run(probe_backend("sandbox")).ok:
        pytest.skip("the newcomer's default backend, the sandbox, does not work here")


def _named_paths(output: str) -> set[str]:
    return {word for word in output.split() if word.startswith("/")}


# -- outputs ------------------------------------------------------------------------------


def test_a_runs_outputs_are_copied_under_the_current_directory_and_named(
    cli: Cli, tmp_path: Path, sandbox: None
) -> None:
    proc = cli(
        "run",
        "--",
        "sh",
        "-c",
        'echo kept > "$OUTPUT_DIR/y.txt"; mkdir "$OUTPUT_DIR/sub"; echo b > "$OUTPUT_DIR/sub/b"',
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "cwd" / "execspace-out").iterdir()
    assert (run_dir / "y.txt").read_text() == "kept\n" and (run_dir / "sub" / "b").read_text() == "b\n"
    assert f"(copied to {run_dir}):" in proc.stderr
    assert {str(run_dir / "y.txt"), str(run_dir / "sub" / "b")} <= _named_paths(proc.stderr), proc.stderr
    # they are the caller's files (as root too: never the sandbox's uid), in a directory of the caller's
    for path in (run_dir.parent, run_dir, run_dir / "sub", run_dir / "y.txt", run_dir / "sub" / "b"):
        assert (path.stat().st_uid, path.stat().st_gid) == (os.getuid(), os.getgid()), path
    again = cli("run", "--", "sh", "-c", 'echo second > "$OUTPUT_DIR/y.txt"')
    assert again.returncode == 0, again.stderr
    assert len(list((tmp_path / "cwd" / "execspace-out").iterdir())) == 2  # a run of its own: nothing replaced
    assert (run_dir / "y.txt").read_text() == "kept\n"


def test_no_out_keeps_nothing_and_says_how_to_keep_it(cli: Cli, tmp_path: Path) -> None:
    proc = cli("run", "--backend", "local", "--no-out", "--", "sh", "-c", 'echo x > "$OUTPUT_DIR/y.txt"')
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "cwd" / "execspace-out").exists()
    assert "--no-out: not kept" in proc.stderr
    nothing = cli("run", "--backend", "local", "--", "true")  # no output: no directory is made
    assert nothing.returncode == 0 and not (tmp_path / "cwd" / "execspace-out").exists()


def test_the_copies_never_write_over_a_file(cli: Cli, tmp_path: Path) -> None:
    # out/work/x.txt and work/x.txt both land as work/x.txt: the first is copied, the second is named, not copied
    script = "mkdir -p ../out/work; echo from-out > ../out/work/x.txt; echo from-work > x.txt"
    proc = cli("run", "--backend", "local", "--collect", "out/**", "--collect", "work/**", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    (copied,) = (tmp_path / "cwd" / "execspace-out").glob("*/work/x.txt")
    first = copied.read_text()
    assert first in ("from-out\n", "from-work\n")
    other = "work/x.txt" if first == "from-out\n" else "out/work/x.txt"
    assert f"not copied, a file of the same name came first: {other}" in proc.stderr


def test_saving_without_replacing_leaves_whatever_is_there(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    precious = tmp_path / "precious"
    precious.write_text("mine")
    (dest / "link.txt").symlink_to(precious)
    (dest / "there.txt").write_text("there")
    files = [File(n, b"new", "text/plain", 3) for n in ("out/link.txt", "out/there.txt", "out/fresh.txt")]
    clashes: list[str] = []
    saved = save_files(files, dest, replace=False, clashes=clashes)
    assert saved == {"out/fresh.txt": dest / "fresh.txt"} and clashes == ["out/link.txt", "out/there.txt"]
    assert precious.read_text() == "mine" and (dest / "link.txt").is_symlink()
    assert (dest / "there.txt").read_text() == "there" and (dest / "fresh.txt").read_text() == "new"
    assert sorted(p.name for p in dest.iterdir()) == ["fresh.txt", "link.txt", "there.txt"]  # no temporary left


# -- what is kept: Ctrl-C, the network audit ----------------------------------------------------


def test_ctrl_c_keeps_the_workspace_and_says_where(tmp_path: Path, env: dict[str, str], sandbox: None) -> None:
    script = 'echo partial > "$OUTPUT_DIR/p.txt"; echo ready; exec sleep 300'
    with subprocess.Popen(
        [EXECSPACE, "run", "--", "sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        _, errors = proc.communicate(timeout=60)
    assert proc.returncode == 130, errors
    found = re.search(r"workspace kept at (\S+)", errors)
    assert found is not None, errors
    kept = Path(found[1])
    assert (kept / "out" / "p.txt").read_text() == "partial\n"
    assert f"execspace ws rm {kept}" in errors
    rm = subprocess.run([EXECSPACE, "ws", "rm", str(kept)], capture_output=True, env=env, timeout=60)
    assert rm.returncode == 0 and not kept.exists(), rm.stderr


@pytest.fixture
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("keep", [False, True])
def test_a_network_refusal_names_an_audit_file_that_exists(cli: Cli, web: int, sandbox: None, keep: bool) -> None:
    flags = ["--allow-domain", f"allowed.test:{web}", "--resolve", "allowed.test=127.0.0.1"]
    script = f"curl -sS -o /dev/null http://allowed.test:{web}/; curl -sS http://denied.test:{web}/ || true"
    proc = cli("run", *flags, *(["--keep"] if keep else []), "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"network attempt\(s\) refused \(see (\S+)\)", proc.stderr)
    assert found is not None, proc.stderr
    audit = [json.loads(line) for line in Path(found[1]).read_text().splitlines()]
    assert [(a["host"], a["allowed"]) for a in audit] == [("allowed.test", True), ("denied.test", False)]
    assert ("/execspace-out/" in found[1]) is not keep  # beside the outputs, or in the kept workspace
    gone = cli("run", *flags, "--no-out", "--", "sh", "-c", script)
    assert "the audit went with the workspace: pass --keep to keep it" in gone.stderr, gone.stderr


# -- --id resumes ---------------------------------------------------------------------------


def test_id_resumes_the_workspace_of_an_earlier_kept_run(cli: Cli, sandbox: None) -> None:
    counts = []
    for _ in range(3):
        proc = cli("run", "--keep", "--id", "turns/s1", "--", "sh", "-c", "echo turn >> note.txt; wc -l < note.txt")
        assert proc.returncode == 0, proc.stderr
        counts.append(proc.stdout.strip())
    assert counts == ["1", "2", "3"]
    listed = json.loads(cli("ws", "--json", "list").stdout)["workspaces"]
    assert [w["id"] for w in listed] == ["turns/s1"]
    # a later turn without --keep runs in it too, and never removes what an earlier run kept
    again = cli("run", "--id", "turns/s1", "--", "cat", "note.txt")
    assert again.stdout == "turn\nturn\nturn\n" and "workspace kept at" in again.stderr
    assert "`execspace ws rm turns/s1` removes it" in again.stderr
    assert cli("ws", "rm", "turns/s1").returncode == 0
    assert json.loads(cli("ws", "--json", "list").stdout)["workspaces"] == []
    fresh = cli("run", "--id", "turns/s2", "--", "sh", "-c", "echo x > note.txt")  # new, not kept: removed
    assert fresh.returncode == 0 and json.loads(cli("ws", "--json", "list").stdout)["workspaces"] == []


# -- ws sees only the command line's workspaces ---------------------------------------------------


def test_ws_lists_and_collects_only_what_the_command_line_made(cli: Cli, env: dict[str, str]) -> None:
    library = "import asyncio, execspace\nasync def main():\n    async with execspace.open_engine('local') as e:\n"
    library += "        print((await e.manager.create_workspace('another/tool')).host_path)\nasyncio.run(main())\n"
    made = subprocess.run([sys.executable, "-c", library], capture_output=True, text=True, env=env, check=True)
    theirs = Path(made.stdout.strip())
    assert theirs.is_dir() and f"execspace-{os.getuid()}" in str(theirs)  # the library's shared default root
    kept = cli("run", "--backend", "local", "--keep", "--id", "mine", "--", "true")
    assert kept.returncode == 0, kept.stderr
    listed = json.loads(cli("ws", "--json", "list").stdout)["workspaces"]
    assert [w["id"] for w in listed] == ["mine"] and f"execspace-cli-{os.getuid()}" in listed[0]["path"]
    gone = json.loads(cli("ws", "--json", "gc", "--older-than", "0s").stdout)["removed"]
    assert [w["id"] for w in gone] == ["mine"]
    assert theirs.is_dir() and (theirs / "metadata.json").is_file()  # never something the command line did not make


# -- snapshots through ws ---------------------------------------------------------------------


def test_ws_snapshot_lines_rm_by_id_or_name_and_gc_of_unnamed_ones(cli: Cli) -> None:
    assert cli("run", "--backend", "local", "--keep", "--id", "proj", "--", "sh", "-c", "echo v1 > f").returncode == 0
    named = cli("ws", "snapshot", "--name", "clean", "proj")
    assert named.returncode == 0, named.stderr
    assert re.fullmatch(
        r"took snap-[0-9a-f]+  clean\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+s ago\)\s+\S+ \S+  of proj\n", named.stdout
    )
    plain = json.loads(cli("ws", "--json", "snapshot", "proj").stdout)["snapshot"]
    assert plain["name"] is None and plain["workspace"] == "proj" and isinstance(plain["created_at"], float)
    listing = cli("ws", "snapshots")
    assert "snapshots: 2" in listing.stderr and " clean " in listing.stdout and " ago)" in listing.stdout
    assert not re.search(r"\b1\d{9}\b", listing.stdout)  # a time a person reads, not epoch seconds
    third = json.loads(cli("ws", "--json", "snapshot", "proj").stdout)["snapshot"]
    by_id = json.loads(cli("ws", "--json", "rm", third["id"]).stdout)
    assert by_id["removed"] == [] and [s["id"] for s in by_id["removed_snapshots"]] == [third["id"]]
    # gc: the unnamed snapshot goes by age; a named one only by name
    dry = json.loads(cli("ws", "--json", "gc", "--older-than", "0s", "--dry-run").stdout)
    assert [s["id"] for s in dry["would_remove_snapshots"]] == [plain["id"]]
    assert [w["id"] for w in dry["would_remove"]] == ["proj"]
    assert json.loads(cli("ws", "--json", "gc", "--older-than", "1d").stdout)["removed_snapshots"] == []
    gc = json.loads(cli("ws", "--json", "gc", "--older-than", "0s").stdout)
    assert [s["id"] for s in gc["removed_snapshots"]] == [plain["id"]]
    left = json.loads(cli("ws", "--json", "snapshots").stdout)["snapshots"]
    assert [s["name"] for s in left] == ["clean"]
    by_name = cli("ws", "rm", "clean")
    assert by_name.returncode == 0 and "removed snapshots: 1" in by_name.stderr, by_name.stderr
    assert json.loads(cli("ws", "--json", "snapshots").stdout)["snapshots"] == []
    neither = cli("ws", "rm", "no-such")
    assert neither.returncode == 125 and "nor is it a snapshot's id or name" in neither.stderr


# -- one clear line ---------------------------------------------------------------------------


def test_a_bad_option_of_run_prints_runs_usage_and_the_option(cli: Cli) -> None:
    proc = cli("run", "--bogus", "--", "true")
    assert proc.returncode == 125
    assert proc.stderr.startswith("usage: execspace run ") and "--collect GLOB" in proc.stderr
    assert "unrecognized arguments: --bogus (`execspace run --help` lists its options)" in proc.stderr


def test_serve_on_a_busy_port_is_one_line_and_exit_125(cli: Cli) -> None:
    pytest.importorskip("uvicorn", reason="needs the serve extra (pip install 'execspace[serve]')")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        proc = cli("serve", "--port", str(port), timeout=60)
    assert proc.returncode == 125, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "Errno" not in proc.stderr
    assert f"execspace serve cannot start: port {port} on 127.0.0.1 is in use" in proc.stderr
    assert "--port" in proc.stderr and time.monotonic() - started < 30  # before any sandbox was set up
