"""The IMAP wire, behind our own small interface: :class:`ImapConnection`. Only it and its
parts import or call imapclient: :mod:`~connectors.imap.session` (TLS, login),
:mod:`~connectors.imap.idle` (IDLE), :mod:`~connectors.imap.search` (SEARCH, ESEARCH),
:mod:`~connectors.imap.fetchparse` (the FETCH parser) and :mod:`~connectors.imap.wire` (the
library's errors as ours).

Everything above this module speaks in :class:`FolderStatus`, :class:`FetchedMail` and
:class:`~connectors.imap.idle.IdleOutcome`, and sees three kinds of failure: :class:`ConnectionLost`
(retry), ``AuthenticationError`` (permanent, back off to the cap) and :class:`ImapProtocolError`.

Wire sample (what :meth:`ImapConnection.fetch` asks for)::

    C: A7 UID FETCH 41,42 (BODY.PEEK[] FLAGS INTERNALDATE MODSEQ)
    S: * 3 FETCH (UID 41 MODSEQ (12) FLAGS (\\Seen) INTERNALDATE "29-Nov-2026 16:07:46 +0000"
       BODY[] {5120} ...)

Pitfalls handled here (PITFALLS.md, imapclient 4.1):

- every read has a timeout (``SocketTimeout``, :mod:`~connectors.imap.session`), or a cut
  network blocks ``idle_done()`` forever (imapclient #449); IDLE's own pitfalls are handled in
  :mod:`~connectors.imap.idle`;
- ``fetch()``/``search()`` reject range strings: we search for UIDs and fetch lists of them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from imapclient import IMAPClient
from imapclient import exceptions as imap_exc

from connectors.imap.config import ImapAccountSettings
from connectors.imap.errors import ConnectionLost, FolderMissing, ImapProtocolError
from connectors.imap.fetchparse import FetchResponse, parse_fetch
from connectors.imap.idle import IdleOutcome, NoopThenIdle, classify_untagged, idle_until
from connectors.imap.qresync import QresyncRequest, parse_vanished
from connectors.imap.search import any_message_id, message_ids_in, search
from connectors.imap.session import log_in, open_client
from connectors.imap.uidset import UidSet
from connectors.imap.wire import text, wire

log = logging.getLogger(__name__)

SEEN = "\\Seen"


@dataclass(frozen=True)
class FolderStatus:
    """What SELECT (or STATUS) says about a folder."""

    uidvalidity: int
    uidnext: int
    highestmodseq: int | None
    exists: int
    #: What vanished since the MODSEQ a QRESYNC SELECT asked about; None when the SELECT was
    #: not a QRESYNC one or the server did not answer it as one (another UIDVALIDITY, NOMODSEQ).
    vanished: UidSet | None = None


@dataclass(frozen=True)
class FetchedMail:
    uid: int
    raw: bytes
    flags: tuple[str, ...]
    internal_date: dt.datetime | None
    modseq: int | None


@dataclass(frozen=True)
class FlagState:
    uid: int
    flags: tuple[str, ...]
    modseq: int | None


def _modseq(item: dict[bytes, Any]) -> int | None:
    value = item.get(b"MODSEQ")
    if isinstance(value, tuple) and value:
        return int(value[0])
    return int(value) if isinstance(value, int) else None


def _stdlib_tz(value: Any) -> dt.datetime | None:
    """An INTERNALDATE with a ``datetime.timezone`` instead of imapclient's FixedOffset, which
    does not survive pickling (FetchedMail goes to parse processes) and is imapclient's type."""
    if not isinstance(value, dt.datetime):
        return None
    offset = value.utcoffset()
    return value if offset is None else value.replace(tzinfo=_timezone(offset))


@functools.lru_cache(maxsize=64)
def _timezone(offset: dt.timedelta) -> dt.timezone:
    """One ``datetime.timezone`` per UTC offset (a mailbox has a handful), not one per mail."""
    return dt.timezone(offset)


class ImapConnection:
    """One connection to one account. Not thread-safe (neither is imapclient): one per worker."""

    def __init__(
        self,
        account: ImapAccountSettings,
        *,
        connect_timeout: float,
        read_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.account = account
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._ssl_context = ssl_context
        self._client: IMAPClient | None = None
        self._capabilities: frozenset[bytes] = frozenset()
        self._logged_in = False
        self.condstore = False
        self.qresync = False

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def client(self) -> IMAPClient:
        if self._client is None:
            raise ConnectionLost("not connected")
        return self._client

    def connect(self) -> None:
        self._client = open_client(
            self.account,
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            ssl_context=self._ssl_context,
        )

    def login(self) -> None:
        self._capabilities = log_in(self.client, self.account)
        self._logged_in = True

    @property
    def logged_in(self) -> bool:
        """Connected and logged in (an early login, :mod:`connectors.imap.earlylogin`)."""
        return self._logged_in and self._client is not None

    def open(self, qresync: bool) -> None:
        """Connect, log in and ENABLE (:meth:`enable_condstore`): the steps a worker's session
        takes before its SELECT, in one call, for a login ahead of the worker."""
        self.connect()
        try:
            self.login()
            self.enable_condstore(qresync=qresync)
        except BaseException:
            self.close()
            raise

    def enable_condstore(self, qresync: bool = False) -> bool:
        """ENABLE CONDSTORE when offered (RFC 7162), or QRESYNC (which implies it) when
        ``qresync`` and offered. Returns whether MODSEQs are available.

        With QRESYNC on, the server reports expunges as ``* VANISHED uid-set`` instead of
        ``* n EXPUNGE`` (section 3.2.10); :meth:`_classify` reads both.
        """
        self.condstore = self.qresync = False
        if qresync and b"QRESYNC" in self._capabilities:
            with wire("enable"):
                enabled = self.client.enable("QRESYNC")
            # ENABLE answers with what it enabled (RFC 5161); a refusal leaves CONDSTORE.
            self.condstore = self.qresync = b"QRESYNC" in [e.upper() for e in enabled]
        if not self.condstore and b"CONDSTORE" in self._capabilities:
            with wire("enable"):
                self.client.enable("CONDSTORE")
            self.condstore = True
        return self.condstore

    @property
    def supports_idle(self) -> bool:
        return b"IDLE" in self._capabilities

    @property
    def capabilities(self) -> frozenset[bytes]:
        """What the server announced after login (upper case atoms, e.g. ``b"IDLE"``)."""
        return self._capabilities

    def close(self) -> None:
        """Drop the connection without a round trip (it may be dead)."""
        client, self._client = self._client, None
        self._logged_in = False
        if client is None:
            return
        with contextlib.suppress(Exception):
            client.shutdown()

    def logout(self) -> None:
        client = self._client
        if client is None:
            return
        with contextlib.suppress(Exception):
            client.logout()
        self.close()

    # --- folder ------------------------------------------------------------------------------

    def select(
        self, folder: str, readonly: bool = False, qresync: QresyncRequest | None = None
    ) -> FolderStatus:
        """SELECT (or EXAMINE) ``folder``; :class:`FolderMissing` when the server has no such
        folder (deleted, renamed, or never created), as LIST says, not the NO's wording.

        With ``qresync`` (and QRESYNC enabled) the SELECT carries the QRESYNC parameter and
        the status says what vanished since ``qresync.modseq`` (:mod:`qresync`)."""
        use_qresync = qresync is not None and self.qresync
        info: dict[bytes, Any] | None = None
        if use_qresync:
            assert qresync is not None
            try:
                with wire(f"select {folder} (qresync)"):
                    info = self._select_qresync(folder, readonly, qresync)
            except ImapProtocolError as exc:
                # A refused parameter must not refuse the folder: a plain SELECT decides that,
                # and the check lists the folder as without QRESYNC.
                log.warning("imap %s: %s; selecting without QRESYNC", self.account.name, exc)
                use_qresync = False
        try:
            if info is None:
                with wire(f"select {folder}"):
                    info = self.client.select_folder(folder, readonly=readonly)
        except ImapProtocolError as exc:
            if not self.folder_exists(folder):
                raise FolderMissing(f"folder {folder} does not exist on the server") from exc
            raise
        hms = info.get(b"HIGHESTMODSEQ")
        uidvalidity = int(info[b"UIDVALIDITY"])
        uidnext = info.get(b"UIDNEXT")
        if uidnext is None:
            # Optional in a SELECT answer (RFC 3501 6.3.1), and Courier leaves it out; the start
            # position and a new epoch's rescan mark need it. STATUS has it (Courier answers
            # STATUS on the selected folder).
            uidnext = self.status(folder).uidnext
        vanished = None
        # RFC 7162 3.2.5: another UIDVALIDITY makes the server ignore the parameter, and a
        # NOMODSEQ folder has no history: neither answer says "nothing vanished".
        if use_qresync and qresync is not None and qresync.uidvalidity == uidvalidity and hms:
            try:
                vanished = parse_vanished(info.get(b"VANISHED", []))
            except ValueError as exc:
                raise ImapProtocolError(f"select {folder}: {exc}") from exc
        return FolderStatus(
            uidvalidity=uidvalidity,
            uidnext=int(uidnext),
            highestmodseq=int(hms) if hms is not None and self.condstore else None,
            exists=int(info.get(b"EXISTS", 0)),
            vanished=vanished,
        )

    def _select_qresync(
        self, folder: str, readonly: bool, qresync: QresyncRequest
    ) -> dict[bytes, Any]:
        """``SELECT folder (QRESYNC (...))``: imaplib's ``select()`` with the parameter added,
        which neither imaplib nor imapclient 4.1 can send (both take a mailbox name only).

        It goes through the same private imaplib calls as ``imaplib.IMAP4.select`` (Python
        3.11-3.13) and imapclient's ``_process_select_response``; pyproject pins imapclient
        ``>=4.1,<4.2``: recheck when moving the pin.
        """
        client = self.client
        imap = client._imap
        imap.untagged_responses = {}  # as select() does: the answer is read from them
        imap.is_readonly = readonly
        typ, data = imap._simple_command(
            "EXAMINE" if readonly else "SELECT",
            client._normalise_folder(folder),
            qresync.parameter(),
        )
        if typ != "OK":
            imap.state = "AUTH"
            raise imap_exc.IMAPClientError(f"select failed: {text(data[-1] or b'')}")
        imap.state = "SELECTED"
        info: dict[bytes, Any] = client._process_select_response(imap.untagged_responses)
        # The FETCH and VANISHED lines must not stay behind: the next UID FETCH takes every
        # filed FETCH line as part of its own answer (imaplib's _untagged_response).
        for name in ("FETCH", "VANISHED"):
            imap.untagged_responses.pop(name, None)
        return info

    def status(self, folder: str) -> FolderStatus:
        """STATUS of a folder (also the selected one: Dovecot answers with current values)."""
        what = [b"UIDVALIDITY", b"UIDNEXT", b"MESSAGES"]
        if self.condstore:
            what.append(b"HIGHESTMODSEQ")
        with wire(f"status {folder}"):
            info = self.client.folder_status(folder, what)
        hms = info.get(b"HIGHESTMODSEQ")
        return FolderStatus(
            uidvalidity=int(info[b"UIDVALIDITY"]),
            uidnext=int(info[b"UIDNEXT"]),
            highestmodseq=int(hms) if hms is not None else None,
            exists=int(info[b"MESSAGES"]),
        )

    def folder_exists(self, folder: str) -> bool:
        with wire(f"list {folder}"):
            return bool(self.client.folder_exists(folder))

    def create_folder(self, folder: str) -> None:
        with wire(f"create {folder}"):
            if not self.client.folder_exists(folder):
                self.client.create_folder(folder)

    # --- search ------------------------------------------------------------------------------

    def search(self, criteria: list[Any]) -> UidSet:
        """The UIDs matching ``criteria``, as ranges (:func:`connectors.imap.search.search`)."""
        return search(self.client, criteria, esearch=b"ESEARCH" in self._capabilities)

    def uids_from(self, first_uid: int) -> UidSet:
        """UIDs >= first_uid, ascending. ("N:*" always matches the highest UID, so filter.)"""
        with wire("search uid"):
            return self.search(["UID", f"{max(first_uid, 1)}:*"]).from_uid(first_uid)

    def uids_larger(self, first_uid: int, last_uid: int, size: int) -> UidSet:
        """UIDs in ``first_uid..last_uid`` of mails over ``size`` bytes (SEARCH LARGER)."""
        with wire("search larger"):
            found = self.search(["UID", f"{first_uid}:{last_uid}", "LARGER", str(size)])
        return found.between(first_uid, last_uid)

    def all_uids(self) -> UidSet:
        with wire("search all"):
            return self.search(["ALL"])

    def uids_since(self, day: dt.date) -> UidSet:
        with wire("search since"):
            return self.search(["SINCE", day])

    def uids_changed_since(self, modseq: int) -> UidSet:
        """UIDs whose MODSEQ is greater than ``modseq`` (RFC 7162 SEARCH MODSEQ)."""
        with wire("search modseq"):
            return self.search(["MODSEQ", str(modseq + 1)])

    def message_ids_in(self, folder: str, message_ids: Sequence[str]) -> set[str]:
        """Which of ``message_ids`` another folder holds, for the expunge-vs-move decision
        (:func:`connectors.imap.search.message_ids_in`). Leaves ``folder`` selected read-only:
        the caller re-selects its own folder."""
        esearch = b"ESEARCH" in self._capabilities
        return message_ids_in(self.client, folder, message_ids, esearch=esearch)

    def locate_message_ids(
        self, folder: str, message_ids: Sequence[str]
    ) -> tuple[int, dict[str, list[int]]]:
        """``(UIDVALIDITY, {message_id: UIDs})`` of those of ``message_ids`` that another
        folder holds (:meth:`message_ids_in`, then a UID SEARCH per id found). Leaves
        ``folder`` selected read-only: the caller re-selects its own folder."""
        found = self.message_ids_in(folder, message_ids)
        if not found:
            return 0, {}
        status = self.select(folder, readonly=True)
        esearch = b"ESEARCH" in self._capabilities
        where: dict[str, list[int]] = {}
        for message_id in sorted(found):
            with wire(f"search {folder}"):
                uids = search(self.client, any_message_id([message_id]), esearch=esearch)
            if uids:
                where[message_id] = list(uids)
        return status.uidvalidity, where

    # --- fetch -------------------------------------------------------------------------------

    def _uid_fetch(self, uids: Sequence[int], items: Sequence[str]) -> FetchResponse:
        """``IMAPClient.fetch(uids, items)`` with the parse done by fetchparse (its fast path, or
        imapclient's parser for anything else): same command, same result.

        It sends the command through the same private imaplib calls as ``IMAPClient.fetch``
        (imapclient 4.1, imapclient.py ~1390-1410); that is acceptable only because pyproject
        pins imapclient ``>=4.1,<4.2``. Recheck this method when moving the pin.
        """
        client = self.client
        imap = client._imap
        message_set = ",".join(str(uid) for uid in uids)
        tag = imap._command("UID", "FETCH", message_set, "(" + " ".join(items) + ")")
        typ, data = imap._command_complete("FETCH", tag)
        client._checkok("fetch", typ, data)
        typ, data = imap._untagged_response(typ, data, "FETCH")
        found = parse_fetch(data, client.normalise_times)
        # Drop unsolicited responses for other messages, as IMAPClient.fetch does.
        return {uid: found[uid] for uid in uids if uid in found}

    def sizes(self, uids: Sequence[int]) -> dict[int, int]:
        if not uids:
            return {}
        with wire("fetch size"):
            found = self._uid_fetch(uids, ["RFC822.SIZE"])
        return {uid: int(item.get(b"RFC822.SIZE", 0)) for uid, item in found.items()}

    def fetch(self, uids: Sequence[int]) -> list[FetchedMail]:
        """Full mails (BODY.PEEK[] leaves \\Seen alone), ascending by UID. Expunged UIDs are absent."""
        if not uids:
            return []
        items = ["BODY.PEEK[]", "FLAGS", "INTERNALDATE"]
        if self.condstore:
            items.append("MODSEQ")
        with wire("fetch"):
            found = self._uid_fetch(uids, items)
        mails = []
        for uid in sorted(found):
            item = found[uid]
            raw = item.get(b"BODY[]")
            if raw is None:
                continue
            internal = item.get(b"INTERNALDATE")
            mails.append(
                FetchedMail(
                    uid=uid,
                    raw=bytes(raw),
                    flags=tuple(text(f) for f in item.get(b"FLAGS", ())),
                    internal_date=_stdlib_tz(internal),
                    modseq=_modseq(item),
                )
            )
        return mails

    def flags(self, uids: Sequence[int]) -> list[FlagState]:
        if not uids:
            return []
        items = [b"FLAGS", b"MODSEQ"] if self.condstore else [b"FLAGS"]
        with wire("fetch flags"):
            found = self.client.fetch(list(uids), items)
        return [
            FlagState(
                uid, tuple(text(f) for f in found[uid].get(b"FLAGS", ())), _modseq(found[uid])
            )
            for uid in sorted(found)
        ]

    def flags_between(self, first_uid: int, last_uid: int) -> list[tuple[int, tuple[str, ...]]]:
        """(uid, flags) of every mail with a UID in ``first_uid..last_uid``, ascending:
        ``UID FETCH first:last (FLAGS)``, the listing of a server without CONDSTORE
        (:mod:`connectors.imap.flaglisting`). A range, not a list of UIDs: the command stays
        short however many mails the window holds."""
        client = self.client
        imap = client._imap
        with wire("fetch flags"):
            # The same private imaplib calls as _uid_fetch (imapclient pinned <4.2).
            tag = imap._command("UID", "FETCH", f"{first_uid}:{last_uid}", "(FLAGS)")
            typ, data = imap._command_complete("FETCH", tag)
            client._checkok("fetch", typ, data)
            typ, data = imap._untagged_response(typ, data, "FETCH")
            found = parse_fetch(data, client.normalise_times)
        return [
            (uid, tuple(text(f) for f in found[uid].get(b"FLAGS", ())))
            for uid in sorted(found)
            if first_uid <= uid <= last_uid
        ]

    # --- waiting -----------------------------------------------------------------------------

    def idle_until(
        self, deadline: float, should_stop: Callable[[], bool], slice_seconds: float
    ) -> IdleOutcome:
        """IDLE until the server announces a change, ``deadline`` (monotonic time) passes, or
        ``should_stop()`` (:func:`connectors.imap.idle.idle_until`)."""
        return idle_until(
            NoopThenIdle(self.client), deadline, should_stop, slice_seconds, self.noop
        )

    def noop(self) -> IdleOutcome:
        """NOOP: what changed, as IDLE would say it. Dovecot answers a NOOP in a session whose
        folder changed UIDVALIDITY or was deleted with ``* BYE IMAP session state is
        inconsistent, please relogin.`` and closes: that BYE is in the ConnectionLost."""
        client = self.client
        try:
            with wire("noop"):
                _, responses = client.noop()
        except ConnectionLost as exc:
            bye = client._imap.untagged_responses.get("BYE")
            if bye:
                raise ConnectionLost(f"noop: server said BYE: {text(bye[-1])}") from exc
            raise
        return classify_untagged(responses)

    # --- side effects ------------------------------------------------------------------------

    def add_flags(self, uids: Sequence[int], flags: Sequence[str]) -> None:
        if uids:
            with wire("store"):
                self.client.add_flags(list(uids), list(flags), silent=True)

    def move(self, uids: Sequence[int], folder: str) -> MovedTo | None:
        """UID MOVE (RFC 6851), or COPY + \\Deleted + UID EXPUNGE where MOVE is missing.

        Returns where the mails went when the server says so (UIDPLUS ``COPYUID``, RFC 4315),
        else None. Moving UIDs that are already gone is a no-op on the server, so a repair may
        repeat it.
        """
        if not uids:
            return None
        # imaplib files response codes (also the tagged one) under their name; drop a stale one.
        codes = self.client._imap.untagged_responses
        codes.pop("COPYUID", None)
        with wire(f"move {folder}"):
            if b"MOVE" in self._capabilities:
                self.client.move(list(uids), folder)
            else:
                self.client.copy(list(uids), folder)
                self.client.add_flags(list(uids), [b"\\Deleted"], silent=True)
                if b"UIDPLUS" in self._capabilities:
                    self.client.uid_expunge(list(uids))
                else:
                    # Without UIDPLUS only a plain EXPUNGE exists: it also removes mail others
                    # marked \Deleted in this folder, which they asked for anyway.
                    self.client.expunge()
        found = codes.pop("COPYUID", None)
        return parse_copyuid(found[-1]) if found else None


@dataclass(frozen=True)
class MovedTo:
    """A COPYUID response code: the target folder's UIDVALIDITY and source UID -> new UID."""

    uidvalidity: int
    uids: dict[int, int]


def parse_copyuid(data: bytes | str) -> MovedTo | None:
    """``b"1700000000 41:43,45 101:104"`` -> MovedTo; None when it does not parse or the two
    sets differ in size (the code is then ignored, not trusted).

    >>> parse_copyuid(b"17 41:43,45 101:104")
    MovedTo(uidvalidity=17, uids={41: 101, 42: 102, 43: 103, 45: 104})
    """
    text = data.decode("ascii", "replace") if isinstance(data, bytes) else data
    parts = text.split()
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    source, target = _uid_set(parts[1]), _uid_set(parts[2])
    if source is None or target is None or len(source) != len(target):
        return None
    return MovedTo(int(parts[0]), dict(zip(source, target, strict=True)))


def _uid_set(text: str) -> list[int] | None:
    """An RFC 3501 uid-set without ``*``, expanded in its order (ranges ascending)."""
    out: list[int] = []
    for item in text.split(","):
        low, _, high = item.partition(":")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        a, b = int(low), int(high or low)
        out.extend(range(min(a, b), max(a, b) + 1))
    return out
