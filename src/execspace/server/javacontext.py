"""Java contexts of the code interpreter: one JVM per context, in the sandbox's own session, whose JShell keeps the
cells' variables, methods and classes from one cell to the next.

The process is the host's ``java`` (the sandbox shows ``/usr``) running ``javarepl.java`` in its single-file
source mode (compiled in memory at each start: no class files to keep anywhere), which drives the JDK's own
``jdk.jshell`` with local execution, so that ``System.out`` is the process's. Its output is plain text and records
(:mod:`.recordprocess`): each write of ``System.out``/``System.err``, the value of the cell's last expression (its
``toString()``), its error, its end. E2B's Java kernel passes env vars as system properties: the sandbox's
``envVars`` are system properties from the start, a cell's ``env_vars`` for that cell.

A JVM is sized for the sandbox, not the host (:func:`jvm_options`): the serial collector (no collector threads),
the client compiler alone (it starts in about half the CPU time), and, where the sandbox's memory or CPUs are
limited, ``-XX:MaxRAM`` at that limit (its heap at most half of it) and as many processors as it may use.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
from collections.abc import Mapping
from importlib import resources

from ..protocols import ProgramRunner
from .recordprocess import RecordProcess, message
from .sandboxes import Sandbox
from .templates import Profile

__all__ = ["JavaContext", "java_missing", "jvm_options"]

_SOURCE = resources.files(__package__).joinpath("javarepl.java").read_text(encoding="utf-8")
#: Writes the driver's source (``$1``) to a file only this process holds (opened, then removed: the source launcher
#: reads a file, not a pipe), then runs ``java OPTIONS… --source 11 /dev/fd/4 NAMES…``.
_SHELL = r"""d=$(mktemp -d) && printf '%s' "$1" >"$d/r.java" && exec 4<"$d/r.java" && rm -r "$d" || exit 70
shift
exec java "$@"
"""
_TAG = "execspace-java-context"
_JVM_OPTIONS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:CICompilerCount=2",
    "-XX:-UsePerfData",
    "-Dfile.encoding=UTF-8",
)


@functools.cache
def java_missing() -> str | None:
    """What the host lacks to run Java contexts (a JDK: ``java`` beside its ``jshell``), or None."""
    java = shutil.which("java")
    if java is None:
        return "no java on the host's PATH"
    if not os.path.exists(os.path.join(os.path.dirname(os.path.realpath(java)), "jshell")):
        return f"{os.path.realpath(java)} is a JRE without the jdk.jshell module"
    return None


def jvm_options(limits: Profile) -> tuple[str, ...]:
    """The JVM's options in a sandbox of these limits: a REPL's JVM, small and quick to start (the client compiler
    only: a cell's code runs at its speed), within the sandbox's memory and CPUs where they are limited."""
    options: tuple[str, ...] = _JVM_OPTIONS
    if limits.memory_mb is not None:
        options += (f"-XX:MaxRAM={limits.memory_mb}m", "-XX:MaxRAMPercentage=50")
    if limits.cpus is not None:
        options += (f"-XX:ActiveProcessorCount={max(1, math.ceil(limits.cpus))}",)
    return options


class JavaContext(RecordProcess):
    """A started JVM and what it writes."""

    DIED = (
        "the Java context's JVM ended (System.exit ends it; one that could not start, e.g. short of the sandbox's "
        "pids or memory, says why in its output); the next cell starts a fresh one, state lost"
    )

    @classmethod
    async def start(cls, runner: ProgramRunner, sandbox: Sandbox, cwd: str, limits: Profile) -> JavaContext:
        java = (*jvm_options(limits), "--source", "11", "/dev/fd/4", *sandbox.env_vars)
        args = ("-c", _SHELL, "java-context", _SOURCE, *java)
        return cls(await runner.start_program(sandbox.workspace, sandbox.context_process("/bin/sh", args, cwd, _TAG)))

    def _message(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        return message(cell_id, code, *(part for pair in env_vars.items() for part in pair))
