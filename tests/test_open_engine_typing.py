"""The typed front door: ``open_engine``'s keywords per backend (execspace/keywords.py) mirror each backend's options
class, so that a type checker refuses a misspelled option or a wrong type as the options class does at run time."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import execspace
from execspace import artifacts, audit, backend, envpolicy, keywords, models, tracing
from execspace.backends import container, local, sandbox
from execspace.engine import open_engine_from
from execspace.errors import InvalidSpec

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")
from execspace.backends import jupyter

e2b = pytest.importorskip("execspace.backends.e2b", reason="the e2b extra is not installed")

PAIRS = [
    (keywords.HostKeywords, backend.HostOptions),
    (keywords.LocalKeywords, local.LocalOptions),
    (keywords.SandboxKeywords, sandbox.SandboxOptions),
    (keywords.ContainerKeywords, container.ContainerOptions),
    (keywords.JupyterKeywords, jupyter.JupyterOptions),
    (keywords.E2BKeywords, e2b.E2BOptions),
]


def _keyword_hints(typed: type) -> dict[str, object]:
    # keywords.py imports the backends' types for the type checker only: resolve its names where they are defined
    names: dict[str, object] = {}
    for module in (artifacts, audit, envpolicy, models, tracing, sandbox, jupyter):
        names.update(vars(module))
    return typing.get_type_hints(typed, localns=names)


@pytest.mark.parametrize(("typed", "options"), PAIRS, ids=[o.__name__ for _, o in PAIRS])
def test_each_backends_keywords_mirror_its_options_class(typed: type, options: type) -> None:
    fields = {f.name: f for f in dataclasses.fields(options)}
    hints = _keyword_hints(typed)
    assert sorted(hints) == sorted(fields)
    assert hints == typing.get_type_hints(options)
    assert not typed.__required_keys__  # type: ignore[attr-defined]
    assert all(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING for f in fields.values()
    )


SNIPPET = """\
import execspace
import execspace.sync
from execspace.backends.sandbox import SandboxOptions


async def f() -> None:
    async with execspace.open_engine("sandbox", netwrok=False) as e:
        pass
    async with execspace.open_engine("container", pids="many") as e:
        pass
    async with execspace.open_engine(mode="session") as e:
        pass
    async with execspace.open_engine("sandbox", network=False, mode="session", kill_grace=1) as e:
        pass
    async with execspace.open_engine("jupyter", kernel_name="python3") as k:
        reveal_type(k)
    async with execspace.open_engine("container", image="img") as c:
        reveal_type(c.pool)
    async with execspace.open_engine("some-plugin", options=SandboxOptions()) as e:
        pass


def g() -> None:
    with execspace.sync.open_engine("sandbox", mdoe="session") as e:
        pass
    with execspace.sync.open_engine("e2b", api_url="http://127.0.0.1:3000", pool_size=2) as e:
        pass
"""


def test_a_misspelled_option_or_a_wrong_type_is_a_mypy_error(tmp_path: Path) -> None:
    snippet = tmp_path / "typo.py"
    snippet.write_text(SNIPPET)
    command = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run([*command, snippet.name], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    said: dict[int, str] = {}
    for line in done.stdout.splitlines():
        if line.startswith(f"{snippet.name}:") and ": note:     def " not in line:
            number = int(line.split(":")[1])
            said[number] = said.get(number, "") + line
    assert 'Unexpected keyword argument "netwrok"' in said[7]
    assert 'matches argument types "str", "str"' in said[9]  # pids="many"
    assert "No overload variant" in said[11]  # the default backend takes only the shared host options
    assert 'Unexpected keyword argument "mdoe"' in said[24]
    assert "WarmPool[execspace.backends.container.pool.PoolSlot]" in said[18]  # a ContainerEngine's pool
    assert (
        'Revealed type is "execspace.engine.KernelEngine[execspace.backends.jupyter.kernels.KernelSessions]"'
        in said[16]
    )
    assert sorted(said) == [7, 9, 11, 16, 18, 24], done.stdout  # the correct calls type-check


async def test_the_run_time_refuses_what_the_type_checker_does(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=r"backend 'local' has no option netwrok; its options: "):
        async with execspace.open_engine("local", netwrok=False):  # type: ignore[call-overload]
            pass
    with pytest.raises(InvalidSpec, match=r"backend 'local' has no option netwrok; its options: "):
        async with open_engine_from("local", {"netwrok": False}):
            pass
    async with open_engine_from("local", {"workspace_root": tmp_path, "kill_grace": 1.0}) as engine:
        workspace = await engine.manager.create_workspace("w")
        assert workspace.host_path is not None
        assert workspace.host_path.is_relative_to(tmp_path)
