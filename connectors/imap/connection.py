"""The IMAP wire, behind our own small interface. The ONLY module that imports imapclient
(with fetchparse.py, its FETCH parser).

Everything above this module speaks in :class:`FolderStatus`, :class:`FetchedMail` and
:class:`IdleOutcome`, and sees three kinds of failure: :class:`ConnectionLost` (retry),
``AuthenticationError`` (permanent, back off to the cap) and :class:`ImapProtocolError`.

Wire sample (what :meth:`ImapConnection.fetch` asks for)::

    C: A7 UID FETCH 41,42 (BODY.PEEK[] FLAGS INTERNALDATE MODSEQ)
    S: * 3 FETCH (UID 41 MODSEQ (12) FLAGS (\\Seen) INTERNALDATE "29-Nov-2026 16:07:46 +0000"
       BODY[] {5120} ...)

Pitfalls handled here (PITFALLS.md, imapclient 4.1):

- every read has a timeout (``SocketTimeout``), or a cut network blocks ``idle_done()`` forever
  (imapclient #449);
- ``idle_check()`` swallows EOF and returns ``[]`` at once (#565): an early empty answer is checked
  with a NOOP after ``idle_done()``, and errors of ``idle_done()`` (``IMAPClientAbortError`` or a
  plain ``OSError``) mean a dead connection;
- ``fetch()``/``search()`` reject range strings: we search for UIDs and fetch lists of them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imapclient import IMAPClient, SocketTimeout
from imapclient import exceptions as imap_exc
from imapclient.imapclient import _normalise_search_criteria

from connectors.imap.config import ImapAccountSettings
from connectors.imap.errors import (
    AuthenticationError,
    ConfigError,
    ConnectionLost,
    FolderMissing,
    ImapProtocolError,
)
from connectors.imap.fetchparse import FetchResponse, parse_fetch
from connectors.imap.qresync import QresyncRequest, parse_vanished
from connectors.imap.uidset import UidSet, parse_esearch

log = logging.getLogger(__name__)

SEEN = "\\Seen"

#: An idle_check() that returns nothing before this fraction of its timeout did not time out:
#: imapclient swallowed an EOF or socket error (#565).
_EARLY_FRACTION = 0.5


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


@dataclass(frozen=True)
class IdleOutcome:
    """What the server pushed during one IDLE period. ``activity`` is False on a quiet timeout."""

    new_mail: bool = False
    expunged: bool = False
    flags_changed: bool = False
    other: bool = False

    @property
    def activity(self) -> bool:
        return self.new_mail or self.expunged or self.flags_changed or self.other


@contextlib.contextmanager
def _wire(operation: str) -> Iterator[None]:
    """Translate imapclient/imaplib/socket errors into ours, keeping the cause chain."""
    try:
        yield
    except imap_exc.LoginError as exc:
        raise AuthenticationError(f"{operation}: login refused: {exc}") from exc
    except imap_exc.IMAPClientAbortError as exc:
        raise ConnectionLost(f"{operation}: connection aborted: {exc}") from exc
    except (OSError, EOFError) as exc:  # socket.timeout, ssl.SSLError, resets, broken pipes
        raise ConnectionLost(f"{operation}: {type(exc).__name__}: {exc}") from exc
    except imap_exc.IMAPClientError as exc:
        raise ImapProtocolError(f"{operation}: {exc}") from exc


def _uidvalidity_code(response: tuple[Any, ...]) -> bool:
    """``* OK [UIDVALIDITY n] ...`` (RFC 3501 7.1): a server may announce a new UIDVALIDITY.

    >>> _uidvalidity_code((b"OK", b"[UIDVALIDITY 1700000000] UIDs valid"))
    True
    >>> _uidvalidity_code((b"OK", b"Still here"))
    False
    """
    text = response[1] if len(response) > 1 else b""
    return isinstance(text, bytes) and text.upper().startswith(b"[UIDVALIDITY ")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


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


def _read_token(path: Path) -> str:
    """The bearer token in ``path`` as it is now (a refresher may have rewritten it)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AuthenticationError(f"cannot read oauth2_access_token_file {path}: {exc}") from exc
    if not token:
        raise AuthenticationError(f"oauth2_access_token_file {path} is empty")
    return token


#: Message-IDs asked for in one SEARCH (``OR`` of ``HEADER Message-ID`` keys).
SEARCH_OR_CHUNK = 25


def _any_message_id(message_ids: Sequence[str]) -> list[str]:
    """SEARCH criteria matching any of ``message_ids``: ``OR k1 OR k2 k3`` (RFC 3501 6.4.4).

    >>> _any_message_id(["a@x", "b@x", "c@x"])
    ['OR', 'HEADER', 'Message-ID', 'a@x', 'OR', 'HEADER', 'Message-ID', 'b@x', 'HEADER', 'Message-ID', 'c@x']
    """
    criteria: list[str] = []
    for i, message_id in enumerate(message_ids):
        if i < len(message_ids) - 1:
            criteria.append("OR")
        criteria += ["HEADER", "Message-ID", message_id]
    return criteria


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
        self.condstore = False
        self.qresync = False

    # --- lifecycle ---------------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl_context is not None:
            return self._ssl_context
        # Verification on, hostname checked: create_default_context() does both.
        return ssl.create_default_context(cafile=self.account.ca_file)

    @property
    def client(self) -> IMAPClient:
        if self._client is None:
            raise ConnectionLost("not connected")
        return self._client

    def connect(self) -> None:
        a = self.account
        timeout = SocketTimeout(connect=self._connect_timeout, read=self._read_timeout)
        with _wire("connect"):
            client = IMAPClient(
                a.host,
                port=a.effective_port,
                ssl=a.security == "ssl",
                ssl_context=self._tls_context() if a.security == "ssl" else None,
                timeout=timeout,
            )
        # tz-aware INTERNALDATE instead of naive local time.
        client.normalise_times = False
        if not logging.getLogger("imapclient.imaplib").isEnabledFor(logging.DEBUG):
            # imapclient sets imaplib's debug level to 5 to route it into logging, so imaplib
            # formats a repr of every response line (a whole mail) and of every FETCH result,
            # even when nobody logs it: ~30% of the FETCH time. Off unless that logger is on.
            client._imap.debug = 0
        self._client = client
        if a.security == "starttls":
            with _wire("capability"):
                caps = client.capabilities()
            if b"STARTTLS" not in caps:
                self.close()
                # Never fall back to plaintext (DESIGN.md, security rules).
                raise ConfigError(
                    f"imap account {a.name}: {a.host} does not offer STARTTLS; "
                    f"use security: ssl or fix the server"
                )
            with _wire("starttls"):
                client.starttls(self._tls_context())

    def login(self) -> None:
        a = self.account
        fetched: str | None = None
        with _wire("login"):
            try:
                if a.oauth2 is not None:
                    # Imported here: requests/oauthlib cost ~0.1 s of every start, and only
                    # accounts with a client-credentials grant use them.
                    from connectors.core.oauth2 import client_credentials

                    fetched = client_credentials(a.oauth2).token()
                    self.client.oauth2_login(a.username, fetched)
                elif a.oauth2_access_token_file is not None:
                    self.client.oauth2_login(a.username, _read_token(a.oauth2_access_token_file))
                elif a.oauth2_access_token is not None:
                    self.client.oauth2_login(a.username, a.oauth2_access_token.get_secret_value())
                elif a.password is not None:
                    self.client.login(a.username, a.password.get_secret_value())
            except imap_exc.IMAPClientAbortError:
                raise
            except imap_exc.IMAPClientError as exc:
                # A NO to LOGIN/AUTHENTICATE: the credentials are wrong or the account locked.
                if fetched is not None and a.oauth2 is not None:
                    client_credentials(a.oauth2).refused(fetched)  # revoked: fetch anew next time
                raise AuthenticationError(f"login as {a.username} refused: {exc}") from exc
            self._capabilities = frozenset(self.client.capabilities())

    def enable_condstore(self, qresync: bool = False) -> bool:
        """ENABLE CONDSTORE when offered (RFC 7162), or QRESYNC (which implies it) when
        ``qresync`` and offered. Returns whether MODSEQs are available.

        With QRESYNC on, the server reports expunges as ``* VANISHED uid-set`` instead of
        ``* n EXPUNGE`` (section 3.2.10); :meth:`_classify` reads both.
        """
        self.condstore = self.qresync = False
        if qresync and b"QRESYNC" in self._capabilities:
            with _wire("enable"):
                enabled = self.client.enable("QRESYNC")
            # ENABLE answers with what it enabled (RFC 5161); a refusal leaves CONDSTORE.
            self.condstore = self.qresync = b"QRESYNC" in [e.upper() for e in enabled]
        if not self.condstore and b"CONDSTORE" in self._capabilities:
            with _wire("enable"):
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
                with _wire(f"select {folder} (qresync)"):
                    info = self._select_qresync(folder, readonly, qresync)
            except ImapProtocolError as exc:
                # A refused parameter must not refuse the folder: a plain SELECT decides that,
                # and the check lists the folder as without QRESYNC.
                log.warning("imap %s: %s; selecting without QRESYNC", self.account.name, exc)
                use_qresync = False
        try:
            if info is None:
                with _wire(f"select {folder}"):
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
            raise imap_exc.IMAPClientError(f"select failed: {_text(data[-1] or b'')}")
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
        with _wire(f"status {folder}"):
            info = self.client.folder_status(folder, what)
        hms = info.get(b"HIGHESTMODSEQ")
        return FolderStatus(
            uidvalidity=int(info[b"UIDVALIDITY"]),
            uidnext=int(info[b"UIDNEXT"]),
            highestmodseq=int(hms) if hms is not None else None,
            exists=int(info[b"MESSAGES"]),
        )

    def folder_exists(self, folder: str) -> bool:
        with _wire(f"list {folder}"):
            return bool(self.client.folder_exists(folder))

    def create_folder(self, folder: str) -> None:
        with _wire(f"create {folder}"):
            if not self.client.folder_exists(folder):
                self.client.create_folder(folder)

    # --- search ------------------------------------------------------------------------------

    def search(self, criteria: list[Any]) -> UidSet:
        """The UIDs matching ``criteria``, as ranges.

        With ESEARCH (RFC 4731) the server sends the ranges themselves
        (``UID SEARCH RETURN (ALL) ...``), so a folder of any size costs a few bytes here;
        without it, the plain SEARCH answer is compacted.
        """
        if b"ESEARCH" not in self._capabilities:
            return UidSet.from_uids(self.client.search(criteria))
        args = [b"RETURN", b"(ALL)", *_normalise_search_criteria(criteria, None)]
        # imapclient has no ESEARCH: its raw command, with the untagged ESEARCH answer.
        lines = self.client._raw_command_untagged(b"SEARCH", args, response_name="ESEARCH")
        try:
            return parse_esearch(lines)
        except ValueError as exc:
            raise ImapProtocolError(f"search {criteria!r}: {exc}") from exc

    def uids_from(self, first_uid: int) -> UidSet:
        """UIDs >= first_uid, ascending. ("N:*" always matches the highest UID, so filter.)"""
        with _wire("search uid"):
            return self.search(["UID", f"{max(first_uid, 1)}:*"]).from_uid(first_uid)

    def uids_larger(self, first_uid: int, last_uid: int, size: int) -> UidSet:
        """UIDs in ``first_uid..last_uid`` of mails over ``size`` bytes (SEARCH LARGER)."""
        with _wire("search larger"):
            found = self.search(["UID", f"{first_uid}:{last_uid}", "LARGER", str(size)])
        return found.between(first_uid, last_uid)

    def all_uids(self) -> UidSet:
        with _wire("search all"):
            return self.search(["ALL"])

    def uids_since(self, day: dt.date) -> UidSet:
        with _wire("search since"):
            return self.search(["SINCE", day])

    def uids_changed_since(self, modseq: int) -> UidSet:
        """UIDs whose MODSEQ is greater than ``modseq`` (RFC 7162 SEARCH MODSEQ)."""
        with _wire("search modseq"):
            return self.search(["MODSEQ", str(modseq + 1)])

    def message_ids_in(self, folder: str, message_ids: Sequence[str]) -> set[str]:
        """Which of ``message_ids`` another folder holds (``SEARCH HEADER Message-ID``, read-only),
        for the expunge-vs-move decision.

        One EXAMINE for all of them, then one SEARCH per ``SEARCH_OR_CHUNK`` ids joined by OR:
        a mass delete (nothing found) costs a round trip per chunk; a chunk with a hit is asked
        again id by id, to know which ones. Leaves ``folder`` selected read-only: the caller
        re-selects its own folder.
        """
        found: set[str] = set()
        if not message_ids:
            return found
        with _wire(f"examine {folder}"):
            if not self.client.folder_exists(folder):
                return found
            self.client.select_folder(folder, readonly=True)
        for start in range(0, len(message_ids), SEARCH_OR_CHUNK):
            chunk = message_ids[start : start + SEARCH_OR_CHUNK]
            with _wire(f"search {folder}"):
                if len(chunk) > 1 and not self.search(_any_message_id(chunk)):
                    continue
                found.update(m for m in chunk if self.search(_any_message_id([m])))
        return found

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
        with _wire("fetch size"):
            found = self._uid_fetch(uids, ["RFC822.SIZE"])
        return {uid: int(item.get(b"RFC822.SIZE", 0)) for uid, item in found.items()}

    def fetch(self, uids: Sequence[int]) -> list[FetchedMail]:
        """Full mails (BODY.PEEK[] leaves \\Seen alone), ascending by UID. Expunged UIDs are absent."""
        if not uids:
            return []
        items = ["BODY.PEEK[]", "FLAGS", "INTERNALDATE"]
        if self.condstore:
            items.append("MODSEQ")
        with _wire("fetch"):
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
                    flags=tuple(_text(f) for f in item.get(b"FLAGS", ())),
                    internal_date=_stdlib_tz(internal),
                    modseq=_modseq(item),
                )
            )
        return mails

    def flags(self, uids: Sequence[int]) -> list[FlagState]:
        if not uids:
            return []
        items = [b"FLAGS", b"MODSEQ"] if self.condstore else [b"FLAGS"]
        with _wire("fetch flags"):
            found = self.client.fetch(list(uids), items)
        return [
            FlagState(
                uid, tuple(_text(f) for f in found[uid].get(b"FLAGS", ())), _modseq(found[uid])
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
        with _wire("fetch flags"):
            # The same private imaplib calls as _uid_fetch (imapclient pinned <4.2).
            tag = imap._command("UID", "FETCH", f"{first_uid}:{last_uid}", "(FLAGS)")
            typ, data = imap._command_complete("FETCH", tag)
            client._checkok("fetch", typ, data)
            typ, data = imap._untagged_response(typ, data, "FETCH")
            found = parse_fetch(data, client.normalise_times)
        return [
            (uid, tuple(_text(f) for f in found[uid].get(b"FLAGS", ())))
            for uid in sorted(found)
            if first_uid <= uid <= last_uid
        ]

    # --- waiting -----------------------------------------------------------------------------

    def idle_until(
        self, deadline: float, should_stop: Callable[[], bool], slice_seconds: float
    ) -> IdleOutcome:
        """IDLE (RFC 2177) until the server announces a change, ``deadline`` (monotonic time)
        passes, or ``should_stop()``; then DONE. Returns what the server announced.

        Raises ConnectionLost when the connection turns out dead: EOF, BYE, or a DONE that gets
        no answer within the read timeout (a silent connection).
        """
        client = self.client
        with _wire("idle"):
            client.idle()
        responses: list[tuple[Any, ...]] = []
        suspicious = False
        try:
            while not should_stop():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait = min(slice_seconds, remaining)
                started = time.monotonic()
                with _wire("idle_check"):
                    got = client.idle_check(timeout=wait)
                if got:
                    responses += got
                    if self._classify(got).activity:
                        break
                    continue  # "* OK Still here" keep-alives
                if time.monotonic() - started < wait * _EARLY_FRACTION:
                    suspicious = True  # imapclient #565: an EOF or socket error was swallowed
                    break
        finally:
            # DONE must always be sent; on a dead or silent connection this raises.
            with _wire("idle_done"):
                _, tail = client.idle_done()
        responses += tail
        outcome = self._classify(responses)
        if suspicious and not outcome.activity:
            self.noop()  # prove the connection alive, or raise ConnectionLost
        return outcome

    @staticmethod
    def _classify(responses: Sequence[tuple[Any, ...]]) -> IdleOutcome:
        new_mail = expunged = flags_changed = other = False
        for response in responses:
            kind = response[1] if len(response) > 1 and isinstance(response[0], int) else None
            head = response[0] if response else None
            if head == b"BYE":
                raise ConnectionLost(f"server said BYE: {response[1:]!r}")
            if kind == b"EXISTS":
                new_mail = True
            elif kind == b"EXPUNGE" or head == b"VANISHED":
                expunged = True  # VANISHED: the expunge with QRESYNC enabled (RFC 7162 3.2.10)
            elif kind == b"FETCH":
                flags_changed = True
            elif head == b"OK" and _uidvalidity_code(response):
                other = True  # "* OK [UIDVALIDITY n]": the sync's STATUS compares it
            elif kind == b"RECENT" or head == b"OK":
                continue  # "* OK Still here" keep-alives and RECENT counters
            else:
                other = True  # anything unknown: a full re-sync is the safe answer
        return IdleOutcome(new_mail, expunged, flags_changed, other)

    def noop(self) -> IdleOutcome:
        """NOOP: what changed, as IDLE would say it. Dovecot answers a NOOP in a session whose
        folder changed UIDVALIDITY or was deleted with ``* BYE IMAP session state is
        inconsistent, please relogin.`` and closes: that BYE is in the ConnectionLost."""
        client = self.client
        try:
            with _wire("noop"):
                _, responses = client.noop()
        except ConnectionLost as exc:
            bye = client._imap.untagged_responses.get("BYE")
            if bye:
                raise ConnectionLost(f"noop: server said BYE: {_text(bye[-1])}") from exc
            raise
        return self._classify(responses)

    # --- side effects ------------------------------------------------------------------------

    def add_flags(self, uids: Sequence[int], flags: Sequence[str]) -> None:
        if uids:
            with _wire("store"):
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
        with _wire(f"move {folder}"):
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


def socket_is_timeout(exc: BaseException) -> bool:
    """True when a ConnectionLost came from a read timeout (a silent connection)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.timeout | TimeoutError):
            return True
        cause = cause.__cause__
    return False
