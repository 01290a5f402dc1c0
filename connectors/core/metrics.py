"""Prometheus metrics and ``/healthz``: health is the age of each mailbox's last successful sync.

"The process is alive" is not health (DESIGN.md): a trigger that died silently still has a process.
``/healthz`` answers 503 with the stale mailboxes listed when any watched mailbox has not completed a
sync for longer than ``health.max_sync_age_seconds``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)


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
        self.last_sync = Gauge(
            f"{prefix}_last_successful_sync_timestamp_seconds",
            "Unix time of the last successful sync",
            labels,
            registry=r,
        )
        self._last_sync: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def watch(self, source: str, account: str, folder: str) -> None:
        """Register a mailbox: from now on it counts for health, synced or not."""
        with self._lock:
            self._last_sync.setdefault((source, account, folder), time.time())

    def synced(self, source: str, account: str, folder: str, mails: int) -> None:
        now = time.time()
        with self._lock:
            self._last_sync[(source, account, folder)] = now
        self.last_sync.labels(source, account, folder).set(now)
        self.mails_per_sync.labels(source, account, folder).set(mails)

    def health(self, max_age: float) -> tuple[bool, dict[str, Any]]:
        now = time.time()
        with self._lock:
            ages = {"/".join(k): round(now - t, 3) for k, t in self._last_sync.items()}
        stale = {k: a for k, a in ages.items() if a > max_age}
        return not stale, {
            "ok": not stale,
            "max_age_seconds": max_age,
            "ages": ages,
            "stale": stale,
        }


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
