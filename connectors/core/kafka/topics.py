"""The topics of DESIGN.md with their cleanup policies, created or aligned (idempotent).

``mailtap topics ensure`` (the admin) calls :func:`ensure_topics` for every topic; a component,
before it writes, for its own topics only (``only=``): a component touches only the topics it reads
or writes, so it needs no permission on another's (:mod:`connectors.core.kafka.acls`). A topic that
holds records of the other encoding is refused (:mod:`connectors.core.kafka.encoding`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, no __all__
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from connectors.core.config import KafkaSettings
from connectors.core.kafka.acls import Acl, Operation
from connectors.core.kafka.clients import admin_client, cluster_metadata
from connectors.core.kafka.encoding import avro_topics, check_topic_encodings
from connectors.core.kafka.permissions import denied

log = logging.getLogger(__name__)

#: Retry tiers for the SMTP sink's retry topics when the sink's settings do not name others.
DEFAULT_RETRY_TIERS = ("5m", "15m", "1h", "4h")


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
        # (connectors.core.source.ownership.catalog).
        TopicSpec(t.mailboxes, 1, COMPACTED),
    ]
    specs += [TopicSpec(f"{t.retry_prefix}.{tier}", n, DELETED) for tier in retry_tiers]
    return specs


def ensure_topics(
    kafka: KafkaSettings,
    retry_tiers: Iterable[str] = DEFAULT_RETRY_TIERS,
    timeout: float = 30.0,
    *,
    only: Iterable[str] | None = None,
) -> dict[str, str]:
    """Create missing topics and align the cleanup policy of existing ones. Idempotent.

    ``only``: the names among :func:`topic_specs` to ensure and check (a component's own
    topics); None ensures all of them (``mailtap topics ensure``).

    Raises ConfigError when a topic holds records of the other encoding than this configuration
    writes (connectors.core.kafka.encoding).

    Returns ``{topic: "created" | "updated" | "ok"}``.
    """
    specs = topic_specs(kafka, retry_tiers)
    if only is not None:
        wanted = set(only)
        specs = [s for s in specs if s.name in wanted]
    result = ensure_topic_specs(kafka, specs, timeout)
    # Every component ensures its topics before it writes: the place to refuse a topic that
    # holds the other encoding (one encoding per topic, DESIGN.md). The DLQ and the offsets carry
    # no records of ours (avro_topics). Topics created just now are empty (and may have no
    # partition leader yet): skip them.
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
                    raise _refused(kafka, exc, name, "Create") from None
                result[name] = "ok"
    present = [s for s in specs if s.name in existing]
    if present:
        described = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in present]
        )
        wanted = {s.name: s for s in present}
        to_alter = []
        for resource, fut in described.items():
            try:
                entries = fut.result()
            except KafkaException as exc:
                raise _refused(kafka, exc, resource.name, "DescribeConfigs") from None
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
            for resource, fut in admin.incremental_alter_configs(resources).items():
                try:
                    fut.result()
                except KafkaException as exc:
                    raise _refused(kafka, exc, resource.name, "AlterConfigs") from None
            result.update({s.name: "updated" for s in to_alter})
    for name, state in sorted(result.items()):
        if state != "ok":
            log.info("topic %s %s", name, state)
    return result


def _refused(
    kafka: KafkaSettings, exc: KafkaException, topic: str, operation: Operation
) -> Exception:
    """A refused topic operation as the sentence naming it (connectors.core.kafka.permissions);
    any other error as it was."""
    return denied(kafka, exc, Acl("topic", topic, operation)) or exc
