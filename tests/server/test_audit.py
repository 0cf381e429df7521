"""The audit log of ``execspace serve`` (``--audit-log``, docs/operations.md "Audit log"), through the official SDK:
each action's line is in the file by the time the SDK call returns (nothing polled), with the sandbox's id and its
key's id, never an environment value, a file's content or the key; rotation by rename and SIGHUP; and a server
SIGKILLed in the middle of a burst of commands and writes from several clients leaves only whole lines, one for
every command and write a client saw acknowledged."""

from __future__ import annotations

import http.server
import json
import random
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import e2b_code_interpreter as ci
import httpx
import pytest
from e2b import ALL_TRAFFIC, CommandExitException, Sandbox

from execspace.audit import key_id
from tests.support import audit_entries, audit_lines, until

from .conftest import Server, running_server

pytestmark = pytest.mark.timeout(240)


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, int]]:
    """An HTTP server on a loopback address of its own (its port: not 80, so an address rule reaches it)."""
    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randrange(3, 254, 2)}"
    server = http.server.ThreadingHTTPServer((address, 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield address, server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def audit_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audit") / "audit.jsonl"


@pytest.fixture(scope="module")
def e2b_server(
    tmp_path_factory: pytest.TempPathFactory, audit_file: Path, upstream: tuple[str, int]
) -> Iterator[Server]:
    """This module's server (the SDK is pointed at it), auditing to ``audit_file``."""
    flags = ["--audit-log", str(audit_file), "--max-sandboxes", "3", "--pool-size", "0", "--allow-internet-access"]
    flags += ["--resolve", f"denied.test={upstream[0]}"]
    with running_server(tmp_path_factory.mktemp("serve"), *flags) as server:
        yield server


def test_the_file_is_the_owners_alone(e2b_server: Server, audit_file: Path) -> None:
    assert audit_file.stat().st_mode & 0o777 == 0o600


def test_each_action_has_its_line_when_the_sdk_call_returns(
    e2b_server: Server, audit_file: Path, upstream: tuple[str, int]
) -> None:
    team = key_id(e2b_server.key)
    address, port = upstream
    network = {"allow_out": [address], "deny_out": [ALL_TRAFFIC]}
    sbx = Sandbox.create(timeout=120, envs={"SANDBOX_SECRET": "value-of-the-sandbox-9313"}, network=network)
    sid = sbx.sandbox_id
    try:
        assert audit_entries(audit_file, "sandbox.create", sandbox=sid, key_id=team, template="base")
        done = sbx.commands.run("echo audited-4410", envs={"CALL_SECRET": "value-of-the-call-7719"}, cwd="/tmp")
        assert done.stdout == "audited-4410\n"
        (start,) = audit_entries(audit_file, "command.start", sandbox=sid, key_id=team)
        assert start["argv"][-1] == "echo audited-4410" and start["cwd"] == "/tmp" and start["user"] == "user"
        assert "CALL_SECRET" in start["env_names"] and isinstance(start["pid"], int)
        (end,) = audit_entries(audit_file, "command.end", sandbox=sid, pid=start["pid"])
        assert (end["exit_code"], end["outcome"], end["argv"]) == (0, "ok", start["argv"])
        with pytest.raises(CommandExitException):
            sbx.commands.run("exit 7")
        assert audit_entries(audit_file, "command.end", sandbox=sid, exit_code=7, outcome="error")

        sbx.commands.run(f"curl -s -o /dev/null --max-time 20 http://{address}:{port}/")
        assert audit_entries(audit_file, "egress.allowed", sandbox=sid, host=address, port=port)
        sbx.commands.run("curl -s -o /dev/null --max-time 20 http://denied.test/")
        assert audit_entries(audit_file, "egress.denied", sandbox=sid, host="denied.test", port=80)

        sbx.files.write("notes/a.txt", "content-of-the-file-5521")
        assert audit_entries(audit_file, "file.write", sandbox=sid, path="/home/user/notes/a.txt", size=24)
        sbx.files.rename("notes/a.txt", "notes/b.txt")
        assert audit_entries(
            audit_file, "file.rename", sandbox=sid, path="/home/user/notes/a.txt", to="/home/user/notes/b.txt"
        )
        sbx.files.remove("notes/b.txt")
        assert audit_entries(audit_file, "file.remove", sandbox=sid, path="/home/user/notes/b.txt")

        # once, without the SDK (which retries a 429 on its own); room for three: two more fit, not three
        body = {"templateID": "base", "timeout": 60}
        made = [httpx.post(f"{e2b_server.url}/v2/sandboxes", json=body, headers=_key(e2b_server)) for _ in range(3)]
        assert [m.status_code for m in made] == [201, 201, 429]
        (refusal,) = audit_entries(audit_file, "policy.refusal", what="capacity", key_id=team)
        assert "maximum of 3 sandboxes" in refusal["reason"]
        for answer in made[:2]:
            gone = httpx.delete(f"{e2b_server.url}/sandboxes/{answer.json()['sandboxID']}", headers=_key(e2b_server))
            assert gone.status_code == 204
            assert audit_entries(audit_file, "sandbox.kill", sandbox=answer.json()["sandboxID"], key_id=team)
    finally:
        sbx.kill()
    assert audit_entries(audit_file, "sandbox.kill", sandbox=sid, key_id=team)
    text = audit_file.read_text()
    for secret in ("value-of-the-sandbox-9313", "value-of-the-call-7719", "content-of-the-file-5521", e2b_server.key):
        assert secret not in text
    assert all(line["time"].endswith("Z") and line["time"][10] == "T" for line in audit_lines(audit_file))


def test_a_cell_and_an_expiry_have_their_lines(e2b_server: Server, audit_file: Path) -> None:
    sbx = ci.Sandbox.create(timeout=60)
    try:
        assert sbx.run_code("6 * 7").text == "42"
        (cell,) = audit_entries(audit_file, "cell.execute", sandbox=sbx.sandbox_id)
        assert (cell["language"], cell["code_bytes"]) == ("python", 5) and "6 * 7" not in json.dumps(cell)
    finally:
        sbx.kill()
    short = httpx.post(
        f"{e2b_server.url}/v2/sandboxes", json={"templateID": "base", "timeout": 1}, headers=_key(e2b_server)
    )
    sid = short.json()["sandboxID"]
    until("the expiry's line", lambda: audit_entries(audit_file, "sandbox.expire", sandbox=sid))


def test_sighup_reopens_the_file_a_rotation_renamed(e2b_server: Server, audit_file: Path) -> None:
    rotated = audit_file.with_name("audit.jsonl.1")
    audit_file.rename(rotated)
    e2b_server.process.send_signal(signal.SIGHUP)
    until("the audit log reopened", audit_file.exists)
    sbx = Sandbox.create(timeout=60)
    try:
        assert audit_entries(audit_file, "sandbox.create", sandbox=sbx.sandbox_id)
        assert not audit_entries(rotated, "sandbox.create", sandbox=sbx.sandbox_id)
    finally:
        sbx.kill()
    rotated.unlink()


def _key(server: Server) -> dict[str, str]:
    return {"X-API-KEY": server.key}


@pytest.mark.timeout(480)
def test_a_sigkilled_server_leaves_whole_lines_and_every_acknowledged_action(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    root = tmp_path / "ws"
    acknowledged: list[tuple[str, str, str]] = []  # (sandbox, line, token) of each command and write a client saw done
    with running_server(root, "--audit-log", str(audit), "--pool-size", "0") as server:
        connect = {"api_key": server.key, "api_url": server.url, "sandbox_url": server.url}
        sandboxes = [Sandbox.create(timeout=120, **connect) for _ in range(4)]
        stop = threading.Event()

        def burst(sbx: Sandbox, client: int) -> None:
            for n in range(10_000):
                if stop.is_set():
                    return
                token = f"burst-{client}-{n}"
                try:
                    if n % 2:
                        sbx.commands.run(f"echo {token}", timeout=10)
                    else:
                        sbx.files.write(f"{token}.txt", token)
                except Exception:  # the server is gone: this one was not acknowledged
                    return
                acknowledged.append((sbx.sandbox_id, "command.end" if n % 2 else "file.write", token))

        with ThreadPoolExecutor(len(sandboxes)) as pool:
            clients = [pool.submit(burst, sbx, i) for i, sbx in enumerate(sandboxes)]
            # a few actions of each client done, the others on their way (a loaded machine does one a second)
            until("the burst under way", lambda: len(acknowledged) >= 12, within=180)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(timeout=20)
            stop.set()
            for client in clients:
                client.result(timeout=60)
    found = audit_lines(audit)  # every line whole and JSON
    said = {(line["sandbox"], line["event"], line.get("path") or line.get("argv", [""])[-1]) for line in found}
    missing = [
        (sandbox, event, token)
        for sandbox, event, token in acknowledged
        if (sandbox, event, f"echo {token}" if event == "command.end" else f"/home/user/{token}.txt") not in said
    ]
    assert len(acknowledged) >= 12 and missing == []
    with running_server(root, "--pool-size", "0"):  # removes what the killed one left
        until("the dead server's sandboxes removed", lambda: not any(root.glob("e2b_*")))


def test_a_node_servers_lines_name_its_node_and_the_front_doors_refusal_names_none(tmp_path: Path) -> None:
    """serve --ray: each node's server adds its Ray ``node`` to every line; the front door writes the creates it
    refuses itself (every node full) with ``node`` null, and nothing else."""
    from execspace.audit import AuditLog
    from execspace.server.audit import ServerAudit
    from execspace.server.cluster.doorevents import CreateAnswered, DoorAudit, NodeCalled
    from execspace.server.events import SandboxChanged

    log = AuditLog(tmp_path / "audit.jsonl")
    try:
        ServerAudit(log, {"node": "f7f7"})(SandboxChanged("create", "i1", "base", "k1"))
        door = DoorAudit(log)
        door(CreateAnswered("created", "k1"))
        door(NodeCalled(0.01))
        door(CreateAnswered("full", "k2"))
    finally:
        log.close()
    created, refused = audit_lines(tmp_path / "audit.jsonl")
    assert (created["event"], created["sandbox"], created["node"]) == ("sandbox.create", "i1", "f7f7")
    assert (refused["event"], refused["what"], refused["key_id"]) == ("policy.refusal", "capacity", "k2")
    assert refused["node"] is None and refused["sandbox"] is None and "every node" in refused["reason"]
