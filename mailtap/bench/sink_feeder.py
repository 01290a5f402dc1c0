"""The Kafka side of one ``mailtap bench sink`` round, in a process of its own.

What feeds the sink (producing the commands) and what reads its result (the SENT events on the
delivery topic) is not the sink's work: in the sink's process it would take the sink's CPU and
GIL, which the raw aiosmtplib half does not pay. :mod:`mailtap.bench.sink` starts this module
with ``python -m mailtap.bench.sink_feeder``, a JSON request on stdin::

    {"bootstrap_servers": "127.0.0.1:9092", "commands": "bench.commands.x",
     "delivery": "bench.delivery.x", "run": "x-1", "messages": 2000}

It encodes the commands, assigns itself every partition of the delivery topic (no group join),
prints ``ready``, waits for ``go`` on stdin, then produces and reads until every command has its
SENT event, and prints one JSON line: ``started`` and ``finished`` (``time.perf_counter()``,
CLOCK_MONOTONIC on Linux, so comparable with the parent's) and the non-SENT events, if any.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import config_from_dict
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.smtp.lanes import PRODUCER_COMPRESSION

#: How long the reader waits for the delivery topic's metadata.
METADATA_TIMEOUT_S = 30.0


def command(i: int, run: str) -> dict[str, Any]:
    """The benchmark's ReplyCommand number ``i`` (the raw half renders the same ones)."""
    return {
        "schema_version": 1,
        "command_id": f"bench-{run}-{i:06d}",
        "kind": "REPLY",
        "workflow": "bench",
        "step": "reply",
        "event_key": f"evt-{i}",
        "from": {"name": "mailtap bench", "address": "bench@example.com"},
        "to": [{"name": "Receiver", "address": f"rcpt{i % 50}@example.org"}],
        "cc": [],
        "bcc": [],
        "reply_to": [],
        "subject": f"Re: bench message {i}",
        "text_body": "Thank you for your message.\n" * 20,
        "html_body": None,
        "attachments": [],
        "in_reply_to": f"orig-{i}@example.org",
        "references": [],
        "auto_submitted": "auto-replied",
        "created_at": datetime.now(UTC),
    }


def feed(request: dict[str, Any]) -> dict[str, Any]:
    """One round: see the module docstring."""
    cfg = config_from_dict(
        {
            "kafka": {
                "bootstrap_servers": request["bootstrap_servers"],
                "topics": {"commands": request["commands"], "delivery": request["delivery"]},
            }
        }
    )
    commands_topic, delivery_topic = request["commands"], request["delivery"]
    serde = AvroSerde.for_schema("ReplyCommand", cfg.kafka)
    commands = [command(i, request["run"]) for i in range(request["messages"])]
    encoded = [(c["command_id"].encode(), serde.encode(c, commands_topic)) for c in commands]
    wanted = {c["command_id"] for c in commands}
    producer = Producer(producer_config(cfg.kafka, compression_type=PRODUCER_COMPRESSION))
    reader = Consumer(consumer_config(cfg.kafka, f"bench-reader-{request['run']}"))
    events = AvroSerde.for_schema("DeliveryEvent", cfg.kafka)
    try:
        topic = reader.list_topics(delivery_topic, timeout=METADATA_TIMEOUT_S).topics[
            delivery_topic
        ]
        # Every event since the topic's start: earlier rounds' are skipped by command id.
        reader.assign(
            [TopicPartition(delivery_topic, p, OFFSET_BEGINNING) for p in topic.partitions]
        )
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("sink_feeder: expected 'go'")
        started = time.perf_counter()
        for key, value in encoded:
            while True:
                try:
                    producer.produce(commands_topic, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(30)
        failed: list[dict[str, Any]] = []
        while wanted:
            for msg in reader.consume(1000, timeout=0.1):
                if msg.error() or msg.value() is None:
                    continue
                event = events.decode(msg.value() or b"")
                if event["command_id"] not in wanted:
                    continue
                wanted.discard(event["command_id"])
                if event["status"] != "SENT":  # the round ends; the parent reports it
                    failed.append({k: str(v) for k, v in event.items()})
        return {"started": started, "finished": time.perf_counter(), "failed": failed[:3]}
    finally:
        reader.close()


def main() -> None:
    print(json.dumps(feed(json.loads(sys.stdin.readline()))), flush=True)


if __name__ == "__main__":
    main()
