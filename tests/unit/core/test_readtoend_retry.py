"""Where a read to the end stops, and which Kafka errors are asked again (no broker needed:
the integration tests of each reader run the same code against a real one)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from connectors.core import stopping
from connectors.core.errors import MailtapError
from connectors.core.kafka import clients
from connectors.core.kafka.errors import KafkaTimeout, StopRequested
from connectors.core.kafka.readtoend import still_short, unread
from connectors.core.kafka.retry import is_retriable, retry_retriable


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 0, False),  # an empty partition
        (0, 5, True),
        (4, 5, True),
        (5, 5, False),  # started at the end
        (9, 5, False),  # past it (the consumer resets; nothing to wait for)
        (OFFSET_BEGINNING, 5, True),
        (OFFSET_BEGINNING, 0, False),
        (OFFSET_END, 5, False),  # offsets_for_times: nothing that recent
        (OFFSET_INVALID, 5, True),  # resolved by the consumer: the read has to look
    ],
)
def test_a_partition_is_unread_when_its_start_is_before_its_end(
    start: int, end: int, expected: bool
) -> None:
    assert unread(start, end) is expected


def test_a_partition_is_done_when_its_position_reaches_the_end_as_of_the_call() -> None:
    ends = {("t", 0): 10, ("t", 1): 7, ("u", 0): 3}
    pending = {("t", 0), ("t", 1), ("u", 0)}
    positions = [
        TopicPartition("t", 0, 10),  # at the end (the position skips a final commit marker)
        TopicPartition("t", 1, 6),  # one short
        TopicPartition("u", 0, 12),  # past it: records written after the call were fetched
    ]
    assert still_short(positions, ends, pending) == {("t", 1)}


def test_an_unknown_position_has_not_reached_the_end() -> None:
    assert still_short([TopicPartition("t", 0, OFFSET_INVALID)], {("t", 0): 1}, {("t", 0)}) == {
        ("t", 0)
    }


def _error(code: int) -> KafkaException:
    return KafkaException(KafkaError(code))


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError._NOENT,  # the admin client's ListOffsets before a new topic has leaders
        KafkaError._UNKNOWN_PARTITION,  # a watermark query before the client knows a new topic
    ],
)
def test_what_a_new_topic_or_a_moved_leader_answers_is_asked_again(code: int) -> None:
    answers: Iterator[KafkaException | str] = iter([_error(code), _error(code), "ends"])

    def call() -> str:
        answer = next(answers)
        if isinstance(answer, KafkaException):
            raise answer
        return answer

    assert is_retriable(KafkaError(code))
    assert retry_retriable(call, time.monotonic() + 10, "finding the end of t") == "ends"


def test_an_error_a_retry_cannot_cure_is_raised_at_once() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise _error(KafkaError.TOPIC_AUTHORIZATION_FAILED)

    with pytest.raises(KafkaException):
        retry_retriable(call, time.monotonic() + 10, "finding the end of t")
    assert len(calls) == 1


def test_retries_end_at_the_deadline_with_a_sentence_naming_what_failed() -> None:
    def call() -> None:
        raise _error(KafkaError.NOT_LEADER_FOR_PARTITION)

    with pytest.raises(KafkaTimeout, match=r"finding the end of mail\.events.*Not leader") as err:
        retry_retriable(call, time.monotonic() + 0.5, "finding the end of mail.events")
    assert isinstance(err.value, TimeoutError) and isinstance(err.value, MailtapError)
    assert isinstance(err.value.__cause__, KafkaException)


def test_a_stop_request_ends_the_retries() -> None:
    def call() -> None:
        clients.request_stop()
        raise _error(KafkaError.LEADER_NOT_AVAILABLE)

    try:
        with pytest.raises(StopRequested):
            retry_retriable(call, time.monotonic() + 10, "finding the end of t")
    finally:
        stopping.STOP.clear()
