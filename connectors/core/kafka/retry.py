"""Retrying a Kafka call through the errors a healthy cluster gives for a moment.

A topic created a moment ago has no leader yet (``LEADER_NOT_AVAILABLE``, ``NOT_LEADER_FOR_PARTITION``,
even ``UNKNOWN_TOPIC_OR_PART`` until its metadata has spread to every broker), a leader moves
(``NOT_LEADER_FOR_PARTITION``), a coordinator loads (``COORDINATOR_LOAD_IN_PROGRESS``,
``NOT_COORDINATOR``), and a busy broker lets a single request time out (``_TIMED_OUT``, which
librdkafka does not flag as retriable). None of them says anything about the request itself:
asked again a little later, it succeeds. :func:`retry_retriable` asks again, with a short
backoff, until a deadline, and gives up with a sentence that names what it was doing.

    ends = retry_retriable(lambda: admin_ends(...), deadline, "finding the end of mail.events")
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from connectors.core.kafka.clients import raise_if_stopping
from connectors.core.kafka.errors import KafkaTimeout

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Codes retried although librdkafka may not flag them ``retriable()``: the admin client and
#: ``get_watermark_offsets`` pass the broker's answer on without the flag.
TRANSIENT_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        # A leader that moved, as the cached leader epoch of a client sees it (issue 29; seen on
        # a 2-broker cluster whose leaders move: tests/integration/core/test_kafka_leader_moves.py).
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader before its high watermark is known
        KafkaError._UNKNOWN_PARTITION,  # the client's metadata is older than the partition
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
    }
)

#: First pause after a retriable error; doubled after each one, up to :data:`MAX_BACKOFF_S`.
#: Leadership of a new topic settles in tens of milliseconds on a healthy cluster.
FIRST_BACKOFF_S = 0.05
#: Longest pause: short enough that a stop request or the deadline is seen promptly.
MAX_BACKOFF_S = 0.5


def is_retriable(error: KafkaError) -> bool:
    """True for an error that a later attempt of the same call may not get."""
    if error.fatal():
        return False
    return bool(error.retriable()) or error.code() in TRANSIENT_CODES


def retry_retriable(call: Callable[[], T], deadline: float, what: str) -> T:
    """``call()``, called again after a retriable :class:`KafkaException` until ``deadline``
    (``time.monotonic()``). A non-retriable error is raised at once; a stop request of the
    process ends the wait with ``StopRequested``. After the deadline, raises
    :class:`KafkaTimeout` (a ``TimeoutError``) naming ``what`` and the last error.
    """
    backoff = FIRST_BACKOFF_S
    attempts = 0
    while True:
        raise_if_stopping()
        attempts += 1
        try:
            result = call()
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not is_retriable(error):
                raise
            if time.monotonic() + backoff > deadline:
                raise KafkaTimeout(
                    f"{what}: still failing after {attempts} attempts ({error.str()})"
                ) from exc
            # One line when a call first meets a transient answer (an operator sees leader
            # moves and coordinator loads in the log), one when it healed; the rest at debug.
            level = logging.WARNING if attempts == 1 else logging.DEBUG
            log.log(level, "%s: %s %s; retrying", what, error.name(), error.str())
        else:
            if attempts > 1:
                log.info("%s: succeeded after %d attempts", what, attempts)
            return result
        time.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)
