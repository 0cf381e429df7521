"""Backend registry: name → lazily imported factory, with install hints.

Third-party backends register through the ``execspace.backends`` entry-point
group (value ``"module:Factory"``); built-in names cannot be overridden.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Protocol

from .errors import InvalidSpec, SetupFailed, UnsupportedBackend

TYPE_CHECKING = False  # typing.TYPE_CHECKING costs an import on the command line's path
if TYPE_CHECKING:
    from .engine import BaseEngine  # engine imports this module lazily in open_engine

__all__ = [
    "BACKENDS",
    "DEFAULT_ORDER",
    "BackendFactory",
    "BackendInfo",
    "Probe",
    "check_options",
    "choose_default_backend",
    "load_backend",
    "probe_backend",
]


@dataclass(frozen=True, slots=True)
class Probe:
    """Whether a backend works on this host, and if not, why and how to fix it."""

    ok: bool
    reason: str = ""
    fix: str = ""


class BackendFactory(Protocol):
    name: str

    @classmethod
    async def probe(cls, **options: Any) -> Probe: ...

    @classmethod
    async def open(cls, **options: Any) -> BaseEngine: ...


@dataclass(frozen=True, slots=True)
class BackendInfo:
    name: str
    target: str
    """``"module:Factory"``, imported on first use."""
    install_hint: str
    summary: str


_BUILTIN = {
    "container": BackendInfo(
        "container",
        "execspace.backends.container:ContainerBackend",
        "pip install 'execspace[docker]' and run a Docker or Podman daemon",
        "one hardened container per workspace (Docker Engine API / Podman)",
    ),
    "jupyter": BackendInfo(
        "jupyter",
        "execspace.backends.jupyter:JupyterBackend",
        "pip install 'execspace[jupyter]'",
        "stateful Jupyter kernels with rich outputs",
    ),
    "local": BackendInfo(
        "local",
        "execspace.backends.local:LocalBackend",
        "built in",
        "runs on this host as you: NO isolation, for trusted code only",
    ),
    "sandbox": BackendInfo(
        "sandbox",
        "execspace.backends.sandbox:SandboxBackend",
        "apt-get install bubblewrap (Linux) or use macOS's sandbox-exec",
        "OS sandbox: bubblewrap + seccomp on Linux, Seatbelt on macOS",
    ),
}

#: Order in which ``backend=None`` looks for a working backend: safest first, never ``local``.
DEFAULT_ORDER = ("sandbox", "container")


def _all_backends() -> dict[str, BackendInfo]:
    found = dict(_BUILTIN)
    from importlib.metadata import entry_points  # 10 ms here: only when a name is not built in

    for ep in entry_points(group="execspace.backends"):
        if ep.name not in found:  # built-ins are never silently replaced
            found[ep.name] = BackendInfo(ep.name, ep.value, f"installed by {ep.dist.name if ep.dist else '?'}", "")
    return dict(sorted(found.items()))


class _KnownBackends(Mapping[str, BackendInfo]):
    """Read-only view of the known backends, built on first use: reading the installed
    packages' entry points costs more than everything else the command line needs."""

    @cached_property
    def _found(self) -> Mapping[str, BackendInfo]:
        return MappingProxyType(_all_backends())

    def __getitem__(self, name: str) -> BackendInfo:
        return self._found[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._found)

    def __len__(self) -> int:
        return len(self._found)


#: Read-only view of the known backends.
BACKENDS: Mapping[str, BackendInfo] = _KnownBackends()


def load_backend(name: str) -> BackendFactory:
    """Import and return the factory of backend ``name``."""
    info = _BUILTIN.get(name) or BACKENDS.get(name)  # built-ins never wait for the entry-point scan
    if info is None:
        raise UnsupportedBackend(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    module_name, _, attr = info.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SetupFailed(name, f"cannot import {module_name} ({exc})", info.install_hint) from exc
    factory: BackendFactory = getattr(module, attr)
    return factory


async def probe_backend(name: str, **options: Any) -> Probe:
    """Probe one backend without raising."""
    try:
        factory = load_backend(name)
    except SetupFailed as exc:
        return Probe(False, exc.cause, exc.fix)
    try:
        return await factory.probe(**options)
    except Exception as exc:  # a probe must never take the caller down
        return Probe(False, f"probe failed: {exc}", (_BUILTIN.get(name) or BACKENDS[name]).install_hint)


def check_options(name: str, factory: BackendFactory, options: Mapping[str, Any], *, chosen: bool = False) -> None:
    """``InvalidSpec`` naming the options ``factory.open`` does not take or needs, before it is called: a
    ``TypeError`` from deep inside would say neither which backend nor what it takes."""
    params = inspect.signature(factory.open).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    accepted = sorted(n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    unknown = sorted(set(options) - set(accepted))
    missing = [n for n in accepted if params[n].default is params[n].empty and n not in options]
    if not (unknown or missing):
        return
    problem = f"has no option {', '.join(unknown)}" if unknown else f"needs the option {', '.join(missing)}"
    hint = " (it was chosen as the default: name the backend your options are for)" if chosen else ""
    raise InvalidSpec(f"backend {name!r} {problem}{hint}; its options: {', '.join(accepted)}")


async def choose_default_backend(options: Mapping[str, Any] | None = None) -> str:
    """The safest backend that works here, probed with the options it would be opened with; ``SetupFailed``
    listing why each failed."""
    reasons = []
    for name in DEFAULT_ORDER:
        probe = await probe_backend(name, **(options or {}))
        if probe.ok:
            return name
        reasons.append(f"{name}: {probe.reason}" + (f" (fix: {probe.fix})" if probe.fix else ""))
    raise SetupFailed(
        "default",
        "no isolating backend works on this host [" + "; ".join(reasons) + "]",
        "fix one of the above, or pass backend='local' (CLI: --backend local) to run WITHOUT isolation",
    )
