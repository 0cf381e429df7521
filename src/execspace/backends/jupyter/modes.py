"""Where the jupyter backend's kernels run: one value, the ``mode=`` of ``open_engine("jupyter", …)``.

* :class:`SandboxedKernels` (default): kernels and programs in the OS sandbox; ``SetupFailed`` where it does not
  work.
* :class:`HostKernels`: kernels and programs on this host as the caller, no isolation.
* :class:`AutoKernels`: :class:`SandboxedKernels` when the sandbox works here, else :class:`HostKernels` with a
  ``RuntimeWarning`` (``describe()`` says which and why): the fallback happens only when this mode is named.
* :class:`ServerKernels`: kernels on a Jupyter Server or Kernel Gateway (docs/jupyter-remote.md).

Each mode holds only the options that apply to it, so an option the mode cannot honour cannot be passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ...errors import InvalidSpec
from ...models import NetworkPolicy, ResourceLimits

if TYPE_CHECKING:
    from ..sandbox import SandboxPolicy

__all__ = [
    "NAMED_MODES",
    "AutoKernels",
    "HostKernels",
    "KernelMode",
    "ProgramsMode",
    "SandboxedKernels",
    "ServerKernels",
    "named_mode",
]

ProgramsMode = Literal["host", "refuse"]


def _check_pool(pool_size: int, pool_idle_timeout: float) -> None:
    if pool_size < 0 or pool_idle_timeout <= 0:
        raise InvalidSpec("pool_size must be >= 0 and pool_idle_timeout > 0 seconds")


@dataclass(frozen=True, slots=True)
class HostKernels:
    """Kernels (and programs) on this host as the caller, with no isolation: only for trusted code.

    Args:
        pool_size: kernels kept started for the next new workspaces (0: none; Python kernels only), each
            bound to its workspace by a silent cell. One covers sessions opened one at a time.
        pool_idle_timeout: seconds a pooled kernel waits for a workspace before it is stopped; the pool
            refills on the next kernel start.
    """

    pool_size: int = 1
    pool_idle_timeout: float = 600.0

    def __post_init__(self) -> None:
        _check_pool(self.pool_size, self.pool_idle_timeout)


@dataclass(frozen=True, slots=True)
class SandboxedKernels:
    """Each kernel is a program of the ``sandbox`` backend (bubblewrap, per-workspace uid, network off by
    default, limits for the whole kernel); workspaces, files and programs are the sandbox backend's.

    Args:
        policy, network, bwrap: the sandbox backend's options (``network`` may be a
            :class:`~execspace.models.NetworkPolicy`: each kernel's sandbox then reaches only its destinations,
            through an egress proxy of its own whose audit is in the kernel's run directory).
        kernel_limits: limits of each kernel as a whole, for its lifetime (default
            ``DEFAULT_KERNEL_LIMITS``, less what this host cannot enforce).
        pool_size: kernels started ahead, each in a workspace slot that is renamed into place, so they serve
            new workspaces only (not reopened ones, nor ``path=``), and none with a policy's no-access globs.
        pool_idle_timeout: seconds a pooled kernel waits before it is stopped; the pool refills on the next
            workspace created.
        environment: a built runtime environment (``execspace env build code-interpreter``) whose python and
            ipykernel run the kernels, and whose tree programs run in: nothing then comes from the caller's venv.
            None: the caller's own Python and packages, which the sandbox's uid must be able to read.
        program_binds: the sandbox backend's option: workspace directories each kernel's sandbox also shows at
            other absolute paths (``(("/home/user", "work"),)``).
    """

    policy: SandboxPolicy | None = None
    network: bool | NetworkPolicy | None = None
    bwrap: str | None = None
    environment: str | None = None
    program_binds: tuple[tuple[str, str], ...] = ()
    kernel_limits: ResourceLimits | None = None
    pool_size: int = 1
    pool_idle_timeout: float = 600.0

    def __post_init__(self) -> None:
        _check_pool(self.pool_size, self.pool_idle_timeout)


@dataclass(frozen=True, slots=True)
class AutoKernels:
    """:class:`SandboxedKernels` (with these options) when the sandbox works here, else :class:`HostKernels`
    with a ``RuntimeWarning``: never a silent fallback. To fail instead, or to set the sandbox's policy,
    network or kernel limits (which the host could not honour), ask for :class:`SandboxedKernels`.

    Args:
        bwrap: the bubblewrap binary to try (a broken one falls back like a missing one).
        pool_size, pool_idle_timeout: the warm pool of whichever mode it becomes.
    """

    bwrap: str | None = None
    pool_size: int = 1
    pool_idle_timeout: float = 600.0

    def __post_init__(self) -> None:
        _check_pool(self.pool_size, self.pool_idle_timeout)


@dataclass(frozen=True, slots=True)
class ServerKernels:
    """Kernels on the Jupyter Server or Kernel Gateway at ``url`` (``http(s)://host:port[/base_url]``).

    Args:
        url: the server.
        token: its token, sent as ``Authorization: token …`` (never shown in reprs or errors); an empty
            token is refused.
        shared_filesystem: True: the server's kernels see ``workspace_root`` at the same path (each kernel
            proves it with a nonce), and files and programs are this host's. False: **server-side
            workspaces** under ``remote_root`` on the server, files move through a file kernel, programs are
            refused; ``workspace_root`` and ``programs`` do not apply.
        server_root: the server's root_dir on this host, if known (kernels then also start in ``work/``).
        ca_file: CA bundle that signs an https server's certificate (the system's trust store otherwise).
        programs: with a shared filesystem, ``"host"`` runs programs on this host as the caller (no
            isolation); ``"refuse"`` raises ``CapabilityError``: code runs only in the server's kernels.
        remote_root: the server-side directory of server-side workspaces (relative to the kernels' start
            directory unless absolute; created private to the server's user).
        request_timeout, start_timeout: seconds for one REST call, and for a kernel to start.
    """

    url: str
    token: str = field(repr=False)
    shared_filesystem: bool = True
    server_root: Path | str | None = None
    ca_file: str | None = None
    programs: ProgramsMode = "host"
    remote_root: str = "execspace-workspaces"
    request_timeout: float = 30.0
    start_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.programs not in ("host", "refuse"):
            raise InvalidSpec(f"ServerKernels(programs={self.programs!r}): use 'host' or 'refuse'")


KernelMode = HostKernels | SandboxedKernels | AutoKernels | ServerKernels
_MODES = (HostKernels, SandboxedKernels, AutoKernels, ServerKernels)
#: The modes a config file may name by a string (each with its defaults; a server needs its URL and token).
NAMED_MODES: dict[str, type[HostKernels | SandboxedKernels | AutoKernels]] = {
    "sandboxed": SandboxedKernels,
    "host": HostKernels,
    "auto": AutoKernels,
}


def named_mode(name: str) -> KernelMode:
    """The mode a config file names (``mode = "sandboxed"``), with its defaults; ``InvalidSpec`` naming the names."""
    kind = NAMED_MODES.get(name)
    if kind is None:
        names = ", ".join(repr(n) for n in NAMED_MODES)
        raise InvalidSpec(
            f"jupyter: {name!r} is not a kernel mode; name one of {names} (a server's kernels need "
            "ServerKernels(url=..., token=...) from execspace.backends.jupyter)"
        )
    return kind()


def check_mode(mode: Any) -> KernelMode:
    """``mode`` if it is one of the modes, else ``InvalidSpec`` naming them (a string or a dict is not one)."""
    if isinstance(mode, _MODES):
        return mode
    names = ", ".join(f"{m.__name__}(…)" for m in _MODES)
    # the type only: a mapping passed by mistake may hold a server token
    raise InvalidSpec(
        f"jupyter: a {type(mode).__name__} is not a kernel mode; pass one of {names} from execspace.backends.jupyter"
    )
