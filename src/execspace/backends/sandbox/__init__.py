"""The ``sandbox`` backend: programs run on this host inside an OS sandbox.

Linux: bubblewrap (see :mod:`.bwrap` for the exact boundary). macOS: Seatbelt
(``sandbox-exec``, see :mod:`.seatbelt`). Other platforms, Windows included, fail
closed with ``UnsupportedBackend``. What a program may touch is a
:class:`~.policy.SandboxPolicy` (profile, path rules, network), enforced around the
program and by the engine's file API alike.

This module is the package's face: what other packages use of it. The factory is :mod:`.factory`, the sandbox
wrapper and per-run runner :mod:`.runner`, session mode :mod:`.sessionrunner` and the modules it names.
"""

from __future__ import annotations

from .bwrap import SANDBOX_WORKSPACE, hidden_by_default
from .factory import DOES_NOT_PROTECT, SandboxBackend, sandbox_layout_owner
from .options import SandboxMode, SandboxOptions
from .policy import Profile, SandboxPolicy
from .runner import Sandbox, SandboxProcess, sandbox_of, which_in_sandbox
from .seccomp import KernelSeccompFilters, SeccompFilters
from .sessionconfig import SessionConfig

__all__ = [
    "DOES_NOT_PROTECT",
    "SANDBOX_WORKSPACE",
    "KernelSeccompFilters",
    "Profile",
    "Sandbox",
    "SandboxBackend",
    "SandboxMode",
    "SandboxOptions",
    "SandboxPolicy",
    "SandboxProcess",
    "SeccompFilters",
    "SessionConfig",
    "hidden_by_default",
    "sandbox_layout_owner",
    "sandbox_of",
    "which_in_sandbox",
]
