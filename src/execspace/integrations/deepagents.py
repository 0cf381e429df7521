"""LangChain deepagents: a sandbox backend whose commands and files are one execspace workspace's.

::

    with execspace.sync.open_engine("sandbox") as engine:
        backend = ExecspaceSandbox(engine)
        agent = create_deep_agent(model=model, backend=backend)
        agent.invoke({"messages": [{"role": "user", "content": "count the lines of data.csv"}]})
        backend.close()

``execute`` is ``sh -c`` in the workspace's ``work/`` directory with the engine's policy and a timeout, stdout and
stderr interleaved as the program wrote them; ``upload_files`` and ``download_files`` go through the engine's
confined file API, file by file (one refused path fails alone). deepagents' other file tools (``ls``, ``read``,
``edit``, ``grep``, ``glob``) run as commands through ``execute``, as in every ``BaseSandbox``. Paths are the
programs' own (``/workspace/work/data.csv`` on the sandbox backend) or relative to ``work/``; only ``work/`` and
``out/`` are the agent's: the rest of the workspace (skills, the engine's records) is refused.

deepagents calls a backend synchronously (its async methods run the sync ones in a thread), so this one takes the
blocking facade (:mod:`execspace.sync`) of an engine.
"""

from __future__ import annotations

import posixpath
import uuid

from ..errors import PathDenied
from ..models import DEFAULT_TIMEOUT, FileKind, PutFile, RunProgramSpec, Workspace
from ..sync import SyncEngine
from . import MissingExtra

try:
    from deepagents.backends.protocol import (
        FILE_NOT_FOUND,
        INVALID_PATH,
        IS_DIRECTORY,
        PERMISSION_DENIED,
        ExecuteResponse,
        FileDownloadResponse,
        FileUploadResponse,
    )
    from deepagents.backends.sandbox import BaseSandbox
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise MissingExtra("deepagents", "LangChain deepagents", exc) from exc

__all__ = ["AGENT_DIRS", "TIMEOUT_EXIT_CODE", "ExecspaceSandbox"]

#: The workspace directories the agent's file calls may touch: its working directory and the collected outputs.
AGENT_DIRS = ("work", "out")
#: Exit code of a command stopped by its timeout (as ``timeout(1)`` reports it).
TIMEOUT_EXIT_CODE = 124
#: Runs the command in this shell with stderr on stdout: one stream, in the order the program wrote it.
_COMBINED = 'exec 2>&1; eval "$1"'


class ExecspaceSandbox(BaseSandbox):
    """One workspace of ``engine`` as a deepagents sandbox backend.

    Args:
        engine: the blocking facade of the engine (``execspace.sync.open_engine("sandbox")``).
        workspace_id: the workspace's id (default ``deepagents/<uuid>``); :meth:`close` removes it.
        timeout: deadline of a command the agent runs without one, in seconds (``timeout=0``: none).
    """

    def __init__(
        self, engine: SyncEngine, *, workspace_id: str | None = None, timeout: float | None = DEFAULT_TIMEOUT
    ) -> None:
        self.engine = engine
        self.timeout = timeout
        self.workspace: Workspace = engine.manager.create_workspace(workspace_id or f"deepagents/{uuid.uuid4()}")

    @property
    def id(self) -> str:
        return self.workspace.id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        deadline = self.timeout if timeout is None else (timeout or None)
        spec = RunProgramSpec("sh", ["-c", _COMBINED, "sh", command], timeout=deadline)
        result = self.engine.runner.run_program(self.workspace, spec)
        output = result.stdout
        if result.timed_out:
            output += f"\n[timed out after {deadline:g}s: the command and everything it started were killed]"
            return ExecuteResponse(output=output, exit_code=TIMEOUT_EXIT_CODE, truncated=result.stdout_truncated)
        return ExecuteResponse(output=output, exit_code=result.exit_code, truncated=result.stdout_truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            try:
                self.engine.fs.put_files(self.workspace, [PutFile(self._relative(path), content)])
                responses.append(FileUploadResponse(path=path))
            except PathDenied:
                responses.append(FileUploadResponse(path=path, error=self._denial(path)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            try:
                content = self.engine.fs.read_file(self.workspace, self._relative(path)).content
                responses.append(FileDownloadResponse(path=path, content=content))
            except FileNotFoundError:
                responses.append(FileDownloadResponse(path=path, error=FILE_NOT_FOUND))
            except PathDenied:
                responses.append(FileDownloadResponse(path=path, error=self._denial(path)))
        return responses

    def close(self) -> None:
        """Remove the workspace, its files and anything still running in it."""
        if not self.engine.closed:
            self.engine.manager.cleanup(self.workspace)

    def _relative(self, path: str) -> str:
        """The workspace-relative path of an agent's path, if it is in one of :data:`AGENT_DIRS`."""
        if not path or "\0" in path:
            raise PathDenied(path, "empty path or NUL byte")
        absolute = posixpath.normpath(posixpath.join(self.workspace.path, "work", path))
        rel = posixpath.relpath(absolute, self.workspace.path)
        if rel.split("/")[0] not in AGENT_DIRS or rel in AGENT_DIRS:
            raise PathDenied(path, f"outside the agent's directories ({', '.join(f'{ws}/' for ws in AGENT_DIRS)})")
        return rel

    def _denial(self, path: str) -> str:
        """deepagents' error code for a refused path: malformed, a directory in the way, or denied."""
        if not path or "\0" in path:
            return INVALID_PATH
        try:
            if self.engine.fs.stat(self.workspace, self._relative(path)).kind is FileKind.DIR:
                return IS_DIRECTORY
        except (FileNotFoundError, PathDenied):
            pass
        return PERMISSION_DENIED
