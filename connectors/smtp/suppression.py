"""The suppression list: addresses mail is no longer sent to, on a compacted Kafka topic.

Topic ``kafka.topics.suppressions`` (``mail.suppressions``), key = :func:`normalize` of the
address, value = an Avro ``Suppression`` record (``schemas/Suppression.avsc``), null = removed.
Any team may read and write it; ``mailtap suppressions list|add|remove`` does from the shell.

Wire sample (the value, as JSON)::

    {"address": "nobody@example.org", "suppressed": true, "reason": "HARD_BOUNCE",
     "detail": "5.1.1 550 5.1.1 <nobody@example.org>: Recipient address rejected",
     "source": "bounce-reader", "command_id": "3f2a...", "soft_bounces": [],
     "updated_at": 1764640000000}

Who is added (by the bounce reader, :mod:`connectors.smtp.bounce_reader`):

- a correlated hard bounce whose status starts with one of ``smtp.suppression.hard_bounce_statuses``
  (``5.1`` by default: the mailbox or domain does not exist);
- ``soft_bounce_limit`` soft bounces (a 4.x.x DSN, or a hard one of another class) within
  ``soft_bounce_window``: until then the record has ``suppressed: false`` and only keeps the times;
- a complaint (ARF, :mod:`connectors.smtp.arf`) about one of our messages;
- the sender of a mail to ``smtp.suppression.unsubscribe_mailto`` (List-Unsubscribe).

Address comparison (documented policy): the domain is IDNA-encoded (A-labels) and lower-cased;
the local part is kept as written except that it is lower-cased (and NFC-normalized when it is
not ASCII). RFC 5321 2.4 lets a receiving host treat local parts case-sensitively, but in practice
none does, and for a suppression list the safe error is to *not* send to ``Jane@`` after ``jane@``
complained.

The sink keeps a :class:`SuppressionTable`: read up to the end at start (so a restart honours
every entry), then kept up to date by a background consumer while it runs, so an entry written by
another team is honoured within about a poll interval, without a restart. A command to a
suppressed recipient is not sent to that recipient: its outcome is ``SUPPRESSED`` with the reason
(:func:`screen`); the other recipients of the command are sent as usual.

Except when the entry was written for a bounce of *this very command* (its ``command_id``, reason
HARD_BOUNCE or SOFT_BOUNCES, or a soft bounce the entry only counts, ``suppressed: false``): the
bounce reader published that recipient's BOUNCED event in the same transaction, so BOUNCED is its
outcome already. This happens when the sink stopped after the relay accepted the mail but
before the outcome was recorded (a kill -9, a broker outage): the command is recovered as
UNKNOWN and resent, and meanwhile its DSN came back. The resend then sends nothing to that
recipient and publishes nothing more for it (a SUPPRESSED event, or the resend's SENT, would be
a second final outcome of one command; found by ``mailtap soak`` on a secured broker). The entry
remembers the address's last bounce only: when another command's bounce of the same address
came in between, the resend goes out as any other.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.errors import RegistryUnavailable
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.errors import StopRequested
from connectors.core.kafka.readtoend import read_batches_to_end, topic_partitions
from connectors.smtp.classify import MAX_DIAGNOSTIC, DeliveryStatus, RecipientOutcome
from connectors.smtp.config import SuppressionSettings
from connectors.smtp.errors import AddressError
from connectors.smtp.render import RenderedMessage

log = logging.getLogger(__name__)

#: Reading the list up to its end at start-up may take this long before the sink fails loudly.
CATCH_UP_TIMEOUT_S = 120.0
#: The background consumer's poll: an entry another team writes is honoured about this soon.
POLL_TIMEOUT_S = 0.5
#: How often a record is decoded again while the schema registry does not answer.
REGISTRY_RETRY_S = 2.0
REASONS = ("HARD_BOUNCE", "SOFT_BOUNCES", "COMPLAINT", "UNSUBSCRIBE", "MANUAL")
#: Reasons written together with a BOUNCED DeliveryEvent of the entry's command.
BOUNCE_REASONS = frozenset({"HARD_BOUNCE", "SOFT_BOUNCES"})


def normalize(address: str) -> str:
    """The key of ``address`` on the list (see the module docstring for the policy).

    >>> normalize("Jane.Doe@Bücher.Example")
    'jane.doe@xn--bcher-kva.example'
    >>> normalize("用户@例子.广告")
    '用户@xn--fsqu00a.xn--4rr70v'
    """
    text = unicodedata.normalize("NFC", address.strip().removeprefix("<").removesuffix(">"))
    local, at, domain = text.rpartition("@")
    if not at or not local or not domain or any(ch.isspace() for ch in text):
        raise AddressError(f"{address!r} is not an address of the form local@domain")
    try:
        ascii_domain = domain.rstrip(".").encode("idna").decode("ascii")
    except UnicodeError:
        raise AddressError(f"{address!r} has an invalid domain") from None
    return f"{local.lower()}@{ascii_domain.lower()}"


def record(
    address: str,
    *,
    reason: str | None,
    now: datetime,
    detail: str | None = None,
    source: str | None = None,
    command_id: str | None = None,
    soft_bounces: Sequence[datetime] = (),
) -> dict[str, Any]:
    """A ``Suppression`` value; ``reason`` None is an unsuppressed soft-bounce counter."""
    if reason is not None and reason not in REASONS:
        raise ValueError(f"reason must be one of {', '.join(REASONS)}, not {reason!r}")
    return {
        "schema_version": 1,
        "address": normalize(address),
        "suppressed": reason is not None,
        "reason": reason,
        "detail": detail[:MAX_DIAGNOSTIC] if detail else None,
        "source": source,
        "command_id": command_id,
        "soft_bounces": list(soft_bounces),
        "updated_at": now,
    }


def after_bounce(
    existing: Mapping[str, Any] | None,
    address: str,
    *,
    hard: bool,
    status: str | None,
    detail: str | None,
    command_id: str | None,
    now: datetime,
    settings: SuppressionSettings,
) -> dict[str, Any] | None:
    """The record to write after a bounce of ``address``; None when nothing changes.

    An address already suppressed stays as it is (the first reason is kept).
    """
    if existing is not None and existing.get("suppressed"):
        return None
    text = " ".join(p for p in (status, detail) if p) or None
    source = "bounce-reader"
    if hard and status and any(_status_in(status, p) for p in settings.hard_bounce_statuses):
        return record(
            address,
            reason="HARD_BOUNCE",
            now=now,
            detail=text,
            source=source,
            command_id=command_id,
        )
    if settings.soft_bounce_limit == 0:
        return None
    since = now - timedelta(seconds=settings.soft_bounce_window_seconds)
    earlier = [t for t in (existing or {}).get("soft_bounces") or [] if t >= since]
    times = sorted([*earlier, now])[-settings.soft_bounce_limit :]
    suppress = len(times) >= settings.soft_bounce_limit
    if suppress:
        window = settings.soft_bounce_window
        text = f"{len(times)} soft bounces within {window}; last: {text or 'no status'}"
    return record(
        address,
        reason="SOFT_BOUNCES" if suppress else None,
        now=now,
        detail=text,
        source=source,
        command_id=command_id,
        soft_bounces=times,
    )


def _status_in(status: str, prefix: str) -> bool:
    return status == prefix or status.startswith(prefix + ".")


def why(entry: Mapping[str, Any]) -> str:
    """The SUPPRESSED event's diagnostic."""
    parts = [f"suppressed: {entry.get('reason') or 'UNRECOGNIZED'}"]
    if entry.get("detail"):
        parts.append(str(entry["detail"]))
    if entry.get("source"):
        parts.append(f"by {entry['source']}")
    return " - ".join(parts)[:MAX_DIAGNOSTIC]


class SuppressionTable:
    """The list in memory: caught up at :meth:`start`, then followed by a background thread.

    Reads every partition from the beginning with its own consumer (no group commits), with
    ``read_committed`` so an aborted bounce-reader transaction adds nobody. Partitions added to
    the topic while running are picked up at the next start.
    """

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self._serde = AvroSerde.for_schema("Suppression", kafka)
        self._entries: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self.applied = 0
        """Records applied so far (tests wait on it)."""

    def get(self, address: str) -> dict[str, Any] | None:
        try:
            return self._entries.get(normalize(address))
        except AddressError:
            return None

    def suppressed(self, address: str) -> dict[str, Any] | None:
        entry = self.get(address)
        return entry if entry is not None and entry.get("suppressed") else None

    def __len__(self) -> int:
        return sum(1 for e in self._entries.values() if e.get("suppressed"))

    def put_local(self, key: str, value: dict[str, Any] | None) -> None:
        """What this process just wrote, before the background consumer reads it back."""
        if value is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = value

    def start(self, timeout: float = CATCH_UP_TIMEOUT_S) -> None:
        consumer = Consumer(
            consumer_config(
                self.kafka, self.kafka.qualify(f"mailtap-suppressions-{uuid.uuid4().hex[:12]}")
            )
        )
        self._consumer = consumer
        self._stop.clear()  # a sink started again after close() follows the topic again
        self._entries = {}
        partitions = topic_partitions(consumer, self.kafka, self.topic, 30) or []
        starts = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions]
        for batch in read_batches_to_end(consumer, starts, timeout):
            self._take(batch)
        log.info("suppression list read topic=%s suppressed=%d", self.topic, len(self))
        self._thread = threading.Thread(target=self._follow, name="suppressions", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        assert self._consumer is not None
        while not self._stop.is_set():
            try:
                self._poll(self._consumer, POLL_TIMEOUT_S)
            except Exception:  # a broker hiccup must not end the thread: log and keep following
                log.exception("reading %s failed; retrying", self.topic)
                self._stop.wait(POLL_TIMEOUT_S)

    def _poll(self, consumer: Consumer, timeout: float) -> None:
        self._take([msg for msg in consumer.consume(500, timeout=timeout) if not msg.error()])

    def _take(self, records: Sequence[Message]) -> None:
        for msg in records:
            key = msg.key()
            if key is None:
                continue
            value = msg.value()
            try:
                entry = None if value is None else self._decode(value)
            except StopRequested:
                return
            except Exception as exc:
                # Another team's bad record must not stop the sink: skip it, say which.
                log.warning(
                    "undecodable suppression record topic=%s partition=%s offset=%s: %s",
                    self.topic,
                    msg.partition(),
                    msg.offset(),
                    exc,
                )
                continue
            self.put_local(key.decode("utf-8", "replace"), entry)
            self.applied += 1

    def _decode(self, value: bytes) -> dict[str, Any]:
        """Decode ``value``, waiting while the schema registry is unreachable: skipping the
        record would forget a suppression, and the sink would mail a hard-bounced address
        (found by `mailtap soak`: a sink started while the registry was down skipped every
        record of mail.suppressions as undecodable)."""
        while True:
            try:
                return self._serde.decode(value, self.topic)
            except RegistryUnavailable as exc:
                log.warning("reading %s waits for the schema registry: %s", self.topic, exc)
                if self._stop.wait(REGISTRY_RETRY_S):
                    raise StopRequested(f"stopped while waiting for the registry: {exc}") from exc

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def screen(
    rendered: RenderedMessage, table: SuppressionTable | None
) -> tuple[RenderedMessage, list[RecipientOutcome]]:
    """``rendered`` without its suppressed recipients, and their outcomes: SUPPRESSED, or the
    BOUNCED already published when this command's own bounce, hard or soft, came back."""
    if table is None:
        return rendered, []
    outcomes = []
    keep = []
    for rcpt in rendered.recipients:
        entry = table.get(rcpt)
        if entry is not None and bounced_by(entry, rendered.command_id):
            reason = (
                why(entry) if entry.get("suppressed") else f"soft bounce: {entry.get('detail')}"
            )
            outcomes.append(
                RecipientOutcome(
                    rcpt,
                    DeliveryStatus.BOUNCED,
                    diagnostic=f"bounced already (resend not sent): {reason}"[:MAX_DIAGNOSTIC],
                    published=True,
                )
            )
        elif entry is not None and entry.get("suppressed"):
            outcomes.append(
                RecipientOutcome(rcpt, DeliveryStatus.SUPPRESSED, diagnostic=why(entry))
            )
        else:
            keep.append(rcpt)
    if not outcomes:
        return rendered, []
    log.info(
        "suppressed command_id=%s recipients=%s",
        rendered.command_id,
        ",".join(f"{o.recipient}:{o.status.value}" for o in outcomes),
    )
    return dataclasses.replace(rendered, recipients=tuple(keep)), outcomes


def bounced_by(entry: Mapping[str, Any], command_id: str) -> bool:
    """Whether ``entry`` was written for a bounce of the command ``command_id`` (so that
    command's BOUNCED event is published already): one that suppressed the address, or a soft
    bounce it only counted (``suppressed: false``)."""
    if entry.get("command_id") != command_id:
        return False
    if entry.get("suppressed"):
        return entry.get("reason") in BOUNCE_REASONS
    return bool(entry.get("soft_bounces"))
