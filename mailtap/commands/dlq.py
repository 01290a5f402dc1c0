"""``mailtap dlq list|show|replay|drop``: dead letters an operator can act on.

One DLQ topic (``kafka.topics.dlq``, or ``--topic``) holds two kinds of record:

* **command** dead letters from the SMTP sink: the original ``ReplyCommand`` bytes with the
  original headers plus ``mailtap.error.{reason,class,topic,partition,offset}``
  (:func:`connectors.smtp.retry.dlq_headers`);
* **source** dead letters from the IMAP/EWS sources: the raw MIME of a mail the parser could not
  read, with ``mailtap.error.{kind,message}`` and ``mailtap.source.{kind,account,folder}``
  (:meth:`connectors.core.source.records.RecordBuilder.dlq`).

A record is named by ``PARTITION:OFFSET``. Filters: ``--error-class`` (class or kind),
``--since``/``--until`` (ISO time of the DLQ record), ``--key``.

``replay`` re-sends a command's original bytes to the commands topic (a fresh attempt; the
retry headers are dropped). It is idempotent: a command id with a SENT outcome on
``mail.delivery`` is not sent again, and the sink itself never re-sends a command whose state
is DONE. A command the sink gave up on *is* DONE, so replaying it after the cause is fixed needs
``--reset-state``: a tombstone for that id on the sink's state topic. The sink reads its state at
start and on every rebalance, so replay while the sink is stopped, or restart it afterwards.
Source dead letters are not replayed (they hold a mail, not an event): fix the parser and let the
source read the mailbox again.

``drop``: the DLQ topic has a delete policy (records expire with its retention), so a dropped
record is remembered instead in the small compacted topic ``<dlq>.dropped`` (key
``PARTITION:OFFSET``, value JSON with who/when/why); ``list`` and ``replay`` skip dropped records,
``list --all`` shows them. A compacted topic rather than a consumer group offset because drops are
per record, not a prefix of the topic.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import click
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from connectors.core.avro.serde import AnyAvroDecoder
from connectors.core.config import KafkaSettings, MailtapConfig, load_config
from connectors.core.errors import DataError
from connectors.core.kafka.clients import admin_client, producer_config
from connectors.core.kafka.topics import COMPACTED
from mailtap.commands.common import config_option
from mailtap.commands.errors import ActionError, NotAcknowledged, UnknownTarget
from mailtap.commands.topicscan import Seen, scan
from mailtap.deployment_names import sink_state_topic

ERROR_PREFIX = "mailtap.error."
#: Headers of a retry record: a replay is a fresh first attempt.
RETRY_HEADERS = ("mailtap.attempt", "mailtap.due-ms", "mailtap.recipients", "mailtap.last-error")


def record_id(seen: Seen) -> str:
    return f"{seen.partition}:{seen.offset}"


def kind_of(seen: Seen) -> str:
    return "source" if seen.header("mailtap.source.account") is not None else "command"


def error_class(seen: Seen) -> str:
    return seen.header("mailtap.error.class") or seen.header("mailtap.error.kind") or ""


def error_reason(seen: Seen) -> str:
    return seen.header("mailtap.error.reason") or seen.header("mailtap.error.message") or ""


def dropped_topic(dlq_topic: str) -> str:
    return f"{dlq_topic}.dropped"


def read_dropped(kafka: KafkaSettings, dlq_topic: str) -> dict[str, Any]:
    dropped: dict[str, Any] = {}
    for seen in scan(kafka, dropped_topic(dlq_topic)):
        if seen.key is None:
            continue
        if seen.value is None:
            dropped.pop(seen.key.decode(), None)
        else:
            dropped[seen.key.decode()] = json.loads(seen.value)
    return dropped


def _parse_time(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO time; write e.g. 2026-12-01T10:00 or 2026-12-01T10:00+01:00"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def select(
    kafka: KafkaSettings,
    topic: str,
    *,
    error_class_: str | None = None,
    since: str | None = None,
    until: str | None = None,
    key: str | None = None,
    include_dropped: bool = False,
) -> Iterator[tuple[Seen, Any]]:
    """DLQ records matching the filters, with their drop note (None when not dropped)."""
    since_ms, until_ms = _parse_time(since), _parse_time(until)  # bad input: before any I/O
    dropped = read_dropped(kafka, topic)
    for seen in scan(kafka, topic, since_ms=since_ms):
        note = dropped.get(record_id(seen))
        if note is not None and not include_dropped:
            continue
        if error_class_ is not None and error_class(seen) != error_class_:
            continue
        if until_ms is not None and seen.timestamp_ms > until_ms:
            continue
        if key is not None and (seen.key or b"").decode("utf-8", "replace") != key:
            continue
        yield seen, note


def summary(seen: Seen, note: Any) -> dict[str, Any]:
    return {
        "id": record_id(seen),
        "at": dt.datetime.fromtimestamp(seen.timestamp_ms / 1000, dt.UTC).isoformat(
            timespec="seconds"
        ),
        "kind": kind_of(seen),
        "key": (seen.key or b"").decode("utf-8", "replace"),
        "error_class": error_class(seen),
        "reason": error_reason(seen),
        "original_topic": seen.header("mailtap.error.topic"),
        # The same spelling as `mailtap status` (imap/ACCOUNT/FOLDER).
        "mailbox": "/".join(
            [(seen.header("mailtap.source.kind") or "").lower()]
            + [seen.header(f"mailtap.source.{f}") or "" for f in ("account", "folder")]
        )
        if kind_of(seen) == "source"
        else None,
        "dropped": note,
    }


def decoded(cfg: MailtapConfig, seen: Seen) -> Any:
    """The command as JSON, or the start of the raw mail of a source dead letter."""
    value = seen.value or b""
    if kind_of(seen) == "source":
        text = value.decode("utf-8", "replace")
        return {"raw_size": len(value), "raw_head": text[:2000]}
    try:
        schema, record = AnyAvroDecoder(
            cfg.kafka.schema_registry_url, cfg.kafka.schema_registry
        ).decode(value)
    except DataError as exc:
        return {"undecodable": str(exc), "value_head": value[:200].decode("utf-8", "replace")}
    return {"schema": schema, "record": record}


def _json(value: Any) -> str:
    def default(v: Any) -> Any:
        if isinstance(v, dt.datetime):
            return v.isoformat()
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        return str(v)

    return json.dumps(value, default=default, indent=2, ensure_ascii=False)


def filters(func: Any) -> Any:
    for option in reversed(
        [
            click.option("--topic", help="DLQ topic (default: kafka.topics.dlq)."),
            click.option("--error-class", "error_class_", help="Only this error class/kind."),
            click.option("--since", help="Only records written at or after this ISO time."),
            click.option("--until", help="Only records written at or before this ISO time."),
            click.option("--key", help="Only records with this key (the command id)."),
        ]
    ):
        func = option(func)
    return config_option(func)


@click.group()
def dlq() -> None:
    """List, show, replay and drop dead letters."""


@dlq.command("list")
@filters
@click.option("--all", "include_dropped", is_flag=True, help="Include dropped records.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines.")
def list_(config_path: str, topic: str | None, as_json: bool, **kw: Any) -> None:
    """One line per dead letter."""
    cfg = load_config(config_path)
    for seen, note in select(cfg.kafka, topic or cfg.kafka.topics.dlq, **kw):
        row = summary(seen, note)
        if as_json:
            click.echo(json.dumps(row, ensure_ascii=False))
        else:
            where = row["mailbox"] or row["original_topic"] or "-"
            flag = " DROPPED" if note else ""
            click.echo(
                f"{row['id']}  {row['at']}  {row['kind']}  {row['key']}  {row['error_class']}  "
                f"{where}  {row['reason'][:120]}{flag}"
            )


@dlq.command()
@config_option
@click.option("--topic", help="DLQ topic (default: kafka.topics.dlq).")
@click.argument("record")
def show(config_path: str, topic: str | None, record: str) -> None:
    """Headers and decoded value of RECORD (PARTITION:OFFSET)."""
    cfg = load_config(config_path)
    try:
        seen, note = find_record(cfg.kafka, topic or cfg.kafka.topics.dlq, record)
    except ActionError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(_json(details(cfg, seen, note)))


def details(cfg: MailtapConfig, seen: Seen, note: Any) -> dict[str, Any]:
    """Everything ``dlq show`` says about one record: summary, headers, decoded value."""
    return {
        **summary(seen, note),
        "headers": {k: v.decode("utf-8", "replace") for k, v in seen.headers},
        "value": decoded(cfg, seen),
    }


def delivered_ids(kafka: KafkaSettings) -> set[str]:
    """Command ids with a SENT outcome on mail.delivery."""
    decoder = AnyAvroDecoder(kafka.schema_registry_url, kafka.schema_registry)
    sent = set()
    for seen in scan(kafka, kafka.topics.delivery):
        if seen.value is None:
            continue
        try:
            _, event = decoder.decode(seen.value, kafka.topics.delivery)
        except DataError:
            continue
        if event.get("status") == "SENT":
            sent.add(str(event["command_id"]))
    return sent


def home_partition(seen: Seen) -> int:
    """The partition the command was dead-lettered from (-1: let the partitioner choose).

    The sink keeps a command's state on the partition number of the command (co-partitioned
    topics, connectors.smtp.state): the tombstone and the replayed command go back to that
    number, whichever partitioner wrote the command first.
    """
    partition = seen.header(ERROR_PREFIX + "partition")
    return int(partition) if partition and partition.isdigit() else -1


@dataclass
class ReplayPlan:
    """What a replay of some DLQ records would do: the commands it sends, and why it skips
    the others (``(record id, reason)``)."""

    chosen: list[Seen] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def plan_replay(kafka: KafkaSettings, candidates: Iterable[Seen]) -> ReplayPlan:
    """Which of ``candidates`` a replay re-sends: commands without a SENT outcome, each id once;
    source dead letters hold a mail, not a command, and are never replayed."""
    sent = delivered_ids(kafka)
    plan = ReplayPlan()
    chosen_keys: set[str] = set()
    for seen in candidates:
        key = (seen.key or b"").decode("utf-8", "replace")
        if kind_of(seen) == "source":
            plan.skipped.append((record_id(seen), "a source dead letter (re-sync the mailbox)"))
        elif key in sent:
            plan.skipped.append((record_id(seen), f"command {key} already SENT"))
        elif key in chosen_keys:
            plan.skipped.append((record_id(seen), f"command {key} already chosen"))
        else:
            chosen_keys.add(key)
            plan.chosen.append(seen)
    return plan


def replay_records(cfg: MailtapConfig, chosen: Iterable[Seen], *, reset_state: bool) -> int:
    """Re-send the original bytes of ``chosen`` (from :func:`plan_replay`) to the commands topic,
    on the partition they were dead-lettered from, without the error and retry headers; with
    ``reset_state`` first a tombstone for each id on the sink's state topic. Returns the count.

    Raises :class:`NotAcknowledged` when Kafka does not confirm the writes (run it again: a
    command id is sent at most once by the sink).
    """
    kafka = cfg.kafka
    records = list(chosen)
    producer = Producer(producer_config(kafka))
    if reset_state:
        for seen in records:
            producer.produce(
                sink_state_topic(cfg), key=seen.key, value=None, partition=home_partition(seen)
            )
        if producer.flush(30):
            raise NotAcknowledged("the state tombstones were not acknowledged; nothing sent")
    for seen in records:
        headers: list[tuple[str, str | bytes | None]] = [
            (k, v)
            for k, v in seen.headers
            if not k.startswith(ERROR_PREFIX) and k not in RETRY_HEADERS
        ]
        producer.produce(
            kafka.topics.commands,
            key=seen.key,
            value=seen.value,
            headers=headers,
            partition=home_partition(seen),
        )
    if producer.flush(30):
        raise NotAcknowledged("some replayed commands were not acknowledged; run it again")
    return len(records)


@dlq.command()
@filters
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; send nothing.")
@click.option(
    "--reset-state",
    is_flag=True,
    help="Also forget the sink's DONE state of each replayed command (needed for given-up "
    "commands; the sink reads it at start and on rebalance).",
)
def replay(
    config_path: str, topic: str | None, dry_run: bool, reset_state: bool, **kw: Any
) -> None:
    """Re-send dead-lettered commands to the commands topic."""
    cfg = load_config(config_path)
    kafka = cfg.kafka
    plan = plan_replay(kafka, (seen for seen, _ in select(kafka, topic or kafka.topics.dlq, **kw)))
    for rid, why in plan.skipped:
        click.echo(f"{rid} skipped: {why}")
    for seen in plan.chosen:
        click.echo(f"{record_id(seen)} {'would replay' if dry_run else 'replaying'} {seen.key!r}")
    if dry_run or not plan.chosen:
        click.echo(f"{len(plan.chosen)} to replay{' (dry run)' if dry_run else ''}")
        return
    try:
        count = replay_records(cfg, plan.chosen, reset_state=reset_state)
    except ActionError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{count} replayed to {kafka.topics.commands}")


def drop_records(
    cfg: MailtapConfig, dlq_topic: str, chosen: Iterable[Seen], *, reason: str, by: str
) -> str:
    """Mark ``chosen`` as handled: a note (when, who, why) per record on ``<dlq>.dropped``
    (created when missing). Returns that topic's name; raises :class:`NotAcknowledged`."""
    target = dropped_topic(dlq_topic)
    admin = admin_client(cfg.kafka)  # held: its futures fail if it is collected first
    futures = admin.create_topics(
        [NewTopic(target, 1, cfg.kafka.replication_factor, config=COMPACTED)]
    )
    for future in futures.values():
        try:
            future.result(timeout=30)
        except Exception as exc:  # already there is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    producer = Producer(producer_config(cfg.kafka))
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for seen in chosen:
        note = {"dropped_at": now, "reason": reason, "by": by, "key": (seen.key or b"").decode()}
        producer.produce(target, key=record_id(seen).encode(), value=json.dumps(note).encode())
    if producer.flush(30):
        raise NotAcknowledged("the drops were not acknowledged; run it again")
    return target


def find_record(kafka: KafkaSettings, dlq_topic: str, record: str) -> tuple[Seen, Any]:
    """The DLQ record ``PARTITION:OFFSET`` with its drop note; :class:`UnknownTarget` if none."""
    for seen, note in select(kafka, dlq_topic, include_dropped=True):
        if record_id(seen) == record:
            return seen, note
    raise UnknownTarget(f"no record {record} on {dlq_topic}")


@dlq.command()
@filters
@click.option("--dry-run", is_flag=True, help="Say what would be dropped; write nothing.")
@click.option("--reason", default="", help="Why (stored with the drop).")
def drop(config_path: str, topic: str | None, dry_run: bool, reason: str, **kw: Any) -> None:
    """Mark dead letters as handled (they stay on the topic until retention)."""
    cfg = load_config(config_path)
    dlq_topic = topic or cfg.kafka.topics.dlq
    if not any(kw.values()) and not dry_run:
        raise click.ClickException("drop needs a filter (--key, --error-class, --since/--until)")
    chosen = [seen for seen, _ in select(cfg.kafka, dlq_topic, **kw)]
    for seen in chosen:
        click.echo(f"{record_id(seen)} {'would drop' if dry_run else 'dropping'} {seen.key!r}")
    if dry_run or not chosen:
        click.echo(f"{len(chosen)} to drop{' (dry run)' if dry_run else ''}")
        return
    try:
        target = drop_records(cfg, dlq_topic, chosen, reason=reason, by=f"cli:{getpass.getuser()}")
    except ActionError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{len(chosen)} dropped (recorded on {target})")
