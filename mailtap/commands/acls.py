"""``mailtap acls -c CONFIG --component C``: the Kafka ACLs a component needs with this config.

Computed by :mod:`connectors.core.kafka.acls` from the topic names, group ids, retry tiers and
transactional-id prefixes of the config; nothing is asked of the broker. ``--format kafka-acls``
prints one ``kafka-acls.sh --add`` command line per binding, ``--format json`` a list.
``--grant`` creates them on the cluster instead, logged in as the config's Kafka login (a
principal allowed to create ACLs), and prints each binding it created.
"""

from __future__ import annotations

import json

import click

from connectors.core.config import load_config
from connectors.core.errors import ConfigError
from connectors.core.kafka.acls import COMPONENTS
from mailtap.aclgrant import grant
from mailtap.acls import component_acls
from mailtap.commands.common import config_option


@click.command()
@config_option
@click.option("--component", type=click.Choice(COMPONENTS), required=True)
@click.option(
    "--format",
    "output",
    type=click.Choice(["kafka-acls", "json"]),
    default="kafka-acls",
    show_default=True,
)
@click.option(
    "--principal",
    default=None,
    help="User principal to grant (default: kafka.sasl_username, else mailtap-<component>).",
)
@click.option(
    "--bootstrap-server",
    default="BOOTSTRAP",
    show_default=True,
    help="Put into the kafka-acls command lines (the admin's listener).",
)
@click.option(
    "--grant",
    "apply",
    is_flag=True,
    help="Create the ACLs on the cluster, logged in as the config's kafka login (an admin's).",
)
def acls(
    config_path: str,
    component: str,
    output: str,
    principal: str | None,
    bootstrap_server: str,
    apply: bool,
) -> None:
    """Print exactly the ACLs COMPONENT needs for this config (or create them: --grant)."""
    try:
        cfg = load_config(config_path)
        needed = component_acls(cfg, component)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    user = principal or cfg.kafka.sasl_username or f"mailtap-{component}"
    if apply:
        if principal is None:
            # The login is the admin's here: granting its own name would be a silent mistake.
            raise click.UsageError("--grant needs --principal: the user the ACLs are for")
        try:
            grant(cfg.kafka, user, needed)
        except ConfigError as exc:  # refused login, no right to create ACLs, no answer
            raise click.ClickException(str(exc)) from None
        for acl in needed:
            click.echo(f"granted User:{user}: {acl}")
        return
    if output == "json":
        click.echo(
            json.dumps(
                {"principal": f"User:{user}", "acls": [a.as_json() for a in needed]}, indent=2
            )
        )
        return
    for acl in needed:
        click.echo(acl.kafka_acls_command(user, bootstrap_server))
