import pytest

pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http", reason="needs the otel extra (pip install 'execspace[otel]')"
)
