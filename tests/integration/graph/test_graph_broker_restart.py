"""Exactly once across a Kafka broker restart (issue 23, as the IMAP source's
``test_kafka_stopped_and_restarted_nothing_lost_nothing_duplicated``): mail arrives while the
broker is down; the source keeps running (its folder backs off, its transaction is retried with
a new writer) and once the broker is back every key is on ``mail.events`` exactly once.

The broker is the test's own (``tests.support.private_kafka``): the session's is shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from connectors.core.config import KafkaSettings, config_from_dict
from connectors.core.kafka.topics import ensure_topics
from connectors.graph.source import GraphSource
from connectors.graph.worker import WorkerState
from tests.graph_server import GraphTestServer
from tests.integration.graph.graph_kafka import USER, imap_key, mime, read_events, source_config
from tests.support.private_kafka import PrivateKafka, private_broker

WAIT_S = 60.0
#: A restarted broker takes its time on a loaded machine; librdkafka reconnects with backoff.
CATCH_UP_S = 120.0
#: Six sweep intervals without a delta request: the source is held up by the broker.
QUIET_S = 3.0


@pytest.fixture
def private_kafka() -> Iterator[PrivateKafka]:
    with private_broker("mailtap-graph-kafka-") as broker:
        yield broker


def _delta_requests(graph: GraphTestServer) -> int:
    return sum(1 for path in graph.request_paths() if path.endswith("/delta"))


def _held_up(graph: GraphTestServer, quiet_s: float) -> Callable[[], bool]:
    """True once the source sent no delta request for ``quiet_s``: with a sweep every 0.5 s
    it only goes quiet while a commit waits for the broker (every page, its cursor included,
    is one transaction)."""
    last = (-1, time.monotonic())

    def check() -> bool:
        nonlocal last
        rounds = _delta_requests(graph)
        if rounds != last[0]:
            last = (rounds, time.monotonic())
            return False
        return time.monotonic() - last[1] >= quiet_s

    return check


def test_kafka_stopped_and_restarted_nothing_lost_nothing_duplicated(
    graph_server: GraphTestServer, private_kafka: PrivateKafka, tmp_path: Path
) -> None:
    kafka = KafkaSettings(bootstrap_servers=private_kafka.bootstrap)
    ensure_topics(kafka, retry_tiers=["1m"])
    config = config_from_dict(source_config(kafka, graph_server, tmp_path / "claims"))
    raws = [mime(n) for n in range(6)]
    for raw in raws[:3]:
        graph_server.add_message(USER, raw)
    source = GraphSource.from_config(config, serve_health=False)
    source.start()
    try:
        [worker] = source.workers
        assert graph_server.wait_until(lambda: worker.events_published == 3, WAIT_S)
        # Live: a sweep from the delta link after the backfill (its two pages).
        assert graph_server.wait_until(lambda: _delta_requests(graph_server) > 2, WAIT_S)
        private_kafka.stop()
        for raw in raws[3:]:
            graph_server.add_message(USER, raw)
        # The source is stuck writing (a page's commit waits for the broker, up to the
        # transaction timeout) while the mail arrives.
        assert graph_server.wait_until(_held_up(graph_server, QUIET_S), WAIT_S)
        private_kafka.start()
        assert graph_server.wait_until(
            lambda: len(read_events(kafka, settled=False)) >= len(raws), CATCH_UP_S
        ), worker.state
        # The same worker caught up: the source did not give the folder up.
        assert source.workers == [worker]
        assert worker.state is not WorkerState.STOPPED and not worker.fenced
    finally:
        source.stop()
    keys = [k for k, _ in read_events(kafka)]
    assert sorted(keys) == sorted(imap_key(raw) for raw in raws)
