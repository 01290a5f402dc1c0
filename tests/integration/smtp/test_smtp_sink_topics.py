"""The sink ensures and checks its own topics only (DESIGN.md: a component touches only the
topics it reads or writes): another component's topic in the other encoding -- ``mail.events``
after ``make demo``, registry-framed, under a registry-less sink or ``mailtap bench sink`` -- does
not stop it, while one of its own topics in the other encoding still does."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from smtp_harness import sink_config

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, MailtapConfig, config_from_dict
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.topics import ensure_topics
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.sink import SmtpSink
from connectors.smtp.topics import sink_topic_names
from mailtap.dev import DevServices
from tests.unit.core.contract_samples import mail_event, reply_command


def framed(kafka: KafkaSettings, schema: str, topic: str, value: dict[str, object]) -> bytes:
    """The Confluent wire format a registry writer puts there (an in-memory registry here)."""
    registry = kafka.model_copy(update={"schema_registry_url": "mock://sink-topics"})
    encoded = AvroSerde.for_schema(schema, registry).encode(value, topic)
    assert encoded[:1] == b"\x00"
    return encoded


def produce(kafka: KafkaSettings, topic: str, value: bytes) -> None:
    producer = Producer(producer_config(kafka))
    producer.produce(topic, key=b"k", value=value)
    assert producer.flush(30) == 0


def topics(kafka: KafkaSettings) -> set[str]:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    return set(admin.list_topics(timeout=30).topics)


#: Topics of the other components, named per test.
OTHERS = ("events", "workflow", "offsets", "mailboxes")


def config(services: DevServices, unique: str) -> MailtapConfig:
    """A registry-less sink config (as the bench's); no relay is contacted by a start."""
    _cfg, _settings, raw = sink_config(services.bootstrap_servers, unique, 1)
    raw["kafka"]["topics"] |= {name: f"mail.{name}.{unique}" for name in OTHERS}
    return config_from_dict(raw)


def start_and_close(cfg: MailtapConfig) -> SmtpSink:
    sink = SmtpSink(cfg, cfg.section("smtp", SmtpSinkSettings))
    try:
        sink.start()
    finally:
        asyncio.run(sink.close())
    return sink


def test_a_registry_framed_events_topic_does_not_stop_a_registry_less_sink(
    services: DevServices, unique: str
) -> None:
    cfg = config(services, unique)
    kafka = cfg.kafka
    # What `make demo` leaves: mail.events in the Confluent wire format.
    ensure_topics(kafka)
    events = kafka.topics.events
    produce(kafka, events, framed(kafka, "MailEvent", events, mail_event()))
    with pytest.raises(ConfigError, match=events):
        ensure_topics(kafka)  # the admin's check of every topic refuses it, rightly

    start_and_close(cfg)  # the sink does not read or write it: it starts


def test_the_sink_creates_its_own_topics_and_no_other(services: DevServices, unique: str) -> None:
    cfg = config(services, unique)
    settings = cfg.section("smtp", SmtpSinkSettings)
    start_and_close(cfg)
    present = topics(cfg.kafka)
    own = sink_topic_names(cfg.kafka, settings.retry_tiers, suppressions=True)
    assert set(own) | {settings.state_topic} <= present
    t = cfg.kafka.topics
    assert {t.events, t.workflow, t.offsets, t.mailboxes}.isdisjoint(present)


def test_a_sink_topic_in_the_other_encoding_still_stops_the_sink(
    services: DevServices, unique: str
) -> None:
    cfg = config(services, unique)
    start_and_close(cfg)
    commands = cfg.kafka.topics.commands
    produce(cfg.kafka, commands, framed(cfg.kafka, "ReplyCommand", commands, reply_command()))
    with pytest.raises(ConfigError, match=rf"{commands} holds records in Confluent wire format"):
        start_and_close(cfg)
