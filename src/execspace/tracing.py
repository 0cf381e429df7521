"""What the run machinery asks of a tracer, and the tracer that does nothing (the default).

The machinery (workspace creation, staging, runs, collection, kernels, snapshots, serve's requests) calls a
:class:`Tracer` it was given; with none it is :data:`NO_TRACER`, whose every call returns at once and which imports
nothing. OpenTelemetry is only imported by :func:`from_environment` when the standard ``OTEL_*`` variables turn
tracing on (:mod:`execspace.otel`, the ``otel`` extra).

A span carries names, counts, codes and durations only: never an environment value, a secret, an argument past
``argv[0]``, stdin, output or file content; an error is recorded by its class name, not its message (a message
may quote a path or a value).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from .errors import SetupFailed

if TYPE_CHECKING:
    from .models import RunResult

__all__ = [
    "NO_TRACER",
    "RUN_SPAN",
    "WORKSPACE_CLEANUP",
    "WORKSPACE_CREATE",
    "WORKSPACE_FORK",
    "WORKSPACE_RESTORE",
    "WORKSPACE_SNAPSHOT",
    "AttributeValue",
    "Attributes",
    "NoTracer",
    "Span",
    "SpanKind",
    "Tracer",
    "from_environment",
    "record_run",
    "run_attributes",
    "tracing_requested",
]

AttributeValue = str | bool | int | float
Attributes = Mapping[str, AttributeValue]
#: ``server``: the span of a request that came in (serve's HTTP requests, an MCP tool call); else ``internal``.
SpanKind = Literal["internal", "server"]


class Span(Protocol):
    """One span being recorded."""

    def set(self, key: str, value: AttributeValue) -> None:
        """Add an attribute (a name, a count, a code: never a value the caller was given to keep secret)."""
        ...

    def failed(self, error: BaseException | str) -> None:
        """Mark the span failed by ``error``'s class (its message is left out: it may quote a value), or by the
        name given (an HTTP status, as OpenTelemetry's ``error.type`` has it)."""
        ...

    def end(self) -> None:
        """End the span (once; later calls do nothing)."""
        ...


@runtime_checkable
class Tracer(Protocol):
    """Makes spans. Given to the machinery by the backend's options (``tracer=``), or to serve and the MCP server
    by their owners; never a global."""

    @property
    def enabled(self) -> bool:
        """Whether spans are recorded: a caller may skip working out attributes when they are not."""
        ...

    def span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: Mapping[str, str] | None = None,
        kind: SpanKind = "internal",
    ) -> AbstractContextManager[Span]:
        """A span for the ``with`` block, the current one inside it (spans started there are its children); an
        exception leaving the block marks it failed. ``parent``: W3C trace context headers (``traceparent``,
        ``tracestate``) of an incoming request, whose trace it joins instead of the current span's."""
        ...

    def start(self, name: str, attributes: Attributes | None = None) -> Span:
        """A child of the current span that is not made current and outlives the caller's block (a program
        started now that ends later): its owner ends it."""
        ...

    def headers(self) -> Mapping[str, str]:
        """The W3C trace context headers (``traceparent``, ``tracestate``) of the current span, for a request it
        sends to a service that traces too (whose span of it is then the current span's child); empty when no span
        is current."""
        ...

    def bound(self, attributes: Attributes) -> Tracer:
        """This tracer adding ``attributes`` to every span it makes (a backend's name, its mode)."""
        ...

    def close(self) -> None:
        """Export what is left and stop: what the owner of a tracer it made from the environment calls last."""
        ...


class _NoSpan:
    __slots__ = ()

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def failed(self, error: BaseException | str) -> None:
        pass

    def end(self) -> None:
        pass

    def __enter__(self) -> Span:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        pass


_NO_SPAN = _NoSpan()
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class NoTracer:
    """The tracer that records nothing: one shared span that ignores every call, nothing allocated per call."""

    __slots__ = ()

    @property
    def enabled(self) -> bool:
        return False

    def span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: Mapping[str, str] | None = None,
        kind: SpanKind = "internal",
    ) -> AbstractContextManager[Span]:
        return _NO_SPAN

    def start(self, name: str, attributes: Attributes | None = None) -> Span:
        return _NO_SPAN

    def headers(self) -> Mapping[str, str]:
        return _NO_HEADERS

    def bound(self, attributes: Attributes) -> Tracer:
        return self

    def close(self) -> None:
        pass


#: The default tracer: immutable, shared by everything that was given none.
NO_TRACER: Tracer = NoTracer()

#: The spans of a workspace's creation and clean-up.
WORKSPACE_CREATE = "execspace.workspace.create"
WORKSPACE_CLEANUP = "execspace.workspace.cleanup"
#: The spans of a snapshot of a workspace's files, of forks (from a workspace or a snapshot) and of a restore.
WORKSPACE_SNAPSHOT = "execspace.workspace.snapshot"
WORKSPACE_FORK = "execspace.workspace.fork"
WORKSPACE_RESTORE = "execspace.workspace.restore"
#: The span of one program's run, from its start to its result (``run_program``, or ``start_program`` until the
#: program's end).
RUN_SPAN = "execspace.run"


def run_attributes(cmd: str, workspace: str, backend: str, isolation: str) -> dict[str, AttributeValue]:
    """What a run's span says when it starts: the program's ``argv[0]`` (OpenTelemetry's ``process.command``: its
    arguments, environment and stdin stay out), the workspace's id, the backend and the isolation it runs under."""
    return {
        "process.command": cmd,
        "execspace.workspace.id": workspace,
        "execspace.backend": backend,
        "execspace.isolation": isolation,
    }


def record_run(span: Span, result: RunResult) -> None:
    """Add a run's result to its span: the exit code (``process.exit.code``, and ``execspace.run.exit_code``),
    the limit that stopped it, whether it timed out, its duration and the bytes it wrote (never the bytes)."""
    span.set("process.exit.code", result.exit_code)
    span.set("execspace.run.exit_code", result.exit_code)
    span.set("execspace.run.timed_out", result.timed_out)
    span.set("execspace.run.duration_s", result.duration)
    span.set("execspace.run.stdout_bytes", result.stdout_total_bytes)
    span.set("execspace.run.stderr_bytes", result.stderr_total_bytes)
    if result.limit_hit is not None:
        span.set("execspace.run.limit_hit", result.limit_hit)


#: The variables that ask for traces (the exporter, or where an OTLP exporter sends them).
_REQUESTING = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces: ``OTEL_TRACES_EXPORTER`` set and not ``none``, or an
    OTLP endpoint set (the exporter then defaults to ``otlp``); ``OTEL_SDK_DISABLED=true`` turns it off. With none
    of them set nothing is traced (the OpenTelemetry SDK's own default, ``otlp`` to localhost, is not assumed)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return any(env.get(name, "").strip() for name in _REQUESTING[1:])


def from_environment(service: str, environ: Mapping[str, str] | None = None) -> Tracer | None:
    """The tracer the ``OTEL_*`` variables ask for (:func:`tracing_requested`), exporting as they say, or None
    when they ask for none (then nothing is imported). ``service`` is the service name when
    ``OTEL_SERVICE_NAME`` is not set. The caller owns it: :meth:`Tracer.close` flushes it.

    Raises:
        SetupFailed: the variables ask for traces and the ``otel`` extra is not installed, or name an exporter
            or protocol that cannot be used (the message says which and how to fix it).
    """
    env = os.environ if environ is None else environ
    if not tracing_requested(env):
        return None
    try:
        from .otel import environment_tracer
    except ImportError as exc:
        raise SetupFailed(
            "tracing",
            f"the OTEL_* variables ask for traces, and OpenTelemetry is not installed ({exc.name} is missing)",
            "pip install 'execspace[otel]', or unset OTEL_TRACES_EXPORTER and OTEL_EXPORTER_OTLP_ENDPOINT",
            component="tracing",
        ) from None
    return environment_tracer(service, env)
