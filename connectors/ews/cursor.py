"""The Exchange source's cursor: what it stores in ``mailtap.offsets`` per (account, folder).

Wire sample (value of the offsets record; key ``{"account":"ops","folder":"inbox","source":"ews"}``)::

    {"subscription_id": "7QLZI7AZRo2A4QyaJu8MMx...",
     "watermark": "2026-11-29T16:08:52+00:00",
     "recent": {"AAMkAGI2...": 1795968532},
     "items": {"3f2a9c0d5e6b7a81": ["9d1c0e2f", "ops/mid:order-1@shop.example", 1795968532]},
     "complete": true}

- ``subscription_id``: the streaming subscription to reconnect to while it lives;
- ``watermark``: the newest DateTimeReceived among committed items (or the configured start);
- ``recent``: ids of committed items received within ``margin`` of the watermark, with their
  DateTimeReceived as Unix seconds. A catch-up reads from ``watermark - margin`` and skips these,
  so the overlap the margin buys never emits an item twice.

- ``items``: what this folder published, per item: a digest of the ItemId (16 hex digits of its
  sha256) -> [digest of the ChangeKey (8 hex digits), the key published (``""``: seen but never
  published, e.g. mail already there at ``start: latest``), DateTimeReceived as Unix seconds].
  A DeletedEvent or a move out names only the ItemId: this is where its key comes from (for the
  tombstone check), and a reconciliation after lost events compares the folder's ItemIds and
  ChangeKeys (FindItem) with it. Digests, not ids: ~80 bytes an item instead of ~250;
- ``complete``: ``items`` holds every item the folder had since the first start (it never
  overflowed :data:`MAX_ITEMS_BYTES`): only then is an unknown item that a reconciliation finds
  new mail (moved or copied in while events were lost) rather than one forgotten for room.

``recent`` is capped at :data:`MAX_RECENT` ids (the newest kept): the offsets record must stay
well under Kafka's 1 MB record limit (an Exchange item id is ~150 characters). A mailbox receiving
more than that within the margin may see a few items published twice after a catch-up (the same
keys, absorbed downstream), never a gap.

Streaming watermarks of EWS itself are not stored: a streaming subscription cannot be resumed
from a watermark (only pull subscriptions can), and we never use SyncFolderItems.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SUBSCRIPTION_ID = "subscription_id"
WATERMARK = "watermark"
RECENT = "recent"
ITEMS = "items"
COMPLETE = "complete"

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: ~2,000 x ~170 bytes: a few hundred KB of offsets record at most.
MAX_RECENT = 2_000
#: Bytes of the ``items`` map (JSON) at most: with ``recent`` the record stays under Kafka's
#: default 1 MB (~6,000 items with keys of ~40 characters). Beyond it the oldest are forgotten.
MAX_ITEMS_BYTES = 500_000
#: Bytes of one ``items`` entry besides its key in the offsets record (compact JSON: 46).
_ENTRY_OVERHEAD = 48


def item_digest(item_id: str) -> str:
    """The ``items`` key of an ItemId."""
    return hashlib.sha256(item_id.encode()).hexdigest()[:16]


def change_digest(change_key: str) -> str:
    return hashlib.sha256(change_key.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class Tracked:
    """What the folder published for one item (an ``items`` entry)."""

    change: str  # change_digest of the ChangeKey published
    key: str  # "" = seen, never published
    received: int  # DateTimeReceived, Unix seconds

    @property
    def published(self) -> bool:
        return bool(self.key)


@dataclass(frozen=True)
class EwsCursor:
    subscription_id: str | None
    watermark: dt.datetime
    recent: Mapping[str, int] = field(default_factory=dict)
    items: Mapping[str, Tracked] = field(default_factory=dict)
    complete: bool = True

    def catchup_since(self, margin: dt.timedelta) -> dt.datetime:
        return max(EPOCH, self.watermark - margin)

    def knows(self, item_id: str) -> bool:
        return item_id in self.recent

    def with_subscription(self, subscription_id: str | None) -> EwsCursor:
        return EwsCursor(subscription_id, self.watermark, self.recent, self.items, self.complete)

    def tracked(self, item_id: str) -> Tracked | None:
        return self.items.get(item_digest(item_id))

    def holds_key(self, key: str) -> bool:
        """True when an item of this folder was published under ``key``."""
        return any(t.key == key for t in self.items.values())

    def tracking(
        self,
        seen: Iterable[tuple[str, str, str, dt.datetime]] = (),
        gone: Iterable[str] = (),
    ) -> EwsCursor:
        """The cursor with ``seen`` items (item id, change key, key published or "", received)
        recorded and the ``gone`` item ids forgotten. Over :data:`MAX_ITEMS_BYTES` the oldest
        entries are dropped and the map is no longer ``complete``.

        >>> t0 = dt.datetime(2026, 11, 29, 16, 0, tzinfo=dt.UTC)
        >>> c = EwsCursor("s", t0).tracking([("A", "ck1", "ops/mid:a@b", t0)])
        >>> c.tracked("A").key, c.tracking(gone=["A"]).tracked("A")
        ('ops/mid:a@b', None)
        """
        items = dict(self.items)
        for item_id in gone:
            items.pop(item_digest(item_id), None)
        for item_id, change_key, key, received in seen:
            items[item_digest(item_id)] = Tracked(
                change_digest(change_key), key, int(received.timestamp())
            )
        complete = self.complete
        size = sum(len(t.key.encode()) + _ENTRY_OVERHEAD for t in items.values())
        if size > MAX_ITEMS_BYTES:
            complete = False
            for digest, entry in sorted(items.items(), key=lambda e: e[1].received):
                if size <= MAX_ITEMS_BYTES:
                    break
                del items[digest]
                size -= len(entry.key.encode()) + _ENTRY_OVERHEAD
        return EwsCursor(self.subscription_id, self.watermark, self.recent, items, complete)

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
        return EwsCursor(self.subscription_id, watermark, kept, self.items, self.complete)

    def forgetting(self, digests: Iterable[str]) -> EwsCursor:
        """The cursor without the ``items`` entries of these item digests."""
        gone = set(digests)
        items = {d: t for d, t in self.items.items() if d not in gone}
        return EwsCursor(self.subscription_id, self.watermark, self.recent, items, self.complete)

    def keeping(self, digest: str, tracked: Tracked) -> EwsCursor:
        """The cursor with the ``items`` entry ``digest`` (back) in place."""
        items = {**self.items, digest: tracked}
        return EwsCursor(self.subscription_id, self.watermark, self.recent, items, self.complete)

    def to_offset(self) -> dict[str, Any]:
        return {
            SUBSCRIPTION_ID: self.subscription_id,
            WATERMARK: self.watermark.isoformat(),
            RECENT: dict(sorted(self.recent.items())),
            ITEMS: {d: [t.change, t.key, t.received] for d, t in sorted(self.items.items())},
            COMPLETE: self.complete,
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
        items = {
            str(d): Tracked(str(e[0]), str(e[1]), int(e[2]))
            for d, e in dict(offset.get(ITEMS) or {}).items()
        }
        # A cursor written before ``items`` existed knows nothing of what it published: the map
        # starts empty and not complete (a reconciliation publishes no unknown item then).
        complete = bool(offset.get(COMPLETE, ITEMS in offset))
        return cls(str(sub) if sub else None, watermark, recent, items, complete)
