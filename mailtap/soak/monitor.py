"""What the soak samples while it runs: per instance RSS and open fds (/proc), health (/healthz),
consumer lag of the streams and sink groups in seconds, and the verifier's counters.

Lag in seconds: for each partition a group has not consumed to its end, the age of the record
at the group's committed offset (what waits longest); 0 when the group is at the end.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from mailtap.soak.fleet import Instance


@dataclass
class Sample:
    at: float
    events: int
    commands: int
    deliveries: int
    lag_s: float | None
    rss: dict[str, int]
    fds: dict[str, int]
    lives: dict[str, int]
    healthy: dict[str, bool] = field(default_factory=dict)
    #: how many mailboxes each source instance runs (its /healthz), when it answered
    owned: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at, 1),
            "events": self.events,
            "commands": self.commands,
            "deliveries": self.deliveries,
            "lag_s": None if self.lag_s is None else round(self.lag_s, 2),
            "rss_mb": {k: round(v / 2**20, 1) for k, v in self.rss.items()},
            "fds": self.fds,
            "lives": self.lives,
            "healthy": self.healthy,
            "owned": self.owned,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Sample:
        """A sample read back from a report (``to_json``; RSS to the 0.1 MB written there)."""
        return cls(
            at=doc["at_s"],
            events=doc["events"],
            commands=doc["commands"],
            deliveries=doc["deliveries"],
            lag_s=doc["lag_s"],
            rss={k: int(v * 2**20) for k, v in doc["rss_mb"].items()},
            fds=doc["fds"],
            lives=doc["lives"],
            healthy=doc.get("healthy", {}),
            owned=doc.get("owned", {}),
        )


class LagProbe:
    """Committed offsets vs end offsets of (group, topic) pairs, as seconds behind."""

    def __init__(self, bootstrap: str, groups: dict[str, str]) -> None:
        self.bootstrap = bootstrap
        self.groups = groups  # group id -> topic
        #: the last `seconds` per group (those behind only)
        self.by_group: dict[str, float] = {}
        self._peek = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "soak-lag-peek",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 0,
            }
        )
        self._group_consumers = {
            group: Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": group,
                    "enable.auto.commit": False,
                    "log_level": 0,
                }
            )
            for group in groups
        }

    def seconds(self, timeout: float = 5.0) -> float | None:
        """The largest lag over the groups; None when Kafka does not answer."""
        worst = 0.0
        self.by_group = {}
        try:
            for group, topic in self.groups.items():
                consumer = self._group_consumers[group]
                meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
                if meta is None or not meta.partitions:
                    continue
                parts = [TopicPartition(topic, p) for p in meta.partitions]
                committed = consumer.committed(parts, timeout=timeout)
                for tp in committed:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, tp.partition), timeout=timeout
                    )
                    position = max(tp.offset, 0)
                    if position >= high:
                        continue
                    age = self._age(topic, tp.partition, position)
                    self.by_group[group] = max(self.by_group.get(group, 0.0), age)
                    worst = max(worst, age)
        except KafkaException:
            return None
        return worst

    def _age(self, topic: str, partition: int, offset: int) -> float:
        self._peek.assign([TopicPartition(topic, partition, offset)])
        msg = self._peek.poll(2.0)
        if msg is None or msg.error() is not None:
            return 0.0  # only transaction markers left: nothing waits
        _, stamp = msg.timestamp()
        return max(0.0, time.time() - stamp / 1000.0)

    def close(self) -> None:
        for consumer in [self._peek, *self._group_consumers.values()]:
            with contextlib.suppress(Exception):
                consumer.close()


def sample_fleet(instances: dict[str, Instance]) -> tuple[dict[str, int], dict[str, int]]:
    rss, fds = {}, {}
    for name, instance in instances.items():
        found = instance.sample()
        if found is not None:
            rss[name], fds[name] = found
    return rss, fds


def health_of(instances: dict[str, Instance]) -> dict[str, bool]:
    return {name: instance.health()[0] for name, instance in instances.items()}


def health_and_owned(instances: dict[str, Instance]) -> tuple[dict[str, bool], dict[str, int]]:
    """One /healthz call per instance: its health, and its work units (the leak rule's spans):
    the mailboxes a source runs, the partitions a streams worker or a sink holds."""
    healthy: dict[str, bool] = {}
    owned: dict[str, int] = {}
    for name, instance in instances.items():
        healthy[name], detail = instance.health()
        units = work_units(detail)
        if units is not None:
            owned[name] = units
    return healthy, owned


def work_units(detail: dict[str, Any] | None) -> int | None:
    """What an instance's memory follows, from its /healthz answer; None when it did not say."""
    if detail is None:
        return None
    if "mailboxes" in detail:
        return len(detail["mailboxes"])
    partitions = detail.get("assigned_partitions")
    return partitions if isinstance(partitions, int) else None
