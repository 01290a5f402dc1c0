"""The Graph test server's identity platform, driven by the real MSAL for Python."""

from __future__ import annotations

import datetime
from pathlib import Path

import msal
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import (
    CLIENT_ID,
    CLIENT_SECRET,
    GRAPH_SCOPE,
    USER,
    app_token,
    trusting_session,
)


def _msal_app(
    server: GraphTestServer, credential: object, client_id: str = CLIENT_ID
) -> msal.ConfidentialClientApplication:
    return msal.ConfidentialClientApplication(
        client_id,
        client_credential=credential,
        authority=server.authority,
        instance_discovery=False,
        http_client=trusting_session(server),
    )


def _certificate(name: str = "mailtap-graph") -> tuple[bytes, bytes]:
    """A self-signed RSA certificate and its key, PEM (what an admin uploads to the app)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _get(server: GraphTestServer, token: str, path: str) -> tuple[int, dict[str, object]]:
    session = trusting_session(server)
    response = session.get(
        f"{server.graph_url}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    return response.status_code, response.json()


def test_openid_configuration_is_what_msal_reads(graph_server: GraphTestServer) -> None:
    session = trusting_session(graph_server)
    doc = session.get(f"{graph_server.authority}/v2.0/.well-known/openid-configuration").json()
    assert doc["token_endpoint"] == f"{graph_server.authority}/oauth2/v2.0/token"
    assert doc["authorization_endpoint"].startswith(graph_server.authority)
    unknown = session.get(
        f"{graph_server.url}/no-such-tenant/v2.0/.well-known/openid-configuration"
    )
    assert unknown.status_code == 400
    assert unknown.json()["error_codes"] == [90002]


def test_client_secret_token_reads_the_mailbox(graph_server: GraphTestServer) -> None:
    token = app_token(graph_server)
    status, body = _get(graph_server, token, f"/users/{USER}/mailFolders/inbox")
    assert status == 200
    assert body["displayName"] == "Inbox"
    assert graph_server.tokens.issued == ["client_credentials"]


def test_msal_caches_the_token_until_it_expires(graph_server: GraphTestServer) -> None:
    app = _msal_app(graph_server, CLIENT_SECRET)
    first = app.acquire_token_for_client(scopes=GRAPH_SCOPE)
    second = app.acquire_token_for_client(scopes=GRAPH_SCOPE)
    assert first["access_token"] == second["access_token"]
    assert second["token_source"] == "cache"
    assert graph_server.tokens.issued == ["client_credentials"]


def test_wrong_secret_is_refused_with_the_aadsts_code(graph_server: GraphTestServer) -> None:
    result = _msal_app(graph_server, "not-the-secret").acquire_token_for_client(scopes=GRAPH_SCOPE)
    assert result["error"] == "invalid_client"
    assert result["error_codes"] == [7000215]
    assert result["error_description"].startswith("AADSTS7000215:")


def test_unknown_app_and_bad_scope_are_refused(graph_server: GraphTestServer) -> None:
    unknown = _msal_app(graph_server, CLIENT_SECRET, client_id="no-such-app")
    assert unknown.acquire_token_for_client(scopes=GRAPH_SCOPE)["error_codes"] == [700016]
    result = _msal_app(graph_server, CLIENT_SECRET).acquire_token_for_client(
        scopes=["https://graph.microsoft.com/Mail.Read"]
    )
    assert result["error"] == "invalid_scope"
    assert result["error_codes"] == [1002012]


@pytest.mark.parametrize("style", ["public_certificate", "thumbprint"])
def test_certificate_client_assertion(graph_server: GraphTestServer, style: str) -> None:
    """PS256 + x5t#S256 (MSAL with the certificate) and RS256 + x5t (MSAL with a SHA-1
    thumbprint) are both verified against the registered certificate."""
    cert_pem, key_pem = _certificate()
    graph_server.register_app("cert-app", certificate_pem=cert_pem)
    credential: dict[str, str] = {"private_key": key_pem.decode()}
    if style == "public_certificate":
        credential["public_certificate"] = cert_pem.decode()
    else:
        sha1 = x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA1())
        credential["thumbprint"] = sha1.hex().upper()
    result = _msal_app(graph_server, credential, "cert-app").acquire_token_for_client(
        scopes=GRAPH_SCOPE
    )
    assert "access_token" in result, result
    status, _ = _get(graph_server, result["access_token"], f"/users/{USER}/mailFolders")
    assert status == 200


def test_assertion_signed_by_another_key_is_refused(graph_server: GraphTestServer) -> None:
    registered, _ = _certificate()
    other_cert, other_key = _certificate("impostor")
    graph_server.register_app("cert-app", certificate_pem=registered)
    credential = {"private_key": other_key.decode(), "public_certificate": other_cert.decode()}
    result = _msal_app(graph_server, credential, "cert-app").acquire_token_for_client(
        scopes=GRAPH_SCOPE
    )
    assert result["error"] == "invalid_client"
    assert result["error_codes"] == [700027]


def test_delegated_refresh_token_reads_only_the_users_mailbox(
    graph_server: GraphTestServer,
) -> None:
    graph_server.add_mailbox("other@example.com")
    refresh = graph_server.issue_refresh_token(CLIENT_ID, USER)
    app = _msal_app(graph_server, CLIENT_SECRET)
    result = app.acquire_token_by_refresh_token(refresh, scopes=["Mail.Read"])
    assert "access_token" in result, result
    assert result["refresh_token"] != refresh  # a new one with every answer
    token = result["access_token"]
    assert _get(graph_server, token, "/me/mailFolders/inbox")[0] == 200
    assert _get(graph_server, token, f"/users/{USER}/mailFolders/inbox")[0] == 200
    status, body = _get(graph_server, token, "/users/other@example.com/mailFolders")
    assert status == 403
    assert body["error"]["code"] == "ErrorAccessDenied"  # type: ignore[index]
    # /me needs a user: an app-only token gets 400.
    assert _get(graph_server, app_token(graph_server), "/me/mailFolders")[0] == 400


def test_revoked_refresh_token_is_invalid_grant(graph_server: GraphTestServer) -> None:
    refresh = graph_server.issue_refresh_token(CLIENT_ID, USER)
    graph_server.revoke_refresh_tokens(USER)
    result = _msal_app(graph_server, CLIENT_SECRET).acquire_token_by_refresh_token(
        refresh, scopes=["Mail.Read"]
    )
    assert result["error"] == "invalid_grant"
    assert result["error_codes"] == [50173]


def test_every_call_needs_a_valid_bearer_token(graph_server: GraphTestServer) -> None:
    session = trusting_session(graph_server)
    anonymous = session.get(f"{graph_server.graph_url}/users/{USER}/mailFolders")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "InvalidAuthenticationToken"
    assert anonymous.json()["error"]["message"] == "Access token is empty."
    assert "authorization_uri" in anonymous.headers["WWW-Authenticate"]
    assert _get(graph_server, "made-up", f"/users/{USER}/mailFolders")[0] == 401
    token = app_token(graph_server)
    assert graph_server.expire_access_tokens() == 1
    status, body = _get(graph_server, token, f"/users/{USER}/mailFolders")
    assert status == 401
    assert "expired" in body["error"]["message"]  # type: ignore[index]
    # MSAL's cache does not know; a fresh token (force_refresh, as after a 401) works.
    fresh = _msal_app(graph_server, CLIENT_SECRET).acquire_token_for_client(scopes=GRAPH_SCOPE)
    assert _get(graph_server, fresh["access_token"], f"/users/{USER}/mailFolders")[0] == 200


def test_token_lifetime_ends_access(tmp_path: Path) -> None:
    with GraphTestServer(token_lifetime=0.5) as server:
        server.add_mailbox(USER)
        server.register_app(CLIENT_ID, secret=CLIENT_SECRET)
        result = _msal_app(server, CLIENT_SECRET).acquire_token_for_client(scopes=GRAPH_SCOPE)
        assert result["expires_in"] == 0
        token = result["access_token"]
        assert server.wait_until(
            lambda: _get(server, token, f"/users/{USER}/mailFolders")[0] == 401, 5
        )
