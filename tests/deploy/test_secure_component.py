"""A component from the image against a secured cluster (issue 27 item 6): the IMAP source in a
container built from deploy/Dockerfile, from the shipped compose config with environment
overrides only, logs in to the secured broker of ``mailtap dev up --secure`` with SASL_SSL
SCRAM-SHA-512 as a principal that holds only prefixed ACLs on its ``kafka.namespace``; the CA
is a file mounted into the container read-only, as a compose or Kubernetes secret would be.
A mail appended to the mailbox becomes its MailEvent on ``<namespace>.mail.events``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from mailtap.dev.process import free_port
from tests.deploy.containers import logs, mailtap_container, status, wait_healthy
from tests.deploy.test_compose import kafka_secrets

# The secured broker of the integration tests (fixtures), started once for this session too.
from tests.integration.secure.conftest import admin, secure_kafka  # noqa: F401
from tests.integration.secure.test_secure_namespaces import Deployment, append
from tests.support import deploy
from tests.unit.deploy.test_compose_logins import readme_override

CONFIG = deploy.ROOT / "deploy" / "compose" / "mailtap.yaml"
CA_IN_CONTAINER = "/run/secrets/kafka-ca.pem"
PUBLISH_S = 120.0


@pytest.fixture
def tenant(services, secure_kafka, admin, unique, tmp_path) -> Iterator[Deployment]:  # noqa: F811
    mailbox = services.add_user(f"image-{unique}@example.com", f"pw-{unique}")
    tenant = Deployment(f"img{unique}", secure_kafka, admin, mailbox, services, tmp_path)
    tenant.provision()
    yield tenant


@pytest.mark.timeout(600)
def test_imap_source_image_publishes_over_sasl_ssl(
    image,
    docker_api,
    volume,
    services,
    secure_kafka,  # noqa: F811 - the imported fixture
    tenant,
    unique,
    tmp_path,
) -> None:
    ca = tmp_path / "ca.pem"
    shutil.copyfile(secure_kafka.ca_location, ca)
    ca.chmod(0o644)  # the image's user (10001) reads it
    port = free_port()
    env = {
        "MAILTAP_KAFKA_BOOTSTRAP": secure_kafka.sasl_bootstrap,
        "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "MAILTAP__KAFKA__SASL_USERNAME": tenant.principal,
        "MAILTAP__KAFKA__SASL_PASSWORD": tenant.password,
        "MAILTAP__KAFKA__SSL_CA_LOCATION": CA_IN_CONTAINER,
        "MAILTAP__KAFKA__NAMESPACE": tenant.namespace,
        "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "null",  # the secured broker comes alone
        "MAILTAP__KAFKA__REPLICATION_FACTOR": "1",
        "MAILTAP__IMAP__ACCOUNTS__0__HOST": services.imap.host,
        "MAILTAP__IMAP__ACCOUNTS__0__PORT": str(services.imap.port),
        "MAILTAP__IMAP__ACCOUNTS__0__SECURITY": "plain",
        "MAILTAP__IMAP__ACCOUNTS__0__USERNAME": tenant.mailbox.username,
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": tenant.mailbox.password,
        "MAILTAP__IMAP__ACCOUNTS__0__START": "all",
        "MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS": "support@example.com",
        "MAILTAP__SMTP__FROM_ADDRESS": "support@example.com",
        "MAILTAP__HEALTH__PORT": str(port),
    }
    container = mailtap_container(image, ["run", "imap-source"], CONFIG, env, volume)
    container.with_volume_mapping(str(ca), CA_IN_CONTAINER, "ro")
    started = container.start()
    try:
        wait_healthy(started, port)
        ids = append(tenant, services, f"image-{unique}", 2)
        deadline = time.monotonic() + PUBLISH_S
        while tenant.message_ids() != ids and time.monotonic() < deadline:
            assert status(started) == "running", logs(started)
            time.sleep(2)
        assert tenant.message_ids() == ids, logs(started)
        assert tenant.password not in logs(started, 1000)  # a secret is never logged
    finally:
        started.stop()


#: Runs the compose services on the host's network: the secured broker listens on loopback.
HOST_NETWORK = """
services:
  topics: {network_mode: host}
  smtp-sink: {network_mode: host}
"""
#: librdkafka reports a refused SASL login within a second; the rest is the container's start.
REFUSED_WITHIN_S = 60.0


@pytest.mark.timeout(600)
def test_compose_services_log_in_with_their_own_secret_files(
    podman,
    image,
    secure_kafka,  # noqa: F811 - the imported fixture
    unique,
    tmp_path,
) -> None:
    """docker-compose.yml as shipped (plus host networking), against the secured broker: the
    ``topics`` service logs in as ``mailtap-admin`` with the password of its own secret file
    and creates the topics; ``smtp-sink`` with a wrong password in ITS file stops at once with
    the ``refused the login`` line naming its own principal."""
    ca = tmp_path / "ca.pem"
    shutil.copyfile(secure_kafka.ca_location, ca)
    ca.chmod(0o644)
    env_file = tmp_path / "mailtap.env"
    env_file.write_text(
        "".join(
            f"{k}={v}\n"
            for k, v in {
                **deploy.COMPOSE_REQUIRED,
                "MAILTAP_KAFKA_BOOTSTRAP": secure_kafka.sasl_bootstrap,
                "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
                "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
                "MAILTAP__KAFKA__SSL_CA_LOCATION": CA_IN_CONTAINER,
                "MAILTAP__KAFKA__NAMESPACE": f"cmp{unique}",
                "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "null",
                "MAILTAP__KAFKA__REPLICATION_FACTOR": "1",
            }.items()
        )
    )
    secrets = kafka_secrets(tmp_path)
    (secrets / "admin.password").write_text(secure_kafka.principals["admin"].password + "\n")
    (secrets / "smtp-sink.password").write_text("not-the-sinks-password")
    override = tmp_path / "host-network.yml"
    override.write_text(HOST_NETWORK)
    env = {
        **podman.env,
        "MAILTAP_ENV_FILE": str(env_file),
        "MAILTAP_KAFKA_SECRETS": str(secrets),
    }

    def compose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "podman_compose",
                "-p",
                f"mailtap-logins-{unique}",
                "-f",
                str(deploy.COMPOSE_FILE),
                "-f",
                str(override),
                *args,
            ],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=deploy.ROOT,
        )

    ca_mount = f"{ca}:{CA_IN_CONTAINER}:ro"
    try:
        ensure = compose("run", "--rm", "--no-deps", "-T", "-v", ca_mount, "topics")
        assert ensure.returncode == 0, ensure.stdout[-3000:] + ensure.stderr[-3000:]
        assert f"cmp{unique}.mail.events" in ensure.stdout + ensure.stderr

        started = time.monotonic()
        sink = compose("run", "--rm", "--no-deps", "-T", "-v", ca_mount, "smtp-sink", timeout=180)
        took = time.monotonic() - started
        output = sink.stdout + sink.stderr
        assert sink.returncode != 0, output[-3000:]
        assert "refused the login of mailtap-smtp-sink" in output, output[-3000:]
        assert "cannot reach Kafka" not in output and "Traceback" not in output, output[-3000:]
        assert "not-the-sinks-password" not in output
        assert secure_kafka.principals["admin"].password not in output
        assert took < REFUSED_WITHIN_S, f"refused after {took:.0f} s"
    finally:
        compose("down", "-v", timeout=120)


@pytest.mark.timeout(600)
def test_readme_mtls_and_oauthbearer_overrides_log_the_sink_in(
    podman,
    image,
    secure_kafka,  # noqa: F811 - the imported fixture
    unique,
    tmp_path,
) -> None:
    """deploy/README.md's two compose overrides as written (their folder moved to the test's),
    against the secured broker's mTLS and OAUTHBEARER listeners: the sink logs in with the
    certificate, key and key password, then with the client secret, each from its own secret
    files, and gets as far as its permission check (no ACL granted for its namespace: it stops
    with the ``may not`` line; a refused login would have said ``refused``)."""
    ca = tmp_path / "ca.pem"
    shutil.copyfile(secure_kafka.ca_location, ca)
    ca.chmod(0o644)
    who = secure_kafka.principals["smtp-sink"]
    secrets = kafka_secrets(tmp_path)
    # The README's override carries a key password: the sink's key, encrypted with one.
    key_password = f"key-{unique}"
    key = serialization.load_pem_private_key(Path(who.key).read_bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(key_password.encode()),
    )
    for suffix, content in {
        "pem": Path(who.certificate).read_text(),
        "key": encrypted.decode(),
        "key-password": key_password,
        "client-secret": who.client_secret,
    }.items():
        path = secrets / f"smtp-sink.{suffix}"
        path.write_text(content)
        path.chmod(0o644)
    clusters = {
        "mtls": {
            "MAILTAP_KAFKA_BOOTSTRAP": secure_kafka.mtls_bootstrap,
            "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SSL",
        },
        "oauthbearer": {
            "MAILTAP_KAFKA_BOOTSTRAP": secure_kafka.oauth_bootstrap,
            "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "MAILTAP__KAFKA__SASL_MECHANISM": "OAUTHBEARER",
            "MAILTAP__KAFKA__SASL_OAUTHBEARER__TOKEN_URL": secure_kafka.token_url,
            "MAILTAP__KAFKA__SASL_OAUTHBEARER__SCOPE": "kafka",
            "MAILTAP__KAFKA__SASL_OAUTHBEARER__CA_FILE": CA_IN_CONTAINER,
        },
    }
    host_network = tmp_path / "host-network.yml"
    host_network.write_text(HOST_NETWORK)
    for kind, cluster in clusters.items():
        override = tmp_path / f"{kind}.yml"
        block = yaml.safe_dump(readme_override(kind))
        override.write_text(block.replace("kafka-secrets/", f"{secrets}/"))
        env_file = tmp_path / f"{kind}.env"
        env_file.write_text(
            "".join(
                f"{k}={v}\n"
                for k, v in {
                    **deploy.COMPOSE_REQUIRED,
                    **cluster,
                    "MAILTAP__KAFKA__SSL_CA_LOCATION": CA_IN_CONTAINER,
                    "MAILTAP__KAFKA__NAMESPACE": f"{kind[:4]}{unique}",
                    "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "null",
                }.items()
            )
        )
        command = [
            sys.executable,
            "-m",
            "podman_compose",
            "-p",
            f"mailtap-{kind}-{unique}",
            "-f",
            str(deploy.COMPOSE_FILE),
            "-f",
            str(override),
            "-f",
            str(host_network),
        ]
        env = {
            **os.environ,
            **podman.env,
            "MAILTAP_ENV_FILE": str(env_file),
            "MAILTAP_KAFKA_SECRETS": str(secrets),
        }
        try:
            sink = subprocess.run(
                [
                    *command,
                    "run",
                    "--rm",
                    "--no-deps",
                    "-T",
                    "-v",
                    f"{ca}:{CA_IN_CONTAINER}:ro",
                    "smtp-sink",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
                cwd=deploy.ROOT,
            )
            output = sink.stdout + sink.stderr
            assert sink.returncode != 0, output[-3000:]
            assert "refused" not in output and "cannot reach Kafka" not in output, output[-3000:]
            assert "kafka: principal User:mailtap-smtp-sink may not" in output, output[-3000:]
            assert "Traceback" not in output
            assert who.client_secret not in output and key_password not in output
        finally:
            subprocess.run(
                [*command, "down", "-v"], env=env, capture_output=True, timeout=120, cwd=deploy.ROOT
            )
