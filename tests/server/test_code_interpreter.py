"""The code interpreter (port 49999) through the official ``e2b-code-interpreter`` SDK, sync and async, against a
real ``execspace serve``: kernels sandboxed on the sandbox's own workspace."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from execspace.testing.processes import TAG_VARIABLE, new_tag, wait_no_process, wait_processes

from .conftest import API_KEY, Server, running_server

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
pytest.importorskip(
    "ipykernel", reason="the code interpreter's kernels are ipykernel: pip install 'execspace[jupyter]'"
)

JS_SDK = os.environ.get("EXECSPACE_E2B_JS", "")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_state_persists_and_the_main_result_is_the_text(sbx: ci.Sandbox) -> None:
    assert sbx.run_code("x = 41").error is None
    execution = sbx.run_code("x + 1")
    assert execution.text == "42"
    assert execution.results[0].is_main_result
    assert execution.execution_count == 2
    assert sbx.run_code("'a string'").text == "a string"


def test_stdout_and_stderr_reach_the_callbacks_and_the_logs(sbx: ci.Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    code = "import sys\nprint('to out')\nprint('to err', file=sys.stderr)"
    execution = sbx.run_code(code, on_stdout=lambda m: out.append(m.line), on_stderr=lambda m: err.append(m.line))
    assert "".join(out) == "to out\n" and "".join(err) == "to err\n"
    assert execution.logs.stdout == ["to out\n"] and execution.logs.stderr == ["to err\n"]


def test_an_exception_is_the_execution_error_with_its_traceback(sbx: ci.Sandbox) -> None:
    execution = sbx.run_code("def f():\n    return 1 / 0\nf()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "return 1 / 0" in strip_ansi(execution.error.traceback)
    assert sbx.run_code("1 + 1").text == "2"  # the kernel goes on


def test_a_matplotlib_figure_is_a_png_result(sbx: ci.Sandbox) -> None:
    pytest.importorskip("matplotlib")
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    pngs = [r.png for r in execution.results if r.png]
    assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(PNG_MAGIC)
    assert not execution.results[0].is_main_result  # displayed, not the cell's value


def test_display_of_html_and_markdown_gives_those_formats(sbx: ci.Sandbox) -> None:
    code = (
        "from IPython.display import HTML, Markdown, display\n"
        "display(HTML('<b>bold</b>'))\ndisplay(Markdown('# Title'))\n"
        "class R:\n    def _repr_latex_(self):\n        return '$x^2$'\n    def _repr_json_(self):\n"
        "        return {'k': [1, 2]}\nR()"
    )
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    html, markdown, main = execution.results
    assert html.html == "<b>bold</b>" and markdown.markdown == "# Title"
    assert main.is_main_result and main.latex == "$x^2$" and main.json == {"k": [1, 2]}
    assert set(main.formats()) >= {"text", "latex", "json"}


def test_contexts_have_their_own_variables_and_restart_clears_them(sbx: ci.Sandbox) -> None:
    one = sbx.create_code_context()
    two = sbx.create_code_context(cwd="/home/user/sub")
    assert one.language == "python" and two.cwd == "/home/user/sub"
    sbx.run_code("v = 'one'", context=one)
    execution = sbx.run_code("v", context=two)
    assert execution.error is not None and execution.error.name == "NameError"
    assert sbx.run_code("import os; print(os.getcwd())", context=two).logs.stdout == ["/home/user/sub\n"]
    assert sbx.run_code("import os; print(os.getcwd())").logs.stdout == ["/home/user\n"]
    assert {c.id for c in sbx.list_code_contexts()} >= {one.id, two.id}
    sbx.restart_code_context(one)
    assert sbx.run_code("v", context=one).error.name == "NameError"
    sbx.remove_code_context(two)
    assert two.id not in {c.id for c in sbx.list_code_contexts()}
    with pytest.raises(ci.NotFoundException, match="not found"):
        sbx.run_code("1", context=two)


def test_contexts_past_the_limit_are_refused_until_one_is_removed(sbx: ci.Sandbox) -> None:
    from execspace.server.interpreter import MAX_CONTEXTS

    made = [sbx.create_code_context() for _ in range(MAX_CONTEXTS - len(sbx.list_code_contexts()))]
    with pytest.raises(Exception, match=f"already has {MAX_CONTEXTS} code contexts"):
        sbx.create_code_context()  # one kernel each: a sandbox cannot start them without bound
    sbx.remove_code_context(made[-1])
    assert sbx.create_code_context().language == "python"


def test_env_vars_hold_for_one_cell_and_sandbox_env_for_all() -> None:
    sandbox = ci.Sandbox.create(envs={"SANDBOX_WIDE": "yes"}, timeout=60)
    try:
        code = "import os; (os.environ.get('SANDBOX_WIDE'), os.environ.get('ONE_CELL'))"
        assert sandbox.run_code(code, envs={"ONE_CELL": "1"}).text == "('yes', '1')"
        assert sandbox.run_code(code).text == "('yes', None)"
    finally:
        sandbox.kill()


def test_a_cell_past_its_timeout_is_interrupted_and_the_state_kept(sbx: ci.Sandbox) -> None:
    sbx.run_code("kept = 7")
    started = time.monotonic()
    with pytest.raises(ci.TimeoutException):
        sbx.run_code("import time\nfor i in range(600):\n    time.sleep(0.1)", timeout=1.5)
    assert time.monotonic() - started < 10
    # the client went away: the cell was interrupted, so the kernel answers at once and kept its variables
    started = time.monotonic()
    assert sbx.run_code("kept * 6").text == "42"
    assert time.monotonic() - started < 5


def test_files_written_by_code_are_seen_by_files_and_back(sbx: ci.Sandbox) -> None:
    sbx.run_code("open('from_code.txt', 'w').write('written by code')")
    assert sbx.files.read("/home/user/from_code.txt") == "written by code"
    sbx.files.write("/home/user/from_files.bin", b"\x00\xffbytes")
    assert sbx.run_code("open('from_files.bin', 'rb').read()").text == "b'\\x00\\xffbytes'"
    assert sbx.commands.run("cat from_code.txt").stdout == "written by code"


def test_killing_the_sandbox_ends_its_kernels() -> None:
    sandbox = ci.Sandbox.create(timeout=60)
    tag = new_tag("kernel")
    code = _tagged_sleeper(tag)
    try:
        assert sandbox.run_code(code).error is None
        assert asyncio.run(wait_processes(tag, 1))  # a process of the kernel's sandbox, as the host sees it
    finally:
        sandbox.kill()
    assert wait_no_process(tag, within=10) == []


def _tagged_sleeper(tag: str) -> str:
    """A cell that starts a process carrying ``tag``, in the kernel's sandbox, as the host sees it."""
    return (
        "import os, subprocess, sys\n"
        "sleeper = [sys.executable, '-c', 'import time; time.sleep(300)']\n"
        f"subprocess.Popen(sleeper, env={{**os.environ, {TAG_VARIABLE!r}: {tag!r}}})"
    )


def test_the_host_name_routes_to_the_code_interpreter(tmp_path: Path) -> None:
    """e2b-code-interpreter 2.8.x calls ``https://49999-<id>.<domain>`` with no ``E2b-Sandbox-*`` headers (a
    reverse proxy with a wildcard certificate in front); the lines are NDJSON, none blank."""
    with (
        running_server(tmp_path / "serve", "--domain", "e2b.test") as server,
        httpx.Client(base_url=server.url, timeout=30) as http,
    ):
        made = http.post("/v2/sandboxes", json={"templateID": "code-interpreter-v1"}, headers={"X-API-KEY": server.key})
        assert made.status_code == 201, made.text
        sandbox_id, token = made.json()["sandboxID"], made.json()["envdAccessToken"]
        host = {"Host": f"49999-{sandbox_id}.e2b.test"}
        body = {"code": "print('via host'); 6 * 7", "context_id": None, "language": None, "env_vars": None}
        refused = http.post("/execute", json=body, headers=host)
        assert refused.status_code == 401  # /execute needs the sandbox's token
        answer = http.post("/execute", json=body, headers={**host, "X-Access-Token": token})
        assert answer.status_code == 200, answer.text
        lines = answer.text.split("\n")
        assert lines[-1] == "" and all(lines[:-1])
        parsed = [json.loads(line) for line in lines[:-1]]
        assert all(isinstance(p, dict) and "type" in p for p in parsed)
        assert {"type": "stdout", "text": "via host\n"}.items() <= parsed[1].items() or any(
            p["type"] == "stdout" and p["text"] == "via host\n" for p in parsed
        )
        assert any(p["type"] == "result" and p["text"] == "42" and p["is_main_result"] for p in parsed)
        assert parsed[-1] == {"type": "end_of_execution"}
        assert http.get("/contexts", headers=host).status_code == 401
        traffic = {"E2B-Traffic-Access-Token": made.json()["trafficAccessToken"]}  # what the SDK sends there
        listed = http.get("/contexts", headers={**host, **traffic})
        assert listed.status_code == 200 and [c["language"] for c in listed.json()] == ["python", "javascript"]
        gone = http.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": server.key})
        assert gone.status_code == 204
        assert http.get("/contexts", headers=host).status_code == 502


async def test_async_run_code_streams_and_keeps_state() -> None:
    sandbox = await ci.AsyncSandbox.create(timeout=60)
    try:
        out: list[str] = []
        await sandbox.run_code("y = 2\nprint('hi')", on_stdout=lambda m: out.append(m.line))
        execution = await sandbox.run_code("y * 21")
        assert out == ["hi\n"] and execution.text == "42"
        context = await sandbox.create_code_context()
        assert (await sandbox.run_code("y", context=context)).error.name == "NameError"
    finally:
        await sandbox.kill()


def test_a_timeout_in_the_request_interrupts_the_cell(e2b_server: Server) -> None:
    """``/execute`` may bound the cell itself (``timeout`` in seconds): the kernel is interrupted and keeps state."""
    with httpx.Client(base_url=e2b_server.url, timeout=30) as http:
        made = http.post("/v2/sandboxes", json={"templateID": "code-interpreter-v1"}, headers={"X-API-KEY": API_KEY})
        sandbox_id = made.json()["sandboxID"]
        headers = {
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": "49999",
            "X-Access-Token": made.json()["envdAccessToken"],
        }
        try:
            body = {"code": "k = 5\nimport time\ntime.sleep(60)", "env_vars": None, "timeout": 1}
            started = time.monotonic()
            lines = [json.loads(line) for line in http.post("/execute", json=body, headers=headers).text.splitlines()]
            assert time.monotonic() - started < 10
            errors = [line for line in lines if line["type"] == "error"]
            assert [e["name"] for e in errors] == ["KeyboardInterrupt"] and lines[-1]["type"] == "end_of_execution"
            again = http.post("/execute", json={"code": "k"}, headers=headers).text.splitlines()
            assert any(json.loads(line).get("text") == "5" for line in again)
        finally:
            http.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": API_KEY})


@pytest.mark.skipif(not JS_SDK, reason="set EXECSPACE_E2B_JS to a directory with `npm install @e2b/code-interpreter`")
def test_js_code_interpreter_sdk_smoke(e2b_server: Server) -> None:
    node = shutil.which("node")
    assert node is not None, "node is not installed"
    script = Path(JS_SDK) / f"code-interpreter-{os.getpid()}.mjs"  # beside its node_modules, so the import resolves
    shutil.copy(Path(__file__).with_name("js") / "code_interpreter.mjs", script)
    try:
        env = {**os.environ, **e2b_server.sdk_env()}
        run = subprocess.run([node, str(script)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        script.unlink()
    assert run.returncode == 0 and run.stdout.strip() == "ok", f"{run.stdout}{run.stderr}"


def test_another_backend_is_refused_saying_which_to_use(tmp_path: Path) -> None:
    # code-interpreter-v1 on the host's dirs (its environment needs the sandbox backend)
    with running_server(tmp_path / "serve", "--backend", "local", "--kernel-environment", "none") as server:
        sandbox = ci.Sandbox.create(api_key=server.key, api_url=server.url, sandbox_url=server.url)
        try:
            with pytest.raises(ci.SandboxException, match="--backend sandbox"):
                sandbox.run_code("1")
            sandbox.files.write("still.txt", "works")  # the sandbox itself goes on
            assert sandbox.files.read("still.txt") == "works"
        finally:
            sandbox.kill()


def test_a_kernel_that_dies_is_reported_and_replaced(sbx: ci.Sandbox) -> None:
    sbx.run_code("lost = 1")
    died = sbx.run_code("import os; os._exit(3)")
    assert died.error is not None and died.error.name == "KernelDied"
    after = sbx.run_code("'lost' in dir()")
    assert after.error is None and after.text == "False"  # a fresh kernel: the state is gone, the context works


def test_a_stopped_server_leaves_no_kernel_behind(tmp_path: Path) -> None:
    tag = new_tag("kernel")
    with running_server(tmp_path / "serve") as server:
        sandbox = ci.Sandbox.create(api_key=server.key, api_url=server.url, sandbox_url=server.url)
        assert sandbox.run_code(_tagged_sleeper(tag)).error is None
        assert asyncio.run(wait_processes(tag, 1))
    assert wait_no_process(tag, within=10) == []


@pytest.mark.timeout(1200)  # builds code-interpreter once per machine (a later run finds it built)
def test_run_code_has_the_code_interpreter_environment_and_none_gives_the_system_python(tmp_path: Path) -> None:
    from execspace.environments import build, builtin_spec

    env = asyncio.run(build(builtin_spec("code-interpreter")))
    probe = "import sys\ntry:\n    import pandas\n    print(pandas.__file__)\nexcept ImportError:\n    print('none')\n"
    for flags, inside in (((), True), (("--kernel-environment", "none"), False)):
        with running_server(tmp_path / f"serve{len(flags)}", *flags) as server:
            sandbox = ci.Sandbox.create(api_key=server.key, api_url=server.url, sandbox_url=server.url)
            try:
                r = sandbox.run_code(probe)
            finally:
                sandbox.kill()
        assert r.error is None, r.error
        where = "".join(r.logs.stdout).strip()
        assert where.startswith(str(env.path)) is inside, where
