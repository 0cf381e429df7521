"""The backend contract: what a factory registered under a name (``registry.py``) offers.

A factory is a class with a ``name``, the options class it takes (``options``: a frozen dataclass deriving from
:class:`BackendOptions`), and two classmethods that take one value of it: ``probe(options) -> Probe`` (does it
work here, with these options?) and ``open(options) -> Engine``. Options are checked when they are built, so a
wrong name, a wrong type or a missing required option is an ``InvalidSpec`` naming it and the valid ones, never a
``TypeError`` from deep inside a backend.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, Self, TypeVar, Union, cast

from .artifacts import ArtifactService
from .audit import AuditSink
from .envpolicy import EnvPolicy
from .errors import InvalidSpec
from .tracing import Tracer

if typing.TYPE_CHECKING:
    from .engine import BaseEngine  # engine imports the registry, which imports this module

__all__ = ["BackendFactory", "BackendOptions", "HostOptions", "Probe", "option_choices"]

OptionsT = TypeVar("OptionsT", bound="BackendOptions")


@dataclass(frozen=True, slots=True)
class Probe:
    """Whether a backend works on this host, and if not, why and how to fix it."""

    ok: bool
    reason: str = ""
    fix: str = ""


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """The base of every backend's options: a frozen dataclass whose fields are checked against their annotations
    when a value is built (``InvalidSpec`` names the field, the type it takes and every valid option).

    Args:
        tracer: the spans of the engine's work (docs/operations.md "Traces"); None: what the ``OTEL_*`` variables
            ask for when ``open_engine`` opens it, else none.
        audit: where a line of each workspace created and cleaned up, program started and ended, file written,
            renamed and removed goes, before the call returns (an :class:`~execspace.audit.AuditLog`;
            docs/operations.md "Audit log"); a backend that cannot audit refuses it (``CapabilityError``).
    """

    tracer: Tracer | None = None
    audit: AuditSink | None = None

    def __post_init__(self) -> None:
        cls: type = type(self)  # a plain type: mypy checks type[Self] against Hashable with the instances' __hash__
        hints = _hints(cls)
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not _conforms(value, hints[field.name]):
                # the type, never the value: it may be a secret
                raise InvalidSpec(
                    f"{type(self).__name__}: option {field.name} takes {_describe(hints[field.name])}, "
                    f"not {type(value).__name__}; its options: {', '.join(self.option_names())}"
                )

    @classmethod
    def option_names(cls) -> list[str]:
        return sorted(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_keywords(cls, backend: str, keywords: Mapping[str, object], *, hint: str = "") -> Self:
        """The options ``keywords`` name, for backend ``backend``; ``hint`` ends the message when they are not
        its options."""
        names = cls.option_names()
        unknown = sorted(set(keywords) - set(names))
        missing = [f.name for f in dataclasses.fields(cls) if _required(f) and f.name not in keywords]
        if unknown or missing:
            problem = f"has no option {', '.join(unknown)}" if unknown else f"needs the option {', '.join(missing)}"
            raise InvalidSpec(f"backend {backend!r} {problem}{hint}; its options: {', '.join(names)}")
        return cls(**cast("dict[str, Any]", keywords))  # each checked by __post_init__

    def as_keywords(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, kw_only=True)
class HostOptions(BackendOptions):
    """The options every backend with workspaces on this host takes.

    Args:
        workspace_root: where workspaces are created (default: a private directory under ``$TMPDIR``).
        env_policy: how a run's environment is built (default: core variables, secrets dropped).
        host_roots: host directories ``host://`` inputs may read from (nothing else is reachable).
        artifacts: an ``ArtifactService`` for ``artifact://`` inputs and saved outputs.
        kill_grace: seconds between SIGTERM and SIGKILL when a run is killed.
    """

    workspace_root: Path | str | None = None
    env_policy: EnvPolicy | None = None
    host_roots: Sequence[Path | str] = ()
    artifacts: ArtifactService | None = None
    kill_grace: float = 2.0


class BackendFactory(Protocol[OptionsT]):
    """What ``registry.load_backend`` returns: the class a backend name stands for."""

    @property
    def name(self) -> str: ...

    @property
    def options(self) -> type[OptionsT]: ...

    async def probe(self, options: OptionsT, /) -> Probe: ...

    async def open(self, options: OptionsT, /) -> BaseEngine: ...


@functools.cache  # resolving the annotations costs more than checking every field
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def option_choices(options: type, name: str) -> tuple[object, ...]:
    """The values option ``name`` of the options class ``options`` takes when it is a ``Literal`` (a backend's
    modes, for ``execspace doctor``); ``()`` for any other option."""
    hint = _hints(options).get(name)
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def _required(field: dataclasses.Field[object]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _conforms(value: object, hint: object) -> bool:
    """Whether ``value`` is of the annotated type (as deep as containers and unions go; callables by being
    callable)."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        return any(_conforms(value, arg) for arg in args)
    if origin is Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if origin is None:
        assert isinstance(hint, type), hint
        if hint in (int, float):  # a bool is an int to Python, never a number of seconds or bytes here
            return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
        return isinstance(value, hint)
    return _conforms_generic(value, origin, args)


def _conforms_generic(value: object, origin: type, args: tuple[object, ...]) -> bool:
    if origin is type:
        return isinstance(value, type) and issubclass(value, args[0])  # type: ignore[arg-type]
    if not isinstance(value, origin):
        return False
    if not args:
        return True
    if isinstance(value, tuple) and origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(item, args[0]) for item in value)
        return len(value) == len(args) and all(map(_conforms, value, args))
    if isinstance(value, Mapping):
        return all(_conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items())
    if isinstance(value, (str, bytes)):  # a string is a sequence of strings: never what a list option means
        return False
    if isinstance(value, (Sequence, Set)):
        return all(_conforms(item, args[0]) for item in value)
    return True


def _describe(hint: object) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "None"
    if origin is Union or origin is types.UnionType:
        return " | ".join(map(_describe, args))
    if origin is Literal:
        return " | ".join(map(repr, args))
    if origin is not None:
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else _describe(a) for a in args)}]"
    return getattr(hint, "__name__", str(hint))
