"""The session supervisor's protocol has one source, ``supervisorprotocol.h``: the C compiler and the host's side
(``protocol.py``) must read the same numbers and the same field layout from it, and the supervisor must take them
from there and nowhere else."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from execspace.backends.sandbox import protocol
from execspace.backends.sandbox.supervisorbin import HEADERS, SOURCE

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

_STRUCT = re.compile(r"struct (\w+) \{([^}]*)\};")
_FIELD = re.compile(r"(u?)int(8|16|32|64)_t (\w+);")
_CODES = {("u", "8"): "B", ("", "8"): "b", ("u", "16"): "H", ("", "16"): "h", ("u", "32"): "I", ("", "32"): "i"}
_CODES |= {("u", "64"): "Q", ("", "64"): "q"}


def _structs(header: str) -> dict[str, list[tuple[str, str]]]:
    """Each struct of the header: its fields, as (name, struct module code)."""
    return {
        name: [(field, _CODES[sign, bits]) for sign, bits, field in _FIELD.findall(body)]
        for name, body in _STRUCT.findall(header)
    }


def _compiled(header: str, tmp_path: Path) -> dict[str, int]:
    """What the C compiler makes of ``header``: every #define's value, every struct's size and fields' offsets."""
    (tmp_path / "supervisorprotocol.h").write_text(header)
    lines = [f'printf("%s %lld\\n", "{name}", (long long)({name}));' for name in protocol.parse_defines(header)]
    for name, fields in _structs(header).items():
        lines.append(f'printf("%s %lld\\n", "sizeof {name}", (long long)sizeof(struct {name}));')
        lines += [f'printf("%s %lld\\n", "{name}.{f}", (long long)offsetof(struct {name}, {f}));' for f, _ in fields]
    probe = tmp_path / "probe.c"
    probe.write_text(
        '#include <stddef.h>\n#include <stdio.h>\n#include "supervisorprotocol.h"\nint main(void) {\n'
        + "\n".join(lines)
        + "\nreturn 0;\n}\n"
    )
    subprocess.run(["cc", "-Wall", "-Werror", "-o", str(tmp_path / "probe"), str(probe)], check=True)
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in (line.rsplit(" ", 1) for line in out.splitlines())}


def _disagreements(header: str, tmp_path: Path) -> list[str]:
    """Where the host's side and the C compiler read ``header`` differently."""
    compiled = _compiled(header, tmp_path)
    found = []
    for name, value in protocol.parse_defines(header).items():
        if compiled[name] != value:
            found.append(f"{name}: the host reads {value}, C {compiled[name]}")
        ours = getattr(protocol, name, None)
        if isinstance(ours, int) and ours != compiled[name]:
            found.append(f"protocol.{name} is {ours}, C {compiled[name]}")
    ended = {1: compiled["EXITED_STDOUT_ENDED"], 2: compiled["EXITED_STDERR_ENDED"]}
    if ended != protocol.EXITED_ENDED:
        found.append(f"protocol.EXITED_ENDED is {protocol.EXITED_ENDED}, C {ended}")
    structs = _structs(header)
    if set(structs) != set(protocol.LAYOUTS):
        found.append(f"the header's structs {sorted(structs)}, the host's layouts {sorted(protocol.LAYOUTS)}")
    for name, fields in structs.items():
        layout = protocol.LAYOUTS.get(name)
        wanted = "=" + "".join(code for _, code in fields)
        if layout is not None and layout.format != wanted:
            found.append(f"{name}: the host packs {layout.format}, the header's fields are {wanted}")
        offset = 0
        for field, code in fields:  # "=" packs without padding: so must the C struct be laid out
            if compiled[f"{name}.{field}"] != offset:
                found.append(f"{name}.{field} is at {compiled[f'{name}.{field}']} in C, {offset} packed")
            offset += struct.calcsize("=" + code)
        if compiled[f"sizeof {name}"] != offset:
            found.append(f"sizeof(struct {name}) is {compiled[f'sizeof {name}']} in C, {offset} packed")
    return found


def test_the_host_and_the_c_compiler_read_the_header_alike(tmp_path: Path) -> None:
    assert _disagreements(protocol.HEADER.read_text(), tmp_path) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("#define MSG_OUTPUT 6", "#define MSG_OUTPUT 9"),  # a number the host has as a name
        ("#define EXITED_STDERR_ENDED 4", "#define EXITED_STDERR_ENDED 8"),
        ("    int32_t signal;", "    uint32_t signal;"),  # a field's type
        ("    uint32_t zero;\n", ""),  # padding appears in C, not in the host's packing
        ("struct message_head {", "struct message_header {"),
    ],
)
def test_a_header_changed_alone_disagrees_with_the_host(tmp_path: Path, old: str, new: str) -> None:
    header = protocol.HEADER.read_text()
    assert old in header
    assert _disagreements(header.replace(old, new), tmp_path) != []


def test_the_supervisor_takes_the_protocol_from_the_header_only() -> None:
    header = protocol.HEADER.read_text()
    source = SOURCE.read_text()
    assert '#include "supervisorprotocol.h"' in source
    assert protocol.HEADER in HEADERS  # part of the build's cache key: a changed protocol builds a new supervisor
    names = [*protocol.parse_defines(header), *_structs(header)]
    redefined = [n for n in names if re.search(rf"#define {n}\b|\b{n}\s*=[^=]|struct {n} \{{", source)]
    assert redefined == []
    # the numbers it sends and reads are the header's names, never their values written out
    assert re.search(r"reply(_fd)?\(\s*\d", source) is None


def test_the_host_takes_the_protocol_from_the_header_only() -> None:
    text = Path(protocol.__file__).read_text()
    header = protocol.HEADER.read_text()
    for name in protocol.parse_defines(header):
        if hasattr(protocol, name):
            assert re.search(rf'^{name}: Final = _C\["{name}"\]$', text, re.MULTILINE), name
