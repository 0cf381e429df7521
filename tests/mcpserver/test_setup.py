"""A failed set-up of ``execspace mcp`` exits non-zero with an execspace error and leaves nothing: no
workspace, no listening port."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from execspace.cli.console import EXIT_EXECSPACE_ERROR
from execspace.cli.main import main
from execspace.registry import choose_default_backend
from execspace.testing.processes import read_until

from .conftest import left_in, server_env, stop, write_config

pytest.importorskip("mcp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("extra", "flags", "message"),
    [
        ("", ["--backend", "no-such-backend"], "unknown backend 'no-such-backend'"),
        ("idle_timout = 5", [], "unknown key idle_timout; the top level takes backend, backend_options, policy, "),
        ("idle_timeout = -1", [], "idle_timeout must be a positive number"),
        (
            'backend = "sandbox"\n[policy]\nmemory_bytes = "lots"',
            [],
            "policy.memory_bytes must be an integer, not a string",
        ),
        ("not toml [", [], "is not valid TOML"),
    ],
)
def test_a_bad_backend_or_config_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, flags: list[str], message: str
) -> None:
    config = write_config(tmp_path, extra)
    port = _free_port()
    argv = ["mcp", "--transport", "http", "--port", str(port), "--config", str(config), *flags]
    assert main(argv) == EXIT_EXECSPACE_ERROR
    assert message in capsys.readouterr().err
    assert not _listening(port)
    assert left_in(tmp_path / "ws") == []


def test_a_backend_option_it_does_not_take_fails_after_the_bind_and_releases_the_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, 'backend = "sandbox"\n[backend_options]\nno_such_option = 1')
    # two [backend_options] tables are not TOML: write the file whole
    root = tmp_path / "ws"
    config.write_text(f'backend = "sandbox"\n[backend_options]\nworkspace_root = "{root}"\nno_such_option = 1\n')
    port = _free_port()
    assert main(["mcp", "--transport", "http", "--port", str(port), "--config", str(config)]) == EXIT_EXECSPACE_ERROR
    assert "no_such_option" in capsys.readouterr().err
    assert not _listening(port)
    assert left_in(root) == []


def test_a_port_in_use_is_a_clear_error_before_any_workspace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert (
            main(["mcp", "--transport", "http", "--port", str(port), "--config", str(config)]) == EXIT_EXECSPACE_ERROR
        )
    err = capsys.readouterr().err
    assert f"execspace mcp cannot start: port {port} on 127.0.0.1 is in use" in err and "--port" in err
    assert "backend 'mcp'" not in err  # the server is no backend
    assert left_in(tmp_path / "ws") == []


def test_the_ready_line_names_the_backend_chosen(tmp_path: Path) -> None:
    """Without a backend named, the server said "(backend auto)": it names the one it opened."""
    argv = [sys.executable, "-m", "execspace", "mcp", "--transport", "http", "--port", "0"]
    argv += ["--config", str(write_config(tmp_path))]
    env = {**server_env(), "EXECSPACE_MCP_TOKEN": "t" * 32}
    with subprocess.Popen(argv, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env) as process:
        try:
            assert process.stderr is not None
            found, seen = read_until(process.stderr, rb"streamable HTTP on \S+ \(backend (\S+)\)", 60)
        finally:
            stop(process)
    assert found is not None, seen
    assert found.group(1).decode() == asyncio.run(choose_default_backend())


def test_a_failure_once_the_engine_is_open_closes_it_and_releases_the_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, 'backend = "sandbox"\n[policy]\nallow_commands = [""]')
    port = _free_port()
    status = main(["mcp", "--transport", "http", "--port", str(port), "--config", str(config)])
    err = capsys.readouterr().err
    assert status == EXIT_EXECSPACE_ERROR, err
    assert "allow entries must be non-empty" in err
    assert not _listening(port)
    assert left_in(tmp_path / "ws") == []


@pytest.mark.parametrize(
    ("config", "flags", "message"),
    [
        (
            'backend = "jupyter"\n[backend_options]\nmode = "sandboxd"',
            [],
            "'sandboxd' is not a kernel mode; name one of",
        ),
        (
            'backend = "jupyter"\n[backend_options]\nmode = "host"\nenvironment = "code-interpreter"',
            [],
            "environment='code-interpreter' runs sandboxed kernels in that environment, but mode=HostKernels",
        ),
        ("", ["--backend", "local", "--environment", "code-interpreter"], "--environment belongs to the sandbox"),
    ],
)
def test_a_kernel_mode_or_environment_the_backend_cannot_take_exits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, flags: list[str], message: str
) -> None:
    """A config a stdio client would only see as "Connection closed": the server refuses it before serving."""
    pytest.importorskip("jupyter_client", reason="the jupyter backend checks its options once it imports")
    path = tmp_path / "mcp.toml"
    path.write_text(config + "\n")
    assert main(["mcp", "--config", str(path), *flags]) == EXIT_EXECSPACE_ERROR
    assert message in capsys.readouterr().err
