"""librdkafka client configuration, built from :class:`KafkaSettings`.

Everything that talks to Kafka gets its properties here (:func:`client_config`), so security
settings, logging (:mod:`connectors.core.kafka.log`) and error reporting are applied once.

Waiting for the cluster (:func:`cluster_metadata`, :func:`init_transactions`) happens in short
slices: between two slices the client's queued log lines are delivered, and a stop requested by
the process (:func:`request_stop`, from the CLI's SIGTERM/SIGINT handlers) ends the wait with
:class:`StopRequested` within :data:`WAIT_SLICE_S`, instead of a 30-90 s librdkafka timeout.
"""

from __future__ import annotations

import atexit
import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from connectors.core import stopping
from connectors.core.config import KafkaSettings
from connectors.core.kafka.errors import KafkaSecurityRefused, KafkaUnavailable
from connectors.core.kafka.errors import StopRequested as StopRequested
from connectors.core.kafka.log import ClientLog
from connectors.core.kafka.security import librdkafka_security, refusal
from connectors.core.stopping import raise_if_stopping as raise_if_stopping
from connectors.core.stopping import request_stop as request_stop
from connectors.core.stopping import stop_requested as stop_requested

log = logging.getLogger(__name__)

#: The ``logger``/``error_cb`` of every client of the process: one place that counts repeats.
CLIENT_LOG = ClientLog()
atexit.register(CLIENT_LOG.flush)

#: A blocking librdkafka call never waits longer than this before the stop flag is checked again
#: (SIGTERM must end a component within 2 s in any state).
WAIT_SLICE_S = 0.5

#: The longest single metadata request: a request that timed out is sent again with twice the
#: time, up to this. A cluster with thousands of topics needs more than one slice to describe
#: itself (measured: 0.4-1.9 s for 5,343 topics on a loaded test broker), and a slice that never
#: grows would ask again forever; kept at the SIGTERM bound.
MAX_METADATA_REQUEST_S = 2.0

#: librdkafka errors that mean "the cluster did not answer (yet)": keep waiting until the deadline.
_NOT_YET = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN}

# The stop request lives below the Kafka layer (the registry's start-up wait honours it too):
# connectors.core.stopping; its names are re-exported here for the Kafka layer's callers.


def unreachable(kafka: KafkaSettings, reason: object, waited: float | None = None) -> str:
    """The sentence for a cluster that does not answer: what failed and what to check."""
    within = f" within {waited:.0f}s" if waited is not None else ""
    return (
        f"cannot reach Kafka at {kafka.bootstrap_servers}{within} ({reason}); check "
        f"kafka.bootstrap_servers (or MAILTAP_KAFKA_BOOTSTRAP) and that the brokers are up"
    )


def _serve_logs(client: Any) -> None:
    """Deliver the client's queued log lines and errors (confluent-kafka hands them over in poll).

    A consumer is polled only while it has no assignment (the metadata waits here come before
    ``assign``): with one, poll() could return a record that nobody would read.
    """
    if isinstance(client, Consumer):
        if not client.assignment():
            client.poll(0)
        return
    client.poll(0)


def cluster_metadata(
    client: Any, kafka: KafkaSettings, timeout: float, topic: str | None = None
) -> Any:
    """``client.list_topics(topic)``, waiting up to ``timeout`` for the cluster to answer.

    Raises :class:`KafkaUnavailable` (with the sentence of :func:`unreachable`) when it does not,
    :class:`StopRequested` when the process is stopping, and
    :class:`~connectors.core.kafka.security.KafkaSecurityRefused` as soon as librdkafka reports
    that the login or the TLS handshake failed (a wrong password, an untrusted or expired
    certificate): waiting for the timeout would only end in "cannot reach Kafka".
    """
    started = time.monotonic()
    deadline = started + timeout
    request = WAIT_SLICE_S
    while True:
        raise_if_stopping()
        remaining = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.05, min(request, remaining)))
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            sentence = refusal(kafka, err)
            if sentence is not None:
                raise KafkaSecurityRefused(sentence) from None
            if err.code() not in _NOT_YET:
                raise
            request = min(request * 2, MAX_METADATA_REQUEST_S)
            _serve_logs(client)
            _raise_if_refused(kafka, started)
            if time.monotonic() >= deadline:
                raise KafkaUnavailable(unreachable(kafka, err.str(), timeout)) from None
        finally:
            _serve_logs(client)


def _raise_if_refused(kafka: KafkaSettings, since: float) -> None:
    """Raise on the first authentication / TLS failure reported since ``since``.

    The client errors of the whole process are looked at: the client waited on here reports
    them only when polled, and a refusal another client of the same process saw meanwhile has
    the same cause (one process, one set of settings).
    """
    for error in CLIENT_LOG.errors_since(since):
        sentence = refusal(kafka, error)
        if sentence is not None:
            raise KafkaSecurityRefused(sentence)


def init_transactions(producer: Producer, kafka: KafkaSettings, timeout: float) -> None:
    """``producer.init_transactions`` in slices: librdkafka resumes the call after a timeout
    (KIP-360 era API, librdkafka >= 1.6), so a stop request is seen between two slices."""
    deadline = time.monotonic() + timeout
    while True:
        raise_if_stopping()
        remaining = deadline - time.monotonic()
        try:
            producer.init_transactions(max(0.05, min(WAIT_SLICE_S, remaining)))
            return
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            # A resumed call reports what librdkafka retries by itself meanwhile (the coordinator
            # still aborting the previous incarnation's transaction: CONCURRENT_TRANSACTIONS):
            # retriable, so call again; fatal and abortable errors end here.
            if not err.retriable() or err.fatal() or time.monotonic() >= deadline:
                raise
            log.debug("init_transactions: %s; resuming", err.str())
            if err.code() != KafkaError._TIMED_OUT:
                stopping.STOP.wait(WAIT_SLICE_S / 5)  # an error that came back at once: do not spin
        finally:
            producer.poll(0)


#: How long a transaction may stay open before the broker aborts it. A batch of mails is written
#: well inside a minute; a longer value only delays fencing of a crashed instance's open transaction.
TRANSACTION_TIMEOUT_MS = 60_000


def client_config(kafka: KafkaSettings) -> dict[str, Any]:
    """What every client gets: brokers, security, and librdkafka's logs through Python logging."""
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        # Not librdkafka properties: confluent-kafka takes them from the same dict.
        "logger": CLIENT_LOG,
        "error_cb": CLIENT_LOG.client_error,
        # KIP-714 client metrics push: librdkafka keeps latency histograms per broker for it,
        # about 190 KB a client (measured), for a broker-side telemetry plugin few clusters run;
        # a source holds a transactional producer per mailbox. client_properties can enable it.
        "enable.metrics.push": False,
    }
    conf.update(librdkafka_security(kafka))
    conf.update(kafka.client_properties)
    return conf


def producer_config(kafka: KafkaSettings, **extra: Any) -> dict[str, Any]:
    """Idempotent producer; pass ``transactional_id=`` for a transactional one."""
    conf = client_config(kafka)
    conf.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            # lz4: the cheapest codec in CPU on both ends (these hosts have 2 cores), and one
            # every broker decodes without a native library (zstd needs zstd-jni on the broker).
            "compression.type": "lz4",
            "message.max.bytes": 1_000_000,
        }
    )
    txn = extra.pop("transactional_id", None)
    if txn:
        conf["transactional.id"] = txn
        conf["transaction.timeout.ms"] = TRANSACTION_TIMEOUT_MS
        # Connections to every broker from the start (librdkafka's default connects only to
        # those a request needs, when it needs them): init_transactions then finds the
        # transaction coordinator's connection up, instead of waiting for librdkafka's fixed
        # 500 ms retry timer. Measured on the local broker, 10 producers each: 0.003-0.015 s
        # per init_transactions, against 0.07-0.53 s (6 of 8 at 0.5 s) with the default (issue
        # 29; the SMTP sink's lanes paid it once each, one after the other). A transactional
        # producer writes to every partition of its topics, so to every broker leading one:
        # the extra connections are those it would open at its first transactions. A
        # client_properties setting of its own wins.
        conf.setdefault("enable.sparse.connections", False)
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def consumer_config(kafka: KafkaSettings, group_id: str, **extra: Any) -> dict[str, Any]:
    """A read_committed consumer with manual commits (nothing commits behind the runtime's back)."""
    conf = client_config(kafka)
    conf.update(
        {
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def admin_client(kafka: KafkaSettings) -> AdminClient:
    # A metadata request for a missing topic must not create it: librdkafka's admin (producer)
    # handle allows auto-creation by default, and a broker with auto.create.topics.enable (the
    # Kafka default) then makes e.g. mail.events with num.partitions and delete cleanup, which
    # ensure_topics can no longer repartition.
    return AdminClient({**client_config(kafka), "allow.auto.create.topics": False})
