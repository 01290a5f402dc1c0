"""Every transactional call of the sink's recorder is bounded: confluent-kafka waits forever
without a timeout, and `mailtap soak` (seed 25) caught a sink waiting in
send_offsets_to_transaction for minutes after its Kafka connections were reset, /healthz
still ok. A bounded call raises; the transaction is aborted and the error goes up."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import TopicNames
from connectors.core.kafka.watchdog import SEND_OFFSETS_TIMEOUT_S
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.recorder import TXN_CALL_TIMEOUT_S, DeliveryRecorder


class BoundedOnlyProducer:
    """Like a producer whose coordinator never answers: a call without a finite timeout would
    block forever (here: fails the test), one with a timeout times out."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def _bounded(self, name: str, timeout: Any) -> None:
        self.calls.append((name, timeout))
        if timeout is None or timeout < 0:
            raise AssertionError(f"{name} without a timeout would wait forever")

    def begin_transaction(self) -> None:
        self.calls.append(("begin_transaction", None))

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: Any = -1) -> None:
        self._bounded("send_offsets_to_transaction", timeout)
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, "timed out", txn_requires_abort=True)
        )

    def commit_transaction(self, timeout: Any = -1) -> None:
        self._bounded("commit_transaction", timeout)

    def abort_transaction(self, timeout: Any = -1) -> None:
        self._bounded("abort_transaction", timeout)


class Group:
    def consumer_group_metadata(self) -> object:
        return object()


def test_a_commit_whose_coordinator_never_answers_ends_in_an_error() -> None:
    producer = BoundedOnlyProducer()
    recorder = DeliveryRecorder(
        producer,  # type: ignore[arg-type]
        SmtpSinkSettings(host="relay.example", from_address="mailtap@example.com"),
        TopicNames(),
        AvroSerde.for_schema("DeliveryEvent"),
    )
    recorder.stage(lambda: None)
    with pytest.raises(KafkaException):
        recorder.commit({("mail.commands", 0): 5}, Group())  # type: ignore[arg-type]
    assert [name for name, _ in producer.calls] == [
        "begin_transaction",
        "send_offsets_to_transaction",
        "abort_transaction",
    ]
    timeouts = dict(producer.calls)
    assert timeouts["send_offsets_to_transaction"] == SEND_OFFSETS_TIMEOUT_S
    assert timeouts["abort_transaction"] == TXN_CALL_TIMEOUT_S
