"""Backend registry: name → lazily imported factory, with install hints.

Third-party backends register through the ``execspace.backends`` entry-point
group (value ``"module:Factory"``); built-in names cannot be overridden.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

from .backend import BackendFactory, BackendOptions, Probe
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
    "build_options",
    "choose_default_backend",
    "load_backend",
    "open_backend",
    "probe_backend",
]


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
    "e2b": BackendInfo(
        "e2b",
        "execspace.backends.e2b:E2BBackend",
        "pip install 'execspace[e2b]' and point it at an E2B-protocol service (api_url, api_key)",
        "remote sandboxes over the E2B protocol (E2B cloud, Cube Sandbox, self-hosted E2B, execspace serve)",
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


def load_backend(name: str) -> BackendFactory[Any]:
    """Import and return the factory of backend ``name`` (which options class it takes is known only then)."""
    info = _BUILTIN.get(name) or BACKENDS.get(name)  # built-ins never wait for the entry-point scan
    if info is None:
        raise UnsupportedBackend(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    module_name, _, attr = info.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SetupFailed(name, f"cannot import {module_name} ({exc})", info.install_hint) from exc
    factory: BackendFactory[Any] = getattr(module, attr)
    return factory


def build_options(
    name: str,
    factory: BackendFactory[Any],
    options: BackendOptions | None = None,
    keywords: Mapping[str, object] | None = None,
    *,
    chosen: bool = False,
) -> BackendOptions:
    """The one typed value ``factory`` takes: ``options`` (its options class, or a base of it such as
    ``HostOptions``) with ``keywords`` over it; ``InvalidSpec`` naming what is wrong and the valid options."""
    cls: type[BackendOptions] = factory.options
    given = dict(options.as_keywords() if options is not None else {})
    if options is not None and not isinstance(options, cls):
        if not issubclass(cls, type(options)):
            raise InvalidSpec(f"backend {name!r} takes {cls.__name__}, not {type(options).__name__}")
    elif options is not None:
        cls = type(options)  # a subclass of the factory's own keeps what it adds
    hint = " (it was chosen as the default: name the backend your options are for)" if chosen else ""
    return cls.from_keywords(name, {**given, **(keywords or {})}, hint=hint)


async def probe_backend(name: str, options: BackendOptions | None = None, /, **keywords: object) -> Probe:
    """Probe one backend with the options it would be opened with, without raising (options it does not take
    are a failed probe saying so)."""
    try:
        factory = load_backend(name)
        built = build_options(name, factory, options, keywords)
    except SetupFailed as exc:
        return Probe(False, exc.cause, exc.fix)
    except InvalidSpec as exc:
        return Probe(False, str(exc), "pass only the options listed")
    try:
        return await factory.probe(built)
    except Exception as exc:  # a probe must never take the caller down
        return Probe(False, f"probe failed: {exc}", (_BUILTIN.get(name) or BACKENDS[name]).install_hint)


async def open_backend(
    name: str | None, options: BackendOptions | None = None, keywords: Mapping[str, object] | None = None
) -> BaseEngine:
    """Open backend ``name`` (``None`` or ``"auto"``: the default choice) with its options built once."""
    chosen = name in (None, "auto")
    if chosen:
        name = await choose_default_backend(keywords, options)
    assert name is not None
    factory = load_backend(name)
    return await factory.open(build_options(name, factory, options, keywords, chosen=chosen))


async def choose_default_backend(
    keywords: Mapping[str, object] | None = None, options: BackendOptions | None = None
) -> str:
    """The safest backend that works here, probed with the options it would be opened with (those it takes: the
    rest are an ``InvalidSpec`` when it opens); ``SetupFailed`` listing why each failed."""
    reasons = []
    for name in DEFAULT_ORDER:
        probe = await _probe_candidate(name, keywords or {}, options)
        if probe.ok:
            return name
        reasons.append(f"{name}: {probe.reason}" + (f" (fix: {probe.fix})" if probe.fix else ""))
    raise SetupFailed(
        "default",
        "no isolating backend works on this host [" + "; ".join(reasons) + "]",
        "fix one of the above, or pass backend='local' (CLI: --backend local) to run WITHOUT isolation",
    )


async def _probe_candidate(name: str, keywords: Mapping[str, object], options: BackendOptions | None) -> Probe:
    try:
        taken = load_backend(name).options.option_names()
    except SetupFailed as exc:
        return Probe(False, exc.cause, exc.fix)
    return await probe_backend(name, options, **{k: v for k, v in keywords.items() if k in taken})
