"""Two deployments on one secured cluster (issue 27 item 5): the same account name, the same
folder, at the same time, each with ``kafka.namespace`` and its own principal that holds only
PREFIXED ACLs on ``<namespace>.``. Neither fences the other (their transactional ids differ),
each topic holds only its own deployment's mail, and one deployment's principal may not read
the other's topic.

The ACLs are written here from the namespace (topic, group and transactional-id prefixes);
``mailtap acls`` (item 3) prints the per-component set once it is on main.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.readtoend import read_to_end, topic_partitions
from connectors.core.kafka.topics import COMPACTED, TopicSpec, ensure_topic_specs, ensure_topics
from mailtap.dev import Account, DevServices
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.secure import SecureKafka
from tests.integration.imap.imap_harness import make_mail, wait_for
from tests.integration.secure.conftest import grant

#: The account name both deployments use: without a namespace their transactional ids (derived
#: from account and folder) would be the same, and each start would fence the other.
ACCOUNT = "support"
PREFIXED_ACLS = {
    ResourceType.TOPIC: (
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.READ,
        AclOperation.WRITE,
    ),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.WRITE, AclOperation.DESCRIBE),
}


class Deployment:
    """One mailtap deployment: a namespace, a principal, a mailbox, an IMAP source process."""

    def __init__(
        self,
        name: str,
        secure_kafka: SecureKafka,
        admin: AdminClient,
        mailbox: Account,
        services: DevServices,
        tmp: Path,
    ) -> None:
        self.namespace = name
        self.principal = f"tenant-{name}"
        self.password = uuid.uuid4().hex
        self.mailbox = mailbox
        self.services = services
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / f"{name}.log"
        # The admin's view (PLAINTEXT super user): creates the topics, as `topics ensure`.
        self.admin_kafka = KafkaSettings(
            bootstrap_servers=secure_kafka.admin_bootstrap, namespace=name
        )
        self.kafka_section: dict[str, Any] = {
            "bootstrap_servers": secure_kafka.sasl_bootstrap,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": self.principal,
            "sasl_password": self.password,
            "ssl_ca_location": secure_kafka.ca_location,
            "namespace": name,
        }
        self.kafka = KafkaSettings.model_validate(self.kafka_section)
        self._admin = admin

    def provision(self) -> None:
        """The operator's part: the principal, its prefixed ACLs, the topics."""
        upsert = UserScramCredentialUpsertion(
            self.principal,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
            self.password.encode(),
        )
        for future in self._admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        acls = [
            AclBinding(
                resource,
                f"{self.namespace}.",
                ResourcePatternType.PREFIXED,
                f"User:{self.principal}",
                "*",
                operation,
                AclPermissionType.ALLOW,
            )
            for resource, operations in PREFIXED_ACLS.items()
            for operation in operations
        ]
        grant(self._admin, acls)  # returns once the broker serves them
        ensure_topics(self.admin_kafka, retry_tiers=["1m"])
        # 4 partitions instead of the source's 32: the session's broker holds every test's topics.
        topics = self.admin_kafka.topics
        ensure_topic_specs(self.admin_kafka, [TopicSpec(topics.imap_index, 4, COMPACTED)])

    def start(self) -> None:
        imap = self.services.imap
        config = {
            "kafka": self.kafka_section,
            "claim_check": {"url": (self.tmp / f"claims-{self.namespace}").as_uri()},
            "health": {"port": 0, "max_sync_age_seconds": 600},
            "imap": {
                "accounts": [
                    {
                        "name": ACCOUNT,
                        "host": imap.host,
                        "port": imap.port,
                        "security": "plain",
                        "username": self.mailbox.username,
                        "password": self.mailbox.password,
                        "folders": ["INBOX"],
                        "start": "all",
                    }
                ],
                "connect_timeout_seconds": 5,
                "backoff_initial_seconds": 0.2,
                "backoff_cap_seconds": 2,
            },
        }
        path = self.tmp / f"{self.namespace}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MAILTAP_LOG_LEVEL": "INFO"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mailtap.cli", "run", "imap-source", "-c", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO_ROOT,
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def message_ids(self) -> set[str]:
        """The Message-IDs on this deployment's events topic, read as its own principal."""
        serde = AvroSerde.for_schema("MailEvent", self.admin_kafka)
        consumer = Consumer(
            consumer_config(self.kafka, self.kafka.qualify(f"t-{uuid.uuid4().hex[:8]}"))
        )
        topic = self.kafka.topics.events
        try:
            starts = [
                TopicPartition(topic, p, 0)
                for p in topic_partitions(consumer, self.kafka, topic, 10) or []
            ]
            return {
                serde.decode(m.value())["message_id"]
                for m in read_to_end(consumer, starts, 60)
                if m.value() is not None
            }
        finally:
            consumer.close()


def append(deployment: Deployment, services: DevServices, tag: str, n: int) -> set[str]:
    from imapclient import IMAPClient

    ids = {f"{tag}-{i}@example.com" for i in range(n)}
    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=10) as client:
        client.login(deployment.mailbox.username, deployment.mailbox.password)
        for message_id in sorted(ids):
            client.append("INBOX", make_mail(message_id, f"mail of {tag}"))
    return ids


def test_two_namespaces_with_the_same_account_share_one_secured_cluster(
    services: DevServices,
    unique: str,
    tmp_path: Path,
    secure_kafka: SecureKafka,
    admin: AdminClient,
) -> None:
    mailboxes = [
        services.add_user(f"{side}-{unique}@example.com", f"pw-{side}-{unique}")
        for side in ("a", "b")
    ]
    prod, stage = (
        Deployment(f"{side}{unique}", secure_kafka, admin, mailbox, services, tmp_path)
        for side, mailbox in zip(("prod", "stage"), mailboxes, strict=True)
    )
    try:
        for deployment in (prod, stage):
            deployment.provision()
        prod_ids = append(prod, services, f"prod-{unique}", 3)
        stage_ids = append(stage, services, f"stage-{unique}", 2)
        prod.start()
        stage.start()

        def published() -> bool:
            running = all(d.proc is not None and d.proc.poll() is None for d in (prod, stage))
            assert running, prod.log() + stage.log()
            return prod.message_ids() >= prod_ids and stage.message_ids() >= stage_ids

        wait_for(published, "both deployments to publish their mailbox")
        # More mail while both run: a fenced writer would stop publishing here.
        prod_ids |= append(prod, services, f"prod2-{unique}", 1)
        stage_ids |= append(stage, services, f"stage2-{unique}", 1)
        wait_for(published, "both deployments to publish the later mail")

        assert prod.message_ids() == prod_ids
        assert stage.message_ids() == stage_ids
        for deployment in (prod, stage):
            assert "fenced" not in deployment.log().lower(), deployment.log()

        # Prefixed ACLs keep them apart: prod's principal may not read stage's topic.
        intruder = Consumer(consumer_config(prod.kafka, prod.kafka.qualify("peek")))
        try:
            theirs = stage.kafka.topics.events
            refused = intruder.list_topics(theirs, timeout=10).topics[theirs].error
            ours = prod.kafka.topics.events
            allowed = intruder.list_topics(ours, timeout=10).topics[ours].error
        finally:
            intruder.close()
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert allowed is None
    finally:
        prod.stop()
        stage.stop()
