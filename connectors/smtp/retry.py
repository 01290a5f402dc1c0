"""Tiered retries: which tier a deferred command goes to, its headers, and waiting for due time.

A deferred command is written to ``<retry_prefix>.<tier>`` (never back onto ``mail.commands``), with
its original value bytes and these headers (names are constants, values UTF-8):

=========================  =================================================================
``mailtap.attempt``        number of the attempt the record is for (the first send is 1)
``mailtap.due-ms``         epoch milliseconds before which it must not be sent
``mailtap.recipients``     JSON list of the recipients still pending (others are final)
``mailtap.last-error``     diagnostic of the previous attempt
=========================  =================================================================

Attempt ``n`` failed -> tier ``min(n, len(tiers)) - 1``: with ``5m,15m,1h,4h`` the second attempt
waits 5 min, the third 15 min, then 1 h, then 4 h for every further attempt. A command older than
``max_lifetime`` (from its ``created_at``) or past ``max_attempts`` is given up: FAILED + DLQ.

:class:`DueGate` holds the bookkeeping for partitions paused until their head record is due; the
sink pauses such a partition and seeks back, so other tiers and new commands keep flowing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from connectors.core.tracing import RecordHeaders, header_pairs

HEADER_ATTEMPT = "mailtap.attempt"
HEADER_DUE_MS = "mailtap.due-ms"
HEADER_RECIPIENTS = "mailtap.recipients"
HEADER_LAST_ERROR = "mailtap.last-error"

HEADER_ERROR_REASON = "mailtap.error.reason"
HEADER_ERROR_CLASS = "mailtap.error.class"
HEADER_ERROR_TOPIC = "mailtap.error.topic"
HEADER_ERROR_PARTITION = "mailtap.error.partition"
HEADER_ERROR_OFFSET = "mailtap.error.offset"

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class RetryInfo:
    """What the headers of a retry record say; defaults describe a fresh command."""

    attempt: int = 1
    due_ms: int = 0
    recipients: tuple[str, ...] | None = None
    last_error: str | None = None

    @classmethod
    def from_headers(cls, headers: RecordHeaders) -> RetryInfo:
        values: dict[str, str] = {}
        for name, value in header_pairs(headers):
            if value is not None:
                values[name] = value.decode("utf-8") if isinstance(value, bytes) else value
        recipients = values.get(HEADER_RECIPIENTS)
        return cls(
            attempt=int(values.get(HEADER_ATTEMPT, "1")),
            due_ms=int(values.get(HEADER_DUE_MS, "0")),
            recipients=tuple(json.loads(recipients)) if recipients else None,
            last_error=values.get(HEADER_LAST_ERROR),
        )

    def to_headers(self) -> Headers:
        headers = [
            (HEADER_ATTEMPT, str(self.attempt).encode()),
            (HEADER_DUE_MS, str(self.due_ms).encode()),
        ]
        if self.recipients is not None:
            headers.append((HEADER_RECIPIENTS, json.dumps(list(self.recipients)).encode()))
        if self.last_error:
            headers.append((HEADER_LAST_ERROR, self.last_error[:1000].encode("utf-8")))
        return headers


@dataclass(frozen=True)
class Retry:
    tier: str
    due: datetime
    attempt: int
    """The attempt the retry record is for."""


@dataclass(frozen=True)
class GiveUp:
    reason: str


def plan_next(
    *,
    failed_attempt: int,
    created_at: datetime,
    now: datetime,
    tiers: Sequence[tuple[str, float]],
    max_lifetime: float,
    max_attempts: int,
) -> Retry | GiveUp:
    """Where attempt ``failed_attempt + 1`` goes, or why there is none.

    >>> from datetime import UTC
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> plan_next(failed_attempt=1, created_at=t0, now=t0, tiers=[("5m", 300.0)],
    ...           max_lifetime=3600, max_attempts=5).tier
    '5m'
    """
    if failed_attempt >= max_attempts:
        return GiveUp(f"gave up after {failed_attempt} attempts (max_attempts={max_attempts})")
    tier, delay = tiers[min(failed_attempt, len(tiers)) - 1]
    due = now + timedelta(seconds=delay)
    deadline = created_at + timedelta(seconds=max_lifetime)
    if now >= deadline or due > deadline:
        return GiveUp(
            f"gave up after {failed_attempt} attempts: max lifetime {max_lifetime:g}s since "
            f"{created_at.isoformat()} reached"
        )
    return Retry(tier=tier, due=due, attempt=failed_attempt + 1)


def expired(created_at: datetime, now: datetime, max_lifetime: float) -> bool:
    return now >= created_at + timedelta(seconds=max_lifetime)


def dlq_headers(
    original: RecordHeaders,
    *,
    reason: str,
    error_class: str,
    topic: str,
    partition: int,
    offset: int,
) -> Headers:
    """Original headers plus the error headers (Kafka Connect's ``__connect.errors.*`` idea)."""
    kept: Headers = [
        (k, v.encode("utf-8") if isinstance(v, str) else v)
        for k, v in header_pairs(original)
        if v is not None and not k.startswith("mailtap.error.")
    ]
    return [
        *kept,
        (HEADER_ERROR_REASON, reason[:2000].encode("utf-8")),
        (HEADER_ERROR_CLASS, error_class.encode("utf-8")),
        (HEADER_ERROR_TOPIC, topic.encode("utf-8")),
        (HEADER_ERROR_PARTITION, str(partition).encode()),
        (HEADER_ERROR_OFFSET, str(offset).encode()),
    ]


@dataclass
class DueGate:
    """Partitions paused until a due time: ``{(topic, partition): due_ms}``."""

    paused: dict[tuple[str, int], int] = field(default_factory=dict)

    def hold(self, topic: str, partition: int, due_ms: int) -> None:
        self.paused[(topic, partition)] = due_ms

    def release_due(self, now_ms: int) -> list[tuple[str, int]]:
        """Partitions whose head record is due now; they are forgotten here."""
        due = [tp for tp, at in self.paused.items() if at <= now_ms]
        for tp in due:
            del self.paused[tp]
        return due

    def forget(
        self, partitions: Mapping[tuple[str, int], object] | Sequence[tuple[str, int]]
    ) -> None:
        for tp in list(partitions):
            self.paused.pop(tp, None)

    def next_due_ms(self) -> int | None:
        return min(self.paused.values()) if self.paused else None
