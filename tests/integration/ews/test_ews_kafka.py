"""The read_committed reader the Exchange tests check Kafka with, against the real broker.

A source's commit is answered before the broker writes the transaction's markers; until they are
written, the partition's last stable offset (LSO) stays before that commit and a read_committed
reader ends there. A test that stops the source and reads at once could miss the last batch
(a flaky "published but not read back" of the newest mail). Here a transaction held open keeps
the LSO before a committed record, deterministically: the reader must wait, not end early.
"""

from __future__ import annotations

import threading
import uuid

from confluent_kafka import Producer

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import producer_config
from tests.integration.ews.ews_kafka import read_topic


def test_a_read_committed_read_waits_for_open_transactions_instead_of_ending_at_the_lso(
    kafka: KafkaSettings,
) -> None:
    topic = kafka.topics.dlq  # one partition: the held transaction is in front of the commit
    held = Producer(producer_config(kafka, transactional_id=f"held-{uuid.uuid4().hex[:8]}"))
    held.init_transactions(30)
    held.begin_transaction()
    held.produce(topic, key=b"held", value=b"1")
    held.flush(30)
    committed = Producer(producer_config(kafka, transactional_id=f"done-{uuid.uuid4().hex[:8]}"))
    committed.init_transactions(30)
    committed.begin_transaction()
    committed.produce(topic, key=b"committed", value=b"2")
    committed.commit_transaction(30)
    # Committed, but behind the LSO while the other transaction is open: what a reader sees
    # between a source's commit and the broker writing its markers.
    assert read_topic(kafka, topic, settled=False) == []

    finisher = threading.Timer(1.0, held.commit_transaction, args=(30,))
    finisher.start()
    try:
        keys = sorted(key for key, _ in read_topic(kafka, topic))
    finally:
        finisher.join()
    assert keys == [b"committed", b"held"]
