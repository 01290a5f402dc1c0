"""The ``mailtap`` command. Subcommands load lazily so ``mailtap --help`` stays fast and a missing
optional extra only breaks the command that needs it (with an actionable message)."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import threading
from typing import Any

import click

from mailtap import logs
from mailtap.logs import LogFormat

#: name -> "module:attribute" of a click command or group.
COMMANDS: dict[str, tuple[str, str]] = {
    "dev": (
        "mailtap.commands.dev:dev",
        "Start, inspect and stop the local Kafka, Dovecot and SMTP.",
    ),
    "topics": ("mailtap.commands.topics:topics", "Create and check mailtap's Kafka topics."),
    "acls": (
        "mailtap.commands.acls:acls",
        "The Kafka ACLs a component needs with this config (kafka-acls lines or JSON).",
    ),
    "consume": (
        "mailtap.commands.consume:consume",
        "Print decoded events of a topic as JSON lines.",
    ),
    "run": ("mailtap.commands.run:run", "Run a connector or the streams worker."),
    "bench": ("mailtap.commands.bench:bench", "Benchmarks against the local services."),
    "demo": ("mailtap.commands.demo:demo", "The whole pipeline on the local services."),
    "blob": (
        "mailtap.commands.blob:blob",
        "Fetch a claim-check blob an event refers to, checked against its sha256.",
    ),
    "config": (
        "mailtap.commands.config:config",
        "Check a config file; print the reference of every key.",
    ),
    "status": (
        "mailtap.commands.status:status",
        "Mailboxes, lag, deliveries and health, read from Kafka.",
    ),
    "dlq": ("mailtap.commands.dlq:dlq", "List, show, replay and drop dead letters."),
    "trace": (
        "mailtap.commands.trace:trace",
        "One mail's events, workflow steps, commands and deliveries, in time order.",
    ),
    "mailboxes": (
        "mailtap.commands.mailboxes:mailboxes",
        "Add or remove mailbox folders of running sources; list them and their owners.",
    ),
    "soak": (
        "mailtap.commands.soak:soak",
        "The fleet under random faults for N minutes, judged by an independent verifier.",
    ),
    "suppressions": (
        "mailtap.commands.suppressions:suppressions",
        "List, add and remove addresses on the suppression list.",
    ),
}

#: Which extra provides what a command imports, for the error message.
EXTRAS = {
    "imapclient": "imap",
    "exchangelib": "ews",
    "msal": "graph",
    "httpx2": "graph",
    "aiosmtplib": "smtp",
    "flufl": "smtp",
    "faust": "streams",
    "authres": "streams",
    "dkim": "streams",
    "fastapi": "console",
    "starlette": "console",
    "uvicorn": "console",
    "jinja2": "console",
    "playwright": "dev",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        target, _ = COMMANDS[cmd_name]
        module_name, attr = target.split(":")
        module = import_optional(module_name)
        command: click.Command = getattr(module, attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def import_optional(module_name: str) -> Any:
    """Import a module; a missing optional dependency becomes a sentence naming the extra."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        extra = EXTRAS.get(top)
        if extra:
            raise click.ClickException(
                f"'{top}' is not installed; install mailtap with the '{extra}' extra: "
                f"pip install 'mailtap[{extra}]'"
            ) from exc
        raise


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    envvar="MAILTAP_LOG_FORMAT",
    help="json: one JSON object per line, with each record's fields (MAILTAP_LOG_FORMAT).",
)
def main(verbose: int, log_format: LogFormat) -> None:
    """mailtap: mail as a reliable Kafka event interface."""
    # SIGTERM ends a command like Ctrl-C does, through its `finally` blocks: the demo and the
    # benchmarks then stop the components and services they started instead of orphaning them.
    # Long-running components install their own handlers for a graceful stop.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    level = getattr(logging, os.environ.get("MAILTAP_LOG_LEVEL", ""), level)
    logs.configure(level, log_format)
    threading.excepthook = logs.log_thread_exception


if __name__ == "__main__":  # pragma: no cover
    main()
