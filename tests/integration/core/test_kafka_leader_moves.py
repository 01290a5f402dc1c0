"""Start-up reads of a component while the partition leaders of its topics keep moving.

Issue 29: an imap-source exited at start on ``Failed to get watermark offsets: Broker: Not
leader for partition``. Here a two-broker cluster (tests/support/kafka_cluster.py) moves the
leader of every partition of the offsets and mailboxes topics every few hundred milliseconds
while the reads a source makes at start run again and again: each must return everything
written, and the log must show that a read really met NOT_LEADER and waited it out.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.encoding import topic_encodings
from connectors.core.kafka.offsets import OffsetStore, canonical_json
from connectors.core.kafka.topics import ensure_topics
from connectors.core.source.ownership.catalog import ADDED, read_changes, write_change
from connectors.core.source.ownership.group import WorkUnit
from tests.support.kafka_cluster import LeaderMoves, TwoBrokers, compile_flipper, start_two_brokers

#: Reads go on until one met NOT_LEADER, at most this long (a hang guard, not a figure).
READS_TIMEOUT_S = 240.0
CURSORS = 30


@pytest.fixture(scope="module")
def two_brokers() -> Iterator[tuple[TwoBrokers, Path]]:
    root = Path(tempfile.mkdtemp(prefix="mailtap-test-2brokers-"))
    cluster = start_two_brokers(root)
    try:
        yield cluster, compile_flipper(root / "classes")
    finally:
        cluster.stop()


def _not_leader_retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "connectors.core.kafka.retry" and "NOT_LEADER_FOR_PARTITION" in r.getMessage()
    ]


def test_start_up_reads_wait_out_moving_leaders_and_lose_nothing(
    two_brokers: tuple[TwoBrokers, Path], unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, classes = two_brokers
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(
        bootstrap_servers=cluster.bootstrap_servers,
        replication_factor=2,
        topics=TopicNames(**names),
    )
    ensure_topics(kafka)
    producer = Producer(producer_config(kafka))
    cursors = {
        canonical_json({"account": f"a{n}", "folder": "INBOX"}): {"uidvalidity": 7, "last_uid": n}
        for n in range(CURSORS)
    }
    for key, offset in cursors.items():
        producer.produce(kafka.topics.offsets, key=key, value=json.dumps(offset).encode())
    assert producer.flush(30) == 0
    units = {WorkUnit("imap", f"a{n}", "Archive"): ADDED for n in range(5)}
    for unit, state in units.items():
        write_change(kafka, unit, state)

    moves = LeaderMoves(
        classes, cluster.bootstrap_servers, [kafka.topics.offsets, kafka.topics.mailboxes], 200
    )
    rounds = 0
    try:
        moves.wait_for_moves(1)
        deadline = time.monotonic() + READS_TIMEOUT_S
        with caplog.at_level(logging.INFO, logger="connectors.core.kafka.retry"):
            while not _not_leader_retries(caplog) and time.monotonic() < deadline:
                assert OffsetStore(kafka).read_all(settled=True) == cursors
                assert read_changes(kafka) == units
                assert topic_encodings(kafka, [kafka.topics.offsets], 30) == {
                    kafka.topics.offsets: set()
                }
                rounds += 1
    finally:
        moves.stop()
    assert moves.moves >= 2, moves.output
    assert _not_leader_retries(caplog), (
        f"no read met NOT_LEADER in {rounds} rounds while leaders moved {moves.moves} times: "
        "the test did not test the retry"
    )
