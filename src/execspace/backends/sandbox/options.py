"""The sandbox backend's options (the ``options`` of :class:`~execspace.backends.sandbox.SandboxBackend`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from ...backend import HostOptions
from ...errors import InvalidSpec, PathDenied
from ...models import NetworkApprover, NetworkPolicy
from ...process.pacing import check_output_rate
from ...workspace.confine import split_relpath
from .bwrap import SYSTEM_TOP
from .policy import SandboxPolicy
from .sessionconfig import SessionConfig

__all__ = ["SandboxMode", "SandboxOptions"]

#: How the sandbox backend runs programs: a sandbox per run, or one per workspace (``details["mode"]`` says more).
SandboxMode = Literal["per-run", "session"]


def check_program_binds(binds: tuple[tuple[str, str], ...]) -> None:
    """Refuse a bind the sandbox cannot make, or one that would shadow what it must show."""
    for path, target in binds:
        parts = [c for c in path.split("/") if c]
        if not path.startswith("/") or not parts or ".." in parts or "/" + "/".join(parts) != path:
            raise InvalidSpec(f"program_binds: {path!r} must be a normalised absolute path without '..'")
        if parts[0] in SYSTEM_TOP or parts[0] in ("workspace", "proc", "dev", "sys", "tmp"):
            raise InvalidSpec(
                f"program_binds: {path!r} lies in /{parts[0]}, which the sandbox binds or makes itself; "
                "choose a path outside it (e.g. /home/user)"
            )
        try:
            split_relpath(target)
        except PathDenied as exc:
            raise InvalidSpec(f"program_binds: the target {target!r} must be a workspace path: {exc.reason}") from None


def check_system_files(files: tuple[tuple[str, str], ...]) -> None:
    """Refuse a replacement for anything but an existing file of the system's directories: the sandbox binds its
    own copy over the host's, read-only, and cannot make one where there is none."""
    for path, _text in files:
        parts = [c for c in path.split("/") if c]
        if not path.startswith("/") or len(parts) < 2 or ".." in parts or parts[0] not in SYSTEM_TOP:
            raise InvalidSpec(
                f"system_files: {path!r} must be an absolute path in one of the system's directories "
                f"({', '.join('/' + t for t in sorted(SYSTEM_TOP))})"
            )
        if not os.path.isfile(path) or os.path.islink(path):
            raise InvalidSpec(
                f"system_files: {path!r} is not a regular file on this host; a sandbox can only show its own "
                "version of a file the system has"
            )


@dataclass(frozen=True, kw_only=True)
class SandboxOptions(HostOptions):
    """The shared host options (:class:`~execspace.backend.HostOptions`), and:

    Args:
        policy: what programs may touch (default: ``SandboxPolicy()``, workspace-write with the network off).
            ``Profile.DANGER_FULL_ACCESS`` runs programs WITHOUT any sandbox (like ``local``);
            ``Profile.EXTERNAL`` runs nothing (isolation is elsewhere) and keeps the file rules.
        network: shorthand for ``policy.with_network(network)``, or a :class:`~execspace.models.NetworkPolicy`: every
            run's network is that allow-list unless the run says otherwise (in session mode the session's sandbox
            has it, with one egress proxy per session); a run may still override it.
        on_network_attempt: with an allow-list, an approval flow for the destinations it does not list (async; True
            allows, anything else refuses; asked once per host and port of a run, within 120 s).
        bwrap: path of the bwrap binary (default: found on PATH).
        mode: ``"per-run"`` (a sandbox per run, the default) or ``"session"`` (one sandbox per workspace whose
            programs outlive a call; Linux, managed profiles; builds its supervisor with a C compiler once).
        session: how session mode keeps its sessions (default :class:`SessionConfig`); only with
            ``mode="session"``.
        environment: a built runtime environment (``execspace env build NAME``, docs/environments.md) to run
            programs in: its tree is bound read-only at its host path, its ``bin`` first on PATH, ``VIRTUAL_ENV``
            and its variables set; ``details["environment"]`` names it and what it holds.
        program_binds: ``(path, target)`` pairs: inside every sandbox, the absolute ``path`` is a bind mount of
            the workspace directory ``target``, with the policy's rules for it and below it
            (``("/home/user", "work")`` gives programs E2B's home, as ``execspace serve`` does: ``pwd`` prints
            ``/home/user``). A run's ``cwd`` and the file API take paths under ``path`` too. ``target`` is
            made when missing; a symlink or a file there is ``PathDenied`` when a sandbox starts (never
            followed). ``path`` must lie outside the system's directories, ``/workspace``, ``/proc``, ``/dev``
            and ``/tmp``; nothing on the host changes.
        system_files: ``(path, text)`` pairs: inside every sandbox, the system file ``path`` (an existing regular
            file under ``/etc``, ``/usr``…) reads as ``text`` instead of the host's, read-only (``execspace serve``
            gives its sandboxes a login ``/etc/profile`` this way); the host's file is not changed.
        machine: programs run on the machine E2B's code expects (docs/backends.md "Machine mode"; Linux, as root):
            as ``user`` (uid 1000, ``HOME=/home/user``, the workspace's ``work/`` there unless ``program_binds``
            binds that path), with a passwordless ``sudo`` to the sandbox's own root (a user namespace of
            unprivileged host uids), over a system they can write (overlays whose upper layers are the workspace's:
            what they change survives the workspace's runs and sessions, its snapshots and forks, and goes with
            it; the host's files are never written, nor made more readable). Refused elsewhere
            (``CapabilityError``).
        read_views: host directories every sandbox shows read-only at their own paths, even where its uid cannot
            reach them (as root, a venv under ``/root`` or another 0700 directory): read grants that the grant
            helper shows from clones of their mounts where the sandbox's uid cannot pass (:mod:`.views`,
            :mod:`.grants`); nothing on the host changes, and the sandbox reads only what others may read in the
            tree. Each must be a
            canonical directory that others may read, outside what no sandbox may see (execspace's workspaces and
            store, credential stores, the policy's no-access paths). The jupyter backend shows the caller's Python
            this way.
        output_rate: bytes a second the host reads of one workspace's programs' output, all of them together (None:
            as fast as they write); a program that writes faster is held back by its full pipe, and nothing it wrote
            is lost. A server of many tenants sets it (``execspace serve``: 32 MiB/s) so that one program printing
            without end does not take the host's CPU from the others.
    """

    policy: SandboxPolicy | None = None
    network: bool | NetworkPolicy | None = None
    on_network_attempt: NetworkApprover | None = None
    bwrap: str | None = None
    mode: SandboxMode = "per-run"
    session: SessionConfig | None = None
    environment: str | None = None
    program_binds: tuple[tuple[str, str], ...] = ()
    system_files: tuple[tuple[str, str], ...] = ()
    output_rate: int | None = None
    machine: bool = False
    read_views: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        check_output_rate(self.output_rate)
        check_program_binds(self.program_binds)
        check_system_files(self.system_files)
        if self.session is not None and self.mode != "session":
            raise InvalidSpec("SandboxOptions: session= configures mode='session'; give mode='session' too")
