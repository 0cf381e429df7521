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

__version__ = "0.1.0"

# Not typing.TYPE_CHECKING: importing typing costs more than the command line's fast path
# (type checkers treat any name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .backend import BackendOptions, HostOptions, Probe
    from .backends.container import ContainerOptions
    from .backends.local import LocalOptions
    from .backends.sandbox import SandboxOptions
    from .capabilities import Capabilities, Isolation, KernelCapabilities
    from .engine import BaseEngine, KernelEngine, open_engine
    from .envpolicy import EnvPolicy
    from .errors import (
        ArtifactNotFound,
        BackendError,
        CannotExecute,
        CapabilityError,
        CommandNotFound,
        EnvironmentBuildFailed,
        EnvironmentBuilding,
        EnvironmentNotFound,
        ExecspaceError,
        ExecutionTimeout,
        FreezeFailed,
        InputError,
        InvalidSpec,
        LimitExceeded,
        NotExecutable,
        PartialOutputCommit,
        PathDenied,
        PathIsDirectory,
        PolicyViolation,
        ProgramFailed,
        ProgramNotFound,
        SandboxLost,
        SetupFailed,
        SnapshotNotFound,
        UnsupportedBackend,
        UnsupportedLanguage,
        UsageError,
        UserNotFound,
        WorkspaceFileNotFound,
        WorkspaceNotFound,
    )
    from .executor import CodeBlockDelimiter, CodeExecutor, code_executor, extract_code_blocks
    from .models import (
        BlockResult,
        CellResult,
        CodeBlock,
        CodeExecutionInput,
        CodeExecutionResult,
        File,
        FileEntry,
        FileKind,
        FileRef,
        HeaderInjection,
        InputSpec,
        NetworkAttempt,
        NetworkPolicy,
        OutputChunk,
        OutputManifest,
        OutputSpec,
        Persistence,
        ProgramInfo,
        PtySize,
        PutFile,
        ResourceLimits,
        RunProgramSpec,
        RunResult,
        Secret,
        Snapshot,
        Workspace,
        WorkspacePolicy,
    )
    from .protocols import (
        CellKernels,
        Engine,
        FileReader,
        Kernels,
        ProgramHandle,
        ProgramRunner,
        SupportsCpuUsage,
        SupportsFileMetadata,
        SupportsFileStreams,
        SupportsFreezing,
        SupportsKernels,
        SupportsSnapshots,
        WorkspaceFS,
        WorkspaceLocks,
        WorkspaceManager,
    )

# Names resolve on first use (PEP 562): the ``execspace`` command's fast path imports this
# package and must not pay for the whole library when a warm daemon runs the command.
_LAZY = {
    "BackendOptions": ".backend",
    "HostOptions": ".backend",
    "Probe": ".backend",
    "ContainerOptions": ".backends.container",
    "LocalOptions": ".backends.local",
    "SandboxOptions": ".backends.sandbox",
    "Capabilities": ".capabilities",
    "Isolation": ".capabilities",
    "KernelCapabilities": ".capabilities",
    "BaseEngine": ".engine",
    "KernelEngine": ".engine",
    "open_engine": ".engine",
    "EnvPolicy": ".envpolicy",
    "ArtifactNotFound": ".errors",
    "BackendError": ".errors",
    "CannotExecute": ".errors",
    "CapabilityError": ".errors",
    "CommandNotFound": ".errors",
    "ExecspaceError": ".errors",
    "ExecutionTimeout": ".errors",
    "FreezeFailed": ".errors",
    "InputError": ".errors",
    "InvalidSpec": ".errors",
    "LimitExceeded": ".errors",
    "NotExecutable": ".errors",
    "UserNotFound": ".errors",
    "PartialOutputCommit": ".errors",
    "SandboxLost": ".errors",
    "PathDenied": ".errors",
    "PathIsDirectory": ".errors",
    "PolicyViolation": ".errors",
    "ProgramFailed": ".errors",
    "SetupFailed": ".errors",
    "SnapshotNotFound": ".errors",
    "UnsupportedBackend": ".errors",
    "UnsupportedLanguage": ".errors",
    "UsageError": ".errors",
    "WorkspaceNotFound": ".errors",
    "WorkspaceFileNotFound": ".errors",
    "EnvironmentNotFound": ".errors",
    "EnvironmentBuildFailed": ".errors",
    "EnvironmentBuilding": ".errors",
    "ProgramNotFound": ".errors",
    "CodeBlockDelimiter": ".executor",
    "CodeExecutor": ".executor",
    "code_executor": ".executor",
    "extract_code_blocks": ".executor",
    "BlockResult": ".models",
    "CellResult": ".models",
    "CodeBlock": ".models",
    "CodeExecutionInput": ".models",
    "CodeExecutionResult": ".models",
    "File": ".models",
    "FileEntry": ".models",
    "FileKind": ".models",
    "FileRef": ".models",
    "InputSpec": ".models",
    "NetworkAttempt": ".models",
    "NetworkPolicy": ".models",
    "HeaderInjection": ".models",
    "Secret": ".models",
    "OutputChunk": ".models",
    "OutputManifest": ".models",
    "OutputSpec": ".models",
    "Persistence": ".models",
    "PutFile": ".models",
    "ProgramInfo": ".models",
    "PtySize": ".models",
    "ResourceLimits": ".models",
    "RunProgramSpec": ".models",
    "RunResult": ".models",
    "Snapshot": ".models",
    "Workspace": ".models",
    "WorkspacePolicy": ".models",
    "Engine": ".protocols",
    "FileReader": ".protocols",
    "CellKernels": ".protocols",
    "Kernels": ".protocols",
    "SupportsFileMetadata": ".protocols",
    "SupportsFileStreams": ".protocols",
    "SupportsCpuUsage": ".protocols",
    "SupportsFreezing": ".protocols",
    "SupportsKernels": ".protocols",
    "SupportsSnapshots": ".protocols",
    "ProgramHandle": ".protocols",
    "ProgramRunner": ".protocols",
    "WorkspaceFS": ".protocols",
    "WorkspaceLocks": ".protocols",
    "WorkspaceManager": ".protocols",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'execspace' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ArtifactNotFound",
    "BackendError",
    "BackendOptions",
    "BaseEngine",
    "BlockResult",
    "CannotExecute",
    "Capabilities",
    "CapabilityError",
    "CellKernels",
    "CellResult",
    "CodeBlock",
    "CodeBlockDelimiter",
    "CodeExecutionInput",
    "CodeExecutionResult",
    "CodeExecutor",
    "CommandNotFound",
    "ContainerOptions",
    "Engine",
    "EnvPolicy",
    "EnvironmentBuildFailed",
    "EnvironmentBuilding",
    "EnvironmentNotFound",
    "ExecspaceError",
    "ExecutionTimeout",
    "File",
    "FileEntry",
    "FileKind",
    "FileReader",
    "FileRef",
    "FreezeFailed",
    "HeaderInjection",
    "HostOptions",
    "InputError",
    "InputSpec",
    "InvalidSpec",
    "Isolation",
    "KernelCapabilities",
    "KernelEngine",
    "Kernels",
    "LimitExceeded",
    "LocalOptions",
    "NetworkAttempt",
    "NetworkPolicy",
    "NotExecutable",
    "OutputChunk",
    "OutputManifest",
    "OutputSpec",
    "PartialOutputCommit",
    "PathDenied",
    "PathIsDirectory",
    "Persistence",
    "PolicyViolation",
    "Probe",
    "ProgramFailed",
    "ProgramHandle",
    "ProgramInfo",
    "ProgramNotFound",
    "ProgramRunner",
    "PtySize",
    "PutFile",
    "ResourceLimits",
    "RunProgramSpec",
    "RunResult",
    "SandboxLost",
    "SandboxOptions",
    "Secret",
    "SetupFailed",
    "Snapshot",
    "SnapshotNotFound",
    "SupportsCpuUsage",
    "SupportsFileMetadata",
    "SupportsFileStreams",
    "SupportsFreezing",
    "SupportsKernels",
    "SupportsSnapshots",
    "UnsupportedBackend",
    "UnsupportedLanguage",
    "UsageError",
    "UserNotFound",
    "Workspace",
    "WorkspaceFS",
    "WorkspaceFileNotFound",
    "WorkspaceLocks",
    "WorkspaceManager",
    "WorkspaceNotFound",
    "WorkspacePolicy",
    "__version__",
    "code_executor",
    "extract_code_blocks",
    "open_engine",
]
