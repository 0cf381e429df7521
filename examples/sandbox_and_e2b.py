"""The same agent on two backends: the local sandbox, then the e2b backend against `execspace serve`.

    python examples/sandbox_and_e2b.py               # the scripted model; starts `execspace serve` on a free port

Nothing in the agent changes: only the engine it is given. On E2B's cloud or Cube Sandbox, pass their api_url
and api_key (E2B_API_URL / E2B_API_KEY) to open_engine("e2b", ...) instead of the local server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from analyse_csv import analyse, parser


@contextlib.contextmanager
def local_e2b_server() -> Iterator[tuple[str, str]]:
    """``execspace serve`` on a free port: its URL and API key."""
    key = "e2b_" + secrets.token_hex(20)
    with tempfile.TemporaryDirectory(prefix="serve-") as root:
        argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", key, "--workspace-root", root]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as server:
            yield from _until_stopped(server, key)


def _until_stopped(server: subprocess.Popen[str], key: str) -> Iterator[tuple[str, str]]:
    try:
        assert server.stdout is not None
        for line in server.stdout:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                yield found.group(1), key
                return
        raise SystemExit("execspace serve did not start")
    finally:
        server.terminate()
        server.wait(timeout=30)


async def main() -> int:
    args = parser().parse_args()
    on_sandbox = await analyse(args, "sandbox")
    with local_e2b_server() as (url, key):
        on_e2b = await analyse(args, "e2b", api_url=url, sandbox_url=url, api_key=key)
    print(f"\nsandbox: {on_sandbox}\ne2b:     {on_e2b}")
    return 0 if on_sandbox and on_e2b else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
