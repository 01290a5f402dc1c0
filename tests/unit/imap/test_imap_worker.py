"""The mailbox worker without services: state transitions, cursor logic, backoff use, batches."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from connectors.core.claimcheck.local import LocalClaimCheckStore
from connectors.core.claimcheck.store import ClaimCheckStore
from connectors.core.errors import AuthenticationError, RegistryUnavailable
from connectors.core.kafka.errors import FencedError, TransactionAborted
from connectors.core.kafka.offsets import canonical_json
from connectors.core.metrics import SourceMetrics
from connectors.core.source.location import SourceLocation
from connectors.imap import backfill as backfill_module
from connectors.imap.config import ImapSourceSettings
from connectors.imap.connection import FetchedMail
from connectors.imap.cursor import Cursor, PendingSideEffect
from connectors.imap.errors import ConnectionLost
from connectors.imap.index import AccountIndex
from connectors.imap.records import ChangeKind, ParsedBatch, RecordBuilder
from connectors.imap.state import WorkerState
from connectors.imap.worker import MailboxWorker
from tests.unit.imap.fake_imap import (
    FakeConnection,
    FakeServer,
    JsonSerde,
    RecordingWriter,
    fake_parse,
)

S = WorkerState


class CountingStop(threading.Event):
    """A stop event that records backoff waits and stops the worker after ``limit`` of them."""

    def __init__(self, limit: int = 100) -> None:
        super().__init__()
        self.delays: list[float | None] = []
        self.limit = limit

    def wait(self, timeout: float | None = None) -> bool:
        self.delays.append(timeout)
        if len(self.delays) >= self.limit:
            self.set()
        return self.is_set()


def make_worker(
    server: FakeServer,
    *,
    stored: Cursor | None = None,
    writer: RecordingWriter | None = None,
    stop: CountingStop | None = None,
    idle_rounds: int = 1,
    metrics: SourceMetrics | None = None,
    pipelined: bool = False,
    index: AccountIndex | None = None,
    builder: RecordBuilder | None = None,
    **account: Any,
) -> tuple[MailboxWorker, RecordingWriter, CountingStop]:
    stop = stop or CountingStop()
    writer = writer or RecordingWriter()
    settings = ImapSourceSettings.model_validate(
        {
            "accounts": [
                {
                    "name": "a",
                    "host": "h",
                    "username": "u",
                    "password": "p",
                    "start": "all",
                    **account,
                }
            ],
            "batch_size": 3,
            "backoff_initial_seconds": 0.01,
            "backoff_cap_seconds": 0.05,
        }
    )
    partition = SourceLocation("imap", "a", "INBOX").partition
    offsets = {canonical_json(partition): stored.to_json()} if stored else {}
    parsing = ThreadedParsing(fake_builder()) if pipelined else None
    worker = MailboxWorker(
        account=settings.accounts[0],
        folder="INBOX",
        settings=settings,
        builder=builder or fake_builder(),
        index=index if index is not None else AccountIndex("a"),
        metrics=metrics or SourceMetrics(),
        stop=stop,
        writer_factory=lambda _txn: writer,
        # What the writer committed last, as the offsets topic would say.
        read_offsets=lambda: (
            {canonical_json(partition): writer.last_offset} if writer.transactions else offsets
        ),
        connection_factory=lambda: FakeConnection(server, stop, idle_rounds),  # type: ignore[arg-type,return-value]
        transactional_id="t",
        watched_folders=["INBOX"],
        parsing=parsing,
    )
    return worker, writer, stop


def fake_builder() -> RecordBuilder:
    return RecordBuilder(
        account="a",
        folder="INBOX",
        parser=fake_parse,
        serde=JsonSerde(),  # type: ignore[arg-type]
        events_topic="ev",
        dlq_topic="dlq",
        max_record_bytes=1_000_000,
    )


class ThreadedParsing:
    """The parse pool's contract on two threads: default change kinds, a future per batch."""

    workers = 2

    def __init__(self, builder: RecordBuilder) -> None:
        self.builder = builder
        #: The processes have started (the source's warm-up is over).
        self.ready = True
        self.executor = ThreadPoolExecutor(2)
        self.batches: list[list[int]] = []
        #: Files a parse process wrote without fsync: the commit must make them durable.
        self.unsynced: tuple[str, ...] = ()

    def submit(
        self, mails: Sequence[FetchedMail], uidvalidity: int, rescan_until: int
    ) -> Future[ParsedBatch]:
        self.batches.append([m.uid for m in mails])

        def kind(mail: FetchedMail, key: str, _fp: str | None) -> tuple[str, ChangeKind]:
            return key, "RESCANNED" if mail.uid < rescan_until else "ADDED"

        def build() -> ParsedBatch:
            built = self.builder.build_all(list(mails), uidvalidity, kind)
            return ParsedBatch(built, self.unsynced)

        return self.executor.submit(build)


def events(writer: RecordingWriter) -> list[dict[str, Any]]:
    return [json.loads(r.value) for r in writer.records if r.topic == "ev" and r.value]


def filled(n: int) -> FakeServer:
    server = FakeServer()
    for i in range(n):
        server.append(f"m{i}\r\n\r\nbody".encode())
    return server


def test_a_session_walks_the_diagram_and_publishes_in_batches_with_the_cursor() -> None:
    server = filled(7)
    worker, writer, _ = make_worker(server)
    worker.run()
    assert worker.machine.history == [
        S.DISCONNECTED, S.CONNECTING, S.AUTHENTICATING, S.SELECTING, S.SYNCING, S.IDLE, S.STOPPED,
    ]  # fmt: skip
    # The pinned start position, then batches of 3, 3 and 1, each with its cursor.
    assert [len(records) for records, _ in writer.transactions] == [0, 3, 3, 1]
    assert [o[0]["last_uid"] for _, o in writer.transactions] == [0, 3, 6, 7]
    assert [e["change"] for e in events(writer)] == ["ADDED"] * 7
    assert writer.last_offset["uidvalidity"] == 100 and writer.last_offset["highestmodseq"] == 8


def test_mail_arriving_during_a_sync_is_published_before_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real server announces it in the sync's own answers (EXISTS among FETCH responses), so
    # the IDLE that follows would not: the worker must look again before it idles.
    server = filled(7)
    fetch = FakeConnection.fetch

    def fetch_while_mail_arrives(self: FakeConnection, uids: Sequence[int]) -> list[FetchedMail]:
        if server.uidnext["INBOX"] == 8:
            server.append(b"late\r\n\r\nbody")
        return fetch(self, uids)

    idle = FakeConnection.idle_until
    published_at_idle: list[int] = []

    def idle_until(self: FakeConnection, *args: Any) -> Any:
        published_at_idle.append(len(events(writer)))
        return idle(self, *args)

    monkeypatch.setattr(FakeConnection, "fetch", fetch_while_mail_arrives)
    monkeypatch.setattr(FakeConnection, "idle_until", idle_until)
    worker, writer, _ = make_worker(server)
    worker.run()
    assert published_at_idle == [8]
    assert writer.last_offset["last_uid"] == 8


def test_a_missing_folder_is_said_once_then_read_once_it_exists(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FakeServer(folders={}, uidnext={})

    class FolderCreatedLater(CountingStop):
        def wait(self, timeout: float | None = None) -> bool:
            if len(self.delays) == 4:  # four looks at the backoff cap's pace, then it is back
                server.folders["INBOX"], server.uidnext["INBOX"] = {}, 1
                server.append(b"m\r\n\r\nbody")
            return super().wait(timeout)

    caplog.set_level(logging.INFO)
    worker, writer, stop = make_worker(server, stop=FolderCreatedLater())
    worker.run()
    said = [r for r in caplog.records if "folder does not exist on the server" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
    assert stop.delays[:4] == [worker.settings.backoff_cap_seconds] * 4
    assert "the folder exists again" in caplog.text
    assert [e["change"] for e in events(writer)] == ["ADDED"]
    assert worker.machine.history[-3:] == [S.SYNCING, S.IDLE, S.STOPPED]


def test_a_restart_from_the_stored_cursor_publishes_nothing_again() -> None:
    server = filled(4)
    first, writer, _ = make_worker(server)
    first.run()
    stored = Cursor.from_json(dict(writer.last_offset))
    second, again, _ = make_worker(server, stored=stored)
    second.run()
    assert again.records == []


def test_flag_change_publishes_one_updated_event_and_moves_highestmodseq() -> None:
    server = filled(3)
    first, writer, _ = make_worker(server)
    first.run()
    server.flag(2, "\\Flagged")
    second, again, _ = make_worker(server, stored=Cursor.from_json(dict(writer.last_offset)))
    second.run()
    updates = events(again)
    assert [(e["change"], e["source"]["uid"], e["flags"]) for e in updates] == [
        ("UPDATED", 2, ["\\Flagged"])
    ]
    assert again.last_offset["highestmodseq"] == server.modseq


def test_a_mail_published_above_highestmodseq_is_not_published_again_unchanged() -> None:
    server = filled(2)
    # Mail 2 went out at its current MODSEQ after highestmodseq was taken (it is in ``fresh``).
    stored = Cursor(100, 2, highestmodseq=2, fresh=((2, server.folders["INBOX"][2].modseq),))
    worker, writer, _ = make_worker(server, stored=stored)
    worker.run()
    assert events(writer) == []
    assert (
        writer.last_offset["fresh"] == [] and writer.last_offset["highestmodseq"] == server.modseq
    )


def test_uidvalidity_change_rescans_every_mail_in_a_new_epoch() -> None:
    server = filled(4)
    metrics = SourceMetrics()
    worker, writer, _ = make_worker(server, stored=Cursor(99, 4, 5, epoch=3), metrics=metrics)
    worker.run()
    assert [e["change"] for e in events(writer)] == ["RESCANNED"] * 4
    assert writer.last_offset["epoch"] == 4 and writer.last_offset["uidvalidity"] == 100
    assert (
        metrics.registry.get_sample_value(
            "mailtap_uidvalidity_changes_total",
            {"source": "imap", "account": "a", "folder": "INBOX"},
        )
        == 1
    )


def test_bad_mail_gives_event_plus_dlq_and_a_parser_crash_gives_dlq_only_cursor_moves_on() -> None:
    server = FakeServer()
    server.append(b"ok1\r\n\r\nx")
    server.append(b"bad\r\n\r\nBAD")
    server.append(b"boom\r\n\r\nBOOM")
    worker, writer, _ = make_worker(server)
    worker.run()
    (batch, offsets) = writer.transactions[1]
    assert [(r.topic, r.key) for r in batch] == [
        ("ev", b"a/mid:ok1"), ("ev", b"a/mid:bad"), ("dlq", b"a/mid:bad"), ("dlq", b"a/INBOX/100/3"),
    ]  # fmt: skip
    headers = dict(batch[2].headers)
    assert headers["mailtap.error.kind"] == b"parse_error" and headers["mailtap.source.uid"] == b"2"
    assert dict(batch[3].headers)["mailtap.error.kind"] == b"unparseable"
    assert offsets[0]["last_uid"] == 3


def test_authentication_failure_backs_off_at_the_cap_every_time() -> None:
    server = FakeServer(fail_login=AuthenticationError("no"), sticky=True)
    metrics = SourceMetrics()
    worker, writer, stop = make_worker(server, stop=CountingStop(limit=3), metrics=metrics)
    worker.run()
    assert stop.delays == [0.05, 0.05, 0.05]
    assert (
        metrics.registry.get_sample_value(
            "mailtap_auth_failures_total", {"source": "imap", "account": "a", "folder": "INBOX"}
        )
        == 3
    )
    assert writer.records == [] and worker.machine.history.count(S.BACKOFF) == 3


def test_a_lost_connection_backs_off_with_jitter_then_reconnects_and_resets() -> None:
    server = filled(2)
    server.fail_connect = ConnectionLost("reset")
    worker, writer, stop = make_worker(server)
    worker.run()
    assert len(stop.delays) == 1 and 0 <= (stop.delays[0] or 0) <= 0.01
    assert server.connects == 2 and worker.backoff.attempt == 0
    assert len(events(writer)) == 2


def test_an_aborted_transaction_is_redone_from_the_committed_cursor() -> None:
    server = filled(3)
    writer = RecordingWriter()
    worker, _, stop = make_worker(server, writer=writer)
    original = writer.write
    calls = {"n": 0}

    def flaky(records: Any, offsets: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the first batch
            raise TransactionAborted("broker hiccup")
        original(records, offsets)

    writer.write = flaky  # type: ignore[method-assign]
    worker.run()
    assert [e["source"]["uid"] for e in events(writer)] == [1, 2, 3]
    assert len(stop.delays) == 1


def test_fenced_worker_stops_for_good() -> None:
    server = filled(2)
    writer = RecordingWriter()
    writer.fail_next = FencedError("another instance")
    worker, _, stop = make_worker(server, writer=writer)
    worker.run()
    assert worker.fenced and worker.machine.state is S.STOPPED
    assert server.connects == 1 and stop.delays == []


def test_after_commit_move_records_moving_then_moved_with_the_new_folder() -> None:
    server = filled(2)
    worker, writer, _ = make_worker(server, after_commit="move:Done")
    worker.run()
    batch_offsets = writer.transactions[1][1][0]
    assert batch_offsets["pending"]["action"] == "move:Done"  # MOVING, with the batch
    assert batch_offsets["pending"]["uids"] == [1, 2]
    moved_records, moved_offsets = writer.transactions[2]
    assert moved_offsets[0]["pending"] is None  # MOVED
    assert [json.loads(r.value)["source"]["folder"] for r in moved_records] == ["Done", "Done"]
    assert server.folders["INBOX"] == {} and len(server.folders["Done"]) == 2
    # Where they are now, from the server's COPYUID: the UIDs the target folder gave them.
    assert [
        (json.loads(r.value)["source"]["uidvalidity"], json.loads(r.value)["source"]["uid"])
        for r in moved_records
    ] == [(100, 1), (100, 2)]
    assert worker.index.uids("Done", 100).tolist() == [1, 2]


def test_a_move_without_copyuid_publishes_the_new_folder_without_a_uid() -> None:
    server = filled(1)
    worker, writer, _ = make_worker(server, after_commit="move:Done")
    connection = FakeConnection
    original = connection.move

    def no_copyuid(self: FakeConnection, uids: Any, folder: str) -> None:
        original(self, uids, folder)

    connection.move = no_copyuid  # type: ignore[assignment,method-assign]
    try:
        worker.run()
    finally:
        connection.move = original  # type: ignore[method-assign]
    (moved,) = writer.transactions[2][0]
    source = json.loads(moved.value)["source"]
    assert (source["folder"], source["uidvalidity"], source["uid"]) == ("Done", None, None)


@pytest.mark.parametrize("already_moved", [False, True])
def test_an_unfinished_move_is_repaired_at_start(already_moved: bool) -> None:
    server = filled(2)
    FakeConnection(server, threading.Event()).create_folder("Done")
    if already_moved:  # the crash came after the move, before its confirmation
        FakeConnection(server, threading.Event()).move([1, 2], "Done")
    stored = Cursor(100, 2, 3, pending=PendingSideEffect("move:Done", (1, 2), target_uidnext=1))
    worker, writer, _ = make_worker(server, stored=stored, after_commit="move:Done")
    worker.run()
    repaired_records, repaired_offsets = writer.transactions[0]
    assert repaired_offsets[0]["pending"] is None
    assert sorted(json.loads(r.value)["source"]["folder"] for r in repaired_records) == ["Done"] * 2
    assert sorted(json.loads(r.value)["source"]["uid"] for r in repaired_records) == [1, 2]
    assert server.folders["INBOX"] == {} and len(server.folders["Done"]) == 2


def test_flag_changes_of_mail_before_the_start_position_are_not_published() -> None:
    server = filled(3)
    first, writer, _ = make_worker(server, start="latest")
    first.run()
    server.flag(1, "\\Seen")  # never published: start=latest skipped it
    server.append(b"m-new\r\n\r\nx")
    second, again, _ = make_worker(server, stored=Cursor.from_json(dict(writer.last_offset)))
    second.run()
    assert [(e["change"], e["source"]["uid"]) for e in events(again)] == [("ADDED", 4)]


def test_a_server_refusing_status_on_the_selected_folder_still_syncs() -> None:
    server = filled(4)
    server.refuse_status = True
    worker, writer, _ = make_worker(server)
    worker.run()
    assert len(events(writer)) == 4 and writer.last_offset["last_uid"] == 4


def test_after_commit_seen_publishes_the_flag_change_without_waiting_for_a_poll() -> None:
    server = filled(2)
    worker, writer, _ = make_worker(server, after_commit="seen")
    worker.run()  # one IDLE round only: the UPDATED events must come before it
    assert [(e["change"], e["flags"]) for e in events(writer)] == [
        ("ADDED", []), ("ADDED", []), ("UPDATED", ["\\Seen"]), ("UPDATED", ["\\Seen"]),
    ]  # fmt: skip
    assert writer.last_offset["pending"] is None


def _storing_parse(raw: bytes, *, claim_check: ClaimCheckStore, **kwargs: Any) -> Any:
    parsed = fake_parse(raw, **kwargs)
    parsed.event["raw_ref"] = claim_check.put(raw, kind="raw").to_avro()
    return parsed


class BlobCheckingWriter(RecordingWriter):
    """Reads every referenced blob back at commit time: it must be in the store by then."""

    def __init__(self, store: LocalClaimCheckStore) -> None:
        super().__init__()
        self.store = store
        self.readable: list[bool] = []

    def write(
        self, records: Any, offsets: Any, before_commit: Callable[[], None] | None = None
    ) -> None:
        def check() -> None:
            if before_commit is not None:
                before_commit()
            for record in records:
                if record.topic == "ev" and record.value:
                    uri = json.loads(record.value)["raw_ref"]["uri"]
                    self.readable.append(self.store.get(uri).startswith(b"m"))

        super().write(records, offsets, check)


def _storing_builder(store: LocalClaimCheckStore) -> RecordBuilder:
    """A builder whose parser puts every body into ``store`` (a blob per mail)."""
    return RecordBuilder(
        account="a",
        folder="INBOX",
        parser=functools.partial(_storing_parse, claim_check=store),
        serde=JsonSerde(),  # type: ignore[arg-type]
        events_topic="ev",
        dlq_topic="dlq",
        max_record_bytes=1_000_000,
        claim_check=store,
    )


def test_a_batch_s_blobs_are_in_the_store_when_its_transaction_commits(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    writer = BlobCheckingWriter(store)
    worker, _, _ = make_worker(filled(5), writer=writer, builder=_storing_builder(store))
    worker.run()
    assert writer.readable == [True] * 5
    assert [len(records) for records, _ in writer.transactions] == [0, 3, 2]
    store.close()


def test_a_failed_transaction_leaves_complete_blobs_only(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    writer = RecordingWriter()
    worker, _, stop = make_worker(
        filled(2), writer=writer, stop=CountingStop(limit=1), builder=_storing_builder(store)
    )
    writer.fail_next = None
    original = writer.write
    calls = []

    def failing(records: Any, offsets: Any, before_commit: Any = None) -> None:
        calls.append(len(records))
        if records:
            raise TransactionAborted("broker said no")
        original(records, offsets, before_commit)

    writer.write = failing  # type: ignore[method-assign]
    worker.run()
    assert calls[:2] == [0, 2] and stop.delays  # the batch failed and the worker backed off
    stored = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert stored == sorted(hashlib.sha256(b"m%d\r\n\r\nbody" % i).hexdigest() for i in range(2))
    store.close()


# --- the pipelined backfill (more new mails than one batch, a parse pool) --------------------


def test_a_pipelined_backfill_commits_the_same_batches_in_uid_order() -> None:
    serial, serial_writer, _ = make_worker(filled(10))
    serial.run()
    worker, writer, _ = make_worker(filled(10), pipelined=True)
    worker.run()
    assert worker._parsing is not None and worker._parsing.batches == [  # type: ignore[attr-defined]
        [1, 2, 3], [4, 5, 6], [7, 8, 9], [10],
    ]  # fmt: skip
    assert_whole_batches_in_order(writer, [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]])
    assert [e["source"]["uid"] for e in events(writer)] == list(range(1, 11))
    assert [e["change"] for e in events(writer)] == ["ADDED"] * 10
    assert writer.last_offset == serial_writer.last_offset


def test_a_failed_commit_drops_the_batches_behind_it_and_the_retry_publishes_each_mail_once() -> (
    None
):
    server = filled(10)
    writer = RecordingWriter()
    original = writer.write
    calls = {"n": 0}

    def flaky(records: Any, offsets: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # the second batch of the backfill
            raise TransactionAborted("broker hiccup")
        original(records, offsets)

    writer.write = flaky  # type: ignore[method-assign]
    worker, _, stop = make_worker(server, writer=writer, pipelined=True)
    worker.run()
    assert [e["source"]["uid"] for e in events(writer)] == list(range(1, 11))
    assert len(stop.delays) == 1 and writer.last_offset["last_uid"] == 10


def test_a_pipelined_mail_the_account_published_in_another_folder_is_updated() -> None:
    index = AccountIndex("a")
    index.register("a/mid:m4", "Archive", 7, 1)
    worker, writer, _ = make_worker(filled(6), pipelined=True, index=index)
    worker.run()
    changes = {e["source"]["uid"]: e["change"] for e in events(writer)}
    assert changes == {1: "ADDED", 2: "ADDED", 3: "ADDED", 4: "ADDED", 5: "UPDATED", 6: "ADDED"}
    assert index.uids("INBOX", 100).tolist() == [1, 2, 3, 4, 5, 6]


def test_a_pipelined_rescan_after_a_uidvalidity_change_is_rescanned() -> None:
    worker, writer, _ = make_worker(filled(7), stored=Cursor(99, 4, 5, epoch=3), pipelined=True)
    worker.run()
    assert [e["change"] for e in events(writer)] == ["RESCANNED"] * 7


def test_a_pipelined_backfill_fenced_midway_stops_for_good() -> None:
    writer = RecordingWriter()
    original = writer.write
    calls = {"n": 0}

    def fenced_later(records: Any, offsets: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise FencedError("another instance")
        original(records, offsets)

    writer.write = fenced_later  # type: ignore[method-assign]
    worker, _, stop = make_worker(filled(10), writer=writer, pipelined=True)
    worker.run()
    assert worker.fenced and stop.delays == []
    assert [e["source"]["uid"] for e in events(writer)] == [1, 2, 3]


def test_batches_are_cut_by_bytes_with_only_the_large_mails_sized() -> None:
    server = FakeServer()
    for i in range(7):
        body = b"x" * (500 if i in (2, 5) else 10)  # two mails above budget / batch_size
        server.append(f"m{i}\r\n\r\n".encode() + body)
    worker, writer, _ = make_worker(server)
    worker.settings = worker.settings.model_copy(update={"max_batch_bytes": 600})
    worker.run()
    # batch_size 3 and 600 bytes: a mail up to 200 bytes fits a full batch unsized; uids 3
    # and 6 (~506 bytes) are sized and go alone.
    batches = [[json.loads(r.value)["source"]["uid"] for r in t[0]] for t in writer.transactions]
    assert batches[1:] == [[1, 2], [3], [4, 5], [6], [7]]
    assert server.size_searches == 1  # one SEARCH LARGER for the window


def test_a_pipelined_batch_commits_only_once_its_unsynced_pack_is_durable(tmp_path: Path) -> None:
    pack = tmp_path / "batch.pack"
    pack.write_bytes(b"blobs")
    worker, writer, stop = make_worker(filled(7), pipelined=True)
    parsing = worker._parsing
    assert isinstance(parsing, ThreadedParsing)
    parsing.unsynced = (str(tmp_path / "gone.pack"),)  # fsync fails: nothing may commit
    stop.limit = 1
    worker.run()
    assert writer.transactions[1:] == [] and len(stop.delays) == 1
    parsing.unsynced = (str(pack),)
    worker, writer, _ = make_worker(filled(7), pipelined=True)
    worker._parsing = parsing
    worker.run()
    assert_whole_batches_in_order(writer, [[1, 2, 3], [4, 5, 6], [7]])


def test_the_first_batch_is_published_in_the_mailbox_thread_while_the_parse_processes_start() -> (
    None
):
    # Issue 29: the pool's warm-up (spawn and imports) must not hold the first event back; the
    # rest of the backlog goes to the pool (waiting for it), in UID order.
    worker, writer, _ = make_worker(filled(10), pipelined=True)
    parsing = worker._parsing
    assert isinstance(parsing, ThreadedParsing)
    parsing.ready = False
    worker.run()
    assert parsing.batches == [[4, 5, 6], [7, 8, 9], [10]]  # the first batch was not submitted
    assert_whole_batches_in_order(writer, [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]])


def assert_whole_batches_in_order(writer: RecordingWriter, batches: list[list[int]]) -> None:
    """After the pinned start position, each transaction holds whole fetched batches, in UID
    order, with the cursor at its last UID."""
    expected = iter(batches)
    for records, offsets in writer.transactions[1:]:
        uids = [json.loads(r.value)["source"]["uid"] for r in records]
        taken: list[int] = []
        while len(taken) < len(uids):
            taken += next(expected)
        assert uids == taken and offsets[0]["last_uid"] == uids[-1]
    assert next(expected, None) is None


def test_batches_parsed_while_the_committer_was_busy_share_one_transaction() -> None:
    writer = RecordingWriter()
    original = writer.write
    first = threading.Event()

    def slow_first(records: Any, offsets: Any, before_commit: Any = None) -> None:
        if records and not first.is_set():
            first.set()
            time.sleep(0.3)  # the next batches are parsed meanwhile
        original(records, offsets, before_commit)

    writer.write = slow_first  # type: ignore[method-assign]
    worker, _, _ = make_worker(filled(13), writer=writer, pipelined=True)
    worker.run()
    assert_whole_batches_in_order(writer, [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12], [13]])
    sizes = [len(records) for records, _ in writer.transactions[1:]]
    assert sizes[0] == 3 and max(sizes) > 3  # later batches went out together
    assert [e["source"]["uid"] for e in events(writer)] == list(range(1, 14))


def test_a_pipelined_backfill_reports_committed_mails_with_rate_and_time_left(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(backfill_module, "PROGRESS_EVERY", 4)
    worker, writer, _ = make_worker(filled(10), pipelined=True)
    with caplog.at_level("INFO", logger="connectors.imap.backfill"):
        worker.run()
    lines = [r.getMessage() for r in caplog.records if "mails published" in r.getMessage()]
    # Counted as batches of 3 commit, so the lines come at 6/10 and 9/10 (past 4 and 8).
    assert [line.split(": ")[1].split(" mails")[0] for line in lines] == ["6/10", "9/10"]
    assert all(line.endswith(" s left)") and "/s, about " in line for line in lines)
    assert [e["source"]["uid"] for e in events(writer)] == list(range(1, 11))


def fail_on_commit(writer: RecordingWriter, number: int, exc: BaseException) -> None:
    """Make the ``number``-th write (from 1) raise ``exc``; the others commit."""
    original = writer.write
    calls = {"n": 0}

    def write(records: Any, offsets: Any) -> None:
        calls["n"] += 1
        if calls["n"] == number:
            raise exc
        original(records, offsets)

    writer.write = write  # type: ignore[method-assign]


def flag_all(server: FakeServer, flag: str, one_modseq: bool) -> None:
    """Flag every mail of INBOX: one STORE giving all the same MODSEQ, or one each."""
    if one_modseq:
        server.modseq += 1
    for mail in server.folders["INBOX"].values():
        if not one_modseq:
            server.modseq += 1
        mail.flags, mail.modseq = (*mail.flags, flag), server.modseq


@pytest.mark.parametrize("one_modseq", [True, False], ids=["one-store", "a-store-each"])
def test_a_mass_flag_change_keeps_the_cursor_small_and_survives_a_failed_commit(
    one_modseq: bool,
) -> None:
    server = filled(40)
    first, writer, _ = make_worker(server)
    first.run()
    flag_all(server, "\\Seen", one_modseq)
    again = RecordingWriter()
    # The sixth batch of the change sync fails; the rest is redone.
    fail_on_commit(again, 6, TransactionAborted("broker hiccup"))
    worker, _, stop = make_worker(
        server, stored=Cursor.from_json(dict(writer.last_offset)), writer=again
    )
    worker.run()
    updated = [e["source"]["uid"] for e in events(again) if e["change"] == "UPDATED"]
    assert sorted(updated) == list(range(1, 41))  # each change once, through the retry
    assert len(stop.delays) == 1
    cursors = [offsets[-1] for _, offsets in again.transactions]
    # The cursor does not list the published changes: its size does not grow with them.
    assert all(c["fresh"] == [] for c in cursors)
    marks = [tuple(c["changes_done"]) for c in cursors if c["changes_done"]]
    assert marks == sorted(marks) and len(marks) >= 13
    assert again.last_offset["changes_done"] is None
    assert again.last_offset["highestmodseq"] == server.modseq


def test_a_change_sync_resumed_from_its_cursor_publishes_the_rest_and_what_changed_again() -> None:
    server = filled(12)
    first, writer, _ = make_worker(server)
    first.run()
    flag_all(server, "\\Seen", one_modseq=True)
    interrupted = RecordingWriter()
    fail_on_commit(interrupted, 3, FencedError("another instance took over"))
    worker, _, _ = make_worker(
        server, stored=Cursor.from_json(dict(writer.last_offset)), writer=interrupted
    )
    worker.run()
    stored = Cursor.from_json(dict(interrupted.last_offset))
    assert stored.changes_done == (server.modseq, 6) and stored.fresh == ()
    server.flag(2, "\\Flagged")  # published before the stop, changed again since
    resumed, rest, _ = make_worker(server, stored=stored)
    resumed.run()
    again = {e["source"]["uid"]: e["flags"] for e in events(rest) if e["change"] == "UPDATED"}
    assert sorted(again) == [2, 7, 8, 9, 10, 11, 12]
    assert again[2] == ["\\Seen", "\\Flagged"]
    assert rest.last_offset["changes_done"] is None


@pytest.mark.parametrize("pipelined", [False, True])
def test_two_different_mails_with_one_message_id_get_two_keys_and_are_both_added(
    pipelined: bool,
) -> None:
    server = filled(4)
    server.append(b"m1\r\n\r\nanother body")  # uid 5: the key of uid 2, another mail
    server.append(b"m1\r\n\r\nbody")  # uid 6: an identical copy of uid 2
    worker, writer, _ = make_worker(server, pipelined=pipelined)
    worker.run()
    published = {e["source"]["uid"]: (e["key"], e["change"]) for e in events(writer)}
    other = "a/mid:m1#" + hashlib.sha256(b"m1\r\n\r\nanother body").hexdigest()[:8]
    assert published[2] == ("a/mid:m1", "ADDED")
    assert published[5] == (other, "ADDED")
    assert published[6] == ("a/mid:m1", "UPDATED")  # the same mail again (documented)


def test_a_session_logged_in_ahead_is_used_as_it_is_and_walks_the_same_diagram() -> None:
    # connectors.imap.earlylogin: the source hands a worker its folder's session logged in
    # while the start-up waited on Kafka; the worker selects on it without a second login.
    server = filled(4)
    worker, writer, stop = make_worker(server)
    logins: list[FakeConnection] = []

    class LoggedIn(FakeConnection):
        logged_in = True

        def login(self) -> None:
            logins.append(self)

    worker._connection_factory = lambda: LoggedIn(server, stop)  # type: ignore[assignment,return-value]
    worker.run()
    assert server.connects == 0 and logins == []
    assert worker.machine.history == [
        S.DISCONNECTED, S.CONNECTING, S.AUTHENTICATING, S.SELECTING, S.SYNCING, S.IDLE, S.STOPPED,
    ]  # fmt: skip
    assert [e["change"] for e in events(writer)] == ["ADDED"] * 4


def test_an_early_logins_refusal_counts_as_the_workers_own_first_attempt() -> None:
    # EarlyLogins.take raises what the early login met: the same cap, the same counters.
    server = filled(1)
    metrics = SourceMetrics()
    worker, writer, stop = make_worker(server, stop=CountingStop(limit=1), metrics=metrics)
    worker._connection_factory = Refusing(AuthenticationError("no"))  # type: ignore[assignment]
    worker.run()
    labels = {"source": "imap", "account": "a", "folder": "INBOX"}
    assert stop.delays == [0.05]  # the cap: permanent
    assert metrics.registry.get_sample_value("mailtap_auth_failures_total", labels) == 1
    assert metrics.registry.get_sample_value("mailtap_connect_failures_total", labels) == 1
    assert writer.records == [] and server.connects == 0


class Refusing:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __call__(self) -> FakeConnection:
        raise self.exc


class RegistryDownSerde(JsonSerde):
    """The registry down for the first ``outages`` encodes, as `AvroSerde.encode` says it."""

    def __init__(self, outages: int) -> None:
        self.outages = outages

    def encode(self, value: dict[str, Any], topic: str) -> bytes:
        if self.outages > 0:
            self.outages -= 1
            raise RegistryUnavailable("the schema registry did not answer while encoding")
        return super().encode(value, topic)


def test_a_registry_outage_fails_the_batch_and_dead_letters_nothing() -> None:
    """Found by `mailtap soak`: a source started during a registry-down fault dead-lettered the
    mail it was encoding ("could not be turned into an event") and committed its cursor past
    it, so the mail never reached mail.events. The batch now fails and is read again."""
    builder = RecordBuilder(
        account="a",
        folder="INBOX",
        parser=fake_parse,
        serde=RegistryDownSerde(outages=2),  # type: ignore[arg-type]
        events_topic="ev",
        dlq_topic="dlq",
        max_record_bytes=1_000_000,
    )
    worker, writer, stop = make_worker(filled(3), builder=builder, stop=CountingStop(limit=5))
    worker.run()
    written = [r for records, _ in writer.transactions for r in records]
    assert [r.topic for r in written if r.topic == "dlq"] == []
    assert sorted(json.loads(r.value)["source"]["uid"] for r in written if r.topic == "ev") == [
        1,
        2,
        3,
    ]
    assert stop.delays  # it backed off before reading the batch again
