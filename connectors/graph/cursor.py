"""The Graph source's cursor: what it stores in ``mailtap.offsets`` per (account, folder).

Wire sample (value of the offsets record; key ``{"account":"ops","folder":"inbox","source":"graph"}``)::

    {"delta_link": "https://graph.microsoft.com/v1.0/users/u/mailFolders/inbox/messages/delta?$deltatoken=...",
     "next_link": null,
     "items": {"3f2a9c0d5e6b7a81": ["9d1c0e2f", "ops/mid:order-1@shop.example"]},
     "complete": true,
     "latest_from": null}

- ``delta_link``: the ``@odata.deltaLink`` of the last finished round: the next round starts
  there. ``null`` until the first round (the backfill) finished, and again after the token died
  (``410``): the folder is then synchronised from a fresh round;
- ``next_link``: the ``@odata.nextLink`` of a first round in progress (a restart continues the
  backfill there instead of listing the folder again);
- ``items``: per message the folder holds, a digest of its immutable id (16 hex digits of its
  sha256) -> [digest of the state last published (read, flag, categories;
  :attr:`~connectors.graph.delta.MessageState.state_digest`), the key published (``""``: seen
  but not published, e.g. mail already there at ``start: latest``)]. A removal (``@removed``)
  names only the id: this is where its key comes from for the tombstone check, and the same
  state returned twice is one event;
- ``complete``: ``items`` holds every message the folder had since the first start (it never
  overflowed :data:`MAX_ITEMS_BYTES`). Beyond it the oldest entries are forgotten: a removal of
  a forgotten message publishes no tombstone (connectors/graph/README.md, "Limits");
- ``latest_from``: with ``start: latest``, the instant of the first start (ISO 8601): the first
  round publishes the messages received from then on only; stored so a restart in the middle of
  that round keeps the same instant (no gap).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["GraphCursor", "Tracked", "id_digest"]

DELTA_LINK = "delta_link"
NEXT_LINK = "next_link"
ITEMS = "items"
COMPLETE = "complete"
LATEST_FROM = "latest_from"

#: Bytes of the ``items`` map (JSON) at most, so the offsets record stays under Kafka's default
#: 1 MB with the links (~8,000 messages with keys of ~40 characters).
MAX_ITEMS_BYTES = 500_000
#: Bytes of one entry besides its key (compact JSON: ``"<16>":["<8>",""],``).
_ENTRY_OVERHEAD = 34


def id_digest(message_id: str) -> str:
    """The ``items`` key of an immutable message id."""
    return hashlib.sha256(message_id.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Tracked:
    """What the folder published for one message."""

    state: str  # MessageState.state_digest published (or seen)
    key: str  # "" = seen, never published

    @property
    def published(self) -> bool:
        return bool(self.key)


@dataclass(frozen=True)
class GraphCursor:
    delta_link: str | None = None
    next_link: str | None = None
    items: Mapping[str, Tracked] = field(default_factory=dict)
    complete: bool = True
    latest_from: str | None = None

    @classmethod
    def from_offset(cls, offset: Mapping[str, Any]) -> GraphCursor:
        items = {d: Tracked(str(v[0]), str(v[1])) for d, v in (offset.get(ITEMS) or {}).items()}
        return cls(
            offset.get(DELTA_LINK) or None,
            offset.get(NEXT_LINK) or None,
            items,
            bool(offset.get(COMPLETE, True)),
            offset.get(LATEST_FROM) or None,
        )

    def to_offset(self) -> dict[str, Any]:
        return {
            DELTA_LINK: self.delta_link,
            NEXT_LINK: self.next_link,
            ITEMS: {d: [t.state, t.key] for d, t in self.items.items()},
            COMPLETE: self.complete,
            LATEST_FROM: self.latest_from,
        }

    @property
    def live(self) -> bool:
        """The first round finished: changes come from the delta link."""
        return self.delta_link is not None

    @property
    def resyncing(self) -> bool:
        """A round from scratch over messages already tracked: the delta token died (the first
        round of a folder starts with no items, or continues from its ``next_link``)."""
        return self.delta_link is None and self.next_link is None and bool(self.items)

    def tracked(self, message_id: str) -> Tracked | None:
        return self.items.get(id_digest(message_id))

    def holds_key(self, key: str) -> bool:
        return any(t.key == key for t in self.items.values())

    def keys(self) -> set[str]:
        return {t.key for t in self.items.values() if t.key}

    def advanced(
        self,
        *,
        delta_link: str | None,
        next_link: str | None,
        seen: Iterable[tuple[str, Tracked]] = (),
        gone: Iterable[str] = (),
    ) -> GraphCursor:
        """The cursor after one page: ``seen`` (message id, what was published) and ``gone``
        (message ids removed) applied, the links replaced."""
        items = dict(self.items)
        for message_id in gone:
            items.pop(id_digest(message_id), None)
        for message_id, tracked in seen:
            digest = id_digest(message_id)
            items.pop(digest, None)  # re-insert: the newest entries are the last ones kept
            items[digest] = tracked
        items, complete = _bounded(items)
        return replace(
            self,
            delta_link=delta_link,
            next_link=next_link,
            items=items,
            complete=self.complete and complete,
        )

    def without(self, digests: Iterable[str]) -> GraphCursor:
        """The cursor without these ``items`` entries (gone, found by a resync)."""
        drop = set(digests)
        return replace(self, items={d: t for d, t in self.items.items() if d not in drop})

    def restarted(self) -> GraphCursor:
        """The delta token died: the next round starts afresh, the items are kept (so the
        resync publishes only what changed)."""
        return replace(self, delta_link=None, next_link=None)


def _bounded(items: dict[str, Tracked]) -> tuple[dict[str, Tracked], bool]:
    size = sum(len(t.key) + _ENTRY_OVERHEAD for t in items.values())
    if size <= MAX_ITEMS_BYTES:
        return items, True
    kept = dict(items)
    for digest in list(kept):
        if size <= MAX_ITEMS_BYTES:
            break
        size -= len(kept.pop(digest).key) + _ENTRY_OVERHEAD
    return kept, False


def encoded_size(cursor: GraphCursor) -> int:
    """Bytes of the cursor as the offsets record stores it (for tests and the README)."""
    return len(json.dumps(cursor.to_offset(), separators=(",", ":")))
