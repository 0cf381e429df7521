"""Typed backend options: one frozen dataclass per backend, built once from ``open_engine``'s keywords or given as
``options=``; a wrong name, a wrong type or a missing required option is an ``InvalidSpec`` naming it and the
valid options, never a ``TypeError``."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from types import ModuleType

import pytest

import execspace
from execspace import BaseEngine, HostOptions, InvalidSpec, LocalOptions, Probe, RunProgramSpec, SandboxOptions
from execspace.backends.container import ContainerOptions
from execspace.backends.local import LocalBackend
from execspace.registry import build_options, load_backend, probe_backend


def jupyter() -> ModuleType:
    """The jupyter backend's face (which imports jupyter_client), or a skip where its extra is not installed."""
    pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")
    import execspace.backends.jupyter

    return execspace.backends.jupyter


async def _runs_true(engine: BaseEngine) -> int:
    ws = await engine.manager.create_workspace("opts")
    return (await engine.runner.run_program(ws, RunProgramSpec("true"))).exit_code


async def test_keywords_and_options_open_the_same_engine(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path / "kw", kill_grace=0.5) as by_keywords:
        assert await _runs_true(by_keywords) == 0
    options = LocalOptions(workspace_root=tmp_path / "typed", kill_grace=0.5)
    async with execspace.open_engine("local", options=options) as typed:
        assert await _runs_true(typed) == 0
    assert (tmp_path / "kw").is_dir() and (tmp_path / "typed").is_dir()


async def test_keywords_go_over_the_options_given(tmp_path: Path) -> None:
    base = LocalOptions(workspace_root=tmp_path / "base")
    async with execspace.open_engine("local", options=base, workspace_root=tmp_path / "over") as engine:
        assert await _runs_true(engine) == 0
    assert (tmp_path / "over").is_dir() and not (tmp_path / "base").exists()


async def test_the_shared_host_options_open_any_host_backend(tmp_path: Path) -> None:
    async with execspace.open_engine("local", options=HostOptions(workspace_root=tmp_path / "ws")) as engine:
        assert await _runs_true(engine) == 0
    assert (tmp_path / "ws").is_dir()


async def test_options_of_another_backend_are_invalid_spec(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="backend 'local' takes LocalOptions, not SandboxOptions"):
        async with execspace.open_engine("local", options=SandboxOptions(workspace_root=tmp_path)):
            pass
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("keywords", "says"),
    [
        ({"kill_grace": "2"}, "option kill_grace takes float, not str"),
        ({"kill_grace": True}, "option kill_grace takes float, not bool"),
        ({"workspace_root": 3}, "option workspace_root takes Path | str | None, not int"),
        ({"host_roots": "/srv"}, "option host_roots takes Sequence[Path | str], not str"),
        ({"host_roots": [Path("/srv"), 1]}, "option host_roots takes Sequence[Path | str]"),
        ({"artifacts": object()}, "option artifacts takes ArtifactService | None"),
        ({"env_policy": {"PATH": "/bin"}}, "option env_policy takes EnvPolicy | None, not dict"),
    ],
)
async def test_a_wrong_type_is_invalid_spec_naming_the_option(
    keywords: dict[str, object], says: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidSpec) as info:
        async with execspace.open_engine("local", **{"workspace_root": tmp_path / "ws", **keywords}):
            pass
    assert says in str(info.value)
    assert (
        "its options: artifacts, audit, env_policy, host_roots, kill_grace, output_rate, tracer, workspace_root"
        in str(info.value)
    )
    assert not (tmp_path / "ws").exists()  # refused before anything was made


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (lambda: SandboxOptions(network="on"), "option network takes bool | NetworkPolicy | None, not str"),
        (lambda: SandboxOptions(policy="read-only"), "option policy takes SandboxPolicy | None"),
        (lambda: ContainerOptions(user=(1000,)), "option user takes tuple[int, int] | None, not tuple"),
        (lambda: ContainerOptions(pids=1.5), "option pids takes int, not float"),
        (lambda: ContainerOptions(read_only_binds={"/a": 1}), "option read_only_binds takes Mapping[str, str] | None"),
        (lambda: ContainerOptions(languages="python"), "option languages takes Sequence[str] | None"),
        (lambda: jupyter().JupyterOptions(mode="host"), "jupyter: a str is not a kernel mode; pass one of"),
        (lambda: jupyter().JupyterOptions(kernel_name=3), "option kernel_name takes str, not int"),
    ],
)
def test_each_backends_options_check_their_types_when_built(build: object, says: str) -> None:
    assert callable(build)
    with pytest.raises(InvalidSpec) as info:
        build()
    assert says in str(info.value)


def test_a_refused_value_is_not_echoed() -> None:
    with pytest.raises(InvalidSpec) as info:
        ContainerOptions(docker_host=b"tcp://user:s3cret@host")
    assert "s3cret" not in str(info.value)
    assert "option docker_host takes str | None, not bytes" in str(info.value)


def test_a_refused_kernel_mode_is_not_echoed() -> None:
    with pytest.raises(InvalidSpec) as info:  # a jupyter server's settings given as a mapping, token and all
        jupyter().JupyterOptions(mode={"url": "http://h:8888", "token": "s3cret"})
    assert "s3cret" not in str(info.value) and "a dict is not a kernel mode" in str(info.value)


def test_well_typed_options_build_and_are_frozen() -> None:
    options = ContainerOptions(image="img:1", user=(1000, 1000), cpus=2, read_only_binds={"/a": "/b"})
    assert options.cpus == 2 and options.languages is None
    with pytest.raises(FrozenInstanceError):
        options.image = "other"  # type: ignore[misc]


@dataclass(frozen=True, kw_only=True)
class _TokenOptions(HostOptions):
    token: str


class _TokenBackend:
    """A third party's backend shape: an option it cannot do without."""

    name = "token"
    options = _TokenOptions

    @classmethod
    async def probe(cls, options: _TokenOptions, /) -> Probe:
        return Probe(True)

    @classmethod
    async def open(cls, options: _TokenOptions, /) -> BaseEngine:
        raise AssertionError("never opened in these tests")


def test_a_missing_required_option_is_invalid_spec() -> None:
    with pytest.raises(InvalidSpec, match="backend 'token' needs the option token; its options: artifacts, "):
        build_options("token", _TokenBackend, None, {"kill_grace": 1.0})
    built = build_options("token", _TokenBackend, HostOptions(kill_grace=1.0), {"token": "t"})
    assert isinstance(built, _TokenOptions) and built.token == "t" and built.kill_grace == 1.0


def test_factories_declare_their_options_class() -> None:
    assert load_backend("local") is LocalBackend and LocalBackend.options is LocalOptions
    assert load_backend("sandbox").options is SandboxOptions
    assert load_backend("container").options is ContainerOptions


def test_the_jupyter_factory_declares_its_options_class() -> None:
    face = jupyter()
    assert load_backend("jupyter").options is face.JupyterOptions
    assert face.JupyterOptions(mode=face.HostKernels(pool_size=0), kernel_name="python3").interrupt_grace == 2.0


async def test_a_probe_with_options_the_backend_lacks_says_so() -> None:
    probe = await probe_backend("local", image="python:3")
    assert not probe.ok
    assert "'local' has no option image" in probe.reason
