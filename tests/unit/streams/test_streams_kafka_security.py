"""The librdkafka mapping (connectors.core.kafka.security) and the aiokafka mapping
(streams.kafka_security, as faust hands it to aiokafka) agree for every security combination the
settings model accepts; the combinations it refuses are refused with a sentence.

The aiokafka side is an ``ssl.SSLContext``: what it trusts and which client certificate it
presents are checked by an in-memory TLS handshake against a server that requires a client
certificate, not by looking inside the context.
"""

from __future__ import annotations

import itertools
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from pydantic import ValidationError

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import client_config
from connectors.core.kafka.security import librdkafka_security
from mailtap.dev.certs import CertificateAuthority, KeyPair
from streams.kafka_security import ClientCredentialsTokenProvider, faust_credentials

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = (None, "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
CLIENT_CERTS = ("none", "plain-key", "encrypted-key")
CAS = ("system", "private")


class Material:
    def __init__(self, root: Path) -> None:
        self.ca = CertificateAuthority.create(root / "ca")
        self.server = self.ca.issue(root / "server", "localhost", hosts=["localhost"])
        self.plain = self.ca.issue(root / "plain", "client-plain")
        self.encrypted = self.ca.issue(root / "enc", "client-enc", key_password="key-pw")


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    return Material(tmp_path_factory.mktemp("tls"))


def _values(
    m: Material, protocol: str, mechanism: str | None, cert: str, ca: str
) -> dict[str, Any]:
    values: dict[str, Any] = {"bootstrap_servers": "broker:9093", "security_protocol": protocol}
    if mechanism:
        values["sasl_mechanism"] = mechanism
    if mechanism == "OAUTHBEARER":
        values["sasl_oauthbearer"] = {
            "token_url": "https://idp.example.com/token",
            "client_id": "mailtap-streams",
            "client_secret": "cs-1",
            "scope": "kafka",
            "ca_file": str(m.ca.certificate) if ca == "private" else None,
        }
    elif mechanism:
        values["sasl_username"] = "mailtap-streams"
        values["sasl_password"] = "pw-1"
    pair: KeyPair | None = {"none": None, "plain-key": m.plain, "encrypted-key": m.encrypted}[cert]
    if pair is not None:
        values["ssl_certificate_location"] = str(pair.certificate)
        values["ssl_key_location"] = str(pair.key)
        if pair.key_password:
            values["ssl_key_password"] = pair.key_password
    if ca == "private":
        values["ssl_ca_location"] = str(m.ca.certificate)
    return values


def _common_name(certificate: x509.Certificate) -> str:
    return str(certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)


def _handshake(client: ssl.SSLContext, m: Material) -> str:
    """The CN of the client certificate a server that requires one receives from ``client``."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(m.server.certificate, m.server.key)
    server.load_verify_locations(m.ca.certificate)
    server.verify_mode = ssl.CERT_OPTIONAL  # record what is presented, even nothing
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    # TLS 1.3: the server reads the client certificate with the first application data.
    c.write(b"x")
    s_in.write(c_out.read())
    assert s.read(1) == b"x"
    peer = s.getpeercert(binary_form=True)
    return _common_name(x509.load_der_x509_certificate(peer)) if peer else "(none)"


def _librdkafka_view(conf: dict[str, Any], m: Material) -> dict[str, Any]:
    cert = None
    if "ssl.certificate.location" in conf:
        password = conf.get("ssl.key.password")
        serialization.load_pem_private_key(  # the password opens the key
            Path(conf["ssl.key.location"]).read_bytes(),
            password=password.encode() if password else None,
        )
        cert = _common_name(
            x509.load_pem_x509_certificate(Path(conf["ssl.certificate.location"]).read_bytes())
        )
    tls = conf["security.protocol"] in ("SSL", "SASL_SSL")
    oauth = None
    if conf.get("sasl.oauthbearer.method") == "oidc":
        oauth = (
            conf["sasl.oauthbearer.token.endpoint.url"],
            conf["sasl.oauthbearer.client.id"],
            conf["sasl.oauthbearer.client.secret"],
            conf["sasl.oauthbearer.scope"],
            conf.get("https.ca.location"),
        )
    return {
        "protocol": conf["security.protocol"],
        "mechanism": conf.get("sasl.mechanism"),
        "user": (conf.get("sasl.username"), conf.get("sasl.password")),
        "verified": (
            conf.get("enable.ssl.certificate.verification") is True
            and conf.get("ssl.endpoint.identification.algorithm") == "https"
        )
        if tls
        else None,
        "private_ca": conf.get("ssl.ca.location") == str(m.ca.certificate) if tls else None,
        "client_cert": (cert or "(none)") if tls and "ssl.ca.location" in conf else None,
        "oauth": oauth,
    }


def _aiokafka_view(kwargs: dict[str, Any], m: Material) -> dict[str, Any]:
    context: ssl.SSLContext | None = kwargs.get("ssl_context")
    tls = kwargs["security_protocol"] in ("SSL", "SASL_SSL")
    assert (context is not None) == tls
    dev_ca = ssl.create_default_context(cafile=m.ca.certificate).get_ca_certs()[0]
    private_ca = None if context is None else dev_ca in context.get_ca_certs()
    provider = kwargs.get("sasl_oauth_token_provider")
    oauth = None
    if provider is not None:
        assert isinstance(provider, ClientCredentialsTokenProvider)
        s = provider.settings
        oauth = (s.token_url, s.client_id, s.secret(), s.scope, s.ca_file)
    mechanism = kwargs.get("sasl_mechanism")
    user = (None, None)
    if mechanism not in (None, "OAUTHBEARER"):
        user = (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"])
    return {
        "protocol": kwargs["security_protocol"],
        "mechanism": mechanism,
        "user": user,
        "verified": (context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname)
        if context is not None
        else None,
        "private_ca": private_ca,
        # Without the private CA the handshake with the test server cannot succeed; which
        # certificate the context presents is checked in the combinations that have it.
        "client_cert": _handshake(context, m) if context is not None and private_ca else None,
        "oauth": oauth,
    }


def test_both_client_libraries_get_the_same_security_for_every_combination(
    material: Material,
) -> None:
    accepted = refused = 0
    for protocol, mechanism, cert, ca in itertools.product(
        PROTOCOLS, MECHANISMS, CLIENT_CERTS, CAS
    ):
        try:
            kafka = KafkaSettings.model_validate(_values(material, protocol, mechanism, cert, ca))
        except ValidationError:
            refused += 1
            continue
        accepted += 1
        librdkafka = _librdkafka_view(librdkafka_security(kafka), material)
        aiokafka = _aiokafka_view(
            dict(credentials_to_aiokafka_auth(faust_credentials(kafka))), material
        )
        assert librdkafka == aiokafka, (protocol, mechanism, cert, ca)
    # PLAINTEXT/SASL_PLAINTEXT take neither certificates nor a CA; SSL takes no mechanism.
    assert (accepted, refused) == (1 + 4 + 3 * 2 + 4 * 3 * 2, 120 - 35)


def test_every_client_gets_the_security_properties(material: Material) -> None:
    kafka = KafkaSettings.model_validate(
        _values(material, "SASL_SSL", "OAUTHBEARER", "encrypted-key", "private")
    )
    conf = client_config(kafka)
    assert conf["ssl.key.password"] == "key-pw"
    assert conf["sasl.oauthbearer.client.secret"] == "cs-1"
    assert "sasl.username" not in conf


@pytest.mark.parametrize(
    ("values", "sentence"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        (
            {"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"},
            "needs security_protocol SASL_SSL",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"},
            "needs sasl_username and sasl_password",
        ),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
            "needs sasl_oauthbearer",
        ),
        (
            {"security_protocol": "SSL", "ssl_certificate_location": "/c.pem"},
            "set both ssl_certificate_location and ssl_key_location",
        ),
        (
            {"security_protocol": "SSL", "ssl_key_password": "x"},
            "ssl_key_password needs ssl_key_location",
        ),
        ({"ssl_ca_location": "/ca.pem"}, r"use SSL \(or SASL_SSL\)"),
    ],
)
def test_incomplete_security_is_refused_with_what_to_change(
    values: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(ValidationError, match=sentence):
        KafkaSettings.model_validate({"bootstrap_servers": "broker:9093", **values})


def test_a_wrong_key_password_is_a_config_error_naming_the_files(material: Material) -> None:
    from connectors.core.errors import ConfigError

    values = _values(material, "SSL", None, "encrypted-key", "private")
    kafka = KafkaSettings.model_validate({**values, "ssl_key_password": "wrong"})
    with pytest.raises(ConfigError, match=r"cannot load the client certificate .*ssl_key_password"):
        faust_credentials(kafka)


def test_token_provider_shows_no_secret(material: Material) -> None:
    kafka = KafkaSettings.model_validate(
        _values(material, "SASL_SSL", "OAUTHBEARER", "none", "private")
    )
    provider = faust_credentials(kafka).oauth_cb  # type: ignore[union-attr]
    assert "cs-1" not in repr(provider) and "mailtap-streams" in repr(provider)
