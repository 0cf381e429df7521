"""The ``execspace`` command, run as a real subprocess: exit codes, JSON, files on the host, streams."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

import execspace
from execspace.cli.run import parse_input
from execspace.errors import InputError
from tests.support import make_traversable

EXECSPACE = str(Path(sys.executable).with_name("execspace"))
BUILTIN_BACKENDS = {"container", "jupyter", "local", "sandbox"}
SVG = "{http://www.w3.org/2000/svg}"

Cli = Callable[..., subprocess.CompletedProcess[bytes]]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    make_traversable(tmp)  # as root, the sandbox's uid must reach workspaces under $TMPDIR
    # default workspaces go under $TMPDIR: keep them inside the test's directory; without a named image the
    # container backend is never the default, so what the default is depends on the sandbox alone
    env = {k: v for k, v in os.environ.items() if k != "EXECSPACE_CONTAINER_IMAGE"}
    return {**env, "TMPDIR": str(tmp), **extra}


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    def run(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None, timeout: float = 60):
        return subprocess.run(
            [EXECSPACE, *args],
            input=stdin,
            capture_output=True,
            cwd=tmp_path,
            env=env or _env(tmp_path),
            timeout=timeout,
        )

    return run


def _path_without_sandbox(tmp_path: Path) -> str:
    """A PATH with python3 and sh but no bwrap: the sandbox backend cannot work under it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sh = shutil.which("sh")
    assert sh is not None
    (bin_dir / "sh").symlink_to(os.path.realpath(sh))
    # the real interpreter, not a wrapper script (pyenv shims need bash on PATH)
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    return str(bin_dir)


# -- exit status --------------------------------------------------------------------------


def test_program_exit_code_passes_through(cli: Cli) -> None:
    proc = cli("run", "--backend", "local", "--", "sh", "-c", "echo out; exit 3")
    assert proc.returncode == 3
    assert proc.stdout == b"out\n"
    assert b"runs WITHOUT isolation" in proc.stderr


def test_killed_by_signal_exits_128_plus_n(cli: Cli) -> None:
    proc = cli("run", "--backend", "local", "--", "sh", "-c", "kill -9 $$")
    assert proc.returncode == 128 + 9


def test_timeout_exits_124_and_kills_the_program(cli: Cli) -> None:
    t0 = time.monotonic()
    proc = cli("run", "--backend", "local", "--timeout", "1", "--", "sleep", "30")
    assert proc.returncode == 124
    assert time.monotonic() - t0 < 20
    assert b"timed out" in proc.stderr


def test_unknown_command_exits_127(cli: Cli) -> None:
    proc = cli("run", "--backend", "local", "--", "no-such-command-xyz")
    assert proc.returncode == 127
    assert b"command not found" in proc.stderr
    as_json = cli("run", "--backend", "local", "--json", "--", "no-such-command-xyz")
    assert as_json.returncode == 127
    assert json.loads(as_json.stdout)["exit_code"] == 127


def test_unknown_backend_exits_125_with_next_step(cli: Cli) -> None:
    proc = cli("run", "--backend", "nosuch", "--", "true")
    assert proc.returncode == 125
    assert proc.stderr.startswith(b"execspace: error: unknown backend 'nosuch'")
    assert b"execspace doctor" in proc.stderr


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--pids", "5"], b"pids"),
        (["--network", "off"], b"--network on"),
        (["--allow-domain", "example.com"], b"--allow-domain needs --backend sandbox"),
    ],
)
def test_unenforceable_policy_on_local_is_refused_before_running(
    cli: Cli, tmp_path: Path, flags: list[str], expected: bytes
) -> None:
    marker = tmp_path / "ran"
    proc = cli("run", "--backend", "local", *flags, "--", "touch", str(marker))
    assert proc.returncode == 125
    assert b"execspace: error: backend 'local' cannot enforce" in proc.stderr
    assert expected in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--network", "on", "--allow-domain", "x.test"], b"drop --network"),
        (["--deny-domain", "x.test"], b"give --allow-domain too"),
        (["--allow-domain", "x test"], b"is not a domain name"),
        (["--allow-domain", "x.test", "--resolve", "x.test"], b"expected NAME=ADDR"),
    ],
)
def test_malformed_domain_flags_are_refused_before_running(
    cli: Cli, tmp_path: Path, flags: list[str], expected: bytes
) -> None:
    marker = tmp_path / "ran"
    proc = cli("run", "--backend", "sandbox", *flags, "--", "touch", str(marker))
    assert proc.returncode in (2, 125) and expected in proc.stderr, proc.stderr
    assert not marker.exists()


def test_allow_domain_reaches_only_the_allowed_name_and_reports_the_audit(cli: Cli, tmp_path: Path) -> None:
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        script = f"curl -sSf -o /dev/null http://allowed.test:{port}/ && ! curl -sSf http://denied.test:{port}/"
        proc = cli(
            "run", "--json", "--backend", "sandbox", "--allow-domain", f"allowed.test:{port}",
            "--resolve", "allowed.test=127.0.0.1", "--", "sh", "-c", script,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    if proc.returncode == 125 and b"sandbox" in proc.stderr:
        pytest.skip(f"sandbox unavailable: {proc.stderr.decode()}")
    report = json.loads(proc.stdout)
    assert report["exit_code"] == 0, report["stderr"]
    assert [(a["host"], a["allowed"]) for a in report["network_audit"]] == [
        ("allowed.test", True),
        ("denied.test", False),
    ]


def test_collect_glob_leaving_the_workspace_is_refused_before_running(cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc = cli("run", "--backend", "local", "--collect", "../*", "--", "touch", str(marker))
    assert proc.returncode == 125
    assert not marker.exists()


def test_bad_arguments_exit_125(cli: Cli) -> None:
    proc = cli("run", "--timeout", "soon", "--", "true")
    assert proc.returncode == 125
    assert b"execspace: error:" in proc.stderr
    assert cli("run", "--backend", "local").returncode == 125  # no command


def test_workspace_path_in_the_way_exits_125(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    for args in (
        ["run", "--backend", "local", "--workspace", "a-file", "--", "true"],
        ["demo", "--keep-dir", "a-file"],
    ):
        proc = cli(*args)
        assert proc.returncode == 125
        assert b"a-file: exists and is not a directory" in proc.stderr
    assert (tmp_path / "a-file").read_text() == "not a directory"


# -- JSON ---------------------------------------------------------------------------------


def test_json_reports_the_run(cli: Cli) -> None:
    proc = cli("run", "--backend", "local", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 2")
    assert proc.returncode == 2
    report = json.loads(proc.stdout)  # exactly one JSON document, nothing else on stdout
    assert set(report) >= {
        "exit_code", "stdout", "stderr", "timed_out", "duration_s", "stdout_truncated",
        "stderr_truncated", "limit_hit", "backend", "isolation", "workspace", "outputs",
    }  # fmt: skip
    assert report["exit_code"] == 2
    assert report["stdout"] == "out\n"
    assert report["stderr"] == "err\n"
    assert report["timed_out"] is False
    assert report["limit_hit"] is None
    assert report["backend"] == "local"
    assert report["isolation"] == "none"
    assert report["workspace"] is None  # a fresh workspace is removed
    assert report["outputs"] == []
    assert 0 <= report["duration_s"] < 30


def test_json_timeout(cli: Cli) -> None:
    proc = cli("run", "--backend", "local", "--json", "--timeout", "0.5", "--", "sh", "-c", "echo a; sleep 30")
    assert proc.returncode == 124
    report = json.loads(proc.stdout)
    assert report["timed_out"] is True
    assert report["limit_hit"] == "timeout"
    assert report["stdout"] == "a\n"  # output before the kill is kept


def test_fresh_workspace_is_removed_and_keep_keeps_it(cli: Cli) -> None:
    gone = cli("run", "--backend", "local", "--json", "--", "sh", "-c", "echo $WORKSPACE_DIR")
    ws = Path(json.loads(gone.stdout)["stdout"].strip())
    assert ws.name and not ws.exists()

    kept = cli("run", "--backend", "local", "--keep", "--", "sh", "-c", "echo kept > ../out/k.txt")
    assert kept.returncode == 0
    line = next(x for x in kept.stderr.decode().splitlines() if "workspace kept at" in x)
    ws = Path(line.split("workspace kept at ", 1)[1])
    assert (ws / "out" / "k.txt").read_text() == "kept\n"
    assert str(ws / "out" / "k.txt") in kept.stderr.decode()  # the outputs summary shows the host path


def _tree(root: Path) -> list[tuple[str, int, int, int]]:
    return sorted(
        (str(p.relative_to(root)), p.lstat().st_mode, p.lstat().st_uid, p.lstat().st_gid)
        for p in [root, *root.rglob("*")]
    )


def test_workspace_refuses_a_directory_of_the_users_own_and_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    """`--workspace .` in a project once re-owned it and added the layout; now it takes --adopt to do that."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "main.py").write_text("print('hi')\n")
    before = _tree(project)
    proc = cli("run", "--backend", "local", "--workspace", str(project), "--", "python3", "main.py")
    assert proc.returncode == 125
    assert b"not an execspace workspace" in proc.stderr and b"--adopt" in proc.stderr and b"--input" in proc.stderr
    assert _tree(project) == before  # not one mode, owner or entry changed
    adopted = cli("run", "--backend", "local", "--workspace", str(project), "--adopt", "--", "ls", "..")
    assert adopted.returncode == 0, adopted.stderr
    assert {"main.py", "src", "work", "out", "metadata.json"} <= set(adopted.stdout.decode().split())
    # a workspace execspace made, and an empty directory, need no --adopt
    again = cli("run", "--backend", "local", "--workspace", str(project), "--", "true")
    empty = tmp_path / "empty"
    empty.mkdir()
    fresh = cli("run", "--backend", "local", "--workspace", str(empty), "--", "true")
    assert (again.returncode, fresh.returncode) == (0, 0), (again.stderr, fresh.stderr)


# -- inputs and outputs -------------------------------------------------------------------


def test_input_is_staged_and_output_collected_to_the_host(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("hello data\n")
    ws = tmp_path / "ws"
    proc = cli(
        "run", "--backend", "local", "--json", "--workspace", str(ws),
        "--input", "data.txt:work/in/d.txt", "--collect", "out/*.txt",
        "--", "sh", "-c", "tr a-z A-Z < in/d.txt > ../out/up.txt; echo no > ../out/skip.md",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["workspace"] == str(ws)
    assert [o["path"] for o in report["outputs"]] == ["out/up.txt"]
    out = report["outputs"][0]
    assert out["size"] == len("HELLO DATA\n")
    assert out["mime"] == "text/plain"
    assert Path(out["host_path"]).read_text() == "HELLO DATA\n"
    assert (ws / "work" / "in" / "d.txt").read_text() == "hello data\n"


def test_collected_outputs_reach_the_host_when_the_workspace_goes(cli: Cli, tmp_path: Path) -> None:
    """--collect names what the user wants: copied to ./execspace-out/<run> (or --out DIR) before the workspace is
    removed; a link planted in --out DIR is replaced, never written through."""
    script = "echo a > ../out/a.txt; mkdir ../out/sub; echo b > ../out/sub/b.txt; echo evil > ../out/evil.txt"
    proc = cli("run", "--backend", "local", "--json", "--collect", "out/**", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["workspace"] is None and report["out_dir"] is not None
    out_dir = Path(report["out_dir"])
    assert out_dir.parent == tmp_path / "execspace-out"
    assert (out_dir / "a.txt").read_text() == "a\n" and (out_dir / "sub" / "b.txt").read_text() == "b\n"
    assert {o["path"]: o["saved_path"] for o in report["outputs"]}["out/a.txt"] == str(out_dir / "a.txt")
    mine = tmp_path / "mine"
    mine.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (mine / "evil.txt").symlink_to(precious)
    again = cli("run", "--backend", "local", "--out", str(mine), "--collect", "out/**", "--", "sh", "-c", script)
    assert again.returncode == 0, again.stderr
    assert precious.read_text() == "keep me" and (mine / "evil.txt").read_text() == "evil\n"
    assert not (mine / "evil.txt").is_symlink() and b"copied to" in again.stderr


def test_json_inlines_outputs_nobody_keeps_and_reports_its_own_failure_as_json(cli: Cli, tmp_path: Path) -> None:
    import base64

    argv = ("run", "--backend", "local", "--json", "--no-out", "--", "sh", "-c", "printf 'x\\0y' > ../out/bin.dat")
    proc = cli(*argv)
    assert proc.returncode == 0, proc.stderr
    (out,) = json.loads(proc.stdout)["outputs"]
    assert base64.b64decode(out["content_base64"]) == b"x\0y" and out["content_truncated"] is False
    assert out["saved_path"] is None and not (tmp_path / "execspace-out").exists()  # --no-out: copied nowhere
    failed = cli("run", "--backend", "nosuch", "--json", "--", "true")
    assert failed.returncode == 125
    assert json.loads(failed.stdout)["error"]["type"] == "UnsupportedBackend"


def test_exec_code_out_keeps_the_files(cli: Cli, tmp_path: Path) -> None:
    code = "import os\nopen(os.environ['OUTPUT_DIR'] + '/r.txt', 'w').write('result')\n"
    (tmp_path / "job.py").write_text(code)
    proc = cli("exec-code", "--backend", "local", "--out", str(tmp_path / "kept"), "job.py")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "kept" / "r.txt").read_text() == "result" and b"copied to" in proc.stderr


def test_exec_code_stages_inputs_and_keeps_or_reuses_its_workspace(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a\n1\n2\n")
    (tmp_path / "job.py").write_text(
        "n = open('inputs/data.csv').read().count('\\n')\nprint(n)\nopen('state', 'w').write(str(n))\n"
    )
    proc = cli("exec-code", "--backend", "local", "--input", "data.csv", "--keep", "--json", "job.py")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    kept = Path(report["workspace"])
    assert report["output"] == "3\n" and (kept / "work" / "state").read_text() == "3"
    # the kept workspace again, by --workspace: what the last call left is there
    (tmp_path / "again.py").write_text("print(open('state').read())\n")
    again = cli("exec-code", "--backend", "local", "--workspace", str(kept), "again.py")
    assert again.returncode == 0 and again.stdout == b"3\n", again.stderr
    assert b"workspace kept at" in again.stderr
    # without --keep the workspace goes, and the report says how to keep the files
    gone = cli("exec-code", "--backend", "local", "--json", "job.py")
    assert gone.returncode == 1 and json.loads(gone.stdout)["workspace"] is None  # no inputs/data.csv there


def test_input_directory_and_default_destination(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.txt").write_text("in a dir\n")
    (tmp_path / "single.csv").write_text("a,b\n")
    proc = cli(
        "run", "--backend", "local", "--input", "pkg", "--input", str(tmp_path / "single.csv"),
        "--", "sh", "-c", "cat inputs/pkg/m.txt inputs/single.csv",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"in a dir\na,b\n"


def test_input_name_with_colon_is_not_split(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "a:b.txt").write_text("colon\n")
    proc = cli("run", "--backend", "local", "--input", "a:b.txt", "--", "cat", "inputs/a:b.txt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"colon\n"


def test_missing_input_exits_125(cli: Cli) -> None:
    proc = cli("run", "--backend", "local", "--input", "nope.csv", "--", "true")
    assert proc.returncode == 125
    assert b"nope.csv" in proc.stderr


def test_parse_input_splits_only_a_meant_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("x.csv").write_text("1")
    spec = parse_input("x.csv:work/a.csv")
    assert (spec.spec.src, spec.spec.dest, spec.host_root) == (
        f"host://{tmp_path / 'x.csv'}",
        "work/a.csv",
        tmp_path,
    )
    assert parse_input("artifact://rep@2:work/r.txt").spec.src == "artifact://rep@2"
    assert parse_input("artifact://rep@2:work/r.txt").spec.dest == "work/r.txt"
    assert parse_input("artifact://rep").spec.dest is None
    assert parse_input(f"host://{tmp_path}/x.csv").host_root == tmp_path
    with pytest.raises(InputError):
        parse_input("missing:work/a.csv")


def test_env_and_cwd(cli: Cli) -> None:
    proc = cli(
        "run",
        "--backend",
        "local",
        "--env",
        "FOO=bar baz",
        "--cwd",
        "out",
        "--",
        "sh",
        "-c",
        "echo $FOO; pwd",
    )
    assert proc.returncode == 0, proc.stderr
    foo, cwd = proc.stdout.decode().splitlines()
    assert foo == "bar baz"
    assert cwd.endswith("/out")


# -- streams ------------------------------------------------------------------------------


def test_output_is_streamed_while_the_program_runs(tmp_path: Path) -> None:
    code = "import time; print('first', flush=True); time.sleep(2); print('second')"
    with subprocess.Popen(
        [EXECSPACE, "run", "--backend", "local", "--", "python3", "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env=_env(tmp_path),
    ) as proc:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "no output within 30 s"
        assert proc.stdout.readline() == b"first\n"
        assert proc.poll() is None  # still sleeping: the line came live, not at exit
        rest, _ = proc.communicate(timeout=30)
    assert rest == b"second\n"
    assert proc.returncode == 0


def test_output_of_a_fast_program_is_not_lost(cli: Cli) -> None:
    for _ in range(5):
        proc = cli("run", "--backend", "local", "--", "sh", "-c", "echo quick; echo fast >&2")
        assert proc.stdout == b"quick\n"
        assert proc.stderr.endswith(b"fast\n")


def test_stdin_is_passed_to_the_program(cli: Cli) -> None:
    data = b"line one\nline two\n"
    proc = cli("run", "--backend", "local", "--", "sh", "-c", "cat; echo end", stdin=data)
    assert proc.stdout == data + b"end\n"
    as_json = cli("run", "--backend", "local", "--json", "--", "wc", "-l", stdin=data)
    assert json.loads(as_json.stdout)["stdout"].strip() == "2"
    no_stdin = cli("run", "--backend", "local", "--no-stdin", "--", "cat", stdin=data)
    assert no_stdin.stdout == b""


def test_closed_stdout_stops_the_program(tmp_path: Path) -> None:
    with subprocess.Popen(
        [EXECSPACE, "run", "--backend", "local", "--timeout", "60", "--", "yes"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=_env(tmp_path),
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"y\n"
        proc.stdout.close()  # like `| head -1`
        t0 = time.monotonic()
        errors = proc.stderr.read()  # EOF when the CLI exits
        proc.wait(timeout=30)
    assert time.monotonic() - t0 < 30  # not the 60 s timeout: the program was stopped
    assert b"Traceback" not in errors


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_cli_kills_the_program_and_keeps_the_workspace(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    pid_file = tmp_path / "pid"
    script = f"echo partial > $OUTPUT_DIR/p.txt; echo $$ > {pid_file}; exec sleep 300"
    with subprocess.Popen(
        [EXECSPACE, "run", "--backend", "local", "--", "sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=_env(tmp_path),
    ) as proc:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the program never started"
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == status
        assert proc.stderr is not None
        errors = proc.stderr.read().decode()
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # in its own session, the program gets no signal of ours
        os.kill(pid, 0)
    (kept,) = (tmp_path / "tmpdir" / f"execspace-cli-{os.getuid()}" / "local").iterdir()
    assert f"workspace kept at {kept}" in errors and (kept / "out" / "p.txt").read_text() == "partial\n"


def _started(tmp_path: Path, *argv: str, stdin: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [EXECSPACE, "run", *argv],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=_env(tmp_path),
    )


def _backend(name: str) -> str:
    if name == "sandbox" and not _sandbox_works():
        pytest.skip("no working sandbox here")
    return name


@pytest.mark.parametrize("backend", ["local", "sandbox"])
def test_stdin_is_streamed_as_it_arrives_and_an_open_pipe_holds_nothing(tmp_path: Path, backend: str) -> None:
    """The program starts at once and reads what the caller writes when it writes it; an agent harness's stdin
    that never closes does not hold the start."""
    backend = _backend(backend)
    script = 'echo started; read line; echo "got:$line"; cat'
    with _started(tmp_path, "--backend", backend, "--", "sh", "-c", script) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"  # before any byte of stdin: on main it waited for EOF
        proc.stdin.write(b"hello\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"got:hello\n"
        proc.stdin.write(b"rest\n")
        proc.stdin.close()
        assert proc.stdout.read() == b"rest\n" and proc.wait(timeout=30) == 0
    with _started(tmp_path, "--backend", backend, "--", "echo", "hi") as proc:  # stdin open and never written
        assert proc.stdout is not None
        assert proc.stdout.read() == b"hi\n" and proc.wait(timeout=30) == 0


@pytest.mark.parametrize("backend", ["local", "sandbox"])
def test_ctrl_c_reaches_the_program_whose_handler_runs_and_the_report_follows(tmp_path: Path, backend: str) -> None:
    backend = _backend(backend)
    script = 'trap "echo caught-int; exit 7" INT; echo ready; while :; do sleep 0.05; done'
    with _started(tmp_path, "--backend", backend, "--keep", "--", "sh", "-c", script) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        rest, errors = proc.stdout.read(), proc.stderr.read()
        assert proc.wait(timeout=30) == 7, errors  # the program's own status
    assert rest == b"caught-int\n"
    assert b"interrupted by SIGINT: sent to the program, which exited on its own" in errors
    assert b"workspace kept at " in errors


def test_a_program_that_ignores_the_signal_is_killed_after_the_grace_and_json_reports_it(tmp_path: Path) -> None:
    script = """trap '' INT; echo ready; touch "$WORK_DIR/armed"; while :; do sleep 0.05; done"""
    argv = ("--backend", "local", "--json", "--grace", "0.5", "--", "sh", "-c", script)
    with _started(tmp_path, *argv, stdin=subprocess.DEVNULL) as proc:
        deadline = time.monotonic() + 30
        workspaces = tmp_path / "tmpdir" / f"execspace-cli-{os.getuid()}" / "local"
        while not list(workspaces.glob("*/work/armed")):  # past the trap: ^C is ignored from here on
            assert time.monotonic() < deadline, "the program never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    report = json.loads(out)
    assert report["interrupted"] == "interrupted by SIGINT: sent to the program, which was then killed"
    assert report["stdout"] == "ready\n" and report["exit_code"] == -signal.SIGTERM
    assert proc.returncode == 128 + signal.SIGTERM


# -- default backend ----------------------------------------------------------------------


def _sandbox_works() -> bool:
    import asyncio

    from execspace.registry import probe_backend

    return asyncio.run(probe_backend("sandbox")).ok


def test_default_backend_runs_or_refuses_with_a_next_step(cli: Cli, tmp_path: Path) -> None:
    proc = cli("run", "--json", "--", "sh", "-c", "echo isolated")
    if not _sandbox_works():
        assert proc.returncode == 125
        assert b"--backend local" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["backend"] == "sandbox"
    assert report["stdout"] == "isolated\n"


def test_without_a_sandbox_the_default_is_refused(cli: Cli, tmp_path: Path) -> None:
    env = _env(tmp_path, PATH=_path_without_sandbox(tmp_path))
    proc = cli("run", "--", "sh", "-c", "echo ran", env=env)
    assert proc.returncode == 125
    assert proc.stdout == b""
    assert b"no isolating backend works" in proc.stderr
    assert b"--backend local" in proc.stderr


# -- doctor -------------------------------------------------------------------------------


def test_doctor_json_lists_every_backend(cli: Cli, tmp_path: Path) -> None:
    proc = cli("doctor", "--json")
    assert proc.returncode == 0
    report = json.loads(proc.stdout)
    names = [b["name"] for b in report["backends"]]
    assert names == sorted(names)
    assert set(names) >= BUILTIN_BACKENDS
    by_name = {b["name"]: b for b in report["backends"]}
    local = by_name["local"]
    assert local["ok"] is True
    assert local["capabilities"]["isolation"] == "none"
    assert "timeout" in local["capabilities"]["enforced_limits"]
    assert local["capabilities"]["kernels"] is None  # no stateful kernels
    jupyter = by_name["jupyter"]
    if jupyter["ok"]:  # its default mode: kernels in the sandbox where it works, else on this host
        kernels = jupyter["capabilities"]["kernels"]
        assert kernels["languages"] == ["python"] and kernels["isolation"] in ("process", "none")
        assert kernels["isolation"] == ("process" if _sandbox_works() else "none")
    for entry in report["backends"]:
        if not entry["ok"]:
            assert entry["reason"] and entry["capabilities"] is None
    assert report["default"]["backend"] == ("sandbox" if _sandbox_works() else None)
    if report["default"]["backend"] is None:
        assert "--backend local" in report["default"]["reason"]
    assert b"probing backends" in proc.stderr


def test_doctor_states_the_limits_an_opened_sandbox_enforces(cli: Cli) -> None:
    """doctor states the sandbox's capabilities without opening it: the same limits an opened engine enforces here
    (as root, the cgroup ones: cpus, and memory and pids for the whole run)."""
    if not _sandbox_works():
        pytest.skip("no working sandbox here")
    proc = cli("doctor", "--json")
    assert proc.returncode == 0
    by_name = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}

    async def opened() -> list[str]:
        async with execspace.open_engine("sandbox") as engine:
            return sorted(engine.describe().enforced_limits)

    assert sorted(by_name["sandbox"]["capabilities"]["enforced_limits"]) == asyncio.run(opened())


def test_doctor_states_each_sandbox_mode(cli: Cli) -> None:
    proc = cli("doctor", "--json")
    assert proc.returncode == 0
    by_name = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}
    modes = {m["mode"]: m for m in by_name["sandbox"]["modes"]}
    assert set(modes) == {"per-run", "session"}
    assert modes["per-run"]["guarantee"].startswith("per-run: one sandbox per run")
    assert modes["session"]["guarantee"].startswith("session: one sandbox per workspace")
    assert modes["per-run"]["ok"] is _sandbox_works()
    # session mode also needs a C compiler for its supervisor: without one it says so, and how to fix it
    has_cc = shutil.which("cc") is not None or shutil.which("gcc") is not None
    assert modes["session"]["ok"] is (_sandbox_works() and has_cc)
    if not modes["session"]["ok"]:
        assert modes["session"]["reason"] and modes["session"]["fix"]
    assert by_name["local"]["modes"] == []  # no modes to choose from: no lines
    text = cli("doctor").stdout.decode()
    sandbox = text.split("sandbox: ", 1)[1].split("\n\n", 1)[0]
    assert "  modes:\n" in sandbox
    state = "OK; one sandbox per workspace" if modes["session"]["ok"] else "NOT AVAILABLE: "
    assert f"    - session: {state}" in sandbox
    assert "    - per-run: " in sandbox


def test_doctor_text(cli: Cli) -> None:
    proc = cli("doctor")
    assert proc.returncode == 0
    text = proc.stdout.decode()
    assert "local: OK" in text
    assert "isolation: none" in text
    if "jupyter: OK" in text:
        assert "kernels:   python, isolation " in text
    for name in BUILTIN_BACKENDS:
        assert f"{name}: " in text
    assert "default backend" in text


# -- demo ---------------------------------------------------------------------------------


def _check_demo_outputs(ws: Path) -> None:
    # the user's copies: theirs (as root, never a sandbox uid's), the workspace gone
    owners = {p.stat().st_uid for p in [ws, *ws.rglob("*")]}
    assert owners == {os.getuid()} and not (ws / "metadata.json").exists()
    with (ws / "work" / "inputs" / "sales.csv").open() as f:
        rows = list(csv.DictReader(f))
    sales = [int(r["sales"]) for r in rows]
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["region"]] = totals.get(r["region"], 0) + int(r["sales"])

    summary = json.loads((ws / "out" / "summary.json").read_text())
    assert summary["count"] == len(rows) == 60
    assert summary["mean"] == pytest.approx(sum(sales) / len(sales), abs=1e-3)
    assert (summary["min"], summary["max"]) == (min(sales), max(sales))
    assert summary["by_region"] == totals

    root = ET.parse(ws / "out" / "chart.svg").getroot()
    assert root.tag == f"{SVG}svg"
    line = root.find(f"{SVG}polyline")
    assert line is not None and len(line.get("points", "").split()) == 60
    bars = [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]
    assert len(bars) == len(totals)
    heights = {r.findtext(f"{SVG}title", "").split(":")[0]: float(r.get("height", "0")) for r in bars}
    assert max(heights, key=heights.__getitem__) == max(totals, key=totals.__getitem__)


def test_demo_produces_summary_and_chart(cli: Cli, tmp_path: Path) -> None:
    proc = cli("demo", "--backend", "local", "--keep-dir", "demo-ws")
    assert proc.returncode == 0, proc.stderr
    ws = tmp_path / "demo-ws"
    _check_demo_outputs(ws)
    out = proc.stdout.decode()
    assert "backend 'local', isolation: none" in out
    assert "out/summary.json" in out and "application/json" in out
    assert str(ws / "out" / "chart.svg") in out


def test_demo_default_keep_dir_and_backend(cli: Cli, tmp_path: Path) -> None:
    proc = cli("demo")
    assert proc.returncode == 0, proc.stderr
    _check_demo_outputs(tmp_path / "execspace-demo")
    assert f"backend {'sandbox' if _sandbox_works() else 'local'!r}" in proc.stdout.decode()


def test_demo_falls_back_to_local_without_a_sandbox(cli: Cli, tmp_path: Path) -> None:
    env = _env(tmp_path, PATH=_path_without_sandbox(tmp_path))
    proc = cli("demo", "--keep-dir", "fallback", env=env)
    assert proc.returncode == 0, proc.stderr
    _check_demo_outputs(tmp_path / "fallback")
    assert b"no isolating backend works" in proc.stderr  # the reason
    assert b"falls back to --backend local" in proc.stderr
    assert "isolation: none" in proc.stdout.decode()


# -- exec-code ----------------------------------------------------------------------------

MARKDOWN = """\
Two blocks:
```python
print("block one")
open("../out/r.txt", "w").write("from python")
```
```bash
echo block two; exit 4
```
"""


def test_exec_code_runs_fenced_blocks(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "reply.md").write_text(MARKDOWN)
    proc = cli("exec-code", "--backend", "local", "--json", "reply.md")
    assert proc.returncode == 1  # one block failed
    report = json.loads(proc.stdout)
    assert [(b["language"], b["exit_code"]) for b in report["blocks"]] == [("python", 0), ("bash", 4)]
    assert report["output"].startswith("block one\nblock two\n")
    assert [(f["name"], f["size"]) for f in report["files"]] == [("out/r.txt", len("from python"))]
    assert report["ok"] is False


def test_exec_code_whole_file_and_stdin(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text('print("```")\nprint(6 * 7)\n')  # a fence inside code is code
    proc = cli("exec-code", "--backend", "local", "prog.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"```\n42\n"
    piped = cli("exec-code", "--backend", "local", "--language", "bash", "-", stdin=b"echo piped; exit 0\n")
    assert (piped.returncode, piped.stdout) == (0, b"piped\n")


def test_exec_code_errors_exit_125(cli: Cli) -> None:
    assert cli("exec-code", "--backend", "nosuch", "-", stdin=b"print(1)").returncode == 125
    missing = cli("exec-code", "--backend", "local", "nope.py")
    assert missing.returncode == 125
    assert b"nope.py" in missing.stderr


# -- entry points -------------------------------------------------------------------------


def test_python_dash_m(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "execspace", "run", "--backend", "local", "--", "sh", "-c", "exit 5"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=60,
    )
    assert proc.returncode == 5
    version = subprocess.run([sys.executable, "-m", "execspace", "--version"], capture_output=True, timeout=60)
    assert version.stdout.startswith(b"execspace ")


def _needs_sandbox() -> None:
    import asyncio

    from execspace.registry import probe_backend

    probe = asyncio.run(probe_backend("sandbox"))
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")


def test_read_only_profile_blocks_writes(cli: Cli, tmp_path: Path) -> None:
    _needs_sandbox()
    from tests.support import make_traversable

    make_traversable(tmp_path)
    proc = cli("run", "--profile", "read-only", "--", "sh", "-c", 'echo x > "$WORK_DIR/f" || echo refused')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"refused\n"


def test_deny_flag_hides_a_host_file(cli: Cli, tmp_path: Path) -> None:
    _needs_sandbox()
    from tests.support import make_traversable

    make_traversable(tmp_path)
    script = "head -c4 /etc/passwd; echo; head -c4 /etc/group || echo denied"
    proc = cli("run", "--deny", "/etc/group", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"root\ndenied\n"  # the file next to it is still readable


def test_unprotect_flag_makes_one_protected_path_writable_under_write(cli: Cli, tmp_path: Path) -> None:
    _needs_sandbox()
    from tests.support import make_traversable

    make_traversable(tmp_path)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "Makefile").write_text("old:\n")
    (project / "AGENTS.md").write_text("Be careful.\n")
    script = f"cd {project}; echo all: > Makefile; echo x > AGENTS.md || echo refused"
    proc = cli("run", "--write", str(project), "--unprotect", "Makefile", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"refused\n"
    assert (project / "Makefile").read_text() == "all:\n" and (project / "AGENTS.md").read_text() == "Be careful.\n"
    assert sorted(os.listdir(project)) == ["AGENTS.md", "Makefile"]
    for flags, error in (([], b"give --write too"), (["--write", str(project)], b"not protected")):
        proc = cli("run", *flags, "--unprotect", "README.md", "--", "true")
        assert proc.returncode == 125 and error in proc.stderr, proc.stderr


def test_write_dot_and_cwd_dot_run_in_the_project_and_plant_nothing(tmp_path: Path) -> None:
    """What the newcomer did (as root, from their project): ``execspace run --write . --cwd . -- ...``. The
    program starts in the project and writes it as the project's owner, though it is 0700 under a 0700 directory
    and owned by root; nothing else appears in it; what exists of the protected paths stays read-only."""
    _needs_sandbox()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    project = closed / "proj"
    project.mkdir(mode=0o700)
    (project / "main.py").write_text("print('hi')\n")
    (project / ".git").mkdir()
    (project / ".git" / "config").write_text("[core]\n")
    before = sorted(os.listdir(project))
    script = "echo new > made.txt; ls main.py; pwd; echo x >> .git/config || echo refused"
    proc = subprocess.run(
        [EXECSPACE, "run", "--backend", "sandbox", "--write", ".", "--cwd", ".", "--", "sh", "-c", script],
        capture_output=True,
        cwd=project,
        env=_env(tmp_path, EXECSPACE_DAEMON="off"),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == f"main.py\n{project}\nrefused\n", proc.stdout
    assert sorted(os.listdir(project)) == sorted([*before, "made.txt"])
    made = os.stat(project / "made.txt")
    assert (made.st_uid, made.st_gid) == (os.geteuid(), os.getegid()) and (project / "made.txt").read_text() == "new\n"
    assert (project / ".git" / "config").read_text() == "[core]\n"
    # a --cwd outside every grant stays a workspace path; a relative one inside a grant is the caller's
    proc = subprocess.run(
        [EXECSPACE, "run", "--backend", "sandbox", "--write", ".", "--cwd", "out", "--", "pwd"],
        capture_output=True,
        cwd=project,
        env=_env(tmp_path, EXECSPACE_DAEMON="off"),
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout == b"/workspace/out\n", proc.stderr


def test_profile_flags_belong_to_the_sandbox(cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc = cli("run", "--backend", "local", "--profile", "read-only", "--", "touch", str(marker))
    assert proc.returncode == 125
    assert b"belong to the sandbox backend" in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize("backend", ["local", "sandbox"])
def test_unrunnable_programs_exit_as_in_a_shell(cli: Cli, tmp_path: Path, backend: str) -> None:
    """Streamed runs (start_program) too: the sandbox reported bwrap's exec failure as exit 1."""
    if backend == "sandbox":
        _needs_sandbox()
        from tests.support import make_traversable

        make_traversable(tmp_path)
    cases = {"/no/such/prog": 127, "./nope": 127, "nope-xyz": 127, "/etc/passwd": 126, "/etc/passwd/x": 126}
    for cmd, code in cases.items():
        proc = cli("run", "--backend", backend, "--", cmd)
        assert proc.returncode == code, (cmd, proc.stderr)
        assert cmd.encode() in proc.stderr


@pytest.mark.parametrize("backend", ["local", "sandbox"])
@pytest.mark.parametrize("json_report", [False, True], ids=["streamed", "json"])
def test_signals_and_timeouts_exit_as_in_a_shell(cli: Cli, tmp_path: Path, backend: str, json_report: bool) -> None:
    """128 + N for a program killed by signal N, 124 for a timeout, the program's own code otherwise: the same on
    every backend, streamed (start_program) or not (run_program; the sandbox's bwrap says 128 + N itself)."""
    if backend == "sandbox":
        _needs_sandbox()
        make_traversable(tmp_path)
    mode = ["--json"] if json_report else []
    for script, status in (("kill -TERM $$", 128 + 15), ("kill -KILL $$", 128 + 9), ("exit 3", 3)):
        proc = cli("run", "--backend", backend, *mode, "--", "sh", "-c", script)
        assert proc.returncode == status, (script, proc.stderr)
        if json_report:
            assert json.loads(proc.stdout)["exit_code"] == (status if status < 128 else 128 - status)
    timed_out = cli("run", "--backend", backend, *mode, "--timeout", "0.5", "--", "sleep", "30")
    assert timed_out.returncode == 124, timed_out.stderr
