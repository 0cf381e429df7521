"""The jupyter backend's options (the ``options`` of :class:`~execspace.backends.jupyter.JupyterBackend`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import HostOptions
from .modes import KernelMode, check_mode
from .outputs import RichOutputLimits

__all__ = ["JupyterOptions"]


@dataclass(frozen=True, kw_only=True)
class JupyterOptions(HostOptions):
    """The shared host options (:class:`~execspace.backend.HostOptions`; ``env_policy`` also builds each kernel's
    environment), and:

    Args:
        mode: where kernels run: :class:`SandboxedKernels` (default; fails closed where the sandbox cannot run
            them), :class:`HostKernels`, :class:`AutoKernels` or :class:`ServerKernels`, each with the options that
            apply to it (pool, sandbox policy and limits, server URL and token; see :mod:`.modes`).
        kernel_name: the installed kernel spec to start for each workspace (sandboxed: ipykernel specs only; on a
            server: one of the server's Python specs).
        interrupt_grace: seconds a timed-out cell gets to stop after the interrupt before its kernel is restarted.
        rich_outputs: how many files and bytes of rich output one cell may leave under ``out/``, and the largest
            message a sandboxed kernel may send (default :class:`RichOutputLimits`).
    """

    mode: KernelMode | None = None
    kernel_name: str = "python3"
    interrupt_grace: float = 2.0
    rich_outputs: RichOutputLimits | None = None

    def __post_init__(self) -> None:
        if self.mode is not None:
            check_mode(self.mode)  # its refusal names every mode and where they come from
        super().__post_init__()
