"""The Exchange source against the EWS test server and the real Kafka broker (read_committed)."""

from __future__ import annotations

import base64
import collections
import datetime as dt
import json
import logging
import signal
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.core.config import KafkaSettings, MailtapConfig, config_from_dict
from connectors.core.kafka.clients import producer_config
from connectors.core.mail import parse_mail
from connectors.ews.source import EwsSource
from tests.ews_server import EwsTestServer
from tests.integration.ews.ews_kafka import (
    ACCOUNT,
    PASSWORD,
    USER,
    read_events,
    read_topic,
    source_config,
)
from tests.support.crashpoints import EXIT_CODE, crash_env
from tests.support.sourceproc import ENV, REPO, restarted
from tests.support.sourceproc import source_command as run_command

#: Generous: waits end as soon as the condition holds; the bound only turns a hang into a failure.
WAIT_S = 60.0


def mime(n: int, *, message_id: bool = True) -> bytes:
    mid = f"Message-ID: <order-{n}@shop.example>\r\n" if message_id else ""
    return (
        f"From: Shop <orders@shop.example>\r\nTo: {USER}\r\nSubject: Order {n}\r\n{mid}"
        f"Date: Sun, 29 Nov 2026 16:00:00 +0000\r\nMIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\nOrder number {n}\r\n"
    ).encode()


def imap_key(raw: bytes) -> str:
    """The key the IMAP source gives the same MIME (same shared parser, IMAP coordinates)."""
    source = {"kind": "IMAP", "folder": "INBOX", "uidvalidity": 1, "uid": 1}
    parsed = parse_mail(
        raw,
        account=ACCOUNT,
        source=source,
        flags=[],
        internal_date=None,
        observed_at=dt.datetime.now(dt.UTC),
    )
    return parsed.key


@pytest.fixture
def source(config: MailtapConfig) -> Iterator[EwsSource]:
    src = EwsSource.from_config(config, serve_health=False)
    src.start()
    yield src
    src.stop()


def published(src: EwsSource) -> int:
    return sum(w.events_published for w in src.workers)


def streaming(ews: EwsTestServer) -> bool:
    return ews.open_streams() == 1


def test_new_items_become_events_with_imap_keys(
    ews: EwsTestServer, source: EwsSource, kafka: KafkaSettings
) -> None:
    assert ews.wait_until(lambda: streaming(ews), WAIT_S)
    raws = [mime(n) for n in range(4)] + [mime(99, message_id=False)]
    items = [ews.deliver(USER, raw) for raw in raws]
    assert ews.wait_until(lambda: published(source) == len(raws), WAIT_S)
    source.stop()

    events = read_events(kafka)
    assert sorted(k for k, _ in events) == sorted(imap_key(raw) for raw in raws)
    by_item = {e["source"]["item_id"]: (k, e) for k, e in events}
    for raw, item in zip(raws, items, strict=True):
        key, event = by_item[item.item_id]
        assert key == event["key"] == imap_key(raw)
        assert event["source"]["kind"] == "EWS"
        assert event["source"]["folder"] == "inbox"
        assert event["source"]["change_key"] == item.change_key
        assert event["internal_date"] == item.received
        assert event["subject"] == item.subject
        assert event["size"] == len(raw)
    assert by_item[items[-1].item_id][1]["key_kind"] == "FINGERPRINT"
    assert "SyncFolderItems" not in ews.operations()


def test_existing_items_are_caught_up_once_then_streamed(
    ews: EwsTestServer, config: MailtapConfig, kafka: KafkaSettings
) -> None:
    before = [ews.deliver(USER, mime(n)) for n in range(3)]
    src = EwsSource.from_config(config, serve_health=False)
    src.start()
    try:
        assert ews.wait_until(lambda: published(src) == 3 and streaming(ews), WAIT_S)
        ews.deliver(USER, mime(3))
        assert ews.wait_until(lambda: published(src) == 4, WAIT_S)
    finally:
        src.stop()
    keys = [k for k, _ in read_events(kafka)]
    assert sorted(keys) == sorted(imap_key(mime(n)) for n in range(4))
    assert {e["source"]["item_id"] for _, e in read_events(kafka)} >= {i.item_id for i in before}


def test_dropped_stream_expired_subscription_and_lost_events_give_every_item_once(
    ews: EwsTestServer, source: EwsSource, kafka: KafkaSettings
) -> None:
    expected: list[bytes] = []

    def deliver(n: int, notify: bool = True) -> None:
        expected.append(mime(n))
        ews.deliver(USER, mime(n), notify=notify)

    assert ews.wait_until(lambda: streaming(ews), WAIT_S)
    deliver(0)
    deliver(1)
    assert ews.wait_until(lambda: published(source) == 2, WAIT_S)

    # 1. The connection is reset mid-stream; mail keeps arriving while we reconnect.
    ews.drop_streams()
    deliver(2)
    deliver(3, notify=False)  # an event Exchange never sent: only a catch-up finds it
    assert ews.wait_until(lambda: published(source) == 4 and streaming(ews), WAIT_S)

    # 2. A notification is cut in the middle: its events are gone from the subscription.
    ews.cut_next_notification()
    deliver(4)
    assert ews.wait_until(lambda: published(source) == 5 and streaming(ews), WAIT_S)

    # 3. The subscription expires while mail arrives: resubscribe and catch up with FindItem.
    (sub_id,) = ews.subscription_ids(USER)
    ews.expire_subscription(sub_id)
    deliver(5)
    deliver(6)
    assert ews.wait_until(lambda: published(source) == 7 and streaming(ews), WAIT_S)
    assert ews.subscription_ids(USER) != [sub_id]

    # 4. The stream stalls (socket open, nothing written): the read timeout notices it.
    streams_opened = ews.operations().count("GetStreamingEvents")
    ews.stall_streams()
    deliver(7)
    assert ews.wait_until(
        lambda: ews.operations().count("GetStreamingEvents") > streams_opened, WAIT_S
    )
    ews.stall_streams(False)
    # Streaming again before the next faults, or they hit no stream and prove nothing.
    assert ews.wait_until(lambda: published(source) == 8 and streaming(ews), WAIT_S)

    # 5. A FIN instead of a reset, then HTTP 503 on the next two stream requests.
    ews.fail_requests(2, status=503, operation="GetStreamingEvents")
    ews.drop_streams(how="fin")
    deliver(8)
    assert ews.wait_until(lambda: published(source) == 9, WAIT_S)
    source.stop()

    keys = [k for k, _ in read_events(kafka)]
    counts = collections.Counter(keys)
    assert counts == collections.Counter(imap_key(raw) for raw in expected)
    assert max(counts.values()) == 1
    assert "SyncFolderItems" not in ews.operations()


def source_command(
    kafka: KafkaSettings, ews: EwsTestServer, tmp_path: Path, **overrides: object
) -> list[str]:
    config = source_config(kafka, ews, tmp_path / "claims", **overrides)
    return run_command("mailtap.commands.ews:run_ews_source", config, tmp_path)


def restart_and_expect(
    run: list[str], ews: EwsTestServer, kafka: KafkaSettings, raws: list[bytes]
) -> None:
    """Run the source again until every mail is in Kafka, then check: each exactly once."""
    with restarted(run, WAIT_S):
        assert ews.wait_until(lambda: len(read_events(kafka)) >= len(raws), WAIT_S)
        assert ews.wait_until(lambda: streaming(ews), WAIT_S)
    keys = [k for k, _ in read_events(kafka)]
    assert sorted(keys) == sorted(imap_key(raw) for raw in raws)
    assert len(keys) == len(set(keys))


def test_kill_9_mid_batch_then_restart_loses_and_duplicates_nothing(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    raws = [mime(n) for n in range(5)]
    for raw in raws[:3]:
        ews.deliver(USER, raw)
    run = source_command(kafka, ews, tmp_path, batch_size=2)

    # Batches written: 1 = the new subscription (no records), 2 = catch-up items 0-1.
    # The process dies inside the second transaction: its records are on the broker, uncommitted.
    crashed = subprocess.run(
        run,
        env={**ENV, **crash_env("in_transaction:2")},
        cwd=REPO,
        timeout=WAIT_S,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == EXIT_CODE, crashed.stderr[-2000:]
    assert len(read_topic(kafka, kafka.topics.events, isolation="read_uncommitted")) == 2
    # The crashed writer's transaction stays open until the restart aborts it: read what is
    # committed now, without waiting for it to settle.
    assert read_events(kafka, settled=False) == []

    # Mail keeps arriving while the source is down; the subscription queues its events.
    for raw in raws[3:]:
        ews.deliver(USER, raw)
    restart_and_expect(run, ews, kafka, raws)
    # The restart reconnected to the subscription stored in the cursor.
    assert ews.operations().count("Subscribe") == 1


def test_sigkill_while_publishing_then_restart_loses_and_duplicates_nothing(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    raws = [mime(n) for n in range(40)]
    for raw in raws[:30]:
        ews.deliver(USER, raw)
    run = source_command(kafka, ews, tmp_path, batch_size=2)
    first = subprocess.Popen(run, env=ENV, cwd=REPO, stderr=subprocess.DEVNULL)
    try:
        # Some batches are committed, more are on their way: a real SIGKILL somewhere in there.
        assert ews.wait_until(lambda: len(read_events(kafka)) >= 4, WAIT_S)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=WAIT_S)
    assert first.returncode == -signal.SIGKILL
    assert len(read_events(kafka, settled=False)) < len(raws)
    for raw in raws[30:]:
        ews.deliver(USER, raw)
    restart_and_expect(run, ews, kafka, raws)


def test_first_start_latest_skips_existing_mail(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    ews.deliver(USER, mime(0))
    cfg = config_from_dict(
        source_config(kafka, ews, tmp_path / "claims", account={"start": "latest"})
    )
    src = EwsSource.from_config(cfg, serve_health=False)
    src.start()
    try:
        assert ews.wait_until(lambda: streaming(ews), WAIT_S)
        ews.deliver(USER, mime(1))
        assert ews.wait_until(lambda: published(src) == 1, WAIT_S)
        # Force a catch-up over the margin window: the old mail must still not appear.
        ews.drop_streams()
        ews.deliver(USER, mime(2))
        assert ews.wait_until(lambda: published(src) == 2, WAIT_S)
    finally:
        src.stop()
    assert sorted(k for k, _ in read_events(kafka)) == sorted(
        [imap_key(mime(1)), imap_key(mime(2))]
    )


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_health_is_the_age_of_the_last_successful_sync(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    raw = source_config(kafka, ews, tmp_path / "claims")
    raw["health"] = {"port": 0, "max_sync_age_seconds": 1.0}
    src = EwsSource.from_config(config_from_dict(raw))
    src.start()
    try:
        assert src.health_port is not None
        port = src.health_port
        # Healthy: every ConnectionStatus=Closed (each second here) is a successful sync.
        assert ews.wait_until(lambda: healthz(port)[0] == 200, WAIT_S)
        assert "ews/ops/inbox" in healthz(port)[1]["ages"]
        # Exchange answers 503 to everything: the process lives, the mailbox does not sync.
        ews.fail_requests(10**6, status=503)
        ews.drop_streams()
        assert ews.wait_until(lambda: healthz(port)[0] == 503, WAIT_S)
        assert "ews/ops/inbox" in healthz(port)[1]["stale"]
        ews.clear_failures()
        assert ews.wait_until(lambda: healthz(port)[0] == 200, WAIT_S)
    finally:
        src.stop()


def test_no_credential_in_any_log_line_even_at_debug(
    ews: EwsTestServer, config: MailtapConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """exchangelib logs each request's headers at DEBUG: the Authorization header must not get
    through (basic auth: the password, base64-encoded)."""
    caplog.set_level(logging.DEBUG)
    src = EwsSource.from_config(config, serve_health=False)
    src.start()
    try:
        ews.deliver(USER, mime(1))
        assert ews.wait_until(lambda: published(src) == 1, WAIT_S)
    finally:
        src.stop()
    assert "streaming" in caplog.text.lower() or "ews" in caplog.text.lower()
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert basic not in caplog.text and PASSWORD not in caplog.text


def test_an_error_after_a_commit_keeps_the_cursor_instead_of_reading_a_lagging_one(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """A read_committed read of the offsets topic ends at its last stable offset, before this
    source's own newest commits: for a moment after each commit (the broker writes the markers
    after answering the commit), and while another source holds a transaction open on that one
    shared partition (held open here, as a crashed instance's is until it times out). A GetItem
    error must not send the source back to that read: it would resume from an older cursor and
    publish again what the newer one had (and with no cursor at all, ``start: latest`` would
    take new mail for mail already there and never publish it)."""
    cfg = config_from_dict(
        source_config(kafka, ews, tmp_path / "claims", account={"start": "latest"})
    )
    src = EwsSource.from_config(cfg, serve_health=False)
    src.start()
    other = Producer(
        producer_config(
            kafka,
            transactional_id=f"other-source-{uuid.uuid4().hex[:8]}",
            transaction_timeout_ms=180_000,  # stays open for the whole test
        )
    )
    try:
        assert ews.wait_until(lambda: streaming(ews), WAIT_S)  # first cursor committed
        other.init_transactions(30)
        other.begin_transaction()
        other.produce(kafka.topics.offsets, key=b'{"account":"other"}', value=b"{}")
        other.flush(30)
        ews.deliver(USER, mime(1))
        assert ews.wait_until(lambda: published(src) == 1, WAIT_S)  # its cursor: behind
        # Not a connection loss (EwsProtocolError): the path that used to re-read the cursor.
        ews.fail_requests(1, operation="GetItem", soap_code="ErrorCorruptData")
        ews.deliver(USER, mime(2))
        assert ews.wait_until(lambda: published(src) >= 2 and streaming(ews), WAIT_S)
    finally:
        src.stop()
        other.abort_transaction(30)
    assert [r.status for r in ews.requests if r.operation == "GetItem"].count(503) == 1
    keys = [k for k, _ in read_events(kafka)]
    assert sorted(keys) == sorted([imap_key(mime(1)), imap_key(mime(2))])


def test_a_restart_behind_another_sources_open_transaction_resumes_from_its_newest_cursor(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    """The first run's newest cursor is committed behind another source's open transaction on
    the shared offsets topic (a crashed instance's stays open until it times out). A restart
    whose read ends at the last stable offset resumes from an older cursor and publishes again
    what the newer one had (with no cursor at all, ``start: latest`` would even skip the mail
    that arrived meanwhile). The restart must wait for that transaction to end."""
    cfg = config_from_dict(
        source_config(kafka, ews, tmp_path / "claims", account={"start": "latest"})
    )
    first = EwsSource.from_config(cfg, serve_health=False)
    first.start()
    other = Producer(
        producer_config(
            kafka,
            transactional_id=f"other-source-{uuid.uuid4().hex[:8]}",
            transaction_timeout_ms=180_000,
        )
    )
    try:
        assert ews.wait_until(lambda: streaming(ews), WAIT_S)  # first cursor committed
        other.init_transactions(30)
        other.begin_transaction()
        other.produce(kafka.topics.offsets, key=b'{"account":"other"}', value=b"{}")
        other.flush(30)
        ews.deliver(USER, mime(1))
        assert ews.wait_until(lambda: published(first) == 1, WAIT_S)  # its cursor: behind
    finally:
        first.stop()
    ews.deliver(USER, mime(2))  # while the source is down: its subscription queues the event

    # The other source's transaction ends a little after the restart began reading.
    ending = threading.Timer(2.0, other.commit_transaction, args=(30,))
    ending.start()
    second = EwsSource.from_config(cfg, serve_health=False)
    second.start()
    try:
        assert ews.wait_until(lambda: published(second) >= 1 and streaming(ews), WAIT_S)
    finally:
        second.stop()
        ending.join()
    keys = [k for k, _ in read_events(kafka)]
    assert sorted(keys) == sorted([imap_key(mime(1)), imap_key(mime(2))])
    assert published(second) == 1
