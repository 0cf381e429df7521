"""A real OTLP/HTTP trace receiver on 127.0.0.1: it parses each POST /v1/traces as opentelemetry-proto's
ExportTraceServiceRequest, as a collector does, and keeps the spans."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["ReceivedSpan", "Receiver", "otlp_receiver"]


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, object]
    status_code: int
    service: str
    events: tuple[str, ...] = ()
    raw: bytes = field(default=b"", repr=False)
    """The span's own encoding: what a test that looks for a value anywhere in it searches."""


def _value(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


class Receiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._received(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self, **more: str) -> dict[str, str]:
        """The variables that send a process's traces here."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            **more,
        }

    def _received(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for rs in request.resource_spans:
            service = next((str(_value(a.value)) for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    found.append(
                        ReceivedSpan(
                            name=sp.name,
                            trace_id=sp.trace_id.hex(),
                            span_id=sp.span_id.hex(),
                            parent_span_id=sp.parent_span_id.hex(),
                            kind=sp.kind,
                            attributes={a.key: _value(a.value) for a in sp.attributes},
                            status_code=sp.status.code,
                            service=service,
                            events=tuple(e.name for e in sp.events),
                            raw=sp.SerializeToString(),
                        )
                    )
        with self._lock:
            self.bodies.append(body)
            self.spans.extend(found)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def wait_for(self, ready: Callable[[Receiver], bool], timeout: float = 20.0) -> None:
        """Poll until ``ready(self)``; fail with what was received."""
        deadline = time.monotonic() + timeout
        while not ready(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not received in {timeout}s: {[s.name for s in self.spans]}")
            time.sleep(0.02)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver._server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver._server.shutdown()
        receiver._server.server_close()
