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
- a change of the read state or the categories gives the item a new ChangeKey and raises
  ``ModifiedEvent`` for the item (``ItemId`` + ``ParentFolderId``) and, when the read state
  changed, for its folder (``UnreadCount``);
- a move gives the item a new ItemId (as ``MoveItem`` does) and raises one ``MovedEvent``
  (``ItemId``, ``ParentFolderId``, ``OldItemId``, ``OldParentFolderId``, types.xsd
  ``MovedCopiedEventType``) on the subscriptions of the old and the new folder; a copy raises
  ``CopiedEvent`` (same shape, ``OldItemId`` = the original) likewise; a hard delete raises
  ``DeletedEvent`` (``ItemId`` + ``ParentFolderId``); a soft delete is a move to Deleted Items;
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
    categories: list[str] = field(default_factory=list)
    #: PidTagFlagStatus (0x1090): 0 none, 1 complete, 2 flagged (Outlook's follow-up flag).
    flag_status: int = 0

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
    old_item_id: tuple[str, str] | None = None  # MovedEvent / CopiedEvent
    old_parent_folder_id: tuple[str, str] | None = None


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

    # -- changes to existing items (a mail client's actions) -----------------------------------

    def update_item(
        self,
        address: str,
        item_id: str,
        *,
        is_read: bool | None = None,
        categories: list[str] | None = None,
        flag_status: int | None = None,
        notify: bool = True,
    ) -> Item:
        """``UpdateItem``: a new ChangeKey; ``ModifiedEvent`` for the item (and for its folder when
        the read state changed, with the new ``UnreadCount``)."""
        with self.cond:
            mailbox = self.mailbox(address)
            item = mailbox.items[item_id]
            read_changed = is_read is not None and is_read != item.is_read
            if is_read is not None:
                item.is_read = is_read
            if categories is not None:
                item.categories = list(categories)
            if flag_status is not None:
                item.flag_status = flag_status
            item.change_key = self._change_key()
            folder = mailbox.folders[item.folder_id]
            if notify:
                now = datetime.now(UTC)
                for sub in self._live_subscriptions(address, folder.folder_id):
                    if "ModifiedEvent" in sub.event_types:
                        sub.pending.append(
                            Event(
                                "ModifiedEvent",
                                self._watermark(),
                                now,
                                (item.item_id, item.change_key),
                                None,
                                (folder.folder_id, folder.change_key),
                            )
                        )
                if read_changed:
                    self._folder_modified(mailbox, folder)
            self.cond.notify_all()
            return item

    def move_item(self, address: str, item_id: str, folder: str, *, notify: bool = True) -> Item:
        """``MoveItem``: the item gets a new id in ``folder`` (a distinguished name or a folder id)."""
        with self.cond:
            mailbox = self.mailbox(address)
            item = mailbox.items.pop(item_id)
            source = mailbox.folders[item.folder_id]
            target = mailbox.distinguished_folder(folder) or mailbox.folders[folder]
            old = (item.item_id, item.change_key)
            item.item_id = _opaque_id(b"I", mailbox.address, uuid.uuid4().hex)
            item.change_key = self._change_key()
            item.folder_id = target.folder_id
            mailbox.items[item.item_id] = item
            if notify:
                self._raise_moved_copied("MovedEvent", mailbox, item, old, source, target)
            self.cond.notify_all()
            return item

    def copy_item(self, address: str, item_id: str, folder: str, *, notify: bool = True) -> Item:
        """``CopyItem``: a new item with the same content (and receive time) in ``folder``."""
        with self.cond:
            mailbox = self.mailbox(address)
            original = mailbox.items[item_id]
            source = mailbox.folders[original.folder_id]
            target = mailbox.distinguished_folder(folder) or mailbox.folders[folder]
            copy = Item(
                item_id=_opaque_id(b"I", mailbox.address, uuid.uuid4().hex),
                change_key=self._change_key(),
                folder_id=target.folder_id,
                mime=original.mime,
                received=original.received,
                subject=original.subject,
                sender=original.sender,
                to=list(original.to),
                internet_message_id=original.internet_message_id,
                sent=original.sent,
                is_read=original.is_read,
                categories=list(original.categories),
                flag_status=original.flag_status,
            )
            mailbox.items[copy.item_id] = copy
            if notify:
                old = (original.item_id, original.change_key)
                self._raise_moved_copied("CopiedEvent", mailbox, copy, old, source, target)
            self.cond.notify_all()
            return copy

    def delete_item(self, address: str, item_id: str, *, notify: bool = True) -> None:
        """``DeleteItem`` with ``DeleteType="HardDelete"``: ``DeletedEvent`` for the item.
        (A ``MoveToDeletedItems`` delete is :meth:`move_item` to ``deleteditems``.)"""
        with self.cond:
            mailbox = self.mailbox(address)
            item = mailbox.items.pop(item_id)
            folder = mailbox.folders[item.folder_id]
            if notify:
                now = datetime.now(UTC)
                for sub in self._live_subscriptions(address, folder.folder_id):
                    if "DeletedEvent" in sub.event_types:
                        sub.pending.append(
                            Event(
                                "DeletedEvent",
                                self._watermark(),
                                now,
                                (item.item_id, item.change_key),
                                None,
                                (folder.folder_id, folder.change_key),
                            )
                        )
                self._folder_modified(mailbox, folder)
            self.cond.notify_all()

    def _raise_moved_copied(
        self,
        kind: str,
        mailbox: Mailbox,
        item: Item,
        old: tuple[str, str],
        source: Folder,
        target: Folder,
    ) -> None:
        now = datetime.now(UTC)
        old_parent = (source.folder_id, source.change_key)
        source.change_key = self._change_key()
        target.change_key = self._change_key()
        subs = {
            sub.subscription_id: sub
            for folder_id in (source.folder_id, target.folder_id)
            for sub in self._live_subscriptions(mailbox.address, folder_id)
        }
        for sub in subs.values():
            if kind in sub.event_types:
                sub.pending.append(
                    Event(
                        kind,
                        self._watermark(),
                        now,
                        (item.item_id, item.change_key),
                        None,
                        (target.folder_id, target.change_key),
                        old_item_id=old,
                        old_parent_folder_id=old_parent,
                    )
                )
        for folder in (source, target) if kind == "MovedEvent" else (target,):
            self._folder_modified(mailbox, folder)

    def _folder_modified(self, mailbox: Mailbox, folder: Folder) -> None:
        """``ModifiedEvent`` for a folder whose content changed (its ``UnreadCount`` now)."""
        if folder.parent_id is None:
            return
        now = datetime.now(UTC)
        grandparent = mailbox.folders[folder.parent_id]
        for sub in self._live_subscriptions(mailbox.address, folder.folder_id):
            if "ModifiedEvent" in sub.event_types:
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
