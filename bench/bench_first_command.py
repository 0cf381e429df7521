"""A serve sandbox's first command after its create, and ``pip install`` of a local wheel in it (issue 30), through
the official SDK against ``execspace serve`` (machine mode where the host can: as root on Linux), in the
``code-interpreter-v1`` template (its runtime environment is where pip installs: the host's own python is PEP 668's).

    python bench/bench_first_command.py [--rounds 15]

Each round creates a sandbox once the template's pool is full (as deployed: a create takes a ready one), times
its first ``commands.run('true')`` and then a second one (the baseline: the same call once the sandbox is warm),
uploads a one-module wheel and times ``pip install --no-index --no-deps`` of it; the same wheel installed by the
host's own ``python3 -m pip`` into a fresh directory (``--target``) is that step's baseline, in the same round. Not
part of ``./run bench``: it builds a sandbox per round.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import statistics
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import httpx

from bench_core import scratch_dir
from bench_serve import CODE_TEMPLATE, KEY, _server
from execspace.testing.binding import make_traversable

_WHEEL = "benchpkg-1.0-py3-none-any.whl"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel() -> bytes:
    """A wheel of one module, made here (no build step, no index)."""
    files = {
        "benchpkg/__init__.py": b"VALUE = 42\n",
        "benchpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: benchpkg\nVersion: 1.0\n",
        "benchpkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [_record_line(n, d) for n, d in files.items()] + ["benchpkg-1.0.dist-info/RECORD,,"]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("benchpkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return out.getvalue()


def _host_install(wheel: Path) -> float:
    with tempfile.TemporaryDirectory(prefix="execspace-bench-pip-") as target:
        argv = ["/usr/bin/python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", target]
        start = time.perf_counter()
        subprocess.run([*argv, str(wheel)], check=True, capture_output=True)
        return time.perf_counter() - start


def _line(name: str, lib: list[float], base: list[float], base_label: str) -> str:
    a, b = statistics.median(lib) * 1000, statistics.median(base) * 1000
    return f"| {name} | {a:.1f} ms | {b:.1f} ms ({base_label}) | {a / b:.2f}× |"


def _pool_full(http: httpx.Client, within: float = 120.0) -> None:
    """Until the template's pool holds what it keeps (as a server between bursts has it)."""
    deadline = time.monotonic() + within
    while (pool := http.get("/execspace/pool").json()[CODE_TEMPLATE])["ready"] < pool["target"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not fill within {within:g} s: {pool}")
        time.sleep(0.05)


def _rounds(url: str, rounds: int, local: Path, wheel: bytes, *out: list[float]) -> None:
    from e2b import Sandbox

    first, warm, pip, host_pip = out
    local.write_bytes(wheel)
    http = httpx.Client(base_url=url, headers={"X-API-KEY": KEY})
    for _ in range(rounds):
        _pool_full(http)
        sbx = Sandbox.create(CODE_TEMPLATE, api_url=url, sandbox_url=url, api_key=KEY)
        try:
            start = time.perf_counter()
            sbx.commands.run("true")
            first.append(time.perf_counter() - start)
            start = time.perf_counter()
            sbx.commands.run("true")
            warm.append(time.perf_counter() - start)
            sbx.files.write(f"/tmp/{_WHEEL}", wheel)
            start = time.perf_counter()
            sbx.commands.run(f"pip install -q --no-index --no-deps /tmp/{_WHEEL}")
            pip.append(time.perf_counter() - start)
            imported = sbx.commands.run("python3 -c 'import benchpkg; print(benchpkg.VALUE)'")
            assert imported.stdout.strip() == "42", imported.stderr
        finally:
            sbx.kill()
        host_pip.append(_host_install(local))
    pool = http.get("/execspace/pool").json()[CODE_TEMPLATE]
    print(f"{pool['taken']} creates took a pooled sandbox, {pool['missed']} found none")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    rounds = ap.parse_args().rounds
    wheel = _wheel()
    first, warm, pip, host_pip = [], [], [], []
    with scratch_dir("execspace-bench-first-") as root:
        make_traversable(root)  # as root, each sandbox's own uid must reach its workspace
        with _server(root / "ws", 20, 2) as (url, _):
            _rounds(url, rounds, root / _WHEEL, wheel, first, warm, pip, host_pip)
    print("| step | serve | baseline (same rounds) | ratio |")
    print("|---|---|---|---|")
    print(_line("first commands.run('true') after create", first, warm, "a second commands.run('true')"))
    print(_line("pip install of a local wheel", pip, host_pip, "the host's pip --target, no sandbox"))


if __name__ == "__main__":
    main()
