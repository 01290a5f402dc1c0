"""The state of the Graph test server: mailboxes, mail folders, messages and their change log.

Pure state, no HTTP. Every mutation appends to a per-folder change log (``FolderLog``) so that
delta query can answer "what changed in this folder since watermark N" the way Exchange Online
does: a message that is in the folder now comes back whole, one that left it (deleted, or moved
out) comes back as ``@removed`` (https://learn.microsoft.com/en-us/graph/delta-query-messages).

Ids: every message has an *immutable* id, stable for its life in the mailbox, and a *default*
(REST) id that changes when the message moves to another folder, as Outlook's default ids do
(https://learn.microsoft.com/en-us/graph/outlook-immutable-id). Both look like Graph ids
(URL-safe base64 of random bytes) and both are accepted wherever a message id is.

One ``threading.Condition`` guards everything: the HTTP handlers and the test thread both
mutate the store, and ``wait_until`` wakes on every change.
"""

from __future__ import annotations

import base64
import email
import email.policy
import itertools
import os
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage

#: The folders every Exchange Online mailbox has, by their well-known name
#: (https://learn.microsoft.com/en-us/graph/api/resources/mailfolder, "Well-known folder names").
WELL_KNOWN_FOLDERS = {
    "inbox": "Inbox",
    "sentitems": "Sent Items",
    "deleteditems": "Deleted Items",
    "drafts": "Drafts",
    "archive": "Archive",
    "junkemail": "Junk Email",
    "outbox": "Outbox",
}
#: The root of the folder tree (``msgfolderroot``): the parent of the folders above.
ROOT_FOLDER = "msgfolderroot"

#: PidTagFlagStatus as Graph names it on ``followupFlag.flagStatus``.
FLAG_STATUSES = ("notFlagged", "complete", "flagged")


def graph_id(prefix: bytes = b"AAMkAG") -> str:
    """An opaque id shaped like Exchange's (URL-safe base64, ``=`` padded)."""
    return base64.urlsafe_b64encode(prefix + os.urandom(30)).decode()


class GraphStoreError(Exception):
    """A test asked for something that does not exist (a programming error in the test)."""


@dataclass
class Message:
    """One message in one folder, with the properties a mail event needs
    (https://learn.microsoft.com/en-us/graph/api/resources/message)."""

    immutable_id: str
    rest_id: str
    folder_id: str
    mime: bytes
    internet_message_id: str | None
    subject: str
    sender: tuple[str, str] | None  # (name, address)
    to_recipients: list[tuple[str, str]]
    cc_recipients: list[tuple[str, str]]
    received: datetime
    conversation_id: str
    has_attachments: bool
    is_read: bool = False
    flag_status: str = "notFlagged"
    categories: list[str] = field(default_factory=list)
    change_key: str = ""
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    modified: datetime = field(default_factory=lambda: datetime.now(UTC))

    def touch(self) -> None:
        """A new ``changeKey`` (the item's version) on every change, as Exchange does."""
        self.change_key = base64.b64encode(b"CQAAABYAAAA" + os.urandom(12)).decode()
        self.modified = datetime.now(UTC)


@dataclass
class MailFolder:
    folder_id: str
    display_name: str
    parent_id: str | None
    well_known_name: str | None = None
    #: (sequence, immutable id) of every change that touched this folder, oldest first.
    log: list[tuple[int, str]] = field(default_factory=list)
    #: immutable id -> the default id a message had here before it left (for ``@removed``).
    departed: dict[str, str] = field(default_factory=dict)
    #: immutable id -> the log sequence of its (latest) arrival here (delta's ``changeType``).
    arrivals: dict[str, int] = field(default_factory=dict)


@dataclass
class Mailbox:
    address: str
    user_id: str
    folders: dict[str, MailFolder] = field(default_factory=dict)
    messages: dict[str, Message] = field(default_factory=dict)  # immutable id -> message
    #: The mailbox was deleted (``delete_mailbox``): 404 from now on.
    deleted: bool = False

    def folder(self, ref: str) -> MailFolder | None:
        """A folder by id, well-known name or (as Graph does not, but tests like) display name."""
        if ref in self.folders:
            return self.folders[ref]
        lowered = ref.lower()
        for folder in self.folders.values():
            if folder.well_known_name == lowered:
                return folder
        for folder in self.folders.values():
            if folder.display_name.lower() == lowered:
                return folder
        return None

    def message(self, ref: str) -> Message | None:
        """A message by its immutable id or its current default id."""
        found = self.messages.get(ref)
        if found is not None:
            return found
        for message in self.messages.values():
            if message.rest_id == ref:
                return message
        return None


class GraphStore:
    """All mailboxes of the tenant. Mutators notify ``cond``; callers may hold it already."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.mailboxes: dict[str, Mailbox] = {}  # lower-case address -> mailbox
        self._sequence = itertools.count(1)
        #: Listeners called (under the lock) with (mailbox, folder id, immutable id, change
        #: type) after every change: subscriptions turn them into notifications.
        self.listeners: list[object] = []
        self.last_sequence = 0

    # -- mailboxes and folders ---------------------------------------------------------------

    def add_mailbox(self, address: str) -> Mailbox:
        with self.cond:
            key = address.lower()
            if key in self.mailboxes and not self.mailboxes[key].deleted:
                raise GraphStoreError(f"mailbox {address} exists already")
            mailbox = Mailbox(address=address, user_id=str(uuid.uuid4()))
            root = MailFolder(graph_id(b"AQMkAD"), "Top of Information Store", None, ROOT_FOLDER)
            mailbox.folders[root.folder_id] = root
            for name, display in WELL_KNOWN_FOLDERS.items():
                folder = MailFolder(graph_id(b"AQMkAD"), display, root.folder_id, name)
                mailbox.folders[folder.folder_id] = folder
            self.mailboxes[key] = mailbox
            self.cond.notify_all()
            return mailbox

    def mailbox(self, ref: str) -> Mailbox | None:
        """A mailbox by address (userPrincipalName) or user id, as ``/users/{id}`` takes both."""
        with self.cond:
            found = self.mailboxes.get(ref.lower())
            if found is None:
                found = next((m for m in self.mailboxes.values() if m.user_id == ref), None)
            return found

    def require_mailbox(self, address: str) -> Mailbox:
        mailbox = self.mailbox(address)
        if mailbox is None:
            raise GraphStoreError(f"no mailbox {address}")
        return mailbox

    def add_folder(self, address: str, display_name: str, parent: str = ROOT_FOLDER) -> MailFolder:
        with self.cond:
            mailbox = self.require_mailbox(address)
            parent_folder = self._folder(mailbox, parent)
            folder = MailFolder(graph_id(b"AQMkAD"), display_name, parent_folder.folder_id)
            mailbox.folders[folder.folder_id] = folder
            self.cond.notify_all()
            return folder

    def delete_mailbox(self, address: str) -> None:
        with self.cond:
            self.require_mailbox(address).deleted = True
            self.cond.notify_all()

    # -- messages ------------------------------------------------------------------------------

    def add_message(
        self,
        address: str,
        mime: bytes,
        *,
        folder: str = "inbox",
        received: datetime | None = None,
        is_read: bool = False,
        notify: bool = True,
    ) -> Message:
        """Deliver raw MIME bytes into a folder (a new item, as transport delivery makes it)."""
        with self.cond:
            mailbox = self.require_mailbox(address)
            target = self._folder(mailbox, folder)
            parsed = email.message_from_bytes(mime, policy=email.policy.default)
            assert isinstance(parsed, EmailMessage)
            message = Message(
                immutable_id=graph_id(b"AAkALg"),
                rest_id=graph_id(),
                folder_id=target.folder_id,
                mime=mime,
                internet_message_id=_header(parsed, "Message-ID"),
                subject=_header(parsed, "Subject") or "",
                sender=_first_address(parsed, "From"),
                to_recipients=_addresses(parsed, "To"),
                cc_recipients=_addresses(parsed, "Cc"),
                received=(received or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0),
                conversation_id=_conversation_id(parsed),
                has_attachments=any(
                    part.is_attachment() for part in parsed.walk() if not part.is_multipart()
                ),
                is_read=is_read,
            )
            message.touch()
            mailbox.messages[message.immutable_id] = message
            self._log(mailbox, target.folder_id, message.immutable_id, "created", notify)
            return message

    def update_message(
        self,
        address: str,
        message_id: str,
        *,
        is_read: bool | None = None,
        flag_status: str | None = None,
        categories: list[str] | None = None,
        notify: bool = True,
    ) -> Message:
        """A client marks a message read/unread, flags it, or sets its categories."""
        if flag_status is not None and flag_status not in FLAG_STATUSES:
            raise GraphStoreError(f"flag_status must be one of {FLAG_STATUSES}")
        with self.cond:
            mailbox = self.require_mailbox(address)
            message = self._message(mailbox, message_id)
            if is_read is not None:
                message.is_read = is_read
            if flag_status is not None:
                message.flag_status = flag_status
            if categories is not None:
                message.categories = list(categories)
            message.touch()
            self._log(mailbox, message.folder_id, message.immutable_id, "updated", notify)
            return message

    def move_message(
        self, address: str, message_id: str, folder: str, *, notify: bool = True
    ) -> Message:
        """Move to another folder: the default id changes, the immutable id does not
        (https://learn.microsoft.com/en-us/graph/outlook-immutable-id)."""
        with self.cond:
            mailbox = self.require_mailbox(address)
            message = self._message(mailbox, message_id)
            target = self._folder(mailbox, folder)
            source = message.folder_id
            if source == target.folder_id:
                return message
            mailbox.folders[source].departed[message.immutable_id] = message.rest_id
            message.folder_id = target.folder_id
            message.rest_id = graph_id()
            message.touch()
            # The source folder sees a deletion, the target a creation: each folder's delta
            # is tracked on its own (delta-query-messages: "a per-folder operation").
            self._log(mailbox, source, message.immutable_id, "deleted", notify)
            self._log(mailbox, target.folder_id, message.immutable_id, "created", notify)
            return message

    def delete_message(self, address: str, message_id: str, *, notify: bool = True) -> None:
        """Delete for good (a hard delete; a soft delete is a move to ``deleteditems``)."""
        with self.cond:
            mailbox = self.require_mailbox(address)
            message = self._message(mailbox, message_id)
            del mailbox.messages[message.immutable_id]
            mailbox.folders[message.folder_id].departed[message.immutable_id] = message.rest_id
            self._log(mailbox, message.folder_id, message.immutable_id, "deleted", notify)

    # -- delta support -------------------------------------------------------------------------

    def changes_since(self, folder: MailFolder, watermark: int) -> list[str]:
        """Immutable ids touched in ``folder`` after ``watermark``, each once, oldest change first."""
        seen: dict[str, None] = {}
        for sequence, immutable_id in folder.log:
            if sequence > watermark:
                seen.pop(immutable_id, None)
                seen[immutable_id] = None
        return list(seen)

    def messages_in(self, mailbox: Mailbox, folder: MailFolder) -> list[Message]:
        """The folder's messages, newest first (delta's order "isn't guaranteed"; this one is
        stable, which makes tests readable)."""
        found = [m for m in mailbox.messages.values() if m.folder_id == folder.folder_id]
        return sorted(found, key=lambda m: (m.received, m.created), reverse=True)

    # -- internals -----------------------------------------------------------------------------

    def _folder(self, mailbox: Mailbox, ref: str) -> MailFolder:
        folder = mailbox.folder(ref)
        if folder is None:
            raise GraphStoreError(f"no folder {ref!r} in {mailbox.address}")
        return folder

    def _message(self, mailbox: Mailbox, ref: str) -> Message:
        message = mailbox.message(ref)
        if message is None:
            raise GraphStoreError(f"no message {ref!r} in {mailbox.address}")
        return message

    def _log(
        self, mailbox: Mailbox, folder_id: str, immutable_id: str, change: str, notify: bool
    ) -> None:
        self.last_sequence = next(self._sequence)
        folder = mailbox.folders[folder_id]
        folder.log.append((self.last_sequence, immutable_id))
        if change == "created":
            folder.arrivals[immutable_id] = self.last_sequence
        if notify:
            for listener in self.listeners:
                listener(mailbox, folder_id, immutable_id, change)  # type: ignore[operator]
        self.cond.notify_all()


def _header(parsed: EmailMessage, name: str) -> str | None:
    value = parsed.get(name)
    return str(value).strip() if value is not None else None


def _addresses(parsed: EmailMessage, name: str) -> list[tuple[str, str]]:
    # policy.default parses address headers itself (headerregistry.AddressHeader).
    found: list[tuple[str, str]] = []
    for header in parsed.get_all(name, []):
        for address in getattr(header, "addresses", ()):
            if address.addr_spec and address.addr_spec != "<>":
                found.append((address.display_name, address.addr_spec))
    return found


def _first_address(parsed: EmailMessage, name: str) -> tuple[str, str] | None:
    found = _addresses(parsed, name)
    return found[0] if found else None


def _conversation_id(parsed: EmailMessage) -> str:
    """Exchange threads by the first message of the conversation; so do we (References'
    first id, else In-Reply-To, else the message's own Message-ID)."""
    root = (
        (_header(parsed, "References") or "").split()[:1]
        or (_header(parsed, "In-Reply-To") or "").split()[:1]
        or [_header(parsed, "Message-ID") or uuid.uuid4().hex]
    )[0]
    digest = uuid.uuid5(uuid.NAMESPACE_URL, root).bytes
    return base64.urlsafe_b64encode(b"AAQkAG" + digest).decode()
