"""Settings validation and the cursor of the Exchange source."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from pydantic import ValidationError

from connectors.core.config import config_from_dict
from connectors.core.errors import ConfigError
from connectors.core.kafka.offsets import canonical_json
from connectors.ews.config import EwsAccountSettings, EwsSourceSettings
from connectors.ews.cursor import EPOCH, MAX_ITEMS_BYTES, MAX_RECENT, EwsCursor, item_digest

T0 = dt.datetime(2026, 11, 29, 16, 0, tzinfo=dt.UTC)
MARGIN = dt.timedelta(minutes=5)


def account(**overrides: Any) -> dict[str, Any]:
    base = {
        "name": "ops",
        "service_endpoint": "https://mail.example.com/EWS/Exchange.asmx",
        "email": "ops@example.com",
        "auth": "ntlm",
        "username": "EXAMPLE\\ops",
        "password": "pw",
    }
    base.update(overrides)
    return base


def test_minimal_ntlm_account_defaults() -> None:
    a = EwsAccountSettings.model_validate(account())
    assert a.folders == ("inbox",)
    assert a.start == "latest"
    assert a.login == "EXAMPLE\\ops"
    assert "pw" not in repr(a)


def test_login_defaults_to_email() -> None:
    assert EwsAccountSettings.model_validate(account(username=None)).login == "ops@example.com"


@pytest.mark.parametrize(
    "endpoint",
    ["http://mail.example.com/EWS/Exchange.asmx", "ftp://x/EWS", "mail.example.com"],
)
def test_plain_http_is_refused_except_on_loopback(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="https"):
        EwsAccountSettings.model_validate(account(service_endpoint=endpoint))


def test_plain_http_on_loopback_is_allowed_for_tests() -> None:
    url = "http://127.0.0.1:8080/EWS/Exchange.asmx"
    assert EwsAccountSettings.model_validate(account(service_endpoint=url)).service_endpoint == url


def test_basic_needs_a_password() -> None:
    with pytest.raises(ValidationError, match="needs a password"):
        EwsAccountSettings.model_validate(account(auth="basic", password=None))


def test_oauth2_needs_https() -> None:
    url = "http://127.0.0.1:8080/EWS/Exchange.asmx"
    with pytest.raises(ValidationError, match="https"):
        EwsAccountSettings.model_validate(
            account(auth="oauth2", password=None, oauth2_access_token="t", service_endpoint=url)
        )


def test_oauth2_with_a_token() -> None:
    a = EwsAccountSettings.model_validate(
        account(auth="oauth2", password=None, oauth2_access_token="tok")
    )
    assert a.oauth2_access_token is not None
    assert a.oauth2_access_token.get_secret_value() == "tok"


def test_oauth2_with_client_credentials() -> None:
    creds = {"oauth2_client_id": "c", "oauth2_client_secret": "s", "oauth2_tenant_id": "t"}
    a = EwsAccountSettings.model_validate(account(auth="oauth2", password=None, **creds))
    assert a.oauth2_client_id == "c"


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"oauth2_access_token": "tok", "oauth2_client_id": "c"},
        {"oauth2_client_id": "c", "oauth2_client_secret": "s"},
        {"oauth2_access_token": "tok", "password": "pw"},
    ],
)
def test_oauth2_needs_exactly_one_credential_kind(extra: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        EwsAccountSettings.model_validate({**account(auth="oauth2", password=None), **extra})


def test_unknown_folder_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown folder"):
        EwsAccountSettings.model_validate(account(folders=["Inbox/Sub"]))


def test_bad_start_is_refused() -> None:
    with pytest.raises(ValidationError, match="since"):
        EwsAccountSettings.model_validate(account(start="since:yesterday"))


def test_no_account_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least one account"):
        EwsSourceSettings.model_validate({"accounts": []})


def test_one_connection_is_refused() -> None:
    with pytest.raises(ValidationError):
        EwsSourceSettings.model_validate({"accounts": [account()], "max_connections": 1})


def test_section_errors_name_the_key_and_hide_secrets() -> None:
    cfg = config_from_dict(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
            "ews": {"accounts": [account(password="hunter2", connection_timeout_minutes=3)]},
        }
    )
    with pytest.raises(ConfigError) as info:
        cfg.section("ews", EwsSourceSettings)
    assert "ews.accounts[0].connection_timeout_minutes" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_connection_timeout_is_within_the_ews_range() -> None:
    with pytest.raises(ValidationError):
        EwsSourceSettings.model_validate(
            {"accounts": [account()], "connection_timeout_minutes": 31}
        )


# --- cursor -----------------------------------------------------------------------------------


def test_cursor_round_trips_through_the_offset_json() -> None:
    cursor = EwsCursor("sub-1", T0, {"a": 1, "b": 2})
    assert EwsCursor.from_offset(cursor.to_offset()) == cursor
    assert cursor.to_offset() == {
        "subscription_id": "sub-1",
        "watermark": "2026-11-29T16:00:00+00:00",
        "recent": {"a": 1, "b": 2},
        "items": {},
        "complete": True,
    }


def test_cursor_without_subscription_round_trips() -> None:
    cursor = EwsCursor(None, EPOCH)
    assert EwsCursor.from_offset(cursor.to_offset()) == cursor


def test_advancing_moves_the_watermark_and_forgets_items_outside_the_margin() -> None:
    cursor = EwsCursor("s", T0).advanced([("old", T0)], MARGIN)
    later = T0 + dt.timedelta(minutes=6)
    cursor = cursor.advanced([("new", later)], MARGIN)
    assert cursor.watermark == later
    assert cursor.knows("new") and not cursor.knows("old")
    assert cursor.catchup_since(MARGIN) == later - MARGIN


def test_an_older_item_does_not_move_the_watermark_back() -> None:
    cursor = EwsCursor("s", T0).advanced([("late", T0 - dt.timedelta(minutes=1))], MARGIN)
    assert cursor.watermark == T0
    assert cursor.knows("late")


def test_catchup_never_starts_before_the_epoch() -> None:
    assert EwsCursor(None, EPOCH).catchup_since(MARGIN) == EPOCH


def test_subscription_change_keeps_watermark_and_recent() -> None:
    cursor = EwsCursor("s", T0, {"a": 1}).with_subscription(None)
    assert cursor == EwsCursor(None, T0, {"a": 1})


def test_recent_is_capped_keeping_the_newest() -> None:
    items = [(f"id-{n}", T0 + dt.timedelta(milliseconds=50 * n)) for n in range(MAX_RECENT + 10)]
    cursor = EwsCursor("s", T0).advanced(items, MARGIN)
    assert len(cursor.recent) == MAX_RECENT
    assert cursor.knows(f"id-{MAX_RECENT + 9}") and not cursor.knows("id-0")


def test_items_remember_the_key_and_change_of_each_published_item_by_digest() -> None:
    cursor = EwsCursor("s", T0).tracking(
        [("AAMk-1", "ck-1", "ops/mid:a@b", T0), ("AAMk-2", "ck-1", "", T0)]
    )
    restored = EwsCursor.from_offset(json.loads(json.dumps(cursor.to_offset())))
    assert restored == cursor and restored.complete
    first = restored.tracked("AAMk-1")
    assert first is not None and first.published and first.key == "ops/mid:a@b"
    assert restored.tracked("AAMk-2") is not None and not restored.tracked("AAMk-2").published
    assert "AAMk-1" not in json.dumps(cursor.to_offset())  # digests only
    assert item_digest("AAMk-1") in cursor.to_offset()["items"]
    changed = restored.tracking([("AAMk-1", "ck-2", "ops/mid:a@b", T0)])
    assert changed.tracked("AAMk-1") != first
    assert restored.holds_key("ops/mid:a@b") and not restored.forgetting(
        [item_digest("AAMk-1")]
    ).holds_key("ops/mid:a@b")


def test_items_over_the_size_cap_forget_the_oldest_and_are_no_longer_complete() -> None:
    key = "ops/mid:" + "x" * 60 + "@example.org"
    count = MAX_ITEMS_BYTES // 100 + 10
    seen = [(f"id-{n}", "ck", key, T0 + dt.timedelta(seconds=n)) for n in range(count)]
    cursor = EwsCursor("s", T0).tracking(seen)
    assert not cursor.complete
    assert cursor.tracked(f"id-{count - 1}") is not None and cursor.tracked("id-0") is None
    assert len(canonical_json(cursor.to_offset()["items"])) <= MAX_ITEMS_BYTES


def test_a_cursor_from_before_items_existed_is_not_complete() -> None:
    old = {"subscription_id": "s", "watermark": T0.isoformat(), "recent": {"a": 1}}
    cursor = EwsCursor.from_offset(old)
    assert cursor.items == {} and not cursor.complete
