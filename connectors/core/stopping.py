"""The process's stop request: SIGTERM/SIGINT handlers call :func:`request_stop`, and every wait
at start-up (for Kafka: :mod:`connectors.core.kafka.clients`; for the schema registry:
:meth:`connectors.core.avro.serde.AvroSerde.prepare`) gives up within its slice instead of its
full timeout, with :class:`~connectors.core.errors.StopRequested`."""

from __future__ import annotations

import threading

from connectors.core.errors import StopRequested

#: Set once the process is asked to stop; never cleared (tests do, between cases).
STOP = threading.Event()


def request_stop() -> None:
    """Make every start-up wait in this process give up (signal handlers call this)."""
    STOP.set()


def stop_requested() -> bool:
    return STOP.is_set()


def raise_if_stopping(what: str = "Kafka") -> None:
    if STOP.is_set():
        raise StopRequested(f"stop requested while waiting for {what}")


def pause_unless_stopping(seconds: float, what: str) -> None:
    """Sleep ``seconds`` between two tries of a start-up wait for ``what``; a stop ends it."""
    STOP.wait(seconds)
    raise_if_stopping(what)
