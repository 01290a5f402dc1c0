"""The Exchange worker against the in-process EWS test server, with an in-memory writer.

No Kafka here (the exactly-once tests on the real broker are in tests/integration/ews); these
check the protocol paths: the sync_items guard, OAuth2, TLS verification, deleted items, DLQ.
"""

from __future__ import annotations

import ast
import datetime as dt
import functools
import ssl
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trustme
from exchangelib.folders import BaseFolder, FolderCollection
from exchangelib.services import SyncFolderItems

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.open import open_claim_check
from connectors.core.claimcheck.store import ClaimCheckStore
from connectors.core.errors import AuthenticationError, ConfigError
from connectors.core.kafka.errors import TransactionAborted
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.mail import parse_mail
from connectors.core.metrics import SourceMetrics
from connectors.ews import connection as ews_connection
from connectors.ews.config import EwsSourceSettings
from connectors.ews.connection import EwsConnection, FetchedItem, ItemRef
from connectors.ews.cursor import change_digest
from connectors.ews.records import EwsRecordBuilder
from connectors.ews.worker import EwsFolderWorker, WorkerState
from tests.ews_server import EwsTestServer
from tests.ews_server.fixture import PASSWORD, USER, fast_server

REPO = Path(__file__).resolve().parents[3]
WAIT_S = 30.0


class MemoryWriter:
    def __init__(self) -> None:
        self.batches: list[tuple[list[SourceRecord], list[Any]]] = []

    def write(self, records: Sequence[SourceRecord], offsets: Sequence[Any]) -> None:
        self.batches.append((list(records), list(offsets)))

    def close(self) -> None:
        pass

    def keys(self, topic: str = "events") -> list[bytes]:
        return [r.key for records, _ in self.batches for r in records if r.topic == topic]


def mime(n: int) -> bytes:
    return (
        f"From: a@example.org\r\nTo: {USER}\r\nSubject: s{n}\r\n"
        f"Message-ID: <m{n}@example.org>\r\n\r\nbody {n}\r\n"
    ).encode()


def settings_for(
    ews: EwsTestServer, batch_size: int = 100, read_timeout: float = 5.0, **account: Any
) -> EwsSourceSettings:
    base = {
        "name": "ops",
        "service_endpoint": ews.url,
        "email": USER,
        "auth": "basic",
        "password": PASSWORD,
        "start": "all",
    }
    base.update(account)
    return EwsSourceSettings.model_validate(
        {
            "accounts": [base],
            "batch_size": batch_size,
            "connection_timeout_minutes": 1,
            "stream_read_timeout_seconds": read_timeout,
            "backoff_initial_seconds": 0.05,
            "backoff_cap_seconds": 0.2,
        }
    )


def builder(parser: Any = parse_mail, store: ClaimCheckStore | None = None) -> EwsRecordBuilder:
    return EwsRecordBuilder(
        account="ops",
        folder="inbox",
        parser=functools.partial(parser, claim_check=store) if store is not None else parser,
        serde=AvroSerde.for_schema("MailEvent"),
        events_topic="events",
        dlq_topic="dlq",
        max_record_bytes=900_000,
        claim_check=store,
    )


class Running:
    """A worker thread with an in-memory writer and offsets."""

    def __init__(
        self,
        ews: EwsTestServer,
        settings: EwsSourceSettings,
        connection_class: type[EwsConnection] = EwsConnection,
        records: EwsRecordBuilder | None = None,
    ) -> None:
        self.writer = MemoryWriter()
        self.stop = threading.Event()
        self.offsets: Mapping[bytes, Mapping[str, Any]] = {}
        account = settings.accounts[0]
        self.worker = EwsFolderWorker(
            account=account,
            folder="inbox",
            settings=settings,
            builder=records or builder(),
            metrics=SourceMetrics(),
            stop=self.stop,
            writer_factory=lambda _txn: self.writer,
            read_offsets=lambda: self.offsets,
            connection_factory=lambda: connection_class(account, settings, "inbox"),
            transactional_id="test",
        )
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(WAIT_S)


@pytest.fixture
def ews() -> Iterator[EwsTestServer]:
    with fast_server() as server:
        yield server


# --- never sync_items ---------------------------------------------------------------------------


@pytest.fixture
def sync_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every way exchangelib offers into SyncFolderItems, recording and raising."""
    calls: list[str] = []

    def forbidden(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"{name} called: streaming must never mix with SyncFolderItems")

        return call

    monkeypatch.setattr(BaseFolder, "sync_items", forbidden("BaseFolder.sync_items"))
    monkeypatch.setattr(FolderCollection, "sync_items", forbidden("FolderCollection.sync_items"))
    monkeypatch.setattr(SyncFolderItems, "call", forbidden("SyncFolderItems.call"))
    return calls


def test_the_sync_items_guard_catches_a_call(ews: EwsTestServer, sync_calls: list[str]) -> None:
    conn = EwsConnection(settings_for(ews).accounts[0], settings_for(ews), "inbox")
    conn.open()
    folder = conn._require_folder()
    with pytest.raises(AssertionError):
        list(folder.sync_items())
    assert sync_calls == ["BaseFolder.sync_items"]


def test_no_code_path_calls_sync_items(ews: EwsTestServer, sync_calls: list[str]) -> None:
    """Start, catch-up, stream, dropped stream, expired subscription: never a sync."""
    ews.deliver(USER, mime(0))
    with Running(ews, settings_for(ews)) as run:
        assert ews.wait_until(lambda: ews.open_streams() == 1, WAIT_S)
        ews.deliver(USER, mime(1))
        assert ews.wait_until(lambda: run.worker.events_published == 2, WAIT_S)
        ews.drop_streams()
        ews.deliver(USER, mime(2), notify=False)
        assert ews.wait_until(lambda: run.worker.events_published == 3, WAIT_S)
        (sub_id,) = ews.subscription_ids(USER)
        ews.expire_subscription(sub_id)
        ews.deliver(USER, mime(3))
        assert ews.wait_until(lambda: run.worker.events_published == 4, WAIT_S)
    assert sync_calls == []
    assert "SyncFolderItems" not in ews.operations()
    assert sorted(run.writer.keys()) == [f"ops/mid:m{n}@example.org".encode() for n in range(4)]


_SYNC_NAMES = {"sync_items", "SyncFolderItems", "sync_folder_items"}


def test_no_source_file_mentions_sync_items_in_code() -> None:
    """Names in code, not in comments or docstrings (those explain why it is never used)."""
    offenders = []
    for path in sorted((REPO / "connectors").rglob("*.py")) + sorted(
        (REPO / "mailtap").rglob("*.py")
    ):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            name = (
                node.attr
                if isinstance(node, ast.Attribute)
                else node.id
                if isinstance(node, ast.Name)
                else node.name
                if isinstance(node, ast.alias)
                else None
            )
            if name is not None and name.rsplit(".", 1)[-1] in _SYNC_NAMES:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def test_closed_stream_reconnects_to_the_same_subscription_without_catch_up(
    ews: EwsTestServer,
) -> None:
    with Running(ews, settings_for(ews)):
        # Each stream lives one (fast) minute and ends with ConnectionStatus=Closed.
        assert ews.wait_until(lambda: ews.operations().count("GetStreamingEvents") >= 3, WAIT_S)
    operations = ews.operations()
    assert operations.count("Subscribe") == 1
    assert operations.count("FindItem") == 2  # the catch-up and reconciliation at start only
    assert len(ews.subscription_ids(USER)) == 1


def test_stop_interrupts_a_quiet_stream() -> None:
    # Keep-alives every 10 minutes and a 30 "minute" stream: only interrupt() can end the read.
    with fast_server(seconds_per_minute=60.0, keepalive_seconds=600.0) as quiet:
        run = Running(quiet, settings_for(quiet, read_timeout=600.0))
        with run:
            assert quiet.wait_until(lambda: quiet.open_streams() == 1, WAIT_S)
            run.stop.set()
            run.worker.interrupt()
            run.thread.join(10)
            assert not run.thread.is_alive()
        assert run.worker.state is WorkerState.STOPPED
        assert run.worker.backoff.attempt == 0  # a stop is not a failure


# --- catch-up paging --------------------------------------------------------------------------


T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def test_catch_up_pages_by_receive_time(ews: EwsTestServer) -> None:
    for n in range(5):
        ews.deliver(USER, mime(n), received=T0 + dt.timedelta(seconds=n))
    with Running(ews, settings_for(ews, batch_size=2)) as run:
        assert ews.wait_until(lambda: ews.open_streams() == 1, WAIT_S)
    assert sorted(run.writer.keys()) == [f"ops/mid:m{n}@example.org".encode() for n in range(5)]
    assert ews.operations().count("FindItem") >= 3  # pages of two


def test_catch_up_of_one_second_larger_than_a_page(ews: EwsTestServer) -> None:
    for n in range(5):
        ews.deliver(USER, mime(n), received=T0)
    with Running(ews, settings_for(ews, batch_size=2)) as run:
        assert ews.wait_until(lambda: ews.open_streams() == 1, WAIT_S)
    assert sorted(run.writer.keys()) == [f"ops/mid:m{n}@example.org".encode() for n in range(5)]


def test_deleting_mail_during_catch_up_skips_nothing(ews: EwsTestServer) -> None:
    """With offset paging, deleting an item of page 1 would shift the first item of page 2
    into page 1's range, and nobody would ever read it."""
    items = [ews.deliver(USER, mime(n), received=T0 + dt.timedelta(seconds=n)) for n in range(6)]

    class DeletingConnection(EwsConnection):
        def find_since(self, since: dt.datetime, limit: int) -> list[ItemRef]:
            refs = super().find_since(since, limit)
            ews.store.mailbox(USER).items.pop(items[0].item_id, None)
            return refs

    with Running(ews, settings_for(ews, batch_size=2), DeletingConnection) as run:
        assert ews.wait_until(lambda: ews.open_streams() == 1, WAIT_S)
    assert sorted(run.writer.keys()) == [f"ops/mid:m{n}@example.org".encode() for n in range(1, 6)]


# --- credentials and TLS --------------------------------------------------------------------------


@pytest.fixture
def ntlm_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EwsTestServer]:
    users = tmp_path / "ntlm-users"
    monkeypatch.setenv("NTLM_USER_FILE", str(users))
    with fast_server(ntlm_user_file=users) as server:
        yield server


@pytest.mark.parametrize("login", [None, "EXAMPLE\\user"], ids=["email", "domain"])
def test_ntlm_handshake_per_connection_streams_and_fetches(
    ntlm_server: EwsTestServer, login: str | None
) -> None:
    with Running(ntlm_server, settings_for(ntlm_server, auth="ntlm", username=login)) as run:
        assert ntlm_server.wait_until(lambda: ntlm_server.open_streams() == 1, WAIT_S)
        ntlm_server.deliver(USER, mime(1))
        assert ntlm_server.wait_until(lambda: run.worker.events_published == 1, WAIT_S)
    statuses = [(r.operation, r.status) for r in ntlm_server.requests]
    assert ("GetStreamingEvents", 200) in statuses and ("GetItem", 200) in statuses
    # The handshake, per connection: the stream holds one connection, GetItem another. (Which
    # request gets the first bare 401 depends on exchangelib's per-process protocol cache: a
    # cached version skips its ConvertId probe; so count handshakes, not 401s.)
    assert ntlm_server.ntlm_handshakes >= 2


def test_ntlm_wrong_password_is_an_authentication_error(ntlm_server: EwsTestServer) -> None:
    settings = settings_for(ntlm_server, auth="ntlm", password="wrong")
    with pytest.raises(AuthenticationError):
        EwsConnection(settings.accounts[0], settings, "inbox").open()


def test_wrong_password_is_an_authentication_error(ews: EwsTestServer) -> None:
    settings = settings_for(ews, password="wrong")
    with pytest.raises(AuthenticationError):
        EwsConnection(settings.accounts[0], settings, "inbox").open()


@pytest.fixture
def tls_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[EwsTestServer, trustme.CA]]:
    monkeypatch.setattr(ews_connection._CaFileAdapter, "ca_files", {})
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with fast_server(tls=context) as server:
        yield server, ca


def ca_file_of(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def test_untrusted_certificate_is_refused(tls_server: tuple[EwsTestServer, trustme.CA]) -> None:
    server, _ = tls_server
    settings = settings_for(server)
    with pytest.raises(ConfigError, match="ca_file"):
        EwsConnection(settings.accounts[0], settings, "inbox").open()
    assert server.requests == []


def test_ca_file_makes_the_certificate_trusted(
    tls_server: tuple[EwsTestServer, trustme.CA], tmp_path: Path
) -> None:
    server, ca = tls_server
    settings = settings_for(server, ca_file=ca_file_of(ca, tmp_path))
    conn = EwsConnection(settings.accounts[0], settings, "inbox")
    conn.open()
    assert server.url.startswith("https://")
    assert server.operations()[-1] == "GetFolder"


def test_oauth2_bearer_token_is_sent(
    tls_server: tuple[EwsTestServer, trustme.CA], tmp_path: Path
) -> None:
    server, ca = tls_server
    server.add_token("token-123", USER)
    settings = settings_for(
        server,
        auth="oauth2",
        password=None,
        oauth2_access_token="token-123",
        ca_file=ca_file_of(ca, tmp_path),
    )
    conn = EwsConnection(settings.accounts[0], settings, "inbox")
    conn.open()
    assert conn.subscribe() in server.subscription_ids(USER)
    assert {r.address for r in server.requests} == {USER}


# --- items and records ----------------------------------------------------------------------------


def test_item_deleted_before_get_item_is_skipped(ews: EwsTestServer) -> None:
    settings = settings_for(ews)
    conn = EwsConnection(settings.accounts[0], settings, "inbox")
    conn.open()
    kept, gone = ews.deliver(USER, mime(1)), ews.deliver(USER, mime(2))
    del ews.store.mailbox(USER).items[gone.item_id]
    fetched = conn.fetch([ItemRef(kept.item_id, kept.change_key), ItemRef(gone.item_id, "x")])
    assert fetched[1] is None
    assert fetched[0] is not None and fetched[0].mime == mime(1)


def item(raw: bytes) -> FetchedItem:
    return FetchedItem("AAMk1", "CQA1", raw, dt.datetime(2026, 11, 29, 16, 0, tzinfo=dt.UTC))


def test_parse_error_gives_an_event_and_a_dlq_record() -> None:
    nested = b"".join(
        f"Content-Type: multipart/mixed; boundary=b{i}\r\n\r\n--b{i}\r\n".encode()
        for i in range(80)
    )
    raw = b"Message-ID: <deep@example.org>\r\nSubject: deep\r\n" + nested
    built = builder().build(item(raw))
    assert built.key == "ops/mid:deep@example.org" and built.dlq
    assert [r.topic for r in built.records] == ["events", "dlq"]
    headers = dict(built.records[1].headers)
    assert headers["mailtap.error.kind"] == b"parse_error"
    assert headers["mailtap.source.item_id"] == b"AAMk1"


def test_parser_bug_gives_a_dlq_record_only() -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    built = builder(broken).build(item(mime(1)))
    assert built.key is None
    assert [(r.topic, r.key) for r in built.records] == [("dlq", b"ops/inbox/AAMk1")]
    assert built.records[0].value == mime(1)


def test_event_carries_ews_coordinates_and_seen_flag() -> None:
    read = FetchedItem("AAMk2", "CQA2", mime(2), item(b"").received, is_read=True)
    built = builder().build(read)
    event = AvroSerde.for_schema("MailEvent").decode(built.records[0].value or b"")
    assert event["source"]["kind"] == "EWS"
    assert event["source"]["item_id"] == "AAMk2" and event["source"]["change_key"] == "CQA2"
    assert event["flags"] == ["\\Seen"]
    assert event["internal_date"] == read.received


def test_a_claim_check_failure_is_not_a_bad_mail() -> None:
    def store_down(*args: Any, **kwargs: Any) -> Any:
        raise ClaimCheckError("cannot store blob: No space left on device")

    with pytest.raises(ClaimCheckError):
        builder(store_down).build(item(mime(1)))


def test_a_store_outage_delays_the_batch_and_then_every_mail_is_an_event_with_its_raw_in_a_pack(
    ews: EwsTestServer, tmp_path: Path
) -> None:
    store = open_claim_check((tmp_path / "claims").as_uri(), pack_max_blob=256 * 1024)
    failures = [ClaimCheckError("disk full"), ClaimCheckError("disk full")]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return parse_mail(*args, **kwargs)

    for n in range(3):
        ews.deliver(USER, mime(n))
    with Running(ews, settings_for(ews), records=builder(flaky, store)) as run:
        assert ews.wait_until(lambda: run.worker.events_published == 3, WAIT_S)
    assert not failures  # the outage was hit, and retried
    assert run.writer.keys("dlq") == []
    assert sorted(run.writer.keys()) == [f"ops/mid:m{n}@example.org".encode() for n in range(3)]
    serde = AvroSerde.for_schema("MailEvent")
    for records, _ in run.writer.batches:
        for record in records:
            event = serde.decode(record.value or b"")
            uri = event["raw_ref"]["uri"]
            assert ".pack#offset=" in uri  # the batch's blobs share one pack file
            assert store.get(uri) == mime(int(event["subject"][1:]))


# --- the cursor across errors -----------------------------------------------------------------


def test_a_failed_write_starts_a_new_writer_and_reads_the_cursor_after_it(
    ews: EwsTestServer,
) -> None:
    """Whether a failed batch committed is not known for sure: a new writer (whose
    init_transactions settles it) and the cursor read back after that. Other errors keep both."""
    run = Running(ews, settings_for(ews))
    writers: list[MemoryWriter] = []
    reads: list[int] = []
    failures = [TransactionAborted("transaction aborted: broker unreachable")]

    class FailingOnce(MemoryWriter):
        def write(self, records: Sequence[SourceRecord], offsets: Sequence[Any]) -> None:
            if records and failures:
                raise failures.pop()
            super().write(records, offsets)

    def new_writer(_txn: str) -> MemoryWriter:
        writers.append(FailingOnce())
        return writers[-1]

    def read_offsets() -> Mapping[bytes, Mapping[str, Any]]:
        reads.append(len(writers))
        return {}

    run.worker._writer_factory = new_writer
    run.worker._read_offsets = read_offsets
    ews.deliver(USER, mime(1))
    with run:
        assert ews.wait_until(lambda: run.worker.events_published == 1, WAIT_S)
        # An EWS error (not a write) afterwards: same writer, no new read.
        ews.fail_requests(1, operation="GetItem", soap_code="ErrorCorruptData")
        ews.deliver(USER, mime(2))
        assert ews.wait_until(lambda: run.worker.events_published == 2, WAIT_S)
    assert len(writers) == 2
    assert reads == [1, 2]  # each read right after its writer was made
    assert sorted(writers[1].keys()) == [f"ops/mid:m{n}@example.org".encode() for n in (1, 2)]


def test_a_reconciliation_publishes_no_change_of_mail_that_was_there_before_start_latest(
    ews: EwsTestServer,
) -> None:
    """``start: latest`` remembers the mail already there as seen, never published: a change to
    it found by a reconciliation is recorded, not published (consumers never saw that mail)."""
    old = ews.deliver(USER, mime(0), received=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    with Running(ews, settings_for(ews, start="latest")) as run:
        assert ews.wait_until(lambda: ews.open_streams() == 1, WAIT_S)
        ews.update_item(USER, old.item_id, is_read=True, notify=False)
        ews.deliver(USER, mime(1), notify=False)
        ews.drop_streams()  # a reconnect: catch-up and reconciliation
        assert ews.wait_until(lambda: run.worker.events_published == 1, WAIT_S)
        assert ews.wait_until(
            lambda: (
                run.worker.cursor is not None
                and (tracked := run.worker.cursor.tracked(old.item_id)) is not None
                and tracked.change == change_digest(old.change_key)
            ),
            WAIT_S,
        )
    assert run.writer.keys() == [b"ops/mid:m1@example.org"]
    tracked = run.worker.cursor.tracked(old.item_id)
    assert tracked is not None and not tracked.published
