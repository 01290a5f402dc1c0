"""The IMAP source against the secured broker, as its own principal (mTLS, the encrypted key),
with only the ACLs granted here; another team's principal reads what it published.

`IMAP_SOURCE_ACLS` is what the source needs *today*, learned from the broker's authorizer log
(`SecureKafka.authorizer_log`): more than least privilege (Create on every topic of the
deployment, because every component ensures all topics; DescribeConfigs for the encoding and
compaction checks). Issue 27 item 3 cuts this down and derives it from one source of truth; this
test then shows the source still runs with exactly that set.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from confluent_kafka import Consumer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from connectors.core.config import TopicNames
from connectors.core.kafka.clients import consumer_config
from mailtap.dev import Account, DevServices
from mailtap.dev.secure import SecureKafka
from tests.integration.imap.imap_harness import ImapHarness, wait_for
from tests.integration.secure.conftest import KafkaSettingsFor, allow, grant

PRINCIPAL = "mailtap-imap-source"


def imap_source_acls(topics: TopicNames) -> list[AclBinding]:
    every_topic = [getattr(topics, name) for name in TopicNames.model_fields]
    acls: list[AclBinding] = []
    for topic in every_topic:
        acls += allow(
            PRINCIPAL,
            ResourceType.TOPIC,
            topic,
            AclOperation.CREATE,
            AclOperation.DESCRIBE,
            AclOperation.DESCRIBE_CONFIGS,
        )
    for topic in (topics.events, topics.offsets, topics.imap_index):
        acls += allow(PRINCIPAL, ResourceType.TOPIC, topic, AclOperation.WRITE)
    for topic in (topics.offsets, topics.imap_index, topics.mailboxes):
        acls += allow(PRINCIPAL, ResourceType.TOPIC, topic, AclOperation.READ)
    for group in ("mailtap-imap-index", "mailtap-mailboxes-reader", "mailtap-offsets-reader"):
        acls += allow(PRINCIPAL, ResourceType.GROUP, group, AclOperation.DESCRIBE)
    prefixed = [
        (ResourceType.TOPIC, f"{topics.retry_prefix}.", AclOperation.CREATE),
        (ResourceType.TOPIC, f"{topics.retry_prefix}.", AclOperation.DESCRIBE),
        (ResourceType.TOPIC, f"{topics.retry_prefix}.", AclOperation.DESCRIBE_CONFIGS),
        (ResourceType.GROUP, "mailtap-encoding-check-", AclOperation.DESCRIBE),
        (ResourceType.TRANSACTIONAL_ID, "mailtap-imap-", AclOperation.WRITE),
        (ResourceType.TRANSACTIONAL_ID, "mailtap-imap-", AclOperation.DESCRIBE),
    ]
    acls += [
        AclBinding(
            resource,
            name,
            ResourcePatternType.PREFIXED,
            f"User:{PRINCIPAL}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for resource, name, operation in prefixed
    ]
    return acls


def _denials(log: Path, principal: str, since: int) -> list[str]:
    with open(log, errors="replace") as lines:
        lines.seek(since)
        return [line for line in lines if f"User:{principal} is Denied" in line]


def test_imap_source_publishes_as_its_own_principal(
    services: DevServices,
    imap_account: Account,
    unique: str,
    tmp_path: Path,
    secure_kafka: SecureKafka,
    kafka_settings: KafkaSettingsFor,
    admin: AdminClient,
) -> None:
    # Topics created by the admin (the PLAINTEXT listener's super user), as `topics ensure`.
    harness = ImapHarness(
        services, imap_account, unique, tmp_path, bootstrap=secure_kafka.admin_bootstrap
    )
    topics = harness.kafka.topics
    try:
        grant(admin, imap_source_acls(topics))
        config = harness.config_dict()
        config["kafka"] = {
            **config["kafka"],
            **secure_kafka.kafka_section("imap-source", "mtls"),
        }
        path = tmp_path / "imap-source.yaml"
        path.write_text(yaml.safe_dump(config))
        authorizer_log = Path(secure_kafka.authorizer_log)
        log_start = authorizer_log.stat().st_size if authorizer_log.exists() else 0
        source = harness.spawn(path)
        ids = harness.append_numbered(2, tag="secure")
        wait_for(lambda: len(harness.events()) >= 2 or source.poll() is not None, "two events")
        assert source.poll() is None, harness.log()
        assert len(harness.events()) == 2
        assert _denials(authorizer_log, PRINCIPAL, log_start) == []

        # Another team: Read on the events topic and its own group, nothing else.
        reader = kafka_settings("other-team", "scram-sha-512")
        group = f"other-team-{unique}"
        grant(
            admin,
            allow("other-team-reader", ResourceType.TOPIC, topics.events, AclOperation.READ)
            + allow("other-team-reader", ResourceType.GROUP, group, AclOperation.READ),
        )
        consumer = Consumer(consumer_config(reader, group))
        consumer.subscribe([topics.events])
        values: list[bytes] = []
        try:
            wait_for(
                lambda: (
                    values.extend(m.value() for m in consumer.consume(10, 0.5) if m.error() is None)
                    or len(values) >= 2
                ),
                "the other team's consumer to read both events",
            )
        finally:
            consumer.close()
        # The Avro strings of the events hold the Message-IDs in UTF-8.
        assert all(any(i.encode() in v for v in values) for i in ids)
    finally:
        harness.stop_all()
