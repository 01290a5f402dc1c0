"""Sinks that scale (issue 12 item 4): several ``mailtap run smtp-sink`` processes in one group,
rebalanced while they send -- a third joins, one stops with SIGTERM, one is killed -9 -- and each
command reaches the SMTP server once, counted there by Message-ID. Only the kill may resend, and at
most the mails it had on the wire (``pool_size``), each reported UNKNOWN first."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from smtp_harness import WAIT_S, TopicReader, command, produce_commands, run_until, sink_config
from smtp_scripted_server import ScriptedRelay

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig, config_from_dict
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.smtp.identity import message_id_for
from connectors.smtp.lanes import PRODUCER_COMPRESSION
from connectors.smtp.sink import SmtpSink
from connectors.smtp.state import ensure_state_topic
from mailtap.components import Component
from mailtap.dev import DevServices

REPO = Path(__file__).resolve().parents[3]
PARTITIONS = 4
POOL_SIZE = 2
COMMANDS = 240
#: Every tenth command is refused 451 once by the relay: its second attempt goes through a retry
#: tier, on the command's partition number, across the rebalances.
FLAKY_EVERY = 10


def wait_for(predicate: Any, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def keys_by_partition(cfg: MailtapConfig, topic: str) -> dict[str, set[int]]:
    """``{key: partitions it was written to}`` of everything committed on ``topic``."""
    consumer = Consumer(consumer_config(cfg.kafka, f"check-{uuid.uuid4().hex[:8]}"))
    found: dict[str, set[int]] = {}
    try:
        for partition in range(PARTITIONS):
            tp = TopicPartition(topic, partition)
            low, high = consumer.get_watermark_offsets(tp, timeout=30, cached=False)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            while consumer.position([tp])[0].offset < high:
                for msg in consumer.consume(500, timeout=1):
                    if not msg.error() and msg.key():
                        found.setdefault(msg.key().decode(), set()).add(partition)
    finally:
        consumer.close()
    return found


def produce_round_robin(cfg: MailtapConfig, cmds: list[dict[str, Any]]) -> None:
    """Commands on partition ``i % PARTITIONS``, not where librdkafka's partitioner would put
    their keys -- as a producer with another partitioner (Java's murmur2) does: the sink must
    follow the command's partition, not hash the command id itself."""
    produce_commands(cfg, [])  # the topics
    serde = AvroSerde.for_schema("ReplyCommand", cfg.kafka)
    producer = Producer(producer_config(cfg.kafka, compression_type=PRODUCER_COMPRESSION))
    topic = cfg.kafka.topics.commands
    for i, value in enumerate(cmds):
        producer.produce(
            topic,
            key=value["command_id"].encode(),
            value=serde.encode(value, topic),
            partition=i % PARTITIONS,
        )
    assert producer.flush(30) == 0


def test_sinks_rebalanced_while_sending_deliver_each_command_once(
    services: DevServices, unique: str, relay: ScriptedRelay, tmp_path: Path
) -> None:
    _cfg, _settings, raw = sink_config(
        services.bootstrap_servers,
        unique,
        relay.port,
        pool_size=POOL_SIZE,
        # Small batches and a send rate per instance: every rebalance lands while most of the
        # commands are still to be sent.
        batch_size=5,
        rate={"per_minute": 300, "burst": 1},
    )
    raw["kafka"]["partitions"] = PARTITIONS
    # Static members do not leave the group on close (KIP-345): their partitions move when the
    # session times out. The broker's minimum keeps the test short.
    raw["kafka"]["client_properties"] = {"session.timeout.ms": "6000"}
    cfg = config_from_dict(raw)
    cmds = [
        command([f"{'flaky1' if i % FLAKY_EVERY == 0 else f'user{i}'}@example.org"])
        for i in range(COMMANDS)
    ]
    produce_round_robin(cfg, cmds)
    expected = {f"<{message_id_for(c['command_id'], 'example.com')}>" for c in cmds}

    sinks: dict[str, Component] = {}

    def start(name: str) -> Component:
        config = tmp_path / f"{name}.yaml"
        mine = {**raw, "smtp": {**raw["smtp"], "instance_id": f"{name}-{unique}"}}
        config.write_text(yaml.safe_dump(mine))
        sinks[name] = Component(
            "smtp-sink", config, tmp_path / f"{name}.log", {"PYTHONPATH": str(REPO)}
        ).start()
        return sinks[name]

    def accepted() -> list[str]:
        return [a.message_id for a in relay.handler.snapshot()]

    running: set[str] = set()

    def sending_beyond(count: int) -> bool:
        for name in running:
            assert sinks[name].alive, sinks[name].log_tail()
        return len(accepted()) >= count

    def assigned(name: str) -> bool:
        return bool(re.search(r"assigned \[\('mail", sinks[name].log_path.read_text()))

    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    try:
        start("a")
        start("b")
        running |= {"a", "b"}
        wait_for(lambda: sending_beyond(20), "a and b sending")
        start("c")  # joins: a rebalance while a and b send
        running.add("c")
        wait_for(lambda: assigned("c"), "c assigned")
        joined = len(accepted())
        wait_for(lambda: sending_beyond(joined + 10), "sending after c joined")
        # c's share has moved to it: the joiners' rebalance is over.
        before_stop = len(accepted())
        assert before_stop < COMMANDS, "everything was sent before the rebalances"
        running.discard("b")
        assert sinks["b"].stop() == 0, sinks["b"].log_tail()  # clean: its batch is recorded
        wait_for(lambda: sending_beyond(before_stop + 30), "a and c sending after b stopped")
        at_kill = accepted()
        assert len(set(at_kill)) < COMMANDS, "everything was sent before the kill"
        # Clean rebalances (a join, a SIGTERM) sent nothing twice.
        assert len(at_kill) == len(set(at_kill)), Counter(at_kill).most_common(3)
        running.discard("c")
        sinks["c"].kill()

        def all_sent() -> bool:
            events.poll(0.2)
            assert sinks["a"].alive, sinks["a"].log_tail()
            return {e["command_id"] for e in events.values if e["status"] == "SENT"} == {
                c["command_id"] for c in cmds
            }

        wait_for(all_sent, "every command SENT after the kill", timeout=2 * WAIT_S)
    finally:
        for sink in sinks.values():
            sink.stop()
    assert sinks["a"].process is not None and sinks["a"].process.returncode == 0
    events.drain()
    events.close()

    copies = Counter(accepted())
    assert set(copies) == expected
    duplicated = {mid: n for mid, n in copies.items() if n > 1}
    unknown = Counter(e["command_id"] for e in events.values if e["status"] == "UNKNOWN")
    print(
        f"sinks=3 partitions={PARTITIONS} commands={COMMANDS} accepted={sum(copies.values())} "
        f"duplicated by the kill -9={len(duplicated)} unknown={sum(unknown.values())}"
    )
    # The kill -9 resends at most what c had on the wire, each after an UNKNOWN report.
    assert sum(n - 1 for n in duplicated.values()) <= POOL_SIZE, duplicated
    for cmd in cmds:
        cid = cmd["command_id"]
        mid = f"<{message_id_for(cid, 'example.com')}>"
        assert copies[mid] <= 1 + unknown[cid]
        assert [e["status"] for e in events.values if e["command_id"] == cid].count("SENT") == 1
    # Each command's state and retry records sit on its commands partition number.
    home = keys_by_partition(cfg, cfg.kafka.topics.commands)
    retried = keys_by_partition(cfg, f"{cfg.kafka.topics.retry_prefix}.1s")
    state = keys_by_partition(cfg, raw["smtp"]["state_topic"])
    assert set(state) == set(home)
    assert len(retried) >= COMMANDS // FLAKY_EVERY
    for cid, partitions in [*state.items(), *retried.items()]:
        assert partitions == home[cid], cid
    # An instance reads back the state of the partitions it is assigned, and only those: c,
    # never alone in the group, never read the whole topic.
    for name in ("a", "b", "c"):
        log = sinks[name].log_path.read_text()
        for topics, numbers in re.findall(
            r"assigned (\[.*?\]); state of partitions (\[.*?\])", log
        ):
            assert sorted({int(p) for p in re.findall(r", (\d+)\)", topics)}) == yaml.safe_load(
                numbers
            ), (name, topics, numbers)
    reads = re.findall(r"state of partitions \[([\d, ]*)\]", sinks["c"].log_path.read_text())
    assert reads and all(len(r.split(",")) < PARTITIONS for r in reads), reads


def test_a_state_topic_with_another_partition_count_stops_the_start(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port)
    produce_commands(cfg, [])  # mail.commands and the tiers with 2 partitions
    ensure_state_topic(cfg.kafka, settings.state_topic, 3)
    sink = SmtpSink(cfg, settings)
    with pytest.raises(ConfigError) as caught:
        sink.start()
    assert f"{settings.state_topic} has 3" in str(caught.value)
    assert relay.handler.snapshot() == []


def produce_on_partition_0(cfg: MailtapConfig, cmds: list[dict[str, Any]]) -> None:
    """One partition, one fetch: the first batch holds them all."""
    produce_commands(cfg, [])
    serde = AvroSerde.for_schema("ReplyCommand", cfg.kafka)
    producer = Producer(producer_config(cfg.kafka, compression_type=PRODUCER_COMPRESSION))
    topic = cfg.kafka.topics.commands
    for value in cmds:
        key = value["command_id"].encode()
        producer.produce(topic, key=key, value=serde.encode(value, topic), partition=0)
    assert producer.flush(30) == 0


async def test_a_stop_mid_batch_sends_no_more_and_the_next_instance_sends_the_rest(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    """SIGTERM (the stop event) during a batch: the send in flight gets its outcome recorded,
    nothing else of the batch is sent, and the next owner sends the rest, each once."""
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port, pool_size=1)
    cmds = [command(["stall@example.org"])] + [command([f"u{i}@example.org"]) for i in range(3)]
    produce_on_partition_0(cfg, cmds)
    stop = asyncio.Event()
    first = SmtpSink(cfg, settings)
    running = asyncio.create_task(first.run(stop))
    deadline = time.monotonic() + WAIT_S
    while not relay.handler.deliveries:  # the stalled DATA reached the relay
        assert time.monotonic() < deadline and not running.done(), "nothing sent"
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(running, WAIT_S)
    assert first.records_total == len(cmds)
    assert len(relay.handler.snapshot()) == 1  # only the one in flight at the stop
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    second = SmtpSink(cfg, settings)
    await run_until(second, events, lambda ev: len({e["command_id"] for e in ev}) == len(cmds))
    copies = Counter(a.message_id for a in relay.handler.snapshot())
    assert sorted(copies.values()) == [1] * len(cmds)
    assert {e["status"] for e in events.values} == {"SENT"}
    events.close()


async def test_a_batch_past_its_budget_leaves_the_unsent_rest_to_the_next_batch(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    """A batch must end well inside max.poll.interval.ms: past it the instance leaves the group,
    its partitions move, and whatever it still started would be sent by the new owner as well.
    So past the budget it starts no new send; the rest comes again in the next batch."""
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, relay.port, pool_size=1)
    # The relay answers the first one after 4 s: the batch's budget (1 s here) is spent then.
    cmds = [command(["stall@example.org"])] + [command([f"u{i}@example.org"]) for i in range(3)]
    produce_on_partition_0(cfg, cmds)
    sink = SmtpSink(cfg, settings)
    sink.batch_budget_s = 1.0
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink.start()
    try:
        deadline = time.monotonic() + WAIT_S
        seen = 0
        while seen == 0:
            assert time.monotonic() < deadline, "no records"
            seen = await sink.poll_once()
        assert seen == len(cmds)
        # Only the command started inside the budget went out; its outcome is recorded.
        assert len(relay.handler.snapshot()) == 1
        while len({e["command_id"] for e in events.values if e["status"] == "SENT"}) < len(cmds):
            assert time.monotonic() < deadline, events.values
            await sink.poll_once()
            events.poll(0.05)
    finally:
        await sink.close()
    copies = Counter(a.message_id for a in relay.handler.snapshot())
    assert sorted(copies.values()) == [1] * len(cmds)
    events.close()
