"""The Graph source against the Graph test server and the real Kafka broker (read_committed)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, MailtapConfig, config_from_dict
from connectors.graph.source import GraphSource
from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import CLIENT_ID
from tests.integration.graph.graph_kafka import (
    ACCOUNT,
    USER,
    imap_key,
    mime,
    read_events,
    read_topic,
    source_config,
)

#: Generous: waits end as soon as the condition holds; the bound only turns a hang into a failure.
WAIT_S = 60.0


@pytest.fixture
def source(config: MailtapConfig) -> Iterator[GraphSource]:
    src = GraphSource.from_config(config, serve_health=False)
    src.start()
    yield src
    src.stop()


def published(src: GraphSource) -> int:
    return sum(w.events_published for w in src.workers)


def test_backfill_then_new_mail_every_key_once_with_imap_keys(
    graph_server: GraphTestServer, config: MailtapConfig, kafka: KafkaSettings
) -> None:
    raws = [mime(n) for n in range(7)] + [mime(99, message_id=False)]
    before = [graph_server.add_message(USER, raw) for raw in raws[:5]]
    src = GraphSource.from_config(config, serve_health=False)
    src.start()
    try:
        assert graph_server.wait_until(lambda: published(src) == 5, WAIT_S)
        later = [graph_server.add_message(USER, raw) for raw in raws[5:]]
        assert graph_server.wait_until(lambda: published(src) == len(raws), WAIT_S)
    finally:
        src.stop()
    events = read_events(kafka)
    keys = [k for k, _ in events]
    assert sorted(keys) == sorted(imap_key(raw) for raw in raws)
    by_id = {e["source"]["item_id"]: e for _, e in events}
    for message in before + later:
        event = by_id[message.immutable_id]
        assert event["source"]["kind"] == "GRAPH" and event["source"]["folder"] == "inbox"
        assert event["change"] == "ADDED"


def delta_rounds(graph: GraphTestServer) -> int:
    return sum(1 for r in graph.requests if r.path.endswith("/delta") and r.status == 200)


def changes_of(kafka: KafkaSettings, key: str) -> list[str]:
    """The ``change`` of every event record of ``key``, in order (tombstones as "tombstone")."""
    serde = AvroSerde.for_schema("MailEvent", kafka)
    return [
        "tombstone" if value is None else serde.decode(value)["change"]
        for k, value in read_topic(kafka, kafka.topics.events)
        if k.decode() == key
    ]


def test_a_flag_change_is_one_updated_event_even_when_delta_returns_it_twice(
    graph_server: GraphTestServer, source: GraphSource, kafka: KafkaSettings
) -> None:
    message = graph_server.add_message(USER, mime(1))
    assert graph_server.wait_until(lambda: published(source) == 1, WAIT_S)
    graph_server.replay_changes(USER, "inbox")
    graph_server.update_message(USER, message.immutable_id, is_read=True, categories=["Red"])
    assert graph_server.wait_until(lambda: published(source) == 2, WAIT_S)
    # The next rounds return the same change again (replayed page): nothing more is published.
    graph_server.replay_changes(USER, "inbox")
    rounds = delta_rounds(graph_server)
    assert graph_server.wait_until(lambda: delta_rounds(graph_server) >= rounds + 3, WAIT_S)
    # An expired access token is replaced without a failed round.
    graph_server.expire_access_tokens()
    rounds = delta_rounds(graph_server)
    assert graph_server.wait_until(lambda: delta_rounds(graph_server) >= rounds + 2, WAIT_S)
    source.stop()
    assert published(source) == 2
    key = imap_key(mime(1))
    assert changes_of(kafka, key) == ["ADDED", "UPDATED"]
    updated = [e for k, e in read_events(kafka) if e["change"] == "UPDATED"]
    assert updated[0]["flags"] == ["\\Seen", "Red"]


def test_a_dead_delta_token_resyncs_the_folder_without_new_keys_or_duplicate_events(
    graph_server: GraphTestServer, source: GraphSource, kafka: KafkaSettings
) -> None:
    messages = [graph_server.add_message(USER, mime(n)) for n in range(4)]
    assert graph_server.wait_until(lambda: published(source) == 4, WAIT_S)
    graph_server.expire_delta_tokens(USER, "inbox")
    # While the token is dead: one mail arrives, one is flagged, one is deleted.
    graph_server.add_message(USER, mime(4), notify=False)
    graph_server.update_message(USER, messages[0].immutable_id, flag_status="flagged")
    graph_server.delete_message(USER, messages[1].immutable_id)
    worker = source.workers[0]
    assert graph_server.wait_until(lambda: worker.resyncs == 1 and published(source) == 7, 20), (
        worker.resyncs,
        published(source),
        worker.tombstones_published,
        worker.last_error,
    )
    rounds = delta_rounds(graph_server)
    assert graph_server.wait_until(lambda: delta_rounds(graph_server) >= rounds + 2, WAIT_S)
    source.stop()
    assert published(source) == 7  # 5 ADDED, 1 UPDATED, 1 tombstone: nothing listed again
    records = read_topic(kafka, kafka.topics.events)
    assert {k.decode() for k, _ in records} == {imap_key(mime(n)) for n in range(5)}
    assert changes_of(kafka, imap_key(mime(0))) == ["ADDED", "UPDATED"]
    assert changes_of(kafka, imap_key(mime(1))) == ["ADDED", "tombstone"]
    assert changes_of(kafka, imap_key(mime(2))) == ["ADDED"]
    assert changes_of(kafka, imap_key(mime(4))) == ["ADDED"]


def test_throttling_waits_retry_after_for_the_whole_mailbox(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    cfg = config_from_dict(
        source_config(
            kafka, graph_server, tmp_path / "claims", account={"folders": ["inbox", "archive"]}
        )
    )
    graph_server.add_message(USER, mime(1))
    graph_server.fail_requests(1, status=429, retry_after=3, path_contains="$value")
    src = GraphSource.from_config(cfg, serve_health=False)
    src.start()
    try:
        assert graph_server.wait_until(
            lambda: any(r.status == 429 for r in graph_server.requests), WAIT_S
        )
        throttled_at = time.monotonic()
        # A request already in flight when the 429 came back may still land: then silence,
        # although the archive folder's sweep (every 0.5 s) would ask in the meantime.
        time.sleep(0.5)
        settled = len(graph_server.requests)
        time.sleep(max(0.0, throttled_at + 2.5 - time.monotonic()))
        during = len(graph_server.requests) - settled
        assert graph_server.wait_until(lambda: published(src) == 1, WAIT_S)
    finally:
        src.stop()
    assert during == 0
    assert [k for k, _ in read_events(kafka)] == [imap_key(mime(1))]


def test_a_move_between_watched_folders_is_updated_and_a_delete_a_tombstone(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    cfg = config_from_dict(
        source_config(
            kafka, graph_server, tmp_path / "claims", account={"folders": ["inbox", "archive"]}
        )
    )
    moved, deleted = (graph_server.add_message(USER, mime(n)) for n in range(2))
    src = GraphSource.from_config(cfg, serve_health=False)
    src.start()
    try:
        assert graph_server.wait_until(lambda: published(src) == 2, WAIT_S)
        graph_server.move_message(USER, moved.immutable_id, "archive")
        graph_server.delete_message(USER, deleted.immutable_id)
        assert graph_server.wait_until(lambda: published(src) == 4, WAIT_S)
        rounds = delta_rounds(graph_server)
        assert graph_server.wait_until(lambda: delta_rounds(graph_server) >= rounds + 4, WAIT_S)
    finally:
        src.stop()
    assert published(src) == 4
    assert changes_of(kafka, imap_key(mime(0))) == ["ADDED", "UPDATED"]
    assert changes_of(kafka, imap_key(mime(1))) == ["ADDED", "tombstone"]
    after_move = next(e for _, e in read_events(kafka) if e["change"] == "UPDATED")
    assert after_move["source"]["folder"] == "archive"
    assert after_move["source"]["item_id"] == moved.immutable_id


def test_revoked_access_and_a_deleted_mailbox_are_states_in_health(
    graph_server: GraphTestServer, source: GraphSource
) -> None:
    graph_server.add_message(USER, mime(1))
    assert graph_server.wait_until(lambda: published(source) == 1, WAIT_S)
    graph_server.revoke_access(CLIENT_ID, USER)
    assert graph_server.wait_until(lambda: health_states(source) == ["ACCESS_DENIED"], WAIT_S)
    ok, detail = source.metrics.health(3600)
    assert not ok and detail["denied"] == {f"graph/{ACCOUNT}/inbox": "ACCESS_DENIED"}
    graph_server.delete_mailbox(USER)
    assert graph_server.wait_until(lambda: health_states(source) == ["MAILBOX_GONE"], WAIT_S)
    assert "MAILBOX_GONE" in source.metrics.health(3600)[1]["reason"]


def health_states(src: GraphSource) -> list[str]:
    return sorted(src.metrics.health(3600)[1]["states"].values())


def test_start_latest_publishes_only_mail_received_after_the_first_start(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    # Mail of the start's own second is published (receivedDateTime has whole seconds: no gap),
    # so the mail already there is from a minute before, as a mailbox's older mail is.
    before = datetime.now(UTC) - timedelta(minutes=1)
    for n in range(3):
        graph_server.add_message(USER, mime(n), received=before)
    cfg = config_from_dict(
        source_config(kafka, graph_server, tmp_path / "claims", account={"start": "latest"})
    )
    src = GraphSource.from_config(cfg, serve_health=False)
    src.start()
    try:
        assert graph_server.wait_until(
            lambda: bool(src.workers) and src.workers[0].state.value == "WAITING", WAIT_S
        )
        graph_server.add_message(USER, mime(3))
        assert graph_server.wait_until(lambda: published(src) == 1, WAIT_S)
    finally:
        src.stop()
    assert [k for k, _ in read_events(kafka)] == [imap_key(mime(3))]
