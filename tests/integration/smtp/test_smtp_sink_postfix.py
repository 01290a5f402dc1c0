"""Happy path through a real MTA: the sink -> private Postfix -> a recording relay."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from email import message_from_bytes, policy
from pathlib import Path

import pytest
from smtp_harness import WAIT_S, TopicReader, command, produce_commands, run_until, sink_config
from smtp_postfix import PrivatePostfix
from smtp_scripted_server import ScriptedRelay

from connectors.smtp.bounce import BounceType, parse_bounce
from connectors.smtp.identity import message_id_for, verp_address
from connectors.smtp.sink import SmtpSink
from mailtap.dev import DevServices

pytestmark = pytest.mark.skipif(not PrivatePostfix.available(), reason="postfix needs root here")


async def test_postfix_accepts_and_forwards_what_we_render(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    blob = b"%PDF-1.4 not really\n" * 50
    attachment = {
        "filename": "Angebot Größe M.pdf",
        "content_type": "application/pdf",
        "uri": "claim://test/1",
        "sha256": hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
    }
    # Not tmp_path: pytest's base folder is 0700 and Postfix's unprivileged daemons must enter it.
    root = Path(tempfile.mkdtemp(prefix="mailtap-postfix-"))
    root.chmod(0o755)
    try:
        await _through_postfix(services, unique, relay, root, blob, attachment)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _through_postfix(
    services: DevServices,
    unique: str,
    relay: ScriptedRelay,
    root: Path,
    blob: bytes,
    attachment: dict[str, object],
) -> None:
    with PrivatePostfix(root, relay.port) as postfix:
        cfg, settings, _ = sink_config(services.bootstrap_servers, unique, postfix.port)
        cmd = command(
            ["kunde@example.org"],
            subject="Re: Anfrage: Größe M ✓",
            html_body="<p>Grüße</p>",
            attachments=[attachment],
            references=["a@example.org"],
            **{"from": {"name": "Zoë Support", "address": "support@example.com"}},
        )
        produce_commands(cfg, [cmd])
        events = TopicReader(cfg, cfg.kafka.topics.delivery)
        sink = SmtpSink(cfg, settings, fetch_blob={"claim://test/1": blob}.__getitem__)
        (event,) = await run_until(sink, events, lambda ev: len(ev) >= 1)
        assert (event["status"], event["smtp_code"], event["enhanced_status"]) == (
            "SENT",
            250,
            "2.0.0",
        )
        assert "queued as" in event["diagnostic"]
        deadline = time.monotonic() + WAIT_S
        while not relay.handler.snapshot() and time.monotonic() < deadline:
            time.sleep(0.2)
        (forwarded,) = relay.handler.snapshot()
        events.close()
    assert forwarded.rcpt_tos == ("kunde@example.org",)
    msg = message_from_bytes(forwarded.data, policy=policy.default)
    assert msg["Message-ID"] == f"<{message_id_for(cmd['command_id'], 'example.com')}>"
    assert msg["Subject"] == "Re: Anfrage: Größe M ✓"
    assert msg["From"].addresses[0].display_name == "Zoë Support"
    assert msg["References"] == "<a@example.org> <orig-1@example.org>"
    assert msg["Auto-Submitted"] == "auto-replied"
    assert "postfix.mailtap.test" in str(msg["Received"])
    (part,) = list(msg.iter_attachments())
    assert part.get_filename() == "Angebot Größe M.pdf"
    assert part.get_content() == blob


async def test_a_real_postfix_bounce_is_correlated_to_its_command(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    """Postfix accepts (SENT), the next hop refuses with 550, Postfix sends an RFC 3464 DSN to
    our VERP return path; bounce.py must turn that DSN into a HARD bounce of the right command."""
    root = Path(tempfile.mkdtemp(prefix="mailtap-postfix-"))
    root.chmod(0o755)
    try:
        with PrivatePostfix(root, relay.port) as postfix:
            cfg, settings, _ = sink_config(
                services.bootstrap_servers, unique, postfix.port, verp_domain="bounces.example.com"
            )
            cmd = command(["rcpt550@example.org"])
            produce_commands(cfg, [cmd])
            events = TopicReader(cfg, cfg.kafka.topics.delivery)
            (event,) = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= 1)
            events.close()
            assert event["status"] == "SENT"  # Postfix took responsibility
            deadline = time.monotonic() + WAIT_S
            while not relay.handler.snapshot() and time.monotonic() < deadline:
                time.sleep(0.2)
            (dsn,) = relay.handler.snapshot()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert dsn.rcpt_tos == (verp_address(cmd["command_id"], "bounces.example.com"),)
    (bounce,) = parse_bounce(dsn.data, verp_domain="bounces.example.com")
    assert bounce.command_id == cmd["command_id"]
    assert (bounce.recipient, bounce.bounce_type, bounce.status) == (
        "rcpt550@example.org",
        BounceType.HARD,
        "5.1.1",
    )
    assert bounce.message_id == message_id_for(cmd["command_id"], "example.com")
    assert bounce.smtp_code == 550
