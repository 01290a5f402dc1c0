"""First starts of ``mailtap run streams`` on fresh app ids: every one does its job, none crashes.

A fresh ``app_id`` (a first deployment, a new workflow set) means new changelog topics. Left to
faust they are created while the worker starts, and a broker slow to list them made the agent
crash-loop (``TypeError`` in ``key_partition``, restarted every few seconds, for good). The
"metadata-lag" runs make the broker slow on purpose: faust's own topic creation is held back
by a few seconds in the worker process, which is what a lagging broker looks like from the
client (the created topic is missing from the metadata answers that follow).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]
from test_streams_kafka import (
    COMMAND,
    DEADLINE_S,
    EVENT,
    REPO,
    TopicReader,
    kafka,  # noqa: F401  (fixture)
    produce,
)

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client
from streams.testing import mail_record

FIRST_STARTS = 5
#: How long the injected lag holds faust's own topic creation back.
LAG_S = 3.0
#: Run in the worker process before ``mailtap run streams``: faust's CreateTopics is sent only
#: LAG_S later, so the metadata refresh faust makes right after "creating" comes back without it.
LAG_PRELUDE = f"""
import asyncio
from faust.transport.drivers import aiokafka as driver
create = driver.Transport._create_topic
async def lagging(self, *args, **kwargs):
    async def later():
        await asyncio.sleep({LAG_S})
        await create(self, *args, **kwargs)
    asyncio.ensure_future(later())
driver.Transport._create_topic = lagging
"""
CRASH_MARKS = ("Crashed reason", "Restarting dead", "Traceback")


def write_config(settings: KafkaSettings, tmp_path: Path, app_id: str) -> Path:
    document = {
        "kafka": {
            "bootstrap_servers": settings.bootstrap_servers,
            "topics": settings.topics.model_dump(),
        },
        "claim_check": {"url": (tmp_path / "claims").as_uri()},
        "streams": {
            "app_id": app_id,
            "data_dir": str(tmp_path / app_id),
            "from_address": {"name": "Helpdesk", "address": "help@example.com"},
            "auth_policy": "none",
            "rules": [{"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"}],
        },
    }
    path = tmp_path / f"{app_id}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


class CliWorker:
    """``mailtap run streams -c CONFIG`` in its own process group, with its log in a file."""

    def __init__(self, config: Path, log_path: Path, prelude: str = "") -> None:
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("MAILTAP_KAFKA_BOOTSTRAP", None)  # the config names the broker
        code = f"{prelude}\nfrom mailtap.cli import main\nmain()"
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, "run", "streams", "-c", str(config)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self) -> str:
        return self.log()[-6000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=30)


def wait_for_ticket(
    commands: TopicReader, events: TopicReader, key: str, worker: CliWorker
) -> None:
    """Until the mail's acknowledgement and TICKET_OPENED are out; fails at the first crash."""
    deadline = time.monotonic() + DEADLINE_S

    def done() -> bool:
        acked = any(c["event_key"] == key and c["step"] == "acknowledge" for c in commands.records)
        opened = any(
            e["event_key"] == key and e["status"] == "TICKET_OPENED" for e in events.records
        )
        return acked and opened

    while not done():
        log = worker.log()
        assert not any(mark in log for mark in CRASH_MARKS), f"worker crashed:\n{worker.tail()}"
        assert worker.proc.poll() is None, f"worker exited:\n{worker.tail()}"
        assert time.monotonic() < deadline, f"timed out; worker log:\n{worker.tail()}"
        for reader in (commands, events):
            msg = reader.consumer.poll(0.2)
            if msg is not None and not msg.error():
                reader.records.append(reader.serde.decode(msg.value()))


def ticket_mail(run: int) -> dict[str, Any]:
    return mail_record(
        message_id=f"first-{run}-{uuid.uuid4().hex}@example.com",
        # One sender per mail: the per-sender reply limit must not hide a missing reply.
        sender=f"first-{run}-{uuid.uuid4().hex[:6]}@example.org",
        observed_at=dt.datetime.now(dt.UTC),
    )


@pytest.mark.parametrize("lag", [False, True], ids=["plain", "metadata-lag"])
def test_first_start_on_fresh_app_ids(
    kafka: KafkaSettings,  # noqa: F811
    tmp_path: Path,
    unique: str,
    lag: bool,
) -> None:
    commands = TopicReader(kafka, kafka.topics.commands, COMMAND)
    events = TopicReader(kafka, kafka.topics.workflow, EVENT)
    try:
        for run in range(FIRST_STARTS):
            app_id = f"mailtap-streams-{unique}-{run}"
            config = write_config(kafka, tmp_path, app_id)
            worker = CliWorker(config, tmp_path / f"{app_id}.log", LAG_PRELUDE if lag else "")
            try:
                # Two mails, one after the other: the agent handles mails one at a time, so the
                # second one's ticket proves the first one's table writes went through.
                for mail in (ticket_mail(run), ticket_mail(run)):
                    produce(kafka, [mail])
                    wait_for_ticket(commands, events, mail["key"], worker)
            finally:
                code = worker.stop()
            log = worker.log()
            assert code == 0, log[-6000:]
            assert not any(mark in log for mark in CRASH_MARKS), log[-6000:]
            # The changelog topics are there, compacted, partitioned like mail.events.
            described = admin_client(kafka).list_topics(timeout=30).topics
            events_partitions = len(described[kafka.topics.events].partitions)
            for table in ("runs", "rates", "state"):
                topic = described[f"{app_id}-{table}-changelog"]
                assert len(topic.partitions) == events_partitions
    finally:
        commands.close()
        events.close()


def test_a_changelog_with_other_partitions_fails_at_start(
    kafka: KafkaSettings,  # noqa: F811
    tmp_path: Path,
    unique: str,
) -> None:
    app_id = f"mailtap-streams-{unique}"
    admin = admin_client(kafka)
    name = f"{app_id}-state-changelog"
    admin.create_topics([NewTopic(name, 1, kafka.replication_factor)])[name].result()
    worker = CliWorker(write_config(kafka, tmp_path, app_id), tmp_path / "worker.log")
    assert worker.proc.wait(timeout=DEADLINE_S) == 1, worker.tail()
    log = worker.log()
    assert f"topic {name} has 1 partitions, but the worker needs 2" in log, log
    assert "Use a new streams.app_id" in log


def test_a_worker_started_before_the_sources_waits_for_mail_events(
    kafka: KafkaSettings,  # noqa: F811  (fixture)
) -> None:
    # compose and a pod start the worker next to the sources: mail.events may not exist yet.
    # Before, the worker stopped at once with "does not exist" and the test pipelines that start
    # every component together failed when the source was slower to create it.
    import threading

    from connectors.core.errors import ConfigError
    from streams.app import events_partitions

    later = kafka.model_copy(
        update={
            "topics": kafka.topics.model_copy(
                update={"events": f"{kafka.topics.events}.later-{uuid.uuid4().hex[:6]}"}
            )
        }
    )

    def create() -> None:
        time.sleep(2.0)
        admin = admin_client(later)  # held: the futures fail if the handle is destroyed
        for future in admin.create_topics([NewTopic(later.topics.events, 3, 1)]).values():
            future.result(30)

    creator = threading.Thread(target=create)
    creator.start()
    try:
        assert events_partitions(later, wait=60.0) == 3
    finally:
        creator.join()
    never = kafka.model_copy(
        update={"topics": kafka.topics.model_copy(update={"events": f"never-{uuid.uuid4().hex}"})}
    )
    with pytest.raises(ConfigError, match=r"does not exist on .* \(waited 1s\); create the topics"):
        events_partitions(never, wait=1.0)


def test_a_first_start_on_old_mail_answers_only_the_new_one(
    kafka: KafkaSettings,  # noqa: F811
    tmp_path: Path,
    unique: str,
) -> None:
    # What start: all (or a new app id reading mail.events from offset 0) feeds a worker: mail
    # that arrived long ago, read now. Only the mail of today gets its acknowledgement.
    now = dt.datetime.now(dt.UTC)
    history = []
    for days in (3, 400):
        mail = ticket_mail(days)
        mail["internal_date"] = now - dt.timedelta(days=days)
        history.append(mail)
    fresh = ticket_mail(0)
    produce(kafka, [*history, fresh])
    app_id = f"mailtap-streams-{unique}"
    worker = CliWorker(write_config(kafka, tmp_path, app_id), tmp_path / "worker.log")
    commands = TopicReader(kafka, kafka.topics.commands, COMMAND)
    events = TopicReader(kafka, kafka.topics.workflow, EVENT)
    old_keys = {m["key"] for m in history}
    try:
        wait_for_ticket(commands, events, fresh["key"], worker)

        def history_skipped() -> bool:
            skipped = {e["event_key"] for e in events.records if e["status"] == "SKIPPED"}
            return old_keys <= skipped

        deadline = time.monotonic() + DEADLINE_S
        while not history_skipped():
            assert time.monotonic() < deadline, f"timed out; worker log:\n{worker.tail()}"
            msg = events.consumer.poll(0.5)
            if msg is not None and not msg.error():
                events.records.append(EVENT.decode(msg.value()))
        commands.drain(worker)  # type: ignore[arg-type]
    finally:
        code = worker.stop()
        commands.close()
        events.close()
    assert code == 0, worker.tail()
    reasons = {
        e["event_key"]: e["attributes"]
        for e in events.records
        if e["event_key"] in old_keys and e["status"] == "SKIPPED"
    }
    assert {a["guard"] for a in reasons.values()} == {"max_reply_age"}
    assert "400 days ago" in reasons[history[1]["key"]]["reason"]
    assert "streams.max_reply_age" in reasons[history[0]["key"]]["reason"]
    assert [c for c in commands.records if c["event_key"] in old_keys] == []
    assert [c["step"] for c in commands.records if c["event_key"] == fresh["key"]] == [
        "acknowledge"
    ]
