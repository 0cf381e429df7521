"""The run path's shape, read from its source and traced: typed configuration (no ``Any``) in the factories and
runners that put an engine together, no import cycle inside the sandbox package, no subclass of the run machinery,
and the path from the CLI to the bwrap argv as docs/architecture.md records it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import execspace
from execspace.process.supervisor import Launch

SRC = Path(execspace.__file__).parent
SANDBOX = SRC / "backends" / "sandbox"
TYPED = [
    SANDBOX / "factory.py",
    SANDBOX / "runner.py",
    SANDBOX / "sessionrunner.py",
    SRC / "backends" / "local" / "__init__.py",
    SRC / "backends" / "jupyter" / "__init__.py",
]


def _annotations(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.arg) and node.annotation is not None) or isinstance(node, ast.AnnAssign):
            assert node.annotation is not None
            found.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            found.append(node.returns)
    return found


@pytest.mark.parametrize("path", TYPED, ids=lambda p: str(p.relative_to(SRC)))
def test_the_factories_and_runners_take_typed_configuration(path: Path) -> None:
    untyped = [
        f"{path.name}:{a.lineno}: {ast.unparse(a)}"
        for a in _annotations(ast.parse(path.read_text()))
        if any(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(a))
    ]
    assert untyped == []


def test_no_module_of_the_sandbox_package_imports_one_that_imports_it_back() -> None:
    imports: dict[str, set[str]] = {}
    for path in SANDBOX.glob("*.py"):
        found = imports.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):  # at any level: a deferred import is a cycle too
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module is None:
                    # a module of the package, or a name of its face (__init__)
                    found.update(a.name if (SANDBOX / f"{a.name}.py").exists() else "__init__" for a in node.names)
                else:
                    found.add(node.module.split(".")[0])
    cycles = []

    def walk(module: str, path: list[str]) -> None:
        for nxt in sorted(imports.get(module, ())):
            if nxt in path:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            else:
                walk(nxt, [*path, nxt])

    for module in sorted(imports):
        walk(module, [module])
    assert cycles == []


def test_a_launch_plan_is_never_changed_after_it_is_built() -> None:
    """A wrapper makes a new plan (``dataclasses.replace``); assigning to one is refused."""
    import dataclasses

    from execspace.process.supervisor import Launch

    plan = Launch(argv=["/bin/true"], env={}, cwd="/", marker="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.argv = ["/bin/false"]  # type: ignore[misc]
    assert dataclasses.replace(plan, argv=["/bin/false"]).argv == ["/bin/false"] and plan.argv == ["/bin/true"]


#: What a backend composes instead of subclassing: each is given its collaborators (a transport, wrappers…).
_MACHINERY = {"HostRunner", "SupervisedProcess"}


def test_no_backend_class_subclasses_the_run_machinery() -> None:
    inherits = []
    for path in (SRC / "backends").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
                if bases & _MACHINERY:
                    inherits.append(f"{path.relative_to(SRC)}:{node.name}")
    assert inherits == []


async def test_the_spawner_is_chosen_per_run_and_the_handle_is_always_a_supervised_process(tmp_path: Path) -> None:
    """A session run's handle is the one SupervisedProcess over the session's channel (its transport); a run the
    session cannot give what it asks (another network setting) is a direct spawn of a sandbox of its own."""
    from execspace.backends.sandbox.sessionprogram import SessionTransport
    from execspace.models import RunProgramSpec
    from execspace.process.supervisor import DirectTransport, SupervisedProcess
    from execspace.registry import probe_backend
    from execspace.testing.binding import make_traversable

    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", mode="session") as engine:
        ws = await engine.manager.create_workspace("t")
        runs = [
            await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", "read x; echo $x"], network=network))
            for network in (None, "on")
        ]
        for run in runs:
            await run.write_stdin("hi\n")
            await run.close_stdin()
            assert (await run.wait()).stdout == "hi\n"
    transports = [type(run.transport) for run in runs if isinstance(run, SupervisedProcess)]
    assert transports == [SessionTransport, DirectTransport]


async def test_a_wrapper_that_fails_releases_what_the_wrappers_before_it_opened(tmp_path: Path) -> None:
    """Each wrapper registers what it opened on the run; one that fails ends the run before it began, and what the
    earlier ones registered is released all the same (once), as for a start that failed."""
    from execspace.backends.local import LocalBackend, LocalOptions
    from execspace.models import RunProgramSpec
    from execspace.process.hostrunner import HostRunner

    released: list[str] = []

    def opens(prep: object, launch: Launch) -> Launch:
        launch.stack.callback(lambda: released.append("on_exit"))
        launch.stack.after_spawn(lambda: released.append("after_spawn"))
        return launch

    def fails(prep: object, launch: Launch) -> Launch:
        raise OSError(5, "the wrapper could not open what it needs")

    engine = await LocalBackend.open(LocalOptions(workspace_root=tmp_path / "ws"))
    try:
        ws = await engine.manager.create_workspace("w")
        assert isinstance(engine.runner, HostRunner)
        runner = engine.runner.sharing(wrappers=[opens, fails])
        with pytest.raises(OSError, match="could not open"):
            await runner.start_program(ws, RunProgramSpec("true"))
        assert released == ["on_exit", "after_spawn"]
    finally:
        await engine.aclose()


def test_a_runs_exit_stack_releases_newest_first_and_every_one_once() -> None:
    """What the steps opened is released in reverse order, each even when one before it raised, and only once."""
    from execspace.process.runstack import RunStack

    stack, released = RunStack(), []
    stack.callback(lambda: released.append("first"))

    def broken() -> None:
        released.append("broken")
        raise OSError(9, "already closed")

    stack.callback(broken)
    stack.callback(lambda: released.append("last"))
    stack.after_spawn(lambda: released.append("fd"))
    with pytest.raises(OSError, match="already closed"):
        stack.abandon()
    assert released == ["last", "broken", "first", "fd"]
    stack.abandon()
    assert released == ["last", "broken", "first", "fd"]


def test_the_cli_reaches_the_bwrap_argv_through_eight_files_in_one_direction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``execspace run --backend sandbox -- /bin/true``, traced: the execspace files on the call stack when the bwrap
    argv is built are at most eight, and none comes back after another was entered (the recorded path)."""
    import sys
    from types import FrameType

    from execspace.backends.sandbox import bwrap
    from execspace.cli.main import main

    if bwrap.find_bwrap() is None:
        pytest.skip("bubblewrap is not installed")
    stacks: list[list[str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is bwrap.build_argv.__code__:
            chain, f = [], frame
            while f is not None:
                name = f.f_code.co_filename
                if name.startswith(str(SRC)):
                    chain.append(str(Path(name).relative_to(SRC)))
                f = f.f_back
            stacks.append(chain[::-1])

    monkeypatch.chdir(tmp_path)
    sys.setprofile(profile)
    try:
        code = main(["run", "--backend", "sandbox", "--", "/bin/true"])
    finally:
        sys.setprofile(None)
    assert code == 0
    assert stacks, "the run never built a bwrap argv"
    files = [f for i, f in enumerate(stacks[0]) if i == 0 or stacks[0][i - 1] != f]  # each file entered
    assert len(set(files)) <= 8, files
    assert len(files) == len(set(files)), f"a file is entered again after another: {files}"
