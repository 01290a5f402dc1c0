"""What the page and the list endpoints show, read from Kafka by the same functions as
``mailtap status`` and ``mailtap dlq list``, kept in memory and re-read in the background.

Reading the DLQ and 24 hours of events takes seconds on a busy cluster; a request must not.
So a :class:`SnapshotCache` re-reads every ``console.refresh_seconds`` on its own thread and a
request pages through the last :class:`Snapshot` (its ``taken_at`` is shown). An action re-reads
at once before it answers, so the operator sees its effect.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from connectors.core.config import MailtapConfig
from mailtap.commands.dlq import select, summary
from mailtap.commands.status import collect
from mailtap.trace import read_records

log = logging.getLogger(__name__)

#: The page's charts cover this long (the mailbox sparklines and the delivery outcomes).
WINDOW_S = 24 * 3600.0


@dataclass(frozen=True)
class Snapshot:
    """One reading of the topics."""

    taken_at: dt.datetime
    took_s: float
    status: dict[str, Any]
    mailboxes: list[dict[str, Any]]
    dlq: list[dict[str, Any]]
    workflows: list[dict[str, Any]] = field(default_factory=list)


def mailbox_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The mailboxes of a ``mailtap status`` report as table rows, sorted by name."""
    return [{"mailbox": name, **entry} for name, entry in sorted(report["mailboxes"].items())]


def workflow_runs(cfg: MailtapConfig) -> list[dict[str, Any]]:
    """The newest status of every workflow instance on ``mail.workflow``, newest first."""
    latest: dict[str, dict[str, Any]] = {}
    for record in read_records(cfg.kafka, [cfg.kafka.topics.workflow]):
        if record.key is None:
            continue
        if record.value is None:
            latest.pop(record.key, None)
            continue
        value = record.value
        occurred = value.get("occurred_at")
        at = (
            occurred
            if isinstance(occurred, dt.datetime)
            else dt.datetime.fromtimestamp(record.timestamp_ms / 1000, dt.UTC)
        )
        latest[record.key] = {
            "instance_id": value.get("instance_id", record.key),
            "workflow": value.get("workflow"),
            "status": value.get("status"),
            "event_key": value.get("event_key"),
            "at": at.isoformat(timespec="seconds"),
            "attributes": value.get("attributes") or {},
        }
    return sorted(latest.values(), key=lambda run: run["at"], reverse=True)


def take(cfg: MailtapConfig) -> Snapshot:
    """Read everything the page shows, once."""
    started = time.monotonic()
    report = collect(cfg, window_s=WINDOW_S)
    dlq = [summary(seen, note) for seen, note in select(cfg.kafka, cfg.kafka.topics.dlq)]
    dlq.reverse()  # newest first: what broke last is what an operator looks for
    runs = workflow_runs(cfg)
    return Snapshot(
        taken_at=dt.datetime.now(dt.UTC),
        took_s=round(time.monotonic() - started, 3),
        status=report,
        mailboxes=mailbox_rows(report),
        dlq=dlq,
        workflows=runs,
    )


class SnapshotCache:
    """The last :class:`Snapshot`, re-read every ``interval_s`` on a daemon thread."""

    def __init__(self, reader: Callable[[], Snapshot], interval_s: float) -> None:
        self._reader = reader
        self._interval_s = interval_s
        self._current: Snapshot | None = None
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()
        #: DLQ record id -> when an action handled it: a reading that began before that may
        #: still hold the record, and must not bring it back.
        self._handled: dict[str, float] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def current(self) -> Snapshot | None:
        """The last snapshot read, None before the first."""
        return self._current

    def get(self) -> Snapshot:
        """The current snapshot (the first call reads one)."""
        current = self._current
        return current if current is not None else self.refresh()

    def refresh(self) -> Snapshot:
        """Read now (one read at a time) and keep it."""
        with self._read_lock:
            began = time.monotonic()
            snapshot = self._reader()
            with self._lock:
                recent = {rid for rid, at in self._handled.items() if at >= began}
                self._handled = {rid: self._handled[rid] for rid in recent}
                if recent:
                    snapshot = replace(
                        snapshot, dlq=[r for r in snapshot.dlq if r["id"] not in recent]
                    )
                self._current = snapshot
            return snapshot

    def without_dlq(self, record_ids: Iterable[str]) -> None:
        """Drop handled DLQ records from the current snapshot at once and re-read soon: an
        action answers in the time of its writes, not of a whole reading of the topics."""
        gone = set(record_ids)
        now = time.monotonic()
        with self._lock:
            self._handled.update(dict.fromkeys(gone, now))
            current = self._current
            if current is not None:
                self._current = replace(
                    current, dlq=[r for r in current.dlq if r["id"] not in gone]
                )
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="console-snapshot", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # a broker hiccup: the page keeps the last snapshot
                log.warning(
                    "console: reading the topics failed; showing the last reading", exc_info=True
                )
            self._wake.wait(self._interval_s)
            self._wake.clear()
