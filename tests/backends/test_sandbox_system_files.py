"""``system_files``: a sandbox shows its own read-only version of a system file (``execspace serve`` gives its login
shells a ``/etc/profile`` so), per run and in session mode; the host's file stays as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.errors import InvalidSpec
from execspace.registry import probe_backend
from tests.support import make_traversable

OURS = "# the sandbox's own profile\nexport FROM_PROFILE=yes\n"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "path",
    ["etc/profile", "/home/x/.profile", "/etc/../etc/profile", "/etc", "/etc/no-such-file-here", "/workspace/x"],
)
async def test_a_replacement_outside_the_system_or_for_no_file_is_refused(path: str) -> None:
    with pytest.raises(InvalidSpec, match="system_files"):
        async with execspace.open_engine("sandbox", system_files=((path, OURS),)):
            pass


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["per-run", "session"])
async def test_programs_read_the_replacement_and_cannot_change_it(tmp_path: Path, mode: str) -> None:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("no working sandbox here")
    host_before = Path("/etc/profile").read_bytes()
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "sandbox", mode=mode, workspace_root=tmp_path / "ws", system_files=(("/etc/profile", OURS),)
    ) as eng:
        ws = await eng.manager.create_workspace("sf")
        script = 'cat /etc/profile; echo "login:$FROM_PROFILE"; echo x >> /etc/profile && echo WROTE'
        r = await eng.runner.run_program(ws, RunProgramSpec("/bin/bash", ["-l", "-c", script]))
    assert r.stdout == OURS + "login:yes\n", r.stderr
    assert "Read-only file system" in r.stderr and r.exit_code != 0
    assert Path("/etc/profile").read_bytes() == host_before
