"""The :class:`~execspace.tracing.Tracer` over OpenTelemetry (the ``otel`` extra), and the one the standard
``OTEL_*`` variables describe.

Imported only when tracing is asked for (:func:`execspace.tracing.from_environment`) or by a caller that hands its
own provider to :class:`OtelTracer`. OpenTelemetry's global tracer provider is never set nor read here: the
provider the variables describe belongs to whoever built it (the CLI for one command, serve and the MCP server for
their lifetime, ``open_engine`` for its engine) and is shut down, its spans exported, by its :meth:`close`; a host
application that has its own passes ``OtelTracer(its_provider)``. What OpenTelemetry keeps per task is only the
current span (a context variable), which is how a request's span is the parent of what it causes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .errors import SetupFailed

if TYPE_CHECKING:  # execspace.tracing imports this module when the variables ask for traces
    from .tracing import Attributes, AttributeValue, Span, SpanKind, Tracer

__all__ = ["OtelTracer", "environment_tracer"]

#: The name of the instrumentation scope of every span.
SCOPE = "execspace"
_PROPAGATOR = TraceContextTextMapPropagator()
_KINDS = {"internal": trace.SpanKind.INTERNAL, "server": trace.SpanKind.SERVER}
_SAMPLERS: dict[str, Callable[[float], sampling.Sampler]] = {
    "always_on": lambda _: sampling.ALWAYS_ON,
    "always_off": lambda _: sampling.ALWAYS_OFF,
    "traceidratio": lambda ratio: sampling.TraceIdRatioBased(ratio),
    "parentbased_always_on": lambda _: sampling.ParentBased(sampling.ALWAYS_ON),
    "parentbased_always_off": lambda _: sampling.ParentBased(sampling.ALWAYS_OFF),
    "parentbased_traceidratio": lambda ratio: sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
}


class _OtelSpan:
    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def failed(self, error: BaseException | str) -> None:
        # the class only: an error's message may quote a path, a command line or a value
        name = error if isinstance(error, str) else type(error).__name__
        self._span.set_attribute("error.type", name)
        self._span.set_status(trace.Status(trace.StatusCode.ERROR, name))

    def end(self) -> None:
        self._span.end()  # the SDK ignores a second end (with a warning), so it is only called once here


class _Ending(_OtelSpan):
    """A span its owner ends (:meth:`OtelTracer.start`): ends once whoever calls first."""

    __slots__ = ("_ended",)

    def __init__(self, span: trace.Span) -> None:
        super().__init__(span)
        self._ended = False

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._span.end()


class OtelTracer:
    """Spans of an OpenTelemetry tracer provider (the SDK's, or any API provider a host application has)."""

    def __init__(
        self, provider: trace.TracerProvider, *, attributes: Attributes | None = None, owned: bool = False
    ) -> None:
        """``owned``: :meth:`close` shuts the provider down (it was made for this tracer alone)."""
        self._provider = provider
        self._tracer = provider.get_tracer(SCOPE)
        self._attributes: dict[str, AttributeValue] = dict(attributes or {})
        self._owned = owned

    @property
    def enabled(self) -> bool:
        return True

    def span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: Mapping[str, str] | None = None,
        kind: SpanKind = "internal",
    ) -> AbstractContextManager[Span]:
        # an incoming request's trace context, or none: a request without one starts a trace, never joins the
        # span that happens to be current in the server's task
        context = _PROPAGATOR.extract(parent) if parent is not None else None
        return self._span(name, self._merged(attributes), context, _KINDS[kind])

    @contextlib.contextmanager
    def _span(self, name: str, attributes: Attributes, context: object, kind: trace.SpanKind) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name,
            context=context,  # type: ignore[arg-type]  # a Context from extract(), or None: the current one
            kind=kind,
            attributes=attributes,
            record_exception=False,  # its message and traceback may quote values: failed() records the class
            set_status_on_exception=False,
        ) as raw:
            span = _OtelSpan(raw)
            try:
                yield span
            except BaseException as exc:
                span.failed(exc)
                raise

    def start(self, name: str, attributes: Attributes | None = None) -> Span:
        return _Ending(self._tracer.start_span(name, attributes=self._merged(attributes)))

    def headers(self) -> Mapping[str, str]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)  # the current context's span: nothing when there is none
        return carrier

    def bound(self, attributes: Attributes) -> Tracer:
        # shares the provider; only the tracer that made it closes it
        return OtelTracer(self._provider, attributes={**self._attributes, **attributes})

    def close(self) -> None:
        if self._owned and isinstance(self._provider, TracerProvider):
            self._provider.shutdown()  # exports what the batch still holds, then stops its thread

    def _merged(self, attributes: Attributes | None) -> Attributes:
        if not attributes:
            return self._attributes
        return {**self._attributes, **attributes} if self._attributes else attributes


def environment_tracer(service: str, env: Mapping[str, str]) -> OtelTracer:
    """A tracer of a provider of its own, as the ``OTEL_*`` variables in ``env`` describe: the exporters
    (``OTEL_TRACES_EXPORTER``: ``otlp``, ``console``), the OTLP protocol (``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``:
    ``http/protobuf``, the default, or ``grpc`` when its exporter is installed) and endpoint, the service name
    (``OTEL_SERVICE_NAME``, else ``service``) and the sampler (``OTEL_TRACES_SAMPLER``, ``_ARG``). The exporters
    read their other settings (headers, timeout, compression, certificates) from the process's environment."""
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME", "").strip() or service}),
        sampler=_sampler(env),
    )
    for processor in _processors(env):
        provider.add_span_processor(processor)
    return OtelTracer(provider, owned=True)


def _processors(env: Mapping[str, str]) -> list[SpanProcessor]:
    names = [n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    processors: list[SpanProcessor] = []
    for name in names:
        if name == "none":
            continue
        if name == "otlp":
            processors.append(BatchSpanProcessor(_otlp_exporter(env)))
        elif name == "console":
            processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            raise SetupFailed(
                "tracing",
                f"OTEL_TRACES_EXPORTER names {name!r}, an exporter execspace does not set up",
                "set OTEL_TRACES_EXPORTER to otlp or console (or none)",
                component="tracing",
            )
    return processors


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ).strip()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter

        return HTTPExporter(endpoint=_http_endpoint(env))
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GRPCExporter,
            )
        except ImportError:
            raise SetupFailed(
                "tracing",
                "OTEL_EXPORTER_OTLP_PROTOCOL is grpc, and the OTLP gRPC exporter is not installed",
                "pip install opentelemetry-exporter-otlp-proto-grpc, or use http/protobuf",
                component="tracing",
            ) from None
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        exporter: SpanExporter = GRPCExporter(endpoint=endpoint.strip() if endpoint else None)
        return exporter
    raise SetupFailed(
        "tracing",
        f"the OTLP protocol {protocol!r} is not one execspace exports with",
        "set OTEL_EXPORTER_OTLP_PROTOCOL to http/protobuf (or grpc, with its exporter installed)",
        component="tracing",
    )


def _http_endpoint(env: Mapping[str, str]) -> str | None:
    """The traces URL: the signal's own endpoint as given, else the base endpoint with ``/v1/traces`` (the OTLP
    specification's rule); None: the exporter's default."""
    own = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if own:
        return own
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return f"{base.rstrip('/')}/v1/traces" if base else None


def _sampler(env: Mapping[str, str]) -> sampling.Sampler:
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    make = _SAMPLERS.get(name)
    if make is None:
        raise SetupFailed(
            "tracing",
            f"OTEL_TRACES_SAMPLER names {name!r}, not a sampler execspace sets up",
            f"use one of {', '.join(_SAMPLERS)}",
            component="tracing",
        )
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(arg) if arg else 1.0
    except ValueError:
        raise SetupFailed(
            "tracing",
            f"OTEL_TRACES_SAMPLER_ARG is {arg!r}, not a number",
            "set it to a ratio between 0 and 1",
            component="tracing",
        ) from None
    return make(ratio)
