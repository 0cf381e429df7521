"""Per-run rlimits inside a container: a POSIX ``sh`` sets them, then ``exec``s the program.

The Engine API has no per-exec limits, so the run's own shell applies them with
``ulimit`` before it becomes the program. Values follow POSIX ``sh`` units (``-f`` in
512-byte blocks, ``-v`` in KiB, as dash, busybox and bash-as-sh use), rounded down so
a limit is never looser than asked, except CPU time which the kernel counts in whole
seconds (rounded up, at least 1, as the other backends do). The soft limit is set
first (a hard limit below the soft one is refused), then the hard one, so the program
cannot raise either. If a ``ulimit`` fails the run exits 126 without starting the
program. ``memory_bytes`` is never an rlimit here (an address-space limit is not a memory
limit): the run gets a container cgroup of that size (:mod:`.memory`).
"""

from __future__ import annotations

import math

from ...models import ResourceLimits

__all__ = ["RLIMITS", "rlimit_argv"]

#: The limits a run's shell sets as rlimits of its processes.
RLIMITS = frozenset({"cpu_seconds", "file_size_bytes"})

# a failed ulimit must stop the run, never let it go on without the limit
_FAIL = "|| { echo 'execspace: cannot apply the run limits' >&2; exit 126; }"


def rlimit_argv(limits: ResourceLimits) -> list[str]:
    """``sh -c '<ulimits>; exec "$@"' sh`` to put before the program's argv, or nothing."""
    steps: list[str] = []
    if limits.cpu_seconds is not None:
        cpu = max(1, math.ceil(limits.cpu_seconds))
        # SIGXCPU at the soft limit, SIGKILL a second later if the program catches it (as rlimits.py does)
        steps.append(f"ulimit -S -t {cpu} && ulimit -H -t {cpu + 1}")
    if limits.file_size_bytes is not None:
        blocks = limits.file_size_bytes // 512
        steps.append(f"ulimit -S -f {blocks} && ulimit -H -f {blocks}")
    if not steps:
        return []
    script = " && ".join(steps)
    return ["/bin/sh", "-c", f'{{ {script}; }} {_FAIL}; exec "$@"', "sh"]
