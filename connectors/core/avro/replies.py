"""The sink's contract as Python types: ``ReplyCommand`` in (written by streams), ``DeliveryEvent``
out (written by the SMTP sink and its bounce reader).

TypedDicts, like :mod:`connectors.core.mail.event` and for the same reason: at run time they
are the plain dicts fastavro encodes, so the types cost nothing per record. One per record of
``schemas/ReplyCommand.avsc`` and ``schemas/DeliveryEvent.avsc``, named like it, every field
required; ``Address`` is the shared ``io.mailtap.v1.Address`` (:mod:`.shared`). The mapping
from Avro is the one in :mod:`connectors.core.mail.event`; tests/unit/core/test_replies_schema.py
fails when these types and the schema files drift apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypedDict

from connectors.core.avro.shared import Address

__all__ = [
    "Address",
    "AttachmentRef",
    "BounceTypeSymbol",
    "CommandKindSymbol",
    "DeliveryEvent",
    "DeliveryStatusSymbol",
    "ReplyCommand",
]

#: ``io.mailtap.v1.CommandKind``.
CommandKindSymbol = Literal["REPLY", "FORWARD", "SEND", "UNRECOGNIZED"]
#: ``io.mailtap.v1.DeliveryStatus``.
DeliveryStatusSymbol = Literal[
    "SENT", "DEFERRED", "BOUNCED", "FAILED", "SUPPRESSED", "UNKNOWN", "UNRECOGNIZED"
]
#: ``io.mailtap.v1.BounceType``.
BounceTypeSymbol = Literal["HARD", "SOFT", "UNRECOGNIZED"]


class AttachmentRef(TypedDict):
    """``io.mailtap.v1.AttachmentRef``: an attachment to send, read from the claim-check store."""

    filename: str
    content_type: str
    uri: str
    sha256: str
    size: int


ReplyCommand = TypedDict(
    "ReplyCommand",
    {
        "schema_version": int,
        "command_id": str,
        "kind": CommandKindSymbol,
        "workflow": str,
        "step": str,
        "event_key": str | None,
        "from": Address,
        "to": list[Address],
        "cc": list[Address],
        "bcc": list[Address],
        "reply_to": list[Address],
        "subject": str,
        "text_body": str | None,
        "html_body": str | None,
        "attachments": list[AttachmentRef],
        "in_reply_to": str | None,
        "references": list[str],
        "auto_submitted": str | None,
        "created_at": datetime,
    },
)
ReplyCommand.__doc__ = """``io.mailtap.v1.ReplyCommand``: a mail to send (the value on
``mail.commands`` and its retry tiers)."""


class DeliveryEvent(TypedDict):
    """``io.mailtap.v1.DeliveryEvent``: one outcome of a command, per recipient and attempt."""

    schema_version: int
    command_id: str
    message_id: str | None
    recipient: str | None
    status: DeliveryStatusSymbol
    smtp_code: int | None
    enhanced_status: str | None
    diagnostic: str | None
    bounce_type: BounceTypeSymbol | None
    attempt: int
    next_attempt_at: datetime | None
    workflow: str | None
    event_key: str | None
    occurred_at: datetime
