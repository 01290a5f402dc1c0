"""A missing permission is one clear line, before anything is sent or advanced (issue 27 item 4).

Against the secured broker, the SMTP sink and the IMAP source get exactly the ACLs
`connectors.core.kafka.acls` computes for their config (the component works: a mail flows), then
each of a set of those ACLs is left out in turn: the component stops within 30 s (the IMAP source
with a refused transactional id: backs off, unhealthy) with one line naming the operation and the
resource and the kafka-acls command that grants it, no traceback, nothing sent, no event written,
no cursor moved. The cases cover every kind of resource and operation the components need; all
ACLs of both components would take several minutes of CI (a process start each).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.core.config import MailtapConfig, config_from_dict
from connectors.core.kafka.acls import Acl
from connectors.core.kafka.topics import ensure_topics
from connectors.smtp.state import ensure_state_topic
from mailtap.acls import component_acls
from mailtap.dev import Account, DevServices
from mailtap.dev.secure import SecureKafka
from tests.integration.imap.imap_harness import ImapHarness, wait_for
from tests.integration.secure.conftest import bindings, grant, revoke
from tests.integration.smtp.smtp_harness import TopicReader, command, produce_commands
from tests.integration.smtp.smtp_scripted_server import ScriptedRelay

REPO = Path(__file__).resolve().parents[3]
#: The line must come this soon after the start (the brief's bound; not a speed target).
STOP_WITHIN_S = 30.0
SINK = "mailtap-smtp-sink"
SOURCE = "mailtap-imap-source"


def _case(resource_type: str, name: str, operation: str, pattern: str = "literal") -> Any:
    return pytest.param((resource_type, name, operation, pattern), id=f"{operation}-{name}")


def _pick(needed: list[Acl], case: tuple[str, str, str, str], names: dict[str, str]) -> Acl:
    resource_type, template, operation, pattern = case
    name = template.format(**names)
    found = [
        a
        for a in needed
        if (a.resource_type, a.name, a.operation, a.pattern)
        == (resource_type, name, operation, pattern)
    ]
    assert found, f"{operation} {resource_type} {name} is not among the computed ACLs: {needed}"
    return found[0]


def _wait_exit_or_line(proc: subprocess.Popen[bytes], log: Path, line: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < STOP_WITHIN_S + 30:
        text = log.read_text(errors="replace") if log.exists() else ""
        if line in text and (proc.poll() is not None or "will retry in" in text):
            return time.monotonic() - start
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    return time.monotonic() - start


def _healthz(log_text: str) -> tuple[int, dict[str, Any]]:
    port = re.search(r"health endpoint on http://127.0.0.1:(\d+)/healthz", log_text)
    assert port, log_text
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# --- the SMTP sink ---------------------------------------------------------------------------


@pytest.fixture
def relay() -> Iterator[ScriptedRelay]:
    with ScriptedRelay(stall_seconds=4.0) as server:
        yield server


def _sink_raw(secure_kafka: SecureKafka, unique: str, port: int) -> dict[str, Any]:
    return {
        "kafka": {
            "bootstrap_servers": secure_kafka.admin_bootstrap,
            "partitions": 1,
            "topics": {
                "commands": f"mail.commands.{unique}",
                "retry_prefix": f"mail.commands.{unique}.retry",
                "dlq": f"mail.commands.{unique}.dlq",
                "delivery": f"mail.delivery.{unique}",
                "suppressions": f"mail.suppressions.{unique}",
            },
        },
        "health": {"port": 0},
        "smtp": {
            "host": "127.0.0.1",
            "port": port,
            "security": "plain",
            "from_address": "mailtap@example.com",
            "group_id": f"sink-{unique}",
            "state_topic": f"mailtap.sink.state.{unique}",
            "instance_id": f"test-{unique}",
            "retry_tiers": ["1s"],
        },
    }


def _run_sink(
    secure_kafka: SecureKafka,
    admin: AdminClient,
    relay: ScriptedRelay,
    unique: str,
    tmp_path: Path,
    leave_out: tuple[str, str, str, str] | None,
) -> tuple[subprocess.Popen[bytes], Path, Acl | None, MailtapConfig]:
    raw = _sink_raw(secure_kafka, unique, relay.port)
    admin_cfg = config_from_dict(raw)
    # The topics exist (the admin's `topics ensure`), with the command waiting.
    produce_commands(admin_cfg, [command(["someone@example.org"], command_id=f"c-{unique}")])
    ensure_state_topic(admin_cfg.kafka, raw["smtp"]["state_topic"], 1)
    raw["kafka"] = {**raw["kafka"], **secure_kafka.kafka_section("smtp-sink", "scram-sha-512")}
    cfg = config_from_dict(raw)
    needed = component_acls(cfg, "smtp-sink")
    names = {"unique": unique}
    missing = _pick(needed, leave_out, names) if leave_out else None
    granted = bindings(SINK, [a for a in needed if a != missing])
    grant(admin, granted)
    config = tmp_path / "sink.yaml"
    config.write_text(yaml.safe_dump(raw))
    log = tmp_path / "sink.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MAILTAP_LOG_LEVEL": "INFO"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", "smtp-sink", "-c", str(config)],
            env=env,
            stdout=out,
            stderr=out,
        )
    proc.granted = granted  # type: ignore[attr-defined]  # revoked by the caller
    return proc, log, missing, admin_cfg


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_sink_with_exactly_the_computed_acls_sends(
    secure_kafka: SecureKafka,
    admin: AdminClient,
    relay: ScriptedRelay,
    unique: str,
    tmp_path: Path,
) -> None:
    proc, log, _, admin_cfg = _run_sink(secure_kafka, admin, relay, unique, tmp_path, None)
    reader = TopicReader(admin_cfg, admin_cfg.kafka.topics.delivery)
    try:
        wait_for(lambda: relay.handler.snapshot() or proc.poll() is not None, "the reply sent")
        assert proc.poll() is None, log.read_text()
        wait_for(
            lambda: reader.poll() or any(v["status"] == "SENT" for v in reader.values),
            "its SENT delivery event",
        )
        assert len(relay.handler.snapshot()) == 1
    finally:
        _stop(proc)
        reader.close()
        revoke(admin, proc.granted)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "leave_out",
    [
        _case("topic", "mail.commands.{unique}", "Read"),
        _case("topic", "mail.delivery.{unique}", "Write"),
        _case("topic", "mail.delivery.{unique}", "Read"),
        _case("topic", "mail.suppressions.{unique}", "Read"),
        _case("topic", "mail.commands.{unique}.retry.1s", "Write"),
        _case("topic", "mail.commands.{unique}.dlq", "DescribeConfigs"),
        _case("topic", "mailtap.sink.state.{unique}", "Create"),
        _case("group", "sink-{unique}", "Read"),
        _case("group", "mailtap-suppressions-", "Describe", "prefixed"),
        _case("transactional-id", "sink-{unique}.", "Write", "prefixed"),
    ],
)
def test_sink_without_one_acl_stops_with_the_line(
    secure_kafka: SecureKafka,
    admin: AdminClient,
    relay: ScriptedRelay,
    unique: str,
    tmp_path: Path,
    leave_out: tuple[str, str, str, str],
) -> None:
    proc, log, missing, admin_cfg = _run_sink(
        secure_kafka, admin, relay, unique, tmp_path, leave_out
    )
    assert missing is not None
    resource = f"{missing.resource_type} {missing.name}"
    line = f"may not {missing.operation.upper()} {resource}"
    try:
        took = _wait_exit_or_line(proc, log, line)
        text = log.read_text(errors="replace")
        assert proc.poll() is not None, f"still running after {took:.0f} s:\n{text}"
        assert took < STOP_WITHIN_S, text
        assert proc.returncode != 0
        assert line in text and f"User:{SINK}" in text and "kafka-acls.sh" in text, text
        assert "--operation " + missing.operation in text, text
        assert "Traceback" not in text, text
        assert relay.handler.snapshot() == [], "a mail was sent without the permission"
        reader = TopicReader(admin_cfg, admin_cfg.kafka.topics.delivery)
        try:
            reader.drain(5)
            assert reader.values == []
        finally:
            reader.close()
    finally:
        _stop(proc)
        revoke(admin, proc.granted)  # type: ignore[attr-defined]


# --- the IMAP source -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "leave_out",
    [
        _case("topic", "{events}", "Write"),
        _case("topic", "{events}", "Read"),
        _case("topic", "{offsets}", "Read"),
        _case("topic", "{mailboxes}", "Create"),
        _case("group", "mailtap-mailboxes-reader", "Describe"),
        _case("topic", "{index}", "Write"),
        _case("topic", "{offsets}", "DescribeConfigs"),
        _case("group", "mailtap-offsets-reader", "Describe"),
        _case("transactional-id", "mailtap-imap-", "Write", "prefixed"),
    ],
)
def test_imap_source_without_one_acl_stops_with_the_line(
    services: DevServices,
    imap_account: Account,
    unique: str,
    tmp_path: Path,
    secure_kafka: SecureKafka,
    admin: AdminClient,
    leave_out: tuple[str, str, str, str],
) -> None:
    harness = ImapHarness(
        services, imap_account, unique, tmp_path, bootstrap=secure_kafka.admin_bootstrap
    )
    t = harness.kafka.topics
    # The topics exist (the admin's `topics ensure` and the source's index topic).
    ensure_topics(harness.kafka)
    from connectors.core.kafka.topics import ensure_topic_specs
    from connectors.imap.indexlog import topic_spec

    ensure_topic_specs(harness.kafka, [topic_spec(harness.kafka)])
    config = harness.config_dict()
    config["kafka"] = {**config["kafka"], **secure_kafka.kafka_section("imap-source", "mtls")}
    needed = component_acls(MailtapConfig.model_validate(config), "imap-source")
    names = {
        "events": t.events,
        "offsets": t.offsets,
        "mailboxes": t.mailboxes,
        "index": t.imap_index,
    }
    missing = _pick(needed, leave_out, names)
    granted = bindings(SOURCE, [a for a in needed if a != missing])
    path = tmp_path / "imap-source.yaml"
    path.write_text(yaml.safe_dump(config))
    line = f"may not {missing.operation.upper()} {missing.resource_type} {missing.name}"
    try:
        grant(admin, granted)
        harness.append_numbered(1, tag="denied")
        source = harness.spawn(path)
        log = tmp_path / "source.log"
        took = _wait_exit_or_line(source, log, line)
        text = harness.log()
        assert line in text and f"User:{SOURCE}" in text and "kafka-acls.sh" in text, text
        assert took < STOP_WITHIN_S, text
        if missing.resource_type == "transactional-id":
            # Refused at the mailbox's first transaction: it backs off, writes nothing, and
            # /healthz says why (503) although the mailbox never synced.
            assert source.poll() is None, text
            status, body = _healthz(text)
            assert status == 503 and line in body["reason"], body
        else:
            assert source.poll() is not None and source.returncode != 0, text
            assert "Traceback" not in text, text
        assert harness.events() == []
        assert harness.cursor() is None
    finally:
        harness.stop_all()
        revoke(admin, granted)
