"""``mailtap suppressions list|add|remove``: the suppression list on ``kafka.topics.suppressions``.

The list is a compacted topic (key = normalized address, value = an Avro ``Suppression``, a
tombstone removes), see :mod:`connectors.smtp.suppression`. ``add`` and ``remove`` write one record;
a running SMTP sink follows the topic and honours the change within a second or so, without a
restart. ``list`` reads the topic to its current end.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
from typing import Any

import click
from confluent_kafka import Producer

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, load_config
from connectors.core.errors import DataError
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.topics import COMPACTED, TopicSpec, ensure_topic_specs
from connectors.smtp.errors import AddressError
from connectors.smtp.suppression import REASONS, normalize, record
from mailtap.commands.common import config_option
from mailtap.commands.errors import ActionError, InvalidInput, NotAcknowledged
from mailtap.commands.topicscan import scan


def read_list(kafka: KafkaSettings) -> dict[str, dict[str, Any]]:
    """Every address's newest record (removed ones left out)."""
    serde = AvroSerde.for_schema("Suppression", kafka)
    topic = kafka.topics.suppressions
    entries: dict[str, dict[str, Any]] = {}
    for seen in scan(kafka, topic):
        if seen.key is None:
            continue
        key = seen.key.decode("utf-8", "replace")
        if seen.value is None:
            entries.pop(key, None)
            continue
        try:
            entries[key] = serde.decode(seen.value, topic)
        except DataError as exc:
            click.echo(
                f"skipping undecodable record {seen.partition}:{seen.offset}: {exc}", err=True
            )
    return entries


def _write(kafka: KafkaSettings, key: str, value: dict[str, Any] | None) -> None:
    topic = kafka.topics.suppressions
    ensure_topic_specs(kafka, [TopicSpec(topic, kafka.partitions, COMPACTED)])
    producer = Producer(producer_config(kafka))
    encoded = (
        None if value is None else AvroSerde.for_schema("Suppression", kafka).encode(value, topic)
    )
    producer.produce(topic, key=key.encode("utf-8"), value=encoded)
    if producer.flush(30):
        raise NotAcknowledged(f"{topic} did not acknowledge the record; run it again")


def suppression_key(address: str) -> str:
    """The normalized address (the record key); :class:`InvalidInput` when it is not one."""
    try:
        return normalize(address)
    except AddressError as exc:
        raise InvalidInput(str(exc)) from None


def add_suppression(
    kafka: KafkaSettings, address: str, *, reason: str, note: str | None, by: str
) -> str:
    """Suppress ``address`` (``reason`` one of :data:`REASONS`); returns its key."""
    if reason.upper() not in REASONS:
        raise InvalidInput(f"unknown reason {reason!r}; expected one of {', '.join(REASONS)}")
    key = suppression_key(address)
    value = record(
        address, reason=reason.upper(), now=dt.datetime.now(dt.UTC), detail=note, source=by
    )
    _write(kafka, key, value)
    return key


def remove_suppression(kafka: KafkaSettings, address: str) -> tuple[str, bool]:
    """Send to ``address`` again; returns its key and whether it was suppressed."""
    key = suppression_key(address)
    was = read_list(kafka).get(key)
    _write(kafka, key, None)
    return key, bool(was and was.get("suppressed"))


@click.group()
def suppressions() -> None:
    """List, add and remove suppressed addresses."""


@suppressions.command("list")
@config_option
@click.option(
    "--all", "show_all", is_flag=True, help="Also addresses that only count soft bounces."
)
@click.option("--json", "as_json", is_flag=True, help="JSON lines.")
def list_(config_path: str, show_all: bool, as_json: bool) -> None:
    """One line per suppressed address: address, reason, when, by whom, detail."""
    cfg = load_config(config_path)
    for key, entry in sorted(read_list(cfg.kafka).items()):
        if not entry.get("suppressed") and not show_all:
            continue
        if as_json:
            click.echo(json.dumps({"key": key, **entry}, default=str, ensure_ascii=False))
            continue
        when = entry["updated_at"].isoformat(timespec="seconds")
        reason = entry.get("reason") or f"not suppressed ({len(entry['soft_bounces'])} soft)"
        click.echo(
            f"{key}  {reason}  {when}  {entry.get('source') or '-'}  {entry.get('detail') or ''}"
        )


@suppressions.command()
@config_option
@click.argument("address")
@click.option(
    "--reason",
    type=click.Choice(REASONS, case_sensitive=False),
    default="MANUAL",
    show_default=True,
    help="Why (MANUAL for a person's decision).",
)
@click.option("--note", help="Free text kept in the record's detail.")
def add(config_path: str, address: str, reason: str, note: str | None) -> None:
    """Stop sending to ADDRESS."""
    cfg = load_config(config_path)
    try:
        key = add_suppression(
            cfg.kafka, address, reason=reason, note=note, by=f"cli:{getpass.getuser()}"
        )
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from None
    except ActionError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"suppressed {key} ({reason.upper()})")


@suppressions.command()
@config_option
@click.argument("address")
def remove(config_path: str, address: str) -> None:
    """Send to ADDRESS again (its soft-bounce count is forgotten too)."""
    cfg = load_config(config_path)
    try:
        key, was = remove_suppression(cfg.kafka, address)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="ADDRESS") from None
    except ActionError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"removed {key} ({'was suppressed' if was else 'was not suppressed'})")
