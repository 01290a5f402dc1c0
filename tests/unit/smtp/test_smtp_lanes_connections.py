"""The sink's transactional producers (its commit lanes and the bounce reader's) connect to every
broker at once (issue 29): with librdkafka's sparse connections, each init_transactions waited
a fixed 500 ms for the coordinator's connection in most starts, one lane after the other."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import config_from_dict
from connectors.smtp import bounce_reader, lanes
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.metrics import SinkMetrics
from connectors.smtp.state import StateStore

CONFIG = {
    "kafka": {"bootstrap_servers": "127.0.0.1:1"},
    "smtp": {
        "host": "127.0.0.1",
        "port": 25,
        "security": "plain",
        "from_address": "replies@example.com",
        "instance_id": "sink-1",
    },
}


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The configs of the producers the sink's modules create (real ones: librdkafka rejects
    an unknown property at construction)."""
    configs: list[dict[str, Any]] = []

    def producer(conf: dict[str, Any]) -> Producer:
        configs.append(conf)
        return Producer(conf)

    for module in (lanes, bounce_reader):
        monkeypatch.setattr(module, "Producer", producer)
    monkeypatch.setattr(lanes, "init_transactions", lambda *args: None)
    return configs


def test_every_commit_lane_connects_to_every_broker_at_once(made: list[dict[str, Any]]) -> None:
    cfg = config_from_dict(CONFIG)
    settings = cfg.section("smtp", SmtpSinkSettings)
    commit_lanes = lanes.CommitLanes(
        cfg.kafka,
        settings,
        instance_id="sink-1",
        delivery_serde=AvroSerde.for_schema("DeliveryEvent", cfg.kafka),
        states=StateStore(),
        clock=lambda: datetime.now(UTC),
        metrics=SinkMetrics(),
    )
    commit_lanes.open()
    commit_lanes.close()
    assert [c["transactional.id"] for c in made] == [
        commit_lanes.transactional_id(lane) for lane in range(lanes.COMMIT_LANES)
    ]
    assert [c["enable.sparse.connections"] for c in made] == [False] * lanes.COMMIT_LANES


def test_the_bounce_readers_producer_connects_to_every_broker_at_once(
    made: list[dict[str, Any]],
) -> None:
    cfg = config_from_dict(CONFIG)
    settings = cfg.section("smtp", SmtpSinkSettings)
    bounce_reader.BounceReader(cfg, settings, fetch_blob=lambda _ref: b"")
    (conf,) = made
    assert conf["transactional.id"] == f"{settings.bounce_group_id}.sink-1"
    assert conf["enable.sparse.connections"] is False
