"""The Exchange source's ``/metrics`` on the EWS test server and the real Kafka: build info, owned
mailboxes, the worker's state (STREAMING), events counted when an item arrives."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.core.config import KafkaSettings, config_from_dict
from connectors.ews.source import EwsSource
from tests.ews_server import EwsTestServer
from tests.integration.ews.ews_kafka import USER, source_config
from tests.integration.ews.test_ews_source import WAIT_S, mime
from tests.support.scrape import scrape, total

pytestmark = pytest.mark.integration

BOX = {"source": "ews", "account": "ops", "folder": "inbox"}


def test_ews_metrics_move_when_an_item_arrives(
    ews: EwsTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    raw = source_config(kafka, ews, tmp_path / "claims")
    raw["health"] = {"port": 0}
    src = EwsSource.from_config(config_from_dict(raw))
    src.start()
    try:
        port = src.health_port
        assert port is not None
        assert ews.wait_until(
            lambda: total(scrape(port), "mailtap_source_state", state="STREAMING", **BOX) == 1,
            WAIT_S,
        )
        before = scrape(port)
        assert total(before, "mailtap_build_info", component="source") == 1
        assert total(before, "mailtap_source_mailboxes", source="ews") == 1
        produced = total(before, "mailtap_events_produced_total", **BOX)
        ews.deliver(USER, mime(7))
        assert ews.wait_until(
            lambda: total(scrape(port), "mailtap_events_produced_total", **BOX) == produced + 1,
            WAIT_S,
        )
        # One state at a time: the others the worker went through are 0.
        states = [lab for (n, lab), v in scrape(port).items() if n == "mailtap_source_state" and v]
        assert len(states) == 1
    finally:
        src.stop()
