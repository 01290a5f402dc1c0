"""One named case per SMTP situation in issue 4."""

from __future__ import annotations

import pytest

from connectors.core.errors import Disposition
from connectors.smtp.classify import (
    DeliveryStatus,
    SmtpReply,
    TransactionReport,
    classify_error,
    classify_report,
)
from connectors.smtp.errors import (
    RenderError,
    SmtpAuthError,
    SmtpDisconnectedError,
    SmtpReplyError,
    SmtpStage,
    SmtpTimeoutError,
    sink_disposition,
)

pytestmark = pytest.mark.unit
RCPTS = ["a@example.org", "b@example.org"]


def test_250_is_sent() -> None:
    outcomes = classify_report(
        RCPTS, TransactionReport({}, SmtpReply(250, "2.0.0 Ok: queued as 4F"))
    )
    assert [(o.status, o.smtp_code, o.enhanced_status) for o in outcomes] == [
        (DeliveryStatus.SENT, 250, "2.0.0")
    ] * 2


@pytest.mark.parametrize(
    ("code", "text", "enhanced"),
    [
        (421, "4.3.2 Service shutting down", "4.3.2"),
        (450, "4.2.1 Mailbox busy", "4.2.1"),
        (451, "4.3.0 Local error in processing", "4.3.0"),
        (452, "4.5.3 Too many recipients", "4.5.3"),
    ],
)
def test_4xx_after_data_is_deferred(code: int, text: str, enhanced: str) -> None:
    (outcome,) = classify_report(["a@example.org"], TransactionReport({}, SmtpReply(code, text)))
    assert outcome.status is DeliveryStatus.DEFERRED
    assert (outcome.smtp_code, outcome.enhanced_status) == (code, enhanced)
    assert outcome.diagnostic == f"{code} {text}"


@pytest.mark.parametrize(
    ("code", "text", "enhanced"),
    [
        (550, "5.1.1 User unknown", "5.1.1"),
        (552, "5.3.4 Message too big", "5.3.4"),
        (554, "5.7.1 Rejected by policy", "5.7.1"),
    ],
)
def test_5xx_is_failed(code: int, text: str, enhanced: str) -> None:
    (outcome,) = classify_report(["a@example.org"], TransactionReport({}, SmtpReply(code, text)))
    assert (outcome.status, outcome.smtp_code, outcome.enhanced_status) == (
        DeliveryStatus.FAILED,
        code,
        enhanced,
    )


@pytest.mark.parametrize(
    ("code", "status"), [(451, DeliveryStatus.DEFERRED), (554, DeliveryStatus.FAILED)]
)
def test_mail_from_reply_applies_to_all(code: int, status: DeliveryStatus) -> None:
    exc = SmtpReplyError(code, "sender refused", stage=SmtpStage.ENVELOPE)
    assert {o.status for o in classify_error(RCPTS, exc)} == {status}


def test_421_greeting_is_deferred() -> None:
    exc = SmtpReplyError(421, "4.7.0 Try again later", stage=SmtpStage.CONNECT)
    outcomes = classify_error(RCPTS, exc)
    assert {(o.status, o.smtp_code, o.enhanced_status) for o in outcomes} == {
        (DeliveryStatus.DEFERRED, 421, "4.7.0")
    }


def test_partial_refusal_gives_one_outcome_per_recipient() -> None:
    report = TransactionReport(
        {"B@example.org": SmtpReply(550, "5.1.1 <b@example.org>: user unknown")},
        SmtpReply(250, "2.0.0 queued"),
    )
    a, b = classify_report(RCPTS, report)
    assert (a.recipient, a.status) == ("a@example.org", DeliveryStatus.SENT)
    assert (b.recipient, b.status, b.enhanced_status) == (
        "b@example.org",
        DeliveryStatus.FAILED,
        "5.1.1",
    )


def test_all_refused_without_data() -> None:
    report = TransactionReport(
        {"a@example.org": SmtpReply(450, "busy"), "b@example.org": SmtpReply(550, "unknown")}, None
    )
    assert [o.status for o in classify_report(RCPTS, report)] == [
        DeliveryStatus.DEFERRED,
        DeliveryStatus.FAILED,
    ]


def test_disconnect_before_data_is_deferred() -> None:
    exc = SmtpDisconnectedError("connection reset", stage=SmtpStage.ENVELOPE)
    assert {o.status for o in classify_error(RCPTS, exc)} == {DeliveryStatus.DEFERRED}


@pytest.mark.parametrize("stage", [SmtpStage.CONNECT, SmtpStage.ENVELOPE, SmtpStage.DATA])
def test_timeout_before_final_dot_is_deferred(stage: SmtpStage) -> None:
    (outcome,) = classify_error(["a@example.org"], SmtpTimeoutError("timed out", stage=stage))
    assert outcome.status is DeliveryStatus.DEFERRED
    assert outcome.diagnostic is not None and outcome.diagnostic.startswith("timeout before")


def test_timeout_after_final_dot_is_unknown() -> None:
    (outcome,) = classify_error(
        ["a@example.org"], SmtpTimeoutError("timed out", stage=SmtpStage.AFTER_DATA)
    )
    assert outcome.status is DeliveryStatus.UNKNOWN
    assert not outcome.status.final


def test_disconnect_after_final_dot_is_unknown() -> None:
    exc = SmtpDisconnectedError("eof", stage=SmtpStage.AFTER_DATA)
    assert {o.status for o in classify_error(RCPTS, exc)} == {DeliveryStatus.UNKNOWN}


def test_auth_failure_keeps_the_message() -> None:
    (outcome,) = classify_error(["a@example.org"], SmtpAuthError(535, "5.7.8 bad credentials"))
    assert outcome.status is DeliveryStatus.DEFERRED
    assert sink_disposition(SmtpAuthError(535, "x")) is Disposition.PERMANENT


@pytest.mark.parametrize(
    ("exc", "disposition"),
    [
        (RenderError("bad"), Disposition.DATA),
        (SmtpReplyError(554, "no", stage=SmtpStage.CONNECT), Disposition.PERMANENT),
        (SmtpReplyError(421, "later", stage=SmtpStage.CONNECT), Disposition.RETRY),
        (SmtpTimeoutError("t", stage=SmtpStage.DATA), Disposition.RETRY),
        (ConnectionResetError(), Disposition.RETRY),
    ],
)
def test_process_disposition(exc: BaseException, disposition: Disposition) -> None:
    assert sink_disposition(exc) is disposition
