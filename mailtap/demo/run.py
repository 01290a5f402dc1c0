"""``mailtap demo``: the whole product on the local services, narrated as it happens.

1. Start (or reuse) the local Kafka, Dovecot and SMTP server; create the topics.
2. Create a fresh demo mailbox and a config for it; start the IMAP source, the streams worker and
   the SMTP sink as child processes, exactly as ``mailtap run`` would in production.
3. Drop sample mails into the mailbox: a ticket request, a follow-up in its thread, an approval
   request, the approver's answer (written once the forward reached the approver), an auto-reply.
4. Print each step as it happens: event on Kafka → workflow → reply command → delivery → the reply
   as received by the SMTP server. End with a summary and stop what the demo started.
"""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml
from imapclient import IMAPClient

from connectors.core.config import load_config
from connectors.core.kafka.topics import ensure_topic_specs, ensure_topics
from connectors.imap.indexlog import topic_spec as index_topic_spec
from mailtap.components import Pipeline, wait_for
from mailtap.demo.trace import RunTrace, Tracer
from mailtap.dev import scenario
from mailtap.dev import services as dev

#: How long the demo waits for each stage. Generous: the first run on a cold JVM and a fresh
#: faust worker (group join, changelog topics) takes several seconds before the first reply.
STAGE_TIMEOUT_S = 90.0
#: The tracer's consumer on topics created a moment ago waits for their partition leaders.
TRACER_READY_S = 60.0

COLOURS = {
    "mail": "cyan",
    "flow": "magenta",
    "command": "yellow",
    "delivery": "green",
    "smtp": "blue",
    "demo": "white",
}


@dataclass
class DemoResult:
    run: str
    appended: int
    expected_replies: int
    trace: RunTrace
    ok: bool
    seconds: float
    #: The first mail's APPEND -> its MailEvent seen on ``mail.events`` (None: never seen).
    first_event_s: float | None = None


def _say(kind: str, text: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S.%f")[:-3]
    click.echo(
        f"{stamp}  {click.style(f'{kind:<8}', fg=COLOURS.get(kind, 'white'), bold=True)} {text}"
    )


def demo_config(info: dev.DevServices, run: str, username: str, password: str, out: Path) -> Path:
    base: dict[str, Any] = yaml.safe_load(info.config_path.read_text())
    account = dict(base["imap"]["accounts"][0])
    account.update(name=f"demo-{run}", username=username, password=password, start="all")
    doc = {
        "kafka": base["kafka"],
        "claim_check": base["claim_check"],
        "health": {"port": 0},
        "imap": {**base["imap"], "accounts": [account]},
        # The worker's local tables in the run's folder: the default (.state/streams, relative to
        # the working directory) does not exist when the services live in another --state-dir.
        "streams": {
            **scenario.streams_section("mailtap-demo"),
            "data_dir": str(out.parent / "streams"),
        },
        "smtp": {**base["smtp"], "retry_tiers": ["5s", "30s"], "max_lifetime": "5m"},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def _append(client: IMAPClient, mail: scenario.SampleMail) -> float:
    """APPEND ``mail``; returns the wall-clock time the server confirmed it."""
    client.append("INBOX", mail.raw)
    appended_at = time.time()
    _say("demo", f"appended {mail.label}: <{mail.message_id}>")
    return appended_at


def _first_event_s(trace: RunTrace, mail: scenario.SampleMail, appended_at: float) -> float | None:
    """Seconds from the APPEND of ``mail`` to its MailEvent on ``mail.events``, as the tracer
    saw it: what a user waits for before the first sign of life of the pipeline."""
    with trace.lock:
        seen = trace.event_seen_at.get(mail.message_id)
    return None if seen is None else seen - appended_at


def _forward_to_approver(trace: RunTrace) -> tuple[str, tuple[str, ...]] | None:
    with trace.lock:
        for message in trace.received:
            if scenario.APPROVER in message.rcpt_tos:
                parsed = email.message_from_bytes(message.raw, policy=email.policy.default)
                refs = tuple(r.strip("<>") for r in str(parsed["References"] or "").split())
                return str(parsed["Message-ID"]).strip("<>"), refs
    return None


def run_demo(state_dir: Path | None, follow: bool, timeout: float = STAGE_TIMEOUT_S) -> DemoResult:
    started_services = dev.status(state_dir) is None
    _say(
        "demo",
        "starting local Kafka, Dovecot and SMTP…"
        if started_services
        else "reusing the running local services",
    )
    info = dev.up(state_dir)
    run = uuid.uuid4().hex[:8]
    user = info.add_user(f"demo-{run}@example.com", f"pw-{run}")
    run_dir = info.state_dir / "demo" / run
    config_path = demo_config(info, run, user.username, user.password, run_dir / "mailtap.yaml")
    cfg = load_config(config_path)
    # What `mailtap topics ensure` does before a deployment starts: the components find their
    # topics there, with partition leaders, instead of creating them and waiting for leaders.
    ensure_topics(cfg.kafka, ["5s", "30s"])
    ensure_topic_specs(cfg.kafka, [index_topic_spec(cfg.kafka)])
    _say("demo", f"run {run}: mailbox {user.username}, config {config_path}")
    trace = RunTrace(account=f"demo-{run}")
    begin = time.monotonic()
    tracer = Tracer(
        cfg.kafka,
        trace,
        info.smtp.received_dir,
        dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5),
        _say,
        run,
    ).start()
    # The tracer is the demo's observer, not part of the pipeline: it is consuming before the
    # components start, so the figure "first mail on mail.events after its APPEND" is the
    # pipeline's, not the tracer's own start on topics created a moment ago.
    if not tracer.ready.wait(TRACER_READY_S):
        _say("demo", f"the tracer is not consuming after {TRACER_READY_S:.0f} s; going on")
    pipeline = Pipeline(config_path, run_dir).start()
    _say("demo", f"started imap-source, streams, smtp-sink (logs in {run_dir})")
    ok = False
    mails: list[scenario.SampleMail] = []
    try:
        with IMAPClient(info.imap.host, info.imap.port, ssl=False, timeout=30) as client:
            client.login(user.username, user.password)
            ticket = scenario.ticket_request(run)
            expense = scenario.approval_request(run)
            first_appended_at = _append(client, ticket)
            mails.append(ticket)
            for mail in (expense, scenario.auto_reply(run, ticket)):
                _append(client, mail)
                mails.append(mail)
            wait_for(
                lambda: (trace.command_ids and _count_replies(trace) >= 3) or not _alive(pipeline),
                timeout,
            )
            pipeline.check_alive()
            followup = scenario.ticket_followup(run, ticket)
            _append(client, followup)
            mails.append(followup)
            forward = None
            if wait_for(lambda: _forward_to_approver(trace) is not None, timeout):
                forward = _forward_to_approver(trace)
            if forward is None:
                _say("demo", "the approval request was not forwarded to the approver in time")
            else:
                answer = scenario.approver_answer(run, *forward)
                _append(client, answer)
                mails.append(answer)
        expected = sum(m.expected_replies for m in mails)
        ok = wait_for(lambda: _count_replies(trace) >= expected or not _alive(pipeline), timeout)
        pipeline.check_alive()
        time.sleep(1.0)  # let the last delivery events arrive for the summary
        ok = ok and _count_replies(trace) == expected and _skipped_auto_reply(trace)
        result = DemoResult(
            run,
            len(mails),
            expected,
            trace,
            ok,
            time.monotonic() - begin,
            _first_event_s(trace, ticket, first_appended_at),
        )
        if not follow:
            tracer.stop()  # the summary is the last word
        _summary(result)
        if follow:
            _say("demo", "following (Ctrl-C stops everything the demo started)…")
            while True:
                time.sleep(1)
                pipeline.check_alive()
        return result
    except KeyboardInterrupt:
        return DemoResult(run, len(mails), 0, trace, ok, time.monotonic() - begin)
    finally:
        tracer.stop()
        pipeline.stop()
        if started_services:
            dev.down(state_dir)
            _say("demo", "stopped the local services the demo started")


def _alive(pipeline: Pipeline) -> bool:
    return all(c.alive for c in pipeline.components.values())


def _count_replies(trace: RunTrace) -> int:
    with trace.lock:
        return len(trace.received)


def _skipped_auto_reply(trace: RunTrace) -> bool:
    with trace.lock:
        return any(
            w["status"] == "SKIPPED" and "vacation-" in (w.get("event_key") or "")
            for w in trace.workflow
        )


def _summary(result: DemoResult) -> None:
    tr = result.trace
    with tr.lock:
        sent = sum(1 for d in tr.delivery if d["status"] == "SENT")
        answered = {c.get("event_key") for c in tr.commands}
        # A mail read twice (the streams worker is at-least-once) publishes nothing the second
        # time (the dedupe table); a mail skipped twice is listed once.
        skipped_by_key: dict[str, Any] = {}
        for w in tr.workflow:
            key = w["event_key"]
            if w["status"] in ("SKIPPED", "UNROUTED") and key not in answered:
                skipped_by_key.setdefault(key, w)
        skipped = list(skipped_by_key.values())
        rows = {
            "mails appended to the mailbox": result.appended,
            "MailEvents on Kafka": len({e["key"] for e in tr.events}),
            "workflow status events": len(tr.workflow),
            "reply commands": len(tr.command_ids),
            "SENT delivery events": sent,
            "replies received by the SMTP server": f"{len(tr.received)} (expected {result.expected_replies})",
            "mails not answered, with reason": len(skipped),
        }
    first = "never" if result.first_event_s is None else f"{result.first_event_s:.1f} s"
    rows["first mail on mail.events after its APPEND"] = first
    click.echo("")
    click.echo(click.style(f"Summary of demo run {result.run} ({result.seconds:.1f} s)", bold=True))
    for label, value in rows.items():
        click.echo(f"  {label:<38} {value}")
    for w in skipped:
        click.echo(f"    - {w['event_key']}: {w['status']} {json.dumps(w['attributes'])}")
    verdict = (
        "every mail took the right path"
        if result.ok
        else "SOMETHING WENT WRONG: see the lines above and the logs"
    )
    click.echo(click.style(f"  {verdict}", fg="green" if result.ok else "red", bold=True))
