"""The pieces of `mailtap dev up --secure` that need no broker: certificates, tokens, configs."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from joserfc import jwt
from joserfc.jwk import KeySet

from mailtap.dev import secure
from mailtap.dev.certs import CertificateAuthority
from mailtap.dev.oauth_server import TokenIssuer, _basic_credentials, signing_key


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_server_certificate_names_localhost_and_the_loopback_address(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    pair = ca.issue(tmp_path / "broker", "localhost", hosts=["localhost", "127.0.0.1"])
    san = _cert(pair.certificate).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in san.value.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    # The chain file and the key load into a TLS server context that clients trusting the CA
    # accept: the same check OpenSSL makes in librdkafka.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pair.certificate, pair.key)
    client = ssl.create_default_context(cafile=ca.certificate)
    assert client.cert_store_stats()["x509_ca"] == 1


def test_client_key_with_a_password_is_encrypted_and_loads_with_it(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    pair = ca.issue(tmp_path / "client", "mailtap-imap-source", key_password="pw-1")
    assert b"ENCRYPTED PRIVATE KEY" in pair.key.read_bytes()
    with pytest.raises(TypeError):
        serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_cert_chain(pair.certificate, pair.key, password="pw-1")
    subject = _cert(pair.certificate).subject
    assert subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == (
        "mailtap-imap-source"
    )


def test_negative_validity_gives_an_expired_certificate(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    pair = ca.issue(tmp_path / "old", "mailtap-smtp-sink", valid_days=-1)
    assert _cert(pair.certificate).not_valid_after_utc < datetime.datetime.now(datetime.UTC)


def test_existing_ca_is_kept(tmp_path: Path) -> None:
    first = CertificateAuthority.create(tmp_path / "ca").certificate.read_bytes()
    assert CertificateAuthority.create(tmp_path / "ca").certificate.read_bytes() == first


def test_token_is_an_rs256_jwt_for_the_client_that_the_jwks_verifies(tmp_path: Path) -> None:
    issuer = TokenIssuer(signing_key(tmp_path), {"c1": "s1"}, "https://idp", "kafka", 60)
    assert issuer.authenticate("c1", "s1")
    assert not issuer.authenticate("c1", "s2")
    assert not issuer.authenticate("nobody", "s1")
    answer = issuer.issue("c1", "kafka")
    assert answer["expires_in"] == 60
    keys = KeySet.import_key_set(issuer.jwks())  # the public half only, as the broker gets it
    token = jwt.decode(answer["access_token"], keys, algorithms=["RS256"])
    assert token.header["kid"] == issuer.jwks()["keys"][0]["kid"]
    claims = token.claims
    assert (claims["sub"], claims["iss"], claims["aud"], claims["scope"]) == (
        "c1",
        "https://idp",
        "kafka",
        "kafka",
    )
    assert claims["exp"] - claims["iat"] == 60
    assert "d" not in issuer.jwks()["keys"][0]  # no private exponent in the published key


def test_basic_credentials_are_parsed_and_garbage_is_not() -> None:
    assert _basic_credentials("Basic YzE6czE6eA==") == ("c1", "s1:x")
    assert _basic_credentials("Basic !!!") is None
    assert _basic_credentials("Bearer abc") is None
    assert _basic_credentials(None) is None


def _secure_kafka(tmp_path: Path) -> secure.SecureKafka:
    principals = {
        c: secure.Principal(n, f"pw-{n}", f"cs-{n}", f"/c/{n}.pem", f"/k/{n}.pem", None)
        for c, n in secure.PRINCIPALS.items()
    }
    return secure.SecureKafka(
        folder=tmp_path,
        host="127.0.0.1",
        admin_bootstrap="127.0.0.1:1",
        sasl_bootstrap="127.0.0.1:2",
        mtls_bootstrap="127.0.0.1:3",
        oauth_bootstrap="127.0.0.1:4",
        ca_location="/ca.pem",
        token_url="https://127.0.0.1:5/token",
        jwks_url="http://127.0.0.1:6/jwks",
        principals=principals,
        oauth_pid=1,
        oauth_log="/oauth.log",
        authorizer_log="/authorizer.log",
    )


def test_configs_per_component_and_mechanism_keep_the_rest_of_the_document(
    tmp_path: Path,
) -> None:
    import yaml

    info = _secure_kafka(tmp_path)
    base = {"kafka": {"bootstrap_servers": "x:1", "schema_registry_url": "http://r"}, "smtp": {}}
    written = secure.write_client_configs(info, base, "# test\n")
    assert set(written) == set(secure.PRINCIPALS)
    sink = yaml.safe_load(written["smtp-sink"]["scram-sha-256"].read_text())
    assert sink["smtp"] == {}
    assert sink["kafka"]["schema_registry_url"] == "http://r"
    assert sink["kafka"]["bootstrap_servers"] == "127.0.0.1:2"
    assert sink["kafka"]["sasl_mechanism"] == "SCRAM-SHA-256"
    assert sink["kafka"]["sasl_username"] == "mailtap-smtp-sink"
    oauth = yaml.safe_load(written["streams"]["oauthbearer"].read_text())["kafka"]
    assert oauth["sasl_oauthbearer"]["client_id"] == "mailtap-streams"
    assert oauth["bootstrap_servers"] == "127.0.0.1:4"
    assert written["streams"]["mtls"].stat().st_mode & 0o077 == 0  # credentials: owner only
    assert secure.SecureKafka.from_json(info.to_json()) == info
