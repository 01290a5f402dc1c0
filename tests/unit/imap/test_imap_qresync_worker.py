"""The worker with a QRESYNC server (RFC 7162), without services: which expunge check a
(re)connect makes, and when the cursor's ``vanished_modseq`` watermark may move."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from connectors.core.kafka.errors import TransactionAborted
from connectors.core.metrics import SourceMetrics
from connectors.imap.connection import FolderStatus
from connectors.imap.cursor import Cursor
from connectors.imap.index import AccountIndex
from connectors.imap.qresync import ExpungeCheck, QresyncRequest, parse_vanished
from connectors.imap.uidset import UidSet
from tests.unit.imap.fake_imap import FakeConnection, FakeServer, RecordingWriter
from tests.unit.imap.test_imap_worker import CountingStop, filled, make_worker


@dataclass
class QresyncServer(FakeServer):
    """A FakeServer that remembers at which MODSEQ each UID was expunged."""

    expunged_at: dict[int, int] = field(default_factory=dict)
    listings: int = 0
    qresync_selects: list[QresyncRequest] = field(default_factory=list)

    def expunge(self, uid: int, folder: str = "INBOX") -> None:
        self.modseq += 1
        del self.folders[folder][uid]
        self.expunged_at[uid] = self.modseq


class QresyncConnection(FakeConnection):
    qresync = True
    server: QresyncServer

    def select(self, folder: str, readonly: bool = False, qresync: object = None) -> FolderStatus:
        status = super().select(folder, readonly)
        s = self.server
        if not isinstance(qresync, QresyncRequest) or qresync.uidvalidity != s.uidvalidity:
            return status
        s.qresync_selects.append(qresync)
        vanished = UidSet.from_uids(
            u
            for u, m in s.expunged_at.items()
            if m > qresync.modseq and (not qresync.last_uid or u <= qresync.last_uid)
        )
        return FolderStatus(
            status.uidvalidity, status.uidnext, status.highestmodseq, status.exists, vanished
        )

    def all_uids(self) -> list[int]:
        self.server.listings += 1
        return super().all_uids()


def _run(
    server: QresyncServer,
    *,
    stored: Cursor | None = None,
    index: AccountIndex,
    writer: RecordingWriter | None = None,
    metrics: SourceMetrics | None = None,
    stop_after: int = 100,
) -> RecordingWriter:
    stop = CountingStop(stop_after)
    # The same index across runs: make_worker takes an empty one for None.
    worker, writer, _ = make_worker(
        server, stored=stored, writer=writer, stop=stop, metrics=metrics, index=index
    )
    worker._connection_factory = lambda: QresyncConnection(server, stop)  # type: ignore[assignment,return-value]
    worker.run()
    return writer


def _qresync_server(n: int) -> QresyncServer:
    plain = filled(n)
    return QresyncServer(folders=plain.folders, uidnext=plain.uidnext, modseq=plain.modseq)


def test_the_first_start_lists_the_folder_and_commits_its_modseq_as_the_watermark() -> None:
    server = _qresync_server(4)
    writer = _run(server, index=AccountIndex("a"))
    cursor = Cursor.from_json(dict(writer.last_offset))
    assert server.listings == 1 and server.qresync_selects == []
    assert cursor.vanished_modseq == server.modseq


def test_a_restart_learns_what_vanished_from_the_select_without_listing() -> None:
    server, index = _qresync_server(4), AccountIndex("a")
    stored = Cursor.from_json(dict(_run(server, index=index).last_offset))
    watermark = stored.vanished_modseq
    server.expunge(2)
    server.listings = 0
    metrics = SourceMetrics()
    writer = _run(server, stored=stored, index=index, metrics=metrics)
    assert server.qresync_selects == [QresyncRequest(server.uidvalidity, watermark, 4)]
    assert server.listings == 0
    tombstones = [r for r in writer.records if r.value is None]
    assert len(tombstones) == 1
    # The tombstone and the new watermark are one transaction.
    records, offsets = writer.transactions[-1]
    assert records == tombstones and offsets[-1]["vanished_modseq"] == server.modseq
    labels = {"source": "imap", "account": "a", "folder": "INBOX", "method": "qresync"}
    assert metrics.registry.get_sample_value("mailtap_expunge_checks_total", labels) == 1


def test_a_failed_tombstone_commit_keeps_the_watermark_and_the_retry_tombstones() -> None:
    server, index = _qresync_server(4), AccountIndex("a")
    stored = Cursor.from_json(dict(_run(server, index=index).last_offset))
    server.expunge(3)
    writer = RecordingWriter()
    writer.fail_next = TransactionAborted("broker said abort")
    _run(server, stored=stored, index=index, writer=writer)
    # The failed transaction left nothing; the retry (a new session) wrote the tombstone with
    # the watermark, although its own check no longer sees the UID in the index.
    assert [r.value for r in writer.records] == [None]
    assert Cursor.from_json(dict(writer.last_offset)).vanished_modseq == server.modseq


def test_without_a_watermark_or_with_another_uidvalidity_the_folder_is_listed() -> None:
    server, index = _qresync_server(3), AccountIndex("a")
    old = Cursor(uidvalidity=server.uidvalidity, last_uid=3)  # a cursor from before QRESYNC
    _run(server, stored=old, index=index)
    assert server.qresync_selects == [] and server.listings == 1
    server.listings = 0
    moved = Cursor(uidvalidity=server.uidvalidity - 1, last_uid=3, vanished_modseq=2)
    writer = _run(server, stored=moved, index=index)
    assert server.qresync_selects == [] and server.listings >= 1
    assert Cursor.from_json(dict(writer.last_offset)).epoch == 1  # a rescan, as before


def test_vanished_lines_parse_and_junk_is_refused() -> None:
    assert parse_vanished([b"(EARLIER) 5,1:3", "7"]).ranges == ((1, 3), (5, 5), (7, 7))
    with pytest.raises(ValueError, match="not a VANISHED"):
        parse_vanished([b"(EARLIER) 1:3 4"])
    with pytest.raises(ValueError):
        parse_vanished([b"(EARLIER) *"])


def test_an_unsettled_check_merged_with_a_later_one_waits_for_the_later_ticket() -> None:
    merged = ExpungeCheck(10, 3, found_gone=True).merged(ExpungeCheck(12, 7, found_gone=False))
    assert merged == ExpungeCheck(12, 7, found_gone=True)


def test_without_qresync_too_a_failed_tombstone_commit_is_decided_again() -> None:
    """The listing path had the same loss: the index forgot the key before the commit, so the
    retry's listing found nothing gone (until a restart rebuilt the index)."""
    server, index = filled(4), AccountIndex("a")
    stop = CountingStop()
    first, writer, _ = make_worker(server, stop=stop, index=index)
    first.run()
    del server.folders["INBOX"][3]
    again = RecordingWriter()
    again.fail_next = TransactionAborted("broker said abort")
    second, _, _ = make_worker(
        server, stored=Cursor.from_json(dict(writer.last_offset)), writer=again, index=index
    )
    second.run()
    assert [r.value for r in again.records] == [None]
