"""Which source instance runs which mailbox: Kafka's own consumer-group protocol divides the work.

After Kafka Connect's distributed mode, without a coordinator of our own:

- Every source instance with the same ``group.id`` (``imap.group.id``, ``ews.group.id``) joins
  one Kafka consumer group, subscribed to a *work topic* (``mailtap.imap-work``, N partitions,
  never written to: its partitions are only the tokens the group divides).
- A work unit is one (account, folder). It belongs to partition
  ``sha256(placement key) % N`` (:func:`partition_of`); an instance runs the units whose
  partitions it is assigned. The placement key is the account for IMAP (the folders of an
  account share its key index and the tombstone clock, ``connectors.imap.syncrounds``, so they
  must run in one process) and the (account, folder) for EWS (folders are independent there).
- The ``cooperative-sticky`` assignor moves only the partitions that must move; the other
  instances keep running. ``on_revoke`` stops and joins the workers of the revoked units before
  it returns, so the next owner is assigned them only once they stopped here (the cooperative
  protocol assigns a revoked partition in the rebalance *after* the revocation).
- A member that dies (kill -9, a lost host) stops heart-beating; after ``session_timeout_seconds``
  the coordinator gives its partitions to the others. A newcomer takes its share on the next
  rebalance.
- Exactly-once across moves does not rest on the group: the per-mailbox transactional id
  (``connectors.core.kafka.transactions``) does. The new owner's ``init_transactions`` fences a previous
  owner that has not noticed yet (a paused process, a lost member) and aborts its open
  transaction, and only then reads the mailbox's cursor.

The consumer is polled from its own thread (librdkafka calls the rebalance callbacks from
``poll``, and a member that does not poll within ``max.poll.interval.ms`` leaves the group).

Who owns what, from Kafka (for ``mailtap status`` and benchmarks): :func:`describe_owners`.

>>> partition_of("support", 32)
29
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from pydantic import Field, field_validator

from connectors.core import namespace as ns
from connectors.core.config import KafkaSettings, NamespacedModel
from connectors.core.kafka.clients import admin_client, cluster_metadata, consumer_config
from connectors.core.kafka.errors import KafkaUnavailable
from connectors.core.kafka.topics import COMPACTED, TopicSpec, ensure_topic_specs

log = logging.getLogger(__name__)

#: Partitions of a work topic mailtap creates: the most instances that can get work, and the
#: grain of balance (units are spread over partitions, partitions over instances). 32 lets up to
#: 32 instances share the mailboxes; a topic's count is never changed by mailtap afterwards
#: (it would move every unit at once), so choose it for the largest deployment you expect.
DEFAULT_WORK_PARTITIONS = 32

#: How often the group thread polls: bounds how late a rebalance's callbacks run here.
POLL_S = 0.5

#: A worker still running this long after its unit was revoked is left behind: the next owner's
#: init_transactions fences it (its commit fails) and aborts its open transaction.
STOP_JOIN_S = 30.0


@dataclass(frozen=True, order=True)
class WorkUnit:
    """One mailbox folder a source publishes: ``imap/support/INBOX``."""

    source: str
    account: str
    folder: str

    def __str__(self) -> str:
        return f"{self.source}/{self.account}/{self.folder}"


#: The key that decides a unit's partition (units with the same key always run together).
Placement = Callable[[WorkUnit], str]


def by_account(unit: WorkUnit) -> str:
    """All folders of an account on one instance (IMAP: shared key index and tombstone rule)."""
    return unit.account


def by_folder(unit: WorkUnit) -> str:
    """Each (account, folder) placed on its own (EWS: folders share nothing)."""
    return f"{unit.account}\x00{unit.folder}"


def partition_of(key: str, partitions: int) -> int:
    """A stable partition for ``key``: the same on every instance, release and Python run (not
    ``hash()``, which is salted per process)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % partitions


def owned_units(
    units: Iterable[WorkUnit], partitions: Iterable[int], count: int, placement: Placement
) -> frozenset[WorkUnit]:
    """The units whose partition (of ``count``) is among ``partitions``."""
    mine = set(partitions)
    return frozenset(u for u in units if partition_of(placement(u), count) in mine)


class GroupSettings(NamespacedModel):
    """``imap.group`` / ``ews.group``: share the mailboxes among every instance with this id."""

    id: str = Field(
        default="",
        description="Kafka consumer group id; instances with the same id divide the mailboxes "
        "among them (without a group, an instance runs every configured mailbox). Unset: "
        "mailtap-<source> (mailtap-imap, mailtap-ews), inside kafka.namespace",
    )
    work_topic: str | None = Field(
        default=None,
        description="topic whose partitions stand for the mailboxes (it holds no records); "
        "mailtap.<source>-work when unset",
    )
    work_partitions: int = Field(
        default=DEFAULT_WORK_PARTITIONS,
        ge=1,
        le=10_000,
        description="partitions of the work topic when mailtap creates it: the most instances "
        "that get work; an existing topic keeps its count",
    )
    #: The broker accepts 6 s to 30 min by default (group.min/max.session.timeout.ms). Smaller
    #: moves a dead instance's mailboxes sooner; larger rides out longer pauses (GC, a slow disk).
    session_timeout_seconds: float = Field(
        default=10.0,
        ge=6.0,
        le=1800.0,
        description="a dead instance's mailboxes move to the others after this",
    )

    @field_validator("id")
    @classmethod
    def _id_not_empty(cls, value: str) -> str:
        # Only a value the file sets is checked: unset, the source section fills in its default.
        if not value:
            raise ValueError("String should have at least 1 character (or leave id unset)")
        return value

    def topic(self, source: str) -> str:
        return self.work_topic or ns.qualify(self.namespace, f"mailtap.{source}-work")


def create_if_missing(kafka: KafkaSettings, spec: TopicSpec) -> None:
    """Create ``spec``'s topic unless it exists. An existing topic is left as it is (no
    DescribeConfigs/AlterConfigs: a source may lack those ACLs where an admin made the topics)."""
    admin = admin_client(kafka)
    if spec.name not in cluster_metadata(admin, kafka, 30).topics:
        ensure_topic_specs(kafka, [spec])


#: How long a start waits for a work topic's partitions to be listed.
PARTITIONS_WAIT_S = 30.0


def work_partition_count(
    client: Any, kafka: KafkaSettings, topic: str, timeout: float = PARTITIONS_WAIT_S
) -> int:
    """The partition count of ``topic``. A topic created a moment ago can be listed with no
    partitions (its metadata has not reached the broker that answered): wait for them, since
    0 would leave every unit without a partition (``partition_of`` divides by it)."""
    deadline = time.monotonic() + timeout
    while True:
        found = cluster_metadata(client, kafka, timeout, topic).topics.get(topic)
        count = len(found.partitions) if found is not None and found.error is None else 0
        if count:
            return count
        if time.monotonic() >= deadline:
            raise KafkaUnavailable(
                f"the work topic {topic} lists no partitions after {timeout:.0f}s; check that "
                f"it exists with partitions (kafka-topics --describe --topic {topic})"
            )
        time.sleep(0.2)


#: The longest heartbeat interval. A member learns of a rebalance (a member died or left) only
#: from a heartbeat's answer, and the coordinator completes it once every live member rejoined:
#: at Kafka's 3 s a failover waited up to 3 s more after the session timeout (the slowest of the
#: survivors), 1 s bounds that to 1 s, for a heartbeat a second per instance.
MAX_HEARTBEAT_MS = 1000


def heartbeat_interval_ms(session_ms: int) -> int:
    """At least three heartbeats per session timeout, as Kafka advises, and one a second at most.

    >>> heartbeat_interval_ms(10_000), heartbeat_interval_ms(2_000)
    (1000, 666)
    """
    return max(100, min(MAX_HEARTBEAT_MS, session_ms // 3))


def member_client_id(source: str) -> str:
    """``mailtap-imap@host:pid``: what :func:`describe_owners` reports for a member."""
    return f"mailtap-{source}@{socket.gethostname()}:{os.getpid()}"


class GroupMembership:
    """This instance's membership in the source group; reports the partitions it holds.

    ``on_change(partitions)`` is called from the group thread with the complete set this
    instance holds after each assignment or revocation, and must have stopped what it no longer
    owns when it returns.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: GroupSettings,
        source: str,
        on_change: Callable[[frozenset[int]], None],
    ) -> None:
        self._kafka = kafka
        self.settings = settings
        self.source = source
        self.topic = settings.topic(source)
        self.client_id = member_client_id(source)
        self._on_change = on_change
        self._held: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        #: Partition count of the work topic (read once; every member reads the same).
        self.partitions = 0

    def start(self) -> None:
        create_if_missing(
            self._kafka, TopicSpec(self.topic, self.settings.work_partitions, COMPACTED)
        )
        session_ms = int(self.settings.session_timeout_seconds * 1000)
        consumer = Consumer(
            consumer_config(
                self._kafka,
                group_id=self.settings.id,
                **{
                    "client.id": self.client_id,
                    "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": session_ms,
                    "heartbeat.interval.ms": heartbeat_interval_ms(session_ms),
                },
            )
        )
        self.partitions = work_partition_count(consumer, self._kafka, self.topic)
        if self.partitions != self.settings.work_partitions:
            log.warning(
                "work topic %s has %d partitions (group.work_partitions says %d); using %d",
                self.topic,
                self.partitions,
                self.settings.work_partitions,
                self.partitions,
            )
        consumer.subscribe(
            [self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
        )
        self._consumer = consumer
        self._thread = threading.Thread(target=self._poll, name=f"{self.source}-group", daemon=True)
        self._thread.start()
        log.info(
            "%s source: joining group %s on %s (%d partitions) as %s",
            self.source,
            self.settings.id,
            self.topic,
            self.partitions,
            self.client_id,
        )

    @property
    def held(self) -> frozenset[int]:
        return frozenset(self._held)

    def _poll(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        try:
            while not self._stop.is_set():
                try:
                    consumer.poll(POLL_S)  # the work topic holds no records: callbacks only
                except KafkaException as exc:
                    log.warning("%s group: %s", self.source, exc.args[0].str())
                except Exception:  # a callback failed: keep the membership alive, log it
                    log.exception("%s group: rebalance handling failed", self.source)
        finally:
            # Leaving the group at once (not after a session timeout) rebalances the others now;
            # close() revokes what this member holds through _revoked first.
            try:
                consumer.close()
            except Exception:  # pragma: no cover - best effort at shutdown
                log.debug("closing the group consumer failed", exc_info=True)

    def _assigned(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._held |= {tp.partition for tp in partitions if tp.topic == self.topic}
        log.info("%s group: assigned %s", self.source, _numbers(partitions))
        self._on_change(self.held)

    def _revoked(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._held -= {tp.partition for tp in partitions}
        log.info("%s group: revoked %s", self.source, _numbers(partitions))
        self._on_change(self.held)

    def _lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        # Lost (this member's session expired): others may run these already; stop ours now.
        log.warning("%s group: lost %s", self.source, _numbers(partitions))
        self._revoked(_consumer, partitions)

    def stop(self, timeout: float = STOP_JOIN_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def _numbers(partitions: list[TopicPartition]) -> list[int]:
    return sorted(tp.partition for tp in partitions)


@dataclass(frozen=True)
class Owner:
    """A group member as the coordinator describes it."""

    member_id: str
    client_id: str
    host: str
    partitions: frozenset[int]


def describe_owners(
    kafka: KafkaSettings,
    group_id: str,
    work_topic: str,
    units: Iterable[WorkUnit],
    placement: Placement,
    timeout: float = 10.0,
) -> dict[WorkUnit, Owner | None]:
    """Which member of ``group_id`` owns each unit right now, from the group coordinator
    (``describe_consumer_groups``) and the unit -> partition mapping. None: no live member holds
    the unit's partition (the group is rebalancing, or empty)."""
    admin = admin_client(kafka)
    metadata = cluster_metadata(admin, kafka, timeout, work_topic)
    topic = metadata.topics.get(work_topic)
    count = len(topic.partitions) if topic is not None and topic.error is None else 0
    description = admin.describe_consumer_groups([group_id])[group_id].result(timeout)
    owners: dict[int, Owner] = {}
    for member in description.members:
        assigned = member.assignment.topic_partitions if member.assignment else []
        held = frozenset(tp.partition for tp in assigned if tp.topic == work_topic)
        owner = Owner(member.member_id, member.client_id, member.host, held)
        owners.update({p: owner for p in held})
    return {u: (owners.get(partition_of(placement(u), count)) if count else None) for u in units}


class Assignment:
    """Runs exactly the units this instance owns: the wanted units (the configuration and the
    mailboxes topic, :mod:`connectors.core.source.ownership.catalog`) whose partitions the group gave it, or
    all of them without a group.

    ``apply(owned)`` (the source's) starts the units newly in ``owned`` and stops (and joins)
    the others before it returns. It is called with a lock held: from the group thread on a
    rebalance, from the mailboxes thread on a change, never at the same time.
    """

    def __init__(
        self,
        wanted: Callable[[], frozenset[WorkUnit]],
        placement: Placement,
        apply: Callable[[frozenset[WorkUnit]], None],
        membership: GroupMembership | None,
    ) -> None:
        self._wanted = wanted
        self._placement = placement
        self._apply = apply
        self.membership = membership
        self._lock = threading.Lock()
        self._partitions: frozenset[int] = frozenset()
        self.owned: frozenset[WorkUnit] = frozenset()
        self._closed = False
        self._failed = False

    def partitions_changed(self, partitions: frozenset[int]) -> None:
        with self._lock:
            self._partitions = partitions
            self._refresh_locked()

    def refresh(self) -> None:
        """The wanted units may have changed: start and stop what differs."""
        with self._lock:
            self._refresh_locked()

    def reconfigure(self, change: Callable[[], None]) -> None:
        """The configuration was reloaded: run ``change()`` (it swaps the wanted units and the
        settings ``apply`` starts units with), then apply even when the owned units stay the
        same, since a unit's settings (a password, a host) may be what changed. Under the lock:
        no rebalance sees half of the change."""
        with self._lock:
            change()
            self._refresh_locked(reapply=True)

    def close(self) -> None:
        """Stop every unit; later rebalances change nothing."""
        with self._lock:
            self._closed = True
            self._set_owned(frozenset())

    def _refresh_locked(self, reapply: bool = False) -> None:
        if self._closed:
            return
        wanted = self._wanted()
        if self.membership is None:
            owned = wanted
        else:
            owned = owned_units(
                wanted, self._partitions, self.membership.partitions, self._placement
            )
        self._set_owned(owned, reapply)

    def retry(self) -> None:
        """Apply again after a failed apply (called about every second by the sharing)."""
        if self._failed:
            with self._lock:
                self._refresh_locked()

    def _set_owned(self, owned: frozenset[WorkUnit], reapply: bool = False) -> None:
        if owned == self.owned and not self._failed and not reapply:
            return
        gained, lost = sorted(owned - self.owned), sorted(self.owned - owned)
        try:
            self._apply(owned)
        except Exception:
            # E.g. the key index of a newly owned account could not be read (Kafka busy): what
            # did start runs; the rest is started by retry(), the rebalance is not held up.
            self._failed = True
            log.exception("starting or stopping mailboxes failed; retrying")
            return
        self._failed = False
        self.owned = owned
        log.info(
            "mailboxes owned: %d (+%s, -%s)",
            len(owned),
            ",".join(map(str, gained)) or "none",
            ",".join(map(str, lost)) or "none",
        )
