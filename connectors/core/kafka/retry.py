"""Broker answers that heal by themselves, and the one loop that waits them out.

A partition whose leader moves (a broker restart, a leader election, a reassignment, a topic
created a moment ago whose leader the broker has not taken up yet) answers NOT_LEADER_OR_FOLLOWER
(``Not leader for partition``) or LEADER_NOT_AVAILABLE until the client has the new metadata; a
group or transaction coordinator that is loading its log answers COORDINATOR_LOAD_IN_PROGRESS or
NOT_COORDINATOR. librdkafka refreshes its metadata on such an answer, but a blocking call
(``get_watermark_offsets``, ``list_offsets``, ``list_topics``) hands it to the caller at once,
often without the retriable flag (the flag is set by librdkafka's own request retries, not by the
broker's error code). Read at start as fatal, one of these ended an IMAP source in CI
(``Failed to get watermark offsets: Broker: Not leader for partition``, issue 29).

Every read of watermarks, offsets or metadata goes through :func:`retry_transient`, and every
read loop skips a consumed error for which :func:`transient` is true::

    low, high = retry_transient(
        lambda: consumer.get_watermark_offsets(tp, timeout=10, cached=False),
        f"watermarks of {tp.topic}[{tp.partition}]",
        timeout=30,
    )
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from connectors.core.config import KafkaSettings
from connectors.core.errors import MailtapError
from connectors.core.kafka.clients import cluster_metadata, raise_if_stopping

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Broker and client error codes that say "not now", never "not so": the answer changes once
#: leadership or a coordinator has settled, or once the broker answers again.
TRANSIENT_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER since Kafka 2.6
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader before its high watermark is known
        KafkaError.UNKNOWN_TOPIC_OR_PART,  # a topic created a moment ago, not on every broker yet
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError._UNKNOWN_PARTITION,  # the client's metadata is older than the partition
        KafkaError._TIMED_OUT,  # a single request on a busy broker; not flagged retriable
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
    }
)

#: The first pause after a transient answer, doubled per attempt up to MAX_PAUSE_S (with jitter,
#: so that the components starting together do not ask again in step). A leader election ends in
#: ~0.1-0.5 s; a coordinator loads its log in seconds on a busy broker.
FIRST_PAUSE_S = 0.1
MAX_PAUSE_S = 2.0
#: The timeout of one request inside a retried call: a request that went to a broker that does
#: not answer is given up in time for a few more attempts within the caller's deadline.
REQUEST_S = 5.0


class KafkaRetriesExhausted(MailtapError, TimeoutError):
    """A broker kept answering a transient error for longer than the caller's deadline.

    A TimeoutError: connectors.core.errors.classify reads it as RETRY, so a component that runs
    backs off and tries again; one that is starting stops with this sentence.
    """


def transient(error: KafkaError) -> bool:
    """True for an error that the same call, repeated a little later, gets past."""
    if error.fatal():
        return False
    return bool(error.retriable()) or error.code() in TRANSIENT_CODES


def error_of(exc: BaseException) -> KafkaError | None:
    """The KafkaError a confluent-kafka exception carries (``KafkaException(KafkaError)``)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def retry_transient(
    call: Callable[[], T],
    what: str,
    timeout: float,
    *,
    first_pause: float = FIRST_PAUSE_S,
    max_pause: float = MAX_PAUSE_S,
) -> T:
    """Return ``call()``, calling it again after a pause while it raises a transient KafkaError.

    Any other error propagates at once. After ``timeout`` seconds of transient errors raises
    :class:`KafkaRetriesExhausted` naming ``what``, the last error and the time waited. A stop
    requested by the process (connectors.core.kafka.clients.request_stop) ends the wait with
    ``StopRequested``. One log line when the first transient error is met, one when it healed.
    """
    started = time.monotonic()
    deadline = started + timeout
    pause = first_pause
    attempts = 0
    while True:
        raise_if_stopping()
        try:
            result = call()
        except KafkaException as exc:
            error = error_of(exc)
            if error is None or not transient(error):
                raise
            attempts += 1
            if attempts == 1:
                log.warning(
                    "kafka: %s answered %s (%s); retrying for up to %.0fs",
                    what,
                    error.name(),
                    error.str(),
                    timeout,
                    extra={"kafka_error": error.name(), "operation": what},
                )
            now = time.monotonic()
            if now >= deadline:
                raise KafkaRetriesExhausted(
                    f"{what}: the broker kept answering {error.name()} ({error.str()}) for "
                    f"{now - started:.0f}s ({attempts} attempts); a partition without a leader "
                    f"or a coordinator that does not load: check the brokers' logs"
                ) from exc
            time.sleep(min(pause * random.uniform(0.5, 1.0), max(0.0, deadline - now)))
            pause = min(pause * 2, max_pause)
            continue
        if attempts:
            log.info(
                "kafka: %s succeeded after %d transient errors in %.1fs",
                what,
                attempts,
                time.monotonic() - started,
                extra={"operation": what},
            )
        return result


def topic_metadata(client: Any, kafka: KafkaSettings, topic: str, timeout: float) -> Any | None:
    """The metadata of ``topic`` (``confluent_kafka.admin.TopicMetadata``), None when the
    cluster does not have it.

    A topic whose leader is being elected comes back with a topic-level error
    (LEADER_NOT_AVAILABLE) instead of raising: that one is asked again, like any transient
    error, where a reader that took it for a missing topic would skip it or stop.
    """

    def ask() -> Any | None:
        found = cluster_metadata(client, kafka, timeout, topic).topics.get(topic)
        if found is None or found.error is None:
            return found
        if found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None  # missing: the caller's sentence says what creates it
        raise KafkaException(found.error)

    return retry_transient(ask, f"metadata of {topic}", timeout)
