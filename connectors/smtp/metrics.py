"""Prometheus metrics of the SMTP sink, and its health for ``/healthz``.

Health is the age of the last completed round of the consume loop (a poll that returned, and the
batch it brought fully recorded in Kafka): a sink stuck on a hung relay or a broken Kafka
transaction stops completing rounds and turns unhealthy after ``health.max_sync_age_seconds``.
An idle sink still completes a round every poll timeout, so idleness is healthy.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from connectors.core.metrics import PartitionLag, build_info


class SinkMetrics:
    """Counters by outcome; served by :class:`connectors.core.metrics.HealthServer`."""

    def __init__(
        self, registry: CollectorRegistry | None = None, prefix: str = "mailtap_smtp"
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.outcomes = Counter(
            f"{prefix}_outcomes",
            "Delivery outcomes recorded, per recipient",
            ["status"],
            registry=r,
        )
        self.retries = Counter(
            f"{prefix}_retries_scheduled", "Retry records written, by tier", ["tier"], registry=r
        )
        self.dlq_records = Counter(f"{prefix}_dlq_records", "Records sent to the DLQ", registry=r)
        self.sessions_opened = Gauge(
            f"{prefix}_sessions_opened", "SMTP sessions opened since start", registry=r
        )
        self.paused_partitions = Gauge(
            f"{prefix}_paused_retry_partitions", "Retry partitions waiting for due time", registry=r
        )
        self.last_round = Gauge(
            f"{prefix}_last_round_timestamp_seconds",
            "Unix time of the last completed consume round",
            registry=r,
        )
        self.assigned_partitions = Gauge(
            f"{prefix}_assigned_partitions",
            "Partitions of the commands and retry topics this instance holds (its work units)",
            registry=r,
        )
        self.lag = Gauge(
            f"{prefix}_consumer_lag",
            "High watermark minus position, per assigned partition (commands and retry topics)",
            ["topic", "partition"],
            registry=r,
        )
        self.partition_lag = PartitionLag(self.lag)
        self.build_info = build_info(r, "smtp-sink")
        self._last_round = time.time()
        self._partitions = 0
        self._lock = threading.Lock()

    def observe_consumer(self, consumer: Any) -> None:
        """Work units and lag, once per round; local figures only (no broker round trip)."""
        assignment = consumer.assignment()
        with self._lock:
            self._partitions = len(assignment)
        self.assigned_partitions.set(len(assignment))
        lags = {}
        for tp in consumer.position(assignment) if assignment else []:
            # cached: the high watermark of the last fetch response for this partition.
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                lags[tp.topic, tp.partition] = high - tp.offset
        self.partition_lag.observe(lags)

    def round_completed(self) -> None:
        now = time.time()
        with self._lock:
            self._last_round = now
        self.last_round.set(now)

    def health(self, max_age: float) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            age = round(time.time() - self._last_round, 3)
            partitions = self._partitions
        ok = age <= max_age
        detail: dict[str, Any] = {
            "ok": ok,
            "max_age_seconds": max_age,
            "last_round_age_seconds": age,
            "assigned_partitions": partitions,
        }
        if not ok:
            detail["reason"] = f"no consume round completed for {age:.0f}s (hung relay or Kafka?)"
        return ok, detail
