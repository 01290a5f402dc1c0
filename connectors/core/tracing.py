"""W3C trace context (``traceparent``) carried in Kafka headers, from a mail to its delivery.

Optional and off by default (``kafka.tracing.enabled``). When on, the chain is::

    source    starts a trace per MailEvent            -> traceparent on mail.events
    streams   a child span per ReplyCommand it emits  -> traceparent on mail.commands
    SMTP sink a child span for the send               -> traceparent on mail.delivery (and retries)

so one mail can be followed end to end by its trace id (``mailtap consume`` prints it).

The OpenTelemetry API's ``TraceContextTextMapPropagator`` reads and writes the header; span ids
come from the tracer provider the operator installed (``opentelemetry-instrument``, their own
SDK setup: spans are then exported to their tracing system), else from a private SDK provider
without an exporter (the API's default provider hands out spans without ids, which would
propagate nothing). The packages are imported only when tracing is on: off costs nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

__all__ = [
    "MISSING_PACKAGES",
    "TRACEPARENT",
    "available",
    "child_headers",
    "span_headers",
    "trace_id",
]

TRACEPARENT = "traceparent"
#: The W3C header names this module writes (``tracestate`` only when a parent had one).
_NAMES = (TRACEPARENT, "tracestate")
MISSING_PACKAGES = (
    "kafka.tracing.enabled needs the OpenTelemetry packages: install mailtap with the "
    "'tracing' extra (pip install 'mailtap[tracing]') or set kafka.tracing.enabled: false"
)

#: What confluent-kafka, aiokafka and faust hand back as record headers.
RecordHeaders = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


def available() -> bool:
    """True when the OpenTelemetry API and SDK can be imported."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("opentelemetry.trace", "opentelemetry.sdk.trace")
    )


def header_pairs(headers: RecordHeaders) -> Iterable[tuple[str, bytes | str | None]]:
    """``headers`` as ``(name, value)`` pairs, whichever shape they came in (none: none)."""
    if headers is None:
        return ()
    return headers.items() if isinstance(headers, Mapping) else headers


def _carrier(headers: RecordHeaders) -> dict[str, str]:
    """The W3C headers among ``headers`` as text (Kafka header values are bytes)."""
    carrier = {}
    for name, value in header_pairs(headers):
        if name in _NAMES and value is not None:
            carrier[name] = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    return carrier


@cache
def _tools() -> tuple[Any, Any]:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return trace, TraceContextTextMapPropagator()


def _tracer() -> Any:
    trace, _ = _tools()
    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        provider = _private_provider()
    return provider.get_tracer("mailtap")


@cache
def _private_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider()


@contextmanager
def span_headers(name: str, parent: RecordHeaders = None) -> Iterator[list[tuple[str, bytes]]]:
    """A span ``name``, child of the context in ``parent`` (a new trace when there is none),
    open for the ``with`` block; yields the Kafka headers that carry it on."""
    trace, propagator = _tools()
    context = propagator.extract(_carrier(parent))
    with _tracer().start_as_current_span(name, context=context) as span:
        carrier: dict[str, str] = {}
        propagator.inject(carrier, context=trace.set_span_in_context(span))
        yield [(k, v.encode("ascii")) for k, v in carrier.items()]


def child_headers(name: str, parent: RecordHeaders = None) -> list[tuple[str, bytes]]:
    """Headers of a (closed) span ``name`` under ``parent``: for a hop that only passes on."""
    with span_headers(name, parent) as headers:
        return headers


def trace_id(headers: RecordHeaders) -> str | None:
    """The trace id (32 hex digits) in a record's ``traceparent``, or None.

    Parsed by hand: ``mailtap consume`` shows it without the OpenTelemetry packages, and a
    malformed header from another producer must not fail the read (W3C trace-context §3.2).
    """
    value = _carrier(headers).get(TRACEPARENT, "")
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return None
    tid = parts[1].lower()
    if any(c not in "0123456789abcdef" for c in tid) or tid == "0" * 32:
        return None
    return tid
