"""The Exchange source's cursor: what it stores in ``mailtap.offsets`` per (account, folder).

Wire sample (value of the offsets record; key ``{"account":"ops","folder":"inbox","source":"ews"}``)::

    {"subscription_id": "7QLZI7AZRo2A4QyaJu8MMx...",
     "watermark": "2026-11-29T16:08:52+00:00",
     "recent": {"AAMkAGI2...": 1795968532}}

- ``subscription_id``: the streaming subscription to reconnect to while it lives;
- ``watermark``: the newest DateTimeReceived among committed items (or the configured start);
- ``recent``: ids of committed items received within ``margin`` of the watermark, with their
  DateTimeReceived as Unix seconds. A catch-up reads from ``watermark - margin`` and skips these,
  so the overlap the margin buys never emits an item twice.

``recent`` is capped at :data:`MAX_RECENT` ids (the newest kept): the offsets record must stay
well under Kafka's 1 MB record limit (an Exchange item id is ~150 characters). A mailbox receiving
more than that within the margin may see a few items published twice after a catch-up (the same
keys, absorbed downstream), never a gap.

Streaming watermarks of EWS itself are not stored: a streaming subscription cannot be resumed
from a watermark (only pull subscriptions can), and we never use SyncFolderItems.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SUBSCRIPTION_ID = "subscription_id"
WATERMARK = "watermark"
RECENT = "recent"

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: ~2,000 x ~170 bytes: a few hundred KB of offsets record at most.
MAX_RECENT = 2_000


@dataclass(frozen=True)
class EwsCursor:
    subscription_id: str | None
    watermark: dt.datetime
    recent: Mapping[str, int] = field(default_factory=dict)

    def catchup_since(self, margin: dt.timedelta) -> dt.datetime:
        return max(EPOCH, self.watermark - margin)

    def knows(self, item_id: str) -> bool:
        return item_id in self.recent

    def with_subscription(self, subscription_id: str | None) -> EwsCursor:
        return EwsCursor(subscription_id, self.watermark, self.recent)

    def advanced(self, items: Iterable[tuple[str, dt.datetime]], margin: dt.timedelta) -> EwsCursor:
        """The cursor after committing ``items`` (item id, DateTimeReceived).

        >>> t0 = dt.datetime(2026, 11, 29, 16, 0, tzinfo=dt.UTC)
        >>> c = EwsCursor("s", t0).advanced([("a", t0), ("b", t0 + dt.timedelta(minutes=9))],
        ...                                 dt.timedelta(minutes=5))
        >>> c.watermark.minute, sorted(c.recent)
        (9, ['b'])
        """
        recent = dict(self.recent)
        watermark = self.watermark
        for item_id, received in items:
            recent[item_id] = int(received.timestamp())
            watermark = max(watermark, received)
        floor = (watermark - margin).timestamp()
        kept = {i: t for i, t in recent.items() if t >= floor}
        if len(kept) > MAX_RECENT:
            newest = sorted(kept.items(), key=lambda entry: entry[1])[-MAX_RECENT:]
            kept = dict(newest)
        return EwsCursor(self.subscription_id, watermark, kept)

    def to_offset(self) -> dict[str, Any]:
        return {
            SUBSCRIPTION_ID: self.subscription_id,
            WATERMARK: self.watermark.isoformat(),
            RECENT: dict(sorted(self.recent.items())),
        }

    @classmethod
    def from_offset(cls, offset: Mapping[str, Any]) -> EwsCursor:
        """Inverse of :meth:`to_offset`.

        >>> c = EwsCursor("s", EPOCH, {"a": 1})
        >>> EwsCursor.from_offset(c.to_offset()) == c
        True
        """
        watermark = dt.datetime.fromisoformat(str(offset[WATERMARK]))
        if watermark.tzinfo is None:
            watermark = watermark.replace(tzinfo=dt.UTC)
        recent = {str(k): int(v) for k, v in dict(offset.get(RECENT) or {}).items()}
        sub = offset.get(SUBSCRIPTION_ID)
        return cls(str(sub) if sub else None, watermark, recent)
