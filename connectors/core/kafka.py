"""librdkafka client configuration and topic management, built from :class:`KafkaSettings`.

Everything that talks to Kafka gets its properties here (:func:`client_config`), so security
settings, logging (:mod:`connectors.core.kafka_log`) and error reporting are applied once.

Waiting for the cluster (:func:`cluster_metadata`, :func:`init_transactions`) happens in short
slices: between two slices the client's queued log lines are delivered, and a stop requested by
the process (:func:`request_stop`, from the CLI's SIGTERM/SIGINT handlers) ends the wait with
:class:`StopRequested` within :data:`WAIT_SLICE_S`, instead of a 30-90 s librdkafka timeout.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, no __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError, MailtapError
from connectors.core.kafka_log import ClientLog

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

_stop = threading.Event()


class StopRequested(MailtapError):
    """The process was asked to stop while it waited for Kafka; nothing was left half-done."""


class KafkaUnavailable(ConfigError):
    """The cluster did not answer within the wait; the message names the setting to check."""


def request_stop() -> None:
    """Make every wait for the cluster in this process give up (signal handlers call this)."""
    _stop.set()


def stop_requested() -> bool:
    return _stop.is_set()


def raise_if_stopping() -> None:
    if _stop.is_set():
        raise StopRequested("stop requested while waiting for Kafka")


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
    :class:`StopRequested` when the process is stopping.
    """
    deadline = time.monotonic() + timeout
    request = WAIT_SLICE_S
    while True:
        raise_if_stopping()
        remaining = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.05, min(request, remaining)))
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() not in _NOT_YET:
                raise
            request = min(request * 2, MAX_METADATA_REQUEST_S)
            if time.monotonic() >= deadline:
                raise KafkaUnavailable(unreachable(kafka, err.str(), timeout)) from None
        finally:
            _serve_logs(client)


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
                _stop.wait(WAIT_SLICE_S / 5)  # an error that came back at once: do not spin
        finally:
            producer.poll(0)


#: How long a transaction may stay open before the broker aborts it. A batch of mails is written
#: well inside a minute; a longer value only delays fencing of a crashed instance's open transaction.
TRANSACTION_TIMEOUT_MS = 60_000

#: Retry tiers for the SMTP sink's retry topics when the sink's settings do not name others.
DEFAULT_RETRY_TIERS = ("5m", "15m", "1h", "4h")


def client_config(kafka: KafkaSettings) -> dict[str, Any]:
    """What every client gets: brokers, security, and librdkafka's logs through Python logging."""
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "security.protocol": kafka.security_protocol,
        # Not librdkafka properties: confluent-kafka takes them from the same dict.
        "logger": CLIENT_LOG,
        "error_cb": CLIENT_LOG.client_error,
        # KIP-714 client metrics push: librdkafka keeps latency histograms per broker for it,
        # about 190 KB a client (measured), for a broker-side telemetry plugin few clusters run;
        # a source holds a transactional producer per mailbox. client_properties can enable it.
        "enable.metrics.push": False,
    }
    if kafka.sasl_mechanism:
        conf["sasl.mechanism"] = kafka.sasl_mechanism
    if kafka.sasl_username:
        conf["sasl.username"] = kafka.sasl_username
    if kafka.sasl_password:
        conf["sasl.password"] = kafka.sasl_password.get_secret_value()
    if kafka.ssl_ca_location:
        conf["ssl.ca.location"] = kafka.ssl_ca_location
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        # Certificate verification is never optional (DESIGN.md, security rules).
        conf["enable.ssl.certificate.verification"] = True
        conf["ssl.endpoint.identification.algorithm"] = "https"
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


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: Mapping[str, str]


COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
DELETED = {"cleanup.policy": "delete"}


def topic_specs(
    kafka: KafkaSettings, retry_tiers: Iterable[str] = DEFAULT_RETRY_TIERS
) -> list[TopicSpec]:
    """The topics of DESIGN.md with their cleanup policies."""
    t = kafka.topics
    n = kafka.partitions
    specs = [
        TopicSpec(t.events, n, COMPACTED),
        TopicSpec(t.commands, n, DELETED),
        TopicSpec(t.dlq, 1, DELETED),
        TopicSpec(t.delivery, n, COMPACTED),
        # One partition: the offsets topic is small and read whole at start-up (Kafka Connect does
        # the same with its offset.storage.topic).
        TopicSpec(t.offsets, 1, COMPACTED),
        TopicSpec(t.workflow, n, COMPACTED),
        TopicSpec(t.suppressions, n, COMPACTED),
        # One partition: small, read whole by every source instance, changes kept in order
        # (connectors.core.mailboxes).
        TopicSpec(t.mailboxes, 1, COMPACTED),
    ]
    specs += [TopicSpec(f"{t.retry_prefix}.{tier}", n, DELETED) for tier in retry_tiers]
    return specs


def ensure_topics(
    kafka: KafkaSettings,
    retry_tiers: Iterable[str] = DEFAULT_RETRY_TIERS,
    timeout: float = 30.0,
) -> dict[str, str]:
    """Create missing topics and align the cleanup policy of existing ones. Idempotent.

    Raises ConfigError when a topic holds records of the other encoding than this configuration
    writes (connectors.core.encoding).

    Returns ``{topic: "created" | "updated" | "ok"}``.
    """
    result = ensure_topic_specs(kafka, topic_specs(kafka, retry_tiers), timeout)
    # Imported here: connectors.core.encoding reads the topics with this module's consumer config.
    from connectors.core.encoding import avro_topics, check_topic_encodings

    # Every component ensures the topics before it writes: the place to refuse a topic that
    # holds the other encoding (one encoding per topic, DESIGN.md).
    # Topics created just now are empty (and may have no partition leader yet): skip them.
    existed = {name for name, state in result.items() if state != "created"}
    check_topic_encodings(
        kafka, [t for t in avro_topics(kafka, retry_tiers) if t in existed], timeout
    )
    return result


def ensure_topic_specs(
    kafka: KafkaSettings, specs: Iterable[TopicSpec], timeout: float = 30.0
) -> dict[str, str]:
    """:func:`ensure_topics` for any list of topics (e.g. the streams worker's changelogs)."""
    admin = admin_client(kafka)
    specs = list(specs)
    existing = cluster_metadata(admin, kafka, timeout).topics
    result: dict[str, str] = {}
    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(s.name, s.partitions, kafka.replication_factor, config=dict(s.config))
                for s in missing
            ],
            operation_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                result[name] = "created"
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
                result[name] = "ok"
    present = [s for s in specs if s.name in existing]
    if present:
        described = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in present]
        )
        wanted = {s.name: s for s in present}
        to_alter = []
        for resource, fut in described.items():
            entries = fut.result()
            spec = wanted[resource.name]
            if all(entries[k].value == v for k, v in spec.config.items() if k in entries):
                result[spec.name] = "ok"
            else:
                to_alter.append(spec)
        if to_alter:
            resources = [
                ConfigResource(
                    ConfigResource.Type.TOPIC,
                    s.name,
                    incremental_configs=[
                        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                        for k, v in s.config.items()
                    ],
                )
                for s in to_alter
            ]
            for fut in admin.incremental_alter_configs(resources).values():
                fut.result()
            result.update({s.name: "updated" for s in to_alter})
    for name, state in sorted(result.items()):
        if state != "ok":
            log.info("topic %s %s", name, state)
    return result
