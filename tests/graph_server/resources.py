"""JSON renderings of Graph resources and errors, as Microsoft Learn documents them. Pure.

- message: https://learn.microsoft.com/en-us/graph/api/resources/message
- mailFolder: https://learn.microsoft.com/en-us/graph/api/resources/mailfolder
- error body: https://learn.microsoft.com/en-us/graph/errors ("Error resource type")

A message as a delta page carries it (delta-query-messages, sample responses)::

    {"@odata.type": "#microsoft.graph.message",
     "@odata.etag": "W/\\"CQAAABYAAAARn2vdzPFjSbaPPxzjlzOTAAASsKZz\\"",
     "subject": "Holiday hours update", "isRead": false, "id": "AAMkADNkNAAASq35xAAA="}
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from .mailbox import Mailbox, MailFolder, Message

#: Properties of ``microsoft.graph.message`` the server can render; ``$select`` of anything
#: else is refused as Graph refuses an unknown property.
MESSAGE_PROPERTIES = (
    "id",
    "createdDateTime",
    "lastModifiedDateTime",
    "changeKey",
    "categories",
    "receivedDateTime",
    "sentDateTime",
    "hasAttachments",
    "internetMessageId",
    "subject",
    "parentFolderId",
    "conversationId",
    "isRead",
    "isDraft",
    "from",
    "sender",
    "toRecipients",
    "ccRecipients",
    "flag",
)


def graph_datetime(value: datetime) -> str:
    """``2016-12-31T00:00:00Z``: UTC, seconds, a ``Z`` (Graph's DateTimeOffset rendering)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _recipient(pair: tuple[str, str]) -> dict[str, Any]:
    name, address = pair
    return {"emailAddress": {"name": name or address, "address": address}}


def message_json(
    message: Message, *, immutable: bool, select: Iterable[str] | None
) -> dict[str, Any]:
    """One message; ``immutable`` picks the id type (``Prefer: IdType="ImmutableId"``)."""
    sender = _recipient(message.sender) if message.sender else None
    full: dict[str, Any] = {
        "id": message.immutable_id if immutable else message.rest_id,
        "createdDateTime": graph_datetime(message.created),
        "lastModifiedDateTime": graph_datetime(message.modified),
        "changeKey": message.change_key,
        "categories": list(message.categories),
        "receivedDateTime": graph_datetime(message.received),
        "sentDateTime": graph_datetime(message.received),
        "hasAttachments": message.has_attachments,
        "internetMessageId": message.internet_message_id,
        "subject": message.subject,
        "parentFolderId": message.folder_id,
        "conversationId": message.conversation_id,
        "isRead": message.is_read,
        "isDraft": False,
        "from": sender,
        "sender": sender,
        "toRecipients": [_recipient(r) for r in message.to_recipients],
        "ccRecipients": [_recipient(r) for r in message.cc_recipients],
        "flag": {"flagStatus": message.flag_status},
    }
    wanted = MESSAGE_PROPERTIES if select is None else ("id", *select)
    body: dict[str, Any] = {
        "@odata.type": "#microsoft.graph.message",
        "@odata.etag": f'W/"{message.change_key}"',
    }
    body.update({name: full[name] for name in wanted})
    return body


def removed_json(message_id: str) -> dict[str, Any]:
    """A message that left the folder (deleted, or moved out): delta-query-messages."""
    return {
        "@odata.type": "#microsoft.graph.message",
        "id": message_id,
        "@removed": {"reason": "deleted"},
    }


#: Properties of ``microsoft.graph.mailFolder`` the server renders (``$select`` checks them).
FOLDER_PROPERTIES = (
    "id",
    "displayName",
    "parentFolderId",
    "childFolderCount",
    "unreadItemCount",
    "totalItemCount",
    "sizeInBytes",
    "isHidden",
)


def folder_json(
    mailbox: Mailbox, folder: MailFolder, select: Iterable[str] | None = None
) -> dict[str, Any]:
    """One mail folder; with ``select`` only those properties and ``id``."""
    messages = [m for m in mailbox.messages.values() if m.folder_id == folder.folder_id]
    full: dict[str, Any] = {
        "id": folder.folder_id,
        "displayName": folder.display_name,
        "parentFolderId": folder.parent_id,
        "childFolderCount": sum(
            1 for f in mailbox.folders.values() if f.parent_id == folder.folder_id
        ),
        "unreadItemCount": sum(1 for m in messages if not m.is_read),
        "totalItemCount": len(messages),
        "sizeInBytes": sum(len(m.mime) for m in messages),
        "isHidden": False,
    }
    wanted = FOLDER_PROPERTIES if select is None else ("id", *select)
    return {name: full[name] for name in wanted}


def error_json(code: str, message: str, client_request_id: str | None = None) -> dict[str, Any]:
    """Graph's error body: ``{"error": {"code", "message", "innerError": {...}}}``."""
    request_id = str(uuid.uuid4())
    inner: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        "request-id": request_id,
        "client-request-id": client_request_id or request_id,
    }
    return {"error": {"code": code, "message": message, "innerError": inner}}
