"""The wire adapter without a server: error translation, IDLE answers, the #565 early-empty case."""

from __future__ import annotations

import doctest
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from imapclient import exceptions as imap_exc

from connectors.core.errors import AuthenticationError, Disposition, classify
from connectors.imap import connection as connection_module
from connectors.imap import idle, search
from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection, parse_copyuid
from connectors.imap.errors import ConnectionLost, ImapProtocolError
from connectors.imap.idle import IdleOutcome, classify_untagged, idle_until
from connectors.imap.wire import wire


@pytest.mark.parametrize("module", [connection_module, idle, search])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    ("raised", "expected", "disposition"),
    [
        (imap_exc.LoginError("bad"), AuthenticationError, Disposition.PERMANENT),
        (imap_exc.IMAPClientAbortError("socket error: EOF"), ConnectionLost, Disposition.RETRY),
        (TimeoutError("timed out"), ConnectionLost, Disposition.RETRY),
        (ConnectionResetError(104, "reset"), ConnectionLost, Disposition.RETRY),
        (ssl.SSLCertVerificationError("self-signed"), ConnectionLost, Disposition.PERMANENT),
        (imap_exc.IMAPClientError("NO [SERVERBUG]"), ImapProtocolError, Disposition.RETRY),
    ],
)
def test_library_errors_become_ours_and_classify_from_the_cause_chain(
    raised: Exception, expected: type[Exception], disposition: Disposition
) -> None:
    with pytest.raises(expected) as caught, wire("fetch"):
        raise raised
    assert caught.value.__cause__ is raised
    assert classify(caught.value) is disposition


@pytest.mark.parametrize(
    ("responses", "flags"),
    [
        ([(3, b"EXISTS")], (True, False, False, False)),
        ([(2, b"EXPUNGE")], (False, True, False, False)),
        ([(1, b"FETCH", (b"FLAGS", (b"\\Seen",)))], (False, False, True, False)),
        ([(b"OK", b"Still here"), (4, b"RECENT")], (False, False, False, False)),
        ([(b"VANISHED", 41)], (False, True, False, False)),  # RFC 7162: EXPUNGE under QRESYNC
        ([(b"XUNKNOWN", 41)], (False, False, False, True)),
    ],
)
def test_idle_answers_are_classified(
    responses: list[tuple[Any, ...]], flags: tuple[bool, ...]
) -> None:
    outcome = classify_untagged(responses)
    assert (outcome.new_mail, outcome.expunged, outcome.flags_changed, outcome.other) == flags


def test_bye_is_a_dead_connection() -> None:
    with pytest.raises(ConnectionLost, match="BYE"):
        classify_untagged([(b"BYE", b"Server shutting down")])


def test_a_uidvalidity_response_code_ends_idle_for_a_sync() -> None:
    # RFC 3501 7.1: "* OK [UIDVALIDITY n]" may announce a new UIDVALIDITY; a keep-alive does not.
    client = FakeClient([[(b"OK", b"Still here")], [(b"OK", b"[UIDVALIDITY 42] changed")]])
    outcome = idle_for(client, lambda: False)
    assert outcome.other
    assert client.calls == ["idle", "idle_check", "idle_check", "idle_done"]


class FakeClient:
    """Just enough of IMAPClient for idle_until(); ``told``: what the way into IDLE answered
    (the NOOP sent with it, :class:`~connectors.imap.idle.NoopThenIdle`)."""

    def __init__(
        self,
        checks: list[list[tuple[Any, ...]]],
        done_error: Exception | None = None,
        told: list[tuple[Any, ...]] | None = None,
    ) -> None:
        self.checks = checks
        self.done_error = done_error
        self.told = told or []
        self.calls: list[str] = []

    def idle(self) -> list[tuple[Any, ...]]:
        self.calls.append("idle")
        return self.told

    def idle_check(self, timeout: float) -> list[tuple[Any, ...]]:
        self.calls.append("idle_check")
        return self.checks.pop(0) if self.checks else []

    def idle_done(self) -> tuple[bytes, list[tuple[Any, ...]]]:
        self.calls.append("idle_done")
        if self.done_error is not None:
            raise self.done_error
        return b"Idle completed", []

    def noop(self) -> tuple[bytes, list[tuple[Any, ...]]]:
        self.calls.append("noop")
        return b"NOOP completed", []


def connection(client: FakeClient) -> ImapConnection:
    account = ImapAccountSettings(name="a", host="h", username="u", password="p")  # type: ignore[arg-type]
    conn = ImapConnection(account, connect_timeout=1, read_timeout=1)
    conn._client = client  # type: ignore[assignment]
    return conn


def idle_for(client: FakeClient, should_stop: Any) -> IdleOutcome:
    """idle_until() on the fake, up to 60 s, checking the connection with the fake's NOOP."""
    return idle_until(client, time.monotonic() + 60, should_stop, 5.0, connection(client).noop)


def test_new_mail_ends_idle_at_once() -> None:
    client = FakeClient([[(b"OK", b"Still here")], [(5, b"EXISTS")]])
    outcome = idle_for(client, lambda: False)
    assert outcome.new_mail
    assert client.calls == ["idle", "idle_check", "idle_check", "idle_done"]


def test_new_mail_in_the_answer_on_the_way_into_idle_ends_it_at_once() -> None:
    # Dovecot does not announce in IDLE what came between the last sync and the IDLE command;
    # the NOOP sent with IDLE does, and the sync must not wait for the next light sync.
    client = FakeClient([[(b"OK", b"Still here")]], told=[(7, b"EXISTS"), (7, b"RECENT")])
    outcome = idle_for(client, lambda: False)
    assert outcome.new_mail
    assert client.calls == ["idle", "idle_done"]


def test_an_early_empty_idle_check_is_verified_with_noop() -> None:
    # imapclient #565: EOF swallowed, [] returned at once although 5 s were allowed.
    client = FakeClient([[]])
    outcome = idle_for(client, lambda: False)
    assert not outcome.activity
    assert client.calls == ["idle", "idle_check", "idle_done", "noop"]


@pytest.mark.parametrize(
    "error", [imap_exc.IMAPClientAbortError("EOF"), BrokenPipeError(32, "pipe")]
)
def test_idle_done_errors_mean_a_dead_connection(error: Exception) -> None:
    client = FakeClient([[]], done_error=error)
    with pytest.raises(ConnectionLost):
        idle_for(client, lambda: False)


def test_stop_request_ends_idle_with_done() -> None:
    client = FakeClient([])
    idle_for(client, lambda: True)
    assert client.calls == ["idle", "idle_done"]


class LoginClient:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.calls: list[tuple[str, str, str]] = []

    def login(self, user: str, password: str) -> None:
        self.calls.append(("login", user, password))
        if self.refuse:
            raise imap_exc.LoginError("b'[AUTHENTICATIONFAILED] Authentication failed.'")

    def oauth2_login(self, user: str, token: str) -> None:
        self.calls.append(("xoauth2", user, token))
        if self.refuse:
            raise imap_exc.IMAPClientError("AUTHENTICATE failed")

    def capabilities(self) -> tuple[bytes, ...]:
        return (b"IMAP4rev1", b"IDLE", b"CONDSTORE", b"MOVE")

    def enable(self, *caps: str) -> None:
        self.calls.append(("enable", *caps, ""))  # type: ignore[arg-type]


def login_connection(client: LoginClient, **account: Any) -> ImapConnection:
    settings = ImapAccountSettings.model_validate(
        {"name": "a", "host": "h", "username": "u@example.com", **account}
    )
    conn = ImapConnection(settings, connect_timeout=1, read_timeout=1)
    conn._client = client  # type: ignore[assignment]
    return conn


def test_xoauth2_login_uses_the_token_and_reads_capabilities_after_login() -> None:
    client = LoginClient()
    conn = login_connection(client, oauth2_access_token="tok")
    conn.login()
    assert client.calls == [("xoauth2", "u@example.com", "tok")]
    assert conn.supports_idle and conn.enable_condstore()


def test_a_token_file_is_read_again_at_every_login(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    client = LoginClient()
    conn = login_connection(client, oauth2_access_token_file=str(token))
    conn.login()
    token.write_text("tok-2")  # the refresher rewrote it before the first token expired
    conn.login()
    assert client.calls == [
        ("xoauth2", "u@example.com", "tok-1"),
        ("xoauth2", "u@example.com", "tok-2"),
    ]


@pytest.mark.parametrize("content", [None, "", "  \n"], ids=["removed", "empty", "blank"])
def test_a_missing_or_empty_token_file_is_an_authentication_error(
    tmp_path: Path, content: str | None
) -> None:
    token = tmp_path / "token"
    token.write_text("tok")
    conn = login_connection(LoginClient(), oauth2_access_token_file=str(token))
    if content is None:
        token.unlink()
    else:
        token.write_text(content)
    with pytest.raises(AuthenticationError, match="oauth2_access_token_file") as caught:
        conn.login()
    assert classify(caught.value) is Disposition.PERMANENT


@pytest.mark.parametrize("account", [{"password": "p"}, {"oauth2_access_token": "tok"}])
def test_a_refused_login_is_an_authentication_error(account: dict[str, str]) -> None:
    conn = login_connection(LoginClient(refuse=True), **account)
    with pytest.raises(AuthenticationError) as caught:
        conn.login()
    assert classify(caught.value) is Disposition.PERMANENT
    assert "tok" not in str(caught.value) and "'p'" not in str(caught.value)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (b"17 41:43,45 101:104", (17, {41: 101, 42: 102, 43: 103, 45: 104})),
        (b"17 43:41 3:1", (17, {41: 1, 42: 2, 43: 3})),
        ("9 5 7", (9, {5: 7})),
        (b"17 41:43 101", None),  # sets of different sizes: not trusted
        (b"17 41:* 101:104", None),
        (b"x 1 2", None),
        (b"17 1", None),
    ],
)
def test_copyuid_codes(code: bytes | str, expected: tuple[int, dict[int, int]] | None) -> None:
    found = parse_copyuid(code)
    assert (found.uidvalidity, found.uids) == expected if found else expected is None
