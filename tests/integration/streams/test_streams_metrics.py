"""The streams worker's ``/metrics`` on the real broker: names present, values moving with mail."""

from __future__ import annotations

import datetime as dt
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_streams_kafka import (  # the streams integration fixtures and helpers
    WorkerProcess,
    config_path,  # noqa: F401  (fixture)
    kafka,  # noqa: F401  (fixture)
    produce,
    start_worker,  # noqa: F401  (fixture)
)

from mailtap.dev.process import free_port
from streams.testing import mail_record
from tests.support.scrape import Samples, healthz, names, scrape, total, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def health_port(config_path: Path) -> int:  # noqa: F811
    port = free_port()
    document = yaml.safe_load(config_path.read_text())
    document["health"] = {"host": "127.0.0.1", "port": port}
    config_path.write_text(yaml.safe_dump(document))
    return port


def _scrape(port: int) -> Samples | None:
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return None


def test_streams_metrics_move_when_a_mail_flows(
    kafka: Any,  # noqa: F811
    health_port: int,
    start_worker: Callable[[], WorkerProcess],  # noqa: F811
) -> None:
    worker = start_worker()
    wait_for(lambda: _scrape(health_port) is not None, "the metrics endpoint")
    wait_for(lambda: healthz(health_port)[0] == 200, "a healthy worker")
    before = scrape(health_port)
    assert {
        "mailtap_build_info",
        "mailtap_streams_assigned_partitions",
        "mailtap_streams_records_processed_total",
        "mailtap_streams_heartbeat_timestamp_seconds",
    } <= names(before)
    assert total(before, "mailtap_build_info", component="streams") == 1
    assert total(before, "mailtap_streams_records_processed_total") == 0

    now = dt.datetime.now(dt.UTC)
    # Read today from a mailbox where it arrived a year ago (start: all): never answered.
    old_mail = mail_record(
        message_id="m-old@example.com", sender="old@example.org", observed_at=now
    )
    old_mail["internal_date"] = now - dt.timedelta(days=365)
    produce(
        kafka,
        [
            mail_record(
                message_id="m-ticket@example.com", to=["support@example.com"], observed_at=now
            ),
            mail_record(
                message_id="m-none@example.com", to=["nobody@example.com"], observed_at=now
            ),
            old_mail,
        ],
    )

    def moved() -> bool:
        s = scrape(health_port)
        return (
            total(s, "mailtap_streams_records_processed_total") >= 3
            and total(s, "mailtap_streams_table_entries", table="runs") >= 1
        )

    wait_for(moved, f"records counted; worker log:\n{worker.tail()}")
    after = scrape(health_port)
    assert total(after, "mailtap_streams_commands_emitted_total", workflow="ticket_intake") >= 1
    assert total(after, "mailtap_streams_guard_decisions_total", guard="routing") == 1
    assert total(after, "mailtap_streams_guard_decisions_total", guard="max_reply_age") == 1
    assert total(after, "mailtap_streams_commands_emitted_total", workflow="ticket_intake") == 1
    assert total(after, "mailtap_streams_workflow_steps_total", status="UNROUTED") == 1
    assert total(after, "mailtap_streams_workflow_failures_total") == 0
    # Lag per partition of the events topic: one sample per assigned partition.
    lags = [lab for (n, lab) in after if n == "mailtap_streams_consumer_lag"]
    assert {
        dict(lab)["partition"] for lab in lags if dict(lab)["topic"] == kafka.topics.events
    } == {
        "0",
        "1",
    }
