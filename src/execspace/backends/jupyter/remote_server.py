"""Start a Jupyter Server or Kernel Gateway on this host for remote mode, locked down, and stop it cleanly.

The server listens on 127.0.0.1 only, on a free port, and requires a fresh token of 256 random
bits (``secrets.token_urlsafe(32)``). The token reaches the server through a config file in a
private (0700) directory, never through argv (visible to every user in ``ps``) or the environment
(inherited by every kernel). User config is not read (``JUPYTER_CONFIG_DIR`` points at an empty
private directory) and our config file is loaded last, so a stray ``c.IdentityProvider.token = ''``
cannot open the server; once up, a request without the token must be refused or the server is
stopped and :class:`~execspace.errors.SetupFailed` raised. No browser, no terminals, no password.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from asyncio.subprocess import Process
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from ...envpolicy import EnvPolicy
from ...errors import ExecspaceError, SetupFailed, UsageError
from .serverapi import ServerApi

__all__ = ["LocalServer", "ServerKind", "start_local_server"]

ServerKind = Literal["server", "gateway"]

#: module to run, its app class (config section), pip package
_APPS: dict[str, tuple[str, str, str]] = {
    "server": ("jupyter_server", "ServerApp", "jupyter_server"),
    "gateway": ("kernel_gateway", "KernelGatewayApp", "jupyter_kernel_gateway"),
}
_STOP_GRACE = 10.0


@dataclass(frozen=True, slots=True)
class LocalServer:
    """A running server started by :func:`start_local_server`."""

    url: str
    token: str = field(repr=False)
    root_dir: Path
    kind: ServerKind
    pid: int
    log_path: Path
    """The server's own log (stdout and stderr), in a private directory removed at shutdown."""


@contextlib.asynccontextmanager
async def start_local_server(
    root_dir: Path | str,
    *,
    kind: ServerKind = "server",
    env_policy: EnvPolicy | None = None,
    startup_timeout: float = 30.0,
    certfile: str | None = None,
    keyfile: str | None = None,
    ca_file: str | None = None,
    wrapper: Sequence[str] = (),
) -> AsyncIterator[LocalServer]:
    """Run a Jupyter Server (``kind="server"``) or Kernel Gateway (``"gateway"``) for the ``async with`` block.

    Kernels started by the server inherit its environment, which is built by ``env_policy`` (host secrets
    are not passed on). Leaving the block shuts the server and its kernels down. With ``certfile`` and
    ``keyfile`` the server speaks https only; ``ca_file`` is what we trust to check it while it starts
    (a self-signed certificate is its own CA). ``wrapper`` is an argv prefix the server runs under (another
    user with ``sudo -u``, its own mount namespace…); it must keep the server's stdio and environment.

    Raises:
        SetupFailed: the package is not installed, or the server did not come up (the message quotes its log).
    """
    module, _, package = _APPS[kind]
    if importlib.util.find_spec(module) is None:
        raise SetupFailed("jupyter", f"{package} is not installed", f"pip install {package}")
    if (certfile is None) != (keyfile is None):
        raise UsageError("pass both certfile and keyfile for https, or neither")
    tls = {"certfile": certfile, "keyfile": keyfile} if certfile and keyfile else {}
    files = _prepare(Path(root_dir), kind, env_policy or EnvPolicy(), tls, ca_file)
    try:
        server, proc = await _launch(files, kind, startup_timeout, tuple(wrapper))
        try:
            yield server
        finally:
            await _stop(proc)
    finally:
        files.log.close()
        shutil.rmtree(files.private, ignore_errors=True)


@dataclass(slots=True)
class _Files:
    root: Path
    private: Path
    """0700 directory: config (with the token), Jupyter's config and runtime dirs, the server's log."""
    config: Path
    env: dict[str, str]
    token: str
    log: IO[bytes]
    scheme: str
    ca_file: str | None


def _prepare(
    root_dir: Path, kind: ServerKind, env_policy: EnvPolicy, tls: dict[str, str], ca_file: str | None
) -> _Files:
    token = secrets.token_urlsafe(32)
    root = root_dir.resolve()
    private = Path(tempfile.mkdtemp(prefix="execspace-jupyter-server-"))
    config = private / "config.json"
    _write_private(config, json.dumps(_config(kind, token, root, tls)))
    env = _server_env(env_policy, private)
    log = open(private / "server.log", "ab")  # noqa: SIM115 - closed with the server
    return _Files(root, private, config, env, token, log, "https" if tls else "http", ca_file)


async def _launch(
    files: _Files, kind: ServerKind, startup_timeout: float, wrapper: tuple[str, ...]
) -> tuple[LocalServer, Process]:
    module, app, _ = _APPS[kind]
    log_path = files.private / "server.log"
    deadline = time.monotonic() + startup_timeout
    # a free port can be taken between our probe and the server's bind (port_retries=0 makes it exit): retry
    for _ in range(3):
        port = _free_port()
        proc = await asyncio.create_subprocess_exec(
            *[*wrapper, sys.executable, "-m", module, f"--config={files.config}", f"--{app}.port={port}"],
            cwd=files.root,
            env=files.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=files.log,
            stderr=files.log,
        )
        url = f"{files.scheme}://127.0.0.1:{port}"
        server = LocalServer(url, files.token, files.root, kind, proc.pid, log_path)
        try:
            ready = await _wait_ready(server, proc, deadline, files.ca_file)
            if ready:
                await _check_locked(server, files.ca_file)
                return server, proc
        except BaseException:
            await _stop(proc)
            raise
        await _stop(proc)
        if time.monotonic() >= deadline:
            break
    raise SetupFailed("jupyter", f"the jupyter {kind} did not start: {_tail(log_path)}", "see the log above")


def _config(kind: ServerKind, token: str, root: Path, tls: dict[str, str]) -> dict[str, Any]:
    common = {"ip": "127.0.0.1", "port_retries": 0, "answer_yes": True, **tls}
    restarter = {
        # how often the server checks that a kernel is alive (3 s by default): a dead kernel is reported sooner
        "KernelRestarter": {"time_to_dead": 1.0},
        # how long DELETE waits for a kernel to stop by itself before killing it (5 s by default): a timed-out
        # cell that ignores SIGINT would otherwise hold its replaced kernel's CPU that long
        "KernelManager": {"shutdown_wait_time": 2.0},
    }
    if kind == "gateway":
        return {"KernelGatewayApp": {**common, "auth_token": token}, **restarter}
    return {
        **restarter,
        "ServerApp": {
            **common,
            "root_dir": str(root),
            "open_browser": False,
            "terminals_enabled": False,
            "allow_remote_access": False,
            "allow_root": os.geteuid() == 0,  # jupyter refuses root unless told; CI runs as root
            "password_required": False,
        },
        "IdentityProvider": {"token": token},
        "PasswordIdentityProvider": {"hashed_password": "", "allow_password_change": False},
    }


def _server_env(env_policy: EnvPolicy, private: Path) -> dict[str, str]:
    env = env_policy.build(os.environ, {}, {})
    for name in ("config", "runtime"):
        (private / name).mkdir(mode=0o700)
    # user config could weaken the server (token, ip); the runtime dir gets the server's info file
    env.update(
        {
            "JUPYTER_CONFIG_DIR": str(private / "config"),
            "JUPYTER_RUNTIME_DIR": str(private / "runtime"),
            "HOME": env.get("HOME", str(private)),
        }
    )
    return env


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_ready(server: LocalServer, proc: Process, deadline: float, ca_file: str | None) -> bool:
    """True once the server answers an authenticated request; False if it exited (e.g. port taken) or timed out."""
    api = ServerApi(server.url, server.token, ca_file=ca_file, request_timeout=2.0)
    try:
        while time.monotonic() < deadline and proc.returncode is None:
            with contextlib.suppress(ExecspaceError):
                await api.kernelspecs()
                return True
            await asyncio.sleep(0.1)
    finally:
        api.close()
    return False


async def _check_locked(server: LocalServer, ca_file: str | None) -> None:
    """Fail closed if the server answers without the token (a config we did not expect opened it)."""
    api = ServerApi(server.url, "", ca_file=ca_file, request_timeout=5.0)
    try:
        status = await api.status_without_token()
    finally:
        api.close()
    if status not in (401, 403):
        raise SetupFailed(
            "jupyter",
            f"the jupyter {server.kind} answered a request without a token (HTTP {status}); it was stopped",
            "check the system-wide Jupyter config (jupyter --paths) for settings that disable authentication",
        )


async def _stop(proc: Process) -> None:
    """SIGTERM lets the server shut its kernels down (they run in their own sessions); SIGKILL if it hangs."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), _STOP_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    await proc.wait()


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return "(no log)"
    return data.decode("utf-8", "replace").strip() or "(empty log)"
