"""A group member's start waits for the partitions of a work topic created a moment ago (found by
``mailtap bench scale``: listed with 0 partitions, every rebalance then divided by zero and the
source ran no mailbox)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from connectors.core.config import KafkaSettings
from connectors.core.kafka.errors import KafkaUnavailable
from connectors.core.metrics import SourceMetrics
from connectors.core.source.ownership import group as assignment
from connectors.core.source.ownership.group import GroupMembership, GroupSettings

TOPIC = "mailtap.imap-work"


class FakeConsumer:
    def __init__(self, _config: dict[str, Any]) -> None:
        self.subscribed: list[str] = []

    def subscribe(self, topics: list[str], **_callbacks: Any) -> None:
        self.subscribed = topics

    def poll(self, _timeout: float) -> None:
        return None

    def close(self) -> None:
        return None


def _listings(counts: list[int]) -> Any:
    answers = iter(counts)

    def metadata(_client: Any, _kafka: Any, _timeout: float, topic: str) -> Any:
        count = next(answers, counts[-1])
        found = SimpleNamespace(error=None, partitions={p: None for p in range(count)})
        return SimpleNamespace(topics={topic: found})

    return metadata


def _membership(monkeypatch: pytest.MonkeyPatch, counts: list[int]) -> GroupMembership:
    monkeypatch.setattr(assignment, "Consumer", FakeConsumer)
    monkeypatch.setattr(assignment, "create_if_missing", lambda _k, _s: None)
    monkeypatch.setattr(assignment, "cluster_metadata", _listings(counts))
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9")
    return GroupMembership(kafka, GroupSettings(id="g"), "imap", lambda _p: None)


def test_start_waits_until_the_new_work_topic_lists_its_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    membership = _membership(monkeypatch, [0, 0, 32])
    membership.start()
    try:
        assert membership.partitions == 32
    finally:
        membership.stop()


def test_a_work_topic_without_partitions_fails_the_start_with_a_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(assignment, "PARTITIONS_WAIT_S", 0.3)
    membership = _membership(monkeypatch, [0])
    with pytest.raises(KafkaUnavailable, match="lists no partitions"):
        assignment.work_partition_count(None, membership._kafka, TOPIC, timeout=0.3)


def test_health_names_each_owned_mailboxs_state() -> None:
    metrics = SourceMetrics()
    metrics.watch("imap", "a", "INBOX")
    metrics.set_state("imap", "a", "INBOX", "IDLE")
    metrics.watch("imap", "b", "INBOX")
    metrics.set_state("imap", "b", "INBOX", "BACKOFF")
    _, detail = metrics.health(600)
    assert detail["states"] == {"imap/a/INBOX": "IDLE", "imap/b/INBOX": "BACKOFF"}
