"""``mailtap trace QUERY -c CONFIG [--json] [--since T]``: one mail's way through mailtap.

The lookup is :mod:`mailtap.trace`; this module only prints it.

    mailtap trace '<abc@example.com>' -c mailtap.yaml     # by Message-ID
    mailtap trace '#K7QJ2M4X' -c mailtap.yaml             # by ticket number
    mailtap trace 3f0c9a1e... -c mailtap.yaml --json      # by command id, as JSON
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click
from confluent_kafka import KafkaException

from connectors.core.config import load_config
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import unreachable
from mailtap.commands.common import config_option
from mailtap.trace import trace as find_trace
from mailtap.trace import trace_topics


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot show {type(value).__name__}")


@click.command("trace")
@click.argument("query")
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the match and its steps.")
@click.option(
    "--since",
    default=None,
    help="Read the topics from this ISO time (e.g. 2026-12-01T00:00:00Z), not from their start.",
)
def trace(query: str, config_path: str, as_json: bool, since: str | None) -> None:
    """Show the mail QUERY names — a Message-ID, a mail key, a ticket or approval number, or a
    command id — with its workflow events, commands and delivery events, in time order.

    Exits 1 when nothing on the topics matches QUERY.
    """
    try:
        when = dt.datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None
    except ValueError:
        raise click.BadParameter(f"{since!r} is not an ISO time", param_hint="--since") from None
    try:
        cfg = load_config(config_path)
        result = find_trace(cfg.kafka, query, since=when)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except KafkaException as exc:
        raise click.ClickException(unreachable(cfg.kafka, exc.args[0].str())) from None
    if as_json:
        click.echo(json.dumps(result.as_json(), default=_default, ensure_ascii=False))
    else:
        for step in result.steps:
            click.echo(step.line())
        if result.matched_by:
            click.echo(f"-> {result.verdict} (matched {result.matched_by})")
    if result.matched_by is None:
        topics = ", ".join(trace_topics(cfg.kafka.topics))
        raise click.ClickException(
            f"nothing on {topics} matches {query!r} (looked for a command id, a mail key, a "
            f"Message-ID and a ticket or approval number)"
        )
