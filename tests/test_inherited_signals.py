"""A host that ignores SIGINT and SIGQUIT (started under ``nohup``, or as a background job of a script) does not hand
that on: every backend's programs start with them at their defaults, so a ``trap ... INT`` and an interrupt work."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execspace import RunProgramSpec
from execspace.backends.sandbox.bwrap import find_bwrap
from execspace.engine import open_engine_from

MODES: list[tuple[str, dict[str, Any]]] = [("local", {}), ("sandbox", {}), ("sandbox", {"mode": "session"})]


@pytest.fixture
def host_ignores_interrupts() -> Iterator[None]:
    before = [signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)]
    try:
        yield
    finally:
        for sig, handler in zip((signal.SIGINT, signal.SIGQUIT), before, strict=True):
            signal.signal(sig, handler)


def _ignored(status: str) -> int:
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)


@pytest.mark.parametrize(("backend", "options"), MODES, ids=["local", "sandbox", "sandbox-session"])
async def test_a_program_of_a_host_that_ignores_interrupts_takes_them(
    backend: str, options: dict[str, Any], tmp_path: Path, host_ignores_interrupts: None
) -> None:
    if backend == "sandbox" and find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    async with open_engine_from(backend, options) as engine:  # the default root: the sandbox uid reaches it
        ws = await engine.manager.create_workspace(f"signals/{tmp_path.name}")
        r = await engine.runner.run_program(ws, RunProgramSpec("cat", ["/proc/self/status"]))
        assert r.exit_code == 0, r.stderr
        mask = _ignored(r.stdout)
        assert not mask & (1 << (signal.SIGINT - 1)) and not mask & (1 << (signal.SIGQUIT - 1)), hex(mask)
        trapped = await engine.runner.run_program(
            ws, RunProgramSpec("sh", ["-c", 'trap "echo caught" INT; kill -INT $$; echo after'])
        )
        assert trapped.stdout == "caught\nafter\n", trapped
        await engine.manager.cleanup(ws)
