"""The jupyter backend's default fails closed: where its kernels cannot be sandboxed, opening fails with the fix;
kernels run on the host only when the caller names that mode (issue 12, point 1).

Each case runs the CLI in a child process, as a user would, with code that prints whether it sees a file the
sandbox never shows: a host kernel would see it."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytest.importorskip("ipykernel")

PROBE = "import os; print('SECRET-VISIBLE' if os.path.exists({secret!r}) else 'hidden')"


def _exec_code(
    python: str, secret: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    code = PROBE.format(secret=str(secret))
    return subprocess.run(
        [python, "-m", "execspace", "exec-code", "--backend", "jupyter", *extra, "-"],
        input=code,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    f = tmp_path / "private" / "secret.txt"
    f.parent.mkdir(mode=0o700)
    f.write_text("host-only\n")
    return f


def test_without_bubblewrap_the_default_refuses_and_names_the_host_mode(secret: Path, tmp_path: Path) -> None:
    empty = tmp_path / "no-bwrap-here"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "XDG_CACHE_HOME": str(tmp_path / "cache")}  # no cached probe
    r = _exec_code(sys.executable, secret, env=env)
    assert "SECRET-VISIBLE" not in r.stdout
    assert r.returncode == 125, r.stdout + r.stderr
    assert "cannot sandbox kernels" in r.stderr and "--kernels host" in r.stderr
    # named by the caller, host kernels run (and say they are not isolated)
    named = _exec_code(sys.executable, secret, "--kernels", "host", env=env)
    assert named.returncode == 0, named.stderr
    assert named.stdout.strip() == "SECRET-VISIBLE" and "WITHOUT isolation" in named.stderr


def test_an_environment_under_a_private_directory_never_runs_kernels_on_the_host(secret: Path, tmp_path: Path) -> None:
    """A venv in a 0700 directory (a venv under /root, say) whose packages a .pth finds elsewhere: as root the
    sandbox shows the venv (a view, see test_jupyter_sandbox.py) but not where its .pth points, which the sandbox's
    uid cannot read, so opening fails with the fix; as a normal user the sandbox runs as the user and the kernel
    starts sandboxed. Either way the kernel never sees the host's files."""
    env_dir = secret.parent / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = next((env_dir / "lib").glob("python*/site-packages"))
    # this test run's packages (execspace, ipykernel) through a .pth, as a venv with them installed would have them
    ours = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (site / "execspace-test.pth").write_text("\n".join([*ours, str(Path(__file__).parents[2] / "src")]) + "\n")
    python = str(env_dir / "bin" / "python")
    r = _exec_code(python, secret, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert "SECRET-VISIBLE" not in r.stdout
    if os.geteuid() == 0:
        assert r.returncode == 125, r.stdout + r.stderr
        assert "not readable by the sandbox uid" in r.stderr and "every parent directory" in r.stderr
    else:
        assert r.returncode in (0, 125), r.stdout + r.stderr
        assert r.stdout.strip() == "hidden" if r.returncode == 0 else "cannot sandbox kernels" in r.stderr
