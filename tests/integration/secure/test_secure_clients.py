"""Every mechanism of the secured broker, with both client libraries mailtap uses: librdkafka
(sources, sink, CLI: `connectors.core.kafka`) and aiokafka (streams: `streams.kafka_security`).

Each case grants the component's principal exactly Write/Read on a new topic and Read on its
groups, then produces with one library and consumes with the other: a record that arrives proves
the login *and* that the broker saw the principal the ACLs name (the certificate's CN, the JWT's
``sub``, the SCRAM/PLAIN user are all ``mailtap-<component>``).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AclOperation, AdminClient, ResourceType

from connectors.core.kafka.clients import consumer_config, producer_config
from mailtap.dev.secure import SecureKafka
from streams.kafka_security import aiokafka_security
from tests.integration.secure.conftest import KafkaSettingsFor, allow, create_topic, grant

#: (mechanism, component): every mechanism, and mTLS with the encrypted key (imap-source) too.
CASES = [
    ("scram-sha-512", "smtp-sink"),
    ("scram-sha-256", "ews-source"),
    ("plain", "other-team"),
    ("mtls", "imap-source"),
    ("mtls", "smtp-sink"),
    ("oauthbearer", "streams"),
]
RECORD_WAIT_S = 30.0


def _librdkafka_produce(conf: dict[str, object], topic: str, value: bytes) -> None:
    outcome: list[KafkaError | None] = []
    producer = Producer(conf)
    producer.produce(topic, key=b"k", value=value, on_delivery=lambda e, _m: outcome.append(e))
    assert producer.flush(RECORD_WAIT_S) == 0
    assert len(outcome) == 1 and outcome[0] is None, outcome[0] and outcome[0].str()


def _librdkafka_read(conf: dict[str, object], topic: str, count: int) -> list[bytes]:
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + RECORD_WAIT_S
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        consumer.close()
    return values


async def _aiokafka_read(kwargs: dict[str, object], topic: str, count: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **kwargs)  # type: ignore[arg-type]
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(RECORD_WAIT_S):
            while len(values) < count:
                batches = await consumer.getmany(timeout_ms=500)
                values += [r.value for records in batches.values() for r in records]
    finally:
        await consumer.stop()
    return values


@pytest.mark.parametrize(("mechanism", "component"), CASES)
async def test_both_client_libraries_connect_as_the_component(
    secure_kafka: SecureKafka,
    kafka_settings: KafkaSettingsFor,
    admin: AdminClient,
    unique: str,
    mechanism: str,
    component: str,
) -> None:
    kafka = kafka_settings(component, mechanism)
    principal = secure_kafka.principals[component].name
    topic, group = f"secure.{mechanism}.{unique}", f"secure-{unique}"
    create_topic(admin, topic)
    grant(
        admin,
        allow(principal, ResourceType.TOPIC, topic, AclOperation.WRITE, AclOperation.READ)
        + allow(principal, ResourceType.GROUP, f"{group}-a", AclOperation.READ)
        + allow(principal, ResourceType.GROUP, f"{group}-r", AclOperation.READ),
    )
    aiokafka = {"bootstrap_servers": kafka.bootstrap_servers, **aiokafka_security(kafka)}

    _librdkafka_produce(producer_config(kafka), topic, b"from librdkafka")
    producer = AIOKafkaProducer(**aiokafka)  # type: ignore[arg-type]
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"from aiokafka", key=b"k")
    finally:
        await producer.stop()

    expected = [b"from librdkafka", b"from aiokafka"]
    assert await _aiokafka_read({**aiokafka, "group_id": f"{group}-a"}, topic, 2) == expected
    read = await asyncio.to_thread(_librdkafka_read, consumer_config(kafka, f"{group}-r"), topic, 2)
    assert read == expected


def test_without_an_acl_the_principal_may_not_write(
    kafka_settings: KafkaSettingsFor, admin: AdminClient, unique: str
) -> None:
    """The authorizer is on and grants nothing by default (allow.everyone.if.no.acl.found=false)."""
    kafka = kafka_settings("smtp-sink", "scram-sha-512")
    topic = f"secure.denied.{unique}"
    create_topic(admin, topic)
    outcome: list[KafkaError | None] = []
    producer = Producer({**producer_config(kafka), "message.timeout.ms": 10_000})
    producer.produce(topic, value=b"x", on_delivery=lambda e, _m: outcome.append(e))
    producer.flush(RECORD_WAIT_S)
    assert len(outcome) == 1 and outcome[0] is not None
    assert outcome[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, outcome[0].str()
