"""``mailtap soak``: the fleet under seeded random faults for N minutes, judged by an
independent verifier (mailtap/soak/run.py). Exit status 0 only when there is no violation."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import click


@click.command()
@click.option("--minutes", type=click.FloatRange(0.5), default=60.0, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds workload and faults.")
@click.option(
    "--mailboxes", type=click.IntRange(1), default=100, show_default=True, help="IMAP accounts."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report as JSON before the verdict."
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write soak.json and soak.png (needs the 'soak' extra) here.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The run's services and logs (default .state/soak/<time>-seed<S>).",
)
@click.option(
    "--step-seconds",
    type=click.FloatRange(0.05),
    default=1.0,
    show_default=True,
    help="Pause between workload steps (one action each).",
)
@click.option(
    "--faults/--no-faults",
    default=True,
    show_default=True,
    help="--no-faults: a baseline run, the workload and the verifier without any fault.",
)
@click.option(
    "--secure",
    type=click.Choice(["scram", "mtls"]),
    default=None,
    help="On a secured broker (SASL_SSL SCRAM-SHA-512 or mTLS, StandardAuthorizer, no ACL "
    "means no access): each component logs in as its principal and holds only the ACLs "
    "`mailtap acls` computes; a refused operation is a violation.",
)
def soak(
    minutes: float,
    seed: int,
    mailboxes: int,
    as_json: bool,
    report_dir: Path | None,
    state_dir: Path | None,
    step_seconds: float,
    faults: bool,
    secure: str | None,
) -> None:
    """3 imap-source, 2 streams and 2 smtp-sink instances under random faults; the last line
    is the verdict."""
    from mailtap.soak.run import SoakOptions, run_soak

    def say(text: str) -> None:
        click.echo(f"{dt.datetime.now().strftime('%H:%M:%S')}  {text}", err=as_json)

    options = SoakOptions(
        minutes, seed, mailboxes, report_dir, state_dir, step_seconds, faults=faults, secure=secure
    )
    passed, document = run_soak(options, say)
    if as_json:
        summary = {k: v for k, v in document.items() if k != "samples"}
        click.echo(json.dumps(summary, sort_keys=True, default=str))
    count = len(document.get("violations", []))
    mode = f" (--secure {secure})" if secure else ""
    verdict = (
        f"PASS: seed {seed}{mode}, {document.get('faults_by_kind', {})} faults, 0 violations"
        if passed
        else f"FAIL: seed {seed}{mode}, {count} violation(s): "
        + "; ".join(f"{v['rule']} {v['subject']}" for v in document.get("violations", [])[:5])
    )
    click.echo(verdict)
    if not passed:
        raise SystemExit(1)
