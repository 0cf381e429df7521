"""The ``sandbox`` backend: programs run on this host inside an OS sandbox.

Linux: bubblewrap (see :mod:`.bwrap` for the exact boundary). macOS (Seatbelt)
and Windows are not supported yet and fail closed with ``UnsupportedBackend``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from ...capabilities import Capabilities, Isolation
from ...engine import BaseEngine
from ...envpolicy import MINIMAL_PATH, EnvPolicy
from ...errors import SetupFailed, UnsupportedBackend
from ...languages import available_languages
from ...models import Workspace
from ...process.hostrunner import HostRunner, Prepared
from ...process.rlimits import RLIMIT_ENFORCED
from ...process.supervisor import Launch
from ...registry import Probe
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root
from ...workspace.layout import LAYOUT_DIRS
from .bwrap import SANDBOX_WORKSPACE, BwrapConfig, build_argv, find_bwrap, sandbox_uid, visible_path_entries

__all__ = ["SandboxBackend"]

DOES_NOT_PROTECT = (
    "kernel vulnerabilities: the boundary is Linux namespaces; a kernel exploit escapes it",
    "reading world-readable host system files (/usr, /etc…) that are bound read-only",
    "with network on: anything reachable from this host, including services on other hosts",
    "no seccomp filter yet: unusual syscalls are limited only by namespaces and dropped capabilities",
    "CPU and memory limits are per-process rlimits; several processes can each use the limit",
)


def _is_root() -> bool:
    return os.geteuid() == 0


class SandboxRunner(HostRunner):
    """A HostRunner that wraps each program in bubblewrap."""

    def __init__(self, bwrap: str, *, network_default: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bwrap = bwrap
        self.network_default = network_default

    def program_root(self, ws: Workspace) -> str:
        return SANDBOX_WORKSPACE

    def resolve_program(self, cmd: str, path: str, cwd: str) -> str | None:
        # the lookup must see what the sandbox sees: no /root, /home… entries
        if "/" in cmd:
            return cmd
        return super().resolve_program(cmd, visible_path_entries(path) or MINIMAL_PATH, cwd)

    def wrap(self, prep: Prepared) -> Launch:
        network = self.network_default if prep.spec.network is None else prep.spec.network == "on"
        env = dict(prep.env)
        env["PATH"] = visible_path_entries(env["PATH"]) or MINIMAL_PATH
        cfg = BwrapConfig(self.bwrap, network=network, host_home=os.environ.get("HOME"))
        cwd_rel = os.path.relpath(prep.host_cwd, prep.root)
        argv = build_argv(cfg, prep.root, "" if cwd_rel == "." else cwd_rel, prep.argv, as_root_host=_is_root())
        launch = self._launch(prep, argv, env, str(prep.root))
        if _is_root():
            uid = sandbox_uid(prep.root)
            launch.user, launch.group = uid, uid
            launch.preexec_fn = _with_nproc(launch.preexec_fn, prep.spec.limits.pids)
        return launch


def _with_nproc(inner: Any, pids: int | None) -> Any:
    if pids is None:
        return inner

    def apply() -> None:
        import resource

        if inner is not None:
            inner()
        # the uid is unique to this workspace, so NPROC counts only its processes
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))

    return apply


def _chown_layout(uid: int) -> Any:
    def prepare(ws_dir: Path) -> None:
        os.chown(ws_dir, uid, uid)
        for d in LAYOUT_DIRS:
            os.chown(ws_dir / d, uid, uid)

    return prepare


class SandboxBackend:
    name = "sandbox"

    @classmethod
    async def probe(cls, *, bwrap: str | None = None, **options: Any) -> Probe:
        if sys.platform == "darwin":
            return Probe(False, "the macOS (Seatbelt) sandbox is not implemented yet", "use --backend container")
        if not sys.platform.startswith("linux"):
            return Probe(False, f"no OS sandbox for {sys.platform}", "use the container or e2b backend")
        path = find_bwrap(bwrap)
        if path is None:
            return Probe(False, "bubblewrap (bwrap) is not installed", "apt-get install bubblewrap")
        return await asyncio.to_thread(_probe_boundary, path)

    @classmethod
    def capabilities(cls, env_policy: EnvPolicy | None = None, network_default: bool = False) -> Capabilities:
        host_path = (env_policy or EnvPolicy()).build(os.environ, {}, {})["PATH"]
        limits = {"timeout", "output_bytes", "disk_bytes"} | RLIMIT_ENFORCED
        if _is_root():
            limits.add("pids")
        return Capabilities(
            backend="sandbox",
            isolation=Isolation.PROCESS,
            network_control=True,
            network_default=network_default,
            clean_env=True,
            read_only_mounts=True,
            streaming=True,
            host_paths=True,
            enforced_limits=frozenset(limits),
            languages=available_languages(visible_path_entries(host_path) or MINIMAL_PATH),
            does_not_protect=DOES_NOT_PROTECT,
            details={
                "boundary": "bubblewrap: user/pid/ipc/uts/net namespaces, read-only system dirs, "
                "no host /home /root /run",
                "uid": "per-workspace unprivileged uid" if _is_root() else "your uid, without capabilities",
                "pids": "RLIMIT_NPROC of the per-workspace uid" if _is_root() else "not enforced (not root)",
            },
        )

    @classmethod
    async def open(
        cls,
        *,
        workspace_root: Path | str | None = None,
        env_policy: EnvPolicy | None = None,
        host_roots: Any = (),
        artifacts: Any = None,
        network: bool = False,
        bwrap: str | None = None,
        kill_grace: float = 2.0,
    ) -> BaseEngine:
        """Open a sandbox engine; raise ``SetupFailed`` (cause and fix) if the boundary does not work here.

        Args:
            network: default network access of runs (off unless True; a run may override).
            bwrap: path of the bwrap binary (default: found on PATH).
        """
        probe = await cls.probe(bwrap=bwrap)
        if not probe.ok:
            if not sys.platform.startswith("linux"):
                raise UnsupportedBackend(f"sandbox: {probe.reason}; {probe.fix}")
            raise SetupFailed("sandbox", probe.reason, probe.fix)
        bwrap_path = find_bwrap(bwrap)
        assert bwrap_path is not None
        caps = cls.capabilities(env_policy, network)
        root = Path(workspace_root) if workspace_root else default_workspace_root().with_name("sandbox")
        as_root = _is_root()

        def owner(ws: Workspace) -> tuple[int, int] | None:
            if not as_root or ws.host_path is None:
                return None
            uid = sandbox_uid(ws.host_path)
            return uid, uid

        manager = HostWorkspaceManager(
            "sandbox",
            root,
            prepare=_chown_layout_for_root() if as_root else None,
            program_path=lambda _p: SANDBOX_WORKSPACE,
            private_root=not as_root,
        )
        fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots, owner=owner)
        runner = SandboxRunner(
            bwrap_path,
            network_default=network,
            capabilities=lambda: caps,
            env_policy=env_policy,
            kill_grace=kill_grace,
        )
        return BaseEngine("sandbox", manager, fs, runner, caps, extra={"bwrap": bwrap_path, "workspace_root": root})


def _chown_layout_for_root() -> Any:
    def prepare(ws_dir: Path) -> None:
        _chown_layout(sandbox_uid(ws_dir))(ws_dir)

    return prepare


def _probe_boundary(bwrap: str) -> Probe:
    """Run a real sandbox and check from inside that it holds (no uid 0, no capabilities)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="execspace-probe-") as tmp:
        ws = Path(tmp)
        (ws / "skills").mkdir()
        (ws / "metadata.json").write_text("{}")
        uid = sandbox_uid(ws)
        kwargs: dict[str, Any] = {}
        if _is_root():
            os.chmod(tmp, 0o711)  # noqa: S103 - the sandbox uid must traverse to the workspace
            os.chown(ws, uid, uid)
            kwargs = {"user": uid, "group": uid, "extra_groups": []}
        cfg = BwrapConfig(bwrap, network=False, tmp_size=None)
        check = "id -u; grep CapEff /proc/self/status"
        argv = build_argv(cfg, ws, "", ["/bin/sh", "-c", check], as_root_host=_is_root())
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=10, env={"PATH": MINIMAL_PATH}, **kwargs
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, f"bwrap could not start: {exc}", "check that bwrap is executable")
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return Probe(
            False,
            f"bwrap failed: {err[0]}",
            "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
            "user.max_user_namespaces>0); in a container run it with --privileged or a seccomp "
            "profile that allows unshare",
        )
    lines = proc.stdout.split()
    if not lines or lines[0] == "0" or "0000000000000000" not in proc.stdout:
        return Probe(False, f"the sandboxed process kept privileges ({proc.stdout.strip()!r})", "report this as a bug")
    return Probe(True, f"bubblewrap at {bwrap}; probe ran as uid {lines[0]} without capabilities")
