"""``execspace env``: build, list, show and remove runtime environments (docs/environments.md)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..environments import BUILTIN_SPECS, BuildEvent, Environment, EnvironmentSpec, EnvironmentStore, builtin_spec
from ..environments import load_spec as load_spec_file
from ..errors import SetupFailed, UsageError
from .console import human_size, print_json, printable, progress

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "env",
        help="build, list, show and remove runtime environments (a venv the sandbox binds read-only)",
        description="Runtime environments for --environment NAME: built once from the package registries into "
        "$XDG_CACHE_HOME/execspace/environments (as root /var/cache/execspace/environments; "
        f"$EXECSPACE_ENVIRONMENTS overrides). Built-in: {', '.join(BUILTIN_SPECS)}.",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="build|list|show|rm")
    build = verbs.add_parser("build", help="build a built-in environment by name, or a SPEC.toml")
    build.add_argument("target", metavar="NAME|SPEC.toml")
    build.add_argument("-v", "--verbose", action="store_true", help="stream pip's output")
    build.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="build it on every living node of the Ray cluster at ADDRESS (as ray.init takes it: HOST:6379, auto), "
        "into each node's own store, each node's steps streamed here; exits 1 naming the nodes that failed "
        "(docs/cluster.md; needs the 'ray' extra)",
    )
    verbs.add_parser("list", help="the environments built here")
    show = verbs.add_parser("show", help="one environment: where it is, its python and packages")
    show.add_argument("name", metavar="NAME")
    rm = verbs.add_parser("rm", help="remove an environment (sandboxes running in it lose it)")
    rm.add_argument("name", metavar="NAME")
    p.set_defaults(handler=command)


async def command(args: argparse.Namespace) -> int:
    store = EnvironmentStore()
    if args.verb == "build" and args.ray:
        return _build_on_every_node(args)
    if args.verb == "build":
        started = time.monotonic()
        env = await store.build(_spec(args.target), progress=_printer(args.verbose, started))
        _print(args, [env], "built")
        return 0
    if args.verb == "list":
        _print(args, store.environments(), "environments")
        return 0
    if args.verb == "show":
        env = store.get(args.name)
        if args.json:
            print_json({"environment": _row(env)})
        else:
            print(printable(env.summary()))
        return 0
    removed = store.remove(args.name)
    if args.json:
        print_json({"removed": [str(p) for p in removed]})
    else:
        progress(f"removed: {', '.join(map(str, removed))}")
    return 0


def _build_on_every_node(args: argparse.Namespace) -> int:
    """``env build --ray``: the spec built on every living node of the cluster, each node's steps shown as they
    come; 1 when any node failed, naming each."""
    try:
        from ..server.cluster.nodebuild import build_on_every_node
    except ImportError as exc:
        raise SetupFailed(
            "env build --ray",
            f"building on a Ray cluster needs Ray ({exc.name} is missing)",
            "pip install 'execspace[ray]'",
            component="execspace env build --ray",
        ) from None
    spec, started = _spec(args.target), time.monotonic()

    def show(node: str, line: str) -> None:
        progress(f"[{time.monotonic() - started:6.1f}s] {node}: {line}")

    results = build_on_every_node(spec, args.ray, show)
    failed = [r for r in results if r.error]
    if args.json:
        print_json(
            {"nodes": [{"node_id": r.node_id, "address": r.address, "path": r.path, "error": r.error} for r in results]}
        )
    for result in results:
        if result.error:
            progress(f"FAILED on {result.name}: {result.error}")
        elif not args.json:
            print(f"{spec.name:<20} built on {result.name}: {printable(result.path)}")
    if failed:
        progress(f"{spec.name} failed on {len(failed)} of {len(results)} nodes: {', '.join(r.name for r in failed)}")
        return 1
    sys.stdout.flush()
    return 0


def _spec(target: str) -> EnvironmentSpec:
    """A built-in by name (or E2B alias), else a TOML file."""
    spec = builtin_spec(target)
    if spec is not None:
        return spec
    path = Path(target)
    if path.suffix == ".toml" or path.exists():
        return load_spec_file(path)
    raise UsageError(
        f"{target!r} is neither a built-in environment ({', '.join(BUILTIN_SPECS)}) nor a spec file: "
        "give a NAME of those or a path to SPEC.toml"
    )


def _printer(verbose: bool, started: float) -> Callable[[BuildEvent], None]:
    def show(event: BuildEvent) -> None:
        if not event.output:
            progress(f"[{time.monotonic() - started:6.1f}s] {event.step}: {event.text}")
        elif verbose:
            sys.stderr.write(f"    {printable(event.text)}\n")
            sys.stderr.flush()

    return show


def _row(env: Environment) -> dict[str, object]:
    return {
        "name": env.name,
        "digest": env.digest,
        "path": str(env.path),
        "python_version": env.python_version,
        "suite": env.suite,
        "packages": dict(env.packages),
        "env": dict(env.env),
        "description": env.description,
        "size_bytes": env.size_bytes,
        "build_seconds": env.build_seconds,
        "built_at": env.built_at,
    }


def _print(args: argparse.Namespace, envs: list[Environment], what: str) -> None:
    if args.json:
        print_json({what: [_row(e) for e in envs]})
        return
    if not envs:
        progress(f"{what}: none (build one: execspace env build {' | '.join(BUILTIN_SPECS)} | SPEC.toml)")
        return
    for env in envs:
        packages = len(env.packages)
        print(
            f"{env.name:<20} {env.digest}  {env.runtime}  {packages:>3} packages  "
            f"{human_size(env.size_bytes):>8}  {printable(str(env.path))}"
        )
    sys.stdout.flush()
