"""The container backend's options (the ``options`` of :class:`~execspace.backends.container.ContainerBackend`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...backend import HostOptions
from ...models import NetworkApprover, NetworkPolicy
from ...workspace.protected import DEFAULT_PROTECTED

__all__ = ["ContainerOptions"]


@dataclass(frozen=True, kw_only=True)
class ContainerOptions(HostOptions):
    """The shared host options (:class:`~execspace.backend.HostOptions`; ``env_policy`` builds the run's
    environment: the host's variables never enter), and:

    Args:
        image: the image every workspace container runs (it needs ``/bin/sh``, ``sleep`` and ``grep``); default
            ``$EXECSPACE_CONTAINER_IMAGE``, else ``[container] image`` of the user config file
            (``$XDG_CONFIG_HOME/execspace/config.toml``). ``SetupFailed`` when none names one.
        docker_host: daemon URL (``unix:///run/podman/podman.sock``…); default ``$DOCKER_HOST``, else the
            default socket.
        user: uid:gid programs run as; default 65534 when we are root, else our own (never 0).
        memory_bytes / pids / cpus: limits of each workspace container (its runs that ask no ``memory_bytes``
            share them); a run that asks for ``memory_bytes`` gets a member container of exactly that memory, with
            these pids and cpus (see :mod:`.memory`).
        read_only_binds: host path → container path mounted read-only (a relaxation; sockets refused).
        network: ``"none"`` (default), or the name of a daemon network (e.g. ``"bridge"``) to let programs
            reach the network: an explicit relaxation, reported by ``describe()``. ``"host"`` is refused. Or a
            :class:`~execspace.models.NetworkPolicy`: the container has no network, and every run that does not
            choose its own reaches only that allow-list, through an egress proxy on the host (needs root and a
            local daemon; ``CapabilityError`` otherwise). On a ``"none"`` container each run may also ask for an
            allow-list of its own (``RunProgramSpec.network``).
        on_network_attempt: with allow-lists, an approval flow for the destinations they do not list (async; True
            lets one through); see docs/backends.md.
        pool_size: started containers kept ready for new workspaces (0: create on first run).
        reap_on_open: first remove containers left by crashed processes (see ``reaper.py``).
        watchdog: also start a small process that removes this engine's containers as soon as our process
            ends, however it ends (SIGKILL included); costs one Python process per engine.
        languages: the languages whose runtimes the image has (code blocks and skill scripts need them);
            default: what the image declares in its ``execspace.languages`` label, none without it.
        protected: workspace paths programs and the file API never write (the workspace root is read-only
            to programs anyway; an entry below a layout directory is mounted read-only). Pass a shorter
            list to opt out of some (``.execspace`` stays).
        environment: a built runtime environment (``execspace env build NAME``, docs/environments.md) bound
            read-only into every container at its host path, its ``bin`` first on PATH and its variables set;
            its python is a venv of the host's system Python, so the image must have that Python at the same
            path with its whole standard library (the test image, the host's ``/usr``, has; so has ``execspace
            image build``'s on the same Debian release); the first run checks it (``SetupFailed`` saying what the
            image lacks). ``details["environment"]`` names it.
    """

    image: str | None = None
    docker_host: str | None = None
    user: tuple[int, int] | None = None
    memory_bytes: int = 512 * 1024 * 1024
    pids: int = 256
    cpus: float = 1.0
    read_only_binds: Mapping[str, str] | None = None
    network: str | NetworkPolicy = "none"
    on_network_attempt: NetworkApprover | None = None
    pool_size: int = 1
    reap_on_open: bool = True
    watchdog: bool = False
    languages: Sequence[str] | None = None
    protected: Sequence[str] = DEFAULT_PROTECTED
    environment: str | None = None
