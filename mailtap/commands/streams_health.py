"""``/healthz`` and ``/metrics`` of the streams worker (``health`` section), for container probes.

Health is not "the process is alive": the worker is healthy when a timer on its event loop ran
within ``health.max_sync_age_seconds`` (a stuck loop stops it), and at that tick the worker held
its partitions of ``mail.events`` and was neither recovering tables nor rebalancing. The state is
taken on the loop and only read by the HTTP thread, so the probe never touches faust's objects.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

#: How often the loop reports; well inside any sensible max age (600 s by default).
HEARTBEAT_SECONDS = 2.0


class StreamsHealth:
    """Served by :class:`connectors.core.metrics.HealthServer` (it needs ``registry``, ``health``)."""

    def __init__(self, events_topic: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.events_topic = events_topic
        self._lock = threading.Lock()
        self._beat = 0.0
        self._partitions = 0
        self._settled = False
        self.heartbeat = Gauge(
            "mailtap_streams_heartbeat_timestamp_seconds",
            "Last time the worker's event loop reported",
            registry=self.registry,
        )
        self.assigned = Gauge(
            "mailtap_streams_assigned_partitions",
            "Partitions of the events topic this worker holds",
            registry=self.registry,
        )

    def observe(self, app: Any) -> None:
        """Called on the event loop by the worker's timer."""
        assignment = app.consumer.assignment() if app.consumer is not None else set()
        partitions = sum(1 for tp in assignment if tp.topic == self.events_topic)
        settled = not (app.in_recovery or app.rebalancing)
        now = time.time()
        with self._lock:
            self._beat, self._partitions, self._settled = now, partitions, settled
        self.heartbeat.set(now)
        self.assigned.set(partitions)

    def health(self, max_age: float) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            age = round(time.time() - self._beat, 3) if self._beat else None
            partitions, settled = self._partitions, self._settled
        ok = age is not None and age <= max_age and partitions > 0 and settled
        return ok, {
            "ok": ok,
            "max_age_seconds": max_age,
            "loop_age_seconds": age,
            "assigned_partitions": partitions,
            "settled": settled,
        }
