"""Server-side state of the EWS test server: mailboxes, folders, items and subscriptions.

Everything here is guarded by one ``threading.Condition`` (``ExchangeStore.cond``): HTTP handler
threads wait on it for new notifications, and ``deliver`` / fault injection notify it.

Streaming semantics modelled after Exchange Server:
- a subscription queues events for its folders while it is alive, whether or not a
  ``GetStreamingEvents`` connection is open; an open connection drains the queue as it writes;
- events written to a connection are gone from the queue (a connection that breaks in the middle
  of a write loses them: streaming cannot replay, exchangelib #1153);
- a new mail raises ``NewMailEvent`` and ``CreatedEvent`` for the item and ``ModifiedEvent`` for its
  folder (with ``UnreadCount``), each with its own watermark;
- a subscription with no open connection for ``subscription_idle_seconds`` expires; an expired or
  unsubscribed subscription answers ``ErrorSubscriptionNotFound``.
"""

from __future__ import annotations

import base64
import email
import email.policy
import email.utils
import itertools
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime


def _opaque_id(kind: bytes, *parts: str) -> str:
    """Opaque, base64 ids in the spirit of Exchange's ``AAMkAD...`` store ids."""
    raw = kind + b"\x00" + "\x00".join(parts).encode()
    return base64.b64encode(raw).decode()


@dataclass
class Folder:
    folder_id: str
    change_key: str
    display_name: str
    folder_class: str | None
    parent_id: str | None
    distinguished: str | None = None


@dataclass
class Item:
    item_id: str
    change_key: str
    folder_id: str
    mime: bytes
    received: datetime
    subject: str | None
    sender: tuple[str, str] | None
    to: list[tuple[str, str]]
    internet_message_id: str | None
    sent: datetime | None
    is_read: bool = False

    @property
    def size(self) -> int:
        return len(self.mime)


@dataclass
class Event:
    """One notification event: ``kind`` is the types.xsd element name (``NewMailEvent`` ...)."""

    kind: str
    watermark: str
    timestamp: datetime
    item_id: tuple[str, str] | None  # (Id, ChangeKey)
    folder_id: tuple[str, str] | None
    parent_folder_id: tuple[str, str]
    unread_count: int | None = None


@dataclass
class Subscription:
    subscription_id: str
    address: str
    folder_ids: set[str] | None  # None = SubscribeToAllFolders
    event_types: set[str]
    pending: list[Event] = field(default_factory=list)
    alive: bool = True
    open_connections: int = 0
    last_detached: float = field(default_factory=time.monotonic)
    # Increments each time a GetStreamingEvents connection takes the subscription over; an older
    # connection that sees a newer generation ends with ErrorNewEventStreamConnectionOpened.
    generation: int = 0


@dataclass
class Mailbox:
    address: str
    password: str
    folders: dict[str, Folder] = field(default_factory=dict)
    items: dict[str, Item] = field(default_factory=dict)

    def distinguished_folder(self, name: str) -> Folder | None:
        for folder in self.folders.values():
            if folder.distinguished == name:
                return folder
        return None

    def unread_count(self, folder_id: str) -> int:
        return sum(1 for i in self.items.values() if i.folder_id == folder_id and not i.is_read)


# The distinguished folders a fresh Exchange mailbox has that a mail client asks for.
_DEFAULT_FOLDERS = (
    ("root", "", None, None),
    ("msgfolderroot", "Top of Information Store", "IPF.Note", "root"),
    ("inbox", "Inbox", "IPF.Note", "msgfolderroot"),
    ("sentitems", "Sent Items", "IPF.Note", "msgfolderroot"),
    ("deleteditems", "Deleted Items", "IPF.Note", "msgfolderroot"),
    ("drafts", "Drafts", "IPF.Note", "msgfolderroot"),
    ("junkemail", "Junk Email", "IPF.Note", "msgfolderroot"),
)


class ExchangeStore:
    """Mailboxes plus live subscriptions; the single source of truth for the HTTP handlers."""

    def __init__(self, subscription_idle_seconds: float = 30 * 60) -> None:
        self.cond = threading.Condition()
        self.mailboxes: dict[str, Mailbox] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.subscription_idle_seconds = subscription_idle_seconds
        self._counter = itertools.count(1)

    # -- mailboxes ---------------------------------------------------------------------------

    def add_mailbox(self, address: str, password: str) -> Mailbox:
        with self.cond:
            mailbox = Mailbox(address=address.lower(), password=password)
            ids: dict[str, str] = {}
            for name, display, folder_class, parent in _DEFAULT_FOLDERS:
                folder_id = _opaque_id(b"F", mailbox.address, name)
                ids[name] = folder_id
                mailbox.folders[folder_id] = Folder(
                    folder_id=folder_id,
                    change_key=self._change_key(),
                    display_name=display,
                    folder_class=folder_class,
                    parent_id=ids[parent] if parent else None,
                    distinguished=name,
                )
            self.mailboxes[mailbox.address] = mailbox
            return mailbox

    def mailbox(self, address: str) -> Mailbox:
        return self.mailboxes[address.lower()]

    def _change_key(self) -> str:
        return base64.b64encode(b"CQAAABYAAA" + str(next(self._counter)).encode()).decode()

    def _watermark(self) -> str:
        return base64.b64encode(b"AQAAA" + str(next(self._counter)).zfill(10).encode()).decode()

    # -- delivery --------------------------------------------------------------------------

    def deliver(
        self,
        address: str,
        mime: bytes,
        folder: str = "inbox",
        received: datetime | None = None,
        notify: bool = True,
    ) -> Item:
        """Store ``mime`` as a new message; raise events on live subscriptions unless ``notify`` is
        false (the "missed events" fault: the item exists, no notification ever mentions it)."""
        msg = email.message_from_bytes(mime, policy=email.policy.compat32)
        with self.cond:
            mailbox = self.mailbox(address)
            target = mailbox.distinguished_folder(folder) or mailbox.folders[folder]
            # A plain UTC datetime, whatever subclass (EWSDateTime ...) the caller passed.
            now = datetime.fromtimestamp((received or datetime.now(UTC)).timestamp(), UTC)
            sender = email.utils.parseaddr(msg.get("From", ""))
            item = Item(
                item_id=_opaque_id(b"I", mailbox.address, uuid.uuid4().hex),
                change_key=self._change_key(),
                folder_id=target.folder_id,
                mime=mime,
                # Exchange stores PR_MESSAGE_DELIVERY_TIME with whole-second precision on the wire.
                received=now.replace(microsecond=0),
                subject=msg.get("Subject"),
                sender=sender if sender[1] else None,
                to=[a for a in email.utils.getaddresses(msg.get_all("To", [])) if a[1]],
                internet_message_id=(msg.get("Message-ID") or "").strip() or None,
                sent=_parse_date(msg.get("Date")),
            )
            mailbox.items[item.item_id] = item
            if notify:
                self._raise_new_mail(mailbox, target, item)
            self.cond.notify_all()
            return item

    def _raise_new_mail(self, mailbox: Mailbox, folder: Folder, item: Item) -> None:
        now = datetime.now(UTC)
        parent = (folder.folder_id, folder.change_key)
        folder.change_key = self._change_key()
        for sub in self._live_subscriptions(mailbox.address, folder.folder_id):
            for kind in ("NewMailEvent", "CreatedEvent"):
                if kind in sub.event_types:
                    sub.pending.append(
                        Event(
                            kind,
                            self._watermark(),
                            now,
                            (item.item_id, item.change_key),
                            None,
                            parent,
                        )
                    )
            if "ModifiedEvent" in sub.event_types and folder.parent_id is not None:
                grandparent = mailbox.folders[folder.parent_id]
                sub.pending.append(
                    Event(
                        "ModifiedEvent",
                        self._watermark(),
                        now,
                        None,
                        (folder.folder_id, folder.change_key),
                        (grandparent.folder_id, grandparent.change_key),
                        unread_count=mailbox.unread_count(folder.folder_id),
                    )
                )

    # -- subscriptions ---------------------------------------------------------------------

    def _live_subscriptions(self, address: str, folder_id: str) -> list[Subscription]:
        self.expire_idle()
        return [
            sub
            for sub in self.subscriptions.values()
            if sub.alive
            and sub.address == address
            and (sub.folder_ids is None or folder_id in sub.folder_ids)
        ]

    def subscribe(self, address: str, folder_ids: set[str] | None, event_types: set[str]) -> str:
        with self.cond:
            sub_id = base64.b64encode(uuid.uuid4().bytes + b"\x10" + address.encode()).decode()
            self.subscriptions[sub_id] = Subscription(sub_id, address, folder_ids, event_types)
            return sub_id

    def expire_idle(self) -> None:
        """Exchange drops a streaming subscription after 30 minutes without a connection."""
        now = time.monotonic()
        for sub in self.subscriptions.values():
            if (
                sub.alive
                and sub.open_connections == 0
                and now - sub.last_detached > self.subscription_idle_seconds
            ):
                sub.alive = False
                sub.pending.clear()

    def kill_subscription(self, sub_id: str) -> None:
        with self.cond:
            sub = self.subscriptions[sub_id]
            sub.alive = False
            sub.pending.clear()
            self.cond.notify_all()

    def live_subscription(self, sub_id: str) -> Subscription | None:
        self.expire_idle()
        sub = self.subscriptions.get(sub_id)
        return sub if sub is not None and sub.alive else None


def _parse_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).astimezone(UTC)
    except (TypeError, ValueError):
        return None
