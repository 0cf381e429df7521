"""envd's stubs are the server's own: generated from its committed .proto files (regenerating them changes nothing),
describing the wire the official SDK speaks, and imported without the e2b package."""

from __future__ import annotations

import ast
import difflib
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import execspace.server

SERVER = Path(execspace.server.__file__).parent
ENVD = SERVER / "envd"
GENERATED = ("*_pb.py", "*_connect.py")
#: The tools of ENVD/buf.gen.yaml, installed with the dev extra (console scripts beside this Python).
TOOLS = ("buf", "protoc-gen-py", "protoc-gen-connectrpc")


def _generated(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for pattern in GENERATED for p in sorted(root.rglob(pattern))}


def _tool_path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    path = _tool_path()
    missing = [tool for tool in TOOLS if shutil.which(tool, path=path) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[dev]' brings the generators")
    fresh = tmp_path / "envd"
    shutil.copytree(ENVD, fresh, ignore=shutil.ignore_patterns(*GENERATED, "__pycache__"))
    assert _generated(fresh) == {}
    env = {**os.environ, "PATH": path, "BUF_CACHE_DIR": str(tmp_path / "buf-cache")}
    done = subprocess.run(["buf", "generate"], cwd=fresh, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    committed, regenerated = _generated(ENVD), _generated(fresh)
    assert sorted(regenerated) == sorted(committed)
    assert set(committed) >= {"process/process_pb.py", "filesystem/filesystem_connect.py"}
    stale = {
        name: [line[:160] for line in difflib.unified_diff(text.splitlines(), regenerated[name].splitlines())][:30]
        for name, text in committed.items()
        if text != regenerated[name]
    }
    assert stale == {}, "run `buf generate` in src/execspace/server/envd (with the dev extra's generators)"


def _wire(module: str) -> dict[str, Any]:
    """Everything of a generated file's descriptor that reaches the wire, by full name: fields (name, number,
    label, type, JSON name, presence, oneof), enum values, and the methods with their streaming kinds."""
    proto = importlib.import_module(module).desc().proto
    found: dict[str, Any] = {"": (proto.package, proto.syntax, tuple(proto.dependency))}

    def enum(e: Any, prefix: str) -> None:
        found[f"{prefix}.{e.name}"] = sorted((v.name, v.number) for v in e.value)

    def message(m: Any, prefix: str) -> None:
        name = f"{prefix}.{m.name}"
        oneofs = [o.name for o in m.oneof_decl]
        fields = [
            (f.name, f.number, str(f.label), str(f.type), f.type_name, f.json_name, f.proto3_optional)
            + ((oneofs[f.oneof_index],) if f.has_field("oneof_index") else ())
            for f in m.field
        ]
        found[name] = (bool(m.options and m.options.map_entry), sorted(fields))
        for nested in m.nested_type:
            message(nested, name)
        for e in m.enum_type:
            enum(e, name)

    for m in proto.message_type:
        message(m, proto.package)
    for e in proto.enum_type:
        enum(e, proto.package)
    for s in proto.service:
        found[f"{proto.package}.{s.name}"] = sorted(
            (x.name, x.input_type, x.output_type, x.client_streaming, x.server_streaming) for x in s.method
        )
    return found


@pytest.mark.parametrize("service", ["process.process", "filesystem.filesystem"])
def test_the_protos_describe_the_wire_the_sdk_speaks(service: str) -> None:
    """The SDK's own generated descriptors (e2b.envd, not its public API: read here only) are the reference."""
    ours, sdk = _wire(f"execspace.server.envd.{service}_pb"), _wire(f"e2b.envd.{service}_pb")
    assert len(ours) > 10
    assert {k: v for k, v in ours.items() if sdk.get(k) != v} == {}
    assert {k: v for k, v in sdk.items() if ours.get(k) != v} == {}


def test_the_server_imports_nothing_of_e2b() -> None:
    found = []
    for path in SERVER.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path.relative_to(SERVER)}: {n}" for n in names if n == "e2b" or n.startswith("e2b.")]
    assert found == []
    blocker = (
        "import sys\n"
        "class Blocker:\n"
        "    def find_spec(self, name, *args):\n"
        "        if name == 'e2b' or name.startswith('e2b.'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Blocker())\n"
        "import execspace.server.app, execspace.server.serve\n"
        "print(sorted(m for m in sys.modules if m.startswith(('e2b', 'google.protobuf'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr[-2000:]
