"""The console (`mailtap run console`) against the secured broker as its own principal
(`mailtap-console`, SCRAM-SHA-512) with exactly the ACLs `mailtap acls --component console`
prints for its config: its first reading of the topics (mailboxes with a source group, lag of
the streams worker and the sink, DLQ, workflows), a DLQ list and a DLQ replay through the API.
The broker's authorizer log must show no denial of the console: the computed set is not short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings, load_config
from connectors.imap.config import ImapSourceSettings
from mailtap.acls import component_acls
from mailtap.commands.topicscan import scan
from mailtap.dev.process import die_with_parent, free_port
from mailtap.dev.secure import SecureKafka
from tests.integration.secure.conftest import bindings, create_topic, grant

PRINCIPAL = "mailtap-console"
TOKEN = "op-" + "s" * 40
#: The console's first reading of the topics (the page's data) on a loaded machine.
READY_S = 90.0


def _config(secure_kafka: SecureKafka, namespace: str, tmp_path: Path, port: int) -> Path:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"name": "olga", "role": "operator", "token": TOKEN}]))
    doc: dict[str, Any] = {
        "kafka": {
            **secure_kafka.kafka_section("console", "scram-sha-512"),
            "namespace": namespace,
        },
        "claim_check": {"url": f"file://{tmp_path}/claims"},
        # What it watches: a source in a group, the streams worker, the sink (their sections).
        "imap": {
            "accounts": [
                {
                    "name": "support",
                    "host": "127.0.0.1",
                    "username": "support@example.com",
                    "password": "unused",
                    "folders": ["INBOX"],
                }
            ],
            "group": {"work_partitions": 2},
        },
        "streams": {"from_address": {"address": "support@example.com"}},
        "smtp": {"host": "127.0.0.1", "from_address": "support@example.com"},
        "console": {"port": port, "tokens_file": str(tokens), "refresh_seconds": 2},
    }
    path = tmp_path / "console.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except OSError:
        return 0, None


def _denials(log: Path, since: int) -> list[str]:
    with open(log, errors="replace") as lines:
        lines.seek(since)
        return [line for line in lines if f"User:{PRINCIPAL} is Denied" in line]


def test_console_reads_and_replays_with_its_computed_acls(
    secure_kafka: SecureKafka, admin: AdminClient, unique: str, tmp_path: Path
) -> None:
    port = free_port()
    path = _config(secure_kafka, f"con{unique}", tmp_path, port)
    cfg = load_config(path, env={})
    topics = cfg.kafka.topics
    # What `topics ensure` and the components would have made; the console ensures its audit
    # topic and creates `<dlq>.dropped` itself (both among its ACLs).
    for name in (
        topics.events,
        topics.offsets,
        topics.commands,
        topics.dlq,
        topics.delivery,
        topics.workflow,
        topics.mailboxes,  # the console's mailbox table needs it (the sources create it)
    ):
        create_topic(admin, name)
    group = cfg.section("imap", ImapSourceSettings).group
    assert group is not None
    create_topic(admin, group.topic("imap"), partitions=group.work_partitions)
    grant(admin, bindings(PRINCIPAL, component_acls(cfg, "console")))
    # A command the sink gave up on, as it writes it: the original bytes with error headers.
    dead_value = b"original command bytes " + unique.encode()
    seeder = Producer({"bootstrap.servers": secure_kafka.admin_bootstrap})
    seeder.produce(
        topics.dlq,
        key=f"cmd-{unique}".encode(),
        value=dead_value,
        partition=0,
        headers=[
            ("mailtap.error.reason", b"550 5.1.1 relay refused"),
            ("mailtap.error.class", b"SMTPRecipientsRefused"),
            ("mailtap.error.topic", topics.commands.encode()),
            ("mailtap.error.partition", b"0"),
        ],
    )
    assert seeder.flush(30) == 0
    del seeder  # its connection ends here, not at the broker's shutdown

    authorizer_log = Path(secure_kafka.authorizer_log)
    log_start = authorizer_log.stat().st_size if authorizer_log.exists() else 0
    log_path = tmp_path / "console.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILTAP")}
    with log_path.open("ab") as log:
        console = subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", "console", "-c", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        listed: Any = None
        status = 0
        while time.monotonic() < deadline and console.poll() is None:
            status, listed = _call(f"{url}/api/v1/dlq")
            if status == 200:
                break
            time.sleep(1)
        console_log = log_path.read_text(errors="replace")
        assert console.poll() is None and status == 200, f"{status} {listed}\n{console_log[-3000:]}"
        # The read API: the dead letter, from the first reading (status, DLQ, workflows).
        assert [row["key"] for row in listed["items"]] == [f"cmd-{unique}"], listed
        record = listed["items"][0]["id"]
        status, lag = _call(f"{url}/api/v1/lag")
        assert status == 200 and set(lag["groups"]) == {
            f"con{unique}.mailtap-streams",
            f"con{unique}.mailtap-smtp-sink",
        }, lag
        # An action: the replay sends the original bytes back to the commands topic.
        status, answer = _call(f"{url}/api/v1/dlq/{record}/replay", "POST")
        assert status == 200 and answer["replayed_to"] == topics.commands, answer
        # Read back through the admin listener (a super user), not as the console.
        plain = KafkaSettings(bootstrap_servers=secure_kafka.admin_bootstrap)
        assert [seen.value for seen in scan(plain, topics.commands)] == [dead_value]
        text = log_path.read_text(errors="replace")
        assert "Traceback" not in text and "reading the topics failed" not in text, text[-3000:]
        assert _denials(authorizer_log, log_start) == []
    finally:
        if console.poll() is None:
            os.killpg(console.pid, signal.SIGTERM)
            try:
                console.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(console.pid, signal.SIGKILL)
                console.wait(5)
