"""The soak's seeded workload, driven over IMAP as users and MTAs would drive the mailboxes.

Each step picks one action with the run's `random.Random`: a new ticket, a follow-up in a
ticket's thread, an approval request, a flag change, a move between the watched folders, a
delete, a ticket from an address that bounces, a broken mail. Two reactions follow the relay:
the approver answers each forward (APPROVE or REJECT, threaded under the forward), and a mail
the relay accepted for ``@bounce.example`` comes back as an RFC 3464 DSN in the bounce mailbox.

Every appended Message-ID is reported to the verifier's ledger (``appended``) before the APPEND,
so an event for anything else is a mail that never existed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import format_datetime

from imapclient import IMAPClient

from mailtap.dev import scenario
from mailtap.soak.relay import SoakRelay

log = logging.getLogger(__name__)

WATCHED = ("INBOX", "Work")
BOUNCE_DOMAIN = "bounce.example"
PASSWORD = "soak"
MAX_CONNECTIONS = 12
#: Action weights of one workload step.
ACTIONS = {
    "ticket": 30,
    "followup": 14,
    "approval": 8,
    "flags": 16,
    "move": 12,
    "delete": 8,
    "bounce": 4,
    "broken": 2,
}


@dataclass
class Mailbox:
    account: str
    username: str
    #: Message-IDs of the workload's mails on the server, with their folder
    mails: dict[str, str] = field(default_factory=dict)
    tickets: list[str] = field(default_factory=list)
    client: IMAPClient | None = None


@dataclass
class Workload:
    host: str
    port: int
    mailboxes: list[Mailbox]
    bounce: Mailbox
    relay: SoakRelay
    rng: random.Random
    appended: Callable[[str, str], None]
    step_seconds: float = 1.0
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _relay_seen: int = 0
    _approval_of: dict[str, str] = field(default_factory=dict)  # request mid -> account
    _answered: set[str] = field(default_factory=set)
    _decided: set[str] = field(default_factory=set)  # approval requests answered
    _serial: int = 0
    _recent: list[Mailbox] = field(default_factory=list)  # mailboxes with an open client

    def prepare(self) -> None:
        for box in [*self.mailboxes, self.bounce]:
            client = self._client(box)
            for folder in WATCHED:
                if not client.folder_exists(folder):
                    client.create_folder(folder)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True, name="soak-workload")
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        names, weights = list(ACTIONS), list(ACTIONS.values())
        while not self._stop.wait(self.step_seconds):
            action = self.rng.choices(names, weights)[0]
            box = self.rng.choice(self.mailboxes)
            step: Callable[[Mailbox], None] = getattr(self, f"_do_{action}")
            self._guarded(action, functools.partial(step, box), box)
            self._guarded("react", self._react, self.bounce)

    def _guarded(self, action: str, step: Callable[[], None], box: Mailbox) -> None:
        """IMAP errors (Dovecot restarting) cost the step, never the run: a new connection next."""
        try:
            step()
        except Exception as exc:
            self.errors[type(exc).__name__] += 1
            log.info("workload %s on %s failed: %r", action, box.account, exc)
            box.client = None

    # --- IMAP plumbing -----------------------------------------------------------------------

    def _client(self, box: Mailbox) -> IMAPClient:
        if box.client is None:
            self._make_room()
            client = IMAPClient(self.host, port=self.port, ssl=False, timeout=20)
            client.login(box.username, PASSWORD)
            box.client = client
        self._recent = [b for b in self._recent if b is not box] + [box]
        return box.client

    def _make_room(self) -> None:
        """At most `MAX_CONNECTIONS` open: the sources hold one IMAP process per watched folder
        and the dev Dovecot serves 256 (``service imap { process_limit }``)."""
        while len(self._recent) >= MAX_CONNECTIONS:
            oldest = self._recent.pop(0)
            if oldest.client is not None:
                with contextlib.suppress(Exception):
                    oldest.client.logout()
                oldest.client = None

    def _mid(self, kind: str, domain: str = "customer.example") -> str:
        self._serial += 1
        return f"soak-{kind}-{self._serial}-{self.rng.getrandbits(32):08x}@{domain}"

    def _append(self, box: Mailbox, raw: bytes, mid: str, folder: str = "INBOX") -> None:
        self.appended(box.account, mid)
        self._client(box).append(folder, raw)
        box.mails[mid] = folder

    def _uid(self, box: Mailbox, mid: str) -> tuple[IMAPClient, list[int]] | None:
        folder = box.mails.get(mid)
        if folder is None:
            return None
        client = self._client(box)
        client.select_folder(folder)
        return client, list(client.search(["HEADER", "Message-ID", mid]))

    # --- actions -----------------------------------------------------------------------------

    def _do_ticket(self, box: Mailbox) -> None:
        mid = self._mid("ticket")
        sender = f"customer{self.rng.randrange(50)}@customer.example"
        raw = mail(sender, scenario.SUPPORT, f"Ticket {self._serial}: printer jam", mid)
        self._append(box, raw, mid)
        box.tickets.append(mid)
        self.counts["ticket"] += 1

    def _do_followup(self, box: Mailbox) -> None:
        live = [t for t in box.tickets if t in box.mails]
        if not live:
            return self._do_ticket(box)
        parent = self.rng.choice(live)
        mid = self._mid("followup")
        raw = mail(
            "customer1@customer.example",
            scenario.SUPPORT,
            "Re: printer jam",
            mid,
            in_reply_to=parent,
            references=(parent,),
        )
        self._append(box, raw, mid)
        self.counts["followup"] += 1
        return None

    def _do_approval(self, box: Mailbox) -> None:
        mid = self._mid("expense", "example.com")
        raw = mail(scenario.REQUESTER, scenario.APPROVALS, f"Expense {self._serial}: 120 EUR", mid)
        self._approval_of[mid] = box.account
        self._append(box, raw, mid)
        self.counts["approval"] += 1

    def _do_flags(self, box: Mailbox) -> None:
        if not box.mails:
            return
        found = self._uid(box, self.rng.choice(sorted(box.mails)))
        if found and found[1]:
            client, uids = found
            flag = self.rng.choice([b"\\Seen", b"\\Flagged", b"$Soak"])
            if self.rng.random() < 0.5:
                client.add_flags(uids, [flag])
            else:
                client.remove_flags(uids, [flag])
            self.counts["flags"] += 1

    def _do_move(self, box: Mailbox) -> None:
        if not box.mails:
            return
        mid = self.rng.choice(sorted(box.mails))
        found = self._uid(box, mid)
        if found and found[1]:
            client, uids = found
            target = "Work" if box.mails[mid] == "INBOX" else "INBOX"
            client.move(uids, target)
            box.mails[mid] = target
            self.counts["move"] += 1

    def _do_delete(self, box: Mailbox) -> None:
        if not box.mails:
            return
        mid = self.rng.choice(sorted(box.mails))
        found = self._uid(box, mid)
        if found and found[1]:
            client, uids = found
            client.delete_messages(uids)
            client.uid_expunge(uids)
            del box.mails[mid]
            self.counts["delete"] += 1

    def _do_bounce(self, box: Mailbox) -> None:
        mid = self._mid("doomed")
        sender = f"gone{self.rng.randrange(1000)}@{BOUNCE_DOMAIN}"
        raw = mail(sender, scenario.SUPPORT, f"Ticket {self._serial}: where is my parcel", mid)
        self._append(box, raw, mid)
        self.counts["bounce"] += 1

    def _do_broken(self, box: Mailbox) -> None:
        mid = self._mid("broken")
        raw = (
            f"Message-ID: <{mid}>\r\nFrom: broken@customer.example\r\nTo: {scenario.SUPPORT}\r\n"
            "Subject: =?utf-8?B?broken?=\r\nMIME-Version: 1.0\r\n"
            'Content-Type: multipart/mixed; boundary="never-closed"\r\n\r\n'
            "--never-closed\r\nContent-Type: text/plain; charset=x-unknown\r\n"
            "Content-Transfer-Encoding: base64\r\n\r\n%%% not base64 %%%\r\n"
        ).encode()
        self._append(box, raw, mid)
        self.counts["broken"] += 1

    # --- reactions to what the relay got ---------------------------------------------------

    def _react(self) -> None:
        relayed = self.relay.snapshot(self._relay_seen)
        for sent in relayed:
            self._relay_seen += 1
            if sent.message_id in self._answered:
                continue  # a resent copy (UNKNOWN outcome): one answer per mail
            if scenario.APPROVER in sent.rcpt_tos:
                self._answer_forward(sent.message_id, sent.in_reply_to, sent.references)
            doomed = [r for r in sent.rcpt_tos if r.endswith(f"@{BOUNCE_DOMAIN}")]
            if doomed:
                self._dsn(sent.message_id, doomed[0])
            self._answered.add(sent.message_id)

    def _answer_forward(self, forward: str, in_reply_to: str, refs: tuple[str, ...]) -> None:
        request = next((r for r in (*refs, in_reply_to) if r in self._approval_of), None)
        if request is None or request in self._decided:
            # Not a forward (a confirmation, an "already decided" answer): answering those
            # would loop between the approver and the workflow.
            return
        self._decided.add(request)
        box = next(b for b in self.mailboxes if b.account == self._approval_of[request])
        mid = self._mid("decision", "example.com")
        decision = self.rng.choice(["APPROVE", "REJECT"])
        raw = mail(
            scenario.APPROVER,
            scenario.APPROVALS,
            "Re: expense",
            mid,
            in_reply_to=forward,
            references=(*refs, forward),
            body=f"{decision}\n\n> Please approve",
        )
        self._append(box, raw, mid)
        self.counts["approver_answer"] += 1

    def _dsn(self, original: str, recipient: str) -> None:
        mid = self._mid("dsn", "relay.example")
        self._append(self.bounce, dsn(mid, original, recipient), mid)
        self.counts["dsn"] += 1


def mail(
    sender: str,
    to: str,
    subject: str,
    mid: str,
    *,
    in_reply_to: str | None = None,
    references: tuple[str, ...] = (),
    body: str = "Hello,\n\nplease have a look.\n",
) -> bytes:
    """A mail as our border MTA hands it over (with its Authentication-Results)."""
    msg = EmailMessage()
    domain = sender.rpartition("@")[2]
    msg["Return-Path"] = f"<{sender}>"
    msg["Authentication-Results"] = (
        f"{scenario.AUTHSERV_ID}; dkim=pass header.d={domain}; spf=pass "
        f"smtp.mailfrom={sender}; dmarc=pass header.from={domain}"
    )
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = format_datetime(dt.datetime.now(dt.UTC))
    msg["Message-ID"] = f"<{mid}>"
    if in_reply_to:
        msg["In-Reply-To"] = f"<{in_reply_to}>"
    if references:
        msg["References"] = " ".join(f"<{r}>" for r in references)
    msg.set_content(body)
    return bytes(msg)


def dsn(mid: str, original: str, recipient: str) -> bytes:
    """An RFC 3464 delivery status notification for ``original`` (5.1.1, user unknown)."""
    date = format_datetime(dt.datetime.now(dt.UTC))
    boundary = f"dsn-{mid.partition('@')[0]}"
    return (
        f"Return-Path: <>\r\nFrom: Mail Delivery System <MAILER-DAEMON@relay.example>\r\n"
        f"To: {scenario.HELPDESK}\r\nSubject: Undelivered Mail Returned to Sender\r\n"
        f"Date: {date}\r\nMessage-ID: <{mid}>\r\nAuto-Submitted: auto-replied\r\n"
        f"MIME-Version: 1.0\r\n"
        f'Content-Type: multipart/report; report-type=delivery-status; boundary="{boundary}"\r\n'
        f"\r\n--{boundary}\r\nContent-Type: text/plain\r\n\r\n"
        f"Your message could not be delivered to {recipient}.\r\n"
        f"\r\n--{boundary}\r\nContent-Type: message/delivery-status\r\n\r\n"
        f"Reporting-MTA: dns; relay.example\r\nArrival-Date: {date}\r\n\r\n"
        f"Final-Recipient: rfc822; {recipient}\r\nAction: failed\r\nStatus: 5.1.1\r\n"
        f"Diagnostic-Code: smtp; 550 5.1.1 <{recipient}>: user unknown\r\n"
        f"\r\n--{boundary}\r\nContent-Type: text/rfc822-headers\r\n\r\n"
        f"From: {scenario.HELPDESK}\r\nTo: {recipient}\r\nMessage-ID: <{original}>\r\n"
        f"Subject: Re: your ticket\r\n\r\n--{boundary}--\r\n"
    ).encode()
