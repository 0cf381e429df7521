"""The host's side of the session supervisor's channel: its numbers, read from ``supervisorprotocol.h`` (the header
the supervisor is built with) when this module is imported, and the field layout of its messages.

The header is the protocol's one source: a constant changed there changes here too, and
``tests/backends/test_supervisor_protocol.py`` compiles the header to check that this module reads every constant
as the C compiler does and that the layouts below have the sizes of the header's structs.
"""

from __future__ import annotations

import ast
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "EXITED_ENDED",
    "EXITED_GROUP_LEFT",
    "FLAG_CAPTURE",
    "FLAG_CTTY",
    "FLAG_RUN_DIR",
    "HEADER",
    "LAYOUTS",
    "MAX_REQUEST",
    "MAX_RLIMITS",
    "MESSAGE_HEAD",
    "MSG_CLOSED",
    "MSG_EXITED",
    "MSG_LISTENING",
    "MSG_OUTPUT",
    "MSG_READY",
    "MSG_SIGNALED",
    "MSG_SPAWNED",
    "OP_LISTEN",
    "OP_SIGNAL",
    "OP_SPAWN",
    "OUT_CHUNK",
    "REQUEST_HEAD",
    "SIGNAL_BODY",
    "SPAWNED_NO_RUN_DIR",
    "SPAWN_BODY",
    "SPAWN_RLIMIT",
    "encode_spawn",
    "parse_defines",
]

#: The protocol's header, beside this module (shipped with the package, and compiled into the supervisor).
HEADER: Final = Path(__file__).with_name("supervisorprotocol.h")

_DEFINE = re.compile(r"^#define ([A-Z][A-Z0-9_]*) (.+)$", re.MULTILINE)
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.LShift, ast.BitOr)


def parse_defines(text: str) -> dict[str, int]:
    """Every ``#define NAME <integer expression>`` of ``text`` (numbers, earlier names, ``+ - * << |``, brackets).

    Raises:
        ValueError: a definition is something else (the header must stay readable here).
    """
    found: dict[str, int] = {}
    for name, expression in _DEFINE.findall(text):
        found[name] = _evaluate(ast.parse(expression.strip(), mode="eval").body, found, name)
    return found


def _evaluate(node: ast.expr, known: dict[str, int], name: str) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, known, name)
    if isinstance(node, ast.BinOp) and isinstance(node.op, _OPERATORS):
        left, right = _evaluate(node.left, known, name), _evaluate(node.right, known, name)
        result: int = {
            ast.Add: int.__add__,
            ast.Sub: int.__sub__,
            ast.Mult: int.__mul__,
            ast.LShift: int.__lshift__,
            ast.BitOr: int.__or__,
        }[type(node.op)](left, right)
        return result
    raise ValueError(f"{HEADER.name}: {name} is not an integer expression this module reads: {ast.unparse(node)}")


_C = parse_defines(HEADER.read_text())

OP_SPAWN: Final = _C["OP_SPAWN"]
OP_SIGNAL: Final = _C["OP_SIGNAL"]
OP_LISTEN: Final = _C["OP_LISTEN"]
FLAG_CTTY: Final = _C["FLAG_CTTY"]
FLAG_CAPTURE: Final = _C["FLAG_CAPTURE"]
FLAG_RUN_DIR: Final = _C["FLAG_RUN_DIR"]
MSG_READY: Final = _C["MSG_READY"]
MSG_SPAWNED: Final = _C["MSG_SPAWNED"]
MSG_EXITED: Final = _C["MSG_EXITED"]
MSG_SIGNALED: Final = _C["MSG_SIGNALED"]
MSG_LISTENING: Final = _C["MSG_LISTENING"]
MSG_OUTPUT: Final = _C["MSG_OUTPUT"]
MSG_CLOSED: Final = _C["MSG_CLOSED"]
EXITED_GROUP_LEFT: Final = _C["EXITED_GROUP_LEFT"]
#: EXITED's flag for the end of a captured program's stdout (fd 1) and stderr (fd 2).
EXITED_ENDED: Final = {1: _C["EXITED_STDOUT_ENDED"], 2: _C["EXITED_STDERR_ENDED"]}
SPAWNED_NO_RUN_DIR: Final = _C["SPAWNED_NO_RUN_DIR"]
#: Largest spawn request (argv, environment, cwd), as ``ARG_MAX`` is for an exec.
MAX_REQUEST: Final = _C["MAX_REQUEST"]
#: Largest OUTPUT message: its head and at most this much output.
OUT_CHUNK: Final = _C["OUT_CHUNK"]
MAX_RLIMITS: Final = _C["MAX_RLIMITS"]

REQUEST_HEAD: Final = struct.Struct("=II")
SPAWN_BODY: Final = struct.Struct("=IIII")
SPAWN_RLIMIT: Final = struct.Struct("=IIQQ")
SIGNAL_BODY: Final = struct.Struct("=iiI")
MESSAGE_HEAD: Final = struct.Struct("=IIii")
#: Each layout by the name of the header's struct it is (what the agreement test compares).
LAYOUTS: Final = {
    "request_head": REQUEST_HEAD,
    "spawn_body": SPAWN_BODY,
    "spawn_rlimit": SPAWN_RLIMIT,
    "signal_body": SIGNAL_BODY,
    "message_head": MESSAGE_HEAD,
}


def encode_spawn(
    flags: int, rlimits: Sequence[tuple[int, int, int]], strings: list[str], argc: int, envc: int
) -> bytes:
    """A SPAWN request's body (after its head): ``strings`` are cwd, the run directory with ``FLAG_RUN_DIR``, argv
    and the environment's ``NAME=value``."""
    body = SPAWN_BODY.pack(flags, len(rlimits), argc, envc)
    body += b"".join(SPAWN_RLIMIT.pack(which, 0, soft, hard) for which, soft, hard in rlimits)
    return body + os.fsencode("\0".join(strings) + "\0")
