"""Attacks through the command line and its warm daemon, judged by what the host sees afterwards:
whether a command ran outside the sandbox, host file bytes, exit statuses, what reached the terminal.

Every test runs the real ``execspace`` command, in-process (``EXECSPACE_DAEMON=off``) and through a
daemon where that path differs. The daemon attack needs a caller that is not root to bite (as root
the sandbox runs under another uid, which the daemon's peer check refuses anyway); it runs as root
too, where it must hold all the more.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import execspace
from execspace import OutputSpec, PutFile, RunProgramSpec
from execspace.cli.daemonwire import daemon_socket_path, encode_request
from execspace.registry import probe_backend
from tests.support import CLI, daemon_served, make_traversable, running_daemon

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sandbox_ok() -> None:
    probe = asyncio.run(probe_backend("sandbox"))
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")


@pytest.fixture
def daemon(sandbox_ok: None) -> Iterator[dict[str, str]]:
    with running_daemon() as env:
        yield env


def _cli(env: dict[str, str], via: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run ``execspace ARGS`` through the daemon (checked) or in this process's child."""
    if via == "in-process":
        env = {**env, "EXECSPACE_DAEMON": "off"}
        return subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, timeout=90)
    before = daemon_served(env)
    done = subprocess.run([*CLI, *args], env=env, cwd=cwd, capture_output=True, timeout=90)
    assert daemon_served(env) == before + 1, "the command did not go through the daemon"
    return done


VIA = pytest.mark.parametrize("via", ["daemon", "in-process"])


# -- F6: a sandboxed program talks to the warm daemon ------------------------------------------

_DAEMON_ATTACK = r"""
import os, socket, sys
path, request = sys.argv[1], bytes.fromhex(sys.argv[2])
try:
    print("listing", sorted(os.listdir(os.path.dirname(path))))
except OSError as exc:
    print("listing", type(exc).__name__)
key = b""
try:
    with open(path[: -len(".sock")] + ".key", "rb") as f:
        key = f.read()
except OSError as exc:
    print("key", type(exc).__name__)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
    socket.send_fds(s, [key + request], [0, 1, 2])
    reply = b"".join(iter(lambda: s.recv(64), b""))
except OSError as exc:
    print("connect", type(exc).__name__)
else:
    print("reply", reply)
"""


def _grant(env: dict[str, str], which: str) -> str:
    sock = daemon_socket_path(env)
    return {
        "runtime-dir": env["XDG_RUNTIME_DIR"],
        "daemon-dir": os.path.dirname(sock),
        "socket": sock,
        "key": sock.removesuffix(".sock") + ".key",
    }[which]


@VIA
@pytest.mark.parametrize("grant", ["runtime-dir", "daemon-dir", "socket", "key"])
def test_a_sandboxed_program_cannot_make_the_daemon_run_commands_on_the_host(
    daemon: dict[str, str], tmp_path: Path, via: str, grant: str
) -> None:
    make_traversable(tmp_path)
    marker = tmp_path / "ran-on-the-host"
    local = ["run", "--backend", "local", "--", "sh", "-c", f"cat /proc/self/status > {marker}"]
    request = encode_request(b"run", local, {b"PATH": b"/usr/bin:/bin"}, os.fsencode(tmp_path), 0o022)
    sock = daemon_socket_path(daemon)
    attack = ["run", "--backend", "sandbox", "--network", "on", "--read", _grant(daemon, grant)]
    attack += ["--", "python3", "-c", _DAEMON_ATTACK, sock, request.hex()]
    served = daemon_served(daemon)
    done = _cli(daemon, via, attack, tmp_path)
    assert not marker.exists(), f"the daemon ran a sandboxed program's command on the host: {done.stdout!r}"
    assert daemon_served(daemon) == served + (via == "daemon")  # the attack's own run, nothing more
    assert b"reply b'+" not in done.stdout
    if os.geteuid() == 0:
        return  # the program runs as another uid: the 0700 directory (or bwrap, for a grant inside it) stops it
    if grant in ("socket", "key"):  # a grant inside the daemon's directory is refused outright
        assert done.returncode == 125 and b"no sandbox may see" in done.stderr, done.stderr
    else:  # one covering it runs, with the directory masked
        assert done.returncode == 0 and b"listing" in done.stdout, done.stderr
        assert b"reply" not in done.stdout and b"cli-" not in done.stdout


# -- F8: relative host paths in grants ------------------------------------------------------


@VIA
@pytest.mark.parametrize("deny", ["./.env", ".env"])
def test_a_relative_deny_keeps_the_host_file_out_of_reach(
    daemon: dict[str, str], tmp_path: Path, via: str, deny: str
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    secret = project / ".env"
    secret.write_bytes(b"API_KEY=hunter2\n")
    make_traversable(project)
    script = f"cat {secret}; echo pwned >> {secret}; echo ok > {project}/notes.txt; echo finished"
    args = ["run", "--backend", "sandbox", "--write", ".", "--deny", deny, "--", "sh", "-c", script]
    done = _cli(daemon, via, args, project)
    assert b"finished" in done.stdout, done.stderr  # the program ran, with the grant in force
    assert b"hunter2" not in done.stdout + done.stderr
    assert secret.read_bytes() == b"API_KEY=hunter2\n"


# -- a program makes its output unreadable --------------------------------------------------

_UNREADABLE_OUTPUT = "mkdir -p ../out; echo a > ../out/ok.txt; echo b > ../out/x; chmod 000 ../out/x; echo done; exit 3"


@VIA
def test_an_unreadable_output_loses_neither_the_result_nor_the_other_files(
    daemon: dict[str, str], tmp_path: Path, via: str
) -> None:
    make_traversable(tmp_path)
    args = ["run", "--backend", "sandbox", "--", "sh", "-c", _UNREADABLE_OUTPUT]
    done = _cli(daemon, via, args, tmp_path)
    assert (done.returncode, done.stdout) == (3, b"done\n"), done.stderr
    assert b"out/ok.txt" in done.stderr and b"out/x" in done.stderr
    if os.geteuid() != 0:  # root reads it anyway
        assert b"skipped: unreadable" in done.stderr
    as_json = _cli(daemon, via, [args[0], "--json", *args[1:]], tmp_path)
    assert as_json.returncode == 3, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["exit_code"] == 3 and report["stdout"] == "done\n"
    outputs = {o["path"]: o for o in report["outputs"]}
    assert outputs["out/ok.txt"]["skipped"] is None and outputs["out/ok.txt"]["size"] == 2
    if os.geteuid() != 0:
        assert "unreadable" in outputs["out/x"]["skipped"]


async def test_collect_outputs_reports_an_unreadable_file_and_keeps_the_rest(tmp_path: Path, sandbox_ok: None) -> None:
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("red/round2/unreadable")
        script = "echo a > ../out/a; echo b > ../out/b; chmod 000 ../out/a"
        await engine.fs.put_files(ws, [PutFile("work/go.sh", script)])
        result = await engine.runner.run_program(ws, RunProgramSpec("sh", ["go.sh"]))
        assert result.exit_code == 0, result.stderr
        manifest = await engine.fs.collect_outputs(ws, OutputSpec(globs=["out/**"], inline=True))
    files = {f.name: f for f in manifest.files}
    assert files["out/b"].content == b"b\n" and files["out/b"].skipped is None
    if os.geteuid() != 0:
        assert files["out/a"].skipped is not None and files["out/a"].content == b""
        assert not manifest.limits_hit


@pytest.mark.parametrize("hidden", ["../out", "../out/sub"])
@VIA
def test_an_unreadable_output_directory_is_reported_not_fatal(
    daemon: dict[str, str], tmp_path: Path, via: str, hidden: str
) -> None:
    """The whole out/ (or a directory in it) made unreadable: the run's result and the other files stay, and the
    directory is reported as skipped (as root nothing is unreadable)."""
    make_traversable(tmp_path)
    script = f"mkdir -p ../out/sub; echo a > ../out/ok.txt; echo s > ../out/sub/s; chmod 000 {hidden}; exit 4"
    args = ["run", "--backend", "sandbox", "--json", "--", "sh", "-c", script]
    done = _cli(daemon, via, args, tmp_path)
    assert done.returncode == 4, done.stderr
    outputs = {o["path"]: o for o in json.loads(done.stdout)["outputs"]}
    if os.geteuid() == 0:
        assert outputs["out/sub/s"]["size"] == 2
        return
    assert "unreadable directory" in outputs[hidden.removeprefix("../")]["skipped"]
    if hidden == "../out/sub":
        assert outputs["out/ok.txt"]["skipped"] is None and outputs["out/ok.txt"]["size"] == 2


# -- terminal escapes in program-chosen names -----------------------------------------------

_ESCAPE_NAME = "mkdir -p ../out; printf x > \"../out/$(printf '\\033]0;pwned\\007x.txt')\"; ln -s nowhere ../out/l"


@VIA
def test_file_names_reach_the_terminal_escaped(daemon: dict[str, str], tmp_path: Path, via: str) -> None:
    make_traversable(tmp_path)
    done = _cli(daemon, via, ["run", "--backend", "sandbox", "--keep", "--", "sh", "-c", _ESCAPE_NAME], tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"\\x1b]0;pwned\\x07x.txt" in done.stderr  # listed, as text
    assert b"\x1b" not in done.stderr + done.stdout and b"\x07" not in done.stderr + done.stdout
    as_json = _cli(daemon, via, ["run", "--json", "--backend", "sandbox", "--", "sh", "-c", _ESCAPE_NAME], tmp_path)
    assert b"\x1b" not in as_json.stdout and b"\x07" not in as_json.stdout
    assert [o["path"] for o in json.loads(as_json.stdout)["outputs"]] == ["out/\x1b]0;pwned\x07x.txt"]
