"""Settings of the imap section: validated at start, errors name the key, secrets stay hidden."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from connectors.core.config import config_from_dict
from connectors.core.errors import ConfigError
from connectors.imap.config import ImapSourceSettings

ACCOUNT = {"name": "a", "host": "imap.example.com", "username": "u", "password": "hunter2"}
OAUTH2 = {
    "token_url": "https://login.example.com/tenant/oauth2/v2.0/token",
    "client_id": "app",
    "client_secret": "hunter2",
    "scope": "https://outlook.office365.com/.default",
}


def settings(**account: object) -> ImapSourceSettings:
    raw = {"kafka": {"bootstrap_servers": "k:9092"}, "imap": {"accounts": [{**ACCOUNT, **account}]}}
    return config_from_dict(raw).section("imap", ImapSourceSettings)


def test_defaults_are_the_safe_ones() -> None:
    account = settings().accounts[0]
    assert account.security == "ssl" and account.effective_port == 993
    assert account.start == "latest" and account.mode == "idle" and account.after_commit == "none"
    assert settings(security="starttls").accounts[0].effective_port == 143
    assert settings(start="since:2026-02-01").accounts[0].start_since == dt.date(2026, 2, 1)
    assert settings(after_commit="move:Done").accounts[0].move_target == "Done"
    renew = settings().idle_renew_seconds
    assert renew < 29 * 60  # RFC 2177 servers may drop IDLE after 30 minutes


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"start": "yesterday"}, "imap.accounts[0].start"),
        ({"start": "since:31/01/2026"}, "ISO date"),
        ({"after_commit": "delete"}, "imap.accounts[0].after_commit"),
        ({"security": "tls"}, "imap.accounts[0].security"),
        ({"password": None}, "exactly one of password, oauth2_access_token, oauth2_access"),
        ({"oauth2_access_token": "tok"}, "exactly one of password, oauth2_access_token, "),
        ({"password": None, "oauth2": {**OAUTH2, "token_url": "http://idp/token"}}, "https://"),
        ({"oauth2": OAUTH2}, "or oauth2"),
        (
            {"password": None, "oauth2_access_token_file": "/nonexistent/token"},
            "oauth2_access_token_file /nonexistent/token does not exist; write the token there",
        ),
        ({"after_commit": "move:INBOX"}, "must not be a watched folder"),
        ({"folders": []}, "at least one folder"),
        ({"colour": "blue"}, "imap.accounts[0].colour"),
    ],
)
def test_misconfiguration_fails_with_the_key_path(
    override: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        settings(**override)
    assert fragment in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_oauth2_token_instead_of_password_and_secrets_masked() -> None:
    account = settings(password=None, oauth2_access_token="tok-123").accounts[0]
    assert account.oauth2_access_token is not None
    assert "tok-123" not in repr(account) and "tok-123" not in str(account)


def test_duplicate_account_names_are_rejected() -> None:
    raw = {"kafka": {"bootstrap_servers": "k:9092"}, "imap": {"accounts": [ACCOUNT, ACCOUNT]}}
    with pytest.raises(ConfigError, match="account names must be unique"):
        config_from_dict(raw).section("imap", ImapSourceSettings)


def test_oauth2_token_file_instead_of_password(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-123\n")
    account = settings(password=None, oauth2_access_token_file=str(token)).accounts[0]
    assert account.oauth2_access_token_file == token


def test_oauth2_client_credentials_instead_of_password() -> None:
    account = settings(password=None, oauth2=OAUTH2).accounts[0]
    assert account.oauth2 is not None and account.oauth2.client_id == "app"
    assert "hunter2" not in repr(account)


def test_an_imap_only_dlq_topic_is_refused_with_the_setting_to_use() -> None:
    raw = {
        "kafka": {"bootstrap_servers": "k:9092"},
        "imap": {"accounts": [ACCOUNT], "dlq_topic": "imap.dlq"},
    }
    with pytest.raises(ConfigError, match=r"set kafka\.topics\.dlq instead"):
        config_from_dict(raw).section("imap", ImapSourceSettings)
