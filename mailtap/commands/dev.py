"""`mailtap dev up|status|down`: the local Kafka, Dovecot and SMTP services."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from mailtap.dev import DevServices, ServiceStartError, down, status, up
from mailtap.dev.imapservers import KINDS
from mailtap.dev.layout import DEFAULT_STATE_DIR
from mailtap.dev.secure import MECHANISMS, SecureKafka

_state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="Where the services keep their configuration, data, logs and pids.",
)


def _describe(info: DevServices) -> str:
    accounts = ", ".join(f"{a.username} / {a.password}" for a in info.imap.accounts)
    kafka_origin = "external" if info.kafka.external else f"pid {info.kafka.pid}"
    registry = (
        "none (MAILTAP_DEV_REGISTRY=off: single-object encoding)"
        if info.registry is None
        else f"{info.registry.url}  (pid {info.registry.pid}; log {info.registry.log_path})"
    )
    lines = [
        f"kafka   {info.kafka.bootstrap_servers}  ({kafka_origin}; log {info.kafka.log_path})",
        f"schema registry {registry}",
        f"imap    {info.imap.host}:{info.imap.port}  ({info.imap.kind}, pid {info.imap.pid}; "
        f"log {info.imap.log_path})",
        f"        accounts: {accounts}",
        f"smtp    {info.smtp.host}:{info.smtp.port}  (pid {info.smtp.pid}; "
        f"log {info.smtp.log_path})",
        f"        received mail: {info.smtp.received_dir}",
        f"config  {info.config_path}",
        f"state   {info.state_dir}",
    ]
    if info.secure is not None:
        lines += _describe_secure(info.secure)
    return "\n".join(lines)


def _describe_secure(secured: SecureKafka) -> list[str]:
    principals = ", ".join(f"{c}={p.name}" for c, p in secured.principals.items())
    return [
        "secured kafka (the one above is its PLAINTEXT admin listener, a super user):",
        f"  SASL_SSL SCRAM-SHA-512/256, PLAIN  {secured.sasl_bootstrap}",
        f"  SSL with client certificates      {secured.mtls_bootstrap}",
        f"  SASL_SSL OAUTHBEARER              {secured.oauth_bootstrap}",
        f"  CA {secured.ca_location}",
        f"  OAuth token endpoint {secured.token_url}, JWKS {secured.jwks_url} "
        f"(pid {secured.oauth_pid})",
        f"  denied operations: {secured.authorizer_log}",
        f"  principals: {principals}",
        f"  configs: {secured.folder}/<component>/<{'|'.join(MECHANISMS)}>.yaml",
    ]


def _emit(info: DevServices, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(info.to_json(), indent=2))
    else:
        click.echo(_describe(info))


@click.group("dev")
def dev() -> None:
    """Local real services (Kafka KRaft, a schema registry, Dovecot IMAP, a recording SMTP
    server)."""


@dev.command("up")
@click.option("--json", "as_json", is_flag=True, help="Print the connection details as JSON.")
@click.option(
    "--secure",
    is_flag=True,
    help="A broker secured like a company cluster: SASL_SSL (SCRAM, PLAIN), mTLS and OAUTHBEARER "
    "listeners, an authorizer without default access, one principal per component, and a "
    "config per component and mechanism under <state-dir>/secure/.",
)
@click.option(
    "--imap",
    "imap_kind",
    type=click.Choice(KINDS),
    default="dovecot",
    show_default=True,
    help="The IMAP server: Dovecot, Dovecot trimmed to IMAP4rev1 + UIDPLUS, Cyrus, Courier or "
    "GreenMail (connectors/imap/README.md, 'Servers').",
)
@_state_dir_option
def up_command(as_json: bool, secure: bool, imap_kind: str, state_dir: Path) -> None:
    """Start the services (a no-op when they already run) and write a mailtap config."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    try:
        info = up(state_dir, secure=secure, imap=imap_kind)
    except ServiceStartError as exc:
        raise click.ClickException(str(exc)) from exc
    _emit(info, as_json)


@dev.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the connection details as JSON.")
@_state_dir_option
def status_command(as_json: bool, state_dir: Path) -> None:
    """Show the running services; exit 1 when they are not (all) up."""
    info = status(state_dir)
    if info is None:
        if as_json:
            click.echo(json.dumps({"up": False, "state_dir": str(state_dir)}))
        else:
            click.echo(f"not running (state dir {state_dir})", err=True)
        sys.exit(1)
    _emit(info, as_json)


@dev.command("down")
@_state_dir_option
def down_command(state_dir: Path) -> None:
    """Stop exactly the processes `mailtap dev up` started."""
    stopped = down(state_dir)
    if stopped:
        click.echo(f"stopped {len(stopped)} service process group(s): {stopped}")
    else:
        click.echo("nothing was running")
