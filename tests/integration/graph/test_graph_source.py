"""The Graph source against the Graph test server and the real Kafka broker (read_committed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.core.config import KafkaSettings, MailtapConfig
from connectors.graph.source import GraphSource
from tests.graph_server import GraphTestServer
from tests.integration.graph.graph_kafka import USER, imap_key, mime, read_events

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
