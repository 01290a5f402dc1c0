"""The sink's topics, and only those: created when missing, aligned, checked for their encoding.

A component touches only the topics it reads or writes (DESIGN.md): the sink reads
``mail.commands``, its retry tiers and (with the suppression list on) ``mail.suppressions``, and
writes ``mail.delivery``, the retry tiers and the DLQ. Another component's topic -- ``mail.events``
holding records of the other encoding, say -- is the admin's to check (``mailtap topics ensure``),
never a reason for the sink, or a benchmark of it on its own topics, not to start. The state topic
is :func:`connectors.smtp.state.ensure_state_topic`'s (its partition count follows the commands').
"""

from __future__ import annotations

from collections.abc import Iterable

from connectors.core.config import KafkaSettings
from connectors.core.kafka.encoding import check_topic_encodings
from connectors.core.kafka.topics import ensure_topic_specs, topic_specs


def sink_topic_names(
    kafka: KafkaSettings, retry_tiers: Iterable[str], *, suppressions: bool
) -> list[str]:
    """Every topic the sink reads or writes, the state topic aside."""
    t = kafka.topics
    names = [t.commands, *(f"{t.retry_prefix}.{tier}" for tier in retry_tiers), t.dlq, t.delivery]
    return [*names, t.suppressions] if suppressions else names


def ensure_sink_topics(
    kafka: KafkaSettings, retry_tiers: Iterable[str], *, suppressions: bool
) -> dict[str, str]:
    """:func:`connectors.core.kafka.topics.ensure_topics` for the sink's topics only.

    Raises ConfigError when one of them holds records of the other encoding than this
    configuration writes. Returns ``{topic: "created" | "updated" | "ok"}``.
    """
    tiers = list(retry_tiers)
    wanted = set(sink_topic_names(kafka, tiers, suppressions=suppressions))
    # The specs (partitions, cleanup policy) are the admin's, so both create the same topics.
    result = ensure_topic_specs(kafka, [s for s in topic_specs(kafka, tiers) if s.name in wanted])
    # The DLQ carries the original bytes of any record: no encoding of its own to check. Topics
    # created just now are empty (and may have no partition leader yet): skipped.
    avro = wanted - {kafka.topics.dlq}
    check_topic_encodings(
        kafka, [t for t, state in result.items() if t in avro and state != "created"]
    )
    return result
