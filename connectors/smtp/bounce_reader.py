"""Bounce ingestion: MailEvents of the bounce mailbox in, BOUNCED DeliveryEvents out.

The bounce mailbox is read by the ordinary IMAP (or EWS) source into ``mail.events``; this reader
consumes that topic, keeps the events of the accounts named in ``smtp.bounce_accounts``, fetches
each raw MIME from the claim-check store, and publishes one BOUNCED event per bounced recipient
that :func:`~connectors.smtp.bounce.parse_bounce` correlates to a command (keyed by command id on
``mail.delivery``). Events and consumer offsets go in one Kafka transaction.

Only ``change == "ADDED"`` events are considered: a RESCANNED event (new UIDVALIDITY) is a mail we
have already read, and UPDATED ones are flag changes. Uncorrelated bounces (not ours, or the
original Message-ID and the VERP address are both missing) are logged and skipped.

Suppression list (:mod:`connectors.smtp.suppression`, with ``smtp.suppression.enabled``): in the
same transaction the reader writes a ``Suppression`` record for a correlated hard bounce of the
configured classes, for soft bounces (counted on the record until the limit suppresses), for a
complaint about one of our messages (ARF, :mod:`connectors.smtp.arf`) and for the sender of a
mail to ``smtp.suppression.unsubscribe_mailto``. It keeps its own :class:`SuppressionTable` to
know an address's earlier soft bounces.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

from connectors.core.avro.replies import DeliveryEvent
from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig
from connectors.core.errors import RegistryUnavailable
from connectors.core.kafka.clients import consumer_config, init_transactions, producer_config
from connectors.core.kafka.transactions import COMMIT_TIMEOUT_S
from connectors.core.kafka.watchdog import SEND_OFFSETS_TIMEOUT_S, bounded
from connectors.smtp import suppression
from connectors.smtp.arf import parse_complaints, unsubscriber
from connectors.smtp.bounce import Bounce, parse_bounce
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.errors import AddressError
from connectors.smtp.metrics import SinkMetrics
from connectors.smtp.render import BlobFetcher

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5
#: While the schema registry does not answer, the batch is read again this often.
REGISTRY_RETRY_S = 5.0
COMPRESSION = "lz4"  # see connectors.smtp.sink.PRODUCER_COMPRESSION


def bounce_event(bounce: Bounce, occurred_at: datetime) -> DeliveryEvent:
    """The DeliveryEvent for one correlated bounce (one with a command id)."""
    if bounce.command_id is None:
        raise ValueError(f"bounce for {bounce.recipient} not correlated to a command: no event")
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
        self.suppression_serde = AvroSerde.for_schema("Suppression", config.kafka)
        self.suppressions = (
            suppression.SuppressionTable(config.kafka, config.kafka.topics.suppressions)
            if settings.suppression.enabled
            else None
        )
        self.published = 0
        self.suppressed = 0
        """Suppression records written (a soft-bounce count included)."""
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
        self._stop = threading.Event()

    def start(self) -> None:
        init_transactions(self._producer, self.config.kafka, 60)
        if self.suppressions is not None:
            self.suppressions.start()
        self._consumer.subscribe([self.config.kafka.topics.events])
        log.info("bounce reader started accounts=%s", sorted(self.accounts))

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        self.start()
        try:
            while not stop.is_set():
                self.poll_once()
        finally:
            self.close()

    def close(self) -> None:
        self._consumer.close()
        self._producer.flush(10)
        if self.suppressions is not None:
            self.suppressions.close()

    def poll_once(self) -> int:
        """Read a batch and publish its BOUNCED events and suppressions with its offsets in one
        transaction; returns the records read (0 when the batch waits for the registry)."""
        records = self._consumer.consume(200, timeout=POLL_TIMEOUT_S)
        if not records:
            return 0
        try:
            return self._publish(records)
        except RegistryUnavailable as exc:
            # Not bad data: the batch is read again once the registry answers, nothing skipped
            # and nothing committed (found by `mailtap soak`, registry-down faults; before, the
            # reader ended and took the sink down with it until the registry came back).
            self._rewind(records)
            log.warning(
                "schema registry unavailable; reading the bounce batch again in %.0f s: %s",
                REGISTRY_RETRY_S,
                exc,
            )
            self._stop.wait(REGISTRY_RETRY_S)
            return 0

    def _publish(self, records: list[Message]) -> int:
        offsets: dict[tuple[str, int], int] = {}
        events: list[DeliveryEvent] = []
        entries: dict[str, dict[str, Any]] = {}  # the batch's suppression records, last wins
        for record in records:
            if record.error():
                continue
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            assert topic is not None and partition is not None and offset is not None
            offsets[(topic, partition)] = offset + 1
            events.extend(self._bounces_in(record, entries))
        delivery = self.config.kafka.topics.delivery
        suppressions_topic = self.config.kafka.topics.suppressions
        self._producer.begin_transaction()
        try:
            for event in events:
                self._producer.produce(
                    delivery,
                    key=event["command_id"].encode(),
                    value=self.delivery_serde.encode(event, delivery),
                )
            for key, entry in entries.items():
                self._producer.produce(
                    suppressions_topic,
                    key=key.encode("utf-8"),
                    value=self.suppression_serde.encode(entry, suppressions_topic),
                )
        except RegistryUnavailable:
            self._producer.abort_transaction(COMMIT_TIMEOUT_S)
            raise
        # Bounded, as in the sink's recorder (confluent-kafka waits forever by default): a
        # timeout ends the reader, and the process restarts with the batch uncommitted.
        # send_offsets_to_transaction may ignore its timeout (watchdog.py): the process exits.
        positions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        group = self._consumer.consumer_group_metadata()
        bounded(
            lambda: self._producer.send_offsets_to_transaction(
                positions, group, SEND_OFFSETS_TIMEOUT_S
            ),
            SEND_OFFSETS_TIMEOUT_S,
            "send_offsets_to_transaction (bounce reader)",
        )
        self._producer.commit_transaction(COMMIT_TIMEOUT_S)
        self.published += len(events)
        self.suppressed += len(entries)
        if self.metrics is not None and events:
            self.metrics.outcomes.labels("BOUNCED").inc(len(events))
        return len(records)

    def _rewind(self, records: list[Message]) -> None:
        """Back to the batch's first record of each partition, so the next poll reads it again."""
        first: dict[tuple[str, int], int] = {}
        for record in records:
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            if record.error() or topic is None or partition is None or offset is None:
                continue
            first.setdefault((topic, partition), offset)
        for (topic, partition), offset in first.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                # Revoked meanwhile: its next owner reads from the committed offset anyway.
                log.info("bounce batch not rewound on %s [%d]: %s", topic, partition, exc)

    def _bounces_in(
        self, record: Message, entries: dict[str, dict[str, Any]]
    ) -> list[DeliveryEvent]:
        value = record.value()
        if value is None:
            return []
        try:
            mail = self.events_serde.decode(value, record.topic() or "")
        except RegistryUnavailable:
            # Not a bad record: skipping it would lose a DSN (no BOUNCED, no suppression).
            # Raised before the batch's transaction: `poll_once` reads the batch again.
            raise
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
        if self.suppressions is not None and self._complaints_in(raw, now, entries):
            return []  # an ARF report, not a bounce
        bounces = parse_bounce(raw, verp_domain=self.settings.verp_domain)
        if not bounces and self.suppressions is not None:
            # Only what is not a bounce: a DSN sent to the unsubscribe address (it may be the
            # return path too) must not suppress the mailer daemon.
            self._unsubscribe_in(raw, now, entries)
        out = []
        for bounce in bounces:
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
            if self.suppressions is not None:
                self._suppress_bounce(bounce, now, entries)
        return out

    def _current(self, address: str, entries: dict[str, dict[str, Any]]) -> Any:
        assert self.suppressions is not None
        return entries.get(suppression.normalize(address)) or self.suppressions.get(address)

    def _keep(self, entry: dict[str, Any], entries: dict[str, dict[str, Any]]) -> None:
        assert self.suppressions is not None
        entries[entry["address"]] = entry
        # Seen by the next batch before the table's consumer reads it back.
        self.suppressions.put_local(entry["address"], entry)
        log.info(
            "suppression address=%s suppressed=%s reason=%s",
            entry["address"],
            entry["suppressed"],
            entry["reason"],
        )

    def _suppress_bounce(
        self, bounce: Bounce, now: datetime, entries: dict[str, dict[str, Any]]
    ) -> None:
        try:
            entry = suppression.after_bounce(
                self._current(bounce.recipient, entries),
                bounce.recipient,
                hard=bounce.bounce_type.value == "HARD",
                status=bounce.status,
                detail=bounce.diagnostic,
                command_id=bounce.command_id,
                now=now,
                settings=self.settings.suppression,
            )
        except AddressError as exc:
            log.warning("bounce of an unusable address: %s", exc)
            return
        if entry is not None:
            self._keep(entry, entries)

    def _complaints_in(self, raw: bytes, now: datetime, entries: dict[str, dict[str, Any]]) -> bool:
        """Suppress the complainants of an ARF report; False when ``raw`` is not one."""
        complaints = parse_complaints(raw, verp_domain=self.settings.verp_domain)
        if complaints is None:
            return False
        for complaint in complaints:
            self._suppress(
                complaint.recipient,
                "COMPLAINT",
                f"feedback type {complaint.feedback_type}",
                complaint.command_id,
                now,
                entries,
            )
        if not complaints:
            log.info("feedback report about no message of ours, or not a complaint: skipped")
        return True

    def _unsubscribe_in(
        self, raw: bytes, now: datetime, entries: dict[str, dict[str, Any]]
    ) -> None:
        mailto = self.settings.suppression.unsubscribe_mailto
        sender = unsubscriber(raw, mailto) if mailto else None
        if sender is not None:
            self._suppress(sender, "UNSUBSCRIBE", f"mail to {mailto}", None, now, entries)

    def _suppress(
        self,
        address: str,
        reason: str,
        detail: str,
        command_id: str | None,
        now: datetime,
        entries: dict[str, dict[str, Any]],
    ) -> None:
        try:
            entry = suppression.record(
                address,
                reason=reason,
                now=now,
                detail=detail,
                source="bounce-reader",
                command_id=command_id,
            )
        except AddressError as exc:
            log.warning("cannot suppress an unusable address (%s): %s", reason, exc)
            return
        existing = self._current(entry["address"], entries)
        if existing is None or not existing.get("suppressed"):
            self._keep(entry, entries)
