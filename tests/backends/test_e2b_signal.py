"""The e2b backend's signal script (``_SIGNAL``: how a timeout, a kill or ``signal()`` reaches a run's program in a
remote sandbox), run here on the host in a PID namespace of its own, where pids are as small as in a sandbox.

It scans ``/proc`` for the process that carries the run's marker and whose parent does not. ``/proc/[0-9]*`` sorts
as text, so past a power of ten a child (pid 100) comes before its program (pid 93). A child that ends between the
two reads of it (its environment, then its status) once made the script take it for the program, signal nothing
and stop: the program never got its TERM (seen as ``test_timeout_and_kill_give_the_program_its_term_handler
[e2b-serve]`` losing its handler's output). ``sed`` is slowed down here so that every child scanned before the
program ends inside that window.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from execspace.backends.e2b.runner import _SIGNAL

_MARKER = "EXECSPACE_RUN=0123456789abcdef"

#: In the new namespace: pids up to about 93, then a program whose 50 ms children soon pass pid 100; once one of
#: them sorts before the program, the script is asked for TERM. $1: the script, $2: where the slow sed is, $3: the
#: program's output.
_HARNESS = r"""
for i in $(seq 90); do /bin/true; done
env -i "$MARKER" sh -c 'trap "echo cleaned-up; exit 0" TERM; echo up; while :; do sleep 0.05; done' > "$3" &
top=$!
until grep -q up "$3"; do sleep 0.01; done
inverted=
for tries in $(seq 500); do
  for kid in $(cat /proc/$top/task/$top/children); do [ "$kid" \< "$top" ] && inverted=$kid; done
  [ -n "$inverted" ] && break
  sleep 0.01
done
[ -n "$inverted" ] || { echo "no child of $top sorts before it" >&2; kill -9 $top; exit 1; }
PATH="$2:$PATH" sh -c "$1" sh "$MARKER" TERM
for tries in $(seq 300); do kill -0 $top 2>/dev/null || exit 0; sleep 0.01; done
kill -9 $top
"""


def test_a_child_that_ends_while_it_is_scanned_is_not_taken_for_the_program(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare (util-linux)")
    prefix = [unshare, "--fork", "--pid", "--mount-proc"]
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        prefix = [unshare, "--map-root-user", "--fork", "--pid", "--mount-proc"]  # a user without CAP_SYS_ADMIN
        if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
            pytest.skip("cannot make a PID namespace here")
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "sed").write_text(f'#!/bin/sh\nsleep 0.08\nexec {shutil.which("sed")} "$@"\n')
    (slow / "sed").chmod(0o755)
    out = tmp_path / "out"
    subprocess.run(
        [*prefix, "sh", "-c", _HARNESS, "sh", _SIGNAL, str(slow), str(out)],
        env={"PATH": "/usr/bin:/bin", "MARKER": _MARKER},
        timeout=60,
        check=True,
    )
    assert out.read_text() == "up\ncleaned-up\n"
