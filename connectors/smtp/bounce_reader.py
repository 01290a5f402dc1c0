"""Bounce ingestion: MailEvents of the bounce mailbox in, BOUNCED DeliveryEvents out.

The bounce mailbox is read by the ordinary IMAP (or EWS) source into ``mail.events``; this reader
consumes that topic, keeps the events of the accounts named in ``smtp.bounce_accounts``, fetches
each raw MIME from the claim-check store, and publishes one BOUNCED event per bounced recipient
that :func:`~connectors.smtp.bounce.parse_bounce` correlates to a command (keyed by command id on
``mail.delivery``). Events and consumer offsets go in one Kafka transaction.

Only ``change == "ADDED"`` events are considered: a RESCANNED event (new UIDVALIDITY) is a mail we
have already read, and UPDATED ones are flag changes. Uncorrelated bounces (not ours, or the
original Message-ID and the VERP address are both missing) are logged and skipped.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from connectors.core.config import MailtapConfig
from connectors.core.kafka import consumer_config, init_transactions, producer_config
from connectors.core.serde import AvroSerde
from connectors.smtp.bounce import Bounce, parse_bounce
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.metrics import SinkMetrics
from connectors.smtp.render import BlobFetcher

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5
COMPRESSION = "lz4"  # see connectors.smtp.sink.PRODUCER_COMPRESSION


def bounce_event(bounce: Bounce, occurred_at: datetime) -> dict[str, Any]:
    """The DeliveryEvent for one correlated bounce."""
    return {
        "schema_version": 1,
        "command_id": bounce.command_id,
        "message_id": bounce.message_id,
        "recipient": bounce.recipient,
        "status": "BOUNCED",
        "smtp_code": bounce.smtp_code,
        "enhanced_status": bounce.status,
        "diagnostic": bounce.diagnostic,
        "bounce_type": bounce.bounce_type.value,
        "attempt": 1,
        "next_attempt_at": None,
        "workflow": None,
        "event_key": None,
        "occurred_at": occurred_at,
    }


class BounceReader:
    """Single-threaded consumer loop; :meth:`run` until a stop event is set."""

    def __init__(
        self,
        config: MailtapConfig,
        settings: SmtpSinkSettings,
        *,
        fetch_blob: BlobFetcher,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: SinkMetrics | None = None,
    ) -> None:
        self.config = config
        #: The sink's, in ``mailtap run smtp-sink``: BOUNCED counts next to SENT for the bounce
        #: rate (deploy/observability's MailtapBounceRateHigh).
        self.metrics = metrics
        self.settings = settings
        self.fetch_blob = fetch_blob
        self.clock = clock
        self.accounts = {a.lower() for a in settings.bounce_accounts}
        self.events_serde = AvroSerde.for_schema("MailEvent", config.kafka)
        self.delivery_serde = AvroSerde.for_schema("DeliveryEvent", config.kafka)
        self.published = 0
        self.uncorrelated = 0
        instance = settings.instance_id or socket.gethostname()
        self._producer = Producer(
            producer_config(
                config.kafka,
                transactional_id=f"{settings.bounce_group_id}.{instance}",
                compression_type=COMPRESSION,
            )
        )
        self._consumer = Consumer(
            consumer_config(config.kafka, settings.bounce_group_id, group_instance_id=instance)
        )

    def start(self) -> None:
        init_transactions(self._producer, self.config.kafka, 60)
        self._consumer.subscribe([self.config.kafka.topics.events])
        log.info("bounce reader started accounts=%s", sorted(self.accounts))

    def run(self, stop: threading.Event) -> None:
        self.start()
        try:
            while not stop.is_set():
                self.poll_once()
        finally:
            self.close()

    def close(self) -> None:
        self._consumer.close()
        self._producer.flush(10)

    def poll_once(self) -> int:
        records = self._consumer.consume(200, timeout=POLL_TIMEOUT_S)
        if not records:
            return 0
        offsets: dict[tuple[str, int], int] = {}
        events: list[dict[str, Any]] = []
        for record in records:
            if record.error():
                continue
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            assert topic is not None and partition is not None and offset is not None
            offsets[(topic, partition)] = offset + 1
            events.extend(self._bounces_in(record))
        delivery = self.config.kafka.topics.delivery
        self._producer.begin_transaction()
        for event in events:
            self._producer.produce(
                delivery,
                key=str(event["command_id"]).encode(),
                value=self.delivery_serde.encode(event, delivery),
            )
        self._producer.send_offsets_to_transaction(
            [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
            self._consumer.consumer_group_metadata(),
        )
        self._producer.commit_transaction()
        self.published += len(events)
        if self.metrics is not None and events:
            self.metrics.outcomes.labels("BOUNCED").inc(len(events))
        return len(records)

    def _bounces_in(self, record: Message) -> list[dict[str, Any]]:
        value = record.value()
        if value is None:
            return []
        try:
            mail = self.events_serde.decode(value, record.topic() or "")
        except Exception as exc:
            log.warning("undecodable MailEvent at %s: %s", record.offset(), exc)
            return []
        if (
            str(mail.get("account", "")).lower() not in self.accounts
            or mail.get("change") != "ADDED"
        ):
            return []
        raw_ref = mail.get("raw_ref")
        if not raw_ref:
            log.warning("bounce mailbox event without raw_ref key=%s", mail.get("key"))
            return []
        try:
            raw = self.fetch_blob(str(raw_ref["uri"]))
        except Exception as exc:
            log.warning("cannot fetch %s: %s", raw_ref["uri"], exc)
            return []
        now = self.clock()
        out = []
        for bounce in parse_bounce(raw, verp_domain=self.settings.verp_domain):
            if bounce.command_id is None:
                self.uncorrelated += 1
                log.info(
                    "uncorrelated bounce recipient=%s key=%s", bounce.recipient, mail.get("key")
                )
                continue
            log.info(
                "bounce command_id=%s recipient=%s type=%s status=%s",
                bounce.command_id,
                bounce.recipient,
                bounce.bounce_type.value,
                bounce.status,
            )
            out.append(bounce_event(bounce, now))
        return out
