"""connectors.core.kafka.retry: which broker answers are waited out, and what the log says.

The errors are built the way confluent-kafka hands them over (``KafkaException(KafkaError)``);
the real broker's NOT_LEADER is provoked in tests/integration/core/test_kafka_leader_moves.py.
"""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core.errors import Disposition, classify
from connectors.core.kafka.errors import KafkaTimeout, StopRequested
from connectors.core.kafka.retry import is_retriable, retry_retriable
from connectors.core.stopping import STOP as _stop

#: The text of the error an imap-source exited on in CI (issue 29).
NOT_LEADER_TEXT = "Failed to get watermark offsets: Broker: Not leader for partition"


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


def broker_error(code: int, text: str = "") -> KafkaException:
    return KafkaException(KafkaError(code, text, retriable=False))


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._TIMED_OUT,
    ],
)
def test_a_moving_leader_or_a_loading_coordinator_is_retriable_without_the_flag(
    code: int,
) -> None:
    assert is_retriable(KafkaError(code, "as the broker answered it", retriable=False))


@pytest.mark.parametrize(
    "code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_REPLICATION_FACTOR]
)
def test_an_answer_that_retrying_cannot_change_is_not_retriable(code: int) -> None:
    assert not is_retriable(KafkaError(code))


def test_the_call_is_repeated_until_the_leader_answers_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = Answers(
        broker_error(KafkaError.NOT_LEADER_FOR_PARTITION, NOT_LEADER_TEXT),
        broker_error(KafkaError.FENCED_LEADER_EPOCH),
        broker_error(KafkaError.LEADER_NOT_AVAILABLE),
    )
    with caplog.at_level(logging.INFO, logger="connectors.core.kafka.retry"):
        got = retry_retriable(call, time.monotonic() + 10, "watermarks of t[0]")
    assert got == (0, 7) and call.calls == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"watermarks of t[0]: NOT_LEADER_FOR_PARTITION {NOT_LEADER_TEXT}; retrying"]
    assert any("succeeded after 4 attempts" in r.getMessage() for r in caplog.records)


def test_another_error_propagates_at_once() -> None:
    call = Answers(broker_error(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))
    with pytest.raises(KafkaException):
        retry_retriable(call, time.monotonic() + 10, "watermarks of t[0]")
    assert call.calls == 1


def test_the_wait_ends_at_the_deadline_with_a_sentence_that_a_runner_retries() -> None:
    call = Answers(*[broker_error(KafkaError.NOT_LEADER_FOR_PARTITION, NOT_LEADER_TEXT)] * 1000)
    with pytest.raises(KafkaTimeout) as raised:
        retry_retriable(call, time.monotonic() + 0.3, "watermarks of t[0]")
    assert "watermarks of t[0]" in str(raised.value) and "Not leader" in str(raised.value)
    assert call.calls > 2
    # A component that runs backs off and tries again; it does not stop for good.
    assert classify(raised.value) is Disposition.RETRY


def test_a_stop_request_ends_the_wait() -> None:
    call = Answers(*[broker_error(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)] * 1000)
    _stop.set()
    try:
        with pytest.raises(StopRequested):
            retry_retriable(call, time.monotonic() + 30, "offsets")
    finally:
        _stop.clear()
    assert call.calls == 0
