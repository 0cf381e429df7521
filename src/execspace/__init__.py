"""execspace: a controlled place for AI agents to run code.

Quick start::

    import execspace
    from execspace import PutFile, RunProgramSpec

    async with execspace.open_engine() as engine:          # safest backend that works here
        ws = await engine.manager.create_workspace("app/user/session")
        await engine.fs.put_files(ws, [PutFile("work/hello.py", "print('hi')")])
        result = await engine.runner.run_program(ws, RunProgramSpec("python3", ["hello.py"]))
        print(result.stdout, engine.describe().isolation)
"""

from __future__ import annotations

from .capabilities import Capabilities, Isolation
from .engine import BaseEngine, open_engine
from .envpolicy import EnvPolicy
from .errors import (
    ArtifactNotFound,
    BackendError,
    CapabilityError,
    ExecspaceError,
    ExecutionTimeout,
    InputError,
    InvalidSpec,
    LimitExceeded,
    PartialOutputCommit,
    PathDenied,
    PolicyViolation,
    ProgramFailed,
    SetupFailed,
    UnsupportedBackend,
    UnsupportedLanguage,
    UsageError,
    WorkspaceNotFound,
)
from .executor import CodeBlockDelimiter, CodeExecutor, code_executor, extract_code_blocks
from .models import (
    BlockResult,
    CodeBlock,
    CodeExecutionInput,
    CodeExecutionResult,
    File,
    FileRef,
    InputSpec,
    OutputChunk,
    OutputManifest,
    OutputSpec,
    Persistence,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    Workspace,
    WorkspacePolicy,
)
from .protocols import Engine, ProgramHandle, ProgramRunner, WorkspaceFS, WorkspaceManager

__version__ = "0.1.0"

__all__ = [
    "ArtifactNotFound",
    "BackendError",
    "BaseEngine",
    "BlockResult",
    "Capabilities",
    "CapabilityError",
    "CodeBlock",
    "CodeBlockDelimiter",
    "CodeExecutionInput",
    "CodeExecutionResult",
    "CodeExecutor",
    "Engine",
    "EnvPolicy",
    "ExecspaceError",
    "ExecutionTimeout",
    "File",
    "FileRef",
    "InputError",
    "InputSpec",
    "InvalidSpec",
    "Isolation",
    "LimitExceeded",
    "OutputChunk",
    "OutputManifest",
    "OutputSpec",
    "PartialOutputCommit",
    "PathDenied",
    "Persistence",
    "PolicyViolation",
    "ProgramFailed",
    "ProgramHandle",
    "ProgramRunner",
    "PutFile",
    "ResourceLimits",
    "RunProgramSpec",
    "RunResult",
    "SetupFailed",
    "UnsupportedBackend",
    "UnsupportedLanguage",
    "UsageError",
    "Workspace",
    "WorkspaceFS",
    "WorkspaceManager",
    "WorkspaceNotFound",
    "WorkspacePolicy",
    "__version__",
    "code_executor",
    "extract_code_blocks",
    "open_engine",
]
