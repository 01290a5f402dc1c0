"""Fixtures of the Graph source tests: per-test topics on the session's broker, a config for the
Graph test server (``graph_server``, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors.core.config import KafkaSettings, MailtapConfig, TopicNames, config_from_dict
from connectors.core.kafka.topics import ensure_topics
from tests.graph_server import GraphTestServer
from tests.integration.graph.graph_kafka import source_config


@pytest.fixture
def kafka(services: Any, unique: str) -> KafkaSettings:
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    settings = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, topics=TopicNames(**names)
    )
    ensure_topics(settings, retry_tiers=["1m"])
    return settings


@pytest.fixture
def config(kafka: KafkaSettings, graph_server: GraphTestServer, tmp_path: Path) -> MailtapConfig:
    return config_from_dict(source_config(kafka, graph_server, tmp_path / "claims"))
