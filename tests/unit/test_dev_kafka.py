"""mailtap.dev.kafka: the broker configuration."""

from __future__ import annotations

import base64
from pathlib import Path

from mailtap.dev import kafka


def _properties(path: Path) -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    return {k.strip(): v.strip() for k, v in pairs}


def test_single_node_config_allows_transactions_and_compaction(tmp_path: Path) -> None:
    layout = kafka.KafkaLayout(tmp_path / "kafka")
    kafka.render(layout, "127.0.0.1", 19092, 19093)

    props = _properties(layout.config)
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert props["log.dirs"] == str(layout.data_dir)
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["log.cleaner.enable"] == "true"
    assert f"fileName = {layout.server_log}" in layout.log4j_config.read_text()


def test_cluster_id_is_a_kafka_uuid() -> None:
    cid = kafka.cluster_id()
    assert len(cid) == 22
    assert len(base64.urlsafe_b64decode(cid + "==")) == 16
    assert cid != kafka.cluster_id()


def test_cluster_id_never_looks_like_an_option() -> None:
    # 1 in 64 random ids starts with "-"; 2,000 draws miss that with probability ~1e-14.
    assert not any(kafka.cluster_id().startswith("-") for _ in range(2000))
