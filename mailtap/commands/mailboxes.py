"""``mailtap mailboxes add|remove|reset|list|rewind|purge``: change the folders the sources
publish, at runtime; forget a mailbox's cursor or everything mailtap keeps of it.

Changes go to the compacted mailboxes topic (``connectors.core.source.ownership.catalog``); every running
source instance follows it within a second, no restart. The account must be defined in the
configuration (its credentials live there); a new account needs a configuration change and a
restart of the instances.

    mailtap mailboxes add imap support Archive -c mailtap.yaml
    mailtap mailboxes remove imap support INBOX -c mailtap.yaml
    mailtap mailboxes list -c mailtap.yaml        # with the owning instance when in a group
    mailtap mailboxes add --file mailboxes.yaml   # many at once: {imap: {ACCOUNT: [FOLDER]}}
    mailtap mailboxes rewind imap support INBOX   # after remove: forget the cursor
    mailtap mailboxes purge imap support INBOX    # after remove: keys, cursor, blobs
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml

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
from mailtap.mailbox_data import execute_purge, forget_cursor, plan_purge, require_stopped
from mailtap.trace import read_records

#: source kind -> (section, model path, placement)
SOURCES = {
    "imap": ("connectors.imap.config", "ImapSourceSettings", by_account),
    "ews": ("connectors.ews.config", "EwsSourceSettings", by_folder),
    "graph": ("connectors.graph.config", "GraphSourceSettings", by_account),
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


def check_mailbox(cfg: MailtapConfig, unit: WorkUnit) -> None:
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
    elif unit.source == "imap" and unit.folder == account.move_target:
        raise ConfigError(
            f"{unit.folder!r} is the after_commit move target of {unit.account}; it cannot "
            f"be published too"
        )


def _configured(cfg: MailtapConfig, unit: WorkUnit) -> bool:
    """Whether the configuration has the unit's account (so a source may still run it)."""
    if unit.source not in (cfg.model_extra or {}):
        return False
    return unit.account in {a.name for a in _settings(cfg, unit.source).accounts}


@click.group()
def mailboxes() -> None:
    """Add or remove mailbox folders of running sources; list them and their owners."""


def change_mailbox(cfg: MailtapConfig, unit: WorkUnit, state: str | None) -> None:
    """Add (``ADDED``), remove (``REMOVED``) or reset (None: the configuration decides) one
    mailbox of the running sources, after checking its account is configured
    (:class:`ConfigError` otherwise, nothing written)."""
    check_mailbox(cfg, unit)
    write_change(cfg.kafka, unit, state)


def rewind_mailbox(cfg: MailtapConfig, unit: WorkUnit) -> None:
    """Forget the cursor of a mailbox no source runs (:class:`ConfigError` while one does)."""
    check_mailbox(cfg, unit)
    require_stopped(cfg.kafka, unit)
    forget_cursor(cfg.kafka, unit)


def _change(config_path: str, source: str, account: str, folder: str, state: str | None) -> None:
    try:
        cfg = load_config(config_path)
        unit = WorkUnit(source, account, folder)
        change_mailbox(cfg, unit, state)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{state or 'reset to the configuration'}: {unit}")


_SOURCE = click.argument("source", type=click.Choice(sorted(SOURCES)))


@mailboxes.command("add")
@click.argument("source", type=click.Choice(sorted(SOURCES)), required=False)
@click.argument("account", required=False)
@click.argument("folder", required=False)
@click.option(
    "--file",
    "mailbox_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A YAML file of mailboxes to add at once: {imap: {ACCOUNT: [FOLDER, ...]}, ews: ...}.",
)
@config_option
def add(
    source: str | None,
    account: str | None,
    folder: str | None,
    mailbox_file: str | None,
    config_path: str,
) -> None:
    """Publish FOLDER of ACCOUNT (an account of the configuration) from now on.

    With --file, every mailbox the file lists; all are checked before any is added.
    """
    if mailbox_file is None:
        if not (source and account and folder):
            raise click.UsageError("give SOURCE ACCOUNT FOLDER, or --file FILE")
        _change(config_path, source, account, folder, ADDED)
        return
    if source or account or folder:
        raise click.UsageError("give either SOURCE ACCOUNT FOLDER or --file FILE, not both")
    try:
        cfg = load_config(config_path)
        units = read_mailbox_file(mailbox_file)
        for unit in units:
            check_mailbox(cfg, unit)
        for unit in units:
            write_change(cfg.kafka, unit, ADDED)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for unit in units:
        click.echo(f"{ADDED}: {unit}")


def read_mailbox_file(path: str) -> list[WorkUnit]:
    """``{imap: {support: [INBOX, Archive]}, ews: {...}}`` -> the mailboxes it lists, in order.

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "m.yaml"
    >>> _ = f.write_text("imap:\\n  support: [INBOX, Archive]\\n  sales: INBOX\\n")
    >>> [str(u) for u in read_mailbox_file(str(f))]
    ['imap/support/INBOX', 'imap/support/Archive', 'imap/sales/INBOX']
    """
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(document, dict) or not document:
        raise ConfigError(f"{path}: expected a mapping like {{imap: {{ACCOUNT: [FOLDER, ...]}}}}")
    units: list[WorkUnit] = []
    for source, accounts in document.items():
        if source not in SOURCES:
            raise ConfigError(f"{path}: unknown source {source!r}; expected {sorted(SOURCES)}")
        if not isinstance(accounts, dict):
            raise ConfigError(f"{path}: {source}: expected ACCOUNT: [FOLDER, ...] entries")
        for account, folders in accounts.items():
            names = [folders] if isinstance(folders, str) else folders
            if not isinstance(names, list) or not names:
                raise ConfigError(f"{path}: {source}.{account}: expected a list of folders")
            units += [WorkUnit(source, str(account), str(name)) for name in names]
    return units


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


@mailboxes.command("rewind")
@_SOURCE
@click.argument("account")
@click.argument("folder")
@config_option
def rewind(source: str, account: str, folder: str, config_path: str) -> None:
    """Forget the cursor of a removed FOLDER: when it runs again, it starts where the
    account's ``start:`` says (all: every mail again; the keys are the same, so nothing is
    duplicated downstream).

    Run `mailtap mailboxes remove` first and `mailtap mailboxes reset` (or add) after.
    """
    try:
        cfg = load_config(config_path)
        unit = WorkUnit(source, account, folder)
        rewind_mailbox(cfg, unit)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"cursor forgotten: {unit} (it starts as start: says when it runs again)")


@mailboxes.command("purge")
@_SOURCE
@click.argument("account")
@click.argument("folder")
@config_option
@click.option("--dry-run", is_flag=True, help="Only say what would be deleted.")
@click.option("--json", "as_json", is_flag=True, help="The plan (and the result) as JSON.")
def purge(
    source: str, account: str, folder: str, config_path: str, dry_run: bool, as_json: bool
) -> None:
    """Delete what mailtap keeps of a removed FOLDER: tombstones for its mails' keys on
    mail.events (and the IMAP key index), its cursor, and the claim-check blobs only its mails
    refer to.

    Run `mailtap mailboxes remove` first, or remove the account from the configuration
    (and SIGHUP the sources).
    """
    try:
        cfg = load_config(config_path)
        unit = WorkUnit(source, account, folder)
        if _configured(cfg, unit):  # else no source of this configuration runs it any more
            require_stopped(cfg.kafka, unit)
        events = read_records(cfg.kafka, [cfg.kafka.topics.events])
        plan = plan_purge(events, unit)
        deleted = [] if dry_run else execute_purge(cfg.kafka, cfg.claim_check, plan)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({**plan.as_json(), "dry_run": dry_run, "deleted_blobs": deleted}))
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{unit}: {verb} {len(plan.keys)} keys on {cfg.kafka.topics.events}, the cursor on "
        f"{cfg.kafka.topics.offsets} and {len(plan.blobs)} blobs; kept "
        f"{len(plan.shared_blobs)} blobs other mailboxes' mails refer to"
    )


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
