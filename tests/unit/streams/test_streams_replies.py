"""Where answers go and how many (issue 17 items 3 and 4): :func:`streams.mail.answer_address`
and the pipeline's rate limit per authenticated sender and per recipient."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from streams.mail import Address, MailView, answer_address
from streams.testing import EPOCH, WorkflowHarness, mail_record

ANN = Address("ann@example.com", "Ann")


@pytest.mark.parametrize(
    ("reply_to", "allow", "expected"),
    [
        ((), (), "ann@example.com"),
        (("victim@elsewhere.example",), (), "ann@example.com"),  # backscatter refused
        (("team@example.com",), (), "team@example.com"),  # the sender's own domain
        (("team@support.example.com",), (), "team@support.example.com"),  # its subdomain
        (("x@example.com.attacker.example",), (), "ann@example.com"),  # a lookalike is not
        (("tickets@partner.example",), ("*@partner.example",), "tickets@partner.example"),
        (("Tickets@Partner.Example",), ("*@partner.example",), "Tickets@Partner.Example"),
        (("tickets@partner.example",), ("*@other.example",), "ann@example.com"),
    ],
)
def test_answer_address_honours_reply_to_only_in_the_senders_domain_or_allow_list(
    reply_to: tuple[str, ...], allow: tuple[str, ...], expected: str
) -> None:
    found = answer_address(
        ANN, tuple(Address(a) for a in reply_to), "<bounce@example.com>", reply_to_allow=allow
    )
    assert found is not None and found.address == expected


def test_answer_address_falls_back_to_the_return_path_and_never_to_a_null_one() -> None:
    assert answer_address(None, (), "<bounce@example.com>") == Address("bounce@example.com")
    assert answer_address(None, (), "<>") is None
    assert answer_address(None, (Address("victim@elsewhere.example"),), None) is None


def test_the_mail_view_and_its_thread_ref_use_the_rule() -> None:
    record = mail_record(sender=("Mallory", "m@example.com"), reply_to=["victim@elsewhere.example"])
    view = MailView.from_record(record)
    assert view.reply_address == Address("m@example.com", "Mallory")
    assert view.thread_ref().reply_address == view.reply_address
    allowed = MailView.from_record(record, reply_to_allow=["*@elsewhere.example"])
    assert allowed.reply_address == Address("victim@elsewhere.example")


# -- the pipeline ----------------------------------------------------------------------------

SETTINGS: dict[str, Any] = {
    "from_address": {"address": "help@example.com"},
    "auth_policy": "none",
    "rate_limit": {"max_replies": 3, "window_seconds": 3600},
    "rules": [{"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"}],
}


def at(seconds: float) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds)


def burst(n: int, **kw: Any) -> list[dict[str, Any]]:
    mails = [mail_record(subject=f"Issue {i}", observed_at=at(i / 1000), **kw) for i in range(n)]
    random.Random(n).shuffle(mails)  # as read from several partitions
    return mails


def recipients(harness: WorkflowHarness) -> list[str]:
    return [a["address"] for c in harness.commands for a in c["to"]]


def test_thirty_mails_of_one_sender_in_any_order_get_max_replies() -> None:
    harness = WorkflowHarness(SETTINGS)
    for record in burst(30):
        harness.deliver(record)
    assert len(harness.commands) == 3
    assert {e["attributes"]["guard"] for e in harness.events if e["status"] == "SKIPPED"} == {
        "rate_limit"
    }


def test_the_sender_is_counted_whoever_the_answer_goes_to() -> None:
    """The issue's probe: one sender, a different Reply-To per mail, one victim per reply."""
    harness = WorkflowHarness({**SETTINGS, "reply_to_allow": ["*@elsewhere.example"]})
    for i in range(6):
        harness.deliver(
            mail_record(
                subject=f"Spam {i}",
                reply_to=[f"victim{i}@elsewhere.example"],
                observed_at=at(i),
            )
        )
    assert len(recipients(harness)) == 3


def test_many_senders_answered_at_one_address_are_limited_per_recipient() -> None:
    harness = WorkflowHarness(SETTINGS)
    for i in range(10):
        harness.deliver(
            mail_record(
                sender=f"s{i}@example.com",
                subject=f"Issue {i}",
                reply_to=["shared@example.com"],
                observed_at=at(-i),  # newest first: the worst order for the old limiter
            )
        )
    assert recipients(harness) == ["shared@example.com"] * 3
    skips = [e["attributes"]["reason"] for e in harness.events if e["status"] == "SKIPPED"]
    assert skips and all("recipient/shared@example.com" in r for r in skips)


def test_a_recipient_over_the_limit_drops_the_whole_step_and_exempt_ones_are_not_limited() -> None:
    approval = {
        "from_address": {"address": "bot@example.com"},
        "auth_policy": "none",
        "rate_limit": {"max_replies": 2, "window_seconds": 3600},
        "rules": [{"match": {"recipient": "approvals@example.com"}, "workflow": "approval"}],
        "workflows": {"approval": {"options": {"approver": "boss@example.com"}}},
    }

    def requests(settings: dict[str, Any]) -> WorkflowHarness:
        harness = WorkflowHarness(settings)
        for i in range(4):
            harness.deliver(
                mail_record(
                    sender=f"r{i}@example.com", to=["approvals@example.com"], subject=f"R{i}"
                )
            )
        return harness

    limited = requests(approval)
    # Two forwards reached the approver; the third request got no forward and no
    # acknowledgement either (no "sent to the approver" for a forward that was not sent).
    assert [c["step"] for c in limited.commands] == ["request", "received"] * 2
    assert limited.statuses().count("APPROVAL_REQUESTED") == 2
    assert len([k for k in limited.tables.state if "/request/" in k]) == 2
    exempt = requests(
        {**approval, "rate_limit": {**approval["rate_limit"], "exempt_recipients": ["boss@*"]}}
    )
    assert [c["step"] for c in exempt.commands] == ["request", "received"] * 4
