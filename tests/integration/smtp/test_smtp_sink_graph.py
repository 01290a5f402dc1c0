"""The sink with ``smtp.transport: graph``: replies go out through Microsoft Graph's sendMail
(tests/graph_server, HTTPS on loopback) with the same intent/outcome records as through a relay,
on the session's Kafka broker."""

from __future__ import annotations

import asyncio
import email
import email.policy
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from smtp_harness import WAIT_S, TopicReader, command, produce_commands, run_until, sink_config
from test_smtp_sink_crash import REPO, start_sink, wait_for

from connectors.core.claimcheck.open import open_configured
from connectors.core.config import config_from_dict
from connectors.graph.source import GraphSource
from connectors.smtp.bounce_reader import BounceReader
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.identity import message_id_for
from connectors.smtp.sink import SmtpSink
from mailtap.dev import DevServices
from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import CLIENT_ID, CLIENT_SECRET, USER
from tests.support.crashpoints import EXIT_CODE


def graph_sink_config(
    services: DevServices, unique: str, server: GraphTestServer, **overrides: Any
) -> tuple[Any, Any, dict[str, Any]]:
    graph_block = {
        "tenant_id": server.tenant,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "user": USER,
        "authority_host": server.url,
        "api_base": server.graph_url,
        "ca_file": str(server.ca_file),
        "request_timeout": 10,
        **overrides.pop("graph", {}),
    }
    cfg, settings, raw = sink_config(
        services.bootstrap_servers, unique, 1, transport="graph", graph=graph_block, **overrides
    )
    del raw["smtp"]["host"], raw["smtp"]["port"], raw["smtp"]["security"]
    return cfg, settings, raw


def sendmail_calls(graph: GraphTestServer) -> list[int]:
    return [r.status for r in graph.requests if r.path.lower().endswith("/sendmail")]


async def test_reply_goes_out_through_graph_sendmail(
    services: DevServices, unique: str, graph_server: GraphTestServer
) -> None:
    graph_server.add_mailbox("colleague@example.com")  # a recipient the server delivers to
    cfg, _settings, _ = graph_sink_config(services, unique, graph_server)
    cmd = command(
        ["a@example.org"],
        **{"from": {"name": "Support", "address": USER}},
        cc=[{"name": None, "address": "colleague@example.com"}],
        bcc=[{"name": None, "address": "audit@example.org"}],
    )
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink = SmtpSink(cfg, cfg.section("smtp", SmtpSinkSettings))
    got = await run_until(sink, events, lambda ev: sum(e["status"] == "SENT" for e in ev) == 3)
    events.close()

    message_id = message_id_for(cmd["command_id"], "example.com")
    assert {(e["recipient"], e["status"]) for e in got} == {
        ("a@example.org", "SENT"),
        ("colleague@example.com", "SENT"),
        ("audit@example.org", "SENT"),
    }
    assert {e["message_id"] for e in got} == {message_id}
    assert all("202 Accepted" in e["diagnostic"] and e["smtp_code"] is None for e in got)
    [sent] = graph_server.sent
    assert sent.sender == USER and sent.json_message is None  # the MIME variant
    assert set(sent.recipients) == {"a@example.org", "colleague@example.com", "audit@example.org"}
    mime = email.message_from_bytes(sent.mime, policy=email.policy.default)
    # The reply's own headers survive (only MIME carries them): threading and RFC 3834.
    assert mime["Message-ID"] == f"<{message_id}>"
    assert mime["In-Reply-To"] == "<orig-1@example.org>"
    assert mime["Auto-Submitted"] == "auto-replied"
    assert mime["Bcc"] == "audit@example.org"  # Exchange takes Bcc from the MIME headers
    # A copy in Sent Items, and the colleague's inbox got it without the Bcc.
    [copy] = graph_server.messages(USER, "sentitems")
    assert copy.internet_message_id == f"<{message_id}>"
    [delivered] = graph_server.messages("colleague@example.com")
    assert b"audit@example.org" not in delivered.mime
    assert sendmail_calls(graph_server) == [202]


async def test_throttled_sendmail_is_deferred_and_honours_retry_after(
    services: DevServices, unique: str, graph_server: GraphTestServer
) -> None:
    """429 with Retry-After: DEFERRED to the first retry tier, no request while Retry-After
    runs, then SENT once; a 503 likewise."""
    graph_server.fail_requests(1, status=429, retry_after=3, path_contains="sendMail")
    graph_server.fail_requests(1, status=503, retry_after=1, path_contains="sendMail")
    cfg, settings, _ = graph_sink_config(services, unique, graph_server, pool_size=1)
    first, second = command(["a@example.org"]), command(["b@example.org"])
    produce_commands(cfg, [first, second])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink = SmtpSink(cfg, settings)
    got = await run_until(
        sink,
        events,
        lambda ev: (
            {e["command_id"] for e in ev if e["status"] == "SENT"}
            == {first["command_id"], second["command_id"]}
        ),
    )
    events.close()

    deferred = [e for e in got if e["status"] == "DEFERRED"]
    assert deferred, got
    assert any("429 TooManyRequests" in e["diagnostic"] for e in deferred), deferred
    assert all(e["next_attempt_at"] is not None for e in deferred)
    for cmd in (first, second):
        mine = [e["status"] for e in got if e["command_id"] == cmd["command_id"]]
        assert mine.count("SENT") == 1 and mine[-1] == "SENT", mine
    calls = sendmail_calls(graph_server)
    assert calls.count(429) == 1 and calls.count(503) == 1 and calls.count(202) == 2, calls
    # A send that came while Retry-After ran was deferred without a request to Graph.
    assert len(deferred) >= calls.count(429) + calls.count(503)
    assert len(graph_server.sent) == 2


async def test_permanent_refusal_is_failed_without_retry(
    services: DevServices, unique: str, graph_server: GraphTestServer
) -> None:
    """A 4xx for the message (400 ErrorInvalidRecipients, user-sendmail's answer to a message
    Exchange finds no valid recipient in) is FAILED at once with Graph's error, never retried;
    the next command goes out."""
    graph_server.fail_requests(
        1,
        status=400,
        code="ErrorInvalidRecipients",
        message="At least one recipient isn't valid.",
        path_contains="sendMail",
    )
    cfg, settings, _ = graph_sink_config(services, unique, graph_server, pool_size=1)
    bad, good = command(["a@example.org"]), command(["b@example.org"])
    produce_commands(cfg, [bad, good])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink = SmtpSink(cfg, settings)
    got = await run_until(sink, events, lambda ev: len({e["command_id"] for e in ev}) == 2)
    events.close()
    by_command = {e["command_id"]: e for e in got}
    failed = [e for e in got if e["status"] == "FAILED"]
    assert len(failed) == 1, got
    assert "400 ErrorInvalidRecipients" in failed[0]["diagnostic"]
    assert failed[0]["next_attempt_at"] is None
    other = ({bad["command_id"], good["command_id"]} - {failed[0]["command_id"]}).pop()
    assert by_command[other]["status"] == "SENT"
    assert sendmail_calls(graph_server) == [400, 202]  # the refused one never again


async def test_access_revoked_keeps_the_mail(
    services: DevServices, unique: str, graph_server: GraphTestServer
) -> None:
    """403 ErrorAccessDenied (an application access policy now excludes the mailbox) is the
    application's problem, not the message's: DEFERRED to a retry tier, never FAILED."""
    graph_server.revoke_access(CLIENT_ID, USER)
    cfg, settings, _ = graph_sink_config(services, unique, graph_server)
    cmd = command(["a@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(SmtpSink(cfg, settings), events, lambda ev: bool(ev))
    events.close()
    assert [e["status"] for e in got] == ["DEFERRED"]
    assert "403 ErrorAccessDenied" in got[0]["diagnostic"]
    assert "check smtp.graph" in got[0]["diagnostic"]
    assert graph_server.sent == []


@pytest.mark.parametrize("hook", ["kill_after_intent", "kill_after_send"])
def test_kill_9_mid_send_resends_no_more_than_the_smtp_path(
    services: DevServices, unique: str, graph_server: GraphTestServer, tmp_path: Path, hook: str
) -> None:
    """kill -9 with INTENTs committed (no request made yet), and with Graph's 202s in but the
    outcomes not recorded: after a restart every command is SENT, a second copy goes only
    for an attempt reported UNKNOWN (at most pool_size of them), with the same Message-ID,
    exactly as through a relay (test_smtp_sink_crash)."""
    cfg, settings, raw = graph_sink_config(services, unique, graph_server)
    config = tmp_path / "mailtap.yaml"
    config.write_text(yaml.safe_dump(raw))
    log = tmp_path / "sink.log"
    cmds = [command([f"user{i}@example.org"]) for i in range(3)]
    produce_commands(cfg, cmds)

    crashed = start_sink(config, log, hook)
    assert crashed.wait(timeout=WAIT_S) == EXIT_CODE, log.read_text()
    if hook == "kill_after_intent":
        assert graph_server.sent == []  # the request waits for the INTENT's commit
    else:
        assert len(graph_server.sent) >= 1

    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    restarted = start_sink(config, log, None)
    try:

        def all_sent() -> bool:
            events.poll(0.2)
            return {e["command_id"] for e in events.values if e["status"] == "SENT"} == {
                c["command_id"] for c in cmds
            }

        wait_for(all_sent, "every command SENT after the restart")
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(timeout=WAIT_S) == 0, log.read_text()
    events.close()

    copies = Counter(
        email.message_from_bytes(m.mime, policy=email.policy.default)["Message-ID"]
        for m in graph_server.sent
    )
    unknown = Counter(e["command_id"] for e in events.values if e["status"] == "UNKNOWN")
    assert 1 <= sum(unknown.values()) <= settings.pool_size
    for cmd in cmds:
        message_id = message_id_for(cmd["command_id"], "example.com")
        mine = [e for e in events.values if e["command_id"] == cmd["command_id"]]
        assert {e["message_id"] for e in mine} == {message_id}
        assert [e["status"] for e in mine].count("SENT") == 1
        if hook == "kill_after_intent":
            assert copies[f"<{message_id}>"] == 1
        else:
            assert copies[f"<{message_id}>"] == 1 + unknown[cmd["command_id"]]


def test_a_refused_secret_stops_the_start_with_a_sentence(
    services: DevServices, unique: str, graph_server: GraphTestServer, tmp_path: Path
) -> None:
    """`mailtap run smtp-sink` with a wrong client secret ends at start, before reading a
    command, with one sentence naming smtp.graph and what to check; the secret is not in it."""
    _cfg, _settings, raw = graph_sink_config(
        services, unique, graph_server, graph={"client_secret": "not-the-secret"}
    )
    config = tmp_path / "mailtap.yaml"
    config.write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "mailtap.cli", "run", "smtp-sink", "-c", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 1, done.stderr
    assert "smtp.graph: the token endpoint refused the application" in done.stderr
    assert "invalid_client" in done.stderr and "check tenant_id, client_id" in done.stderr
    assert "Traceback" not in done.stderr
    assert "not-the-secret" not in done.stderr + done.stdout
    assert graph_server.sent == []


async def test_a_bounce_comes_back_as_an_ndr_read_through_the_graph_source(
    services: DevServices, unique: str, graph_server: GraphTestServer, tmp_path: Path
) -> None:
    """Graph says 202 (SENT) for a recipient that later bounces; Exchange Online's NDR lands in
    the sending mailbox, the Graph source publishes it, the bounce reader (smtp.bounce_accounts)
    correlates it by the reply's Message-ID: BOUNCED, as on the SMTP path."""
    account = f"m365-{unique}"
    graph_server.bounce_recipient("gone@example.net")
    _, _, raw = graph_sink_config(
        services,
        unique,
        graph_server,
        bounce_accounts=[account],
        bounce_group_id=f"bounces-{unique}",
    )
    # The source's topics of this test only (the session broker is shared).
    raw["kafka"]["topics"].update(
        events=f"mail.events.{unique}",
        offsets=f"mailtap.offsets.{unique}",
        mailboxes=f"mailtap.mailboxes.{unique}",
    )
    raw["claim_check"] = {"url": (tmp_path / "claims").as_uri()}
    raw["graph"] = {
        "tenant_id": graph_server.tenant,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "authority_host": graph_server.url,
        "api_base": graph_server.graph_url,
        "ca_file": str(graph_server.ca_file),
        "accounts": [{"name": account, "user": USER, "start": "all"}],
        "sweep_interval_seconds": 0.5,
    }
    cfg = config_from_dict(raw)
    settings = cfg.section("smtp", SmtpSinkSettings)
    cmd = command(["gone@example.net"], **{"from": {"name": "Support", "address": USER}})
    produce_commands(cfg, [cmd])

    source = GraphSource.from_config(cfg, serve_health=False)
    source.start()
    # The bounce reader reads the NDR's MIME where the source put it: the claim-check store.
    reader = BounceReader(cfg, settings, fetch_blob=open_configured(cfg.claim_check).get)
    sink = SmtpSink(cfg, settings)
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    sink.start()
    reader.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while {e["status"] for e in events.values} < {"SENT", "BOUNCED"}:
            assert time.monotonic() < deadline, events.values
            await sink.poll_once()
            reader.poll_once()
            events.poll(0.05)
            await asyncio.sleep(0)
    finally:
        reader.close()
        await sink.close()
        source.stop()
        events.close()
    [sent] = [e for e in events.values if e["status"] == "SENT"]
    [bounced] = [e for e in events.values if e["status"] == "BOUNCED"]
    assert sent["command_id"] == bounced["command_id"] == cmd["command_id"]
    assert bounced["recipient"] == "gone@example.net"
    assert bounced["bounce_type"] == "HARD" and bounced["enhanced_status"] == "5.1.1"
    assert bounced["message_id"] == message_id_for(cmd["command_id"], "example.com")
