"""The public surface: what ``import execspace`` promises, and the error tree."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import execspace
import execspace.sync
from execspace import errors, protocols

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


def _type_checking_imports(path: Path) -> dict[str, str]:
    """Name -> relative module of each ``from .module import name`` under ``if TYPE_CHECKING:`` in ``path``."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom) and imp.level:
                    found.update({alias.name: "." * imp.level + (imp.module or "") for alias in imp.names})
    return found


def test_the_lazy_names_are_typed_as_what_they_resolve_to() -> None:
    """``execspace`` resolves its names on first use (``_LAZY``); a type checker sees only the imports under
    ``TYPE_CHECKING``, and a name missing there types as ``Any`` (``__getattr__``): the two lists and ``__all__``
    must agree, module by module."""
    typed = _type_checking_imports(Path(execspace.__file__))
    lazy: dict[str, str] = execspace._LAZY  # type: ignore[attr-defined]
    assert typed == lazy
    assert set(lazy) == set(execspace.__all__) - {"__version__"}


def test_every_seam_protocol_is_exported_at_top_level() -> None:
    missing = {n for n in (*protocols.__all__, *errors.__all__) if getattr(execspace, n, None) is None}
    assert missing == set()
    assert set(protocols.__all__) <= set(execspace.__all__)


def _faces() -> list[str]:
    found = ["execspace.sync", "execspace.protocols"]
    for info in pkgutil.walk_packages(execspace.__path__, "execspace."):
        if info.ispkg:
            found.append(info.name)
    return found


@pytest.mark.parametrize("name", _faces())
def test_a_package_face_exports_exactly_what_it_names(name: str) -> None:
    """Each package's face (and the sync facade's): every name of ``__all__`` resolves, once, and a star import
    gives exactly them."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:  # a package over an optional extra that is not installed here
        if exc.name is not None and exc.name.split(".")[0] != "execspace":
            pytest.skip(f"{name} needs {exc.name}, not installed here")
        raise
    names = list(getattr(module, "__all__", []))
    assert len(names) == len(set(names)), f"duplicates in {name}.__all__"
    assert [n for n in names if not hasattr(module, n)] == []
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    if names:
        assert set(namespace) - {"__builtins__"} == set(names)


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
