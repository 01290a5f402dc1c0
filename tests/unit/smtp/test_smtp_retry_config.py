"""Retry planning, retry headers, the due gate, rate limiting, identities and the settings model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.core.config import config_from_dict
from connectors.core.errors import ConfigError
from connectors.smtp.config import RateLimit, SmtpSinkSettings, parse_duration
from connectors.smtp.identity import (
    command_id_from_message_id,
    command_id_from_verp,
    message_id_for,
    verp_address,
)
from connectors.smtp.ratelimit import SendRateLimiter, TokenBucket
from connectors.smtp.retry import (
    HEADER_ERROR_OFFSET,
    HEADER_ERROR_REASON,
    DueGate,
    GiveUp,
    Retry,
    RetryInfo,
    dlq_headers,
    plan_next,
)

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TIERS = [("5m", 300.0), ("15m", 900.0), ("1h", 3600.0), ("4h", 14400.0)]


@pytest.mark.parametrize(
    ("failed_attempt", "tier"), [(1, "5m"), (2, "15m"), (3, "1h"), (4, "4h"), (5, "4h"), (9, "4h")]
)
def test_each_failed_attempt_goes_to_its_tier(failed_attempt: int, tier: str) -> None:
    plan = plan_next(
        failed_attempt=failed_attempt,
        created_at=T0,
        now=T0,
        tiers=TIERS,
        max_lifetime=10 * 86400,
        max_attempts=10,
    )
    assert isinstance(plan, Retry)
    assert (plan.tier, plan.attempt) == (tier, failed_attempt + 1)
    assert plan.due == T0 + timedelta(seconds=dict(TIERS)[tier])


def test_gives_up_when_the_next_attempt_would_be_past_the_lifetime() -> None:
    plan = plan_next(
        failed_attempt=3,
        created_at=T0,
        now=T0 + timedelta(minutes=30),
        tiers=TIERS,
        max_lifetime=3600,
        max_attempts=10,
    )
    assert isinstance(plan, GiveUp) and "max lifetime" in plan.reason


def test_gives_up_after_max_attempts() -> None:
    plan = plan_next(
        failed_attempt=3, created_at=T0, now=T0, tiers=TIERS, max_lifetime=1e9, max_attempts=3
    )
    assert isinstance(plan, GiveUp) and "3 attempts" in plan.reason


def test_retry_headers_round_trip() -> None:
    info = RetryInfo(
        attempt=3, due_ms=1_764_000_000_000, recipients=("b@example.org",), last_error="451 x"
    )
    assert RetryInfo.from_headers(info.to_headers()) == info
    assert RetryInfo.from_headers(None) == RetryInfo()
    assert RetryInfo.from_headers(dict(info.to_headers())) == info


def test_dlq_headers_keep_the_original_and_add_the_error() -> None:
    headers = dict(
        dlq_headers(
            [("mailtap.attempt", b"4"), ("mailtap.error.reason", b"old")],
            reason="gave up",
            error_class="GiveUp",
            topic="mail.commands.retry.4h",
            partition=2,
            offset=41,
        )
    )
    assert headers["mailtap.attempt"] == b"4"
    assert headers[HEADER_ERROR_REASON] == b"gave up"
    assert headers[HEADER_ERROR_OFFSET] == b"41"


def test_due_gate_releases_only_what_is_due() -> None:
    gate = DueGate()
    gate.hold("retry.5m", 0, 1000)
    gate.hold("retry.1h", 1, 5000)
    assert gate.next_due_ms() == 1000
    assert gate.release_due(999) == []
    assert gate.release_due(1000) == [("retry.5m", 0)]
    gate.forget([("retry.1h", 1)])
    assert gate.paused == {}


def test_token_bucket_waits_once_the_burst_is_spent() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, capacity=2, clock=lambda: now[0])
    assert [bucket.try_take() for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 10.0
    assert bucket.try_take() == 0.0


@given(st.text(min_size=1, max_size=80))
def test_identities_are_reversible(command_id: str) -> None:
    assert command_id_from_message_id(message_id_for(command_id, "Example.COM")) == command_id
    verp = verp_address(command_id, "bounces.example.com")
    assert command_id_from_verp(verp, "bounces.example.com") == command_id
    assert command_id_from_verp(verp, "other.example") is None


def test_foreign_message_ids_are_not_ours() -> None:
    assert command_id_from_message_id("<CAF=x@mail.gmail.com>") is None


def test_durations() -> None:
    assert [parse_duration(v) for v in ("500ms", "30s", "5m", "4h", "2d")] == [
        0.5,
        30.0,
        300.0,
        14400.0,
        172800.0,
    ]
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("5 minutes")


def test_settings_errors_name_the_key() -> None:
    cfg = config_from_dict(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
            "smtp": {
                "host": "relay",
                "from_address": "a@example.com",
                "retry_tiers": ["1h", "5m"],
                "prot": 1,
            },
        }
    )
    with pytest.raises(ConfigError) as caught:
        cfg.section("smtp", SmtpSinkSettings)
    text = str(caught.value)
    assert "smtp.retry_tiers" in text and "increasing order" in text
    assert "smtp.prot" in text


def test_password_is_secret() -> None:
    settings = SmtpSinkSettings(
        host="relay", from_address="a@example.com", username="u", password="hunter2"
    )
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings)
    with pytest.raises(ValueError, match="username is required"):
        SmtpSinkSettings(host="relay", from_address="a@example.com", password="x")


async def test_rate_limiter_per_domain_and_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("connectors.smtp.ratelimit.asyncio.sleep", fake_sleep)
    limiter = SendRateLimiter(
        RateLimit(per_minute=600, burst=100),
        {"slow.example": RateLimit(per_minute=60, burst=1)},
    )
    await limiter.acquire(["a@slow.example"])
    await limiter.acquire(["b@fast.example", "c@fast.example"])
    assert waits == []
    await limiter.acquire(["d@SLOW.example"])
    assert len(waits) == 1 and 0.9 < waits[0] <= 1.0  # one token per second for slow.example


def test_lifetime_shorter_than_the_first_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="raise max_lifetime"):
        SmtpSinkSettings(
            host="relay", from_address="a@example.com", retry_tiers=["1h"], max_lifetime="30m"
        )


async def test_rate_limiter_refuses_a_wait_longer_than_max_wait() -> None:
    limiter = SendRateLimiter(None, {"*": RateLimit(per_minute=6, burst=1)})
    assert await limiter.acquire(["a@slow.example"], max_wait=1.0) is True
    # The next token of slow.example comes in 10 s: refused, and nothing taken.
    assert await limiter.acquire(["b@slow.example"], max_wait=1.0) is False
    assert await limiter.acquire(["c@other.example"], max_wait=1.0) is True
