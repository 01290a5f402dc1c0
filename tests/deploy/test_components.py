"""Each component in a container built from deploy/Dockerfile, from the shipped compose config
(deploy/compose/mailtap.yaml) with environment overrides only, against the session's Kafka,
Dovecot and SMTP server: each reaches healthy, and together they do their jobs — a mail
appended to the mailbox becomes its MailEvent, then a ReplyCommand, then a SENT DeliveryEvent
and a reply at the SMTP server. The Exchange source runs from deploy/compose/ews-source.yaml against the test
suite's EWS server. These are the commands of deploy/README.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from imapclient import IMAPClient

from mailtap.dev import scenario
from mailtap.dev.process import free_port, free_ports
from tests.deploy.containers import (
    healthz,
    logs,
    mailtap_container,
    run_once,
    status,
    wait_healthy,
)
from tests.ews_server.fixture import PASSWORD as EWS_PASSWORD
from tests.ews_server.fixture import USER as EWS_USER
from tests.ews_server.fixture import fast_server
from tests.support import deploy

CONFIG = deploy.ROOT / "deploy" / "compose" / "mailtap.yaml"
COMPONENTS = ("imap-source", "streams", "smtp-sink")
STAGE_S = 120.0


def topic_env(unique: str) -> dict[str, str]:
    names = {
        "EVENTS": f"mail.events.{unique}",
        "COMMANDS": f"mail.commands.{unique}",
        "RETRY_PREFIX": f"mail.commands.retry.{unique}",
        "DLQ": f"mail.commands.dlq.{unique}",
        "DELIVERY": f"mail.delivery.{unique}",
        "OFFSETS": f"mailtap.offsets.{unique}",
        "WORKFLOW": f"mail.workflow.{unique}",
    }
    return {f"MAILTAP__KAFKA__TOPICS__{k}": v for k, v in names.items()}


def component_env(services, unique: str, account) -> dict[str, str]:
    """Everything that differs from the shipped file: the cluster, the mailbox, the relay,
    names unique to this run (the session's services are shared)."""
    return {
        "MAILTAP_KAFKA_BOOTSTRAP": services.bootstrap_servers,
        "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "null",  # the session runs no registry
        **topic_env(unique),
        "MAILTAP__IMAP__ACCOUNTS__0__HOST": services.imap.host,
        "MAILTAP__IMAP__ACCOUNTS__0__PORT": str(services.imap.port),
        "MAILTAP__IMAP__ACCOUNTS__0__SECURITY": "plain",
        "MAILTAP__IMAP__ACCOUNTS__0__USERNAME": account.username,
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": account.password,
        "MAILTAP__STREAMS__APP_ID": f"streams-{unique}",
        "MAILTAP__STREAMS__AUTHSERV_ID": scenario.AUTHSERV_ID,
        # Required by the shipped file: no reply leaves from a placeholder address.
        "MAILTAP__STREAMS__FROM_ADDRESS__ADDRESS": scenario.HELPDESK,
        "MAILTAP__SMTP__FROM_ADDRESS": scenario.HELPDESK,
        "MAILTAP__SMTP__HOST": services.smtp.host,
        "MAILTAP__SMTP__PORT": str(services.smtp.port),
        "MAILTAP__SMTP__SECURITY": "plain",
        "MAILTAP__SMTP__GROUP_ID": f"sink-{unique}",
        "MAILTAP__SMTP__STATE_TOPIC": f"mailtap.sink.state.{unique}",
        "MAILTAP__SMTP__INSTANCE_ID": f"sink-{unique}",
    }


def consume(topic: str, env: dict[str, str]) -> list[dict]:
    """``mailtap consume TOPIC --from-beginning`` with the same file and overrides."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mailtap.cli",
            "consume",
            topic,
            "-c",
            str(CONFIG),
            "--from-beginning",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def wait_record(topic: str, env: dict[str, str], wanted, containers) -> dict:
    deadline = time.monotonic() + STAGE_S
    while time.monotonic() < deadline:
        found = [r for r in consume(topic, env) if wanted(r)]
        if found:
            return found[0]
        time.sleep(2)
    raise AssertionError(
        f"nothing wanted on {topic}; logs:\n"
        + "\n".join(f"--- {n} ({status(c)})\n{logs(c)}" for n, c in containers.items())
    )


@pytest.fixture
def running(image, docker_api, volume, services, unique, imap_account) -> Iterator[tuple]:
    env = component_env(services, unique, imap_account)
    ensure = mailtap_container(image, ["topics", "ensure"], CONFIG, env, volume)
    code, output = run_once(ensure)
    assert code == 0, output
    containers = {}
    ports = dict(zip(COMPONENTS, free_ports(len(COMPONENTS)), strict=True))
    try:
        for name in COMPONENTS:
            container = mailtap_container(
                image,
                ["run", name],
                CONFIG,
                {**env, "MAILTAP__HEALTH__PORT": str(ports[name])},
                volume,
            )
            containers[name] = container.start()
        yield env, containers, ports
    finally:
        for container in containers.values():
            container.stop()


@pytest.mark.timeout(600)
def test_each_component_reaches_healthy_and_does_its_job(running, services, imap_account, unique):
    env, containers, ports = running
    started = time.monotonic()
    for name, container in containers.items():
        detail = wait_healthy(container, ports[name])
        print(f"{name}: healthy after {time.monotonic() - started:.1f} s: {detail}")

    mail = scenario.ticket_request(unique)
    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
        client.login(imap_account.username, imap_account.password)
        client.append("INBOX", mail.raw)

    def about_the_mail(record: dict) -> bool:
        return mail.message_id in json.dumps(record)

    event = wait_record(f"mail.events.{unique}", env, about_the_mail, containers)
    print(f"event after {time.monotonic() - started:.1f} s: key {event['key']}")
    command = wait_record(f"mail.commands.{unique}", env, about_the_mail, containers)
    command_id = command["value"]["command_id"]
    print(f"command {command_id[:12]} after {time.monotonic() - started:.1f} s")
    delivery = wait_record(
        f"mail.delivery.{unique}",
        env,
        lambda r: r["key"] == command_id and (r["value"] or {}).get("status") == "SENT",
        containers,
    )
    print(f"SENT after {time.monotonic() - started:.1f} s: {delivery['value']['status']}")
    replies = [m for m in services.received_messages() if mail.message_id.encode() in m.raw]
    assert replies, "the SMTP server received no reply to the mail"
    for name, container in containers.items():
        assert status(container) == "running", f"{name} stopped:\n{logs(container)}"


EWS_CONFIG = deploy.ROOT / "deploy" / "compose" / "ews-source.yaml"


@pytest.mark.timeout(400)
def test_ews_source_reaches_healthy_and_publishes_a_delivered_mail(
    image, docker_api, volume, services, unique
):
    """The fourth component, from deploy/compose/ews-source.yaml (compose --profile ews),
    against the test suite's EWS server (tests/ews_server) on the loopback."""
    with fast_server() as ews:
        env = {
            "MAILTAP_KAFKA_BOOTSTRAP": services.bootstrap_servers,
            "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "null",
            **topic_env(unique),
            "MAILTAP__EWS__ACCOUNTS__0__SERVICE_ENDPOINT": ews.url,
            "MAILTAP__EWS__ACCOUNTS__0__EMAIL": EWS_USER,
            "MAILTAP__EWS__ACCOUNTS__0__AUTH": "basic",
            "MAILTAP__EWS__ACCOUNTS__0__PASSWORD": EWS_PASSWORD,
        }
        code, output = run_once(
            mailtap_container(image, ["topics", "ensure"], EWS_CONFIG, env, volume)
        )
        assert code == 0, output
        port = free_port()
        container = mailtap_container(
            image,
            ["run", "ews-source"],
            EWS_CONFIG,
            {**env, "MAILTAP__HEALTH__PORT": str(port)},
            volume,
        ).start()
        try:
            started = time.monotonic()
            detail = wait_healthy(container, port)
            print(f"ews-source: healthy after {time.monotonic() - started:.1f} s: {detail}")
            # The shipped file starts at start: latest (mail already in the folder is not
            # published): deliver once the folder streams, not while it takes its start point.
            deadline = time.monotonic() + 180
            while "STREAMING" not in healthz(port)[1].get("states", {}).values():
                assert time.monotonic() < deadline, f"never STREAMING:\n{logs(container)}"
                time.sleep(0.5)
            mail = scenario.ticket_request(unique)
            ews.deliver(EWS_USER, mail.raw)
            event = wait_record(
                f"mail.events.{unique}",
                env,
                lambda r: mail.message_id in json.dumps(r),
                {"ews-source": container},
            )
            print(f"ews event after {time.monotonic() - started:.1f} s: key {event['key']}")
            assert status(container) == "running", logs(container)
        finally:
            container.stop()
