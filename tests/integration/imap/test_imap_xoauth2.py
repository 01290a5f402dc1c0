"""XOAUTH2 against a real Dovecot: its oauth2 passdb asks a local token introspection endpoint
(RFC 7662) whether a bearer token is active, as it would ask an identity provider.

A Dovecot of its own (the shared one has no oauth2 passdb), with the same template plus an
oauth2 passdb for the XOAUTH2/OAUTHBEARER mechanisms; plain logins still go to the passwd file.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from connectors.core.errors import AuthenticationError
from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
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


def _introspection_server(tokens: Introspection) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            token = parse_qs(body).get("token", [""])[0]
            tokens.asked.append(token)
            user = tokens.active.get(token)
            answer = json.dumps({"active": True, "username": user} if user else {"active": False})
            data = answer.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def oauth_dovecot(tmp_path: Path) -> Iterator[OAuthDovecot]:
    tokens = Introspection()
    introspection = _introspection_server(tokens)
    port = _free_port()
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


def _login(server: OAuthDovecot, **credentials: str) -> ImapConnection:
    account = ImapAccountSettings.model_validate(
        {"name": "a", "host": server.host, "port": server.port, "security": "plain"}
        | {"username": USER, **credentials}
    )
    conn = ImapConnection(account, connect_timeout=5, read_timeout=10)
    conn.connect()
    conn.login()
    return conn


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
    harness = ImapHarness(
        services,
        Account(USER, dev_dovecot.DEFAULT_PASSWORD),  # plain login, to append the test mails
        unique,
        tmp_path,
        host=oauth_dovecot.host,
        port=oauth_dovecot.port,
    )
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
