"""Two tenants of one ``execspace serve``: what one sandbox at its caps costs another (issue 28).

``python bench/bench_tenants.py [--rounds N] [--flood-seconds S]``

A server subprocess (sandbox backend, session mode) serves two sandboxes. The **victim** is timed with the official
SDK: ``commands.run("true")`` and a file round trip (``files.write`` then ``files.read`` of 4 KiB). Its latency is
measured with the server idle and then while the **hog**, another sandbox of the same server, runs every flood the
red team used, at the server's caps, from a separate process:

- commands: starts ``sleep`` commands until it holds its share of live commands and streams, and keeps asking;
- output: two commands printing as fast as they can (``yes``), their output streamed to the hog;
- watchers: recursive directory watches of a 20,000-file tree, as many as its share allows, kept asking;
- listings: ``ListDir`` of that tree with the deepest depth (uint32 max), 8 at a time;
- file operations: ``Stat`` from 64 concurrent callers (its share runs 2 at once, queues 64);
- bodies: ``/execute`` and create bodies larger than the server takes (refused as they arrive);
- slow heads: 200 connections that never complete a request head (the server's connection cap and head timeout);
- transfers: uploads of 64 MiB and downloads of a 1 TiB sparse file, 4 at a time.

Both phases are interleaved (idle, flood, idle, flood …, ``--rounds`` each), so the machine's drift falls on both.
The hog's process runs at the lowest priority (``nice 19``): in a deployment the attacker's CPU is its own machine's,
and on a two-core host an unniced client would measure what two clients cost each other rather than the server.
The target (issue 28): the victim's medians under flood within 2× of idle. The server's RSS and open descriptors are
read from /proc before, at the end of each flood and after, and must stay bounded (no growth with the flood's
length). Nothing is asserted; the verdict is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

KEY = "e2b_" + "0123456789abcdef" * 2
UINT32_MAX = 2**32 - 1
TREE = "/home/user/tree"


@contextlib.contextmanager
def _server(root: Path, log: Path) -> Iterator[tuple[str, int]]:
    """The server, its output in ``log`` (a file: a pipe nobody reads would stop it once full)."""
    from execspace.testing.binding import make_traversable
    from execspace.testing.processes import terminate

    root.mkdir(parents=True, exist_ok=True)
    make_traversable(root)  # as root, each sandbox's own uid must reach its workspace
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", KEY, "--workspace-root", str(root)]
    argv += ["--pool-size", "0", "--max-upload-mb", "64"]
    env = {**os.environ, "EXECSPACE_DAEMON": "off", "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while (found := re.search(rb"listening on (\S+)", log.read_bytes())) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"execspace serve did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield found.group(1).decode(), proc.pid
    finally:
        terminate(proc, grace=20)


def _proc_status(pid: int) -> tuple[float, int]:
    """The server's resident memory (MiB) and open descriptors."""
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


# the hog: raw requests in a process of its own


def _envelope(message: dict[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(data)) + data


class Hog:
    """One sandbox's floods, as coroutines that run until the stop event."""

    def __init__(self, url: str, sandbox: dict[str, Any], stop: asyncio.Event) -> None:
        self.url, self.stop = url, stop
        self.envd = {
            "E2b-Sandbox-Id": sandbox["sandboxID"],
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sandbox["envdAccessToken"],
        }
        self.interp = {**self.envd, "E2b-Sandbox-Port": "49999"}
        self.refused = 0
        self.answered = 0

    def _client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
        return httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits)

    async def _until_stopped(self, step: Callable[[httpx.AsyncClient], Any], workers: int) -> None:
        async with self._client() as client:

            async def loop() -> None:
                while not self.stop.is_set():
                    try:
                        await step(client)
                    except (httpx.HTTPError, OSError):
                        self.refused += 1
                        await asyncio.sleep(0.01)

            await asyncio.gather(*(loop() for _ in range(workers)))

    async def _stream(self, client: httpx.AsyncClient, path: str, message: dict[str, Any]) -> None:
        """Open a server stream and hold it until stopped (or refused)."""
        headers = {**self.envd, "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        async with client.stream("POST", path, content=_envelope(message), headers=headers) as response:
            chunks = response.aiter_bytes()
            first = await anext(chunks, b"")
            if len(first) > 5 and first[0] & 0x02:  # an end-of-stream frame first: refused (its share is full)
                self.refused += 1
                await asyncio.sleep(0.05)
                return
            self.answered += 1
            stopping = asyncio.ensure_future(self.stop.wait())
            reading = asyncio.ensure_future(_drain(chunks))
            await asyncio.wait({stopping, reading}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            reading.cancel()

    async def commands(self) -> None:
        start = {"process": {"cmd": "/bin/sleep", "args": ["600"]}}
        await self._until_stopped(lambda c: self._stream(c, "/process.Process/Start", start), 140)

    async def output(self) -> None:
        """Commands that print as fast as they can, their streams read to the end."""
        loud = {"process": {"cmd": "/bin/sh", "args": ["-c", "yes 0123456789abcdef0123456789abcdef | head -c 2G"]}}
        await self._until_stopped(lambda c: self._stream(c, "/process.Process/Start", loud), 2)

    async def watchers(self) -> None:
        watch = {"path": TREE, "recursive": True}
        await self._until_stopped(lambda c: self._stream(c, "/filesystem.Filesystem/WatchDir", watch), 20)

    async def _unary(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
        headers = {**self.envd, "Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        response = await client.post(path, json=body, headers=headers)
        if response.status_code == 200:
            self.answered += 1
        else:
            self.refused += 1

    async def listings(self) -> None:
        body = {"path": TREE, "depth": UINT32_MAX}
        await self._until_stopped(lambda c: self._unary(c, "/filesystem.Filesystem/ListDir", body), 8)

    async def stats(self) -> None:
        await self._until_stopped(lambda c: self._unary(c, "/filesystem.Filesystem/Stat", {"path": TREE}), 64)

    async def bodies(self) -> None:
        async def oversized(client: httpx.AsyncClient) -> None:
            chunk = b" " * (1024 * 1024)

            async def body() -> Any:
                for _ in range(20):
                    yield chunk

            response = await client.post("/execute", content=body(), headers=self.interp)
            self.refused += response.status_code == 413

        await self._until_stopped(oversized, 2)

    async def slow_heads(self) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        held: list[socket.socket] = []
        while not self.stop.is_set():
            held = [s for s in held if _open(s)]
            while len(held) < 200:
                try:
                    sock = socket.create_connection((host, int(port)), timeout=5)
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                    sock.setblocking(False)
                    held.append(sock)
                except OSError:
                    self.refused += 1
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.5)
        for sock in held:
            sock.close()

    async def transfers(self) -> None:
        upload = os.urandom(1024 * 1024) * 64

        async def up(client: httpx.AsyncClient) -> None:
            files = {"file": ("big.bin", upload)}
            response = await client.post(
                "/files", params={"path": "/home/user/big.bin"}, files=files, headers=self.envd
            )
            self.answered += response.status_code == 200

        async def down(client: httpx.AsyncClient) -> None:
            async with client.stream("GET", "/files", params={"path": "/home/user/sparse"}, headers=self.envd) as r:
                got = 0
                async for chunk in r.aiter_bytes():
                    got += len(chunk)
                    if got > 256 * 1024 * 1024 or self.stop.is_set():
                        break
            self.answered += 1

        await asyncio.gather(self._until_stopped(up, 2), self._until_stopped(down, 2))

    async def run(self, seconds: float, skip: frozenset[str]) -> dict[str, int]:
        floods = {
            "commands": self.commands,
            "output": self.output,
            "watchers": self.watchers,
            "listings": self.listings,
            "stats": self.stats,
            "bodies": self.bodies,
            "slow-heads": self.slow_heads,
            "transfers": self.transfers,
        }
        tasks = [asyncio.ensure_future(flood()) for name, flood in floods.items() if name not in skip]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        self.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"answered": self.answered, "refused": self.refused}


async def _drain(chunks: Any) -> None:
    async for _ in chunks:
        pass


def _open(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _hog_process(
    url: str, sandbox: dict[str, Any], seconds: float, skip: frozenset[str], started: Any, done: Any
) -> None:
    # the attacker's own CPU is its machine's, not the server's: on this one it must not take the cores the server
    # and the victim need, or the figure would be what two clients cost each other
    os.nice(19)

    async def main() -> None:
        hog = Hog(url, sandbox, asyncio.Event())
        started.set()
        done.put(await hog.run(seconds, skip))

    asyncio.run(main())


# the victim: the official SDK, timed


def _timed(step: Callable[[], object], n: int) -> list[float]:
    times = []
    for _ in range(n):
        began = time.perf_counter()
        step()
        times.append((time.perf_counter() - began) * 1000)
    return times


def _victim_round(victim: Any, n: int) -> tuple[list[float], list[float]]:
    payload = os.urandom(4096)

    def command() -> None:
        assert victim.commands.run("true").exit_code == 0

    def round_trip() -> None:
        victim.files.write("/home/user/v.bin", payload)
        assert victim.files.read("/home/user/v.bin", format="bytes") == payload

    return _timed(command, n), _timed(round_trip, n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="idle and flood phases each (default 3)")
    parser.add_argument("--per-round", type=int, default=30, help="victim calls of each kind per phase (default 30)")
    parser.add_argument("--flood-seconds", type=float, default=20.0, help="length of each flood phase (default 20)")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=("commands", "output", "watchers", "listings", "stats", "bodies", "slow-heads", "transfers"),
        help="leave a flood out (repeatable)",
    )
    parser.add_argument("--server-log", default="bench-tenants-serve.log", help="where the server's output goes")
    args = parser.parse_args()

    from e2b import Sandbox

    log = Path(args.server_log)
    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as tmp, _server(Path(tmp) / "ws", log) as (url, pid):
        os.environ.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": KEY})
        victim = Sandbox.create(timeout=3600)
        with httpx.Client(base_url=url, timeout=60) as control:
            made = control.post(
                "/v2/sandboxes", json={"templateID": "base", "timeout": 3600}, headers={"X-API-KEY": KEY}
            )
            hog_info = made.json()
        hog = Sandbox.connect(hog_info["sandboxID"])
        setup = (
            f'mkdir -p {TREE} && cd {TREE} && python3 -c "import os\nfor d in range(200):\n os.mkdir(str(d))\n'
            " for f in range(100): open(f'{d}/{f}', 'w').close()\" && truncate -s 1T /home/user/sparse"
        )
        hog.commands.run(setup, timeout=300)
        _victim_round(victim, 5)  # warm both paths
        before = _proc_status(pid)
        idle: tuple[list[float], list[float]] = ([], [])
        flood: tuple[list[float], list[float]] = ([], [])
        during: list[tuple[float, int]] = []
        outcomes = []
        for round_no in range(args.rounds):
            cmd, rt = _victim_round(victim, args.per_round)
            idle[0].extend(cmd)
            idle[1].extend(rt)
            started, done = multiprocessing.Event(), multiprocessing.Queue()
            proc = multiprocessing.Process(
                target=_hog_process,
                args=(url, hog_info, args.flood_seconds, frozenset(args.skip), started, done),
                daemon=True,
            )
            proc.start()
            started.wait(30)
            time.sleep(min(5.0, args.flood_seconds / 4))  # the floods reach their caps before the victim is timed
            cmd, rt = _victim_round(victim, args.per_round)
            flood[0].extend(cmd)
            flood[1].extend(rt)
            during.append(_proc_status(pid))
            outcomes.append(done.get(timeout=args.flood_seconds + 120))
            proc.join(60)
            for p in hog.commands.list():
                with contextlib.suppress(Exception):
                    hog.commands.kill(p.pid)
            print(f"round {round_no + 1}: hog {outcomes[-1]}", file=sys.stderr)
        after = _proc_status(pid)
        victim.kill()
        hog.kill()

    rows = []
    for what, base, loaded in (
        ("commands.run('true')", idle[0], flood[0]),
        ("file round trip 4 KiB", idle[1], flood[1]),
    ):
        b, f = statistics.median(base), statistics.median(loaded)
        rows.append((what, b, f, f / b))
    print(f"{'victim call':<24} {'idle p50 ms':>12} {'flooded p50 ms':>15} {'ratio':>7}  target ≤ 2×")
    for what, b, f, ratio in rows:
        print(f"{what:<24} {b:>12.2f} {f:>15.2f} {ratio:>6.2f}×  {'PASS' if ratio <= 2 else 'MISS'}")
    print(
        f"server RSS MiB / fds: before {before[0]:.0f} / {before[1]}, during "
        f"{', '.join(f'{r:.0f} / {n}' for r, n in during)}, after {after[0]:.0f} / {after[1]}"
    )
    print(f"hog requests per flood: {outcomes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
