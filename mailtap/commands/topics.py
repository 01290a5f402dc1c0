"""``mailtap topics ensure -c CONFIG``: create the topics of DESIGN.md, idempotently."""

from __future__ import annotations

import json

import click

from connectors.core.config import MailtapConfig, load_config
from connectors.core.errors import ConfigError
from connectors.core.kafka.topics import (
    TopicSpec,
    ensure_topic_specs,
    ensure_topics,
    topic_specs,
)
from mailtap.commands.common import config_option, retry_tiers_of


@click.group()
def topics() -> None:
    """Kafka topics used by mailtap."""


@topics.command("ensure")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def ensure(config_path: str, as_json: bool) -> None:
    """Create missing topics and align cleanup policies (compaction where DESIGN.md says so)."""
    try:
        cfg = load_config(config_path)
        tiers = retry_tiers_of(cfg)
        result = ensure_topics(cfg.kafka, tiers)
        extra = _connector_topics(cfg)
        if extra:
            result.update(ensure_topic_specs(cfg.kafka, extra))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    specs = {s.name: s for s in [*topic_specs(cfg.kafka, tiers), *extra]}
    for name, state in sorted(result.items()):
        policy = specs[name].config.get("cleanup.policy", "")
        click.echo(f"{state:8} {name} ({policy}, {specs[name].partitions} partitions)")


def _connector_topics(cfg: MailtapConfig) -> list[TopicSpec]:
    """Topics a configured connector creates itself (where its principal may not)."""
    if not cfg.has_section("imap"):
        return []
    from connectors.imap.indexlog import topic_spec  # the imap extra's modules, only then

    return [topic_spec(cfg.kafka)]
