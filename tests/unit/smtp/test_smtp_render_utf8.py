"""RFC 6531/6532 rendering: a non-ASCII local part makes an SMTPUTF8 message with UTF-8 headers;
everything else stays ASCII (IDNA domains, RFC 2047 words)."""

from __future__ import annotations

from datetime import UTC, datetime
from email import message_from_string, policy
from typing import Any

import pytest

from connectors.smtp.classify import DeliveryStatus, classify_error
from connectors.smtp.errors import RenderError, SmtpStage, SmtpUtf8UnsupportedError
from connectors.smtp.render import normalize_address, render


def command(to: str, **overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "command_id": "c0ffee",
        "from": {"name": "Zoë", "address": "support@example.com"},
        "to": [{"name": "李雷", "address": to}],
        "subject": "回复: 订单",
        "text_body": "好的",
        "created_at": datetime(2026, 12, 2, tzinfo=UTC),
    }
    value.update(overrides)
    return value


def test_non_ascii_local_part_renders_utf8_headers() -> None:
    out = render(command("用户@例子.广告"))
    assert out.smtputf8 and out.recipients == ("用户@例子.广告",)
    head = out.data.partition(b"\r\n\r\n")[0]
    assert "To: 李雷 <用户@例子.广告>".encode() in head
    assert "Subject: 回复: 订单".encode() in head and b"=?" not in head
    assert b"Message-ID: <mailtap.c0ffee@example.com>" in head  # ASCII whatever the addresses
    msg = message_from_string(out.data.decode("utf-8"), policy=policy.default)
    assert msg["From"].addresses[0].display_name == "Zoë"


def test_ascii_local_part_at_idn_domain_stays_ascii() -> None:
    out = render(command("Kunde@Bücher.example"))
    assert not out.smtputf8 and out.recipients == ("Kunde@xn--bcher-kva.example",)
    head = out.data.partition(b"\r\n\r\n")[0]
    assert head.isascii() and b"=?utf-8?" in head  # display name and subject as RFC 2047


def test_non_ascii_sender_domain_gives_an_ascii_message_id() -> None:
    out = render(command("用户@例子.广告", **{"from": {"name": None, "address": "客服@例子.广告"}}))
    assert out.message_id == "mailtap.c0ffee@xn--fsqu00a.xn--4rr70v"


@pytest.mark.parametrize("bad", ["用 户@例子.广告", "用户.@例子.广告", "用户@例子..广告"])
def test_invalid_utf8_addresses_are_refused(bad: str) -> None:
    with pytest.raises(RenderError):
        normalize_address(bad, "to", utf8=True)


def test_non_ascii_local_part_needs_utf8() -> None:
    with pytest.raises(RenderError, match="needs SMTPUTF8"):
        normalize_address("用户@例子.广告", "to")


def test_relay_without_smtputf8_is_a_failed_5_6_7() -> None:
    exc = SmtpUtf8UnsupportedError("the relay does not offer SMTPUTF8", stage=SmtpStage.ENVELOPE)
    (outcome,) = classify_error(["用户@例子.广告"], exc)
    assert (outcome.status, outcome.enhanced_status) == (DeliveryStatus.FAILED, "5.6.7")
    assert "SMTPUTF8" in (outcome.diagnostic or "")


def test_long_utf8_headers_fold_within_the_line_limit_and_read_back() -> None:
    subject, name = "回复" * 150, "李雷" * 30
    cmd = command("用户@例子.广告", subject=subject)
    cmd["to"][0]["name"] = name
    out = render(cmd)
    head = out.data.partition(b"\r\n\r\n")[0]
    # RFC 5322 2.1.1: 998 octets at most; a word too long to fold within 78 characters is sent
    # as RFC 2047 encoded words, which RFC 6532 keeps valid.
    assert max(len(line) for line in head.split(b"\r\n")) <= 998
    msg = message_from_string(out.data.decode("utf-8"), policy=policy.default)
    assert msg["Subject"] == subject
    assert msg["To"].addresses[0].display_name == name
