"""``mailtap run <component> -c CONFIG``: one long-running component per process (one container each).

A configuration or connection error ends the process with one sentence that says what to change,
never a traceback; with ``--log-format json`` that sentence is a JSON log line like every other
line the component writes (a log pipeline reads stderr whole).
"""

from __future__ import annotations

import logging
from typing import NoReturn

import click
from confluent_kafka import KafkaException

from connectors.core.errors import ConfigError
from connectors.core.kafka.errors import StopRequested
from mailtap import logs
from mailtap.cli import import_optional
from mailtap.commands.common import config_option

log = logging.getLogger(__name__)

#: component -> "module:function(config_path)"
COMPONENTS = {
    "imap-source": "mailtap.commands.imap:run_imap_source",
    "ews-source": "mailtap.commands.ews:run_ews_source",
    "graph-source": "mailtap.commands.graph:run_graph_source",
    "smtp-sink": "mailtap.commands.smtp:run_smtp_sink",
    "streams": "mailtap.commands.streams:run_streams",
    "console": "mailtap.console.server:run_console",
}


def _fail(component: str, message: str) -> NoReturn:
    if logs.current_format() == "json":
        log.error("%s: %s", component, message, extra={"component": component})
        raise SystemExit(1)
    raise click.ClickException(message)


@click.command()
@click.argument("component", type=click.Choice(sorted(COMPONENTS)))
@config_option
def run(component: str, config_path: str) -> None:
    """Run COMPONENT until interrupted (SIGTERM/SIGINT stop it cleanly)."""
    module_name, func_name = COMPONENTS[component].split(":")
    runner = getattr(import_optional(module_name), func_name)
    try:
        runner(config_path)
    except ConfigError as exc:
        _fail(component, str(exc))
    except StopRequested:
        # SIGTERM/SIGINT while waiting for Kafka: nothing was written; the next start begins anew.
        log.warning(
            "%s: stopped while waiting for Kafka; nothing was written",
            component,
            extra={"component": component},
        )
    except KafkaException as exc:
        _fail(component, f"Kafka error: {exc.args[0].str()}")
