"""`execspace serve` templates (issue 15, item 2): what a CPU quota gives a busy sandbox, and what a template costs a
create, each against ``base`` (no quota, the host's dirs) in the same server, interleaved.

    python bench/bench_templates.py [--rounds 3] [--creates 10]

One server with three templates of its own (``half``: ``cpu_count = 0.5``, ``tenth``: ``cpu_count = 0.1``, ``disk``:
``disk_mb = 1024``), serve's pools off (every create makes its workspace then), the official ``e2b`` SDK as the
client. Rows:

* the CPU two busy processes of one sandbox get over 3 s of wall time (CPUs: CPU seconds per wall second), per
  template: ``base`` is what the host gives without a quota (less than 2 when other work competes);
* create + the first ``commands.run('true')``, per template: ``code-interpreter-v1`` runs in its environment (it
  must be built: ``execspace env build code-interpreter``), ``tenth`` under its quota, ``disk`` on a 1 GiB filesystem
  of its own (its image made, formatted and mounted by the create, its session started then: a disk-bounded engine
  keeps no sessions started ahead, where the others take one of the sandbox backend's).
Not in ``run_all.py``; its numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import e2b

from execspace.testing.binding import make_traversable

KEY = "e2b_" + "0123456789abcdef" * 2
CONFIG = "[templates.half]\ncpu_count = 0.5\n[templates.tenth]\ncpu_count = 0.1\n[templates.disk]\ndisk_mb = 1024\n"
BUSY = (
    'python3 -c "import os, time\nw = time.monotonic()\nfor _ in range(2):\n    if os.fork() == 0:\n'
    "        while time.monotonic() - w < 3: pass\n        os._exit(0)\nos.wait(); os.wait()\nt = os.times()\n"
    'print((t.children_user + t.children_system) / (time.monotonic() - w))"'
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="busy-loop rounds per template")
    parser.add_argument("--creates", type=int, default=10, help="creates per template")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-templates-") as tmp:
        root = Path(tmp)
        make_traversable(root)
        (root / "serve.toml").write_text(CONFIG)
        argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", KEY, "--pool-size", "0"]
        argv += ["--workspace-root", str(root / "ws"), "--config", str(root / "serve.toml")]
        env = {**os.environ, "EXECSPACE_DAEMON": "off"}
        server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        try:
            _measure(_url(server), args.rounds, args.creates)
        finally:
            server.terminate()
            server.wait(30)


def _url(server: subprocess.Popen[bytes]) -> str:
    assert server.stdout is not None
    for line in server.stdout:
        found = re.search(rb"listening on (\S+)", line)
        if found:
            return found.group(1).decode()
    raise RuntimeError("execspace serve did not start")


def _measure(url: str, rounds: int, creates: int) -> None:
    sdk = {"api_key": KEY, "api_url": url, "sandbox_url": url}
    print("load at start:", os.getloadavg())
    cpus: dict[str, list[float]] = {"base": [], "half": [], "tenth": []}
    made: dict[str, list[float]] = {"base": [], "code-interpreter-v1": [], "tenth": [], "disk": []}
    for template in made:  # each template's engine opens on its first create: untimed
        e2b.Sandbox.create(template=template, **sdk).kill()
    for _ in range(rounds):
        for template, seen in cpus.items():
            sandbox = e2b.Sandbox.create(template=template, **sdk)
            seen.append(float(sandbox.commands.run(BUSY, timeout=60).stdout))
            sandbox.kill()
    for _ in range(creates):
        for template, seen in made.items():
            started = time.perf_counter()
            sandbox = e2b.Sandbox.create(template=template, **sdk)
            sandbox.commands.run("true")
            seen.append((time.perf_counter() - started) * 1000)
            sandbox.kill()
    print("load at end:", os.getloadavg())
    for template, seen in cpus.items():
        print(f"busy loop, {template}: {', '.join(f'{c:.3f}' for c in seen)} CPUs")
    for template, seen in made.items():
        p90 = statistics.quantiles(seen, n=10)[-1]
        print(f"create + first command, {template}: median {statistics.median(seen):.1f} ms, p90 {p90:.1f} ms")


if __name__ == "__main__":
    main()
