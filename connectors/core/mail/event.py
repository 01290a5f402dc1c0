"""The ``MailEvent`` value as Python types, from the parser to the Avro encoder.

One ``TypedDict`` per record of ``schemas/MailEvent.avsc`` (and the shared
``io.mailtap.v1.Address``), named like the Avro record, with the schema's field names and
every field required: the parser writes each of them. TypedDicts and not dataclasses because
at run time a TypedDict *is* the plain dict fastavro encodes: typing the event costs nothing
per mail, where a dataclass would need a conversion to a dict before every encode (the ingest
path is CPU-bound). The same types describe what :meth:`AvroSerde.decode
<connectors.core.avro.serde.AvroSerde.decode>` returns for the current schema.

How Avro maps to Python here: ``["null", X]`` -> ``X | None``; ``array`` -> ``list``; a
nested record -> its TypedDict; an enum -> a ``Literal`` of all its symbols (``UNRECOGNIZED``
included: a reader may meet it, a writer never writes it, and the serde refuses it);
``timestamp-millis`` -> an aware ``datetime``. tests/unit/mail/test_event_schema.py fails when
these types and the schema files drift apart.

``Address`` is the one of :mod:`connectors.core.avro.shared` (the reply command has it too).
``from`` is a Python keyword, so :data:`MailEvent` uses the functional TypedDict syntax.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypedDict

from connectors.core.avro.shared import Address

__all__ = [
    "Address",
    "Attachment",
    "BlobRef",
    "ChangeKindSymbol",
    "GuardHeaderName",
    "GuardHeaders",
    "KeyKindSymbol",
    "MailEvent",
    "SourceCoordinates",
    "SourceKindSymbol",
]

#: ``io.mailtap.v1.KeyKind``.
KeyKindSymbol = Literal["MESSAGE_ID", "FINGERPRINT", "UNRECOGNIZED"]
#: ``io.mailtap.v1.ChangeKind``.
ChangeKindSymbol = Literal["ADDED", "UPDATED", "RESCANNED", "UNRECOGNIZED"]
#: ``io.mailtap.v1.SourceKind``.
SourceKindSymbol = Literal["IMAP", "EWS", "GRAPH", "UNRECOGNIZED"]


class SourceCoordinates(TypedDict):
    """``io.mailtap.v1.SourceCoordinates``: where the connector saw the mail."""

    kind: SourceKindSymbol
    folder: str
    uidvalidity: int | None
    uid: int | None
    modseq: int | None
    item_id: str | None
    change_key: str | None


class Attachment(TypedDict):
    """``io.mailtap.v1.Attachment``: one attachment, its content in the claim-check store."""

    filename: str | None
    content_type: str
    size: int
    sha256: str
    uri: str | None


class BlobRef(TypedDict):
    """``io.mailtap.v1.BlobRef``: the Avro form of
    :class:`connectors.core.claimcheck.store.BlobRef`."""

    uri: str
    sha256: str
    size: int


#: The single-header fields of :class:`GuardHeaders` (all but ``authentication_results``), for
#: code that treats them alike.
GuardHeaderName = Literal[
    "auto_submitted",
    "precedence",
    "list_id",
    "list_unsubscribe",
    "return_path",
    "x_auto_response_suppress",
    "content_type",
]


class GuardHeaders(TypedDict):
    """``io.mailtap.v1.GuardHeaders``: the headers the stream guards read, verbatim."""

    auto_submitted: str | None
    precedence: str | None
    list_id: str | None
    list_unsubscribe: str | None
    return_path: str | None
    x_auto_response_suppress: str | None
    content_type: str | None
    authentication_results: list[str]


MailEvent = TypedDict(
    "MailEvent",
    {
        "schema_version": int,
        "key": str,
        "key_kind": KeyKindSymbol,
        "change": ChangeKindSymbol,
        "account": str,
        "source": SourceCoordinates,
        "message_id": str | None,
        "in_reply_to": str | None,
        "references": list[str],
        "from": Address | None,
        "reply_to": list[Address],
        "to": list[Address],
        "cc": list[Address],
        "subject": str | None,
        "date": datetime | None,
        "internal_date": datetime | None,
        "size": int,
        "text_body": str | None,
        "html_body": str | None,
        "body_truncated": bool,
        "attachments": list[Attachment],
        "raw_ref": BlobRef | None,
        "guard_headers": GuardHeaders,
        "flags": list[str],
        "parse_error": str | None,
        "observed_at": datetime,
        "content_fingerprint": str | None,
    },
)
MailEvent.__doc__ = """``io.mailtap.v1.MailEvent``: one mail as seen in a mailbox (the value on
``mail.events``; a tombstone has no value)."""
