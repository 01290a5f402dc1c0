"""One running pipeline for the console's API and browser tests: the IMAP source, the streams
worker and the SMTP sink on the session's Dovecot, Kafka and SMTP server, a ticket mail that
went all the way to a SENT reply, dead letters on the DLQ, and ``mailtap run console`` on top,
with an operator and a viewer token."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from imapclient import IMAPClient

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig, load_config
from connectors.core.kafka.clients import producer_config
from mailtap.components import Component, wait_for
from mailtap.dev import scenario
from mailtap.dev.process import free_ports
from mailtap.trace import read_records

STAGE_S = 150.0
PIPELINE = ("imap-source", "streams", "smtp-sink")
OPERATOR_TOKEN = "op-" + "o" * 40
VIEWER_TOKEN = "view-" + "v" * 40


@dataclass
class ConsoleStack:
    """What the tests need to know about the running stack."""

    url: str
    config_path: Path
    cfg: MailtapConfig
    run: str
    ticket_message_id: str
    account: str
    #: Record ids (PARTITION:OFFSET) of the command dead letters seeded, oldest first.
    dead_commands: list[str]
    dead_source: str
    console: Component

    def call(
        self,
        method: str,
        path: str,
        token: str | None = OPERATOR_TOKEN,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One API request; (status, decoded JSON answer)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def _config(services: Any, run: str, user: Any, tmp: Path, port: int, health_port: int) -> Path:
    base = yaml.safe_load(Path(services.config_path).read_text())
    account = dict(base["imap"]["accounts"][0])
    account.update(
        name=f"console-{run}", username=user.username, password=user.password, start="all"
    )
    tokens = tmp / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            [
                {"name": "olga", "role": "operator", "token": OPERATOR_TOKEN},
                {"name": "victor", "role": "viewer", "token": VIEWER_TOKEN},
            ]
        )
    )
    tokens.chmod(0o600)
    topics = {
        name: f"{default}.{run}"
        for name, default in {
            "events": "mail.events",
            "commands": "mail.commands",
            "retry_prefix": "mail.commands.retry",
            "dlq": "mail.commands.dlq",
            "delivery": "mail.delivery",
            "offsets": "mailtap.offsets",
            "workflow": "mail.workflow",
            "suppressions": "mail.suppressions",
            "mailboxes": "mailtap.mailboxes",
            "audit": "mailtap.audit",
        }.items()
    }
    doc = {
        "kafka": {**base["kafka"], "topics": topics},
        "claim_check": base["claim_check"],
        # The IMAP source's /healthz (the others get their own ports): the console asks it for
        # the mailbox's state and last sync.
        "health": {"port": health_port},
        "imap": {**base["imap"], "accounts": [account]},
        "streams": {**scenario.streams_section(f"streams-{run}"), "data_dir": str(tmp / "streams")},
        "smtp": {
            **base["smtp"],
            "retry_tiers": ["5s"],
            "max_lifetime": "5m",
            "group_id": f"sink-{run}",
            "state_topic": f"mailtap.sink.state.{run}",
            "instance_id": f"sink-{run}",
        },
        "console": {
            "port": port,
            "tokens_file": str(tokens),
            "refresh_seconds": 2,
            "page_size": 20,
            "max_body_bytes": 4096,
        },
    }
    path = tmp / "mailtap.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def replies(services: Any, run: str) -> list[email.message.EmailMessage]:
    """The replies the SMTP server received for this run's mails."""
    found = []
    for message in services.received_messages():
        if run.encode() in message.raw:
            parsed = email.message_from_bytes(message.raw, policy=email.policy.default)
            if run in str(parsed["In-Reply-To"] or ""):
                found.append(parsed)
    return found


def seed_dead_letters(cfg: MailtapConfig, count: int) -> tuple[list[str], str]:
    """``count`` command dead letters (copies of the run's real command under new ids, as the
    sink writes them when it gives up) and one source dead letter; their record ids."""
    kafka = cfg.kafka
    commands = [r for r in read_records(kafka, [kafka.topics.commands]) if r.value]
    assert commands, "the pipeline wrote no command"
    serde = AvroSerde.for_schema("ReplyCommand", kafka)
    producer = Producer(producer_config(kafka))
    ids: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        ids.append(f"{msg.partition()}:{msg.offset()}")

    for n in range(count):
        value = dict(commands[0].value or {})
        value["command_id"] = f"dead-{n}-{uuid.uuid4().hex[:12]}"
        value["created_at"] = dt.datetime.now(dt.UTC)
        producer.produce(
            kafka.topics.dlq,
            key=value["command_id"].encode(),
            value=serde.encode(value, kafka.topics.commands),
            partition=0,
            headers=[
                ("mailtap.error.reason", b"550 5.1.1 relay refused: test dead letter"),
                ("mailtap.error.class", b"SMTPRecipientsRefused"),
                ("mailtap.error.topic", kafka.topics.commands.encode()),
                ("mailtap.error.partition", b"0"),
                ("mailtap.error.offset", str(n).encode()),
            ],
            on_delivery=delivered,
        )
        producer.flush(30)
    source: list[str] = []
    producer.produce(
        kafka.topics.dlq,
        key=b"broken-mail",
        value=b"Subject: =?broken\r\n\r\nnot parseable",
        partition=0,
        headers=[
            ("mailtap.error.kind", b"ParseError"),
            ("mailtap.error.message", b"MIME nesting deeper than 50"),
            ("mailtap.source.kind", b"IMAP"),
            ("mailtap.source.account", b"elsewhere"),
            ("mailtap.source.folder", b"INBOX"),
        ],
        on_delivery=lambda err, msg: source.append(f"{msg.partition()}:{msg.offset()}"),
    )
    producer.flush(30)
    return ids, source[0]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def console_stack(
    services: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleStack]:
    run = uuid.uuid4().hex[:10]
    tmp = tmp_path_factory.mktemp("console")
    user = services.add_user(f"console-{run}@example.com", "pw")
    port, *pipeline_ports = free_ports(1 + len(PIPELINE))
    health_ports = dict(zip(PIPELINE, pipeline_ports, strict=True))
    config_path = _config(services, run, user, tmp, port, health_ports["imap-source"])
    cfg = load_config(config_path)
    ticket = scenario.ticket_request(run)
    pipeline = [
        Component(
            name,
            config_path,
            tmp / "logs" / f"{name}.log",
            {"MAILTAP__HEALTH__PORT": str(health_ports[name])},
        ).start()
        for name in PIPELINE
    ]
    try:
        with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
            client.login(user.username, user.password)
            client.append("INBOX", ticket.raw)
        assert wait_for(lambda: len(replies(services, run)) >= 1, STAGE_S), pipeline[-1].log_tail()
        dead, dead_source = seed_dead_letters(cfg, 5)
        console = Component("console", config_path, tmp / "logs" / "console.log").start()
        url = f"http://127.0.0.1:{port}"
        try:
            assert wait_for(lambda: _healthy(url), 60), console.log_tail()
            yield ConsoleStack(
                url=url,
                config_path=config_path,
                cfg=cfg,
                run=run,
                ticket_message_id=ticket.message_id,
                account=f"console-{run}",
                dead_commands=dead,
                dead_source=dead_source,
                console=console,
            )
        finally:
            console.stop()
    finally:
        for component in reversed(pipeline):
            component.stop()
