"""``mailtap bench <name> [--json]``: benchmarks that print their figures (never assertions).

Each benchmark measures its own baseline in the same run and prints the ratio, because these
machines are shared and noisy: absolute numbers are not comparable between runs, ratios are.
"""

from __future__ import annotations

import json
from typing import Any

import click

from mailtap.cli import import_optional
from mailtap.dev.imapservers import KINDS

#: ``bench parse`` works in batches of 200 mails, as the source does.
BATCH_MIN = 200


def _emit(figures: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True, default=str))


@click.group()
def bench() -> None:
    """Benchmarks against the local services (started when none are running)."""


@bench.command("ingest")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--mails", type=int, default=20_000, show_default=True, help="Backfill size.")
@click.option(
    "--rounds", type=click.IntRange(1), default=3, show_default=True, help="Median of rounds."
)
@click.option(
    "--warm-up",
    "warm_up",
    type=click.FloatRange(0),
    default=45.0,
    show_default=True,
    help="Seconds of produce that warm the broker's JIT up first (0: none).",
)
@click.option(
    "--imap-server",
    "imap_server",
    type=click.Choice(KINDS),
    default="dovecot",
    show_default=True,
    help="The IMAP server of the dev stack to read from (started next to the running Kafka).",
)
@click.option(
    "--secure",
    type=click.Choice(["scram", "mtls", "oauthbearer"]),
    default=None,
    help="Also ingest over this secured listener of the same broker (SASL_SSL SCRAM-SHA-512, "
    "mTLS, SASL_SSL OAUTHBEARER) and print its rate / the PLAINTEXT rate.",
)
def ingest(
    as_json: bool, mails: int, rounds: int, warm_up: float, imap_server: str, secure: str | None
) -> None:
    """IMAP -> Kafka: raw FETCH rate vs exactly-once ingest, new-mail latency, peak RSS."""
    if secure is not None:
        figures = import_optional("mailtap.bench.tls_cost").bench_tls_cost(
            as_json, mails, rounds, warm_up, imap_server, secure
        )
    else:
        figures = import_optional("mailtap.bench.ingest").bench_ingest(
            json_out=as_json,
            mails=mails,
            rounds=rounds,
            warm_up_s=warm_up,
            imap_server=imap_server,
        )
    _emit(figures, as_json)


@bench.command("sink")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
def sink(as_json: bool) -> None:
    """mail.commands -> SMTP -> SENT events, vs raw aiosmtplib on one connection."""
    module = import_optional("mailtap.bench.sink")
    _emit(module.bench_sink(json_out=as_json), as_json)


@bench.command("streams")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option(
    "--events",
    type=click.IntRange(1),
    default=20_000,
    show_default=True,
    help="MailEvents pre-filled on each run's topic.",
)
@click.option(
    "--workers",
    default="1,2,3",
    show_default=True,
    help="Worker counts to run, comma-separated (each on its own topic of 6 partitions).",
)
def streams(as_json: bool, events: int, workers: str) -> None:
    """mail.events -> streams workers -> mail.commands/mail.workflow, vs a bare aiokafka loop.

    Each run pre-fills a fresh 6-partition events topic (tickets, approval requests and
    auto-replies the guards skip), runs a bare aiokafka consume -> produce loop over it, then
    starts that many `mailtap run streams` workers with the demo's workflows. events/s is
    counted by an independent read_committed consumer from record timestamps: from the first
    event consumed (a worker's first record re-keyed onto its conversation topic) to the last
    command or workflow record; it checks that every event was answered. Prints the ratio to
    the bare loop of the same run and the scaling over the worker counts.
    """
    try:
        counts = tuple(int(n) for n in workers.split(","))
    except ValueError:
        raise click.BadParameter("expected counts like 1,2,3", param_hint="--workers") from None
    if not counts or min(counts) < 1:
        raise click.BadParameter("expected counts of at least 1", param_hint="--workers")
    module = import_optional("mailtap.bench.streams")
    _emit(module.bench_streams(json_out=as_json, events=events, workers=counts), as_json)


@bench.command("e2e")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--mails", type=int, default=200, show_default=True)
def e2e(as_json: bool, mails: int) -> None:
    """APPEND into Dovecot -> reply received by the SMTP server: p50/p99 latency."""
    module = import_optional("mailtap.bench.e2e")
    _emit(module.bench_e2e(json_out=as_json, mails=mails), as_json)


@bench.command("coldstart")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
def coldstart(as_json: bool, rounds: int) -> None:
    """`dev up` on a fresh state dir -> the registry accepts the components' first registrations."""
    module = import_optional("mailtap.bench.coldstart")
    _emit(module.bench_coldstart(rounds=rounds), as_json)


@bench.command("reconnect")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--mails", type=int, default=50_000, show_default=True, help="Mails in the folder.")
@click.option(
    "--expunged", type=int, default=100, show_default=True, help="Mails expunged (and flagged)."
)
@click.option("--rounds", type=click.IntRange(1), default=5, show_default=True)
def reconnect(as_json: bool, mails: int, expunged: int, rounds: int) -> None:
    """A reconnect's expunge check: listing the folder vs QRESYNC's VANISHED (time, bytes)."""
    module = import_optional("mailtap.bench.reconnect")
    _emit(
        module.bench_reconnect(json_out=as_json, mails=mails, expunged=expunged, rounds=rounds),
        as_json,
    )


@bench.command("flag-listing")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--mails", type=click.IntRange(1), default=10_000, show_default=True)
def flag_listing(as_json: bool, mails: int) -> None:
    """Flag changes without CONDSTORE: bytes, time and memory of one FLAGS listing."""
    module = import_optional("mailtap.bench.flaglisting")
    _emit(module.bench_flag_listing(mails=mails), as_json)


@bench.command("parse")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--mails", type=click.IntRange(BATCH_MIN), default=6000, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=5, show_default=True)
@click.option(
    "--profile",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Also print cProfile's N costliest functions of one more pass.",
)
def parse(as_json: bool, mails: int, rounds: int, profile: int) -> None:
    """IMAP parse processes' job per mail, in this process, against the stdlib's parse."""
    module = import_optional("mailtap.bench.parse")
    _emit(module.bench_parse(mails=mails, rounds=rounds, profile=profile), as_json)


@bench.command("changes")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--imap-server", "imap_server", type=click.Choice(KINDS), default="dovecot")
@click.option("--samples", type=click.IntRange(1), default=3, show_default=True)
def changes(as_json: bool, imap_server: str, samples: int) -> None:
    """New mail, flag change, expunge -> Kafka latency with the source's default timing."""
    module = import_optional("mailtap.bench.changes")
    _emit(module.bench_changes(imap_server=imap_server, samples=samples), as_json)


@bench.command("graph")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--messages", type=click.IntRange(1), default=2000, show_default=True)
@click.option("--samples", type=click.IntRange(1), default=50, show_default=True)
@click.option("--idle", type=click.IntRange(1), default=20, show_default=True)
def graph(as_json: bool, messages: int, samples: int, idle: int) -> None:
    """Graph source: ingest vs raw delta paging, webhook notification -> event latency, RSS per
    idle mailbox (against tests/graph_server: run from a source checkout)."""
    module = import_optional("mailtap.bench.graph")
    _emit(module.bench_graph(messages=messages, samples=samples, idle=idle), as_json)


@bench.command("startup")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option(
    "--other-events",
    type=click.IntRange(0),
    default=1_000_000,
    show_default=True,
    help="Events of other accounts put on mail.events first.",
)
@click.option("--other-accounts", type=click.IntRange(1), default=1000, show_default=True)
@click.option(
    "--rounds", type=click.IntRange(1), default=3, show_default=True, help="Restarts of each kind."
)
def startup(as_json: bool, other_events: int, other_accounts: int, rounds: int) -> None:
    """IMAP source: process start -> first FETCH, key index from its changelog vs mail.events."""
    module = import_optional("mailtap.bench.startup")
    figures = module.bench_startup(
        json_out=as_json, other_events=other_events, other_accounts=other_accounts, rounds=rounds
    )
    _emit(figures, as_json)


@bench.command("scale")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option(
    "--mailboxes", type=click.IntRange(2), default=200, show_default=True, help="M accounts."
)
@click.option(
    "--instances",
    default="1,2,3",
    show_default=True,
    help="Instance counts to run, comma-separated (1 gives the RSS, >= 2 the failover).",
)
@click.option("--mails", type=click.IntRange(1), default=3, show_default=True, help="Per mailbox.")
@click.option(
    "--session-timeout",
    type=click.FloatRange(6.0),
    default=10.0,
    show_default=True,
    help="imap.group.session_timeout_seconds of the instances.",
)
@click.option(
    "--with-startup",
    is_flag=True,
    help="Also run `mailtap bench startup` (1,000,000 events of other accounts; minutes).",
)
@click.option(
    "--registry/--no-registry",
    default=True,
    show_default=True,
    help="Write through the dev stack's schema registry (the default configuration) or not.",
)
def scale(
    as_json: bool,
    mailboxes: int,
    instances: str,
    mails: int,
    session_timeout: float,
    with_startup: bool,
    registry: bool,
) -> None:
    """M mailboxes over 1, 2, 3 source instances: first event, events/s, RSS, failover."""
    try:
        counts = tuple(int(n) for n in instances.split(","))
    except ValueError:
        raise click.BadParameter("expected counts like 1,2,3", param_hint="--instances") from None
    if not counts or min(counts) < 1:
        raise click.BadParameter("expected counts of at least 1", param_hint="--instances")
    module = import_optional("mailtap.bench.scale")
    figures = module.bench_scale(
        json_out=as_json,
        mailboxes=mailboxes,
        instances=counts,
        mails=mails,
        session_timeout=session_timeout,
        with_startup=with_startup,
        registry=registry,
    )
    _emit(figures, as_json)


@bench.command("console")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on the last line.")
@click.option("--mailboxes", type=click.IntRange(1), default=1000, show_default=True)
@click.option("--dead-letters", type=click.IntRange(0), default=10_000, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=5, show_default=True)
def console(as_json: bool, mailboxes: int, dead_letters: int, rounds: int) -> None:
    """The console page's first paint in Chromium with many mailboxes and dead letters."""
    module = import_optional("mailtap.bench.console")
    figures = module.bench_console(
        json_out=as_json, mailboxes=mailboxes, dead_letters=dead_letters, rounds=rounds
    )
    _emit(figures, as_json)
