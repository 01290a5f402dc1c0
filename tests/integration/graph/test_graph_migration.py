"""The migration recipe of connectors/graph/README.md: a mailbox read by the EWS source, then by
the Graph source (same account name, ``start: all``): no gap, and no key the EWS source did
not already give the same mail."""

from __future__ import annotations

from pathlib import Path

from connectors.core.config import KafkaSettings, config_from_dict
from connectors.ews.source import EwsSource
from connectors.graph.source import GraphSource
from tests.ews_server.fixture import fast_server
from tests.graph_server import GraphTestServer
from tests.integration.ews.ews_kafka import source_config as ews_source_config
from tests.integration.graph.graph_kafka import USER, mime, read_events, read_topic, source_config

WAIT_S = 60.0


def test_ews_then_graph_with_start_all_no_gap_and_no_new_key(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    raws = [mime(n) for n in range(5)] + [mime(99, message_id=False)]
    with fast_server() as ews:
        ews_cfg = config_from_dict(ews_source_config(kafka, ews, tmp_path / "claims"))
        old = EwsSource.from_config(ews_cfg, serve_health=False)
        old.start()
        try:
            for raw in raws[:3]:
                ews.deliver(USER, raw)
            assert ews.wait_until(lambda: sum(w.events_published for w in old.workers) == 3, WAIT_S)
        finally:
            old.stop()  # step 1: the EWS source stops for the mailbox
    ews_keys = {k for k, _ in read_events(kafka)}
    # The same mailbox as Graph serves it: what EWS published, plus mail that arrived after the
    # EWS source stopped (the gap a careless switch would lose).
    for raw in raws:
        graph_server.add_message(USER, raw)
    graph_cfg = config_from_dict(
        source_config(kafka, graph_server, tmp_path / "claims", account={"start": "all"})
    )
    new = GraphSource.from_config(graph_cfg, serve_health=False)
    new.start()  # step 2
    try:
        assert graph_server.wait_until(
            lambda: sum(w.events_published for w in new.workers) == len(raws), WAIT_S
        )
    finally:
        new.stop()
    events = read_events(kafka)
    graph_keys = {k for k, e in events if e["source"]["kind"] == "GRAPH"}
    ews_mails = {k for k, e in events if e["source"]["kind"] == "EWS"}
    assert ews_mails == ews_keys and len(ews_keys) == 3
    assert ews_keys <= graph_keys  # the mails EWS published: the same keys from Graph
    assert len(graph_keys) == len(raws)  # no gap: the mail of the switch is there too
    assert {k.decode() for k, _ in read_topic(kafka, kafka.topics.events)} == graph_keys
