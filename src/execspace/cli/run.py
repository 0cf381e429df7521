"""``execspace run``: one program in a workspace, inputs staged in, outputs collected out."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast

from ..artifacts import FileArtifactService
from ..capabilities import Capabilities
from ..engine import BaseEngine, open_engine_from
from ..environments.hints import missing_module_hint
from ..errors import CannotExecute, ExecspaceError, InputError, PathDenied, UsageError, WorkspaceNotFound
from ..models import (
    DEFAULT_TIMEOUT,
    InputSpec,
    NetworkPolicy,
    OutputManifest,
    OutputSpec,
    Persistence,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    Workspace,
    WorkspacePolicy,
)
from ..process.preparation import not_started
from ..protocols import Engine
from .console import (
    error_message,
    human_size,
    print_json,
    printable,
    progress,
    warn_if_unisolated,
    workspace_dir,
)
from .inject import add_inject_options, with_injections
from .outputs import AUDIT_FILE, Brought, bring_outputs, inline
from .roots import in_cli_root
from .streaming import run_program, stdin_source
from .tracing import traced_command

if TYPE_CHECKING:
    from ..backends.sandbox import SandboxPolicy

__all__ = [
    "EXIT_TIMEOUT",
    "add_parser",
    "exit_status",
    "parse_input",
]

EXIT_TIMEOUT = 124
DEFAULT_ID = "execspace/cli/run"
DEFAULT_COLLECT = ("out/**",)
_URI_SCHEMES = ("artifact://", "host://", "workspace://", "skill://")

_EPILOG = """\
exit status: the program's own; 128+N when killed by signal N; 124 on timeout;
126 not executable; 127 command not found; 125 when execspace itself failed.

examples:
  execspace run --backend local -- python3 -c 'print(1)'
  execspace run --input plot.py --input data.csv --collect 'out/*.png' --keep -- python3 inputs/plot.py
  execspace run --input ./src:work/src --network off --memory 512 -- make -C src
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a program in a fresh workspace",
        description="Run CMD in a workspace: stage --input files, run, collect --collect outputs.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backend", help="backend to use (default: the safest that works here, never 'local')")
    add_image_option(p)
    add_environment_option(p)
    add_workspace_options(p)
    p.add_argument(
        "--out",
        type=host_path,
        metavar="DIR",
        help="copy the collected files into DIR (out/x lands as DIR/x); default: when the workspace is removed, "
        "into a new ./execspace-out/<run>/",
    )
    p.add_argument(
        "--no-out",
        action="store_true",
        help="do not copy the outputs of a removed workspace anywhere (with --json they are inlined instead)",
    )
    p.add_argument("--network", choices=("off", "on"), help="network access (default: the backend's)")
    p.add_argument(
        "--allow-domain",
        action="append",
        default=[],
        metavar="D[:PORT]",
        help="network only to these destinations, through an egress proxy outside the sandbox (repeatable; "
        "*.example.com for subdomains; without :PORT, ports 80 and 443)",
    )
    p.add_argument(
        "--deny-domain", action="append", default=[], metavar="D[:PORT]", help="never this destination (wins)"
    )
    p.add_argument(
        "--resolve",
        action="append",
        default=[],
        type=resolve_pair,
        metavar="NAME=ADDR",
        help="pin NAME to ADDR for the egress proxy (the address then counts as allowed: tests, private hosts)",
    )
    add_inject_options(p)
    p.add_argument(
        "--profile",
        choices=("read-only", "workspace-write", "danger-full-access"),
        help="sandbox permission profile (default workspace-write; danger-full-access turns the sandbox OFF)",
    )
    for flag, what in (("--read", "extra host path to read"), ("--write", "extra host path to write")):
        p.add_argument(flag, action="append", default=[], type=host_path, metavar="PATH", help=f"sandbox: {what}")
    p.add_argument(
        "--deny", action="append", default=[], type=host_path, metavar="PATH", help="sandbox: host path with no access"
    )
    p.add_argument(
        "--unprotect",
        action="append",
        default=[],
        metavar="NAME",
        help="sandbox: let --write make this protected project path writable (e.g. Makefile; default: never)",
    )
    p.add_argument(
        "--timeout",
        type=parse_timeout,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds before the program is killed; 'none': no limit (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument("--memory", type=_positive, metavar="MB", help="memory limit in MiB")
    p.add_argument("--pids", type=int, metavar="N", help="limit on processes/threads at once")
    p.add_argument("--cpu", type=_positive, metavar="SECONDS", help="CPU time limit")
    add_input_option(p)
    p.add_argument(
        "--collect",
        action="append",
        default=[],
        metavar="GLOB",
        help="workspace glob of outputs to collect (default out/**); repeatable",
    )
    p.add_argument("--artifacts", type=host_path, metavar="DIR", help="artifact store directory for artifact:// inputs")
    p.add_argument("--env", action="append", default=[], type=_env_pair, metavar="K=V", help="set a variable")
    p.add_argument(
        "--cwd",
        default="work",
        metavar="PATH",
        help="working directory: a workspace path (default work), or a directory of yours in a --read/--write grant "
        "(absolute, or relative to yours: --write . --cwd .)",
    )
    p.add_argument(
        "--no-stdin",
        action="store_true",
        help="do not pass our stdin (otherwise passed as it arrives, unless a TTY)",
    )
    p.add_argument(
        "--grace",
        type=_positive,
        default=5.0,
        metavar="SEC",
        help="after Ctrl-C, SIGTERM or SIGHUP (passed to the program), seconds before its tree is killed (default 5; "
        "a second signal kills it at once)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming output")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(handler=command)


# -- argument types -----------------------------------------------------------------------


def host_path(text: str) -> Path:
    """A host path from the command line, made absolute against the caller's directory.

    Every host path option goes through here: a relative one left as given would mean a
    workspace path to the sandbox policy (``--deny ./.env`` would deny nothing on the host).
    """
    return Path(os.path.expanduser(text)).absolute()


def parse_timeout(text: str) -> float | None:
    if text.strip().lower() in ("none", "off", "0"):
        return None
    return _positive(text)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


# -- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InputArg:
    spec: InputSpec
    host_root: Path | None
    """Host directory the engine must allow for this input (``None``: not a host input)."""


def resolve_pair(text: str) -> tuple[str, str]:
    name, sep, addr = text.partition("=")
    if not sep or not name or not addr:
        raise argparse.ArgumentTypeError(f"expected NAME=ADDR, got {text!r}")
    return name, addr


def network_choice(args: argparse.Namespace) -> Literal["off", "on"] | NetworkPolicy | None:
    """``--network``, or the allow-list the domain flags make (they cannot be mixed with ``--network``)."""
    if not (args.allow_domain or args.deny_domain or args.resolve or args.inject_header):
        return cast('Literal["off", "on"] | None', args.network)
    if args.network is not None:
        raise UsageError("--allow-domain/--deny-domain/--resolve make the network an allow-list: drop --network")
    if not args.allow_domain:
        raise UsageError("--deny-domain, --resolve and --inject-header refine an allow-list: give --allow-domain too")
    inject, ca = with_injections(args)
    resolve = dict(args.resolve)
    return NetworkPolicy.allow(args.allow_domain, deny=args.deny_domain, resolve=resolve, inject=inject, upstream_ca=ca)


def _looks_relative(path: str) -> bool:
    return bool(path) and not path.startswith(("/", "~")) and "://" not in path


def _split_dest(value: str) -> tuple[str, str | None]:
    """``SRC:DEST`` → (SRC, DEST), splitting only where DEST is clearly meant.

    A host path may itself contain ':'; so the split needs an existing SRC
    (or a URI source) and a relative-looking DEST after the last ':'.
    """
    head, sep, tail = value.rpartition(":")
    if sep and tail.startswith(("/", "~")) and (head.startswith(_URI_SCHEMES) or Path(head).exists()):
        # an existing source and an absolute destination: the destination is meant, and is not a workspace path
        example = f"{head}:work/{Path(tail).name or 'data'}"
        raise PathDenied(tail, f"--input {value!r}: DEST is a path in the workspace, e.g. --input {example}")
    if not sep or not _looks_relative(tail):
        return value, None
    if head.startswith(_URI_SCHEMES) or Path(head).exists():
        return head, tail
    return value, None


def parse_input(value: str) -> InputArg:
    """Turn one ``--input`` value into an :class:`InputSpec` and the host root it needs."""
    src, dest = _split_dest(value)
    if src.startswith("host://"):
        src = src[len("host://") :]
    elif src.startswith(_URI_SCHEMES):
        return InputArg(InputSpec(src, dest), None)
    path = host_path(src)
    if not path.exists():
        raise InputError(f"--input {value!r}: {path} does not exist")
    return InputArg(InputSpec(f"host://{path}", dest), _root_of(path))


def _root_of(path: Path) -> Path:
    return path if path.is_dir() else path.parent


# -- the command --------------------------------------------------------------------------


def collect_globs(patterns: Sequence[str]) -> list[str]:
    """The ``--collect`` globs, refused before the run when they could never match inside the workspace."""
    globs = list(patterns) or list(DEFAULT_COLLECT)
    for g in globs:
        if g.startswith("/") or ".." in g.split("/"):
            raise PathDenied(g, "--collect globs are relative to the workspace (e.g. 'out/**')")
    return globs


def program_argv(words: Sequence[str]) -> list[str]:
    argv = list(words[1:] if words[:1] == ["--"] else words)
    if not argv:
        raise UsageError("no command given: execspace run [options] -- CMD [ARGS...]")
    return argv


def build_spec(args: argparse.Namespace, argv: list[str]) -> RunProgramSpec:
    limits = ResourceLimits(
        memory_bytes=int(args.memory * 2**20) if args.memory else None,
        pids=args.pids,
        cpu_seconds=args.cpu,
    )
    return RunProgramSpec(
        cmd=argv[0],
        args=argv[1:],
        env=dict(args.env),
        cwd=run_cwd(args.cwd, [*args.read, *args.write]),
        timeout=args.timeout,
        limits=limits,
        network=network_choice(args),
    )


def run_cwd(cwd: str, grants: Sequence[Path]) -> str:
    """``--cwd`` as the run takes it: a relative path naming a directory of the caller's (against their directory)
    that lies in a host grant is that directory, where the sandbox shows it (``--write . --cwd .``); any other
    relative path is a workspace path (``out``, when the project has no ``out/``), and an absolute one is as the
    program sees it (a grant's host path, ``/workspace/...``, a system directory)."""
    if cwd.startswith("/") or not grants:
        return cwd
    host = host_path(cwd)
    inside = any(host == g or g in host.parents for g in grants)
    return str(host) if inside and host.is_dir() else cwd


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """The engine the command line asks for: the backend ``--backend`` names or another flag implies (None: the
    default choice), and the options the flags set, as keywords of that backend's options (checked when it opens:
    flags are values of run time)."""

    backend: str | None = None
    options: Mapping[str, object] = field(default_factory=dict)

    def implying(self, backend: str, refusal: str, **options: object) -> EngineRequest:
        """This request with options that belong to ``backend``, which it now names; ``refusal`` (formatted with
        the backend named instead) when another is named."""
        if self.backend not in (None, backend):
            raise UsageError(refusal.format(self.backend))
        return EngineRequest(backend, {**self.options, **options})

    def adding(self, **options: object) -> EngineRequest:
        """This request with options any backend takes."""
        return EngineRequest(self.backend, {**self.options, **options})


def sandbox_policy(args: argparse.Namespace) -> SandboxPolicy | None:
    """The sandbox policy the profile flags ask for, or None when none was given."""
    if args.unprotect and not args.write:
        raise UsageError("--unprotect makes a protected path writable under a --write grant: give --write too")
    if not (args.profile or args.read or args.write or args.deny):
        return None
    from ..backends.sandbox import Profile, SandboxPolicy

    policy = SandboxPolicy(profile=Profile[(args.profile or "workspace-write").upper().replace("-", "_")])
    if args.unprotect:
        policy = policy.without_protected(*args.unprotect)
    return policy.with_read_paths(*args.read).with_write_paths(*args.write).with_no_access(*args.deny)


def add_workspace_options(p: argparse.ArgumentParser) -> None:
    """Which workspace a command runs in and whether it stays: ``run`` and ``exec-code`` alike."""
    p.add_argument("--workspace", metavar="DIR", type=host_path, help="use DIR as the workspace and keep it")
    p.add_argument(
        "--adopt",
        action="store_true",
        help="with --workspace: make a non-empty directory of yours a workspace (it gets home/ out/ runs/ ... and "
        "metadata.json; as root it is handed to a sandbox uid)",
    )
    p.add_argument("--keep", action="store_true", help="keep the fresh workspace and print where it is")
    p.add_argument(
        "--id",
        help="workspace id / artifact scope: a run with the id of a kept workspace runs in it again (default: a "
        f"fresh workspace, id {DEFAULT_ID})",
    )


def add_input_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="SRC[:DEST]",
        help="stage a host file/dir or artifact://name[@v] at DEST (default work/inputs/<name>); repeatable",
    )


def with_input_roots(request: EngineRequest, inputs: Sequence[InputArg]) -> EngineRequest:
    """``request`` allowing the host roots of the host files of ``inputs``."""
    roots = sorted({i.host_root for i in inputs if i.host_root is not None})
    return request.adding(host_roots=roots) if roots else request


def add_image_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--image",
        metavar="NAME",
        help="container: the image to run in (default $EXECSPACE_CONTAINER_IMAGE, else [container] image in "
        "$XDG_CONFIG_HOME/execspace/config.toml); implies --backend container",
    )


def add_environment_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--environment",
        metavar="NAME",
        help="run in the built runtime environment NAME (execspace env list; build one with execspace env "
        "build code-interpreter); implies --backend sandbox, or kernels from it with --backend jupyter, or bound "
        "into the container with --backend container (or --image)",
    )


#: The refusal of ``--kernels`` (or ``--environment`` with it) when another backend than jupyter is named.
KERNELS_REFUSAL = "--kernels is for the jupyter backend, not {!r}: drop one of them"


def with_environment(request: EngineRequest, args: argparse.Namespace, kernels: str | None = None) -> EngineRequest:
    """``--environment``: the sandbox's runtime environment, the container's (with ``--image`` or ``--backend
    container``), or the sandboxed kernels' (``--backend jupyter``, or ``kernels``: ``--kernels``)."""
    if args.environment is None:
        return request
    if request.backend == "jupyter" or kernels is not None:
        if kernels == "host":
            raise UsageError("--environment runs kernels in the sandbox: drop --kernels host")
        from ..backends.jupyter import SandboxedKernels

        return request.implying("jupyter", KERNELS_REFUSAL, mode=SandboxedKernels(environment=args.environment))
    if request.backend == "container" or args.image is not None:
        return request.adding(environment=args.environment)
    return request.implying(
        "sandbox",
        "--environment belongs to the sandbox, container and jupyter backends, not {!r}",
        environment=args.environment,
    )


def with_image(request: EngineRequest, args: argparse.Namespace) -> EngineRequest:
    """``--image``: the container backend's image (it picks that backend)."""
    if args.image is None:
        return request
    return request.implying("container", "--image belongs to the container backend, not {!r}", image=args.image)


def engine_request(args: argparse.Namespace, inputs: Sequence[InputArg]) -> EngineRequest:
    """The engine ``execspace run``'s flags ask for."""
    request = with_environment(with_image(EngineRequest(args.backend), args), args)
    policy = sandbox_policy(args)
    if policy is not None:
        refusal = "--profile/--read/--write/--deny belong to the sandbox backend, not {!r}"
        request = request.implying("sandbox", refusal, policy=policy)
    request = with_input_roots(request, inputs)
    return request.adding(artifacts=FileArtifactService(args.artifacts)) if args.artifacts is not None else request


async def open_workspace(engine: Engine, args: argparse.Namespace) -> tuple[Workspace, bool]:
    """The workspace to run in, and whether to remove it afterwards. ``--id`` names one: the workspace an earlier
    run with that id kept is run in again (and stays), else a new one by that id is made (and stays with
    ``--keep``), as the library's sessions do; without it each run gets a fresh workspace."""
    if args.workspace is not None:
        path = workspace_dir(args.workspace, "--workspace", adopt=args.adopt)
        return await engine.manager.create_workspace(args.id or DEFAULT_ID, path=path), False
    if args.id is None:
        ws = await engine.manager.create_workspace(DEFAULT_ID, WorkspacePolicy(persistence=Persistence.TURN))
        return ws, not args.keep
    try:
        return await engine.manager.get_workspace(args.id), False
    except WorkspaceNotFound:
        ws = await engine.manager.create_workspace(args.id, WorkspacePolicy(persistence=Persistence.SESSION))
        return ws, not args.keep


def exit_status(result: RunResult) -> int:
    if result.timed_out:
        return EXIT_TIMEOUT
    if result.exit_code < 0:
        return 128 - result.exit_code
    return result.exit_code


async def execute(
    engine: BaseEngine, ws: Workspace, spec: RunProgramSpec, stdin: int | None, args: argparse.Namespace
) -> tuple[RunResult, str | None]:
    """Run the program with our stdin streamed to it and our signals routed to it; a command that cannot be
    started (:class:`~execspace.errors.CannotExecute`) is a result with its 127/126, as in a shell. Also returns
    the line saying what a routed signal did."""
    live = not args.json
    try:
        return await run_program(engine.runner, ws, spec, stdin, live=live, grace=args.grace, signals=args.signals)
    except CannotExecute as exc:
        if live:
            print(exc, file=sys.stderr, flush=True)
        return not_started(exc), None


async def command(args: argparse.Namespace) -> int:
    spec = build_spec(args, program_argv(args.command))
    globs = collect_globs(args.collect)
    inputs = [parse_input(v) for v in args.input]
    stdin = stdin_source(args.no_stdin)
    request = engine_request(args, inputs)
    if request.backend is None and sys.stderr.isatty():
        progress("looking for an isolating backend...")
    backend, options = await in_cli_root(request.backend, request.options)
    async with traced_command("run", options) as traced, open_engine_from(backend, traced) as engine:
        caps = engine.describe()
        warn_if_unisolated(caps)
        caps.require(spec)  # refuse before creating or staging anything
        ws, remove = await open_workspace(engine, args)
        try:
            await engine.fs.stage_inputs(ws, [i.spec for i in inputs])
            result, interrupted = await execute(engine, ws, spec, stdin, args)
            remove = remove and interrupted is None  # the user stopped it: what it left is there to look at
            outputs = await gather(engine, ws, args, globs, result, kept=not remove)
            remove = remove and outputs.refusal is None  # what could not be brought out stays where it is
        finally:
            if remove:
                await engine.manager.cleanup(ws)
        report(args, caps, ws, result, outputs, kept=not remove, interrupted=interrupted)
    if result.exit_code != 0 and (hint := missing_module_hint(result.stderr, args.environment)) is not None:
        progress(hint)
    return exit_status(result)


@dataclass(slots=True)
class Gathered:
    """A run's outputs as the report tells them: the manifest, what was brought to the host, or why the collection
    was refused (a tree too deep, say: the run's own result is reported all the same)."""

    manifest: OutputManifest = field(default_factory=OutputManifest)
    brought: Brought = field(default_factory=Brought)
    refusal: ExecspaceError | None = None


async def gather(
    engine: BaseEngine, ws: Workspace, args: argparse.Namespace, globs: list[str], result: RunResult, *, kept: bool
) -> Gathered:
    """The outputs collected and brought to the host (see :func:`.outputs.bring_outputs`), or why they could not
    be."""
    try:
        manifest = await engine.fs.collect_outputs(ws, OutputSpec(globs=globs))
        brought = await bring_outputs(
            engine, ws, globs, result, out=args.out, kept=kept, no_out=args.no_out, json=args.json
        )
    except ExecspaceError as exc:
        return Gathered(refusal=exc)
    return Gathered(manifest, brought)


# -- reporting ----------------------------------------------------------------------------

#: Characters of a refused path shown in the report (a tree 2,000 levels deep has a path of 4,000).
_SHOWN_PATH = 80


class OutputRow(TypedDict):
    """One output file in ``--json`` (``outputs``), with its content when it is inlined."""

    path: str
    size: int
    mime: str
    host_path: str | None
    saved_path: str | None
    skipped: str | None
    content_base64: NotRequired[str]
    content_truncated: NotRequired[bool]


def _outputs(manifest: OutputManifest, kept: bool, brought: Brought) -> list[OutputRow]:
    rows = []
    for f in manifest.files:
        saved = brought.saved.get(f.name)
        row: OutputRow = {
            "path": f.name,
            "size": f.size_bytes,
            "mime": f.mime_type,
            "host_path": str(f.host_path) if kept and f.host_path is not None else None,
            "saved_path": str(saved) if saved is not None else None,
            "skipped": f.skipped,
        }
        if brought.files is not None and f.name in brought.files:
            content = inline(brought.files[f.name])
            row["content_base64"], row["content_truncated"] = content["content_base64"], content["content_truncated"]
        rows.append(row)
    return rows


def _audit_file(ws: Workspace, result: RunResult, kept: bool, brought: Brought) -> str | None:
    """Where the run's network audit can be read now: in the kept workspace, or its copy beside the outputs."""
    if brought.audit is not None:
        return str(brought.audit)
    if kept and result.network_audit and result.run_dir:
        return f"{ws.host_path or ws.path}/{result.run_dir}/{AUDIT_FILE}"
    return None


def report(
    args: argparse.Namespace,
    caps: Capabilities,
    ws: Workspace,
    result: RunResult,
    gathered: Gathered,
    *,
    kept: bool,
    interrupted: str | None = None,
) -> None:
    brought = gathered.brought
    rows = _outputs(gathered.manifest, kept, brought)
    workspace = str(ws.host_path or ws.path) if kept else None
    audit = _audit_file(ws, result, kept, brought)
    if interrupted is not None and not args.json:
        progress(interrupted)
    if args.json:
        refusal = gathered.refusal
        print_json(
            {
                "exit_code": result.exit_code,
                "signal": result.signal,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "timed_out": result.timed_out,
                "duration_s": round(result.duration, 3),
                "stdout_truncated": result.stdout_truncated,
                "stderr_truncated": result.stderr_truncated,
                "limit_hit": result.limit_hit,
                "backend": caps.backend,
                "isolation": str(caps.isolation),
                "workspace": workspace,
                "outputs": rows,
                "outputs_limits_hit": gathered.manifest.limits_hit,
                "outputs_error": None
                if refusal is None
                else {"type": type(refusal).__name__, "message": _refusal(refusal)},
                "interrupted": interrupted,
                "out_dir": str(brought.out_dir) if brought.out_dir is not None else None,
                "network_audit": [attempt.as_dict() for attempt in result.network_audit],
                "network_audit_file": audit,
            }
        )
        return
    _report_text(args, ws, result, rows, gathered, workspace, audit)


def _report_text(
    args: argparse.Namespace,
    ws: Workspace,
    result: RunResult,
    outputs: list[OutputRow],
    gathered: Gathered,
    workspace: str | None,
    audit: str | None,
) -> None:
    brought = gathered.brought
    if result.timed_out:
        # the limit asked for, not the time measured (a loaded machine takes a moment longer to stop it)
        limit = f"{args.timeout:g}s" if args.timeout is not None else f"{result.duration:.1f}s"
        progress(f"program timed out after {limit} and was killed (exit status 124)")
    elif result.limit_hit:
        progress(f"program stopped by the {result.limit_hit} limit")
    if gathered.refusal is not None:
        progress(f"its outputs could not be collected (they are left in the workspace): {_refusal(gathered.refusal)}")
    if outputs:
        if brought.out_dir is not None:
            where = f" (copied to {printable(str(brought.out_dir))})"
        elif workspace:
            where = ""
        else:
            where = " (workspace removed, --no-out: not kept; drop --no-out, or pass --keep or --out DIR)"
        progress(f"{len(outputs)} output file(s){where}:")
        _print_table(outputs)
    elif args.collect and gathered.refusal is None:
        progress(f"no output matched --collect {' '.join(args.collect)}")
    if brought.clashes:
        progress(f"not copied, a file of the same name came first: {', '.join(map(printable, brought.clashes))}")
    if gathered.manifest.limits_hit:
        progress("output collection was cut short by its caps (files or bytes); narrow --collect")
    _report_network(result, audit)
    if workspace and args.workspace is None:
        name = ws.id if args.id is not None else workspace  # the default id names every run's: never a hint for rm
        progress(f"workspace kept at {printable(workspace)}")
        progress(f"`execspace ws rm {printable(name)}` removes it")


def _refusal(exc: ExecspaceError) -> str:
    """Why the outputs could not be collected, in a line: a path too deep to walk is named by its ends."""
    if not isinstance(exc, PathDenied):
        return error_message(exc)
    path = exc.path
    if len(path) > _SHOWN_PATH:
        path = f"{path[: _SHOWN_PATH // 2]}...{path[-_SHOWN_PATH // 4 :]}"
    return f"path '{printable(path)}' denied: {exc.reason}"


def _report_network(result: RunResult, audit: str | None) -> None:
    denied = [a for a in result.network_audit if not a.allowed]
    if not denied:
        return
    where = f"see {printable(audit)}" if audit else "the audit went with the workspace: pass --keep to keep it"
    progress(f"{len(denied)} network attempt(s) refused ({where}):")
    for attempt in denied[:5]:
        progress(f"  {printable(attempt.host)}:{attempt.port} ({attempt.protocol}): {printable(attempt.reason)}")


def _row(output: OutputRow) -> tuple[str, str, str, str]:
    """One output's table cells; the program chose its name, so it is printed escaped. The last is where it is on
    the host: its copy, or the file in the kept workspace."""
    kind = f"skipped: {output['skipped']}" if output["skipped"] else output["mime"]
    where = output["saved_path"] or output["host_path"] or ""
    return printable(output["path"]), human_size(output["size"]), kind, printable(where)


def _print_table(outputs: list[OutputRow]) -> None:
    rows = [_row(o) for o in outputs]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)] + [row[3]]
        print("  " + "  ".join(cells).rstrip(), file=sys.stderr)
    sys.stderr.flush()
