"""The typed, read-only view of a ``MailEvent`` that guards, routing and workflows receive.

The Avro decoder gives a plain dict (``connectors.core.avro.serde.AvroSerde.decode``); workflows should
not index into it by string, so :meth:`MailView.from_record` turns it into frozen dataclasses once.
Field names follow the schema (``schemas/MailEvent.avsc``) except ``from``, a Python keyword,
which is :attr:`MailView.sender`.

>>> import datetime as dt
>>> view = MailView.from_record({
...     "key": "acct/abc@example.com", "key_kind": "MESSAGE_ID", "change": "ADDED",
...     "account": "acct", "source": {"kind": "IMAP", "folder": "INBOX"},
...     "message_id": "abc@example.com", "from": {"name": "Ann", "address": "ann@example.com"},
...     "subject": "Printer broken", "guard_headers": {},
...     "observed_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})
>>> view.sender.address, view.folder, view.thread_ids
('ann@example.com', 'INBOX', ())
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from connectors.core.avro.shared import Address as AddressRecord


@dataclass(frozen=True, slots=True)
class Address:
    """A mailbox; mirrors the Avro record ``io.mailtap.v1.Address``."""

    address: str
    name: str | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Address:
        return cls(address=str(record["address"]), name=record.get("name"))

    def to_record(self) -> AddressRecord:
        return {"name": self.name, "address": self.address}

    @property
    def normalized(self) -> str:
        """Lower-cased address, for comparisons (local parts are case-insensitive in practice)."""
        return self.address.strip().lower()


@dataclass(frozen=True, slots=True)
class AttachmentView:
    filename: str | None
    content_type: str
    size: int
    sha256: str
    uri: str | None


@dataclass(frozen=True, slots=True)
class GuardHeaders:
    """Headers the guards read, verbatim and unfolded (RFC 3834 and friends)."""

    auto_submitted: str | None = None
    precedence: str | None = None
    list_id: str | None = None
    list_unsubscribe: str | None = None
    return_path: str | None = None
    x_auto_response_suppress: str | None = None
    content_type: str | None = None
    authentication_results: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> GuardHeaders:
        return cls(
            auto_submitted=record.get("auto_submitted"),
            precedence=record.get("precedence"),
            list_id=record.get("list_id"),
            list_unsubscribe=record.get("list_unsubscribe"),
            return_path=record.get("return_path"),
            x_auto_response_suppress=record.get("x_auto_response_suppress"),
            content_type=record.get("content_type"),
            authentication_results=tuple(record.get("authentication_results") or ()),
        )


@dataclass(frozen=True, slots=True)
class ThreadRef:
    """What is needed to answer a mail later, small enough to keep in a state table.

    A workflow that replies to an *earlier* mail (the approval decision goes to the requester
    when the approver answers) stores ``mail.thread_ref().to_state()`` and rebuilds it with
    :meth:`from_state`.
    """

    key: str
    message_id: str | None
    references: tuple[str, ...]
    subject: str | None
    reply_address: Address | None

    def to_state(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "message_id": self.message_id,
            "references": list(self.references),
            "subject": self.subject,
            "reply_address": self.reply_address.to_record() if self.reply_address else None,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ThreadRef:
        reply = state.get("reply_address")
        return cls(
            key=str(state["key"]),
            message_id=state.get("message_id"),
            references=tuple(state.get("references") or ()),
            subject=state.get("subject"),
            reply_address=Address.from_record(reply) if reply else None,
        )


def _addresses(records: Sequence[Mapping[str, Any]] | None) -> tuple[Address, ...]:
    return tuple(Address.from_record(r) for r in records or ())


def domain_of(address: str) -> str:
    """``Ann@Example.COM.`` -> ``example.com``."""
    return address.rpartition("@")[2].strip().strip(">").lower().rstrip(".")


def aligned(domain: str, from_domain: str) -> bool:
    """Relaxed alignment (RFC 7489 §3.1.1): same organisational domain, approximated by suffix."""
    domain, from_domain = domain.lower().rstrip("."), from_domain.lower().rstrip(".")
    # A bare TLD (d=com) would align with everything; real signers use at least two labels.
    return "." in domain and (
        from_domain == domain
        or from_domain.endswith("." + domain)
        or domain.endswith("." + from_domain)
    )


def answer_address(
    sender: Address | None,
    reply_to: Sequence[Address],
    return_path: str | None,
    *,
    reply_to_allow: Sequence[str] = (),
) -> Address | None:
    """Where every automatic answer to a mail goes: the one rule of mailtap.

    1. The first Reply-To, *only* when its domain is the From domain or a parent or subdomain
       of it (a team address of the sender's own organisation), or when it matches one of
       ``reply_to_allow`` (shell wildcards, ``streams.reply_to_allow``);
    2. else From: the address the sender-authentication guard vouched for;
    3. else the envelope sender (Return-Path), when not null;
    4. else nobody.

    Why not simply Reply-To, as a person's mail client does (RFC 5322 §3.6.2): an automatic
    responder answers anyone who writes, so an unchecked Reply-To turns it into a relay that
    sends mail in our name to third parties (backscatter). The sender authentication vouches
    for the From domain only; a Reply-To in that domain is the sender's own business, anything
    else is not ours to write to. Why From before the envelope sender, which RFC 3834 §4 names
    for personal responders: mailtap's answers are service responses (a ticket number, a
    decision), meant for the author; the envelope sender is often a bulk sender's bounce
    address, and From is the address DMARC authenticates.

    >>> ann = Address("ann@example.com", "Ann")
    >>> answer_address(ann, (Address("victim@elsewhere.example"),), None).address
    'ann@example.com'
    >>> answer_address(ann, (Address("team@support.example.com"),), None).address
    'team@support.example.com'
    >>> answer_address(None, (), "<bounce@example.com>").address
    'bounce@example.com'
    """
    if reply_to:
        first = reply_to[0]
        patterns = [p.strip().lower() for p in reply_to_allow]
        if (
            sender is not None and aligned(domain_of(first.address), domain_of(sender.address))
        ) or any(fnmatchcase(first.normalized, p) for p in patterns):
            return first
    if sender is not None:
        return sender
    path = (return_path or "").strip().strip("<>").strip()
    return Address(path) if "@" in path else None


@dataclass(frozen=True, slots=True)
class MailView:
    """One mail as the stream sees it. Build with :meth:`from_record`."""

    key: str
    key_kind: str
    change: str
    account: str
    source_kind: str
    folder: str
    message_id: str | None
    in_reply_to: str | None
    references: tuple[str, ...]
    sender: Address | None
    reply_to: tuple[Address, ...]
    to: tuple[Address, ...]
    cc: tuple[Address, ...]
    subject: str | None
    date: dt.datetime | None
    observed_at: dt.datetime
    text_body: str | None
    html_body: str | None
    attachments: tuple[AttachmentView, ...]
    raw_uri: str | None
    guard_headers: GuardHeaders
    flags: tuple[str, ...]
    parse_error: str | None
    reply_address: Address | None
    """Where an answer goes, decided by :func:`answer_address` (not simply Reply-To)."""

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], *, reply_to_allow: Sequence[str] = ()
    ) -> MailView:
        """``reply_to_allow``: ``streams.reply_to_allow``, see :func:`answer_address`."""
        source = record.get("source") or {}
        sender_record = record.get("from")
        sender = Address.from_record(sender_record) if sender_record else None
        reply_to = _addresses(record.get("reply_to"))
        raw_ref = record.get("raw_ref")
        guard_headers = GuardHeaders.from_record(record.get("guard_headers") or {})
        return cls(
            key=str(record["key"]),
            key_kind=str(record.get("key_kind", "MESSAGE_ID")),
            change=str(record.get("change", "ADDED")),
            account=str(record["account"]),
            source_kind=str(source.get("kind", "IMAP")),
            folder=str(source.get("folder", "")),
            message_id=record.get("message_id"),
            in_reply_to=record.get("in_reply_to"),
            references=tuple(record.get("references") or ()),
            sender=sender,
            reply_to=reply_to,
            to=_addresses(record.get("to")),
            cc=_addresses(record.get("cc")),
            subject=record.get("subject"),
            date=record.get("date"),
            observed_at=record["observed_at"],
            text_body=record.get("text_body"),
            html_body=record.get("html_body"),
            attachments=tuple(
                AttachmentView(
                    filename=a.get("filename"),
                    content_type=str(a["content_type"]),
                    size=int(a["size"]),
                    sha256=str(a["sha256"]),
                    uri=a.get("uri"),
                )
                for a in record.get("attachments") or ()
            ),
            raw_uri=raw_ref["uri"] if raw_ref else None,
            guard_headers=guard_headers,
            flags=tuple(record.get("flags") or ()),
            parse_error=record.get("parse_error"),
            reply_address=answer_address(
                sender, reply_to, guard_headers.return_path, reply_to_allow=reply_to_allow
            ),
        )

    @property
    def recipients(self) -> tuple[Address, ...]:
        return self.to + self.cc

    @property
    def thread_ids(self) -> tuple[str, ...]:
        """Message-IDs this mail answers: In-Reply-To first, then References newest first."""
        ids: list[str] = []
        for mid in (self.in_reply_to, *reversed(self.references)):
            if mid and mid not in ids:
                ids.append(mid)
        return tuple(ids)

    def thread_ref(self) -> ThreadRef:
        return ThreadRef(
            key=self.key,
            message_id=self.message_id,
            references=self.references,
            subject=self.subject,
            reply_address=self.reply_address,
        )
