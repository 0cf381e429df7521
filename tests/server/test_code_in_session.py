"""A Python context's kernel runs inside its sandbox's session, beside the commands (official
``e2b-code-interpreter`` SDK against a real ``execspace serve``): one ``/tmp``, one process table, one loopback."""

from __future__ import annotations

import asyncio

import pytest

from execspace.testing.processes import TAG_VARIABLE, new_tag, wait_no_process, wait_processes

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
pytest.importorskip(
    "ipykernel", reason="the code interpreter's kernels are ipykernel: pip install 'execspace[jupyter]'"
)


def test_a_file_a_cell_writes_in_tmp_is_read_by_a_command(sbx: ci.Sandbox) -> None:
    assert sbx.run_code("open('/tmp/x', 'w').write('hi')").error is None
    assert sbx.commands.run("cat /tmp/x").stdout == "hi"
    sbx.commands.run("echo -n back > /tmp/y")
    assert sbx.run_code("open('/tmp/y').read()").text == "back"


def test_the_kernel_is_a_process_that_commands_see(sbx: ci.Sandbox) -> None:
    pid = int(sbx.run_code("import os; os.getpid()").text)
    listed = sbx.commands.run("ps -e -o pid=").stdout.split()
    assert str(pid) in listed, listed
    # that pid is the kernel's own process, not a namesake in another pid namespace
    assert "IPKernelApp" in sbx.commands.run(f"cat /proc/{pid}/cmdline").stdout


def test_a_server_started_in_a_cell_is_reached_by_a_command(sbx: ci.Sandbox) -> None:
    serve = (
        "import http.server, threading\n"
        "class Hello(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'from the kernel')\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        "httpd = http.server.HTTPServer(('127.0.0.1', 0), Hello)\n"
        "threading.Thread(target=httpd.serve_forever, daemon=True).start()\n"
        "httpd.server_address[1]"
    )
    port = int(sbx.run_code(serve).text)
    fetch = f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}').read())\""
    assert sbx.commands.run(fetch).stdout.strip() == "b'from the kernel'"


def test_killing_the_sandbox_leaves_no_kernel_process() -> None:
    tag = new_tag("pykernel")
    # the sandbox's envs reach every program of it: the kernel's own process carries the tag
    sandbox = ci.Sandbox.create(timeout=60, envs={TAG_VARIABLE: tag})
    try:
        assert sandbox.run_code("1 + 1").text == "2"
        assert asyncio.run(wait_processes(tag, 1))  # the kernel, as the host sees it
    finally:
        sandbox.kill()
    assert wait_no_process(tag, within=10) == []


def test_the_kernel_cannot_open_unix_sockets_when_the_sandbox_is_offline(sbx: ci.Sandbox) -> None:
    """Why the kernel's channels are relayed over its stdio: the offline session refuses ``socket(AF_UNIX)``."""
    probe = (
        "import socket\ntry:\n    socket.socket(socket.AF_UNIX).close()\n    found = 'open'\n"
        "except PermissionError:\n    found = 'refused'\nfound"
    )
    assert sbx.run_code(probe).text == "refused"


def test_outputs_larger_than_the_host_holds_ahead_arrive_whole(sbx: ci.Sandbox) -> None:
    """A 5 MB print comes in pieces, each let through once the cell's reader took the one before (the setup cell's
    reply, which no cell reads, holds nothing up)."""
    run = sbx.run_code("print('x' * 5_000_000)\n'done'", timeout=60)
    assert run.error is None and run.text == "done"
    assert "".join(run.logs.stdout) == "x" * 5_000_000 + "\n"
