"""A bare HTTP loop for benchmark 7's baselines: uvicorn configured as ``execspace serve`` configures it, whose
only app answers ``POST /sandboxes`` and ``POST /v2/sandboxes`` with a fixed 201 body of the shape the SDK reads
(and ``DELETE`` with 204), doing nothing else. The official SDK's creates against it cost what the client and the
HTTP stack cost on this machine: the floor under ``execspace serve``'s own creates, measured in the same run.

Run as ``python bench/stub_e2b_api.py``; it prints ``listening on http://127.0.0.1:PORT`` once it listens.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from typing import Any

import uvicorn

_ids = itertools.count()


def _created() -> bytes:
    return json.dumps(
        {
            "templateID": "base",
            "sandboxID": f"stub{next(_ids):016x}",
            "alias": "base",
            "clientID": "execspace",
            "envdVersion": "0.5.7",
            "envdAccessToken": "t" * 32,
            "trafficAccessToken": None,
            "domain": None,
        }
    ).encode()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["method"] == "POST" and scope["path"] in ("/sandboxes", "/v2/sandboxes"):
        status, body = 201, _created()
    elif scope["method"] == "DELETE":
        status, body = 204, b""
    else:
        status, body = 404, b'{"code":404,"message":"stub"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Server(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        print(f"listening on http://{host}:{port}", flush=True)


if __name__ == "__main__":
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning", access_log=False)
    asyncio.run(_Server(config).serve())
