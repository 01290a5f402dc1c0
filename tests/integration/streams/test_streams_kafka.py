"""The streams worker on the real broker, as a subprocess (``run_streams``), killed and restarted.

One story, in phases, so that each phase's expectations rest on the previous one:

1. worker A: a ticket request, an approval request (old enough for its reminder to be due), an
   auto-reply and an unrouted mail -> ack, forward + receipt + reminder, SKIPPED, UNROUTED;
   then a follow-up in the ticket's thread -> attached, no new ticket;
2. worker A is killed with SIGKILL; worker B starts with the same app id (tables restored from
   the changelog topics);
3. the approver's APPROVE arrives -> B still knows the pending approval -> decision + confirmation;
4. every record of ``mail.events`` is produced again from the beginning -> the mails that ran
   a workflow publish nothing (the worker counts them as dedupe decisions on /metrics), not
   one new command id.

Deadlines only guard against hangs; nothing asserts on timing.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.core.kafka.topics import ensure_topics
from mailtap.dev.process import free_port
from streams.testing import mail_record
from streams.workflows.ticket_intake import ticket_number
from tests.support.scrape import deduped

REPO = Path(__file__).resolve().parents[3]
#: Hang guard for each wait (a worker start includes a group join and table recovery).
DEADLINE_S = 180.0
BOSS = "boss@example.com"

MAIL = AvroSerde.for_schema("MailEvent")
COMMAND = AvroSerde.for_schema("ReplyCommand")
EVENT = AvroSerde.for_schema("WorkflowEvent")


@pytest.fixture
def kafka(services: Any, unique: str) -> KafkaSettings:
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    settings = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers,
        topics=TopicNames(**names),
        partitions=2,
    )
    ensure_topics(settings, retry_tiers=["1m"])
    return settings


@pytest.fixture
def config_path(kafka: KafkaSettings, tmp_path: Path, unique: str) -> Path:
    document = {
        "kafka": {
            "bootstrap_servers": kafka.bootstrap_servers,
            "topics": kafka.topics.model_dump(),
        },
        "claim_check": {"url": (tmp_path / "claims").as_uri()},
        "streams": {
            "app_id": f"mailtap-streams-{unique}",
            "data_dir": str(tmp_path / "faust"),
            "from_address": {"name": "Helpdesk", "address": "help@example.com"},
            "auth_policy": "none",
            "tick_interval_seconds": 0.5,
            "rules": [
                {"match": {"recipient": "approvals@example.com"}, "workflow": "approval"},
                {"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"},
            ],
            "workflows": {
                "approval": {
                    "options": {
                        "approver": BOSS,
                        "reminder_after_seconds": 60,
                        "max_reminders": 1,
                    }
                }
            },
        },
    }
    path = tmp_path / "mailtap.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


class WorkerProcess:
    """``run_streams(config)`` in its own process group, with its log in a file."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("MAILTAP_KAFKA_BOOTSTRAP", None)  # the config names the broker
        #: Its /metrics: the config's health section (test_streams_metrics writes one), else
        #: one on a free port, by environment (which would override the config's).
        health = yaml.safe_load(config_path.read_text()).get("health") or {}
        if "port" in health:
            self.port = int(health["port"])
        else:
            self.port = free_port()
            env["MAILTAP__HEALTH__PORT"] = str(self.port)
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from mailtap.commands.streams import run_streams; "
                    "run_streams(sys.argv[1])",
                    str(config_path),
                ],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def deduped(self) -> int:
        return deduped(self.port)


@pytest.fixture
def start_worker(config_path: Path, tmp_path: Path) -> Iterator[Callable[[], WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        worker = WorkerProcess(config_path, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


class TopicReader:
    """Reads a topic from the beginning, decoding values; keeps everything seen so far."""

    def __init__(self, kafka: KafkaSettings, topic: str, serde: AvroSerde) -> None:
        self.serde = serde
        self.consumer = Consumer(consumer_config(kafka, group_id=f"t-{uuid.uuid4().hex[:8]}"))
        parts = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        self.records: list[dict[str, Any]] = []

    def until(
        self,
        done: Callable[[list[dict[str, Any]]], bool],
        worker: WorkerProcess,
        missing: Callable[[list[dict[str, Any]]], object] | None = None,
    ) -> None:
        """Read until ``done``; on the deadline fail naming what is ``missing`` (when given)."""
        deadline = time.monotonic() + DEADLINE_S
        while not done(self.records):
            assert time.monotonic() < deadline, (
                f"timed out{f'; missing {missing(self.records)}' if missing else ''}"
                f"; worker log:\n{worker.tail()}"
            )
            assert worker.proc.poll() is None, f"worker exited:\n{worker.tail()}"
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            self.records.append(self.serde.decode(msg.value()))

    def drain(self, worker: WorkerProcess) -> None:
        """Read up to the current end of every partition."""
        ends = {}
        for tp in self.consumer.assignment():
            _, high = self.consumer.get_watermark_offsets(tp, timeout=10)
            ends[tp.partition] = high

        def at_end(_: list[dict[str, Any]]) -> bool:
            positions = {
                tp.partition: tp.offset for tp in self.consumer.position(self.consumer.assignment())
            }
            return all(positions[p] >= end for p, end in ends.items() if end > 0)

        self.until(at_end, worker)

    def close(self) -> None:
        self.consumer.close()


def produce(kafka: KafkaSettings, records: list[dict[str, Any]]) -> None:
    producer = Producer(producer_config(kafka))
    for record in records:
        producer.produce(
            kafka.topics.events, key=record["key"], value=MAIL.encode(record, kafka.topics.events)
        )
    assert producer.flush(30) == 0


def replay_events(kafka: KafkaSettings) -> int:
    """Re-produce every record of mail.events, verbatim, from the beginning."""
    reader = Consumer(consumer_config(kafka, group_id=f"r-{uuid.uuid4().hex[:8]}"))
    topic = kafka.topics.events
    parts = reader.list_topics(topic, timeout=10).topics[topic].partitions
    reader.assign([TopicPartition(topic, p, 0) for p in parts])
    # Only what is there now: the copies produced below land on the same topic.
    ends = {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    producer = Producer(producer_config(kafka))
    done = {p for p, end in ends.items() if end == 0}
    count = 0
    deadline = time.monotonic() + DEADLINE_S
    while done != set(parts):
        assert time.monotonic() < deadline
        msg = reader.poll(1.0)
        if msg is None or msg.error() or msg.partition() in done:
            continue
        producer.produce(topic, key=msg.key(), value=msg.value())
        count += 1
        if msg.offset() + 1 >= ends[msg.partition()]:
            done.add(msg.partition())
    reader.close()
    assert producer.flush(30) == 0
    return count


def send_sentinels(kafka: KafkaSettings, now: dt.datetime) -> set[str]:
    """One unrouted mail into each partition of mail.events; returns their keys."""
    producer = Producer(producer_config(kafka))
    topic = kafka.topics.events
    parts = producer.list_topics(topic, timeout=10).topics[topic].partitions
    keys = set()
    for p in parts:
        record = mail_record(
            message_id=f"sentinel-{p}-{uuid.uuid4().hex}@example.com",
            to=["nobody@example.com"],
            observed_at=now,
        )
        producer.produce(topic, key=record["key"], value=MAIL.encode(record, topic), partition=p)
        keys.add(record["key"])
    assert producer.flush(30) == 0
    return keys


def steps(commands: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(c["workflow"], c["step"]) for c in commands}


def test_worker_replies_survives_kill_and_absorbs_a_full_replay(
    kafka: KafkaSettings, start_worker: Callable[[], WorkerProcess]
) -> None:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    ticket = mail_record(message_id=f"t1-{uuid.uuid4().hex}@example.com", observed_at=now)
    approval = mail_record(
        message_id=f"a1-{uuid.uuid4().hex}@example.com",
        to=["approvals@example.com"],
        subject="Expense: hotel 240 EUR",
        observed_at=now - dt.timedelta(hours=1),  # its reminder is due at the first tick
    )
    auto_reply = mail_record(
        subject="Out of office",
        guard_headers={"auto_submitted": "auto-replied"},
        observed_at=now,
    )
    unrouted = mail_record(to=["sales@example.com"], subject="Offer", observed_at=now)

    commands = TopicReader(kafka, kafka.topics.commands, COMMAND)
    events = TopicReader(kafka, kafka.topics.workflow, EVENT)
    try:
        # -- phase 1: worker A ------------------------------------------------------------------
        worker_a = start_worker()
        produce(kafka, [ticket, approval, auto_reply, unrouted])
        phase1 = {
            ("ticket_intake", "acknowledge"),
            ("approval", "request"),
            ("approval", "received"),
            ("approval", "reminder-1"),
        }
        commands.until(lambda got: phase1 <= steps(got), worker_a)
        events.until(lambda got: {"UNROUTED", "SKIPPED"} <= {e["status"] for e in got}, worker_a)
        ack = next(c for c in commands.records if c["step"] == "acknowledge")
        assert ack["in_reply_to"] == ticket["message_id"]
        assert ack["references"] == [ticket["message_id"]]
        number = ticket_number(ticket["key"])
        assert f"[#{number}]" in ack["subject"]
        skipped = next(e for e in events.records if e["status"] == "SKIPPED")
        assert skipped["event_key"] == auto_reply["key"]
        assert skipped["attributes"]["guard"] == "auto_submitted"

        followup = mail_record(
            message_id=f"t2-{uuid.uuid4().hex}@example.com",
            subject=ack["subject"],
            in_reply_to="ack@mailtap",
            references=[ticket["message_id"], "ack@mailtap"],
            observed_at=now + dt.timedelta(seconds=1),
        )
        produce(kafka, [followup])
        commands.until(lambda got: ("ticket_intake", "followup") in steps(got), worker_a)
        events.until(lambda got: any(e["status"] == "TICKET_UPDATED" for e in got), worker_a)
        assert [e["instance_id"] for e in events.records if e["status"].startswith("TICKET")] == [
            number,
            number,
        ]

        # -- phase 2: kill A, start B -------------------------------------------------------------
        worker_a.kill()
        worker_b = start_worker()

        # -- phase 3: the approver answers; B must know the pending approval ---------------------
        answer = mail_record(
            message_id=f"a2-{uuid.uuid4().hex}@example.com",
            sender=BOSS,
            to=["approvals@example.com"],
            subject="Re: [APPROVAL x] Expense: hotel 240 EUR",
            text_body="APPROVE\n\nfine.",
            references=[approval["message_id"], "fwd@mailtap"],
            in_reply_to="fwd@mailtap",
            observed_at=now + dt.timedelta(seconds=2),
        )
        produce(kafka, [answer])
        commands.until(
            lambda got: {("approval", "decision"), ("approval", "confirmation")} <= steps(got),
            worker_b,
        )
        events.until(lambda got: any(e["status"] == "APPROVED" for e in got), worker_b)
        decision = next(c for c in commands.records if c["step"] == "decision")
        assert decision["to"][0]["address"] == "ann@example.com"
        assert decision["in_reply_to"] == approval["message_id"]
        assert "approved" in decision["text_body"]

        # -- phase 4: replay everything ---------------------------------------------------------
        ids_before = {c["command_id"] for c in commands.records}
        assert len(ids_before) == 7
        events.drain(worker_b)
        mark = len(events.records)
        deduped_before = worker_b.deduped()
        assert replay_events(kafka) == 6
        # A sentinel per partition, produced after the replay, and the worker's count of mails
        # it had run already: the four that ran a workflow publish nothing when read again (a
        # SKIPPED under the mail's key would take the place of its status on the compacted
        # mail.workflow). The auto-reply and the unrouted mail are reported again as before.
        sentinels = send_sentinels(kafka, now)
        ran = {ticket["key"], approval["key"], followup["key"], answer["key"]}
        again = sentinels | {auto_reply["key"], unrouted["key"]}
        events.until(lambda got: again <= {e["event_key"] for e in got[mark:]}, worker_b)
        deadline = time.monotonic() + DEADLINE_S
        while worker_b.deduped() < deduped_before + len(ran):
            assert time.monotonic() < deadline, worker_b.tail()
            time.sleep(0.5)
        events.drain(worker_b)
        after = events.records[mark:]
        assert not [e for e in after if e["event_key"] in ran], after
        assert {e["event_key"] for e in after} == again
        commands.drain(worker_b)
        assert {c["command_id"] for c in commands.records} == ids_before
    finally:
        commands.close()
        events.close()
