"""Which backend and options the command line's flags ask for: read from the parsed arguments, never written into
them, and a flag of one backend with another named is refused naming both."""

from __future__ import annotations

import argparse

import pytest

from execspace.backends.sandbox import Profile
from execspace.cli import execcode, run
from execspace.cli.main import build_parser
from execspace.errors import UsageError

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")
from execspace.backends.jupyter import HostKernels, SandboxedKernels


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def _run_request(*flags: str) -> tuple[run.EngineRequest, argparse.Namespace]:
    args = _parse("run", *flags, "--", "/bin/true")
    before = vars(args).copy()
    request = run.engine_request(args, [run.parse_input(v) for v in args.input])
    assert vars(args) == before  # the parsed arguments are read, never written
    return request, args


def _code_request(*flags: str) -> run.EngineRequest:
    args = _parse("exec-code", *flags, "-")
    before = vars(args).copy()
    request = execcode.engine_request(args, [run.parse_input(v) for v in args.input])
    assert vars(args) == before
    return request


def test_a_flag_of_one_backend_names_it() -> None:
    assert _run_request()[0] == run.EngineRequest(None, {})
    assert _run_request("--backend", "local")[0] == run.EngineRequest("local", {})
    assert _run_request("--image", "img")[0] == run.EngineRequest("container", {"image": "img"})
    assert _run_request("--environment", "env")[0] == run.EngineRequest("sandbox", {"environment": "env"})
    request = _run_request("--image", "img", "--environment", "env")[0]
    assert request == run.EngineRequest("container", {"image": "img", "environment": "env"})
    request, _ = _run_request("--profile", "read-only")
    assert request.backend == "sandbox"
    policy = request.options["policy"]
    assert getattr(policy, "profile", None) is Profile.READ_ONLY


def test_exec_code_kernels_pick_jupyter_and_an_environment_sandboxes_them() -> None:
    assert _code_request("--kernels", "host") == run.EngineRequest("jupyter", {"mode": HostKernels()})
    assert _code_request("--kernels", "sandbox") == run.EngineRequest("jupyter", {"mode": SandboxedKernels()})
    request = _code_request("--kernels", "sandbox", "--environment", "env")
    assert request == run.EngineRequest("jupyter", {"mode": SandboxedKernels(environment="env")})
    assert _code_request("--environment", "env") == run.EngineRequest("sandbox", {"environment": "env"})


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--backend", "local", "--image", "img"), "--image belongs to the container backend, not 'local'"),
        (("--backend", "container", "--profile", "read-only"), "belong to the sandbox backend, not 'container'"),
        (("--image", "img", "--profile", "read-only"), "belong to the sandbox backend, not 'container'"),
        (("--backend", "local", "--environment", "env"), "--environment belongs to the sandbox, container and jupyter"),
    ],
)
def test_run_refuses_a_flag_of_another_backend(flags: tuple[str, ...], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        _run_request(*flags)


@pytest.mark.parametrize(
    "flags",
    [
        ("--backend", "sandbox", "--kernels", "host"),
        ("--backend", "sandbox", "--kernels", "sandbox", "--environment", "env"),  # once silently jupyter
        ("--image", "img", "--kernels", "sandbox"),
    ],
)
def test_exec_code_refuses_kernels_with_another_backend(flags: tuple[str, ...]) -> None:
    with pytest.raises(UsageError, match=r"--kernels is for the jupyter backend, not '(sandbox|container)'"):
        _code_request(*flags)
