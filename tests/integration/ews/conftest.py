"""Fixtures of the Exchange source tests: the EWS test server, per-test topics, a config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.core.config import KafkaSettings, MailtapConfig, TopicNames, config_from_dict
from connectors.core.kafka.topics import ensure_topics
from tests.ews_server import EwsTestServer
from tests.ews_server.fixture import fast_server
from tests.integration.ews.ews_kafka import source_config


@pytest.fixture
def ews() -> Iterator[EwsTestServer]:
    with fast_server() as server:
        yield server


@pytest.fixture
def kafka(services: Any, unique: str) -> KafkaSettings:
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    settings = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, topics=TopicNames(**names)
    )
    ensure_topics(settings, retry_tiers=["1m"])
    return settings


@pytest.fixture
def config(kafka: KafkaSettings, ews: EwsTestServer, tmp_path: Path) -> MailtapConfig:
    return config_from_dict(source_config(kafka, ews, tmp_path / "claims"))
