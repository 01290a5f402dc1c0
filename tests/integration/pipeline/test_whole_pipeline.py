"""The whole product on the real services: Dovecot → IMAP source → Kafka → streams → SMTP sink →
the SMTP server. Each mail gets exactly one threaded reply, the auto-reply none, the approval round
trip completes — and stays so when the streams worker is killed and when mail.events is replayed
from the beginning by a worker with empty state."""

from __future__ import annotations

import email
import email.policy
import time
from pathlib import Path

import pytest
import yaml
from imapclient import IMAPClient

from mailtap.components import Component, Pipeline, wait_for
from mailtap.dev import scenario
from mailtap.dev.received import ReceivedMessage

STAGE_S = 120.0


def _config(services, unique: str, user, tmp_path: Path, app_id: str) -> Path:
    base = yaml.safe_load(Path(services.config_path).read_text())
    account = dict(base["imap"]["accounts"][0])
    account.update(
        name=f"pipe-{unique}", username=user.username, password=user.password, start="all"
    )
    topics = {
        "events": f"mail.events.{unique}",
        "commands": f"mail.commands.{unique}",
        "retry_prefix": f"mail.commands.retry.{unique}",
        "dlq": f"mail.commands.dlq.{unique}",
        "delivery": f"mail.delivery.{unique}",
        "offsets": f"mailtap.offsets.{unique}",
        "workflow": f"mail.workflow.{unique}",
    }
    doc = {
        "kafka": {**base["kafka"], "topics": topics},
        "claim_check": base["claim_check"],
        "health": {"port": 0},
        "imap": {**base["imap"], "accounts": [account]},
        "streams": {**scenario.streams_section(app_id), "data_dir": str(tmp_path / app_id)},
        "smtp": {
            **base["smtp"],
            "retry_tiers": ["5s"],
            "max_lifetime": "5m",
            "group_id": f"sink-{unique}",
            "state_topic": f"mailtap.sink.state.{unique}",
            "instance_id": f"sink-{unique}",
        },
    }
    path = tmp_path / f"{app_id}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _ours(services, run: str) -> list[ReceivedMessage]:
    found = []
    for message in services.received_messages():
        # The shared SMTP server keeps every mail of every test (tens of thousands): parsing
        # them all on each poll took minutes; only a mail holding the run id can be ours.
        if run.encode() not in message.raw:
            continue
        parsed = email.message_from_bytes(message.raw, policy=email.policy.default)
        if run in f"{parsed['In-Reply-To'] or ''} {parsed['References'] or ''}":
            found.append(message)
    return found


def _parsed(message: ReceivedMessage) -> email.message.EmailMessage:
    return email.message_from_bytes(message.raw, policy=email.policy.default)  # type: ignore[return-value]


def _forward(services, run: str) -> tuple[str, tuple[str, ...]] | None:
    for message in _ours(services, run):
        if scenario.APPROVER in message.rcpt_tos:
            parsed = _parsed(message)
            refs = tuple(r.strip("<>") for r in str(parsed["References"] or "").split())
            return str(parsed["Message-ID"]).strip("<>"), refs
    return None


@pytest.mark.timeout(600)
def test_each_mail_gets_one_threaded_reply_through_crash_and_replay(
    services, unique, tmp_path
) -> None:
    run = unique
    user = services.add_user(f"pipe-{unique}@example.com", "pw")
    config = _config(services, unique, user, tmp_path, f"streams-{unique}")
    ticket = scenario.ticket_request(run)
    expense = scenario.approval_request(run)
    vacation = scenario.auto_reply(run, ticket)
    followup = scenario.ticket_followup(run, ticket)
    with (
        Pipeline(config, tmp_path / "logs") as pipeline,
        IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client,
    ):
        client.login(user.username, user.password)
        for mail in (ticket, expense, vacation):
            client.append("INBOX", mail.raw)
        assert wait_for(lambda: len(_ours(services, run)) >= 3, STAGE_S), pipeline.components[
            "streams"
        ].log_tail()

        # Crash the streams worker mid-run; mail keeps arriving; a new worker takes over.
        pipeline.components["streams"].kill()
        client.append("INBOX", followup.raw)
        forward = _forward(services, run)
        assert forward is not None, "the approval request was not forwarded to the approver"
        answer = scenario.approver_answer(run, *forward)
        client.append("INBOX", answer.raw)
        pipeline.components["streams"].start()
        assert wait_for(lambda: len(_ours(services, run)) >= 6, STAGE_S), pipeline.components[
            "streams"
        ].log_tail()
        pipeline.check_alive()

        # Replay mail.events from the beginning with a worker that has no state at all.
        replay_config = _config(services, unique, user, tmp_path, f"replay-{unique}")
        replayer = Component("streams", replay_config, tmp_path / "logs" / "replay.log").start()
        try:
            time.sleep(20)  # long enough to read the whole topic and emit every command again
            assert replayer.alive, replayer.log_tail()
        finally:
            replayer.stop()
        time.sleep(3)

    received = _ours(services, run)
    by_recipient: dict[str, list[email.message.EmailMessage]] = {}
    for message in received:
        for rcpt in message.rcpt_tos:
            by_recipient.setdefault(rcpt, []).append(_parsed(message))
    for m in received:  # shown by pytest when an assertion below fails
        parsed = _parsed(m)
        print(m.rcpt_tos, parsed["Subject"], parsed["In-Reply-To"], parsed["Message-ID"])
        print("   ", parsed.get_body(("plain",)).get_content().splitlines()[:3])
    assert len(received) == 6, [
        (m.rcpt_tos, _parsed(m)["Subject"], _parsed(m)["In-Reply-To"], _parsed(m)["Message-ID"])
        for m in received
    ]
    assert {k: len(v) for k, v in by_recipient.items()} == {
        scenario.APPROVER: 2,  # the forward and the confirmation
        scenario.CUSTOMER: 2,  # the ticket acknowledgement and the follow-up answer
        scenario.REQUESTER: 2,  # the acknowledgement and the decision
    }
    assert scenario.VACATION not in by_recipient  # the auto-reply is never answered

    ack = next(
        m for m in by_recipient[scenario.CUSTOMER] if m["In-Reply-To"] == f"<{ticket.message_id}>"
    )
    assert ack["References"] == f"<{ticket.message_id}>"
    assert ack["Auto-Submitted"] == "auto-replied"
    follow_answer = next(m for m in by_recipient[scenario.CUSTOMER] if m is not ack)
    assert follow_answer["In-Reply-To"] == f"<{followup.message_id}>"
    assert follow_answer["References"].split() == [
        f"<{ticket.message_id}>",
        f"<{followup.message_id}>",
    ]
    ticket_tag = ack["Subject"].rsplit("[#", 1)[1]
    assert ticket_tag in follow_answer["Subject"]  # the follow-up attached to the same ticket

    decision = next(
        m
        for m in by_recipient[scenario.REQUESTER]
        if "APPROVE" in m.get_body().get_content().upper()
        and m["In-Reply-To"] == f"<{expense.message_id}>"
        and m is not by_recipient[scenario.REQUESTER][0]
    )
    assert decision["References"].split()[-1] == f"<{expense.message_id}>"
    message_ids = [_parsed(m)["Message-ID"] for m in received]
    assert len(set(message_ids)) == 6
