"""``mailtap consume TOPIC``: how another team looks at the stream, one JSON object per record.

Avro values are decoded with the schema they were written with; the offsets topic's JSON values
are shown as JSON; anything else (DLQ payloads) as text when it is UTF-8, else base64.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import click
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from connectors.core import tracing
from connectors.core.avro.serde import AnyAvroDecoder
from connectors.core.config import KafkaSettings, TopicNames, load_config
from connectors.core.errors import ConfigError, DataError
from connectors.core.kafka.clients import consumer_config, unreachable
from connectors.core.kafka.errors import KafkaTimeout, TopicReadError
from connectors.core.kafka.readtoend import read_to_end, topic_partitions
from mailtap.commands.common import config_option

#: Without --follow, the read to the end of the topic gives up after this: printing a large
#: topic takes a while, a read that has not reached the end by then is stuck.
READ_TIMEOUT_S = 600.0


def _bytes_to_json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}
    try:
        return json.loads(text)
    except ValueError:
        return text


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot show {type(value).__name__}")


def _in_namespace(kafka: KafkaSettings, topic: str) -> str:
    """With ``kafka.namespace``, one of mailtap's default topic names (``mail.events``) means
    this deployment's topic (``prod.mail.events``, or the name ``kafka.topics`` gives it), so
    that one command line serves every deployment; any other name is read as given."""
    if kafka.namespace is None:
        return topic
    defaults = TopicNames()
    for role in TopicNames.model_fields:
        if getattr(defaults, role) == topic:
            resolved: str = getattr(kafka.topics, role)
            if resolved != topic:
                click.echo(f"reading {resolved} (kafka.namespace {kafka.namespace})", err=True)
            return resolved
    return topic


@click.command()
@click.argument("topic")
@config_option
@click.option("--from-beginning", is_flag=True, help="Start at the oldest record.")
@click.option("--offset", type=int, default=None, help="Start at this offset in every partition.")
@click.option("--from-time", default=None, help="Start at an ISO time, e.g. 2026-11-29T10:00:00Z.")
@click.option("--max-messages", type=int, default=None, help="Stop after this many records.")
@click.option("--follow/--no-follow", default=False, help="Keep waiting for new records.")
@click.option("--uncommitted", is_flag=True, help="Also show records of open/aborted transactions.")
def consume(
    topic: str,
    config_path: str,
    from_beginning: bool,
    offset: int | None,
    from_time: str | None,
    max_messages: int | None,
    follow: bool,
    uncommitted: bool,
) -> None:
    """Print TOPIC's records as JSON lines (key, partition, offset, timestamp, headers,
    trace_id, value).

    Without --from-beginning/--offset/--from-time it starts at the end (new records only)
    and implies --follow.
    """
    if (
        sum(x is not None and x is not False for x in (from_beginning or None, offset, from_time))
        > 1
    ):
        raise click.UsageError("use only one of --from-beginning, --offset, --from-time")
    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if not (from_beginning or offset is not None or from_time):
        follow = True
    topic = _in_namespace(cfg.kafka, topic)
    consumer = Consumer(
        consumer_config(
            cfg.kafka,
            group_id=cfg.kafka.qualify(f"mailtap-consume-{uuid.uuid4().hex[:8]}"),
            isolation_level="read_uncommitted" if uncommitted else "read_committed",
            enable_partition_eof=True,
        )
    )
    decoder = AnyAvroDecoder(cfg.kafka.schema_registry_url, cfg.kafka.schema_registry)
    try:
        partitions = topic_partitions(consumer, cfg.kafka, topic, 10)
        if partitions is None:
            raise click.ClickException(
                f"topic {topic!r} does not exist on {cfg.kafka.bootstrap_servers}"
            )
        assignments = [TopicPartition(topic, p, _start(from_beginning, offset)) for p in partitions]
        if from_time:
            when = dt.datetime.fromisoformat(from_time.replace("Z", "+00:00"))
            millis = int(when.timestamp() * 1000)
            assignments = consumer.offsets_for_times(
                [TopicPartition(topic, p, millis) for p in partitions], timeout=10
            )
        if follow:
            consumer.assign(assignments)
            records: Iterable[Message] = _follow(consumer, topic)
        else:
            records = read_to_end(consumer, assignments, READ_TIMEOUT_S)
        for msg in itertools.islice(records, max_messages):
            record = _record(msg, decoder, topic)
            click.echo(json.dumps(record, default=_default, ensure_ascii=False))
    except (ConfigError, KafkaTimeout, TopicReadError) as exc:  # KafkaUnavailable: the sentence
        raise click.ClickException(str(exc)) from None  # names the setting to check
    except KafkaException as exc:
        raise click.ClickException(unreachable(cfg.kafka, exc.args[0].str())) from None
    finally:
        consumer.close()


def _start(from_beginning: bool, offset: int | None) -> int:
    if offset is not None:
        return offset
    return OFFSET_BEGINNING if from_beginning else OFFSET_END


def _follow(consumer: Consumer, topic: str) -> Iterator[Message]:
    """Every record as it comes, until interrupted."""
    while True:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is None:
            yield msg
        elif err.code() != KafkaError._PARTITION_EOF:
            raise click.ClickException(f"consuming {topic}: {err}")


def _record(msg: Any, decoder: AnyAvroDecoder, topic: str) -> dict[str, Any]:
    raw = msg.value()
    out: dict[str, Any] = {
        "topic": topic,
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": dt.datetime.fromtimestamp(msg.timestamp()[1] / 1000, dt.UTC).isoformat(),
        "key": _bytes_to_json(msg.key()),
        "headers": {k: _bytes_to_json(v) for k, v in (msg.headers() or [])},
        # From the W3C traceparent header (kafka.tracing.enabled): follow one mail end to end.
        "trace_id": tracing.trace_id(msg.headers()),
    }
    if raw is None:
        out["value"] = None
        out["tombstone"] = True
        return out
    try:
        schema, value = decoder.decode(raw, topic)
        out["schema"] = schema
        out["value"] = value
    except DataError:
        out["value"] = _bytes_to_json(raw)
    return out
