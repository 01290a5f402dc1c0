"""The IMAP source against the secured broker, as its own principal (mTLS, the encrypted key),
with only the ACLs granted here; another team's principal reads what it published.

The ACLs are exactly those `mailtap acls --component imap-source` prints for this config
(`connectors.core.kafka.acls`); the broker's authorizer log (`SecureKafka.authorizer_log`) must
show no denial of the source: the computed set is neither short nor padded by a retry.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from confluent_kafka import Consumer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AdminClient,
    ResourceType,
)

from connectors.core.config import MailtapConfig
from connectors.core.kafka.clients import consumer_config
from mailtap.acls import component_acls
from mailtap.dev import Account, DevServices
from mailtap.dev.secure import SecureKafka
from tests.integration.imap.imap_harness import ImapHarness, wait_for
from tests.integration.secure.conftest import KafkaSettingsFor, allow, bindings, grant

PRINCIPAL = "mailtap-imap-source"
BROKEN = (
    b"From: a@example.org\r\nTo: b@example.org\r\nMessage-ID: <b64-dlq@x>\r\nSubject: broken\r\n"
    b"Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    b"!!!not*base64===\r\nYWJj=ZGVm\r\n"
)


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
        config = harness.config_dict()
        needed = component_acls(MailtapConfig.model_validate(config), "imap-source")
        grant(admin, bindings(PRINCIPAL, needed))
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
        # A broken mail: its dead letter goes to the DLQ in the folder's transaction, so Write
        # on the DLQ is among the source's ACLs (it was not: the folder's transactions failed).
        harness.append([BROKEN])
        wait_for(
            lambda: (len(harness.events()) >= 3 and harness.dlq()) or source.poll() is not None,
            "three events and the dead letter",
        )
        assert source.poll() is None, harness.log()
        assert len(harness.events()) == 3
        (dead,) = harness.dlq()
        assert b"!!!not*base64===" in (dead.raw_value or b"")
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
