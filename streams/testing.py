"""An in-memory harness for testing workflows without Kafka, and a MailEvent record builder.

It drives :class:`streams.pipeline.Pipeline` exactly as the faust app does (process, then apply
the table writes), with dicts in place of the changelog-backed tables::

    harness = WorkflowHarness({"from_address": {"address": "help@example.com"},
                               "auth_policy": "none",
                               "rules": [{"workflow": "ticket_intake"}]})
    out = harness.deliver(mail_record(subject="Printer broken"))
    assert out.commands[0]["subject"] == "Re: Printer broken [#...]"
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from connectors.core.avro.replies import ReplyCommand
from streams.auth import DnsFunc, RawLoader
from streams.config import StreamsSettings
from streams.pipeline import MemoryTables, Outcome, Pipeline
from streams.workflow import BUILTIN_MODULES, Record, bind_workflows

EPOCH = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)


def _address(value: str | tuple[str, str] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        return {"name": value[0], "address": value[1]}
    return {"name": None, "address": value}


def mail_record(
    *,
    message_id: str | None = None,
    sender: str | tuple[str, str] | None = "ann@example.com",
    to: Iterable[str] = ("support@example.com",),
    reply_to: Iterable[str] = (),
    subject: str | None = "Printer on floor 3 is broken",
    text_body: str | None = "It prints only blank pages.",
    account: str = "demo",
    folder: str = "INBOX",
    in_reply_to: str | None = None,
    references: Iterable[str] = (),
    attachments: Iterable[Mapping[str, Any]] = (),
    guard_headers: Mapping[str, Any] | None = None,
    observed_at: dt.datetime = EPOCH,
    key: str | None = None,
    change: str = "ADDED",
    raw_uri: str | None = None,
    parse_error: str | None = None,
) -> Record:
    """A decoded ``MailEvent`` as :class:`connectors.core.avro.serde.AvroSerde` returns it."""
    mid = (
        message_id
        or f"{hashlib.sha256(repr((subject, sender, observed_at)).encode()).hexdigest()[:16]}@example.com"
    )
    return {
        "schema_version": 1,
        "key": key or f"{account}/{mid}",
        "key_kind": "MESSAGE_ID",
        "change": change,
        "account": account,
        "source": {
            "kind": "IMAP",
            "folder": folder,
            "uidvalidity": 1,
            "uid": 1,
            "modseq": None,
            "item_id": None,
            "change_key": None,
        },
        "message_id": mid,
        "in_reply_to": in_reply_to,
        "references": list(references),
        "from": _address(sender),
        "reply_to": [_address(a) for a in reply_to],
        "to": [_address(a) for a in to],
        "cc": [],
        "subject": subject,
        "date": observed_at,
        "internal_date": observed_at,
        "size": len(text_body or ""),
        "text_body": text_body,
        "html_body": None,
        "body_truncated": False,
        "attachments": [dict(a) for a in attachments],
        "raw_ref": {"uri": raw_uri, "sha256": "0" * 64, "size": 0} if raw_uri else None,
        "guard_headers": {
            "auto_submitted": None,
            "precedence": None,
            "list_id": None,
            "list_unsubscribe": None,
            "return_path": None,
            "x_auto_response_suppress": None,
            "content_type": "text/plain; charset=utf-8",
            "authentication_results": [],
            **(guard_headers or {}),
        },
        "flags": [],
        "parse_error": parse_error,
        "observed_at": observed_at,
    }


class WorkflowHarness:
    """Pipeline + in-memory tables; collects every command and event it produced."""

    def __init__(
        self,
        settings: StreamsSettings | Mapping[str, Any],
        *,
        modules: Iterable[str] = BUILTIN_MODULES,
        load_raw: RawLoader | None = None,
        dnsfunc: DnsFunc | None = None,
    ) -> None:
        self.settings = (
            settings
            if isinstance(settings, StreamsSettings)
            else StreamsSettings.model_validate(settings)
        )
        self.pipeline = Pipeline(
            self.settings,
            bind_workflows(self.settings, modules),
            load_raw=load_raw,
            dnsfunc=dnsfunc,
        )
        self.tables = MemoryTables()
        self.commands: list[ReplyCommand] = []
        self.events: list[Record] = []

    def deliver(self, record: Mapping[str, Any] | None) -> Outcome:
        return self._commit(self.pipeline.process(record, self.tables))

    def tick(self, now: dt.datetime) -> Outcome:
        return self._commit(self.pipeline.tick(now, self.tables))

    def sweep(self, now: dt.datetime) -> Outcome:
        """The retention sweep at ``now`` (``streams.state_retention_days``)."""
        return self._commit(self.pipeline.sweep(now, self.tables))

    def _commit(self, outcome: Outcome) -> Outcome:
        self.commands += outcome.commands
        self.events += outcome.events
        Pipeline.apply(outcome, self.tables)
        return outcome

    def statuses(self) -> list[str]:
        return [e["status"] for e in self.events]
