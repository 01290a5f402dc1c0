"""connectors.core.kafka.retry: which broker answers are waited out, and how the wait ends.

The errors are built the way confluent-kafka hands them over (``KafkaException(KafkaError)``);
the real broker's NOT_LEADER is provoked in tests/integration/core/test_kafka_leader_moves.py.
"""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core.config import KafkaSettings
from connectors.core.errors import Disposition, classify
from connectors.core.kafka.clients import StopRequested, _stop
from connectors.core.kafka.retry import (
    KafkaRetriesExhausted,
    retry_transient,
    topic_metadata,
    transient,
)


def broker_error(code: int, text: str = "", *, retriable: bool = False) -> KafkaException:
    return KafkaException(KafkaError(code, text, retriable=retriable))


class Answers:
    """A call that raises the given errors in turn, then returns ``result``."""

    def __init__(self, *errors: KafkaException, result: object = (0, 7)) -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    ],
)
def test_a_moving_leader_or_a_loading_coordinator_is_transient_without_the_retriable_flag(
    code: int,
) -> None:
    assert transient(KafkaError(code, "as the broker answered it", retriable=False))


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.INVALID_REPLICATION_FACTOR,
    ],
)
def test_an_answer_that_retrying_cannot_change_is_not_transient(code: int) -> None:
    assert not transient(KafkaError(code))


def test_a_fatal_error_is_not_transient_even_with_a_transient_code() -> None:
    assert not transient(KafkaError(KafkaError.NOT_COORDINATOR, fatal=True))


def test_the_call_is_repeated_until_the_leader_answers(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29: the imap-source exited on exactly this text."""
    call = Answers(
        broker_error(
            KafkaError.NOT_LEADER_FOR_PARTITION,
            "Failed to get watermark offsets: Broker: Not leader for partition",
        ),
        broker_error(KafkaError.LEADER_NOT_AVAILABLE),
    )
    with caplog.at_level(logging.INFO, logger="connectors.core.kafka.retry"):
        assert retry_transient(call, "watermarks of t[0]", timeout=10, first_pause=0.01) == (0, 7)
    assert call.calls == 3
    messages = [r.getMessage() for r in caplog.records]
    assert any("NOT_LEADER_FOR_PARTITION" in m and "watermarks of t[0]" in m for m in messages)
    assert any("succeeded after 2 transient errors" in m for m in messages)


def test_another_error_propagates_at_once() -> None:
    call = Answers(broker_error(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))
    with pytest.raises(KafkaException) as raised:
        retry_transient(call, "watermarks of t[0]", timeout=10, first_pause=0.01)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert call.calls == 1


def test_the_wait_ends_at_the_deadline_with_a_sentence_that_a_runner_retries() -> None:
    call = Answers(*[broker_error(KafkaError.NOT_LEADER_FOR_PARTITION)] * 1000)
    started = time.monotonic()
    with pytest.raises(KafkaRetriesExhausted) as raised:
        retry_transient(call, "watermarks of t[0]", timeout=0.3, first_pause=0.01, max_pause=0.05)
    assert time.monotonic() - started < 2.0
    text = str(raised.value)
    assert "watermarks of t[0]" in text and "NOT_LEADER_FOR_PARTITION" in text
    assert call.calls > 2
    # A component that runs backs off and tries again; it does not stop for good.
    assert classify(raised.value) is Disposition.RETRY


def test_a_stop_request_ends_the_wait() -> None:
    call = Answers(*[broker_error(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)] * 1000)
    _stop.set()
    try:
        with pytest.raises(StopRequested):
            retry_transient(call, "offsets", timeout=30, first_pause=0.01)
    finally:
        _stop.clear()
    assert call.calls == 0


class _Topic:
    def __init__(self, error: KafkaError | None) -> None:
        self.error = error
        self.partitions = {0: object()}


class _Metadata:
    def __init__(self, topics: dict[str, _Topic]) -> None:
        self.topics = topics


class MetadataAnswers:
    """A client whose metadata answers are the given topic-level errors in turn, then the topic
    (what librdkafka returns while a new topic's leader is elected: no exception)."""

    def __init__(self, *errors: KafkaError | None) -> None:
        self.answers = list(errors)
        self.calls = 0

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        self.calls += 1
        error = self.answers.pop(0) if self.answers else None
        return _Metadata({topic: _Topic(error)})

    def poll(self, timeout: float) -> None:
        return None


def test_a_topic_whose_leader_is_being_elected_is_asked_again_not_taken_for_missing() -> None:
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9")
    client = MetadataAnswers(KafkaError(KafkaError.LEADER_NOT_AVAILABLE), None)
    found = topic_metadata(client, kafka, "mailtap.mailboxes", timeout=10)
    assert found is not None and found.error is None and client.calls == 2
    missing = MetadataAnswers(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert topic_metadata(missing, kafka, "mailtap.mailboxes", timeout=10) is None
    assert missing.calls == 1
