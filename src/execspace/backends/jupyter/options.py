"""The jupyter backend's options (the ``options`` of :class:`~execspace.backends.jupyter.JupyterBackend`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Self

from ...backend import HostOptions
from ...errors import InvalidSpec
from .modes import KernelMode, SandboxedKernels, check_mode, named_mode
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
        environment: a built runtime environment (``execspace env build code-interpreter``) whose Python and
            packages run the sandboxed kernels, and whose tree programs run in: shorthand for
            ``SandboxedKernels(environment=...)``, the default mode (another mode is refused: host kernels run the
            caller's Python, a server's kernels the server's).
    """

    mode: KernelMode | None = None
    kernel_name: str = "python3"
    interrupt_grace: float = 2.0
    rich_outputs: RichOutputLimits | None = None
    environment: str | None = None

    def __post_init__(self) -> None:
        if self.mode is not None:
            check_mode(self.mode)  # its refusal names every mode and where they come from
        if self.environment is not None:
            self.kernel_mode()
        super().__post_init__()

    @classmethod
    def from_keywords(cls, backend: str, keywords: Mapping[str, object], *, hint: str = "") -> Self:
        """As every backend's, and a config file's ``mode = "sandboxed"`` (``"host"``, ``"auto"``): that mode with
        its defaults."""
        mode = keywords.get("mode")
        if isinstance(mode, str):
            keywords = {**keywords, "mode": named_mode(mode)}
        return super().from_keywords(backend, keywords, hint=hint)

    def kernel_mode(self) -> KernelMode:
        """Where kernels run: ``mode`` (default :class:`SandboxedKernels`) with ``environment`` in it."""
        mode = check_mode(self.mode or SandboxedKernels())
        if self.environment is None:
            return mode
        if not isinstance(mode, SandboxedKernels):
            raise InvalidSpec(
                f"jupyter: environment={self.environment!r} runs sandboxed kernels in that environment, but "
                f"mode={type(mode).__name__}(…) runs them elsewhere; drop mode= (sandboxed kernels are the default) "
                "or drop environment="
            )
        if mode.environment not in (None, self.environment):
            raise InvalidSpec(
                f"jupyter: environment={self.environment!r} contradicts "
                f"SandboxedKernels(environment={mode.environment!r}); give one"
            )
        return replace(mode, environment=self.environment)
