"""``mailtap mailboxes add|remove|reset|list``: change the folders the sources publish, at runtime.

Changes go to the compacted mailboxes topic (``connectors.core.source.ownership.catalog``); every running
source instance follows it within a second, no restart. The account must be defined in the
configuration (its credentials live there); a new account needs a configuration change and a
restart of the instances.

    mailtap mailboxes add imap support Archive -c mailtap.yaml
    mailtap mailboxes remove imap support INBOX -c mailtap.yaml
    mailtap mailboxes list -c mailtap.yaml        # with the owning instance when in a group
"""

from __future__ import annotations

import json
from typing import Any

import click

from connectors.core.config import MailtapConfig, load_config
from connectors.core.errors import ConfigError
from connectors.core.source.ownership.catalog import (
    ADDED,
    REMOVED,
    MailboxCatalog,
    read_changes,
    write_change,
)
from connectors.core.source.ownership.group import (
    GroupSettings,
    Owner,
    WorkUnit,
    by_account,
    by_folder,
    describe_owners,
)
from mailtap.commands.common import config_option

#: source kind -> (section, model path, placement)
SOURCES = {
    "imap": ("connectors.imap.config", "ImapSourceSettings", by_account),
    "ews": ("connectors.ews.config", "EwsSourceSettings", by_folder),
}


def _settings(cfg: MailtapConfig, source: str) -> Any:
    module_name, model, _ = SOURCES[source]
    if source not in (cfg.model_extra or {}):
        raise ConfigError(
            f"the configuration has no {source!r} section; the mailboxes of a {source} source "
            f"are changed with the configuration its instances run with"
        )
    from mailtap.cli import import_optional

    return cfg.section(source, getattr(import_optional(module_name), model))


def _check(cfg: MailtapConfig, unit: WorkUnit) -> None:
    settings = _settings(cfg, unit.source)
    accounts = {a.name: a for a in settings.accounts}
    account = accounts.get(unit.account)
    if account is None:
        raise ConfigError(
            f"account {unit.account!r} is not in the {unit.source} section (defined: "
            f"{', '.join(sorted(accounts))}); add it there with its credentials first"
        )
    if unit.source == "ews":
        from connectors.ews.config import MAIL_FOLDERS

        if unit.folder not in MAIL_FOLDERS:
            raise ConfigError(
                f"unknown folder {unit.folder!r}; expected one of {sorted(MAIL_FOLDERS)}"
            )
    elif unit.folder == account.move_target:
        raise ConfigError(
            f"{unit.folder!r} is the after_commit move target of {unit.account}; it cannot "
            f"be published too"
        )


@click.group()
def mailboxes() -> None:
    """Add or remove mailbox folders of running sources; list them and their owners."""


def _change(config_path: str, source: str, account: str, folder: str, state: str | None) -> None:
    try:
        cfg = load_config(config_path)
        unit = WorkUnit(source, account, folder)
        _check(cfg, unit)
        write_change(cfg.kafka, unit, state)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{state or 'reset to the configuration'}: {unit}")


_SOURCE = click.argument("source", type=click.Choice(sorted(SOURCES)))


@mailboxes.command("add")
@_SOURCE
@click.argument("account")
@click.argument("folder")
@config_option
def add(source: str, account: str, folder: str, config_path: str) -> None:
    """Publish FOLDER of ACCOUNT (an account of the configuration) from now on."""
    _change(config_path, source, account, folder, ADDED)


@mailboxes.command("remove")
@_SOURCE
@click.argument("account")
@click.argument("folder")
@config_option
def remove(source: str, account: str, folder: str, config_path: str) -> None:
    """Stop publishing FOLDER of ACCOUNT, even when the configuration lists it."""
    _change(config_path, source, account, folder, REMOVED)


@mailboxes.command("reset")
@_SOURCE
@click.argument("account")
@click.argument("folder")
@config_option
def reset(source: str, account: str, folder: str, config_path: str) -> None:
    """Forget the runtime change of FOLDER: the configuration decides again."""
    _change(config_path, source, account, folder, None)


def mailbox_listing(cfg: MailtapConfig) -> list[dict[str, Any]]:
    """Every mailbox the sources of ``cfg`` want, with where it comes from and, for a source
    in a group, the member that owns it now (``owner`` None: nobody, e.g. mid-rebalance)."""
    changes = read_changes(cfg.kafka)
    rows: list[dict[str, Any]] = []
    present = cfg.model_extra or {}
    for source, (_, _, placement) in sorted(SOURCES.items()):
        if source not in present:
            continue
        settings = _settings(cfg, source)
        catalog = MailboxCatalog(source, {a.name: a.folders for a in settings.accounts})
        configured = catalog.wanted()
        for unit, state in changes.items():
            catalog.record(unit, state)
        wanted = catalog.wanted()
        group: GroupSettings | None = settings.group
        owners: dict[WorkUnit, Owner | None] = {}
        if group is not None and wanted:
            owners = describe_owners(cfg.kafka, group.id, group.topic(source), wanted, placement)
        for unit in sorted(wanted):
            owner = owners.get(unit)
            rows.append(
                {
                    "mailbox": str(unit),
                    "origin": "configuration" if unit in configured else "added",
                    "group": group.id if group else None,
                    "owner": owner.client_id if owner else None,
                }
            )
        for unit in sorted(configured - wanted):
            rows.append({"mailbox": str(unit), "origin": "removed", "group": None, "owner": None})
    return rows


@mailboxes.command("list")
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per mailbox.")
def list_(config_path: str, as_json: bool) -> None:
    """The mailboxes of the configuration's sources, runtime changes and owners included."""
    try:
        rows = mailbox_listing(load_config(config_path))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for row in rows:
        if as_json:
            click.echo(json.dumps(row, sort_keys=True))
            continue
        owner = f"  owner {row['owner']}" if row["owner"] else ""
        if row["group"] and not row["owner"]:
            owner = "  owner: none right now"
        click.echo(f"{row['mailbox']:50} {row['origin']:13}{owner}")
