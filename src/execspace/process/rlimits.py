"""POSIX rlimits applied in the child before exec, and how their kills show up."""

from __future__ import annotations

import math
import resource
import signal
from collections.abc import Callable

from ..models import ResourceLimits

__all__ = ["RLIMIT_ENFORCED", "classify_rlimit_exit", "rlimit_preexec", "rlimit_values"]

#: Limits this module can enforce with rlimits (per process; ``cpu_seconds`` per process too).
RLIMIT_ENFORCED = frozenset({"memory_bytes", "cpu_seconds", "file_size_bytes"})


def _requested(limits: ResourceLimits) -> list[tuple[int, int]]:
    pairs: list[tuple[int, int]] = []
    if limits.memory_bytes is not None:
        pairs.append((resource.RLIMIT_AS, limits.memory_bytes))
    if limits.cpu_seconds is not None:
        pairs.append((resource.RLIMIT_CPU, max(1, math.ceil(limits.cpu_seconds))))
    if limits.file_size_bytes is not None:
        pairs.append((resource.RLIMIT_FSIZE, limits.file_size_bytes))
    return pairs


def rlimit_values(limits: ResourceLimits) -> list[tuple[int, int, int]]:
    """``(resource, soft, hard)`` for each rlimit of ``limits``, within this process's hard limits (which a
    child inherits): for a process started elsewhere than by ``preexec_fn`` (a sandbox session's supervisor)."""
    values: list[tuple[int, int, int]] = []
    for which, value in _requested(limits):
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # CPU: SIGXCPU at the soft limit, then SIGKILL one second later if it is caught
        new_hard = soft + 1 if which == resource.RLIMIT_CPU and hard == resource.RLIM_INFINITY else soft
        values.append((which, soft, new_hard))
    return values


def rlimit_preexec(limits: ResourceLimits) -> Callable[[], None] | None:
    """A ``preexec_fn`` setting the rlimits of ``limits``, or None when none is set."""
    if not _requested(limits):
        return None

    def apply() -> None:
        for which, soft, hard in rlimit_values(limits):
            resource.setrlimit(which, (soft, hard))

    return apply


def classify_rlimit_exit(code: int) -> str | None:
    """Name the limit behind an exit status, when the signal tells.

    ``-N`` is a direct death by signal N; ``128+N`` is how a shell or bwrap reports one.
    """
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "cpu_seconds"
    if code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return "file_size_bytes"
    return None
