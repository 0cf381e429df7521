"""What serve --ray costs the single-host server (nothing: no Ray imported), how a front door that cannot join
its cluster says so, and what --max-sandboxes takes with and without it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def test_the_single_host_server_and_cli_never_import_ray() -> None:
    code = "import sys, execspace.server, execspace.cli.serve, execspace.cli.main; print('ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.timeout(60)
def test_a_front_door_whose_cluster_does_not_answer_fails_naming_the_address() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"  # nothing listens there
        argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--ray", address]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=45)
    assert done.returncode == 125  # SetupFailed
    assert f"cannot join the Ray cluster at {address}" in done.stderr, done.stderr[-2000:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--max-sandboxes", "0"], "max_sandboxes must be at least 1, got 0"),  # one host: as before
        (["--max-sandboxes", "-1", "--ray", "127.0.0.1:1"], "with --ray is the slots of a node"),
    ],
)
def test_max_sandboxes_takes_zero_only_as_a_front_doors_default(argv: list[str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "execspace", "serve", "--port", "0", *argv], capture_output=True, text=True, timeout=45
    )
    assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]
