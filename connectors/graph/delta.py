"""Delta pages of a mail folder -> our own types (pure: JSON in, dataclasses out).

A delta round (learn.microsoft.com/graph/delta-query-messages) pages through
``/users/{id}/mailFolders/{folder}/messages/delta``: every page but the last carries an
``@odata.nextLink``, the last an ``@odata.deltaLink`` (the cursor of the next round). A message
deleted or moved out of the folder comes back as ``{"id": ..., "@removed": {"reason": ...}}``;
any other entry is the message's current state with the ``$select``ed properties. The same
message may appear more than once in a round (message-delta: "the same change may be returned
more than once"); the last entry wins.

Wire sample (one page, ``Prefer: IdType="ImmutableId"``)::

    {"@odata.nextLink": "https://graph.microsoft.com/v1.0/users/u/mailFolders/inbox/messages/delta?$skiptoken=...",
     "value": [
       {"id": "AAkALgAAAAAAHYQDEapmEc2byACqAC-EWg0AAAA=", "changeKey": "CQAAABYAAAA",
        "isRead": false, "flag": {"flagStatus": "notFlagged"}, "categories": ["Blue"],
        "receivedDateTime": "2026-11-29T16:08:52Z", "internetMessageId": "<order-1@shop.example>",
        "parentFolderId": "AAMkAGI2..."},
       {"id": "AAkALgAAAAAAHYQDEapmEc2byACqAC-EWg0AAAB=", "@removed": {"reason": "deleted"}}]}
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connectors.graph.errors import GraphProtocolError

__all__ = ["SELECT", "DeltaPage", "MessageState", "parse_delta_page"]

#: What the event and the change detection need; the MIME comes from ``$value``.
SELECT = (
    "id",
    "changeKey",
    "isRead",
    "flag",
    "categories",
    "receivedDateTime",
    "internetMessageId",
    "parentFolderId",
)


@dataclass(frozen=True)
class MessageState:
    """One delta entry: a message's current state, or its removal from the folder."""

    message_id: str
    removed: bool
    change_key: str | None = None
    is_read: bool = False
    flagged: bool = False
    categories: tuple[str, ...] = ()
    received: dt.datetime | None = None
    internet_message_id: str | None = None

    @property
    def flags(self) -> list[str]:
        """The event's ``flags`` as the IMAP and EWS sources say them: ``\\Seen`` for a read
        message, ``\\Flagged`` for a follow-up flag, then its Outlook categories."""
        system = [f for f, on in (("\\Seen", self.is_read), ("\\Flagged", self.flagged)) if on]
        return system + list(self.categories)

    @property
    def state_digest(self) -> str:
        """What an UPDATED event reports (read, flag, categories), as 8 hex digits: the same
        state seen twice is one event. The changeKey is not part of it: Exchange changes it
        for things the event does not carry."""
        text = "\x00".join(self.flags)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class DeltaPage:
    """One page: its entries (the last per message id), and where the round goes on."""

    entries: tuple[MessageState, ...]
    next_link: str | None
    delta_link: str | None


def parse_delta_page(body: Mapping[str, Any]) -> DeltaPage:
    """A delta page's JSON -> :class:`DeltaPage`. Raises GraphProtocolError when it has neither
    link, or an entry without an id."""
    next_link = body.get("@odata.nextLink")
    delta_link = body.get("@odata.deltaLink")
    if not next_link and not delta_link:
        raise GraphProtocolError("a delta page without @odata.nextLink or @odata.deltaLink")
    raw = body.get("value")
    if not isinstance(raw, list):
        raise GraphProtocolError("a delta page without a value array")
    latest: dict[str, MessageState] = {}
    for entry in raw:
        state = parse_entry(entry)
        latest.pop(state.message_id, None)  # keep the order of the last appearance
        latest[state.message_id] = state
    return DeltaPage(tuple(latest.values()), next_link or None, delta_link or None)


def parse_entry(entry: Mapping[str, Any]) -> MessageState:
    message_id = entry.get("id")
    if not isinstance(message_id, str) or not message_id:
        raise GraphProtocolError(f"a delta entry without an id: {sorted(entry)}")
    if "@removed" in entry:
        return MessageState(message_id, removed=True)
    flag = entry.get("flag") or {}
    return MessageState(
        message_id,
        removed=False,
        change_key=entry.get("changeKey"),
        is_read=bool(entry.get("isRead")),
        flagged=flag.get("flagStatus") == "flagged",
        categories=tuple(_strings(entry.get("categories"))),
        received=_datetime(entry.get("receivedDateTime")),
        internet_message_id=entry.get("internetMessageId") or None,
    )


def _strings(value: Any) -> Sequence[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _datetime(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
