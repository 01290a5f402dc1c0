"""In-memory stand-ins for the worker's collaborators: a mailbox behind ImapConnection's interface,
a transactional writer that records what it committed, and a parser."""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail.event import MailEvent, SourceCoordinates
from connectors.imap.connection import FetchedMail, FlagState, FolderStatus, MovedTo
from connectors.imap.errors import FolderMissing, ImapProtocolError
from connectors.imap.idle import IdleOutcome
from connectors.imap.uidset import UidSet


@dataclass
class Mail:
    raw: bytes
    flags: tuple[str, ...] = ()
    modseq: int = 0


@dataclass
class FakeServer:
    uidvalidity: int = 100
    folders: dict[str, dict[int, Mail]] = field(default_factory=lambda: {"INBOX": {}})
    uidnext: dict[str, int] = field(default_factory=lambda: {"INBOX": 1})
    modseq: int = 1
    #: Raised by the next connect()/login() (then cleared unless sticky).
    fail_connect: BaseException | None = None
    fail_login: BaseException | None = None
    sticky: bool = False
    connects: int = 0
    #: Refuse STATUS on the selected mailbox (RFC 3501 allows it).
    refuse_status: bool = False
    size_searches: int = 0

    def append(self, raw: bytes, folder: str = "INBOX") -> int:
        uid = self.uidnext[folder]
        self.uidnext[folder] = uid + 1
        self.modseq += 1
        self.folders[folder][uid] = Mail(raw, (), self.modseq)
        return uid

    def flag(self, uid: int, flag: str, folder: str = "INBOX") -> None:
        self.modseq += 1
        mail = self.folders[folder][uid]
        mail.flags, mail.modseq = (*mail.flags, flag), self.modseq


class FakeConnection:
    condstore = True
    #: A server without QRESYNC: every expunge check lists the folder.
    qresync = False
    supports_idle = True
    #: Every fake session starts unconnected (no early login, connectors.imap.earlylogin).
    logged_in = False
    #: What the fake announces after login: no fallback to log (capabilities.py).
    capabilities = frozenset({b"IMAP4REV1", b"IDLE", b"CONDSTORE", b"MOVE", b"UIDPLUS"})

    def __init__(self, server: FakeServer, stop: threading.Event, idle_rounds: int = 1) -> None:
        self.server = server
        self.stop = stop
        self.folder = "INBOX"
        self.idle_rounds = idle_rounds

    def _fail(self, attr: str) -> None:
        exc = getattr(self.server, attr)
        if exc is not None:
            if not self.server.sticky:
                setattr(self.server, attr, None)
            raise exc

    def connect(self) -> None:
        self.server.connects += 1
        self._fail("fail_connect")

    def login(self) -> None:
        self._fail("fail_login")

    def enable_condstore(self, qresync: bool = False) -> bool:
        return True

    def select(self, folder: str, readonly: bool = False, qresync: object = None) -> FolderStatus:
        if not self.folder_exists(folder):
            raise FolderMissing(f"folder {folder} does not exist on the server")
        self.folder = folder
        s = self.server
        return FolderStatus(s.uidvalidity, s.uidnext[folder], s.modseq, len(s.folders[folder]))

    def status(self, folder: str) -> FolderStatus:
        if self.server.refuse_status and folder == self.folder:
            raise ImapProtocolError("status: BAD STATUS of the selected mailbox")
        s = self.server
        return FolderStatus(s.uidvalidity, s.uidnext[folder], s.modseq, len(s.folders[folder]))

    def noop(self) -> IdleOutcome:
        return IdleOutcome()

    def _box(self) -> dict[int, Mail]:
        return self.server.folders[self.folder]

    def uids_from(self, first: int) -> list[int]:
        return sorted(u for u in self._box() if u >= first)

    def all_uids(self) -> list[int]:
        return sorted(self._box())

    def uids_since(self, day: dt.date) -> list[int]:
        return self.all_uids()

    def uids_changed_since(self, modseq: int) -> UidSet:
        return UidSet.from_uids(u for u, m in self._box().items() if m.modseq > modseq)

    def uids_larger(self, first_uid: int, last_uid: int, size: int) -> list[int]:
        self.server.size_searches += 1
        box = self._box()
        return [u for u in sorted(box) if first_uid <= u <= last_uid and len(box[u].raw) > size]

    def sizes(self, uids: Sequence[int]) -> dict[int, int]:
        return {u: len(self._box()[u].raw) for u in uids if u in self._box()}

    def fetch(self, uids: Sequence[int]) -> list[FetchedMail]:
        box = self._box()
        return [
            FetchedMail(u, box[u].raw, box[u].flags, None, box[u].modseq)
            for u in sorted(uids)
            if u in box
        ]

    def flags(self, uids: Sequence[int]) -> list[FlagState]:
        box = self._box()
        return [FlagState(u, box[u].flags, box[u].modseq) for u in sorted(uids) if u in box]

    def idle_until(
        self, deadline: float, should_stop: Callable[[], bool], slice_seconds: float
    ) -> IdleOutcome:
        self.idle_rounds -= 1
        if self.idle_rounds <= 0:
            self.stop.set()
        return IdleOutcome()

    def message_ids_in(self, folder: str, message_ids: Sequence[str]) -> set[str]:
        return set()

    def folder_exists(self, folder: str) -> bool:
        return folder in self.server.folders

    def create_folder(self, folder: str) -> None:
        self.server.folders.setdefault(folder, {})
        self.server.uidnext.setdefault(folder, 1)

    def add_flags(self, uids: Sequence[int], flags: Sequence[str]) -> None:
        for uid in uids:
            for flag in flags:
                self.server.flag(uid, flag, self.folder)

    def move(self, uids: Sequence[int], folder: str) -> MovedTo | None:
        """Like a UIDPLUS server: COPYUID for the mails that were there."""
        moved = {}
        for uid in uids:
            mail = self._box().pop(uid, None)
            if mail is not None:
                moved[uid] = self.server.append(mail.raw, folder)
        return MovedTo(self.server.uidvalidity, moved) if moved else None

    def close(self) -> None:
        pass

    def logout(self) -> None:
        pass


class RecordingWriter:
    def __init__(self) -> None:
        self.transactions: list[tuple[list[SourceRecord], list[Mapping[str, Any]]]] = []
        self.fail_next: BaseException | None = None

    def write(
        self,
        records: Sequence[SourceRecord],
        offsets: Any,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        if before_commit is not None:
            before_commit()
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        self.transactions.append((list(records), [o for _, o in offsets]))

    def close(self) -> None:
        pass

    @property
    def records(self) -> list[SourceRecord]:
        return [r for records, _ in self.transactions for r in records]

    @property
    def last_offset(self) -> Mapping[str, Any]:
        return self.transactions[-1][1][-1]


@dataclass
class Parsed:
    key: str
    event: MailEvent
    parse_error: str | None = None


def fake_parse(
    raw: bytes, *, account: str, source: Mapping[str, Any], flags: list[str], **_: Any
) -> Parsed:
    """Key = account + first line; ``BAD`` in the mail sets parse_error; ``BOOM`` raises.
    The content fingerprint is the sha256 of the whole mail."""
    if b"BOOM" in raw:
        raise RuntimeError("parser bug")
    error = "broken" if b"BAD" in raw else None
    key = f"{account}/mid:{raw.splitlines()[0].decode()}"
    coordinates: SourceCoordinates = {
        "kind": "IMAP",
        "folder": source["folder"],
        "uidvalidity": source.get("uidvalidity"),
        "uid": source.get("uid"),
        "modseq": source.get("modseq"),
        "item_id": None,
        "change_key": None,
    }
    # A whole MailEvent, as the record builders expect from connectors.core.mail.parse_mail.
    event: MailEvent = {
        "schema_version": 1,
        "key": key,
        "key_kind": "MESSAGE_ID",
        "change": "ADDED",
        "account": account,
        "source": coordinates,
        "message_id": None,
        "in_reply_to": None,
        "references": [],
        "from": None,
        "reply_to": [],
        "to": [],
        "cc": [],
        "subject": None,
        "date": None,
        "internal_date": None,
        "size": len(raw),
        "text_body": None,
        "html_body": None,
        "body_truncated": False,
        "attachments": [],
        "raw_ref": None,
        "guard_headers": {
            "auto_submitted": None,
            "precedence": None,
            "list_id": None,
            "list_unsubscribe": None,
            "return_path": None,
            "x_auto_response_suppress": None,
            "content_type": None,
            "authentication_results": [],
        },
        "flags": flags,
        "parse_error": error,
        "observed_at": dt.datetime.now(dt.UTC),
        "content_fingerprint": hashlib.sha256(raw).hexdigest(),
    }
    return Parsed(key, event, error)


class JsonSerde:
    def encode(self, value: dict[str, Any], topic: str) -> bytes:
        import json

        return json.dumps(value, sort_keys=True, default=str).encode()
