"""The three grants of the Graph source, through MSAL, against the test server's token endpoint
(no Kafka): a certificate, a delegated refresh token, and what a refusal becomes. No secret in
any log line, even at DEBUG."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from connectors.graph.auth import TokenSource
from connectors.graph.client import GraphClient
from connectors.graph.config import GraphSourceSettings
from connectors.graph.errors import AccessDenied
from connectors.graph.gate import MailboxGate
from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import CLIENT_ID, CLIENT_SECRET, USER

CERT_APP = "22222222-3333-4444-5555-666666666666"


def settings(graph: GraphTestServer, **auth: Any) -> GraphSourceSettings:
    authority, _, tenant = graph.authority.rpartition("/")
    return GraphSourceSettings.model_validate(
        {
            "tenant_id": tenant,
            "client_id": auth.pop("client_id", CLIENT_ID),
            "authority_host": authority,
            "api_base": graph.graph_url,
            "ca_file": str(graph.ca_file),
            "accounts": [{"name": "ops", "user": USER}],
            **auth,
        }
    )


def inbox_id(s: GraphSourceSettings) -> str:
    client = GraphClient(s, USER, TokenSource(s), MailboxGate(4))
    try:
        return client.folder_id("inbox")
    finally:
        client.close()


def certificate_pem(tmp_path: Path) -> tuple[Path, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mailtap graph source")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path = tmp_path / "graph-app.pem"
    path.write_bytes(key_pem + cert_pem)
    return path, cert_pem


def test_a_certificate_gets_app_only_tokens(graph_server: GraphTestServer, tmp_path: Path) -> None:
    path, cert_pem = certificate_pem(tmp_path)
    graph_server.register_app(CERT_APP, certificate_pem=cert_pem)
    s = settings(
        graph_server, client_id=CERT_APP, auth="client_certificate", certificate_file=str(path)
    )
    assert inbox_id(s) == graph_server.folder_id(USER, "inbox")


def test_a_delegated_refresh_token_and_its_revocation(graph_server: GraphTestServer) -> None:
    token = graph_server.issue_refresh_token(CLIENT_ID, USER)
    s = settings(
        graph_server, auth="refresh_token", refresh_token=token, client_secret=CLIENT_SECRET
    )
    assert inbox_id(s) == graph_server.folder_id(USER, "inbox")
    graph_server.revoke_refresh_tokens(USER)
    with pytest.raises(AccessDenied, match="invalid_grant"):
        inbox_id(s)


def test_a_wrong_secret_is_access_denied_and_no_secret_is_logged(
    graph_server: GraphTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    good = settings(graph_server, client_secret=CLIENT_SECRET)
    tokens = TokenSource(good)
    client = GraphClient(good, USER, tokens, MailboxGate(4))
    try:
        assert client.folder_id("inbox") == graph_server.folder_id(USER, "inbox")
        graph_server.expire_access_tokens()  # a 401: the token is dropped and fetched again
        assert client.folder_id("inbox") == graph_server.folder_id(USER, "inbox")
    finally:
        client.close()
    statuses = [r.status for r in graph_server.requests if r.path.endswith("/mailFolders/inbox")]
    assert statuses == [200, 401, 200]
    with pytest.raises(AccessDenied, match="invalid_client"):
        inbox_id(settings(graph_server, client_secret="wrong-secret-value"))
    assert caplog.records  # the flow logged something at DEBUG
    assert CLIENT_SECRET not in caplog.text and "wrong-secret-value" not in caplog.text
    assert tokens.token() not in caplog.text
