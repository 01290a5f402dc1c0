"""The sink's topics, and only those: created when missing, aligned, checked for their encoding.

A component touches only the topics it reads or writes (DESIGN.md): the sink reads
``mail.commands``, its retry tiers and (with the suppression list on) ``mail.suppressions``, and
writes ``mail.delivery``, the retry tiers and the DLQ. Another component's topic -- ``mail.events``
holding records of the other encoding, say -- is the admin's to check (``mailtap topics ensure``),
never a reason for the sink not to start, nor for it to need Read there
(:mod:`connectors.core.kafka.acls`). The state topic is
:func:`connectors.smtp.state.ensure_state_topic`'s (its partition count follows the commands').
"""

from __future__ import annotations

from collections.abc import Iterable

from connectors.core.config import KafkaSettings
from connectors.core.kafka.topics import ensure_topics


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
    return ensure_topics(
        kafka, tiers, only=sink_topic_names(kafka, tiers, suppressions=suppressions)
    )
