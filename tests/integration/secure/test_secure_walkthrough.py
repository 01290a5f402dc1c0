"""deploy/README.md's walk-through onto a secured cluster (issue 27 item 6), run as written.

The commands are read from the README (between ``walkthrough:begin`` and ``walkthrough:end``),
so the page and this test cannot drift apart, and run in one ``bash -e`` in a fresh directory
against the broker of ``mailtap dev up --secure`` (SASL_SSL SCRAM-SHA-512, ``StandardAuthorizer``,
no ACL = no access, no auto-created topics). What the README leaves to the user is provided as
a user would: ``mailtap.env`` is ``deploy/compose/mailtap.env.example`` filled in (this
session's broker, its CA, a Dovecot mailbox; a ``kafka.namespace`` of its own, as the session's
broker is shared by the tests), and the three passwords are shell variables.

Checked: every command succeeds; the grants created exactly the bindings ``mailtap acls``
computes for each principal with this config; the README's own consumer (``other-team-reader``)
printed the mail; a stock confluent-kafka consumer logged in as ``other-team-reader`` finds it
on ``mail.events``; the IMAP source is still running and never logged a password.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AclBinding, AdminClient  # type: ignore[attr-defined]
from imapclient import IMAPClient

from connectors.core.config import load_config
from mailtap.aclgrant import bindings
from mailtap.acls import component_acls
from mailtap.dev import DevServices, process
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.secure import PRINCIPALS, SecureKafka
from mailtap.dev.secure_acls import principal_bindings
from tests.integration.imap.imap_harness import make_mail
from tests.integration.secure.conftest import revoke

README = REPO_ROOT / "deploy" / "README.md"
ENV_EXAMPLE = REPO_ROOT / "deploy" / "compose" / "mailtap.env.example"
#: The issue's bound on the walk-through.
MAX_COMMANDS = 10
#: The whole walk-through: topics, grants, a source start, the first mail read back. Far more
#: than it takes (~30 s here), so that a loaded machine does not fail it.
WALKTHROUGH_TIMEOUT_S = 240.0
#: The independent read of a mail the walk-through's consumer already printed.
READ_BACK_S = 60.0
#: ``mailtap acls --component`` -> the principal the walk-through grants it to.
GRANTED = {
    "imap-source": PRINCIPALS["imap-source"],
    "streams": PRINCIPALS["streams"],
    "smtp-sink": PRINCIPALS["smtp-sink"],
    "reader": PRINCIPALS["other-team"],
}


def walkthrough_commands() -> list[str]:
    """The command lines of the README's walk-through block, verbatim (comments dropped)."""
    text = README.read_text()
    block = text.split("<!-- walkthrough:begin -->\n", 1)[1].split("<!-- walkthrough:end -->")[0]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in body.splitlines() if line.strip() and not line.startswith("#")]


def filled_env_file(values: dict[str, str], leave_out: set[str]) -> str:
    """deploy/compose/mailtap.env.example with ``values`` filled in: each key's line replaced,
    keys the example lacks appended, the keys of ``leave_out`` removed."""
    lines: list[str] = []
    seen: set[str] = set()
    for line in ENV_EXAMPLE.read_text().splitlines():
        key = line.split("=", 1)[0] if re.match(r"^[A-Z0-9_]+=", line) else None
        if key in leave_out:
            continue
        if key in values:
            seen.add(key)
            line = f"{key}={_quoted(values[key])}"
        lines.append(line)
    lines += [f"{k}={_quoted(v)}" for k, v in values.items() if k not in seen]
    return "\n".join(lines) + "\n"


def _read_env_file(path: Path) -> dict[str, str]:
    """The variables ``set -a && . ./mailtap.env`` exports (values plain or single-quoted)."""
    variables: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if re.match(r"^[A-Z0-9_]+=", line):
            key, value = line.split("=", 1)
            quoted = len(value) >= 2 and value[0] == value[-1] == "'"
            variables[key] = value[1:-1] if quoted else value
    return variables


def _quoted(value: str) -> str:
    # Single quotes: nothing inside is interpreted, by compose's env-file syntax and by sh alike.
    assert "'" not in value
    return f"'{value}'"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A directory of the user's: the repository's deploy/ (the compose config) beside it."""
    (tmp_path / "deploy").symlink_to(REPO_ROOT / "deploy")
    yield tmp_path


@pytest.mark.timeout(420)
def test_the_readme_walkthrough_runs_against_a_secured_cluster(
    services: DevServices,
    secure_kafka: SecureKafka,
    admin: AdminClient,
    unique: str,
    workdir: Path,
) -> None:
    commands = walkthrough_commands()
    assert 3 <= len(commands) <= MAX_COMMANDS, commands

    namespace = f"walk{unique}"
    mailbox = services.add_user(f"walk-{unique}@example.com", f"pw-{unique}")
    message_id = f"walkthrough-{unique}@example.com"
    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=10) as client:
        client.login(mailbox.username, mailbox.password)
        client.append("INBOX", make_mail(message_id, "a customer's question"))

    values = {
        "MAILTAP_KAFKA_BOOTSTRAP": secure_kafka.sasl_bootstrap,
        "MAILTAP__KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "MAILTAP__KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "MAILTAP__KAFKA__SSL_CA_LOCATION": secure_kafka.ca_location,
        "MAILTAP__KAFKA__SCHEMA_REGISTRY_URL": "null",  # the secured broker comes alone
        "MAILTAP__KAFKA__REPLICATION_FACTOR": "1",
        "MAILTAP__KAFKA__NAMESPACE": namespace,
        "MAILTAP__IMAP__ACCOUNTS__0__HOST": services.imap.host,
        "MAILTAP__IMAP__ACCOUNTS__0__PORT": str(services.imap.port),
        "MAILTAP__IMAP__ACCOUNTS__0__SECURITY": "plain",
        "MAILTAP__IMAP__ACCOUNTS__0__USERNAME": mailbox.username,
        "MAILTAP__IMAP__ACCOUNTS__0__PASSWORD": mailbox.password,
        "MAILTAP__IMAP__ACCOUNTS__0__START": "all",
        # 4 instead of 32 partitions: the session's broker holds every test's topics.
        "MAILTAP__IMAP__GROUP__WORK_PARTITIONS": "4",
        "MAILTAP__CLAIM_CHECK__URL": (workdir / "claims").as_uri(),
        "MAILTAP__HEALTH__HOST": "127.0.0.1",
        "MAILTAP__HEALTH__PORT": str(process.free_port("127.0.0.1")),
        "MAILTAP__STREAMS__DATA_DIR": str(workdir / "streams"),
    }
    # Every command logs in as its own principal; the secured broker comes without a registry.
    leave_out = {
        "MAILTAP__KAFKA__SASL_USERNAME",
        "MAILTAP__KAFKA__SASL_PASSWORD",
        "MAILTAP__KAFKA__SCHEMA_REGISTRY__BASIC_AUTH_USERNAME",
        "MAILTAP__KAFKA__SCHEMA_REGISTRY__BASIC_AUTH_PASSWORD",
    }
    (workdir / "mailtap.env").write_text(filled_env_file(values, leave_out=leave_out))
    (workdir / "mailtap.env").chmod(0o600)

    principals = secure_kafka.principals
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILTAP")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        ADMIN_PASSWORD=principals["admin"].password,
        SOURCE_PASSWORD=principals["imap-source"].password,
        READER_PASSWORD=principals["other-team"].password,
    )
    held_before = {p: set(principal_bindings(admin, p)) for p in GRANTED.values()}
    admin_login = {
        "MAILTAP__KAFKA__SASL_USERNAME": principals["admin"].name,
        "MAILTAP__KAFKA__SASL_PASSWORD": principals["admin"].password,
    }
    config = load_config(
        REPO_ROOT / "deploy" / "compose" / "mailtap.yaml",
        env={**_read_env_file(workdir / "mailtap.env"), **admin_login},
    )
    expected: dict[str, set[AclBinding]] = {
        principal: set(bindings(principal, component_acls(config, component)))
        for component, principal in GRANTED.items()
    }

    script = "\n".join(commands) + "\n"
    walk = subprocess.Popen(
        ["bash", "-e", "-c", script],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the background source is in this group: stopped below
    )
    try:
        try:
            out, err = walk.communicate(timeout=WALKTHROUGH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            walk.kill()
            out, err = walk.communicate()
            source_log = (workdir / "imap-source.log").read_text(errors="replace")
            pytest.fail(f"the walk-through did not end: {out}\n{err}\n{source_log}")
        source_log = (workdir / "imap-source.log").read_text(errors="replace")
        assert walk.returncode == 0, f"{out}\n{err}\n{source_log}"

        # The README's consumer, as the other team, printed the mail.
        assert message_id in out, out
        # The grants: exactly what `mailtap acls` computes, for each principal.
        for principal, wanted in expected.items():
            created = set(principal_bindings(admin, principal)) - held_before[principal]
            assert created == wanted - held_before[principal], principal
        # A stock consumer, logged in as the other team, reads it from mail.events.
        topic, group = f"{namespace}.mail.events", f"{namespace}.mailtap-consume-check"
        assert _found_on_events_topic(secure_kafka, topic, group, message_id)
        # The source runs on (nothing was refused) and logged no secret.
        assert process.group_members(walk.pid), source_log
        assert principals["imap-source"].password not in source_log + out + err
        assert principals["admin"].password not in out + err
    finally:
        process.stop_group(walk.pid)
        for principal in GRANTED.values():
            created = set(principal_bindings(admin, principal)) - held_before[principal]
            if created:
                revoke(admin, sorted(created, key=str))
    assert process.group_members(walk.pid) == []


def _found_on_events_topic(secure_kafka: SecureKafka, topic: str, group: str, needle: str) -> bool:
    """Whether a record on ``topic`` holds ``needle``, read from the start by a plain
    confluent-kafka consumer with the other team's own SCRAM login (no mailtap code: Avro
    strings are UTF-8 bytes in the record)."""
    who = secure_kafka.principals["other-team"]
    consumer = Consumer(
        {
            "bootstrap.servers": secure_kafka.sasl_bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": who.name,
            "sasl.password": who.password,
            "ssl.ca.location": secure_kafka.ca_location,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + READ_BACK_S
        while time.monotonic() < deadline:
            record = consumer.poll(1.0)
            if record is None or record.error() is not None or record.value() is None:
                continue
            if needle.encode() in record.value():
                return True
        return False
    finally:
        consumer.close()


def test_a_grant_by_a_login_without_alter_on_the_cluster_says_so(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    """`mailtap acls --grant` as a principal that may not create ACLs: one line naming the
    missing right and the way out, no traceback, nothing granted."""
    config = tmp_path / "reader.yaml"
    config.write_text(
        yaml.safe_dump({"kafka": secure_kafka.kafka_section("other-team", "scram-sha-512")})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILTAP")}
    refused = subprocess.run(
        [
            *(sys.executable, "-m", "mailtap.cli", "acls", "-c", str(config)),
            *("--component", "reader", "--principal", "someone-else", "--grant"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "principal User:other-team-reader may not create ACLs" in refused.stderr
    assert "without --grant" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == ""
