"""W3C trace context in Kafka headers (connectors.core.tracing): a child span keeps its parent's
trace, a record without one starts a new trace, bad headers are ignored, the setting is off by
default and refuses to start without the packages."""

from __future__ import annotations

import pytest

from connectors.core import tracing
from connectors.core.config import config_from_dict
from connectors.core.errors import ConfigError

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _parts(headers: list[tuple[str, bytes]]) -> list[str]:
    values = [v.decode() for k, v in headers if k == tracing.TRACEPARENT]
    assert len(values) == 1, headers
    return values[0].split("-")


def test_child_keeps_the_parents_trace_with_a_new_span() -> None:
    for parent in ([("other", b"x"), ("traceparent", PARENT.encode())], {"traceparent": PARENT}):
        version, trace, span, _flags = _parts(tracing.child_headers("hop", parent))
        assert version == "00"
        assert trace == "0af7651916cd43dd8448eb211c80319c"
        assert len(span) == 16 and span != "b7ad6b7169203331"


def test_without_a_parent_each_record_starts_its_own_trace() -> None:
    first = _parts(tracing.child_headers("mail.received"))[1]
    second = _parts(tracing.child_headers("mail.received", [("x", b"y")]))[1]
    assert len(first) == 32 and first != "0" * 32
    assert first != second


def test_malformed_parent_starts_a_new_trace() -> None:
    trace = _parts(tracing.child_headers("hop", [("traceparent", b"garbage")]))[1]
    assert len(trace) == 32 and trace != "0af7651916cd43dd8448eb211c80319c"


def test_span_headers_stay_valid_inside_the_block() -> None:
    with tracing.span_headers("smtp.send", [("traceparent", PARENT.encode())]) as headers:
        assert tracing.trace_id(headers) == "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("traceparent", PARENT.encode())], "0af7651916cd43dd8448eb211c80319c"),
        ({"traceparent": PARENT.upper()}, "0af7651916cd43dd8448eb211c80319c"),
        ([("traceparent", b"00-" + b"0" * 32 + b"-b7ad6b7169203331-01")], None),
        ([("traceparent", b"00-xyz-b7ad6b7169203331-01")], None),
        ([("traceparent", None)], None),
        ([("mailtap.error.kind", b"parse_error")], None),
        (None, None),
    ],
)
def test_trace_id(headers: tracing.RecordHeaders, expected: str | None) -> None:
    assert tracing.trace_id(headers) == expected


def test_tracing_is_off_by_default_and_can_be_switched_on() -> None:
    base = {"bootstrap_servers": "127.0.0.1:9092"}
    assert config_from_dict({"kafka": base}).kafka.tracing.enabled is False
    on = config_from_dict({"kafka": {**base, "tracing": {"enabled": True}}})
    assert on.kafka.tracing.enabled is True


def test_enabled_without_the_packages_fails_at_start_saying_what_to_do(monkeypatch) -> None:
    monkeypatch.setattr(tracing, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"mailtap\[tracing\]"):
        config_from_dict(
            {"kafka": {"bootstrap_servers": "127.0.0.1:9092", "tracing": {"enabled": True}}}
        )


def test_spans_go_to_the_operators_tracer_provider(monkeypatch) -> None:
    """With an SDK provider installed (e.g. by opentelemetry-instrument), spans are exported."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    headers = tracing.child_headers("workflow.command", [("traceparent", PARENT.encode())])
    [span] = exporter.get_finished_spans()
    assert span.name == "workflow.command"
    assert f"{span.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    assert _parts(headers)[2] == f"{span.context.span_id:016x}"
