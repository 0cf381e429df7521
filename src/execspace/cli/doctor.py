"""``execspace doctor``: which backends work here, why the others do not, and what each enforces."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
from typing import Any

from ..backend import option_choices
from ..capabilities import Capabilities
from ..engine import open_engine
from ..environments import EnvironmentStore
from ..errors import SetupFailed
from ..registry import BACKENDS, choose_default_backend, load_backend, probe_backend
from .console import print_json, progress
from .daemon import ping
from .daemonwire import daemon_socket_path

__all__ = ["add_parser", "backend_capabilities", "command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check which backends work on this host",
        description="Probe every backend: does it work here, why not and how to fix it, what it enforces.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=command)


async def backend_capabilities(name: str) -> Capabilities:
    """The backend's capability statement, without opening it when it can say so up front."""
    factory = load_backend(name)
    declared = getattr(factory, "capabilities", None)
    if callable(declared):
        caps = declared()
        if inspect.isawaitable(caps):
            caps = await caps
        if isinstance(caps, Capabilities):
            return caps
    async with open_engine(name) as engine:
        return engine.describe()


async def _modes(name: str) -> list[dict[str, Any]]:
    """A backend with a ``mode`` option of fixed choices (the sandbox's per-run and session): each one's probe
    and the guarantee its capabilities state (``details["mode"]``)."""
    factory = load_backend(name)
    declared = getattr(factory, "capabilities", None)
    takes_mode = callable(declared) and "mode" in inspect.signature(declared).parameters
    found = []
    for mode in option_choices(factory.options, "mode"):
        probe = await probe_backend(name, mode=mode)
        caps = declared(mode=mode) if takes_mode else None  # type: ignore[misc]
        if inspect.isawaitable(caps):
            caps = await caps
        guarantee = caps.details.get("mode", "") if isinstance(caps, Capabilities) else ""
        found.append({"mode": mode, "ok": probe.ok, "reason": probe.reason, "fix": probe.fix, "guarantee": guarantee})
    return found


async def _inspect(name: str) -> dict[str, Any]:
    info = BACKENDS[name]
    probe = await probe_backend(name)
    entry: dict[str, Any] = {
        "name": name,
        "summary": info.summary,
        "ok": probe.ok,
        "reason": probe.reason,
        "fix": probe.fix or ("" if probe.ok else info.install_hint),
        "capabilities": None,
        "modes": await _modes(name),
    }
    if probe.ok:
        try:
            entry["capabilities"] = (await backend_capabilities(name)).as_dict()
        except Exception as exc:  # one broken backend must not hide the others' report
            entry["capabilities_error"] = f"{type(exc).__name__}: {exc}"
    return entry


async def _default() -> dict[str, Any]:
    try:
        return {"backend": await choose_default_backend(), "reason": ""}
    except SetupFailed as exc:
        return {"backend": None, "reason": str(exc)}


async def command(args: argparse.Namespace) -> int:
    progress(f"probing backends ({', '.join(BACKENDS)})...")
    *entries, default = await asyncio.gather(*(_inspect(n) for n in BACKENDS), _default())
    daemon = _daemon()
    store = EnvironmentStore()
    built = [
        {"name": e.name, "path": str(e.path), "python": e.python_version, "packages": len(e.packages)}
        for e in store.environments()
    ]
    environments = {"store": str(store.root), "built": built}
    if args.json:
        print_json({"backends": entries, "default": default, "daemon": daemon, "environments": environments})
    else:
        sys.stdout.write(render(entries, default, daemon) + _environment_lines(environments))
        sys.stdout.flush()
    return 0


# -- text ---------------------------------------------------------------------------------


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def _caps_lines(caps: dict[str, Any]) -> list[str]:
    network = "on by default" if caps["network_default"] else "off by default"
    network += "; can be turned off per run" if caps["network_control"] else "; cannot be turned off"
    if caps.get("network_domains"):
        network += "; allow-lists by domain (--allow-domain)"
    lines = [
        f"isolation: {caps['isolation']}",
        f"network:   {network}",
        f"limits:    {', '.join(caps['enforced_limits']) or 'none'}",
        f"languages: {', '.join(caps['languages']) or 'none found'}",
        f"streaming: {_yes(caps['streaming'])}   clean env: {_yes(caps['clean_env'])}   "
        f"read-only mounts: {_yes(caps['read_only_mounts'])}   host paths: {_yes(caps['host_paths'])}   "
        f"binary output: {_yes(caps['binary_output'])}",
    ]
    kernels = caps.get("kernels")
    if kernels:
        lines.append(
            f"kernels:   {', '.join(kernels['languages'])}, isolation {kernels['isolation']}; cells get "
            f"{', '.join(kernels['cell_limits']) or 'no limits'}; whole kernel: "
            f"{', '.join(kernels['kernel_limits']) or 'no limits'}; warm pool {kernels['warm_pool']}"
        )
    if caps["does_not_protect"]:
        lines.append("does not protect against:")
        lines.extend(f"  - {item}" for item in caps["does_not_protect"])
    return lines


def _entry_lines(entry: dict[str, Any]) -> list[str]:
    lines = [f"{entry['name']}: {'OK' if entry['ok'] else 'NOT AVAILABLE'}"]
    body = [f"about:     {entry['summary']}"] if entry["summary"] else []
    if not entry["ok"]:
        body.append(f"why:       {entry['reason']}")
        if entry["fix"]:
            body.append(f"fix:       {entry['fix']}")
    elif entry["capabilities"] is not None:
        body.extend(_caps_lines(entry["capabilities"]))
    else:
        body.append(f"capabilities unavailable: {entry.get('capabilities_error', '?')}")
    if entry.get("modes"):
        body.append("modes:")
        body.extend(f"  - {_mode_line(mode)}" for mode in entry["modes"])
    return lines + [f"  {line}" for line in body]


def _mode_line(mode: dict[str, Any]) -> str:
    if not mode["ok"]:
        fix = f" (fix: {mode['fix']})" if mode["fix"] else ""
        return f"{mode['mode']}: NOT AVAILABLE: {mode['reason']}{fix}"
    guarantee = mode["guarantee"].removeprefix(f"{mode['mode']}: ")
    return f"{mode['mode']}: OK; {guarantee or 'no statement'}"


def _environment_lines(environments: dict[str, Any]) -> str:
    built = environments["built"]
    if not built:
        return f"environments ({environments['store']}): none built; `execspace env build code-interpreter`\n"
    lines = [f"  {e['name']}: python {e['python']}, {e['packages']} packages, {e['path']}\n" for e in built]
    return "".join([f"environments ({environments['store']}):\n", *lines])


def _daemon() -> dict[str, Any]:
    path = daemon_socket_path()
    answer = ping(path)
    return {"running": answer is not None, "socket": path, "status": (answer or "").removeprefix("pong ")}


def render(entries: list[dict[str, Any]], default: dict[str, Any], daemon: dict[str, Any] | None = None) -> str:
    working = [e["name"] for e in entries if e["ok"]]
    out = [f"execspace doctor: {len(entries)} backends, working here: {', '.join(working) or 'none'}", ""]
    for entry in entries:
        out.extend([*_entry_lines(entry), ""])
    if default["backend"]:
        out.append(f"default backend (when --backend is not given): {default['backend']}")
    else:
        out.append(f"default backend (when --backend is not given): none: {default['reason']}")
    if daemon is not None:
        if daemon["running"]:
            out.append(f"CLI daemon: running ({daemon['status']}), socket {daemon['socket']}")
        else:
            out.append("CLI daemon: not running; `execspace daemon start` makes each command start in milliseconds")
    return "\n".join(out) + "\n"
