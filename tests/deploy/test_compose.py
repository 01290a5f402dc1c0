"""docker-compose.yml with podman-compose: ``config`` resolves an existing cluster from the
environment alone, and ``--profile local-kafka up`` / ``down`` runs the whole file — the broker
and the registry (local stand-ins built from .cache/, tagged with the names the file uses), the
topics created, the streams worker and the sink healthy by the image's own HEALTHCHECK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support import deploy

STANDINS = deploy.ROOT / "deploy" / "podman" / "build-standins.sh"
PROJECT = "mailtap-test"


def compose(podman, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "podman_compose",
            "-p",
            PROJECT,
            "-f",
            str(deploy.COMPOSE_FILE),
            *args,
        ],
        env={**os.environ, **podman.env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=deploy.ROOT,
    )


def test_config_points_at_an_existing_cluster_from_the_environment(podman, image, tmp_path) -> None:
    cluster = {
        **deploy.COMPOSE_REQUIRED,
        "MAILTAP_KAFKA_BOOTSTRAP": "b1.example.com:9093",
        "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
    }
    # As deploy/README.md does it: the cluster in an env file, not in the YAML; no Kafka login
    # there: each service's is its own (below).
    env_file = tmp_path / "mailtap.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in cluster.items()))
    secrets = kafka_secrets(tmp_path)
    result = compose(
        podman,
        "config",
        env={"MAILTAP_ENV_FILE": str(env_file), "MAILTAP_KAFKA_SECRETS": str(secrets)},
    )
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)
    services = rendered["services"]
    files = set()
    for name, user in LOGINS.items():
        assert services[name]["env_file"] == [str(env_file)], services[name]
        assert services[name]["environment"] == {
            "MAILTAP_CONFIG": "/etc/mailtap/mailtap.yaml",
            "MAILTAP_SECRETS_DIR": "/run/secrets",
            "MAILTAP__KAFKA__SASL_USERNAME": user,
        }
        # Its own password: one secret file of its own, where MAILTAP_SECRETS_DIR reads it.
        (secret,) = [
            s for s in services[name]["secrets"] if s["target"] == "MAILTAP__KAFKA__SASL_PASSWORD"
        ]
        files.add(rendered["secrets"][secret["source"]]["file"])
    assert files == {str(secrets / f"{LOGINS_FILES[n]}.password") for n in LOGINS}
    # deploy/README.md's check before `up`, as a service: the shipped config with that env file
    # and the sink's own login (SASL_SSL without a password would be refused by the check).
    env = {"MAILTAP_ENV_FILE": str(env_file), "MAILTAP_KAFKA_SECRETS": str(secrets)}
    try:
        check = compose(
            podman, "run", "--rm", "--no-deps", "-T", "smtp-sink", "config", "check", env=env
        )
        assert check.returncode == 0, check.stdout + check.stderr[-2000:]
        assert "valid for imap-source, streams, smtp-sink, console" in check.stdout
    finally:
        compose(podman, "down", "-v", env=env)


#: compose service -> its Kafka principal (docker-compose.yml, deploy/README.md's ACL table).
LOGINS = {
    "topics": "mailtap-admin",
    "imap-source": "mailtap-imap-source",
    "streams": "mailtap-streams",
    "smtp-sink": "mailtap-smtp-sink",
}
#: compose service -> its password file in kafka-secrets/.
LOGINS_FILES = {
    "topics": "admin",
    "imap-source": "imap-source",
    "streams": "streams",
    "smtp-sink": "smtp-sink",
}


def kafka_secrets(folder: Path) -> Path:
    """kafka-secrets/ as docker-compose.yml's header makes it: one password file per principal,
    readable by the image's user."""
    secrets = folder / "kafka-secrets"
    secrets.mkdir()
    for name in ("admin", "imap-source", "ews-source", "streams", "smtp-sink", "console"):
        path = secrets / f"{name}.password"
        path.write_text(f"password of mailtap-{name}")
        path.chmod(0o644)
    return secrets


#: Printed by ``podman exec`` in a running container: the settings mailtap resolved there.
EFFECTIVE = """
import json, os
from connectors.core.config import load_config
from connectors.imap.config import ImapSourceSettings
from connectors.smtp.config import SmtpSinkSettings
from streams.config import StreamsSettings
config = load_config(os.environ["MAILTAP_CONFIG"])
out = {"kafka": config.kafka.bootstrap_servers, "kafka_user": config.kafka.sasl_username,
       "kafka_password": config.kafka.sasl_password.get_secret_value()}
if config.has_section("imap"):
    account = config.section("imap", ImapSourceSettings).accounts[0]
    out["imap_password"] = account.password.get_secret_value()
if config.has_section("streams"):
    streams = config.section("streams", StreamsSettings)
    out["from"] = streams.from_address.address
    out["require"] = streams.policy_for("ticket_intake")
if config.has_section("smtp"):
    out["envelope_from"] = config.section("smtp", SmtpSinkSettings).from_address
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def standins(podman) -> None:
    build = subprocess.run([str(STANDINS)], capture_output=True, text=True, timeout=1800)
    if build.returncode != 0:
        pytest.fail(f"build-standins.sh failed:\n{build.stderr[-3000:]}")


def containers(podman) -> dict[str, dict]:
    listed = json.loads(
        podman.run(
            "ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "json"
        ).stdout
    )
    return {c["Labels"]["com.docker.compose.service"]: c for c in listed}


@pytest.mark.timeout(900)
def test_up_and_down_with_the_local_kafka_profile(podman, image, standins, tmp_path) -> None:
    env_file = tmp_path / "mailtap.env"
    env_file.write_text(
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD='pa ss #1 !x: \"q\" 0777 é'\n"
        "MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS=help@example.org\n"
        "MAILTAP__SMTP__FROM_ADDRESS=bounces@example.org\n"
        "MAILTAP__STREAMS__WORKFLOWS__TICKET_INTAKE__REQUIRE=none\n"
    )
    env = {"MAILTAP_ENV_FILE": str(env_file), "MAILTAP_KAFKA_SECRETS": str(kafka_secrets(tmp_path))}
    up = compose(podman, "--profile", "local-kafka", "up", "-d", env=env)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert set(containers(podman)) >= {
            "kafka",
            "schema-registry",
            "topics",
            "imap-source",
            "streams",
            "smtp-sink",
        }
        deadline = time.monotonic() + 300
        healthy: set[str] = set()
        while time.monotonic() < deadline and healthy != {"streams", "smtp-sink"}:
            for name in {"streams", "smtp-sink"} - healthy:
                check = podman.run(
                    "healthcheck", "run", containers(podman)[name]["Id"], check=False
                )
                if check.returncode == 0:
                    healthy.add(name)
            time.sleep(3)
        assert healthy == {"streams", "smtp-sink"}, logs(podman)
        topics = podman.run("inspect", containers(podman)["topics"]["Id"]).stdout
        assert json.loads(topics)[0]["State"]["ExitCode"] == 0, logs(podman)
        # What each running component resolved from the env file: every value as written.
        effective = {
            name: json.loads(
                podman.run("exec", containers(podman)[name]["Id"], "python", "-c", EFFECTIVE)
                .stdout.strip()
                .splitlines()[-1]
            )
            for name in ("imap-source", "streams", "smtp-sink")
        }
        for name, settings in effective.items():
            # Each container its own login, the password from its own secret file.
            assert settings["kafka_user"] == LOGINS[name], name
            assert settings["kafka_password"] == f"password of {LOGINS[name]}", name
            assert settings["imap_password"] == 'pa ss #1 !x: "q" 0777 é', name
            assert settings["from"] == "help@example.org", name
            assert settings["require"] == "none", name
            assert settings["envelope_from"] == "bounces@example.org", name
    finally:
        down = compose(podman, "--profile", "local-kafka", "down", "-v", env=env)
    assert down.returncode == 0, down.stderr[-2000:]
    assert containers(podman) == {}


def logs(podman) -> str:
    out = []
    for name, container in containers(podman).items():
        tail = podman.run("logs", "--tail", "15", container["Id"], check=False)
        out.append(f"--- {name} ({container['State']})\n{tail.stdout}{tail.stderr}")
    return "\n".join(out)
