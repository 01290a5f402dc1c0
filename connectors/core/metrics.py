"""Prometheus metrics and ``/healthz``: health is the age of each mailbox's last successful sync.

"The process is alive" is not health (DESIGN.md): a trigger that died silently still has a process.
``/healthz`` answers 503 with the stale mailboxes listed when any watched mailbox has not completed a
sync for longer than ``health.max_sync_age_seconds``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

#: States a mailbox worker reports in ``mailtap_source_state`` (FENCED: another instance with the
#: same transactional id took over; the mailbox is stopped here and needs an operator).
UNHEALTHY_STATES = frozenset({"BACKOFF", "FENCED", "ACCESS_DENIED", "MAILBOX_GONE"})
#: States that need an operator, not time: the credentials or the mailbox itself (Graph: consent
#: revoked, the user deleted). ``/healthz`` lists them under ``denied`` and is not ok.
DENIED_STATES = frozenset({"ACCESS_DENIED", "MAILBOX_GONE"})


def build_info(registry: CollectorRegistry, component: str) -> Gauge:
    """``mailtap_build_info{component,version} 1``: which release each process runs."""
    try:
        version = importlib.metadata.version("mailtap")
    except importlib.metadata.PackageNotFoundError:  # a source tree without installed metadata
        version = "unknown"
    gauge = Gauge(
        "mailtap_build_info",
        "Always 1; the labels say which component and release this process runs",
        ["component", "version"],
        registry=registry,
    )
    gauge.labels(component, version).set(1)
    return gauge


class PartitionLag:
    """``<prefix>_consumer_lag{topic,partition}``: one series per partition the process holds
    now. A rebalance that moves a partition away removes its series: a gauge left at the figure
    of its last observation showed the partition as lagging for good on the worker that had it
    before (``bench streams`` with 2 workers: a lag of ~2,000 on partitions another worker
    had caught up)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._shown: set[tuple[str, str]] = set()

    def observe(self, figures: dict[tuple[str, int], int]) -> None:
        """Set the lag of each partition held now (topic, partition -> lag); drop the others."""
        shown = {(topic, str(partition)) for topic, partition in figures}
        for labels in self._shown - shown:
            self.gauge.remove(*labels)
        for (topic, partition), lag in figures.items():
            self.gauge.labels(topic, str(partition)).set(max(0, lag))
        self._shown = shown


class SourceMetrics:
    """The metrics every source connector exports, labelled by account and folder."""

    def __init__(self, registry: CollectorRegistry | None = None, prefix: str = "mailtap") -> None:
        self.registry = registry or CollectorRegistry()
        labels = ("source", "account", "folder")
        r = self.registry
        self.connects = Counter(f"{prefix}_connects", "Successful connections", labels, registry=r)
        self.connect_failures = Counter(
            f"{prefix}_connect_failures", "Failed connection attempts", labels, registry=r
        )
        self.auth_failures = Counter(
            f"{prefix}_auth_failures", "Authentication failures", labels, registry=r
        )
        self.uidvalidity_changes = Counter(
            f"{prefix}_uidvalidity_changes",
            "UIDVALIDITY changes (full rescans)",
            labels,
            registry=r,
        )
        self.mails_per_sync = Gauge(
            f"{prefix}_mails_last_sync", "Mails read in the last sync", labels, registry=r
        )
        self.events_produced = Counter(
            f"{prefix}_events_produced", "Events committed to Kafka", labels, registry=r
        )
        self.dlq_records = Counter(
            f"{prefix}_dlq_records", "Records sent to the DLQ", labels, registry=r
        )
        self.transaction_aborts = Counter(
            f"{prefix}_transaction_aborts", "Aborted Kafka transactions", labels, registry=r
        )
        self.expunge_checks = Counter(
            f"{prefix}_expunge_checks",
            "Looks for mails that left a folder, by method: listing (every UID) or qresync "
            "(IMAP VANISHED since the cursor, no listing)",
            (*labels, "method"),
            registry=r,
        )
        self.last_sync = Gauge(
            f"{prefix}_last_successful_sync_timestamp_seconds",
            "Unix time of the last successful sync",
            labels,
            registry=r,
        )
        self.state = Gauge(
            f"{prefix}_source_state",
            "1 for the state each mailbox worker is in, 0 for the others",
            (*labels, "state"),
            registry=r,
        )
        self.watched = Gauge(
            f"{prefix}_source_mailboxes",
            "Mailboxes this process owns (its work units)",
            ("source",),
            registry=r,
        )
        self.owned = Gauge(
            f"{prefix}_source_mailbox_owned",
            "1 for each mailbox this process owns now (a unit moved away loses its series)",
            labels,
            registry=r,
        )
        self.config_reloads = Counter(
            f"{prefix}_config_reloads",
            "Configuration reloads (SIGHUP) by result: ok (the accounts applied) or failed (the "
            "file was refused; the running configuration stays)",
            ("source", "result"),
            registry=r,
        )
        self.build_info = build_info(r, "source")
        #: The group membership behind the ownership (``connectors.core.source.ownership.group``), for /healthz.
        self.assignment: dict[str, Any] | None = None
        self._last_sync: dict[tuple[str, str, str], float] = {}
        self._states: dict[tuple[str, str, str], str] = {}
        #: Mailboxes the broker refuses a permission to: the sentence naming the missing ACL.
        self._refused: dict[tuple[str, str, str], str] = {}
        #: Per mailbox, the server's missing extensions and the source's fallbacks (IMAP).
        self._fallbacks: dict[tuple[str, str, str], tuple[str, ...]] = {}
        #: Mailboxes that moved away: a worker that stopped late (after the runtime's join gave
        #: up on it) still reports a sync or its STOPPED state, which must not bring the
        #: mailbox back (found by `mailtap soak`: an instance counted a handed-over mailbox as
        #: its own, "not synced", and stayed unhealthy for good).
        self._gone: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def watch(self, source: str, account: str, folder: str) -> None:
        """Register a mailbox: from now on it counts for health, synced or not."""
        with self._lock:
            self._gone.discard((source, account, folder))
            self._last_sync.setdefault((source, account, folder), time.time())
            owned = sum(1 for k in self._last_sync if k[0] == source)
        self.watched.labels(source).set(owned)
        self.owned.labels(source, account, folder).set(1)

    def unwatch(self, source: str, account: str, folder: str) -> None:
        """The mailbox moved to another instance (or was removed): it no longer counts here,
        and its labelled series go, so a dashboard sums each mailbox once across instances."""
        key = (source, account, folder)
        with self._lock:
            self._gone.add(key)
            self._last_sync.pop(key, None)
            state = self._states.pop(key, None)
            self._fallbacks.pop(key, None)
            self._refused.pop(key, None)
            owned = sum(1 for k in self._last_sync if k[0] == source)
        self.watched.labels(source).set(owned)
        for gauge in (self.owned, self.last_sync, self.mails_per_sync):
            with contextlib.suppress(KeyError):
                gauge.remove(source, account, folder)
        if state is not None:
            with contextlib.suppress(KeyError):
                self.state.remove(source, account, folder, state)

    def mailboxes(self) -> list[str]:
        """``source/account/folder`` of every mailbox this process owns, sorted."""
        with self._lock:
            return sorted("/".join(k) for k in self._last_sync)

    def set_state(self, source: str, account: str, folder: str, state: str) -> None:
        """The mailbox worker's state machine moved (``connectors.imap.state``, ews worker)."""
        with self._lock:
            if (source, account, folder) in self._gone:
                return
            old = self._states.get((source, account, folder))
            self._states[(source, account, folder)] = state
        if old is not None and old != state:
            self.state.labels(source, account, folder, old).set(0)
        self.state.labels(source, account, folder, state).set(1)

    def set_fallbacks(self, source: str, account: str, folder: str, notes: tuple[str, ...]) -> None:
        """What the mailbox's server lacks and what the source does instead (for /healthz)."""
        with self._lock:
            if (source, account, folder) in self._gone:
                return
            if notes:
                self._fallbacks[(source, account, folder)] = notes
            else:
                self._fallbacks.pop((source, account, folder), None)

    def synced(self, source: str, account: str, folder: str, mails: int) -> None:
        now = time.time()
        with self._lock:
            if (source, account, folder) in self._gone:
                return
            self._last_sync[(source, account, folder)] = now
        self.last_sync.labels(source, account, folder).set(now)
        self.mails_per_sync.labels(source, account, folder).set(mails)

    def refused(self, source: str, account: str, folder: str, sentence: str | None) -> None:
        """A mailbox the broker refuses a permission (None: granted again). Unhealthy until
        then, even before its first sync."""
        with self._lock:
            if sentence is None or (source, account, folder) in self._gone:
                self._refused.pop((source, account, folder), None)
            else:
                self._refused[(source, account, folder)] = sentence

    def health(self, max_age: float) -> tuple[bool, dict[str, Any]]:
        now = time.time()
        with self._lock:
            ages = {"/".join(k): round(now - t, 3) for k, t in self._last_sync.items()}
            fenced = sorted("/".join(k) for k, st in self._states.items() if st == "FENCED")
            backoff = sorted("/".join(k) for k, st in self._states.items() if st == "BACKOFF")
            denied = {"/".join(k): st for k, st in self._states.items() if st in DENIED_STATES}
            states = {"/".join(k): st for k, st in sorted(self._states.items())}
            refused = {"/".join(k): why for k, why in sorted(self._refused.items())}
            fallbacks = {"/".join(k): list(v) for k, v in sorted(self._fallbacks.items())}
        stale = {k: a for k, a in ages.items() if a > max_age}
        ok = not stale and not fenced and not refused and not denied
        detail: dict[str, Any] = {
            "ok": ok,
            "max_age_seconds": max_age,
            "ages": ages,
            "stale": stale,
            "fenced": fenced,
            "backoff": backoff,
            # Mailboxes that wait for an operator: ACCESS_DENIED or MAILBOX_GONE.
            "denied": denied,
            # Each owned mailbox's worker state (IDLE, POLLING, BACKOFF ...), for mailtap status.
            "states": states,
            # Mailboxes whose server lacks an extension: what the source does instead
            # (e.g. polling without IDLE).
            "fallbacks": fallbacks,
            # Which mailboxes this instance runs (the others' are on other instances).
            "mailboxes": sorted(ages),
        }
        if self.assignment is not None:
            detail["assignment"] = self.assignment
        if not ok:
            reasons = [f"{k} not synced for {a:.0f}s" for k, a in sorted(stale.items())]
            reasons += [f"{k} fenced by another instance" for k in fenced]
            reasons += [f"{k}: {why}" for k, why in refused.items()]
            reasons += [f"{k} {st}" for k, st in sorted(denied.items())]
            detail["reason"] = "; ".join(reasons)
        return ok, detail


class HealthServer:
    """``GET /metrics`` (Prometheus text) and ``GET /healthz`` (JSON, 200 or 503) on a thread."""

    def __init__(self, metrics: SourceMetrics, host: str, port: int, max_age: float) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body = generate_latest(owner.metrics.registry)
                    self._send(200, body, CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    ok, detail = owner.metrics.health(owner.max_age)
                    self._send(200 if ok else 503, json.dumps(detail).encode(), "application/json")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.metrics = metrics
        self.max_age = max_age
        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("health endpoint on http://%s:%d/healthz", *self._server.server_address[:2])
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
