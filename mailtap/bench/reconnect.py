"""``mailtap bench reconnect``: what a reconnect costs to learn the expunges of an outage, with
and without QRESYNC (RFC 7162), on one big folder of the local Dovecot.

Setup: a fresh account whose INBOX holds ``--mails`` small mails (written into the maildir and
indexed with ``doveadm force-resync``: APPEND is ~150 mail/s, PITFALLS.md), and an account index
holding every UID of it, as a source rebuilds it from Kafka at start. The HIGHESTMODSEQ then is
the watermark (the cursor's ``vanished_modseq``). "While the source is down", ``--expunged``
mails spread over the folder are expunged and as many get a flag.

Each round reconnects both ways, with mailtap's own code (``ImapConnection``, ``AccountIndex``):

- listing (``imap.qresync: off``, or a server without QRESYNC): connect, login, ENABLE
  CONDSTORE, SELECT, ``UID SEARCH ALL`` (ESEARCH ranges on Dovecot), the index's UIDs of the
  folder, and the difference;
- the same against a server without ESEARCH (hidden from the connection): a plain
  ``UID SEARCH ALL`` answer with every UID;
- qresync: connect, login, ENABLE QRESYNC, ``SELECT INBOX (QRESYNC (uidvalidity watermark
  1:last))``, the index's UIDs of the folder, and their intersection with ``VANISHED``.

Both must find the same gone UIDs (checked and printed). Figures: wall time (median of the
rounds), bytes read from and sent to the server, commands sent, and the ratios. Figures, not
assertions. The rest of a restart (the Kafka index rebuild, the CONDSTORE flag sync, new mail)
is the same on both paths and not measured here.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.index import AccountIndex
from connectors.imap.qresync import QresyncRequest, vanished_candidates
from mailtap.bench.ingest import _account, _services
from mailtap.dev import DevServices

ACCOUNT = "bench"
#: Index registrations per SQLite transaction while the bench fills the index.
REGISTER_CHUNK = 5000


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _mail(tag: str, i: int) -> bytes:
    return (
        f"Message-ID: <reconnect-{i}-{tag}@example.com>\r\nFrom: s{i}@example.com\r\n"
        f"To: bench@example.com\r\nSubject: mail {i}\r\n"
        f"Date: Sun, 29 Nov 2026 12:00:00 +0000\r\n\r\nsmall mail {i}\r\n"
    ).encode()


def _populate(info: DevServices, username: str, password: str, tag: str, count: int) -> None:
    """Small mails straight into the maildir, then Dovecot indexes them (the fast path)."""
    conn = _connection(info, username, password)
    conn.select("INBOX", readonly=True)  # creates the maildir
    conn.logout()
    maildir = info.imap.mail_dir / username / "Maildir"
    owner = maildir.stat()
    host, now = socket.gethostname(), int(time.time())
    for i in range(count):
        data = _mail(tag, i)
        # S= and W= as Dovecot's own delivery writes them (see mailtap.bench.ingest).
        path = maildir / "cur" / f"{now}.M{i}P{os.getpid()}.{host},S={len(data)},W={len(data)}:2,"
        path.write_bytes(data)
        os.chown(path, owner.st_uid, owner.st_gid)
    info.doveadm("force-resync", "-u", username, "INBOX")


def _connection(info: DevServices, username: str, password: str) -> ImapConnection:
    account = ImapAccountSettings.model_validate(_account(info, username, password, ACCOUNT))
    conn = ImapConnection(account, connect_timeout=10, read_timeout=120)
    conn.connect()
    conn.login()
    return conn


class _Wire:
    """Counts what one connection reads and sends, and its commands (imaplib's tags)."""

    def __init__(self, conn: ImapConnection) -> None:
        self.read = self.sent = self.commands = 0
        imap = conn.client._imap
        wire = self
        file, send, new_tag = imap.file, imap.send, imap._new_tag

        class _File:
            def readline(self, *args: Any) -> bytes:
                line: bytes = file.readline(*args)
                wire.read += len(line)
                return line

            def read(self, *args: Any) -> bytes:
                data: bytes = file.read(*args)
                wire.read += len(data)
                return data

            def __getattr__(self, name: str) -> Any:
                return getattr(file, name)

        def counted_send(data: bytes) -> None:
            wire.sent += len(data)
            send(data)

        def counted_tag() -> bytes:
            wire.commands += 1
            tag: bytes = new_tag()
            return tag

        imap.file = _File()
        imap.send = counted_send
        imap._new_tag = counted_tag


@dataclass
class _Reconnect:
    seconds: float
    read: int
    sent: int
    commands: int
    gone: list[int]


def _reconnect(
    info: DevServices,
    username: str,
    password: str,
    check: Callable[[ImapConnection], list[int]],
) -> _Reconnect:
    started = time.perf_counter()
    conn = _connection(info, username, password)
    # Bytes and commands are counted after LOGIN (the same on both paths); the time includes
    # the connect and the LOGIN.
    wire = _Wire(conn)
    gone = check(conn)
    seconds = time.perf_counter() - started
    found = _Reconnect(seconds, wire.read, wire.sent, wire.commands, gone)
    conn.logout()  # not counted
    return found


def bench_reconnect(
    json_out: bool, mails: int = 50_000, expunged: int = 100, rounds: int = 5
) -> dict[str, Any]:
    info = _services()
    tag = uuid.uuid4().hex[:8]
    username, password = f"reconnect-{tag}@example.com", "bench"
    info.add_user(username, password)
    _say(f"populating INBOX with {mails} small mails ...")
    started = time.monotonic()
    _populate(info, username, password, tag, mails)
    figures: dict[str, Any] = {
        "mails": mails,
        "populate_seconds": round(time.monotonic() - started, 1),
    }

    conn = _connection(info, username, password)
    conn.enable_condstore(qresync=True)
    status = conn.select("INBOX")
    if not conn.qresync or not status.highestmodseq:
        raise RuntimeError("the local Dovecot does not offer QRESYNC; nothing to compare")
    uids = conn.all_uids()
    uidvalidity, watermark, last_uid = status.uidvalidity, status.highestmodseq, uids[-1]
    _say("filling the account index (what a start rebuilds from Kafka) ...")
    index = AccountIndex(ACCOUNT)
    for start in range(0, len(uids), REGISTER_CHUNK):
        index.register_many(
            [
                (f"{ACCOUNT}/mid:{uid}", "INBOX", uidvalidity, uid)
                for uid in uids[start : start + REGISTER_CHUNK]
            ]
        )
    # The outage: mails spread over the folder expunged, as many others flagged.
    step = max(len(uids) // max(expunged, 1), 1)
    doomed = [uids[i] for i in range(step // 2, len(uids), step)][:expunged]
    flagged = [uid + 1 for uid in doomed if uid + 1 in uids and uid + 1 not in doomed]
    conn.client.add_flags(flagged, [b"\\Flagged"], silent=True)
    conn.client.add_flags(doomed, [b"\\Deleted"], silent=True)
    conn.client.uid_expunge(doomed)
    conn.logout()
    figures.update(expunged=len(doomed), flagged=len(flagged))

    def forget(gone: Sequence[int]) -> list[int]:
        # As the worker does with what left (index.remove: None for a UID never published).
        return [uid for uid in gone if index.remove("INBOX", uid) is not None]

    def listing(c: ImapConnection) -> list[int]:
        c.enable_condstore(qresync=False)
        c.select("INBOX", readonly=True)
        known = index.uids("INBOX", uidvalidity)
        present = c.all_uids()
        return forget([u for u in known if u not in present and u <= last_uid])

    def listing_plain_search(c: ImapConnection) -> list[int]:
        # A server without ESEARCH (RFC 4731) answers with every UID, not ranges.
        c._capabilities = c._capabilities - {b"ESEARCH"}
        return listing(c)

    def qresync(c: ImapConnection) -> list[int]:
        c.enable_condstore(qresync=True)
        request = QresyncRequest(uidvalidity, watermark, last_uid)
        vanished = c.select("INBOX", readonly=True, qresync=request).vanished
        assert vanished is not None, "the server did not answer the QRESYNC SELECT"
        return forget(
            vanished_candidates(vanished, last_uid, lambda: index.uids("INBOX", uidvalidity))
        )

    checks = {"listing": listing, "listing_plain_search": listing_plain_search, "qresync": qresync}
    results: dict[str, list[_Reconnect]] = {name: [] for name in checks}
    for number in range(1, rounds + 1):
        _say(f"round {number} of {rounds}")
        for name, check in checks.items():
            results[name].append(_reconnect(info, username, password, check))
            # Back into the index: the next check starts from the same state.
            index.register_many([(f"{ACCOUNT}/mid:{u}", "INBOX", uidvalidity, u) for u in doomed])
    index.close()
    for name, runs in results.items():
        last = runs[-1]
        figures[name] = {
            "seconds_median": round(statistics.median(r.seconds for r in runs), 4),
            "seconds_all": [round(r.seconds, 4) for r in runs],
            "bytes_read": last.read,
            "bytes_sent": last.sent,
            "commands": last.commands,
            "gone_found": len(last.gone),
        }
    figures["same_gone_uids"] = all(r.gone == doomed for runs in results.values() for r in runs)
    qr = figures["qresync"]
    for name in ("listing", "listing_plain_search"):
        figures[f"time_ratio_{name}_to_qresync"] = round(
            figures[name]["seconds_median"] / qr["seconds_median"], 2
        )
        figures[f"bytes_read_ratio_{name}_to_qresync"] = round(
            figures[name]["bytes_read"] / qr["bytes_read"], 2
        )
    if not json_out:
        for name, value in figures.items():
            print(f"{name:40s} {value}")
    return figures
