"""The secured local Kafka: what ``mailtap dev up --secure`` runs instead of the plaintext broker.

A KRaft broker set up like a company cluster (``deploy/local/kafka/server-secure.properties.tmpl``):
SASL_SSL with SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN; SSL requiring a client certificate (mTLS);
SASL_SSL with OAUTHBEARER, whose JWTs come from the dev OAuth server (`mailtap.dev.oauth_server`)
and are checked against its JWKS; ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``
and no auto-created topics. A PLAINTEXT listener on loopback (principal ``User:ANONYMOUS``, a super
user) carries the admin work of the dev stack and of the tests.

Every component has one principal, the same under every mechanism (``User:mailtap-smtp-sink`` is
the SCRAM/PLAIN user, the certificate's CN and the OAuth client id), so one set of ACLs serves all
three listeners. ``mailtap-admin`` is a super user (it creates topics); the others are granted
nothing here: a component gets exactly the ACLs its operator grants (issue 27, item 3).

Layout of ``<state>/secure/``::

    ca/ca.pem                          the CA every client trusts (ssl_ca_location)
    broker/{cert,key}.pem              localhost / 127.0.0.1
    clients/<principal>/{cert,key}.pem mTLS; mailtap-imap-source's key is encrypted (key_password)
    oauth/                             the OAuth server's clients.json, signing key, TLS certificate
    credentials.json                   passwords and client secrets (0600), kept across runs
    <component>/<mechanism>.yaml       a ready mailtap config (written by `mailtap.dev.services`)

Credentials are generated once and kept, so configs written earlier stay valid; the broker's data
is formatted again when they change (SCRAM users are added at format time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import ssl
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mailtap.dev import kafka, process
from mailtap.dev.certs import CertificateAuthority, KeyPair
from mailtap.dev.layout import render_template

log = logging.getLogger(__name__)

#: component -> principal name (SCRAM/PLAIN user, certificate CN, OAuth client id).
PRINCIPALS: dict[str, str] = {
    "imap-source": "mailtap-imap-source",
    "ews-source": "mailtap-ews-source",
    "streams": "mailtap-streams",
    "smtp-sink": "mailtap-smtp-sink",
    "console": "mailtap-console",
    "admin": "mailtap-admin",
    "other-team": "other-team-reader",
}
#: Principals allowed everything: the admin listener's anonymous user and mailtap's admin.
SUPER_USERS = ("User:ANONYMOUS", "User:mailtap-admin")
#: The component whose client key is written encrypted (``ssl_key_password``): an mTLS setup
#: with a password-protected key is common, and both client libraries must handle it.
ENCRYPTED_KEY_COMPONENT = "imap-source"
#: The ``mechanism`` names of the written configs.
MECHANISMS = ("scram-sha-512", "scram-sha-256", "plain", "mtls", "oauthbearer")
OAUTH_AUDIENCE = "mailtap-dev-kafka"
OAUTH_SCOPE = "kafka"
#: The ports a secured set needs besides the admin (``kafka``) and controller ports.
PORT_NAMES = ("kafka_sasl", "kafka_mtls", "kafka_oauth", "oauth_token", "oauth_jwks")
OAUTH_START_TIMEOUT_S = 30.0
#: The SCRAM mechanisms every principal is a user of.
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
#: CN=mailtap-smtp-sink,O=mailtap dev -> User:mailtap-smtp-sink: the same principal name as its
#: SCRAM user and its OAuth client id, so one set of ACLs serves every mechanism.
PRINCIPAL_MAPPING_RULE = "RULE:^CN=([^,]+)(,.*)?$/$1/,DEFAULT"


@dataclass(frozen=True)
class Principal:
    """One component's identity under every mechanism."""

    name: str
    password: str
    client_secret: str
    certificate: str
    key: str
    key_password: str | None


@dataclass(frozen=True)
class SecureKafka:
    """Connection details of a running secured broker and its OAuth server."""

    folder: Path
    host: str
    admin_bootstrap: str
    sasl_bootstrap: str
    mtls_bootstrap: str
    oauth_bootstrap: str
    ca_location: str
    token_url: str
    jwks_url: str
    principals: dict[str, Principal]
    oauth_pid: int
    oauth_log: str
    authorizer_log: str

    def kafka_section(self, component: str, mechanism: str) -> dict[str, Any]:
        """The ``kafka:`` settings with which ``component`` reaches this broker by ``mechanism``
        (one of `MECHANISMS`), credentials included."""
        who = self.principals[component]
        if mechanism in ("scram-sha-512", "scram-sha-256", "plain"):
            return client_section(who, mechanism, self.sasl_bootstrap, self.ca_location)
        if mechanism == "mtls":
            return client_section(who, mechanism, self.mtls_bootstrap, self.ca_location)
        if mechanism == "oauthbearer":
            return {
                "bootstrap_servers": self.oauth_bootstrap,
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "OAUTHBEARER",
                "ssl_ca_location": self.ca_location,
                "sasl_oauthbearer": {
                    "token_url": self.token_url,
                    "client_id": who.name,
                    "client_secret": who.client_secret,
                    "scope": OAUTH_SCOPE,
                    "ca_file": self.ca_location,
                },
            }
        raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}")

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "principals"}
        data["folder"] = str(self.folder)
        data["principals"] = {c: p.__dict__ for c, p in self.principals.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SecureKafka:
        values = {k: v for k, v in data.items() if k not in ("folder", "principals")}
        principals = {c: Principal(**p) for c, p in data["principals"].items()}
        return cls(folder=Path(data["folder"]), principals=principals, **values)


def client_section(
    who: Principal, mechanism: str, bootstrap: str, ca_location: str
) -> dict[str, Any]:
    """The ``kafka:`` connection settings of ``who`` on a listener at ``bootstrap`` that takes
    ``mechanism``: ``scram-sha-512``, ``scram-sha-256``, ``plain`` (SASL_SSL) or ``mtls`` (SSL
    with a client certificate)."""
    if mechanism in ("scram-sha-512", "scram-sha-256", "plain"):
        return {
            "bootstrap_servers": bootstrap,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": mechanism.upper(),
            "sasl_username": who.name,
            "sasl_password": who.password,
            "ssl_ca_location": ca_location,
        }
    if mechanism == "mtls":
        section: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "security_protocol": "SSL",
            "ssl_ca_location": ca_location,
            "ssl_certificate_location": who.certificate,
            "ssl_key_location": who.key,
        }
        if who.key_password:
            section["ssl_key_password"] = who.key_password
        return section
    raise ValueError(f"no client section for {mechanism!r}: scram-sha-*, plain or mtls")


def _credentials(folder: Path) -> dict[str, dict[str, str]]:
    """Passwords and client secrets per component, made once and kept (0600)."""
    path = folder / "credentials.json"
    known: dict[str, dict[str, str]] = json.loads(path.read_text()) if path.exists() else {}
    for component in PRINCIPALS:
        known.setdefault(
            component,
            {
                "password": secrets.token_urlsafe(18),
                "client_secret": secrets.token_urlsafe(24),
                "key_password": secrets.token_urlsafe(12),
            },
        )
    path.write_text(json.dumps(known, indent=2))
    path.chmod(0o600)
    return known


def _principals(folder: Path, ca: CertificateAuthority) -> dict[str, Principal]:
    credentials = _credentials(folder)
    principals: dict[str, Principal] = {}
    for component, name in PRINCIPALS.items():
        secret = credentials[component]
        key_password = secret["key_password"] if component == ENCRYPTED_KEY_COMPONENT else None
        client_dir = folder / "clients" / name
        pair = KeyPair(client_dir / "cert.pem", client_dir / "key.pem", key_password)
        if not (pair.certificate.exists() and pair.key.exists()):
            pair = ca.issue(client_dir, name, key_password=key_password)
        principals[component] = Principal(
            name=name,
            password=secret["password"],
            client_secret=secret["client_secret"],
            certificate=str(pair.certificate),
            key=str(pair.key),
            key_password=key_password,
        )
    return principals


def _server_pair(ca: CertificateAuthority, folder: Path, host: str) -> KeyPair:
    pair = KeyPair(folder / "cert.pem", folder / "key.pem")
    if pair.certificate.exists() and pair.key.exists():
        return pair
    return ca.issue(folder, "localhost", hosts=sorted({"localhost", host}))


def _jaas_quote(value: str) -> str:
    if '"' in value or "\\" in value:
        raise ValueError("a JAAS option value may not contain quotes or backslashes")
    return f'"{value}"'


def scram_format_args(principals: dict[str, Principal]) -> list[str]:
    """``kafka-storage format`` arguments adding every principal as a SCRAM user (both
    mechanisms): a KRaft cluster's SCRAM users are part of its formatted metadata, so they
    survive a broker restart and need no running broker to be added."""
    arguments: list[str] = []
    for who in principals.values():
        for mechanism in SCRAM_MECHANISMS:
            arguments += ["--add-scram", f"{mechanism}=[name={who.name},password={who.password}]"]
    return arguments


def scram_marker(format_args: list[str]) -> str:
    """What `kafka.prepare_storage` compares to reuse data formatted with these SCRAM users."""
    return hashlib.sha256(" ".join(format_args).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BrokerMaterial:
    """The TLS material and identities a secured broker and its clients share."""

    ca: CertificateAuthority
    #: the broker's PEM keystore (key + certificate for localhost and the host)
    keystore: Path
    principals: dict[str, Principal]


def broker_material(folder: Path, host: str) -> BrokerMaterial:
    """The dev CA, the broker's keystore and every component's principal under ``folder``
    (made once and kept: configs written earlier stay valid)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.create(folder / "ca")
    keystore = _keystore(_server_pair(ca, folder / "broker", host))
    return BrokerMaterial(ca, keystore, _principals(folder, ca))


def authorizer_section(super_users: tuple[str, ...] = SUPER_USERS) -> dict[str, str]:
    """Broker properties of a cluster run like a company's: nothing without an ACL, and no
    topic created by a client's metadata request (as in server-secure.properties.tmpl)."""
    return {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": ";".join(super_users),
        "auto.create.topics.enable": "false",
    }


def tls_section(material: BrokerMaterial) -> dict[str, str]:
    """The broker's TLS settings for every SSL / SASL_SSL listener (PEM files), with the
    certificate's CN as the principal (`PRINCIPAL_MAPPING_RULE`)."""
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(material.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(material.ca.certificate),
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.principal.mapping.rules": PRINCIPAL_MAPPING_RULE,
    }


def sasl_section(listener: str, mechanisms: tuple[str, ...] = SCRAM_MECHANISMS) -> dict[str, str]:
    """A SASL_SSL listener named ``listener`` accepting the SCRAM ``mechanisms`` (users from
    `scram_format_args`)."""
    name = listener.lower()  # Kafka's listener-scoped keys use the lower-case name
    section = {f"listener.name.{name}.sasl.enabled.mechanisms": ",".join(mechanisms)}
    for mechanism in mechanisms:
        if not mechanism.startswith("SCRAM-"):
            raise ValueError(f"sasl_section makes SCRAM listeners only, not {mechanism}")
        section[f"listener.name.{name}.{mechanism.lower()}.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        )
    return section


def mtls_section(listener: str) -> dict[str, str]:
    """An SSL listener named ``listener`` that refuses a client without a certificate from
    the dev CA."""
    return {f"listener.name.{listener.lower()}.ssl.client.auth": "required"}


def write_log4j(layout: kafka.KafkaLayout) -> None:
    """The secured broker's logging: the authorizer's decisions (every DENIED operation with
    principal, operation and resource) in `KafkaLayout.authorizer_log`."""
    layout.log4j_config.write_text(
        render_template(
            "kafka/log4j2-secure.properties.tmpl",
            {"log_path": str(layout.server_log), "authorizer_log_path": str(layout.authorizer_log)},
        )
    )


def _start_oauth(
    folder: Path, host: str, token_port: int, jwks_port: int, principals: dict[str, Principal]
) -> tuple[int, Path]:
    oauth = folder / "oauth"
    (oauth / "tls").mkdir(parents=True, exist_ok=True)
    clients = oauth / "clients.json"
    clients.write_text(json.dumps({p.name: p.client_secret for p in principals.values()}))
    clients.chmod(0o600)
    log_path = oauth / "oauth.log"
    pid = process.spawn(
        [
            sys.executable,
            "-m",
            "mailtap.dev.oauth_server",
            "--folder",
            str(oauth),
            "--host",
            host,
            "--token-port",
            str(token_port),
            "--jwks-port",
            str(jwks_port),
            "--issuer",
            _issuer(host, token_port),
            "--audience",
            OAUTH_AUDIENCE,
        ],
        log_path,
    )
    return pid, log_path


def _issuer(host: str, token_port: int) -> str:
    return f"https://{host}:{token_port}"


def probe_jwks(jwks_url: str, timeout: float = 2.0) -> None:
    """Raise unless ``jwks_url`` serves a key set."""
    with urllib.request.urlopen(jwks_url, timeout=timeout) as answer:
        if not json.load(answer).get("keys"):
            raise RuntimeError(f"{jwks_url} served no keys")


def probe_token_endpoint(token_url: str, ca_location: str, timeout: float = 2.0) -> None:
    """Raise unless an HTTPS server with a certificate from ``ca_location`` answers at
    ``token_url`` (any HTTP status will do: the TLS handshake is the point)."""
    context = ssl.create_default_context(cafile=ca_location)
    request = urllib.request.Request(token_url.rsplit("/", 1)[0] + "/jwks")
    with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
        answer.read()


def launch(
    folder: Path,
    host: str,
    ports: dict[str, int],
    record: Callable[[int], None],
) -> tuple[SecureKafka, int, kafka.KafkaLayout]:
    """Make the certificates and credentials, start the OAuth server (and wait for it: the
    broker fetches the JWKS as it starts) and the broker (not waited for: see `kafka.wait_ready`
    on ``admin_bootstrap``). ``ports`` holds ``kafka`` (admin), ``kafka_controller`` and
    `PORT_NAMES`; ``record`` gets each pid as soon as it exists."""
    material = broker_material(folder, host)
    principals = material.principals
    _server_pair(material.ca, folder / "oauth" / "tls", host)

    oauth_pid, oauth_log = _start_oauth(
        folder, host, ports["oauth_token"], ports["oauth_jwks"], principals
    )
    record(oauth_pid)
    jwks_url = f"http://{host}:{ports['oauth_jwks']}/jwks"
    token_url = f"https://{host}:{ports['oauth_token']}/token"

    def oauth_answers() -> None:
        probe_jwks(jwks_url)
        probe_token_endpoint(token_url, str(material.ca.certificate))

    process.wait_until_ready(
        "oauth server", oauth_pid, oauth_answers, [oauth_log], OAUTH_START_TIMEOUT_S
    )

    layout = kafka.KafkaLayout(folder / "kafka")
    plain_users = " ".join(f"user_{p.name}={_jaas_quote(p.password)}" for p in principals.values())
    values = {
        "host": host,
        "admin_port": str(ports["kafka"]),
        "sasl_port": str(ports["kafka_sasl"]),
        "mtls_port": str(ports["kafka_mtls"]),
        "oauth_port": str(ports["kafka_oauth"]),
        "controller_port": str(ports["kafka_controller"]),
        "data_dir": str(layout.data_dir),
        "plain_users": plain_users,
        "jwks_url": jwks_url,
        "issuer": _issuer(host, ports["oauth_token"]),
        "audience": OAUTH_AUDIENCE,
    }
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.config.write_text(render_template("kafka/server-secure.properties.tmpl", values))
    kafka.set_properties(
        layout.config,
        {**authorizer_section(), **tls_section(material), **mtls_section("MTLS")},
    )
    layout.config.chmod(0o600)  # PLAIN passwords
    write_log4j(layout)
    scram = scram_format_args(principals)
    # The voter set names the controller port; the SCRAM users are part of the formatted data.
    kafka.prepare_storage(
        layout,
        ports["kafka"],
        ports["kafka_controller"],
        extra_format_args=scram,
        marker=scram_marker(scram),
    )
    # Kafka 4 fetches OAuth URLs only when this JVM property allows them (CVE-2025-27817).
    allowed = f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={jwks_url},{token_url}"
    kafka_pid = kafka.start(layout, extra_jvm_options=(allowed,))
    record(kafka_pid)
    info = SecureKafka(
        folder=folder,
        host=host,
        admin_bootstrap=f"{host}:{ports['kafka']}",
        sasl_bootstrap=f"{host}:{ports['kafka_sasl']}",
        mtls_bootstrap=f"{host}:{ports['kafka_mtls']}",
        oauth_bootstrap=f"{host}:{ports['kafka_oauth']}",
        ca_location=str(material.ca.certificate),
        token_url=token_url,
        jwks_url=jwks_url,
        principals=principals,
        oauth_pid=oauth_pid,
        oauth_log=str(oauth_log),
        authorizer_log=str(layout.authorizer_log),
    )
    return info, kafka_pid, layout


def _keystore(pair: KeyPair) -> Path:
    """The broker's PEM keystore: its unencrypted PKCS#8 key followed by the certificate chain
    (the one-file form of ``ssl.keystore.type=PEM``)."""
    keystore = pair.certificate.parent / "keystore.pem"
    keystore.write_bytes(pair.key.read_bytes() + pair.certificate.read_bytes())
    keystore.chmod(0o600)
    return keystore


def write_client_configs(
    info: SecureKafka, base: dict[str, Any], header: str
) -> dict[str, dict[str, Path]]:
    """``<folder>/<component>/<mechanism>.yaml`` for every component and mechanism: ``base``
    (a whole mailtap config) with its ``kafka`` section's connection settings replaced."""
    import yaml

    written: dict[str, dict[str, Path]] = {}
    for component in PRINCIPALS:
        target = info.folder / component
        target.mkdir(parents=True, exist_ok=True)
        for mechanism in MECHANISMS:
            kafka_section = {
                k: v
                for k, v in base.get("kafka", {}).items()
                if k not in ("bootstrap_servers", "security_protocol")
            }
            kafka_section.update(info.kafka_section(component, mechanism))
            document = {**base, "kafka": kafka_section}
            path = target / f"{mechanism}.yaml"
            path.write_text(
                header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
            )
            path.chmod(0o600)
            written.setdefault(component, {})[mechanism] = path
    return written


def start_standalone(folder: Path, host: str = "127.0.0.1") -> tuple[SecureKafka, list[int]]:
    """The secured broker and its OAuth server alone (no Dovecot, SMTP or registry), on free
    ports, ready: what the secured integration tests start once per session. Returns the
    details and the process groups to stop (`process.stop_group`)."""
    names = ["kafka", "kafka_controller", *PORT_NAMES]
    ports = dict(zip(names, process.free_ports(len(names), host), strict=True))
    pids: list[int] = []
    try:
        info, kafka_pid, layout = launch(folder, host, ports, pids.append)
        kafka.wait_ready(layout, kafka_pid, info.admin_bootstrap)
    except BaseException:
        for pid in pids:
            process.stop_group(pid)
        raise
    return info, pids
