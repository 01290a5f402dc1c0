"""``/healthz`` and ``/metrics`` of the streams worker (``health`` section), for container probes.

Health is not "the process is alive": the worker is healthy when a timer on its event loop ran
within ``health.max_sync_age_seconds`` (a stuck loop stops it), and at that tick the worker held
its partitions of ``mail.events`` and was neither recovering tables nor rebalancing. The state is
taken on the loop and only read by the HTTP thread, so the probe never touches faust's objects.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from connectors.core.metrics import PartitionLag, build_info
from streams.pipeline import FAILED, SKIPPED, UNROUTED, Outcome

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
            "Partitions of the events topic this worker holds (its work units)",
            registry=self.registry,
        )
        r = self.registry
        self.lag = Gauge(
            "mailtap_streams_consumer_lag",
            "High watermark minus committed offset, per assigned partition (transaction markers "
            "count, so an idle transactional topic can show 1)",
            ["topic", "partition"],
            registry=r,
        )
        self.partition_lag = PartitionLag(self.lag)
        self.records = Counter(
            "mailtap_streams_records_processed", "mail.events records handled", registry=r
        )
        self.guard_decisions = Counter(
            "mailtap_streams_guard_decisions",
            "Mails a guard stopped, by workflow and guard (routing: no rule matched)",
            ["workflow", "guard"],
            registry=r,
        )
        self.workflow_steps = Counter(
            "mailtap_streams_workflow_steps",
            "WorkflowEvents emitted, by workflow and status",
            ["workflow", "status"],
            registry=r,
        )
        self.workflow_failures = Counter(
            "mailtap_streams_workflow_failures",
            "Workflow handlers that raised (the mail is not marked as run)",
            ["workflow"],
            registry=r,
        )
        self.commands = Counter(
            "mailtap_streams_commands_emitted",
            "ReplyCommands sent to the commands topic, by workflow and step",
            ["workflow", "step"],
            registry=r,
        )
        self.table_entries = Gauge(
            "mailtap_streams_table_entries", "Keys in each table", ["table"], registry=r
        )
        self.build_info = build_info(r, "streams")

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
        if app.consumer is not None:
            self._observe_lag(app.consumer, assignment)

    def _observe_lag(self, consumer: Any, assignment: Any) -> None:
        # faust keeps the committed offset per partition (_committed_offset, the next offset to
        # read); the high watermark comes from the fetcher's last response.
        committed = getattr(consumer, "_committed_offset", {})
        lags = {}
        for tp in assignment:
            try:
                high = consumer.highwater(tp)
            except Exception:  # not fetched yet: no figure rather than a wrong one
                continue
            if high is None:
                continue
            lags[tp.topic, tp.partition] = high - (committed.get(tp) or 0)
        self.partition_lag.observe(lags)

    def observe_tables(self, tables: dict[str, Any]) -> None:
        """Called on the event loop with the worker's faust tables."""
        for name, table in tables.items():
            self.table_entries.labels(name).set(len(table))

    def observe_outcome(self, outcome: Outcome, *, record: bool) -> None:
        """Count one handled record (``record``) or timer tick and what it produced."""
        if record:
            self.records.inc()
        if outcome.already_ran is not None:  # a repeat: counted here, published nowhere
            self.guard_decisions.labels(outcome.already_ran, "dedupe").inc()
        for event in outcome.events:
            workflow, status = event["workflow"], event["status"]
            self.workflow_steps.labels(workflow, status).inc()
            if status == SKIPPED:
                self.guard_decisions.labels(workflow, event["attributes"].get("guard", "")).inc()
            elif status == UNROUTED:
                self.guard_decisions.labels(workflow, "routing").inc()
            elif status == FAILED:
                self.workflow_failures.labels(workflow).inc()
        for command in outcome.commands:
            self.commands.labels(command["workflow"], command["step"]).inc()

    def health(self, max_age: float) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            age = round(time.time() - self._beat, 3) if self._beat else None
            partitions, settled = self._partitions, self._settled
        ok = age is not None and age <= max_age and partitions > 0 and settled
        detail: dict[str, Any] = {
            "ok": ok,
            "max_age_seconds": max_age,
            "loop_age_seconds": age,
            "assigned_partitions": partitions,
            "settled": settled,
        }
        if not ok:
            detail["reason"] = (
                "event loop has not reported yet"
                if age is None
                else f"event loop stuck for {age:.0f}s"
                if age > max_age
                else "recovering tables or rebalancing"
                if not settled
                else f"no partition of {self.events_topic} assigned"
            )
        return ok, detail


def mails_read_again(port: int) -> int:
    """A streams worker's ``mailtap_streams_guard_decisions_total{guard="dedupe"}``: the mails
    it found it had run already (they publish nothing). OSError while it does not serve."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "mailtap_streams_guard_decisions_total"
            and sample.labels.get("guard") == "dedupe"
        )
    )
