"""E2B's egress rules (``network={"allow_out": ..., "deny_out": ...}``) through the official SDK, enforced by the
egress proxy: an upstream on a loopback address of its own, port 80 (a domain is allowed on 80 and 443, as on
E2B) and one other port, named ``allowed.test`` / ``denied.test`` by the server's ``--resolve`` pins."""

from __future__ import annotations

import http.server
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, AsyncSandbox, Sandbox
from e2b.exceptions import SandboxException

import execspace
from execspace import RunProgramSpec
from execspace.backends.e2b import E2BOptions

from .conftest import Server, running_server


@dataclass(frozen=True)
class Upstream:
    address: str
    """A loopback address only this test's servers listen on, at port 80 and at ``other_port``."""
    other_port: int


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.server.server_address[1]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randrange(2, 254, 2)}"
    try:
        servers = [http.server.ThreadingHTTPServer((address, port), _Hello) for port in (80, 0)]
    except PermissionError:
        pytest.skip("port 80 (where E2B matches a domain) needs root")
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Upstream(address, servers[1].server_address[1])
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def egress_server(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[Server]:
    pins = ["--resolve", f"allowed.test={upstream.address}", "--resolve", f"denied.test={upstream.address}"]
    with running_server(tmp_path_factory.mktemp("serve"), "--allow-internet-access", *pins) as server:
        yield server


@pytest.fixture
def sdk(egress_server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    for name, value in egress_server.sdk_env().items():
        monkeypatch.setenv(name, value)
    return egress_server


def _status(sbx: Sandbox, url: str) -> str:
    """The HTTP status a request through the sandbox's proxy settings gets (403: the proxy refused it)."""
    return sbx.commands.run(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 {url}").stdout


def test_an_allowed_domain_is_reached_on_port_80_and_nothing_else(sdk: Server, upstream: Upstream) -> None:
    sbx = Sandbox.create(network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]})
    try:
        got = sbx.commands.run("curl -sS --max-time 20 http://allowed.test/")
        assert got.stdout == "hello from 80\n"
        assert _status(sbx, f"http://allowed.test:{upstream.other_port}/") == "403"  # a domain: 80 and 443 only
        assert _status(sbx, "http://denied.test/") == "403"
        assert _status(sbx, f"http://{upstream.address}/") == "403"  # its address is not on the list
        info = sbx.get_info()
        assert info.network is not None
        assert (info.network.get("allow_out"), info.network.get("deny_out")) == (["allowed.test"], [ALL_TRAFFIC])
        assert info.allow_internet_access is False
    finally:
        sbx.kill()


def test_allow_out_alone_is_an_allow_list_here(sdk: Server) -> None:
    """allow_internet_access left out counts as False (the server's default is offline, E2B's is online)."""
    sbx = Sandbox.create(network={"allow_out": ["allowed.test"]})
    try:
        assert sbx.commands.run("curl -sS --max-time 20 http://allowed.test/").stdout == "hello from 80\n"
        assert _status(sbx, "http://denied.test/") == "403"
    finally:
        sbx.kill()


def test_update_network_replaces_the_rules_of_the_next_commands(sdk: Server) -> None:
    sbx = Sandbox.create(network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]})
    try:
        assert _status(sbx, "http://denied.test/") == "403"
        sbx.update_network({"allow_out": ["denied.test"], "deny_out": [ALL_TRAFFIC]})
        assert _status(sbx, "http://denied.test/") == "200"
        assert _status(sbx, "http://allowed.test/") == "403"
        info = sbx.get_info().network
        assert info is not None and info.get("allow_out") == ["denied.test"]
        with pytest.raises(SandboxException, match=r"400: network.denyOut"):
            sbx.update_network({"deny_out": ["denied.test"]})
        assert _status(sbx, "http://denied.test/") == "200"  # a refused update changes nothing
    finally:
        sbx.kill()


def test_an_allowed_block_wins_over_a_denied_one_on_every_port(sdk: Server, upstream: Upstream) -> None:
    """``allow_internet_access=False`` denies all traffic; the allowed /32 inside the denied 127.0.0.0/8 wins,
    on any port; its neighbour stays denied."""
    neighbour = upstream.address.rsplit(".", 1)[0] + "." + str(int(upstream.address.rsplit(".", 1)[1]) + 1)
    sbx = Sandbox.create(
        allow_internet_access=False,
        network={"allow_out": [f"{upstream.address}/32"], "deny_out": ["127.0.0.0/8"]},
    )
    try:
        url = f"http://{upstream.address}:{upstream.other_port}/"
        assert sbx.commands.run(f"curl -sS --max-time 20 {url}").stdout == f"hello from {upstream.other_port}\n"
        assert _status(sbx, f"http://{neighbour}:{upstream.other_port}/") == "403"
        assert _status(sbx, "http://allowed.test/") == "403"  # a name is not an address
    finally:
        sbx.kill()


@pytest.mark.parametrize(
    ("network", "internet", "answer"),
    [
        ({"deny_out": ["example.com"]}, False, "400: network.denyOut entry 'example.com' is not an IP address"),
        ({"allow_out": ["example.com:8080"]}, False, "400: network.allowOut entry 'example.com:8080'"),
        ({"allow_out": ["10.0.0.0/33"]}, False, "400: network.allowOut entry '10.0.0.0/33'"),
        ({"deny_out": ["10.0.0.0/8"]}, True, "501: .*network.denyOut without denying all traffic"),
        ({"allow_out": ["allowed.test"], "egress_proxy": {"address": "p.test:1080"}}, False, "501: .*egressProxy"),
    ],
)
def test_malformed_or_unenforceable_rules_are_refused_naming_the_field(
    sdk: Server, network: dict[str, object], internet: bool, answer: str
) -> None:
    with pytest.raises(SandboxException, match=answer):
        Sandbox.create(allow_internet_access=internet, network=network)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("network", "field"), [("allowed.test", "network must be an object"), ({"allowOut": "x"}, "network.allowOut")]
)
def test_a_network_field_of_the_wrong_shape_gets_a_json_400(sdk: Server, network: object, field: str) -> None:
    body = {"templateID": "base", "network": network}
    answer = httpx.post(f"{sdk.url}/v2/sandboxes", json=body, headers={"X-API-KEY": sdk.key})
    assert answer.status_code == 400
    assert answer.json()["code"] == 400 and answer.json()["message"].startswith(field)


@pytest.mark.parametrize(
    "ask",
    [
        {"allow_internet_access": True},
        {"network": {"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]}},
        {"allow_internet_access": True, "network": {"allow_out": ["allowed.test"]}},
    ],
    ids=["internet", "allow-list", "both"],
)
def test_a_server_that_keeps_sandboxes_offline_refuses_the_network_at_create(
    e2b_server: Server, ask: dict[str, Any]
) -> None:
    """The conftest's server runs without --allow-internet-access: a sandbox asking for the network is refused
    with a 403 naming the flag (the SDK's own SandboxException), never created offline; nothing is left behind."""
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(SandboxException, match=r"^403: .*--allow-internet-access") as refused:
        Sandbox.create(**ask)
    assert getattr(refused.value, "status_code", 403) == 403
    assert {s.sandbox_id for s in Sandbox.list().next_items()} == before
    offline = Sandbox.create(network={"deny_out": [ALL_TRAFFIC]})
    try:
        assert offline.get_info().network == {"deny_out": [ALL_TRAFFIC]}
        assert offline.get_info().allow_internet_access is False
    finally:
        offline.kill()


async def test_the_async_sdk_is_refused_the_same(e2b_server: Server) -> None:
    with pytest.raises(SandboxException, match=r"^403: .*--allow-internet-access"):
        await AsyncSandbox.create(allow_internet_access=True)
    sbx = await AsyncSandbox.create(allow_internet_access=False)
    try:
        assert (await sbx.get_info()).allow_internet_access is False
    finally:
        await sbx.kill()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"lang": "python", "package_version": "2.45.1"}, 201),  # sends true on every create: its default
        ({"lang": "js", "package_version": "2.29.0"}, 201),
        ({"lang": "python", "package_version": "2.51.0"}, 403),  # sends it only when its caller does
        ({"lang": "js", "package_version": "2.51.0"}, 403),
        ({"lang": "python", "package_version": "garbage"}, 403),
        ({}, 403),  # any other client is taken at its word
    ],
)
def test_only_an_sdk_that_always_sends_the_network_gets_its_default(
    e2b_server: Server, headers: dict[str, str], status: int
) -> None:
    body = {"templateID": "base", "allow_internet_access": True}
    answer = httpx.post(f"{e2b_server.url}/v2/sandboxes", json=body, headers={"X-API-KEY": e2b_server.key, **headers})
    assert answer.status_code == status, answer.text
    if status == 201:
        sandbox_id = answer.json()["sandboxID"]
        assert Sandbox.get_info(sandbox_id).allow_internet_access is False  # offline, and it says so
        Sandbox.kill(sandbox_id)
    else:
        assert answer.json() == {"code": 403, "message": answer.json()["message"]}
        assert "--allow-internet-access" in answer.json()["message"]


def test_a_network_update_the_server_forbids_is_refused(e2b_server: Server) -> None:
    sbx = Sandbox.create()
    try:
        answer = httpx.put(
            f"{e2b_server.url}/sandboxes/{sbx.sandbox_id}/network",
            json={"allow_internet_access": True},
            headers={"X-API-KEY": e2b_server.key},
        )
        assert answer.status_code == 403 and "--allow-internet-access" in answer.json()["message"]
        assert sbx.get_info().allow_internet_access is False
    finally:
        sbx.kill()


async def test_the_e2b_backend_asking_for_the_network_is_refused_naming_the_flag(e2b_server: Server) -> None:
    options = {"api_url": e2b_server.url, "sandbox_url": e2b_server.url, "api_key": e2b_server.key}
    async with execspace.open_engine("e2b", template="base", allow_internet_access=True, **options) as engine:
        with pytest.raises(execspace.BackendError, match=r"403: .*--allow-internet-access"):
            await engine.manager.create_workspace("net/refused")


@pytest.mark.skipif(not os.environ.get("EXECSPACE_E2B_JS"), reason="set EXECSPACE_E2B_JS (./run test makes one)")
def test_the_javascript_sdk_sends_the_same_rules(egress_server: Server, upstream: Upstream) -> None:
    node = shutil.which("node")
    assert node is not None, "node is not installed"
    js_sdk = Path(os.environ["EXECSPACE_E2B_JS"])
    script = js_sdk / f"network-{os.getpid()}.mjs"  # beside its node_modules, so that `import 'e2b'` resolves
    shutil.copy(Path(__file__).with_name("js") / "network.mjs", script)
    try:
        env = {**os.environ, **egress_server.sdk_env()}
        run = subprocess.run([node, str(script)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        script.unlink()
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


async def test_the_e2b_backend_gives_its_sandboxes_the_engines_allow_list(
    egress_server: Server, upstream: Upstream, tmp_path: Path
) -> None:
    """``E2BOptions(network=NetworkPolicy)`` becomes the sandbox's ``allow_out`` with all other traffic denied,
    enforced by the service for every run; a run asking for another network is refused, and so is a policy whose
    meaning would change on the way (a domain on another port, an address without ``:*``, a denied entry)."""
    policy = execspace.NetworkPolicy.allow(["allowed.test", f"{upstream.address}:*"])
    options = {"api_url": egress_server.url, "sandbox_url": egress_server.url, "api_key": egress_server.key}
    async with execspace.open_engine("e2b", template="base", network=policy, **options) as engine:
        assert engine.describe().network_domains
        ws = await engine.manager.create_workspace("net/allow")

        async def curl(url: str) -> str:
            spec = RunProgramSpec("curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20", url])
            return (await engine.runner.run_program(ws, spec)).stdout

        assert await curl("http://allowed.test/") == "200"
        assert await curl(f"http://{upstream.address}:{upstream.other_port}/") == "200"  # an address: every port
        assert await curl("http://denied.test/") == "403"
        assert await curl(f"http://allowed.test:{upstream.other_port}/") == "403"  # a domain: 80 and 443 only
        for other in ("on", "off", execspace.NetworkPolicy.allow(["denied.test"])):
            with pytest.raises(execspace.CapabilityError, match="allow-list"):
                await engine.runner.run_program(ws, RunProgramSpec("true", network=other))
    for bad, says in (
        (["allowed.test:8080"], "ports 80 and 443"),
        ([upstream.address], ":\\*"),
        (["*:*"], "allow_internet_access=True"),
    ):
        with pytest.raises(execspace.InvalidSpec, match=says):
            E2BOptions(network=execspace.NetworkPolicy.allow(bad))
    with pytest.raises(execspace.InvalidSpec, match="allowed entries win"):
        E2BOptions(network=execspace.NetworkPolicy.allow(["allowed.test"], deny=["10.0.0.0/8"]))
    with pytest.raises(execspace.InvalidSpec, match="give one"):
        E2BOptions(network=policy, allow_internet_access=True)
