"""LlamaIndex: a tool spec whose tools run commands and code, and move files, in one execspace workspace.

::

    async with execspace.open_engine("sandbox") as engine:
        spec = ExecspaceToolSpec(engine, policy=CommandPolicy())
        agent = FunctionAgent(tools=spec.to_tool_list(), llm=llm)
        await agent.run("plot data.csv")
        await spec.aclose()

The tools are execspace's own (``run_command`` is the ``workspace_exec`` tool: the command policy, output
budget and timeouts; ``run_code`` is ``execute_code``: fenced-block languages, kernels where the engine has
them, files written to ``out/`` reported), so an agent gets the same answers as through the MCP server; results
are JSON text. ``write_file`` and ``read_file`` reach only ``work/`` and ``out/``, through the engine's confined
file API. LlamaIndex's own code interpreter spec runs ``subprocess`` on the host; these run where the engine does.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

from ..errors import ExecspaceError, PathDenied, WorkspaceNotFound
from ..executor import CodeExecutor
from ..models import DEFAULT_TIMEOUT, PutFile
from ..protocols import Engine
from ..tools import CommandChecker, ExecuteCodeTool, WorkspaceExecTool, error_result
from . import MissingExtra

try:
    from llama_index.core.tools.tool_spec.base import BaseToolSpec
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise MissingExtra("llama-index", "LlamaIndex (llama-index-core)", exc) from exc

__all__ = ["ExecspaceToolSpec"]

#: Text files the model may read back at once (a larger one is cut, and says so).
MAX_READ_BYTES = 256 * 1024
_AGENT_DIRS = ("work", "out")


class ExecspaceToolSpec(BaseToolSpec):
    """Tools over one workspace of ``engine`` (which the caller opens and closes).

    Args:
        engine: the backend, e.g. ``open_engine("sandbox")``.
        workspace_id: the workspace (default ``llama-index/<uuid>``); :meth:`aclose` removes it.
        policy: the command policy of ``run_command`` (``None`` runs any command line).
        timeout: deadline of a code run, in seconds (commands: the model's, up to the tool's maximum).
    """

    spec_functions = ["run_command", "run_code", "write_file", "read_file"]  # noqa: RUF012 - LlamaIndex's API

    def __init__(
        self,
        engine: Engine,
        *,
        workspace_id: str | None = None,
        policy: CommandChecker | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self.engine = engine
        self.workspace_id = workspace_id or f"llama-index/{uuid.uuid4()}"
        self._exec = WorkspaceExecTool(engine, workspace_id=self.workspace_id, policy=policy)
        self._code = ExecuteCodeTool(CodeExecutor(engine, timeout=timeout), execution_id=self.workspace_id)

    async def run_command(
        self,
        command: str,
        timeout: float | None = None,  # noqa: ASYNC109 - the model's argument (the tool's schema), for the program
    ) -> str:
        """Run a shell command line in the workspace (working directory work/) and return a JSON result with its
        exit code, output and the files it created or changed under out/.

        Args:
            command: the command line, e.g. "python3 analyse.py data.csv".
            timeout: seconds it may run (default: the tool's).
        """
        arguments: dict[str, Any] = {"command": command}
        if timeout is not None:
            arguments["timeout"] = timeout
        return json.dumps(await self._exec.call(arguments))

    async def run_code(self, code: str, language: str = "python") -> str:
        """Run a block of code in the workspace and return a JSON result with its output and the files it wrote
        under out/ (plots saved there come back as files).

        Args:
            code: the source code.
            language: its language: python or bash.
        """
        return json.dumps(await self._code.call({"language": language, "code": code}))

    async def write_file(self, path: str, content: str) -> str:
        """Write a text file in the workspace, under work/ (relative paths) or out/ ("out/report.md").

        Args:
            path: the file's path, e.g. "data/input.csv" (in work/) or "out/report.md".
            content: the text to write.
        """
        try:
            rel = _agent_path(path)
            ws = await self.engine.manager.create_workspace(self.workspace_id)
            await self.engine.fs.put_files(ws, [PutFile(rel, content)])
        except ExecspaceError as exc:
            return json.dumps(error_result(exc))
        return json.dumps({"status": "ok", "path": rel, "bytes": len(content.encode())})

    async def read_file(self, path: str) -> str:
        """Read a text file of the workspace, under work/ (relative paths) or out/.

        Args:
            path: the file's path, e.g. "results.txt" (in work/) or "out/report.md".
        """
        try:
            rel = _agent_path(path)
            ws = await self.engine.manager.create_workspace(self.workspace_id)
            file = await self.engine.fs.read_file(ws, rel, max_bytes=MAX_READ_BYTES)
        except FileNotFoundError:
            return json.dumps({"status": "error", "error": "FileNotFound", "message": f"no file at {path!r}"})
        except ExecspaceError as exc:
            return json.dumps(error_result(exc))
        return json.dumps({"status": "ok", "path": rel, "content": file.text, "truncated": file.truncated})

    async def aclose(self) -> None:
        """Stop the background commands and remove the workspace with everything in it."""
        await self._exec.aclose()
        with contextlib.suppress(WorkspaceNotFound):
            await self.engine.manager.cleanup(await self.engine.manager.get_workspace(self.workspace_id))


def _agent_path(path: str) -> str:
    """The workspace path of a model's path: ``out/...`` as given, anything else under ``work/``."""
    parts = [p for p in path.strip().split("/") if p not in ("", ".")]
    if path.strip().startswith("/") or ".." in parts or not parts:
        raise PathDenied(path, "use a path relative to work/, or one under out/ (no '..', not absolute)")
    rel = "/".join(parts if parts[0] in _AGENT_DIRS else ["work", *parts])
    if rel in _AGENT_DIRS:
        raise PathDenied(path, "a directory, not a file")
    return rel
