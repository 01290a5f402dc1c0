"""``mailtap bench flag-listing``: what finding flag changes without CONDSTORE costs per catch-up
(connectors/imap/flaglisting.py), on the local Dovecot.

A mailbox of ``mails`` mails (half of them \\Seen, written as maildir files), then: the bytes of
one ``UID FETCH 1:N (FLAGS)`` answer on the wire (a raw socket), the time of the source's own
listing and comparison (``ImapConnection.flags_between`` in windows + ``FlagSnapshot.changed``,
min and median of 5), and the memory of the snapshot (tracemalloc). Figures, not assertions.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
import tracemalloc
import uuid
from typing import Any

from imapclient import IMAPClient

from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.flaglisting import FlagSnapshot, uid_windows
from mailtap.bench.ingest import _account, _say, _services
from mailtap.dev import DevServices

RUNS = 5


def _populate(info: DevServices, username: str, password: str, mails: int) -> None:
    client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
    client.login(username, password)
    client.select_folder("INBOX")  # creates the maildir
    client.logout()
    maildir = info.imap.mail_dir / username / "Maildir"
    owner = maildir.stat()
    now = int(time.time())
    for i in range(mails):
        data = f"Message-ID: <flags-{i}@example.com>\r\nSubject: {i}\r\n\r\nbody\r\n".encode()
        seen = "S" if i % 2 else ""
        name = f"{now}.M{i}P{os.getpid()}.bench,S={len(data)},W={len(data)}:2,{seen}"
        path = maildir / "cur" / name
        path.write_bytes(data)
        os.chown(path, owner.st_uid, owner.st_gid)
    info.doveadm("force-resync", "-u", username, "INBOX")


def _wire_bytes(info: DevServices, username: str, password: str, mails: int) -> int:
    """Bytes of the server's answer to one listing, as they cross the socket."""
    with socket.create_connection((info.imap.host, info.imap.port), timeout=60) as sock:
        answer = sock.makefile("rb")
        answer.readline()
        for tag, command in ((b"a", f"LOGIN {username} {password}"), (b"b", "SELECT INBOX")):
            sock.sendall(tag + b" " + command.encode() + b"\r\n")
            while not answer.readline().startswith(tag + b" "):
                pass
        sock.sendall(f"c UID FETCH 1:{mails} (FLAGS)\r\n".encode())
        total = 0
        while True:
            line = answer.readline()
            total += len(line)
            if not line or line.startswith(b"c "):
                return total


def bench_flag_listing(mails: int) -> dict[str, Any]:
    info = _services()
    if not info.imap.kind.startswith("dovecot"):
        raise RuntimeError("bench flag-listing populates through Dovecot's maildir and doveadm")
    username, password = f"flags-{uuid.uuid4().hex[:8]}@example.com", "bench"
    info.add_user(username, password)
    _say(f"populating a mailbox with {mails} mails ...")
    _populate(info, username, password, mails)
    figures: dict[str, Any] = {"mails": mails}
    try:
        wire = _wire_bytes(info, username, password, mails)
        figures["wire_bytes_per_listing"] = wire
        figures["wire_bytes_per_mail"] = round(wire / mails, 1)
        account = ImapAccountSettings.model_validate(_account(info, username, password))
        conn = ImapConnection(account, connect_timeout=10, read_timeout=120)
        conn.connect()
        conn.login()
        conn.select("INBOX", readonly=True)
        snapshot = FlagSnapshot()
        seconds = []
        for _ in range(RUNS):
            started = time.perf_counter()
            for low, high in uid_windows(1, mails):
                snapshot.changed(1, conn.flags_between(low, high))
            seconds.append(time.perf_counter() - started)
        figures["listing_and_diff_seconds_min"] = round(min(seconds), 3)
        figures["listing_and_diff_seconds_median"] = round(statistics.median(seconds), 3)
        listed = [
            pair for low, high in uid_windows(1, mails) for pair in conn.flags_between(low, high)
        ]
        tracemalloc.start()
        fresh = FlagSnapshot()
        fresh.remember(1, listed)
        figures["snapshot_mb"] = round(tracemalloc.get_traced_memory()[0] / 1e6, 2)
        tracemalloc.stop()
        conn.logout()
    finally:
        info.doveadm("expunge", "-u", username, "mailbox", "INBOX", "all", check=False)
    for name, value in figures.items():
        print(f"{name:40s} {value}")
    return figures
