"""Tracing through the whole product on the real services (issue 13 item 6): with
``kafka.tracing.enabled`` one mail's MailEvent, its ReplyCommand and its DeliveryEvent carry a W3C
``traceparent`` of the same trace (read back by an independent consumer), and ``mailtap consume``
prints that trace id; off (the default), none of them carries one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from imapclient import IMAPClient
from test_whole_pipeline import _config, _ours

from mailtap.components import Pipeline, wait_for
from mailtap.dev import scenario

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
STAGE_S = 180.0


def _records(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict[str, bytes]]]:
    """(value, headers) of every committed record of ``topic``, by a consumer of our own."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"trace-check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])  # 0: from the start
        out, at_end = [], set()
        while at_end != set(partitions):
            msg = consumer.poll(5.0)
            if msg is None:
                continue
            if msg.error():
                at_end.add(msg.partition())
                continue
            out.append((msg.value(), dict(msg.headers() or [])))
        return out
    finally:
        consumer.close()


def _trace_ids(records: list[tuple[bytes | None, dict[str, bytes]]]) -> list[str | None]:
    ids = []
    for value, headers in records:
        if value is None:
            continue  # tombstones
        parent = headers.get("traceparent")
        ids.append(parent.decode().split("-")[1] if parent else None)
    return ids


@pytest.mark.timeout(600)
@pytest.mark.parametrize("enabled", [True, False], ids=["tracing-on", "tracing-off"])
def test_one_mail_is_one_trace_from_event_to_delivery(
    services, unique, tmp_path, enabled: bool
) -> None:
    run = unique
    user = services.add_user(f"trace-{unique}@example.com", "pw")
    config = _config(services, unique, user, tmp_path, f"streams-{unique}")
    doc = yaml.safe_load(config.read_text())
    if enabled:
        doc["kafka"]["tracing"] = {"enabled": True}
    config.write_text(yaml.safe_dump(doc))
    topics = doc["kafka"]["topics"]
    ticket = scenario.ticket_request(run)
    with (
        Pipeline(config, tmp_path / "logs") as pipeline,
        IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client,
    ):
        client.login(user.username, user.password)
        client.append("INBOX", ticket.raw)
        assert wait_for(lambda: len(_ours(services, run)) >= 1, STAGE_S), pipeline.components[
            "smtp-sink"
        ].log_tail()
        bootstrap = services.kafka.bootstrap_servers
        assert wait_for(lambda: _trace_ids(_records(bootstrap, topics["delivery"])), STAGE_S)

    events = _trace_ids(_records(bootstrap, topics["events"]))
    commands = _trace_ids(_records(bootstrap, topics["commands"]))
    deliveries = _trace_ids(_records(bootstrap, topics["delivery"]))
    assert len(events) == 1 and commands and deliveries, (events, commands, deliveries)
    if not enabled:
        assert events + commands + deliveries == [None] * (
            len(events) + len(commands) + len(deliveries)
        )
    else:
        trace = events[0]
        assert trace is not None and len(trace) == 32
        assert set(commands) == {trace}, (trace, commands)
        assert set(deliveries) == {trace}, (trace, deliveries)

    # mailtap consume, as an operator runs it, shows the trace id of each delivery.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mailtap.cli",
            "consume",
            topics["delivery"],
            "-c",
            str(config),
            "--from-beginning",
            "--max-messages",
            str(len(deliveries)),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
        check=True,
    ).stdout
    shown = [json.loads(line)["trace_id"] for line in out.splitlines() if line.strip()]
    assert shown == deliveries, out
