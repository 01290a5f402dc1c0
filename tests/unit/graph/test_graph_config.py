"""The ``graph`` section: what it accepts, and the sentence it fails with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from connectors.graph.config import GraphSourceSettings

ACCOUNT = {"name": "support", "user": "support@contoso.com"}


def settings(**extra: Any) -> GraphSourceSettings:
    raw = {"tenant_id": "t", "client_id": "c", "accounts": [ACCOUNT], **extra}
    return GraphSourceSettings.model_validate(raw)


def test_a_secret_from_a_file_is_read_and_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("hunter2\n")
    s = settings(client_secret_file=str(secret))
    assert s.secret() == "hunter2"
    assert s.accounts[0].folders == ("inbox",) and s.accounts[0].start == "latest"
    inline = settings(client_secret="hunter2")
    assert "hunter2" not in repr(inline) and "hunter2" not in str(inline.model_dump())


@pytest.mark.parametrize(
    ("extra", "sentence"),
    [
        ({}, "auth client_secret needs client_secret or client_secret_file"),
        ({"auth": "client_certificate"}, "auth client_certificate needs certificate_file"),
        ({"auth": "refresh_token"}, "auth refresh_token needs refresh_token"),
        (
            {"client_secret": "s", "refresh_token": "r"},
            "refresh_token does not apply to auth client_secret",
        ),
        ({"client_secret": "s", "api_base": "http://graph.example"}, "http only on loopback"),
        ({"client_secret": "s", "client_secret_file": "/nonexistent"}, "not both"),
        ({"client_secret_file": "/nonexistent"}, "/nonexistent does not exist"),
        ({"client_secret": "s", "max_concurrent_requests": 5}, "less than or equal to 4"),
        ({"client_secret": "s", "accounts": []}, "list at least one account under graph.accounts"),
        (
            {"client_secret": "s", "accounts": [{**ACCOUNT, "folders": ["inbox", "Inbox"]}]},
            "each once",
        ),
        ({"client_secret": "s", "accounts": [{**ACCOUNT, "start": "now"}]}, "expected all"),
    ],
)
def test_a_misconfiguration_fails_with_a_sentence(extra: dict[str, Any], sentence: str) -> None:
    with pytest.raises(ValidationError) as failed:
        settings(**extra)
    assert sentence in str(failed.value)


def test_notification_modes_need_their_endpoint_and_a_client_state() -> None:
    hub = "EventHub:https://ns.servicebus.windows.net/eventhubname/mail-hub?tenantId=contoso.com"
    ok = settings(
        client_secret="s",
        notifications={
            "mode": "eventhubs",
            "event_hub_url": hub,
            "event_hubs": {"bootstrap_servers": "ns.servicebus.windows.net:9093"},
            "client_state": "12345678",
        },
    )
    assert ok.notifications.event_hub_name == "mail-hub"
    assert ok.notifications.notification_urls() == (hub, hub)
    hook = settings(
        client_secret="s",
        notifications={"mode": "webhook", "public_url": "https://x/", "client_state": "12345678"},
    )
    assert hook.notifications.notification_urls() == ("https://x/notify", "https://x/lifecycle")
    for notifications, sentence in (
        ({"mode": "webhook", "client_state": "12345678"}, "needs public_url"),
        ({"mode": "webhook", "public_url": "https://x"}, "client_state of 8-128"),
        ({"mode": "eventhubs", "client_state": "12345678", "event_hub_url": hub}, "event_hubs"),
    ):
        with pytest.raises(ValidationError) as failed:
            settings(client_secret="s", notifications=notifications)
        assert sentence in str(failed.value)
