"""Bounce mailbox events on mail.events -> BOUNCED delivery events correlated to their commands."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from smtp_harness import WAIT_S, TopicReader, sink_config

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.local import LocalClaimCheckStore
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.topics import ensure_topics
from connectors.core.mail import parse_mail
from connectors.smtp.bounce_reader import BounceReader
from connectors.smtp.lanes import PRODUCER_COMPRESSION
from connectors.smtp.metrics import SinkMetrics
from mailtap.dev import DevServices

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dsn"
BOUNCES = "bounces@example.com"


def test_bounces_become_correlated_bounced_events(
    services: DevServices, unique: str, tmp_path: Path
) -> None:
    cfg, settings, _ = sink_config(
        services.bootstrap_servers,
        unique,
        25,
        bounce_accounts=[BOUNCES],
        bounce_group_id=f"bounces-{unique}",
        verp_domain="bounces.example.com",
    )
    ensure_topics(cfg.kafka)
    store = LocalClaimCheckStore(tmp_path / "claims")
    mails = [
        (BOUNCES, (FIXTURES / "qmail.eml").read_bytes()),
        (BOUNCES, (FIXTURES / "postfix.eml").read_bytes()),
        (
            BOUNCES,
            b"From: a@example.org\r\nSubject: hello\r\nMessage-ID: <x1@example.org>\r\n\r\nhi\r\n",
        ),
        ("someone@example.com", (FIXTURES / "gmail.eml").read_bytes()),
    ]
    serde = AvroSerde.for_schema("MailEvent", cfg.kafka)
    producer = Producer(producer_config(cfg.kafka, compression_type=PRODUCER_COMPRESSION))
    topic = cfg.kafka.topics.events
    for uid, (account, raw) in enumerate(mails, start=1):
        parsed = parse_mail(
            raw,
            account=account,
            source={"kind": "IMAP", "folder": "INBOX", "uidvalidity": 1, "uid": uid},
            flags=[],
            internal_date=None,
            observed_at=datetime.now(UTC),
            claim_check=store,
        )
        producer.produce(topic, key=parsed.key.encode(), value=serde.encode(parsed.event, topic))
    assert producer.flush(30) == 0

    metrics = SinkMetrics()
    reader = BounceReader(cfg, settings, fetch_blob=store.get, metrics=metrics)
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    reader.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while len(events.values) < 2 and time.monotonic() < deadline:
            reader.poll_once()
            events.poll(0.1)
    finally:
        reader.close()
    got = sorted(events.values, key=lambda e: e["command_id"])
    assert [(e["command_id"], e["recipient"], e["status"], e["bounce_type"]) for e in got] == [
        ("c0c0a5e5", "ghost@example.org", "BOUNCED", "HARD"),
        ("d00dfeed77", "olduser@example.info", "BOUNCED", "HARD"),
    ]
    assert got[0]["enhanced_status"] == "5.1.1" and got[0]["smtp_code"] == 550
    assert got[0]["message_id"] == "mailtap.c0c0a5e5@example.com"
    assert [k for k, _, _ in events.records] == [e["command_id"] for e in events.values]
    # Counted where the bounce-rate alert looks for them.
    assert (
        metrics.registry.get_sample_value("mailtap_smtp_outcomes_total", {"status": "BOUNCED"}) == 2
    )
    events.close()
