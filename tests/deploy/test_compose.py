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
        "MAILTAP_KAFKA_BOOTSTRAP": "b1.example.com:9093",
        "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "MAILTAP__KAFKA__SASL_USERNAME": "mailtap",
        "MAILTAP__KAFKA__SASL_PASSWORD": "from-a-secret-store",
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": "imap-secret",
    }
    # As deploy/README.md does it: the cluster in an env file, not in the YAML.
    env_file = tmp_path / "mailtap.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in cluster.items()))
    result = compose(podman, "--env-file", str(env_file), "config")
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name in ("imap-source", "streams", "smtp-sink", "topics"):
        env = services[name]["environment"]
        assert env["MAILTAP_KAFKA_BOOTSTRAP"] == "b1.example.com:9093"
        assert env["MAILTAP__KAFKA__SASL_MECHANISM"] == "SCRAM-SHA-512"
    # deploy/README.md's check before `up`: the shipped config with that env file, per component.
    check = podman.run(
        "run",
        "--rm",
        "--env-file",
        str(env_file),
        "-v",
        f"{deploy.ROOT}/deploy/compose/mailtap.yaml:/etc/mailtap/mailtap.yaml:ro",
        image,
        "config",
        "check",
    )
    assert "valid for imap-source, streams, smtp-sink" in check.stdout
    missing = compose(podman, "config", env={"MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": ""})
    assert missing.returncode != 0 and "IMAP password" in missing.stderr + missing.stdout


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
    env_file.write_text("MAILTAP__IMAP__ACCOUNTS__0__PASSWORD=not-used-here\n")
    up = compose(podman, "--env-file", str(env_file), "--profile", "local-kafka", "up", "-d")
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
    finally:
        down = compose(
            podman, "--env-file", str(env_file), "--profile", "local-kafka", "down", "-v"
        )
    assert down.returncode == 0, down.stderr[-2000:]
    assert containers(podman) == {}


def logs(podman) -> str:
    out = []
    for name, container in containers(podman).items():
        tail = podman.run("logs", "--tail", "15", container["Id"], check=False)
        out.append(f"--- {name} ({container['State']})\n{tail.stdout}{tail.stderr}")
    return "\n".join(out)
