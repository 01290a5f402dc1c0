"""The suppression list end to end, as a user runs it: ``mailtap run imap-source`` reads the bounce
mailbox (Dovecot) into Kafka, ``mailtap run smtp-sink`` sends through the recording SMTP server and
reads the bounces. A hard-bounce DSN, an ARF complaint, an unsubscribe mail and (at the limit) soft
bounces each suppress their address: the next command to it gets SUPPRESSED and nothing reaches the SMTP server.
``mailtap suppressions add|list|remove`` act on the running sink without a restart.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from imapclient import IMAPClient
from smtp_harness import WAIT_S, TopicReader, command, produce_commands

from connectors.core.config import config_from_dict
from mailtap.cli import main
from mailtap.components import Pipeline, wait_for
from mailtap.dev.received import ReceivedMessage, received_messages, received_names
from mailtap.dev.services import DevServices

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FIXTURE_TOKEN = b"a1b2c3d4e5f6"  # the command id in the fixtures' quoted Message-IDs


def _config(services: DevServices, unique: str, bounce_user: Any, tmp_path: Path) -> Path:
    base = yaml.safe_load(Path(services.config_path).read_text())
    account = dict(base["imap"]["accounts"][0])
    account.update(
        name=f"bounces-{unique}",
        username=bounce_user.username,
        password=bounce_user.password,
        start="all",
    )
    names = ("events", "commands", "dlq", "delivery", "offsets", "workflow", "suppressions")
    topics = {name: f"{name}.{unique}" for name in names}
    topics["retry_prefix"] = f"retry.{unique}"
    doc = {
        "kafka": {**base["kafka"], "topics": topics},
        "claim_check": base["claim_check"],
        "health": {"port": 0},
        "imap": {**base["imap"], "accounts": [account]},
        "smtp": {
            **base["smtp"],
            "retry_tiers": ["5s"],
            "max_lifetime": "5m",
            "group_id": f"sink-{unique}",
            "bounce_group_id": f"bounces-{unique}",
            "state_topic": f"mailtap.sink.state.{unique}",
            "instance_id": f"sink-{unique}",
            "bounce_accounts": [f"bounces-{unique}"],
            "suppression": {"unsubscribe_mailto": bounce_user.username, "soft_bounce_limit": 2},
        },
    }
    path = tmp_path / "mailtap.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(config: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["suppressions", args[0], "-c", str(config), *args[1:]])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.mark.timeout(600)
def test_bounce_complaint_unsubscribe_and_cli_suppress_until_removed(
    services: DevServices, unique: str, tmp_path: Path
) -> None:
    bounce_user = services.add_user(f"bounces-{unique}@example.com", "pw")
    config = _config(services, unique, bounce_user, tmp_path)
    cfg = config_from_dict(yaml.safe_load(config.read_text()), env={})
    received_dir = services.smtp.received_dir
    before = received_names(received_dir)
    hard, kim, leaver, manual, full = (
        f"{who}-{unique}@example.org" for who in ("hard", "kim", "leave", "manual", "full")
    )
    produce_commands(cfg, [])  # the topics, so the readers below can start
    events = TopicReader(cfg, cfg.kafka.topics.delivery)

    def ours() -> list[ReceivedMessage]:
        return [m for m in received_messages(received_dir, before) if unique.encode() in m.raw]

    def outcome(cmd: dict[str, Any]) -> str | None:
        events.poll(0.1)
        found = [e["status"] for e in events.values if e["command_id"] == cmd["command_id"]]
        return found[-1] if found else None

    def send(to: str) -> dict[str, Any]:
        cmd = command([to], command_id=uuid.uuid4().hex, subject=f"Re: case {unique}")
        produce_commands(cfg, [cmd])
        assert wait_for(lambda: outcome(cmd) in ("SENT", "SUPPRESSED"), WAIT_S), events.values
        return cmd

    def delivered(cmd: dict[str, Any]) -> bool:
        return any(f"mailtap.{cmd['command_id']}@".encode() in m.raw for m in ours())

    def listed() -> str:
        return cli(config, "list")

    def to_bounce_mailbox(raw: bytes) -> None:
        with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
            client.login(bounce_user.username, bounce_user.password)
            client.append("INBOX", raw)

    with Pipeline(config, tmp_path / "logs", names=("imap-source", "smtp-sink")) as pipeline:
        # 1. Sent; the reply carries List-Unsubscribe. Then a 5.1.1 DSN about it comes back.
        first = send(hard)
        assert outcome(first) == "SENT", pipeline.components["smtp-sink"].log_tail()
        assert wait_for(lambda: delivered(first), WAIT_S)
        sent = next(m for m in ours() if m.rcpt_tos == (hard,)).message
        assert sent["List-Unsubscribe"] == f"<mailto:{bounce_user.username}?subject=unsubscribe>"
        dsn = (FIXTURES / "dsn" / "rfc3464_hard_511.eml").read_bytes()
        dsn = dsn.replace(b"nobody@example.org", hard.encode())
        # Sent to the return path, here also the unsubscribe address: still only a bounce.
        dsn = dsn.replace(b"support@example.com", bounce_user.username.encode())
        to_bounce_mailbox(dsn.replace(FIXTURE_TOKEN, first["command_id"].encode()))
        assert wait_for(lambda: hard in listed(), WAIT_S), pipeline.components[
            "smtp-sink"
        ].log_tail()
        assert "HARD_BOUNCE" in listed() and "5.1.1" in listed()
        assert wait_for(lambda: outcome(first) == "BOUNCED", WAIT_S)

        # 2. The next command to that address is SUPPRESSED and never reaches the server.
        again = send(hard)
        assert outcome(again) == "SUPPRESSED"
        event = next(e for e in events.values if e["command_id"] == again["command_id"])
        assert event["recipient"] == hard and "HARD_BOUNCE" in event["diagnostic"]

        # 3. An ARF complaint (text/rfc822-headers form) about a sent reply.
        complained = send(kim)
        assert outcome(complained) == "SENT"
        arf = (FIXTURES / "arf" / "jmrp_headers_only.eml").read_bytes()
        arf = arf.replace(b"kim@hotmail.example", kim.encode())
        to_bounce_mailbox(arf.replace(FIXTURE_TOKEN, complained["command_id"].encode()))
        assert wait_for(lambda: f"{kim}  COMPLAINT" in listed(), WAIT_S)
        assert outcome(send(kim)) == "SUPPRESSED"

        # 4. An unsubscribe mail to the List-Unsubscribe address suppresses its sender.
        to_bounce_mailbox(
            f"From: Leaver <{leaver}>\r\nTo: {bounce_user.username}\r\n"
            f"Subject: unsubscribe\r\nMessage-ID: <u-{unique}@example.org>\r\n\r\n\r\n".encode()
        )
        assert wait_for(lambda: f"{leaver}  UNSUBSCRIBE" in listed(), WAIT_S)
        assert outcome(send(leaver)) == "SUPPRESSED"

        # 5. Soft bounces (4.2.2 mailbox full) count; the second within the window suppresses.
        filling = send(full)
        soft = (FIXTURES / "dsn" / "rfc3464_soft_422.eml").read_bytes()
        soft = soft.replace(b"full@example.net", full.encode())
        soft = soft.replace(b"b0a7c0de1234", filling["command_id"].encode())
        to_bounce_mailbox(soft.replace(b"<dsn.2@", f"<dsn.a.{unique}@".encode()))
        assert wait_for(lambda: full in cli(config, "list", "--all"), WAIT_S)
        assert full not in listed()  # one soft bounce: counted, not suppressed
        assert outcome(send(full)) == "SENT"
        to_bounce_mailbox(soft.replace(b"<dsn.2@", f"<dsn.b.{unique}@".encode()))
        assert wait_for(lambda: f"{full}  SOFT_BOUNCES" in listed(), WAIT_S)
        assert outcome(send(full)) == "SUPPRESSED"

        # 6. The CLI: an added address is honoured by the running sink; a removed one is sent.
        assert "suppressed" in cli(config, "add", manual.upper(), "--note", "asked by phone")
        assert wait_for(lambda: f"{manual}  MANUAL" in listed(), WAIT_S)
        assert outcome(send(manual)) == "SUPPRESSED"
        assert "was suppressed" in cli(config, "remove", hard)
        assert hard not in listed()
        resent = send(hard)
        assert outcome(resent) == "SENT"
        assert wait_for(lambda: delivered(resent), WAIT_S)
        pipeline.check_alive()

    # Nothing suppressed reached the SMTP server: only the SENT commands did.
    assert sorted(m.rcpt_tos for m in ours()) == sorted(
        [(hard,), (hard,), (kim,), (full,), (full,)]
    )
    events.close()
