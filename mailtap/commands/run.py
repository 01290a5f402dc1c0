"""``mailtap run <component> -c CONFIG``: one long-running component per process (one container each)."""

from __future__ import annotations

import click

from connectors.core.errors import ConfigError
from mailtap.cli import import_optional
from mailtap.commands.common import config_option

#: component -> "module:function(config_path)"
COMPONENTS = {
    "imap-source": "mailtap.commands.imap:run_imap_source",
    "ews-source": "mailtap.commands.ews:run_ews_source",
    "smtp-sink": "mailtap.commands.smtp:run_smtp_sink",
    "streams": "mailtap.commands.streams:run_streams",
}


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
        raise click.ClickException(str(exc)) from None
