"""One real record per topic schema, every optional part filled, as mailtap's writers build them,
and the schema helpers the contract tests share (history check, Java Avro, the registry)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from connectors.core.avro.schemas import TOPIC_SCHEMAS, assemble, shared_types

#: The default symbol of every enum, for readers only (schemas/README.md, "Enums").
PLACEHOLDER = "UNRECOGNIZED"
NAMED = ("record", "error", "enum", "fixed")


def full_name(node: dict[str, Any], namespace: str) -> str:
    name = node["name"]
    return name if "." in name else f"{node.get('namespace', namespace)}.{name}"


def definitions(node: Any, namespace: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named type defined in a raw schema: (full name, definition)."""
    if isinstance(node, list):
        for branch in node:
            yield from definitions(branch, namespace)
    elif isinstance(node, dict):
        kind = node.get("type")
        if kind in NAMED:
            yield full_name(node, namespace), node
            namespace = node.get("namespace", namespace)
            for field in node.get("fields", []):
                yield from definitions(field["type"], namespace)
        elif kind == "array":
            yield from definitions(node["items"], namespace)
        elif kind == "map":
            yield from definitions(node["values"], namespace)
        else:
            yield from definitions(kind, namespace)


def current(root: Path) -> dict[str, dict[str, Any]]:
    """The assembled (self-contained) topic schemas of ``root``."""
    shared = shared_types(root)
    return {
        name: assemble(json.loads((root / f"{name}.avsc").read_text()), shared)
        for name in TOPIC_SCHEMAS
    }


#: Enum symbols only a source released after v1 writes (schemas/README.md, "Compatibility"):
#: a v1 deployment upgrades its readers before it starts that source, so the v1 check leaves
#: them out as it leaves out the placeholder. Nothing else may be listed here.
LATER_SOURCE_SYMBOLS = {"SourceKind": ("GRAPH",)}


def without_placeholder(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as the writers a v1 reader can meet use it: the reader-only enum symbol
    removed, and the symbols only later sources write (:data:`LATER_SOURCE_SYMBOLS`)."""
    copied: dict[str, Any] = json.loads(json.dumps(schema))
    for name, node in definitions(copied, copied["namespace"]):
        if node["type"] == "enum" and PLACEHOLDER in node["symbols"]:
            node["symbols"].remove(PLACEHOLDER)
            node.pop("default", None)
            for symbol in LATER_SOURCE_SYMBOLS.get(name.rpartition(".")[2], ()):
                node["symbols"].remove(symbol)
        for field in node.get("fields", []):
            if field.get("default") == PLACEHOLDER:  # ChangeKind's field default
                del field["default"]
    return copied


NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

ADDRESS = {"name": "Zoë Ünal", "address": "zoe@example.com"}


def mail_event() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "key": "demo/mid:abc@example.com",
        "key_kind": "MESSAGE_ID",
        "change": "ADDED",
        "account": "demo",
        "source": {
            "kind": "IMAP",
            "folder": "INBOX",
            "uidvalidity": 1700000000,
            "uid": 42,
            "modseq": 9,
            "item_id": None,
            "change_key": None,
        },
        "message_id": "abc@example.com",
        "in_reply_to": "prev@example.com",
        "references": ["root@example.com", "prev@example.com"],
        "from": ADDRESS,
        "reply_to": [{"name": None, "address": "replies@example.com"}],
        "to": [{"name": None, "address": "demo@example.com"}],
        "cc": [{"name": "Ops", "address": "ops@example.com"}],
        "subject": "Grüße 你好",
        "date": NOW,
        "internal_date": NOW,
        "size": 4096,
        "text_body": "Hallo\n",
        "html_body": "<p>Hallo</p>",
        "body_truncated": False,
        "attachments": [
            {
                "filename": "Rechnung März.pdf",
                "content_type": "application/pdf",
                "size": 1234,
                "sha256": SHA,
                "uri": f"file:///claims/{SHA}",
            }
        ],
        "raw_ref": {"uri": f"file:///claims/{SHA}", "sha256": SHA, "size": 4096},
        "guard_headers": {
            "auto_submitted": None,
            "precedence": None,
            "list_id": None,
            "list_unsubscribe": None,
            "return_path": "<zoe@example.com>",
            "x_auto_response_suppress": None,
            "content_type": "multipart/mixed",
            "authentication_results": ["mx.example.com; dkim=pass header.d=example.com"],
        },
        "flags": ["\\Seen"],
        "parse_error": None,
        "observed_at": NOW,
        "content_fingerprint": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    }


def reply_command() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "command_id": "c" * 64,
        "kind": "REPLY",
        "workflow": "ticket_intake",
        "step": "answer",
        "event_key": "demo/mid:abc@example.com",
        "from": {"name": "Support", "address": "support@example.com"},
        "to": [ADDRESS],
        "cc": [],
        "bcc": [{"name": None, "address": "archive@example.com"}],
        "reply_to": [],
        "subject": "Re: Grüße 你好",
        "text_body": "Ticket T-1 opened.\n",
        "html_body": None,
        "attachments": [
            {
                "filename": "T-1.txt",
                "content_type": "text/plain",
                "uri": f"file:///claims/{SHA}",
                "sha256": SHA,
                "size": 12,
            }
        ],
        "in_reply_to": "abc@example.com",
        "references": ["root@example.com", "abc@example.com"],
        "auto_submitted": "auto-replied",
        "created_at": NOW,
    }


def delivery_event() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "command_id": "c" * 64,
        "message_id": "mailtap.cccc@example.com",
        "recipient": "zoe@example.com",
        "status": "BOUNCED",
        "smtp_code": 550,
        "enhanced_status": "5.1.1",
        "diagnostic": "550 5.1.1 no such user",
        "bounce_type": "HARD",
        "attempt": 2,
        "next_attempt_at": None,
        "workflow": "ticket_intake",
        "event_key": "demo/mid:abc@example.com",
        "occurred_at": NOW,
    }


def workflow_event() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "instance_id": "T-1",
        "workflow": "ticket_intake",
        "status": "TICKET_OPENED",
        "event_key": "demo/mid:abc@example.com",
        "attributes": {"queue": "support"},
        "occurred_at": NOW,
    }


def suppression() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "address": "zoe@xn--bcher-kva.example",
        "suppressed": True,
        "reason": "HARD_BOUNCE",
        "detail": "5.1.1 550 5.1.1 no such user",
        "source": "bounce-reader",
        "command_id": "c" * 64,
        "soft_bounces": [NOW],
        "updated_at": NOW,
    }


SAMPLES = {
    "MailEvent": mail_event,
    "ReplyCommand": reply_command,
    "DeliveryEvent": delivery_event,
    "WorkflowEvent": workflow_event,
    "Suppression": suppression,
}
#: Default topic of each schema.
TOPICS = {
    "MailEvent": "mail.events",
    "ReplyCommand": "mail.commands",
    "DeliveryEvent": "mail.delivery",
    "WorkflowEvent": "mail.workflow",
    "Suppression": "mail.suppressions",
}
