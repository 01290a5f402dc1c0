"""Hostile mail through the whole product (issue 17): Dovecot → IMAP source → Kafka → streams →
SMTP sink → the recording SMTP server, with the demo's routing and ``auth_policy: authserv``.

Each test APPENDs what an attacker can put in a mailbox and counts what reaches the SMTP server;
the ``mail.workflow`` events say why a mail got no answer, which is also how a test knows the
pipeline is done with a mail it must not answer. One pipeline serves the module: every test
uses its own senders and Message-IDs (``run``), so their counts do not mix.

The pipeline runs with ``rate_limit.max_replies: 5``, the default, instead of the demo's 1000.
"""

from __future__ import annotations

import base64
import datetime as dt
import email
import email.policy
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from imapclient import IMAPClient
from test_whole_pipeline import _config as pipeline_config

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import load_config
from connectors.core.kafka.clients import consumer_config
from mailtap.components import Pipeline, wait_for
from mailtap.dev import received, scenario

#: Hang guard of each wait; nothing asserts on timing.
STAGE_S = 120.0
#: After the last expected outcome, how long to keep watching for replies that must not come.
SETTLE_S = 8.0
MAX_REPLIES = 5
MTA = scenario.AUTHSERV_ID


@dataclass
class Outbox:
    """What the SMTP server received since the module started (it is shared by many tests)."""

    folder: Path
    seen: set[str] = field(default_factory=set)
    messages: list[received.ReceivedMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen = received.received_names(self.folder)

    def poll(self) -> list[received.ReceivedMessage]:
        new = received.received_messages(self.folder, skip=self.seen)
        self.seen.update(m.path.name for m in new)
        self.messages += new
        return self.messages

    def to(self, address: str) -> list[EmailMessage]:
        return [parsed(m) for m in self.poll() if address.lower() in map(str.lower, m.rcpt_tos)]

    def threaded(self, message_id: str) -> list[received.ReceivedMessage]:
        """Replies and forwards that name ``message_id`` in In-Reply-To or References."""
        out = []
        for m in self.poll():
            p = parsed(m)
            if f"<{message_id}>" in f"{p['In-Reply-To'] or ''} {p['References'] or ''}":
                out.append(m)
        return out


def parsed(message: received.ReceivedMessage) -> EmailMessage:
    return email.message_from_bytes(message.raw, policy=email.policy.default)  # type: ignore[return-value]


class WorkflowEvents:
    """``mail.workflow`` from the beginning, decoded."""

    def __init__(self, config_path: Path) -> None:
        config = load_config(config_path)
        self.topic = config.kafka.topics.workflow
        self.serde = AvroSerde.for_schema("WorkflowEvent", config.kafka)
        self.consumer = Consumer(
            consumer_config(config.kafka, group_id=f"sec-{uuid.uuid4().hex[:8]}")
        )
        self.assigned = False
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        if not self.assigned:
            meta = self.consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if meta is None or not meta.partitions:
                return self.records
            self.consumer.assign([TopicPartition(self.topic, p, 0) for p in meta.partitions])
            self.assigned = True
        while (msg := self.consumer.poll(0.2)) is not None:
            if not msg.error():
                self.records.append(self.serde.decode(msg.value(), self.topic))
        return self.records

    def about(self, message_id: str) -> list[dict[str, Any]]:
        return [e for e in self.poll() if message_id in (e["event_key"] or "")]

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Rig:
    services: Any
    imap: IMAPClient
    pipeline: Pipeline
    outbox: Outbox
    events: WorkflowEvents

    def append(self, *raws: bytes) -> None:
        if len(raws) == 1:
            self.imap.append("INBOX", raws[0])
        else:  # one MULTIAPPEND: the mails reach the source as one burst
            self.imap.multiappend("INBOX", list(raws))

    def wait(self, predicate: Callable[[], object], what: str) -> None:
        ok = wait_for(predicate, STAGE_S, interval=0.5)
        self.pipeline.check_alive()
        assert ok, f"{what}; streams log:\n{self.pipeline.components['streams'].log_tail(40)}"

    def settle(self) -> None:
        time.sleep(SETTLE_S)
        self.outbox.poll()


def _config(services: Any, unique: str, user: Any, tmp_path: Path) -> Path:
    """The whole-pipeline test's configuration, with the reply limit these tests probe."""
    path = pipeline_config(services, unique, user, tmp_path, f"streams-{unique}")
    doc = yaml.safe_load(path.read_text())
    doc["streams"]["rate_limit"]["max_replies"] = MAX_REPLIES
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def rig(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    unique = uuid.uuid4().hex[:10]
    tmp_path = tmp_path_factory.mktemp("security")
    user = services.add_user(f"sec-{unique}@example.com", "pw")
    config = _config(services, unique, user, tmp_path)
    outbox = Outbox(Path(services.smtp.received_dir))
    events = WorkflowEvents(config)
    with (
        Pipeline(config, tmp_path / "logs") as pipeline,
        IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client,
    ):
        client.login(user.username, user.password)
        try:
            yield Rig(services, client, pipeline, outbox, events)
        finally:
            events.close()


# -- hostile mail ---------------------------------------------------------------------------


def mta_header(sender: str, *, dkim: str | None = None, spf: str = "pass") -> str:
    """What our border MTA writes for a mail it authenticated."""
    domain = sender.rpartition("@")[2]
    parts = [f"dkim=pass header.d={dkim}" if dkim else "dkim=none"]
    parts.append(f"spf={spf} smtp.mailfrom={sender}")
    parts.append(f"dmarc={'pass' if dkim or spf == 'pass' else 'fail'} header.from={domain}")
    return f"{MTA}; " + "; ".join(parts)


def raw_mail(
    *,
    sender: str,
    to: str,
    subject: str,
    body: str,
    message_id: str,
    auth: list[str],
    name: str = "Someone",
    return_path: str | None = None,
    reply_to: str | None = None,
    in_reply_to: str | None = None,
    references: tuple[str, ...] = (),
    attachment: tuple[str, bytes] | None = None,
) -> bytes:
    """A mail as the mailbox holds it: the MTA's headers first (``auth``, topmost first).

    ``attachment`` is (the raw Content-Disposition parameters, data), so a test can write a
    filename no mail library would produce.
    """
    lines = [f"Return-Path: <{return_path or sender}>"]
    lines += [f"Authentication-Results: {value}" for value in auth]
    lines += [
        f"From: {name} <{sender}>",
        f"To: {to}",
        f"Subject: {subject}",
        f"Date: {format_datetime(dt.datetime.now(dt.UTC))}",
        f"Message-ID: <{message_id}>",
        "MIME-Version: 1.0",
    ]
    if reply_to:
        lines.append(f"Reply-To: {reply_to}")
    if in_reply_to:
        lines.append(f"In-Reply-To: <{in_reply_to}>")
    if references:
        lines.append("References: " + " ".join(f"<{r}>" for r in references))
    if attachment is None:
        lines += ["Content-Type: text/plain; charset=utf-8", "", body]
    else:
        params, data = attachment
        lines += [
            'Content-Type: multipart/mixed; boundary="b1"',
            "",
            "--b1",
            "Content-Type: text/plain; charset=utf-8",
            "",
            body,
            "--b1",
            "Content-Type: application/pdf",
            f"Content-Disposition: attachment; {params}",
            "Content-Transfer-Encoding: base64",
            "",
            base64.b64encode(data).decode(),
            "--b1--",
        ]
    return ("\r\n".join(lines) + "\r\n").encode()


def approval_request(run: str, requester: str, **extra: Any) -> tuple[str, bytes]:
    mid = f"request-{run}@example.com"
    return mid, raw_mail(
        sender=requester,
        name="Carol Dupont",
        to=scenario.APPROVALS,
        subject=f"Expense report {run}",
        body="Please approve my expenses (receipt attached).",
        message_id=mid,
        auth=[mta_header(requester, dkim="example.com")],
        attachment=extra.pop("attachment", ('filename="receipt.pdf"', b"%PDF-1.4 receipt\n")),
        **extra,
    )


def forwarded(rig: Rig, request_mid: str) -> tuple[str, tuple[str, ...]]:
    """Wait for the forward of a request to the approver: (its Message-ID, its References)."""
    found: list[EmailMessage] = []

    def forward() -> bool:
        found[:] = [
            parsed(m) for m in rig.outbox.threaded(request_mid) if scenario.APPROVER in m.rcpt_tos
        ]
        return bool(found)

    rig.wait(forward, f"the request {request_mid} was not forwarded to the approver")
    refs = tuple(r.strip("<>") for r in str(found[0]["References"] or "").split())
    return str(found[0]["Message-ID"]).strip("<>"), refs


def forged_answer(
    run: str, forward: tuple[str, tuple[str, ...]], auth: list[str], **extra: Any
) -> tuple[str, bytes]:
    mid = f"answer-{run}@example.com"
    forward_mid, refs = forward
    return mid, raw_mail(
        sender=scenario.APPROVER,
        name="Bob Boss",
        to=scenario.APPROVALS,
        subject=f"Re: [APPROVAL] Expense report {run}",
        body="APPROVE\n\nFine.",
        message_id=mid,
        auth=auth,
        in_reply_to=forward_mid,
        references=(*refs, forward_mid),
        **extra,
    )


def assert_not_approved(rig: Rig, requester: str, answer_mid: str) -> list[dict[str, Any]]:
    """The forged answer produced no decision: the requester has only its acknowledgement."""
    rig.wait(lambda: rig.events.about(answer_mid), f"no workflow event about {answer_mid}")
    rig.settle()
    to_requester = rig.outbox.to(requester)
    bodies = [m.get_body(("plain",)).get_content() for m in to_requester]  # type: ignore[union-attr]
    assert not [b for b in bodies if "was approved" in b], bodies
    assert len(to_requester) == 1, bodies  # the acknowledgement only
    statuses = [e["status"] for e in rig.events.about(answer_mid)]
    assert "APPROVED" not in statuses, statuses
    return rig.events.about(answer_mid)


def requested(rig: Rig, run: str, requester: str) -> tuple[str, tuple[str, ...]]:
    mid, raw = approval_request(run, requester)
    rig.append(raw)
    return forwarded(rig, mid)


# -- 1. the trusted Authentication-Results ------------------------------------------------


def test_forged_results_below_an_unparseable_mta_header_approve_nothing(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    requester = f"carol-{run}@example.com"
    forward = requested(rig, run, requester)
    # Our MTA's header is on top; the attacker made it unparseable through the HELO literal.
    ours = (
        f"{MTA}; dkim=none; spf=fail smtp.mailfrom=x@attacker.example "
        f"smtp.helo=[203.0.113.7]; dmarc=fail header.from=example.com"
    )
    forged = f"{MTA}; dkim=pass header.d=example.com; dmarc=pass header.from=example.com"
    answer_mid, raw = forged_answer(run, forward, [ours, forged])
    rig.append(raw)
    events = assert_not_approved(rig, requester, answer_mid)
    skipped = [e for e in events if e["status"] == "SKIPPED"]
    assert skipped and skipped[0]["attributes"]["guard"] == "sender_authentication", events
    assert "unparsable" in skipped[0]["attributes"]["reason"], events


# -- 2. who may approve --------------------------------------------------------------------


def test_dmarc_pass_for_another_domain_does_not_approve(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    requester = f"carol-{run}@example.com"
    forward = requested(rig, run, requester)
    # The MTA's own, parseable header: DMARC passed for the attacker's domain, not example.com.
    ours = f"{MTA}; dkim=none; spf=none smtp.mailfrom=x@attacker.example; dmarc=pass header.from=attacker.example"
    answer_mid, raw = forged_answer(run, forward, [ours])
    rig.append(raw)
    events = assert_not_approved(rig, requester, answer_mid)
    assert any(e["attributes"].get("guard") == "sender_authentication" for e in events), events


def test_an_approval_without_the_approvers_dkim_signature_decides_nothing(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    requester = f"carol-{run}@example.com"
    forward = requested(rig, run, requester)
    # Sent as boss@ through a host the SPF record of example.com allows (a shared outbound
    # relay): DMARC passes through SPF alignment, but no DKIM signature of example.com.
    ours = mta_header("bounces@example.com", dkim=None, spf="pass")
    answer_mid, raw = forged_answer(run, forward, [ours], return_path="bounces@example.com")
    rig.append(raw)
    assert_not_approved(rig, requester, answer_mid)


def test_the_requester_cannot_approve_their_own_request(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    requester = f"carol-{run}@example.com"
    forward = requested(rig, run, requester)
    # The requester writes as boss@ through the company's own MTA, which signs every mail of
    # example.com: DKIM and DMARC pass, but the envelope sender is the requester.
    ours = mta_header(requester, dkim="example.com")
    answer_mid, raw = forged_answer(run, forward, [ours], return_path=requester)
    rig.append(raw)
    assert_not_approved(rig, requester, answer_mid)


def test_the_approver_still_approves(rig: Rig) -> None:
    """The positive control of the three tests above: the real approver's answer decides."""
    run = uuid.uuid4().hex[:8]
    requester = f"carol-{run}@example.com"
    forward = requested(rig, run, requester)
    _, raw = forged_answer(run, forward, [mta_header(scenario.APPROVER, dkim="example.com")])
    rig.append(raw)
    rig.wait(
        lambda: any(
            "was approved" in m.get_body(("plain",)).get_content() for m in rig.outbox.to(requester)
        ),  # type: ignore[union-attr]
        "the approver's answer did not reach the requester as a decision",
    )


# -- 3. the reply rate limit ---------------------------------------------------------------


def _burst(run: str, senders: list[str], reply_to: str | None = None) -> list[bytes]:
    return [
        raw_mail(
            sender=sender,
            to=scenario.SUPPORT,
            subject=f"Printer {run} #{i}",
            body="It is broken.",
            message_id=f"bomb-{i}-{run}@customer.example",
            auth=[mta_header(sender, dkim="customer.example")],
            reply_to=reply_to,
        )
        for i, sender in enumerate(senders)
    ]


def _skips(rig: Rig, run: str) -> list[dict[str, Any]]:
    return [
        e for e in rig.events.poll() if run in (e["event_key"] or "") and e["status"] == "SKIPPED"
    ]


def _outcomes(rig: Rig, run: str) -> int:
    """Mails of the burst the pipeline is done with: acknowledged or skipped."""
    done = {e["event_key"] for e in rig.events.poll() if run in (e["event_key"] or "")}
    return len(done)


def test_thirty_mails_from_one_sender_get_at_most_max_replies(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    sender = f"bomb-{run}@customer.example"
    rig.append(*_burst(run, [sender] * 30))
    rig.wait(lambda: _outcomes(rig, run) >= 30, "not every mail of the burst was handled")
    rig.settle()
    assert len(rig.outbox.to(sender)) == MAX_REPLIES
    assert {e["attributes"]["guard"] for e in _skips(rig, run)} == {"rate_limit"}


def test_thirty_senders_answered_at_one_address_get_at_most_max_replies(rig: Rig) -> None:
    """Per recipient: 30 authenticated senders of one domain all ask for the answer to go to
    the same address of that domain (a Reply-To honoured because it is their own domain)."""
    run = uuid.uuid4().hex[:8]
    target = f"shared-{run}@customer.example"
    senders = [f"s{i}-{run}@customer.example" for i in range(30)]
    rig.append(*_burst(run, senders, reply_to=target))
    rig.wait(lambda: _outcomes(rig, run) >= 30, "not every mail of the burst was handled")
    rig.settle()
    assert len(rig.outbox.to(target)) == MAX_REPLIES


# -- 4. backscatter ------------------------------------------------------------------------


def test_reply_to_of_a_foreign_domain_gets_no_mail(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    sender = f"mallory-{run}@customer.example"
    victims = [f"victim{i}-{run}@elsewhere.example" for i in range(6)]
    mails = [
        raw_mail(
            sender=sender,
            name="Your Bank",
            to=scenario.SUPPORT,
            subject=f"Click here {run} #{i}",
            body="Buy now.",
            message_id=f"spam-{i}-{run}@customer.example",
            auth=[mta_header(sender, dkim="customer.example")],
            reply_to=victim,
        )
        for i, victim in enumerate(victims)
    ]
    rig.append(*mails)
    rig.wait(lambda: _outcomes(rig, run) >= 6, "not every mail was handled")
    rig.settle()
    assert {v: len(rig.outbox.to(v)) for v in victims} == dict.fromkeys(victims, 0)
    # The answers went to the authenticated sender, and only up to the per-sender limit.
    assert len(rig.outbox.to(sender)) == MAX_REPLIES


def test_reply_to_in_the_senders_own_domain_is_honoured(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    sender = f"alice-{run}@customer.example"
    team = f"team-{run}@customer.example"
    mid = f"teamreq-{run}@customer.example"
    rig.append(
        raw_mail(
            sender=sender,
            to=scenario.SUPPORT,
            subject=f"Printer {run}",
            body="Broken.",
            message_id=mid,
            auth=[mta_header(sender, dkim="customer.example")],
            reply_to=team,
        )
    )
    rig.wait(
        lambda: rig.outbox.to(team), "the answer did not go to the Reply-To of the sender's domain"
    )
    assert rig.outbox.to(sender) == []


# -- 5. an attachment name with CR/LF ------------------------------------------------------


def test_a_filename_with_line_breaks_is_forwarded_and_the_ack_tells_the_truth(rig: Rig) -> None:
    run = uuid.uuid4().hex[:8]
    requester = f"carol-{run}@example.com"
    mid, raw = approval_request(
        run,
        requester,
        attachment=(
            "filename*=utf-8''receipt%0D%0ABcc%3A%20x%40attacker.example%0D%0A.pdf",
            b"%PDF-1.4 receipt\n",
        ),
    )
    rig.append(raw)
    rig.wait(lambda: rig.outbox.to(requester), "the requester got no acknowledgement")
    (ack,) = rig.outbox.to(requester)
    ack_text = ack.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    # Whatever the acknowledgement says, the approver must have what it talks about (before
    # the fix the sink refused to render the forward while the acknowledgement said "sent").
    assert "passed on to boss@example.com" in ack_text, ack_text
    assert "Attachments passed on: receipt Bcc: x@attacker.example .pdf" in ack_text, ack_text
    forwarded(rig, mid)
    (fwd,) = [parsed(m) for m in rig.outbox.threaded(mid) if scenario.APPROVER in m.rcpt_tos]
    names = [part.get_filename() for part in fwd.iter_attachments()]
    assert names == ["receipt Bcc: x@attacker.example .pdf"], names
    assert [p.get_content() for p in fwd.iter_attachments()] == [b"%PDF-1.4 receipt\n"]
    for m in rig.outbox.threaded(mid):
        assert all("attacker.example" not in r for r in m.rcpt_tos), m.rcpt_tos
