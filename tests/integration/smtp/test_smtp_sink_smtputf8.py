"""Internationalized addresses (RFC 6531): ``用户@例子.广告`` goes out with SMTPUTF8 and UTF-8 headers
when the relay offers the extension, ends FAILED (5.6.7, nothing sent) when it does not; an ASCII
local part at an IDN domain goes through any relay as IDNA. Against aiosmtpd advertising and not
advertising SMTPUTF8, and through a real Postfix with and without ``smtputf8_enable``."""

from __future__ import annotations

import shutil
import tempfile
import time
from email import message_from_string, policy
from pathlib import Path
from typing import Any

import pytest
from smtp_harness import WAIT_S, TopicReader, command, produce_commands, run_until, sink_config
from smtp_postfix import PrivatePostfix
from smtp_scripted_server import Accepted, ScriptedRelay

from connectors.smtp.sink import SmtpSink
from mailtap.dev import DevServices

pytestmark = pytest.mark.integration

CHINESE = "用户@例子.广告"
IDN_ASCII_LOCAL = "kunde@bücher.example"


def _commands() -> tuple[dict[str, Any], dict[str, Any]]:
    utf8 = command(
        [CHINESE],
        subject="回复: 订单 42",
        **{"from": {"name": "Zoë Support", "address": "support@example.com"}},
    )
    idn = command([IDN_ASCII_LOCAL], subject="Re: Größe M")
    return utf8, idn


async def _send(
    services: DevServices, unique: str, port: int, commands: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    cfg, settings, _ = sink_config(services.bootstrap_servers, unique, port)
    produce_commands(cfg, commands)
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    try:
        got = await run_until(SmtpSink(cfg, settings), events, lambda ev: len(ev) >= len(commands))
    finally:
        events.close()
    return {e["command_id"]: e for e in got}


def _wait_accepted(relay: ScriptedRelay, count: int) -> list[Accepted]:
    deadline = time.monotonic() + WAIT_S
    while len(relay.handler.snapshot()) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return relay.handler.snapshot()


def _assert_utf8_message(accepted: Accepted) -> None:
    assert accepted.rcpt_tos == (CHINESE,)
    assert "SMTPUTF8" in [o.upper() for o in accepted.mail_options]
    head = accepted.data.partition(b"\r\n\r\n")[0]
    assert f"To: {CHINESE}".encode() in head  # RFC 6532: raw UTF-8, no encoded words
    assert "Subject: 回复: 订单 42".encode() in head and b"=?utf-8?" not in head
    msg = message_from_string(accepted.data.decode("utf-8"), policy=policy.default)
    assert msg["To"].addresses[0].addr_spec == CHINESE
    assert msg["From"].addresses[0].display_name == "Zoë Support"


def _assert_idna_message(accepted: Accepted) -> None:
    assert accepted.rcpt_tos == ("kunde@xn--bcher-kva.example",)
    assert "SMTPUTF8" not in [o.upper() for o in accepted.mail_options]
    head = accepted.data.partition(b"\r\n\r\n")[0]
    assert head.isascii() and b"To: kunde@xn--bcher-kva.example" in head
    assert b"Subject: Re: =?utf-8?" in head  # RFC 2047 without SMTPUTF8


async def test_relay_offering_smtputf8_gets_the_utf8_address(
    services: DevServices, unique: str
) -> None:
    utf8, idn = _commands()
    with ScriptedRelay(smtputf8=True) as relay:
        events = await _send(services, unique, relay.port, [utf8, idn])
        accepted = _wait_accepted(relay, 2)
    assert events[utf8["command_id"]]["status"] == "SENT"
    assert events[utf8["command_id"]]["recipient"] == CHINESE
    assert events[idn["command_id"]]["status"] == "SENT"
    by_rcpt = {a.rcpt_tos[0]: a for a in accepted}
    _assert_utf8_message(by_rcpt[CHINESE])
    _assert_idna_message(by_rcpt["kunde@xn--bcher-kva.example"])


async def test_relay_without_smtputf8_fails_the_utf8_address_and_sends_idna(
    services: DevServices, unique: str
) -> None:
    utf8, idn = _commands()
    with ScriptedRelay(smtputf8=False) as relay:
        events = await _send(services, unique, relay.port, [utf8, idn])
        accepted = _wait_accepted(relay, 1)
    failed = events[utf8["command_id"]]
    assert (failed["status"], failed["enhanced_status"], failed["recipient"]) == (
        "FAILED",
        "5.6.7",
        CHINESE,
    )
    assert "does not offer SMTPUTF8" in failed["diagnostic"]
    assert events[idn["command_id"]]["status"] == "SENT"
    (only,) = accepted  # nothing of the UTF-8 message reached the relay
    _assert_idna_message(only)


@pytest.mark.skipif(not PrivatePostfix.available(), reason="postfix needs root here")
@pytest.mark.parametrize("enabled", [True, False], ids=["smtputf8_enable=yes", "no"])
async def test_through_postfix(services: DevServices, unique: str, enabled: bool) -> None:
    utf8, _ = _commands()
    # Not tmp_path: pytest's base folder is 0700 and Postfix's unprivileged daemons must enter it.
    root = Path(tempfile.mkdtemp(prefix="mailtap-postfix-"))
    root.chmod(0o755)
    try:
        with (
            ScriptedRelay(smtputf8=True) as relay,
            PrivatePostfix(root, relay.port, smtputf8=enabled) as postfix,
        ):
            events = await _send(services, unique, postfix.port, [utf8])
            event = events[utf8["command_id"]]
            if enabled:
                assert event["status"] == "SENT", event
                (forwarded,) = _wait_accepted(relay, 1)
                _assert_utf8_message(forwarded)
                assert b"postfix.mailtap.test" in forwarded.data
            else:
                assert (event["status"], event["enhanced_status"]) == ("FAILED", "5.6.7")
                time.sleep(1)
                assert relay.handler.snapshot() == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
