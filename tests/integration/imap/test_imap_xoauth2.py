"""XOAUTH2 against a real Dovecot: its oauth2 passdb asks a local token introspection endpoint
(RFC 7662) whether a bearer token is active, as it would ask an identity provider.

A Dovecot of its own (the shared one has no oauth2 passdb), with the same template plus an
oauth2 passdb for the XOAUTH2/OAUTHBEARER mechanisms; plain logins still go to the passwd file.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import trustme

from connectors.core.errors import AuthenticationError, Disposition, classify
from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.errors import ConnectionLost
from mailtap.dev import Account, DevServices, process
from mailtap.dev import dovecot as dev_dovecot
from tests.integration.imap.imap_harness import ImapHarness, make_mail, running, wait_for

USER = dev_dovecot.DEFAULT_USERS[0]


@dataclass
class Introspection:
    """Active tokens and their users; everything else is inactive."""

    active: dict[str, str] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)


@dataclass
class OAuthDovecot:
    host: str
    port: int
    config: Path
    tokens: Introspection


def _form_server(
    answer: Callable[[BaseHTTPRequestHandler, dict[str, list[str]]], tuple[int, object]],
    context: ssl.SSLContext | None = None,
) -> ThreadingHTTPServer:
    """A loopback HTTP(S) server that answers each form POST with ``answer(request, form)``:
    (status, JSON body)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            status, reply = answer(self, parse_qs(body))
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _introspection_server(tokens: Introspection) -> ThreadingHTTPServer:
    def answer(_request: BaseHTTPRequestHandler, form: dict[str, list[str]]) -> tuple[int, object]:
        token = form.get("token", [""])[0]
        tokens.asked.append(token)
        user = tokens.active.get(token)
        return 200, {"active": True, "username": user} if user else {"active": False}

    return _form_server(answer)


@pytest.fixture
def oauth_dovecot(tmp_path: Path) -> Iterator[OAuthDovecot]:
    tokens = Introspection()
    introspection = _introspection_server(tokens)
    port = process.free_port()
    layout = dev_dovecot.layout_for(tmp_path / "dovecot-state")
    dev_dovecot.render(layout, "127.0.0.1", port)
    oauth2_conf = layout.root / "dovecot-oauth2.conf.ext"
    oauth2_conf.write_text(
        "introspection_mode = post\n"
        f"introspection_url = http://127.0.0.1:{introspection.server_port}/introspect\n"
        "username_attribute = username\nactive_attribute = active\nactive_value = true\n"
    )
    config = layout.config.read_text()
    config = config.replace(
        "auth_mechanisms = plain login", "auth_mechanisms = plain login xoauth2 oauthbearer"
    )
    config = config.replace(
        "passdb {\n  driver = passwd-file\n",
        f"passdb {{\n  driver = oauth2\n  mechanisms = xoauth2 oauthbearer\n"
        f"  args = {oauth2_conf}\n}}\n"
        "passdb {\n  driver = passwd-file\n  mechanisms = plain login\n",
        1,
    )
    assert "driver = oauth2" in config
    layout.config.write_text(config)
    pid = dev_dovecot.start(layout)
    try:
        dev_dovecot.wait_ready(layout, pid, "127.0.0.1", port)
        yield OAuthDovecot("127.0.0.1", port, layout.config, tokens)
    finally:
        process.stop_group(pid)
        introspection.shutdown()


def _login(server: OAuthDovecot, **credentials: object) -> ImapConnection:
    account = ImapAccountSettings.model_validate(
        {"name": "a", "host": server.host, "port": server.port, "security": "plain"}
        | {"username": USER, **credentials}
    )
    conn = ImapConnection(account, connect_timeout=5, read_timeout=10)
    conn.connect()
    try:
        conn.login()
    except BaseException:
        conn.close()
        raise
    return conn


def _harness(
    server: OAuthDovecot, services: DevServices, unique: str, tmp_path: Path
) -> ImapHarness:
    """The source's harness on this Dovecot; the test mails are appended with a plain login."""
    account = Account(USER, dev_dovecot.DEFAULT_PASSWORD)
    return ImapHarness(services, account, unique, tmp_path, host=server.host, port=server.port)


def test_xoauth2_login_with_a_token_file_that_a_refresher_rotates(
    oauth_dovecot: OAuthDovecot, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    oauth_dovecot.tokens.active["tok-1"] = USER
    token_file.write_text("tok-1\n")
    conn = _login(oauth_dovecot, oauth2_access_token_file=str(token_file))
    assert conn.select("INBOX", readonly=True).uidvalidity > 0
    conn.logout()
    # The refresher puts a new token in place; the identity provider lets the old one expire.
    oauth_dovecot.tokens.active = {"tok-2": USER}
    token_file.write_text("tok-2\n")
    _login(oauth_dovecot, oauth2_access_token_file=str(token_file)).logout()
    with pytest.raises(AuthenticationError):
        _login(oauth_dovecot, oauth2_access_token="tok-1")
    assert oauth_dovecot.tokens.asked == ["tok-1", "tok-2", "tok-1"]


def test_the_source_logs_in_again_with_the_rotated_token_after_its_connection_is_dropped(
    oauth_dovecot: OAuthDovecot, services: DevServices, unique: str, tmp_path: Path
) -> None:
    harness = _harness(oauth_dovecot, services, unique, tmp_path)
    token_file = tmp_path / "token"
    oauth_dovecot.tokens.active["tok-1"] = USER
    token_file.write_text("tok-1")
    account = {"password": None, "oauth2_access_token_file": str(token_file), "start": "latest"}
    with running(harness, account=account, catchup_poll_seconds=2):
        wait_for(lambda: harness.cursor() is not None, "the source's first cursor")
        harness.append([make_mail(f"a-{unique}@example.com", "before")])
        wait_for(lambda: len(harness.events()) == 1, "the first event")
        oauth_dovecot.tokens.active = {"tok-2": USER}
        token_file.write_text("tok-2")
        # Drop the source's session: it must reconnect, and tok-1 is no longer accepted.
        dev_dovecot.doveadm(oauth_dovecot.config, "kick", USER)
        harness.append([make_mail(f"b-{unique}@example.com", "after")])
        wait_for(lambda: len(harness.events()) == 2, "the event after the reconnect")
    assert "tok-2" in oauth_dovecot.tokens.asked
    # Two keys, maybe on two partitions: no order between them.
    assert sorted(r.value["subject"] for r in harness.events() if r.value) == ["after", "before"]


# --- tokens mailtap fetches itself (OAuth2 client credentials) --------------------------------


@dataclass
class TokenEndpoint:
    """An HTTPS OAuth2 token endpoint (RFC 6749 4.4) that registers what it issues with the
    introspection endpoint Dovecot asks, as an identity provider does."""

    url: str
    ca_file: Path
    tokens: Introspection
    expires_in: int = 3600
    status: int = 200
    issued: list[str] = field(default_factory=list)
    grants: list[dict[str, list[str]]] = field(default_factory=list)


CLIENT_ID, CLIENT_SECRET = "mailtap-app", "app-secret-value"


def _token_server(endpoint: TokenEndpoint, context: ssl.SSLContext) -> ThreadingHTTPServer:
    basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()

    def answer(request: BaseHTTPRequestHandler, form: dict[str, list[str]]) -> tuple[int, object]:
        endpoint.grants.append(form)
        if endpoint.status != 200:
            return endpoint.status, {"error": "temporarily_unavailable"}
        if request.headers.get("Authorization") != f"Basic {basic}":
            return 401, {"error": "invalid_client", "error_description": "bad secret"}
        token = f"fetched-{len(endpoint.issued) + 1}"
        endpoint.issued.append(token)
        endpoint.tokens.active[token] = USER
        return 200, {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": endpoint.expires_in,
        }

    return _form_server(answer, context)


@pytest.fixture
def token_endpoint(oauth_dovecot: OAuthDovecot, tmp_path: Path) -> Iterator[TokenEndpoint]:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    endpoint = TokenEndpoint("", ca_file, oauth_dovecot.tokens)
    server = _token_server(endpoint, context)
    endpoint.url = f"https://127.0.0.1:{server.server_port}/tenant/oauth2/v2.0/token"
    try:
        yield endpoint
    finally:
        server.shutdown()


def _oauth2(endpoint: TokenEndpoint, secret: str = CLIENT_SECRET) -> dict[str, str]:
    return {
        "token_url": endpoint.url,
        "client_id": CLIENT_ID,
        "client_secret": secret,
        "scope": "https://outlook.office365.com/.default",
        "ca_file": str(endpoint.ca_file),
    }


def test_fetched_tokens_are_reused_renewed_before_expiry_and_replaced_when_revoked(
    oauth_dovecot: OAuthDovecot, token_endpoint: TokenEndpoint, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token_endpoint.expires_in = 2  # renewed after half its life
    oauth2 = _oauth2(token_endpoint)
    _login(oauth_dovecot, oauth2=oauth2).logout()
    _login(oauth_dovecot, oauth2=oauth2).logout()
    assert token_endpoint.issued == ["fetched-1"]  # cached, one grant for both logins
    (grant,) = token_endpoint.grants
    assert grant["grant_type"] == ["client_credentials"]
    assert grant["scope"] == ["https://outlook.office365.com/.default"]
    assert CLIENT_SECRET not in json.dumps(grant)  # the secret went in the Authorization header
    time.sleep(1.2)
    _login(oauth_dovecot, oauth2=oauth2).logout()
    assert token_endpoint.issued == ["fetched-1", "fetched-2"]  # renewed before it expired
    token_endpoint.expires_in = 3600
    # The identity provider revokes the token early: the login is refused once, then the
    # next one fetches a new token.
    oauth_dovecot.tokens.active.pop("fetched-2")
    with pytest.raises(AuthenticationError):
        _login(oauth_dovecot, oauth2=oauth2)
    _login(oauth_dovecot, oauth2=oauth2).logout()
    assert token_endpoint.issued[-1] == "fetched-3"
    assert caplog.text.count("oauth2: new access token for client mailtap-app") == 3
    assert "fetched-" not in caplog.text and CLIENT_SECRET not in caplog.text  # no secret logged
    xoauth2 = base64.b64encode(f"user={USER}\x01auth=Bearer fetched-1\x01\x01".encode())
    assert xoauth2.decode()[:40] not in caplog.text  # nor the AUTHENTICATE line imaplib sends


def test_a_refused_client_is_permanent_and_an_endpoint_outage_is_transient(
    oauth_dovecot: OAuthDovecot, token_endpoint: TokenEndpoint
) -> None:
    wrong = "not-the-app-secret"
    with pytest.raises(
        AuthenticationError, match="refused client mailtap-app: invalid_client"
    ) as refused:
        _login(oauth_dovecot, oauth2=_oauth2(token_endpoint, secret=wrong))
    assert classify(refused.value) is Disposition.PERMANENT and wrong not in str(refused.value)
    token_endpoint.status = 503
    with pytest.raises(ConnectionLost) as outage:
        _login(oauth_dovecot, oauth2=_oauth2(token_endpoint, secret="another-secret"))
    assert classify(outage.value) is Disposition.RETRY
    token_endpoint.status = 200
    elsewhere = _oauth2(token_endpoint, secret="a-third-secret") | {
        "token_url": f"https://127.0.0.1:{process.free_port()}/token"
    }
    with pytest.raises(ConnectionLost, match="cannot reach token endpoint"):
        _login(oauth_dovecot, oauth2=elsewhere)
    assert token_endpoint.issued == []


def test_the_source_runs_on_tokens_it_fetches_itself(
    oauth_dovecot: OAuthDovecot,
    token_endpoint: TokenEndpoint,
    services: DevServices,
    unique: str,
    tmp_path: Path,
) -> None:
    harness = _harness(oauth_dovecot, services, unique, tmp_path)
    oauth2 = _oauth2(token_endpoint, secret=CLIENT_SECRET) | {"scope": f"imap-{unique}"}
    account = {"password": None, "oauth2": oauth2, "start": "latest"}
    with running(harness, account=account, catchup_poll_seconds=2):
        wait_for(lambda: harness.cursor() is not None, "the source's first cursor")
        harness.append([make_mail(f"c-{unique}@example.com", "fetched token")])
        wait_for(lambda: len(harness.events()) == 1, "the event")
    assert token_endpoint.issued and all(t.startswith("fetched-") for t in token_endpoint.issued)
    assert [r.value["subject"] for r in harness.events() if r.value] == ["fetched token"]
