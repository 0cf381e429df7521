"""``execspace doctor``: which backends work here, why the others do not, and what each enforces."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True, slots=True)
class ModeReport:
    """One choice of a backend's ``mode`` option: its probe and the guarantee its capabilities state."""

    mode: object
    ok: bool
    reason: str
    fix: str
    guarantee: str

    def as_json(self) -> dict[str, object]:
        return {"mode": self.mode, "ok": self.ok, "reason": self.reason, "fix": self.fix, "guarantee": self.guarantee}


@dataclass(frozen=True, slots=True)
class BackendReport:
    """What doctor found of one backend."""

    name: str
    summary: str
    ok: bool
    reason: str
    fix: str
    capabilities: Capabilities | None
    modes: list[ModeReport]
    capabilities_error: str | None = None
    """Why a backend whose probe passed could not state its capabilities."""

    def as_json(self) -> dict[str, object]:
        found: dict[str, object] = {
            "name": self.name,
            "summary": self.summary,
            "ok": self.ok,
            "reason": self.reason,
            "fix": self.fix,
            "capabilities": self.capabilities.as_dict() if self.capabilities is not None else None,
            "modes": [m.as_json() for m in self.modes],
        }
        if self.capabilities_error is not None:
            found["capabilities_error"] = self.capabilities_error
        return found


@dataclass(frozen=True, slots=True)
class DefaultReport:
    """The backend ``--backend`` not given picks, or why none can be picked."""

    backend: str | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DaemonReport:
    running: bool
    socket: str
    status: str


@dataclass(frozen=True, slots=True)
class EnvironmentsReport:
    """The runtime environment store and the environments built in it."""

    store: str
    built: list[dict[str, object]]
    """``name``, ``path``, ``python`` and ``packages`` (their count) of each."""


async def _modes(name: str) -> list[ModeReport]:
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
        found.append(ModeReport(mode, probe.ok, probe.reason, probe.fix, guarantee))
    return found


async def _inspect(name: str) -> BackendReport:
    info = BACKENDS[name]
    probe = await probe_backend(name)
    fix = probe.fix or ("" if probe.ok else info.install_hint)
    caps, error = None, None
    if probe.ok:
        try:
            caps = await backend_capabilities(name)
        except Exception as exc:  # one broken backend must not hide the others' report
            error = f"{type(exc).__name__}: {exc}"
    return BackendReport(name, info.summary, probe.ok, probe.reason, fix, caps, await _modes(name), error)


async def _default() -> DefaultReport:
    try:
        return DefaultReport(await choose_default_backend())
    except SetupFailed as exc:
        return DefaultReport(None, str(exc))


async def command(args: argparse.Namespace) -> int:
    progress(f"probing backends ({', '.join(BACKENDS)})...")
    entries, default = await asyncio.gather(asyncio.gather(*(_inspect(n) for n in BACKENDS)), _default())
    daemon = _daemon()
    store = EnvironmentStore()
    built: list[dict[str, object]] = [
        {"name": e.name, "path": str(e.path), "python": e.python_version, "packages": len(e.packages)}
        for e in store.environments()
    ]
    environments = EnvironmentsReport(str(store.root), built)
    if args.json:
        print_json(
            {
                "backends": [e.as_json() for e in entries],
                "default": asdict(default),
                "daemon": asdict(daemon),
                "environments": asdict(environments),
            }
        )
    else:
        sys.stdout.write(render(entries, default, daemon) + _environment_lines(environments))
        sys.stdout.flush()
    return 0


# -- text ---------------------------------------------------------------------------------


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def _caps_lines(caps: Capabilities) -> list[str]:
    network = "on by default" if caps.network_default else "off by default"
    network += "; can be turned off per run" if caps.network_control else "; cannot be turned off"
    if caps.network_domains:
        network += "; allow-lists by domain (--allow-domain)"
    lines = [
        f"isolation: {caps.isolation}",
        f"network:   {network}",
        f"limits:    {', '.join(sorted(caps.enforced_limits)) or 'none'}",
        f"languages: {', '.join(caps.languages) or 'none found'}",
        f"streaming: {_yes(caps.streaming)}   clean env: {_yes(caps.clean_env)}   "
        f"read-only mounts: {_yes(caps.read_only_mounts)}   host paths: {_yes(caps.host_paths)}   "
        f"binary output: {_yes(caps.binary_output)}",
    ]
    kernels = caps.kernels
    if kernels:
        lines.append(
            f"kernels:   {', '.join(kernels.languages)}, isolation {kernels.isolation}; cells get "
            f"{', '.join(sorted(kernels.cell_limits)) or 'no limits'}; whole kernel: "
            f"{', '.join(sorted(kernels.kernel_limits)) or 'no limits'}; warm pool {kernels.warm_pool}"
        )
    if caps.does_not_protect:
        lines.append("does not protect against:")
        lines.extend(f"  - {item}" for item in caps.does_not_protect)
    return lines


def _entry_lines(entry: BackendReport) -> list[str]:
    lines = [f"{entry.name}: {'OK' if entry.ok else 'NOT AVAILABLE'}"]
    body = [f"about:     {entry.summary}"] if entry.summary else []
    if not entry.ok:
        body.append(f"why:       {entry.reason}")
        if entry.fix:
            body.append(f"fix:       {entry.fix}")
    elif entry.capabilities is not None:
        body.extend(_caps_lines(entry.capabilities))
    else:
        body.append(f"capabilities unavailable: {entry.capabilities_error or '?'}")
    if entry.modes:
        body.append("modes:")
        body.extend(f"  - {_mode_line(mode)}" for mode in entry.modes)
    return lines + [f"  {line}" for line in body]


def _mode_line(mode: ModeReport) -> str:
    if not mode.ok:
        fix = f" (fix: {mode.fix})" if mode.fix else ""
        return f"{mode.mode}: NOT AVAILABLE: {mode.reason}{fix}"
    guarantee = mode.guarantee.removeprefix(f"{mode.mode}: ")
    return f"{mode.mode}: OK; {guarantee or 'no statement'}"


def _environment_lines(environments: EnvironmentsReport) -> str:
    if not environments.built:
        return f"environments ({environments.store}): none built; `execspace env build code-interpreter`\n"
    lines = [
        f"  {e['name']}: python {e['python']}, {e['packages']} packages, {e['path']}\n" for e in environments.built
    ]
    return "".join([f"environments ({environments.store}):\n", *lines])


def _daemon() -> DaemonReport:
    path = daemon_socket_path()
    answer = ping(path)
    return DaemonReport(answer is not None, path, (answer or "").removeprefix("pong "))


def render(entries: list[BackendReport], default: DefaultReport, daemon: DaemonReport | None = None) -> str:
    working = [e.name for e in entries if e.ok]
    out = [f"execspace doctor: {len(entries)} backends, working here: {', '.join(working) or 'none'}", ""]
    for entry in entries:
        out.extend([*_entry_lines(entry), ""])
    if default.backend:
        out.append(f"default backend (when --backend is not given): {default.backend}")
    else:
        out.append(f"default backend (when --backend is not given): none: {default.reason}")
    if daemon is not None:
        if daemon.running:
            out.append(f"CLI daemon: running ({daemon.status}), socket {daemon.socket}")
        else:
            out.append("CLI daemon: not running; `execspace daemon start` makes each command start in milliseconds")
    return "\n".join(out) + "\n"
