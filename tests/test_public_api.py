"""The public surface: what ``import execspace`` promises, and the error tree."""

from __future__ import annotations

import inspect

import pytest

import execspace
from execspace import errors

#: Names callers rely on. Others may be added; none of these may disappear.
REQUIRED = {
    "ArtifactNotFound",
    "BackendError",
    "BackendOptions",
    "BaseEngine",
    "BlockResult",
    "Capabilities",
    "CapabilityError",
    "CodeBlock",
    "CodeExecutionInput",
    "CodeExecutionResult",
    "ContainerOptions",
    "Engine",
    "EnvPolicy",
    "ExecspaceError",
    "ExecutionTimeout",
    "File",
    "FileRef",
    "HostOptions",
    "InputError",
    "InputSpec",
    "InvalidSpec",
    "Isolation",
    "LimitExceeded",
    "LocalOptions",
    "NetworkAttempt",
    "NetworkPolicy",
    "OutputChunk",
    "OutputManifest",
    "OutputSpec",
    "PartialOutputCommit",
    "PathDenied",
    "Persistence",
    "PolicyViolation",
    "Probe",
    "ProgramFailed",
    "ProgramHandle",
    "ProgramRunner",
    "PutFile",
    "ResourceLimits",
    "RunProgramSpec",
    "RunResult",
    "SandboxOptions",
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
    "open_engine",
}


def test_required_names_are_exported() -> None:
    missing = REQUIRED - set(execspace.__all__)
    assert not missing, f"removed from execspace.__all__: {sorted(missing)}"


def test_every_exported_name_resolves() -> None:
    assert len(execspace.__all__) == len(set(execspace.__all__)), "duplicates in __all__"
    for name in execspace.__all__:
        assert getattr(execspace, name, None) is not None, name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from execspace import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(execspace.__all__)


def test_version() -> None:
    parts = execspace.__version__.split(".")
    assert len(parts) >= 2 and all(p.isdigit() for p in parts[:2])


def _exported_errors() -> list[type[BaseException]]:
    objs = [getattr(execspace, n, None) for n in execspace.__all__]
    return [o for o in objs if inspect.isclass(o) and issubclass(o, BaseException)]


ERROR_CLASSES = sorted({getattr(errors, n) for n in errors.__all__} | set(_exported_errors()), key=lambda c: c.__name__)


def test_every_error_is_exported_at_top_level() -> None:
    for name in errors.__all__:
        assert getattr(execspace, name) is getattr(errors, name)
        assert name in execspace.__all__


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_error_is_documented_and_in_the_tree(cls: type[BaseException]) -> None:
    assert issubclass(cls, execspace.ExecspaceError)
    doc = cls.__doc__ or ""
    assert doc.strip() and doc != Exception.__doc__, f"{cls.__name__} has no docstring of its own"
    if cls.__module__ == errors.__name__:
        assert cls.__name__ in (errors.__doc__ or ""), f"{cls.__name__} is missing from the documented tree"


def test_errors_also_derive_from_the_builtin_a_caller_expects() -> None:
    assert issubclass(execspace.PathDenied, PermissionError)
    assert issubclass(execspace.WorkspaceNotFound, LookupError)
    assert issubclass(execspace.ArtifactNotFound, LookupError)
    assert issubclass(execspace.ExecutionTimeout, TimeoutError)
    assert issubclass(execspace.InvalidSpec, ValueError)
    assert issubclass(execspace.CapabilityError, execspace.PolicyViolation)
    assert issubclass(execspace.PartialOutputCommit, execspace.BackendError)


def test_error_messages_carry_their_fields() -> None:
    denied = execspace.PathDenied("../x", "'..' components are not allowed")
    assert denied.path == "../x" and "'..'" in str(denied)
    cap = execspace.CapabilityError("network off", "local", "use the sandbox")
    assert cap.capability == "network off" and cap.backend == "local"
    assert "local" in str(cap) and "use the sandbox" in str(cap)
    setup = execspace.SetupFailed("sandbox", "bwrap missing", "apt-get install bubblewrap")
    assert "bwrap missing" in str(setup) and "Fix: apt-get install bubblewrap" in str(setup)


async def test_open_engine_rejects_unknown_backends() -> None:
    with pytest.raises(execspace.UnsupportedBackend):
        async with execspace.open_engine("no-such-backend"):
            pass


async def test_local_engine_satisfies_the_protocols(engine: execspace.BaseEngine) -> None:
    assert isinstance(engine, execspace.Engine)
    assert isinstance(engine.manager, execspace.WorkspaceManager)
    assert isinstance(engine.fs, execspace.WorkspaceFS)
    assert isinstance(engine.runner, execspace.ProgramRunner)
    caps = engine.describe()
    assert caps.backend == "local" and caps.isolation is execspace.Isolation.NONE
    assert not caps.network_control and "pids" not in caps.enforced_limits
    assert {
        "timeout",
        "output_bytes",
        "memory_bytes",
        "cpu_seconds",
        "file_size_bytes",
    } <= caps.enforced_limits


async def test_closed_engine_refuses_use(tmp_path: object) -> None:
    async with execspace.open_engine("local", workspace_root=str(tmp_path)) as eng:
        pass
    with pytest.raises(execspace.UsageError):
        _ = eng.manager
