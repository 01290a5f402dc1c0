"""librdkafka client configuration and topic management, built from :class:`KafkaSettings`.

Everything that talks to Kafka gets its properties here, so security settings are applied once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, no __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError

log = logging.getLogger(__name__)

#: How long a transaction may stay open before the broker aborts it. A batch of mails is written
#: well inside a minute; a longer value only delays fencing of a crashed instance's open transaction.
TRANSACTION_TIMEOUT_MS = 60_000

#: Retry tiers for the SMTP sink's retry topics when the sink's settings do not name others.
DEFAULT_RETRY_TIERS = ("5m", "15m", "1h", "4h")


def _common(kafka: KafkaSettings) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "security.protocol": kafka.security_protocol,
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
    conf = _common(kafka)
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
    conf = _common(kafka)
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
    return AdminClient(_common(kafka))


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
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise ConfigError(
            f"cannot reach Kafka at {kafka.bootstrap_servers}: {exc}; check kafka.bootstrap_servers"
        ) from exc
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
