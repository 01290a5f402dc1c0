"""One encoding per topic, against the real broker: a component that ensures its topics (every
writer does before it writes) refuses a topic whose records carry the other framing."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.topics import ensure_topics
from mailtap.dev import DevServices
from tests.unit.core.contract_samples import mail_event, reply_command

#: Never contacted: the check reads Kafka only; the URL just selects the Confluent framing.
REGISTRY = "http://127.0.0.1:9/apis/ccompat/v7"


def settings(services: DevServices, unique: str, registry: str | None = None) -> KafkaSettings:
    names = ("events", "commands", "dlq", "delivery", "offsets", "workflow")
    return KafkaSettings.model_validate(
        {
            "bootstrap_servers": services.kafka.bootstrap_servers,
            "schema_registry_url": registry,
            "partitions": 2,
            "topics": {n: f"mail.{n}.{unique}" for n in names}
            | {"retry_prefix": f"mail.retry.{unique}"},
        }
    )


def produce(kafka: KafkaSettings, topic: str, key: str, value: bytes | None, txn: str) -> None:
    """As the sources write: in a transaction (its commit marker takes an offset too)."""
    producer = Producer(producer_config(kafka, transactional_id=txn))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key=key.encode(), value=value)
    producer.commit_transaction(30)


def test_a_registry_writer_refuses_a_topic_of_single_object_records(
    services: DevServices, unique: str
) -> None:
    plain = settings(services, unique)
    ensure_topics(plain)
    event = AvroSerde.for_schema("MailEvent").encode(mail_event(), plain.topics.events)
    produce(plain, plain.topics.events, "demo/mid:a", event, f"enc-{unique}")

    ensure_topics(plain)  # the same encoding: nothing to refuse

    with pytest.raises(ConfigError) as refused:
        ensure_topics(settings(services, unique, REGISTRY))
    message = str(refused.value)
    assert plain.topics.events in message and "single-object" in message
    assert "unset kafka.schema_registry_url" in message and "new topics" in message


def test_a_registry_less_writer_refuses_a_topic_of_confluent_records(
    services: DevServices, unique: str
) -> None:
    framed = settings(services, unique, "mock://encoding-test")
    ensure_topics(framed)
    command = AvroSerde.for_schema("ReplyCommand", framed).encode(
        reply_command(), framed.topics.commands
    )
    assert command[:1] == b"\x00"
    produce(framed, framed.topics.commands, "c" * 64, command, f"enc-{unique}")

    with pytest.raises(ConfigError, match=r"set kafka\.schema_registry_url to the registry"):
        ensure_topics(settings(services, unique))


def test_tombstones_and_empty_topics_are_no_encoding(services: DevServices, unique: str) -> None:
    plain = settings(services, unique)
    ensure_topics(plain)
    produce(plain, plain.topics.events, "demo/mid:gone", None, f"enc-{unique}")

    ensure_topics(settings(services, unique, REGISTRY))  # nothing framed yet: either may start
