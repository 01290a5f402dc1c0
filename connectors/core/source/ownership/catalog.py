"""The mailboxes topic (``mailtap.mailboxes``): folders added or removed at runtime, for every instance.

A source publishes the folders its configuration lists, changed by the newest record of each
(source, account, folder) on this compacted topic: ``added`` publishes a folder the
configuration does not list, ``removed`` stops one it does. Credentials stay in the
configuration's account definitions, so a record can only name an account the configuration
defines (a record for another account is logged and ignored). ``mailtap mailboxes add|remove|list``
writes and reads it; every running instance follows it within a second, no restart needed.

Wire sample (canonical JSON, as the offsets topic)::

    key   {"account":"support","folder":"Archive","source":"imap"}
    value {"at":"2026-12-02T01:00:00+00:00","state":"added"}
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.core.kafka.offsets import canonical_json
from connectors.core.kafka.readtoend import read_to_end, topic_partitions
from connectors.core.kafka.topics import COMPACTED, TopicSpec, ensure_topic_specs
from connectors.core.source.ownership.group import WorkUnit

log = logging.getLogger(__name__)

ADDED = "added"
REMOVED = "removed"
STATES = (ADDED, REMOVED)

#: How long a reader waits for the topic's end at start (a one-partition compacted topic with a
#: record per changed folder: seconds at most on a healthy cluster).
READ_TIMEOUT_S = 30.0


def topic_spec(kafka: KafkaSettings) -> TopicSpec:
    # One partition: small, read whole by every instance, and changes stay in order.
    return TopicSpec(kafka.topics.mailboxes, 1, COMPACTED)


def unit_key(unit: WorkUnit) -> bytes:
    return canonical_json({"source": unit.source, "account": unit.account, "folder": unit.folder})


def decode(key: bytes | None, value: bytes | None) -> tuple[WorkUnit, str | None] | None:
    """``(unit, state)`` of a record (state None: a tombstone), or None for a foreign record."""
    try:
        fields = json.loads(key or b"")
        unit = WorkUnit(str(fields["source"]), str(fields["account"]), str(fields["folder"]))
        state = None if value is None else str(json.loads(value)["state"])
    except (ValueError, KeyError, TypeError):
        log.warning("mailboxes topic: ignoring a record that is not a mailbox change: %r", key)
        return None
    if state is not None and state not in STATES:
        log.warning("mailboxes topic: ignoring %s with unknown state %r", unit, state)
        return None
    return unit, state


def write_change(kafka: KafkaSettings, unit: WorkUnit, state: str | None) -> None:
    """Record ``state`` (added / removed; None forgets the unit: back to the configuration)."""
    if state is not None and state not in STATES:
        raise ValueError(f"state must be one of {STATES}")
    ensure_topic_specs(kafka, [topic_spec(kafka)])
    producer = Producer(producer_config(kafka))
    value = None
    if state is not None:
        value = canonical_json({"state": state, "at": dt.datetime.now(dt.UTC).isoformat()})
    producer.produce(kafka.topics.mailboxes, key=unit_key(unit), value=value)
    if producer.flush(30) != 0:
        raise TimeoutError(f"writing to {kafka.topics.mailboxes} did not complete within 30s")


class MailboxCatalog:
    """The units a source wants: the configuration's, changed by the mailboxes topic.

    ``configured`` maps each configured account to its folders.
    """

    def __init__(self, source: str, configured: Mapping[str, Sequence[str]]) -> None:
        self.source = source
        self._configured: set[WorkUnit] = set()
        self._accounts: set[str] = set()
        self._changes: dict[WorkUnit, str] = {}
        self._lock = threading.Lock()
        self.reconfigure(configured)

    def reconfigure(self, configured: Mapping[str, Sequence[str]]) -> bool:
        """The configuration was reloaded: these accounts and folders from now on, with the
        topic's changes on top (kept for every account: one added later picks its own up).
        True when it changes the wanted units."""
        with self._lock:
            before = self._wanted_locked()
            self._configured = {
                WorkUnit(self.source, account, folder)
                for account, folders in configured.items()
                for folder in folders
            }
            self._accounts = set(configured)
            return self._wanted_locked() != before

    def record(self, unit: WorkUnit, state: str | None) -> bool:
        """Take one record into account; True when it changes the wanted units."""
        if unit.source != self.source:
            return False
        if unit.account not in self._accounts and state == ADDED:
            log.warning(
                "mailboxes topic names %s, but account %s is not in this instance's "
                "configuration (credentials live there): ignored until it is",
                unit,
                unit.account,
            )
        with self._lock:
            before = self._wanted_locked()
            if state is None:
                self._changes.pop(unit, None)
            else:
                self._changes[unit] = state
            return self._wanted_locked() != before

    def wanted(self) -> frozenset[WorkUnit]:
        with self._lock:
            return self._wanted_locked()

    def _wanted_locked(self) -> frozenset[WorkUnit]:
        added = {u for u, s in self._changes.items() if s == ADDED}
        removed = {u for u, s in self._changes.items() if s == REMOVED}
        wanted = (self._configured | added) - removed
        return frozenset(u for u in wanted if u.account in self._accounts)


def read_changes(kafka: KafkaSettings, timeout: float = READ_TIMEOUT_S) -> dict[WorkUnit, str]:
    """The newest state of every unit on the topic (``mailtap mailboxes list``)."""
    found: dict[WorkUnit, str] = {}

    def keep(unit: WorkUnit, state: str | None) -> bool:
        if state is None:
            found.pop(unit, None)
        else:
            found[unit] = state
        return False

    watcher = MailboxWatcher(kafka, keep, on_change=lambda: None)
    try:
        watcher.read_to_end(timeout)
    finally:
        watcher.close()
    return found


class MailboxWatcher:
    """Follows the mailboxes topic: reads it whole at start, then each new record as it comes.

    ``record(unit, state) -> changed`` is the catalog's; ``on_change()`` runs (on the watcher
    thread) after records that changed it, ``on_idle()`` whenever a poll brought nothing.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        record: Callable[[WorkUnit, str | None], bool],
        on_change: Callable[[], None],
        on_idle: Callable[[], None] = lambda: None,
    ) -> None:
        self._kafka = kafka
        self._topic = kafka.topics.mailboxes
        self._record = record
        self._on_change = on_change
        self._on_idle = on_idle
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Assigned, not subscribed: every instance reads every record (no group).
        self._consumer = Consumer(
            consumer_config(
                kafka,
                group_id=kafka.qualify("mailtap-mailboxes-reader"),
                enable_partition_eof=True,
            )
        )

    def read_to_end(self, timeout: float = READ_TIMEOUT_S) -> None:
        """Take in every record written so far (before the first units start)."""
        partitions = topic_partitions(self._consumer, self._kafka, self._topic, timeout)
        if partitions is None:
            raise RuntimeError(f"topic {self._topic} is missing; `mailtap topics ensure` makes it")
        # The end as of now: the read is over once the position reaches it, at the fetch that
        # brought the last record (or at once, on an empty topic). The end-of-partition event
        # alone would come only after one more fetch, which the broker holds for
        # fetch.wait.max.ms (500 ms on this consumer, which then follows the topic) hoping for
        # new records: half a second of every source's start-up (issue 12).
        starts = [TopicPartition(self._topic, p, 0) for p in partitions]
        for msg in read_to_end(self._consumer, starts, timeout):
            self._take(msg.key(), msg.value())

    def _take(self, key: bytes | None, value: bytes | None) -> bool:
        decoded = decode(key, value)
        return decoded is not None and self._record(*decoded)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._follow, name="mailboxes", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._consumer.poll(0.5)
                if msg is None:
                    self._on_idle()
                    continue
                if msg.error() is not None:
                    continue
                if self._take(msg.key(), msg.value()):
                    self._on_change()
            except Exception:  # keep following; a failed start of a unit is logged by it
                log.exception("mailboxes topic: applying a change failed")
        self._consumer.close()

    def request_stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        else:
            self._consumer.close()
