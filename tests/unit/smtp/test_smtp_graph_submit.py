"""The Graph transport's pure parts: the MIME it submits, what Graph's answers mean, and the
settings it refuses at start."""

from __future__ import annotations

import base64
import email
import email.policy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from connectors.smtp.classify import DeliveryStatus
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.graphsubmit import refused, request_body, submission_mime, unanswered
from connectors.smtp.render import render


def reply(**overrides: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "command_id": "c-1",
        "from": {"name": "Support", "address": "support@example.com"},
        "to": [{"name": "A", "address": "a@example.org"}],
        "cc": [{"name": None, "address": "c@example.org"}],
        "bcc": [{"name": None, "address": "audit@example.org"}],
        "reply_to": [],
        "subject": "Re: order 42",
        "text_body": "Thanks.",
        "html_body": None,
        "attachments": [],
        "in_reply_to": "orig@example.org",
        "references": [],
        "auto_submitted": "auto-replied",
        "created_at": datetime(2026, 12, 5, tzinfo=UTC),
    }
    value.update(overrides)
    return value


def parsed(data: bytes) -> email.message.EmailMessage:
    message = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(message, email.message.EmailMessage)
    return message


def test_bcc_recipients_are_written_as_a_bcc_header_and_the_body_is_kept() -> None:
    rendered = render(reply())
    mime = submission_mime(rendered)
    message = parsed(mime)
    assert message["Bcc"] == "audit@example.org"
    assert message["To"] == "A <a@example.org>" and message["Cc"] == "c@example.org"
    assert message["In-Reply-To"] == "<orig@example.org>"
    assert mime.split(b"\r\n\r\n", 1)[1] == rendered.data.split(b"\r\n\r\n", 1)[1]
    assert base64.b64decode(request_body(rendered)) == mime


def test_a_message_whose_headers_name_its_recipients_goes_byte_for_byte() -> None:
    rendered = render(reply(bcc=[]))
    assert submission_mime(rendered) == rendered.data


def test_recipients_not_sent_to_this_time_leave_the_headers() -> None:
    """A retry of the pending recipients (or one without a suppressed address) must not reach
    the others: Exchange sends to whoever the MIME headers name."""
    rendered = render(reply(), recipients=["c@example.org"])
    message = parsed(submission_mime(rendered))
    assert message["To"] is None and message["Bcc"] is None
    assert message["Cc"] == "c@example.org"


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (429, "TooManyRequests", DeliveryStatus.DEFERRED),
        (503, "serviceNotAvailable", DeliveryStatus.DEFERRED),
        (504, "generalException", DeliveryStatus.DEFERRED),
        (401, "InvalidAuthenticationToken", DeliveryStatus.DEFERRED),
        (403, "ErrorAccessDenied", DeliveryStatus.DEFERRED),
        (404, "MailboxNotEnabledForRESTAPI", DeliveryStatus.DEFERRED),
        (400, "ErrorInvalidRecipients", DeliveryStatus.FAILED),
        (400, "ErrorMimeContentInvalidBase64String", DeliveryStatus.FAILED),
        (413, "RequestEntityTooLarge", DeliveryStatus.FAILED),
        (500, "generalException", DeliveryStatus.UNKNOWN),
    ],
)
def test_graph_answers_per_recipient(status: int, code: str, expected: DeliveryStatus) -> None:
    outcomes = refused(["a@example.org", "b@example.org"], status, code, "text")
    assert [o.status for o in outcomes] == [expected, expected]
    assert all(f"{status} {code}" in (o.diagnostic or "") for o in outcomes)
    assert all(o.smtp_code is None for o in outcomes)  # an HTTP status is not an SMTP code


def test_no_answer_is_unknown_only_once_the_request_went_out() -> None:
    assert unanswered(["a@x.org"], "w", maybe_sent=True)[0].status is DeliveryStatus.UNKNOWN
    assert unanswered(["a@x.org"], "w", maybe_sent=False)[0].status is DeliveryStatus.DEFERRED


GRAPH = {"tenant_id": "t", "client_id": "c", "client_secret": "s", "user": "u@example.com"}


def settings(**smtp: Any) -> SmtpSinkSettings:
    return SmtpSinkSettings.model_validate({"from_address": "u@example.com", **smtp})


def test_transport_graph_needs_no_relay_host() -> None:
    assert settings(transport="graph", graph=GRAPH).transport == "graph"


@pytest.mark.parametrize(
    ("smtp", "sentence"),
    [
        ({"transport": "graph"}, "transport graph needs the graph block"),
        ({"transport": "graph", "graph": GRAPH, "pool_size": 8}, "set pool_size to 4 or less"),
        (
            {"transport": "graph", "graph": GRAPH, "verp_domain": "b.example.com"},
            "remove verp_domain",
        ),
        (
            {"transport": "graph", "graph": {**GRAPH, "client_secret": None}},
            "set exactly one of client_secret, client_secret_file or certificate_file",
        ),
        ({"transport": "smtp"}, "host is required with transport smtp"),
        ({"host": "relay", "graph": GRAPH}, "graph applies to transport graph only"),
    ],
)
def test_misconfigurations_are_refused_with_a_sentence(
    smtp: dict[str, Any], sentence: str, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match=sentence):
        settings(**smtp)


def test_an_exchange_online_ndr_of_a_graph_sent_reply_correlates_to_its_command() -> None:
    """How a bounce comes back on the Graph path: Exchange Online's NDR in the sending mailbox
    (as tests/graph_server writes it, RFC 3464 with the original's headers), read by the bounce
    reader, names the command by the reply's own Message-ID (no VERP on this path)."""
    from connectors.smtp.bounce import BounceType, parse_bounce
    from tests.graph_server.sendmail import Bounce, non_delivery_report

    rendered = render(reply(bcc=[]))
    ndr = non_delivery_report(
        "support@example.com",
        "a@example.org",
        Bounce("5.1.1", "550 5.1.1 RESOLVER.ADR.RecipNotFound; not found"),
        submission_mime(rendered),
    )
    [bounce] = parse_bounce(ndr)
    assert bounce.recipient == "a@example.org"
    assert bounce.command_id == "c-1"
    assert bounce.bounce_type is BounceType.HARD
    assert bounce.status == "5.1.1"
