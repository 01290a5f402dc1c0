"""docs/runbook.md, run as written: its ``<!-- runbook: NAME -->`` blocks go to bash unchanged
(only the example account names get this run's suffix), with the three components running on
the real services (Dovecot → IMAP source → Kafka → streams → SMTP sink → the SMTP server).

One story, each recipe on what the previous ones left:

1. trace: a ticket request (answered) and an auto-reply (skipped), found by Message-ID,
   ticket number and command id;
2. onboarding: a second account through the file and SIGHUP, folders of both through
   ``mailboxes add --file``;
3. rewind: the support INBOX read again from its ``start: all`` after its cursor is forgotten;
4. purge: the sales INBOX's keys, cursor and blobs gone;
5. backup and restore of the claims directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from imapclient import IMAPClient

from connectors.core.config import KafkaSettings, load_config
from mailtap.components import Component, wait_for
from mailtap.dev import scenario
from mailtap.mailbox_data import cursor_key
from mailtap.trace import TopicRecord, read_records

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
RUNBOOK = REPO / "docs" / "runbook.md"
STAGE_S = 180.0
BLOCK = re.compile(r"<!-- runbook: (?P<name>[\w-]+) -->\n```sh\n(?P<body>.*?)```", re.DOTALL)


def runbook_blocks() -> dict[str, str]:
    return {m["name"]: m["body"] for m in BLOCK.finditer(RUNBOOK.read_text())}


class Runbook:
    """Runs the runbook's blocks with bash in ``cwd``, ``mailtap`` of this interpreter first
    on PATH, the configuration in MAILTAP_CONFIG."""

    def __init__(self, config: Path, cwd: Path, unique: str) -> None:
        self.blocks = runbook_blocks()
        self.cwd = cwd
        self.unique = unique
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "MAILTAP_CONFIG": str(config),
            "PYTHONPATH": str(REPO),
        }
        self.env.pop("MAILTAP_KAFKA_BOOTSTRAP", None)  # the config names the broker

    def run(self, name: str, check: bool = True, **variables: str) -> str:
        script = self.blocks[name].replace("acme-", f"acme{self.unique}-")
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.cwd,
            env={**self.env, **variables},
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check:
            assert done.returncode == 0, f"runbook block {name}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def account(base: dict[str, Any], name: str, user: Any) -> dict[str, Any]:
    entry = dict(base["imap"]["accounts"][0])
    entry.update(name=name, username=user.username, password=user.password, start="all")
    return entry


def write_config(
    path: Path, base: dict[str, Any], accounts: list[dict[str, Any]], unique: str, tmp: Path
) -> None:
    names = (
        "events",
        "commands",
        "retry_prefix",
        "dlq",
        "delivery",
        "offsets",
        "workflow",
        "imap_index",
        "mailboxes",
        "suppressions",
    )
    topics = {n: f"runbook.{n}.{unique}" for n in names}
    doc = {
        "kafka": {**base["kafka"], "topics": topics},
        "claim_check": base["claim_check"] | {"url": (tmp / "claims").as_uri()},
        "health": {"host": "127.0.0.1", "port": 0},  # three components on one host
        "imap": {"accounts": accounts},
        "streams": {
            **scenario.streams_section(f"runbook-{unique}"),
            "data_dir": str(tmp / "streams"),
        },
        "smtp": {
            **base["smtp"],
            "retry_tiers": ["5s"],
            "max_lifetime": "5m",
            "group_id": f"runbook-sink-{unique}",
            "state_topic": f"runbook.sink.state.{unique}",
            "instance_id": f"runbook-sink-{unique}",
        },
    }
    path.write_text(yaml.safe_dump(doc))


def events_of(kafka: KafkaSettings, key_prefix: str) -> list[TopicRecord]:
    return [
        r
        for r in read_records(kafka, [kafka.topics.events])
        if r.key and r.key.startswith(key_prefix)
    ]


def append(services: Any, user: Any, folder: str, raw: bytes) -> None:
    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
        client.login(user.username, user.password)
        if not client.folder_exists(folder):
            client.create_folder(folder)
        client.append(folder, raw)


def simple_mail(message_id: str, to: str) -> bytes:
    return (
        f"From: Bob <bob@partner.example>\r\nTo: {to}\r\nSubject: Offer {message_id}\r\n"
        f"Message-ID: <{message_id}>\r\nDate: Sat, 05 Dec 2026 10:00:00 +0000\r\n\r\nHello.\r\n"
    ).encode()


@pytest.mark.timeout(900)
def test_every_runbook_recipe_runs_as_written(services: Any, unique: str, tmp_path: Path) -> None:
    base = yaml.safe_load(Path(services.config_path).read_text())
    support_user = services.add_user(f"rb-support-{unique}@example.com", "pw")
    sales_user = services.add_user(f"rb-sales-{unique}@example.com", "pw")
    support, sales = f"acme{unique}-support", f"acme{unique}-sales"
    config = tmp_path / "mailtap.yaml"
    write_config(config, base, [account(base, support, support_user)], unique, tmp_path)
    kafka = load_config(config).kafka
    book = Runbook(config, tmp_path, unique)
    components = {
        name: Component(name, config, tmp_path / "logs" / f"{name}.log")
        for name in ("imap-source", "streams", "smtp-sink")
    }
    ticket = scenario.ticket_request(unique)
    vacation = scenario.auto_reply(unique, ticket)
    # As a deployment does it first (the compose topics service, deploy/README.md).
    ensure = subprocess.run(
        [sys.executable, "-m", "mailtap.cli", "topics", "ensure"],
        env=book.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ensure.returncode == 0, ensure.stderr
    try:
        for component in components.values():
            component.start()
        append(services, support_user, "INBOX", ticket.raw)
        append(services, support_user, "INBOX", vacation.raw)

        # -- 1. why did this mail get no reply? ---------------------------------------------
        def traced(query: str, verdict: str) -> dict[str, Any] | None:
            out = subprocess.run(
                [sys.executable, "-m", "mailtap.cli", "trace", query, "--json"],
                env=book.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if out.returncode != 0:
                return None
            result: dict[str, Any] = json.loads(out.stdout)
            return result if result["verdict"].startswith(verdict) else None

        assert wait_for(lambda: traced(f"<{ticket.message_id}>", "reply SENT"), STAGE_S, 2), (
            components["smtp-sink"].log_tail()
        )
        answered = traced(f"<{ticket.message_id}>", "reply SENT")
        assert answered is not None
        opened = next(s for s in answered["steps"] if s["kind"] == "workflow")
        number = opened["value"]["instance_id"]
        command_id = next(s["key"] for s in answered["steps"] if s["kind"] == "command")
        assert wait_for(lambda: traced(f"<{vacation.message_id}>", "no reply: SKIPPED"), STAGE_S, 2)

        out = book.run("trace", MESSAGE_ID=ticket.message_id, TICKET=number, COMMAND_ID=command_id)
        lines = out.splitlines()
        assert lines[0].startswith("mail ") and "ADDED" in lines[0]
        assert any("TICKET_OPENED" in line for line in lines)
        assert any("ticket_intake/acknowledge" in line for line in lines)
        assert any(line.startswith("delivery ") and " SENT " in line for line in lines)
        assert "-> reply SENT to alice@customer.example (matched message-id)" in lines
        assert "(matched workflow instance)" in out  # the ticket number
        by_command = json.loads(lines[-1])
        assert by_command["matched_by"] == "command id"
        assert by_command["event_keys"] == answered["event_keys"]
        skipped = traced(f"<{vacation.message_id}>", "no reply: SKIPPED by auto_submitted")
        assert skipped is not None, "the auto-reply's trace names its guard"

        # -- 2. onboarding: an account through the file and SIGHUP, folders in bulk ------------
        write_config(
            config,
            base,
            [account(base, support, support_user), account(base, sales, sales_user)],
            unique,
            tmp_path,
        )
        append(
            services,
            sales_user,
            "INBOX",
            simple_mail(f"sales-{unique}@partner.example", sales_user.username),
        )
        book.run("onboard-accounts", SOURCE_PID=str(components["imap-source"].process.pid))  # type: ignore[union-attr]
        assert wait_for(lambda: events_of(kafka, f"{sales}/"), STAGE_S, 1), components[
            "imap-source"
        ].log_tail()
        append(
            services,
            support_user,
            "Archive",
            simple_mail(f"arch-s-{unique}@partner.example", "x@example.com"),
        )
        append(
            services,
            sales_user,
            "Archive",
            simple_mail(f"arch-t-{unique}@partner.example", "y@example.com"),
        )
        listing = book.run("onboard-folders")
        assert f"imap/{support}/Archive" in listing and f"imap/{sales}/Archive" in listing

        def archived() -> bool:
            folders = {
                (r.key.split("/")[0], (r.value or {}).get("source", {}).get("folder"))
                for r in events_of(kafka, "acme")
                if r.key
            }
            return {(support, "Archive"), (sales, "Archive")} <= folders

        assert wait_for(archived, STAGE_S, 1), components["imap-source"].log_tail()

        # -- 3. rewind: the support INBOX read again from start: all ---------------------------
        def ticket_versions() -> int:
            return sum(1 for r in events_of(kafka, f"{support}/") if "ticket-" in (r.key or ""))

        before = ticket_versions()
        assert before >= 1
        book.run("rewind")
        assert wait_for(lambda: ticket_versions() > before, STAGE_S, 1), components[
            "imap-source"
        ].log_tail()
        # The streams worker answered it once: the same command id, no second delivery.
        again = traced(f"<{ticket.message_id}>", "reply SENT")
        assert again is not None
        assert [s["key"] for s in again["steps"] if s["kind"] == "command"] == [command_id]

        # -- 4. purge: the sales INBOX's keys, cursor and blobs --------------------------------
        sales_inbox = [
            r
            for r in events_of(kafka, f"{sales}/")
            if (r.value or {}).get("source", {}).get("folder") == "INBOX"
        ]
        assert sales_inbox
        out = book.run("purge")
        plan_line, done_line = [line for line in out.splitlines() if line.startswith("imap/")]
        assert "would delete 1 keys" in plan_line, out
        assert "deleted 1 keys" in done_line, out
        newest: dict[str, Any] = {}
        for record in read_records(kafka, [kafka.topics.events]):
            newest[str(record.key)] = record.value
        assert newest[str(sales_inbox[0].key)] is None  # tombstoned
        assert all(v is not None for k, v in newest.items() if k.startswith(f"{support}/"))
        cursors = [r for r in read_offsets(kafka) if r[0] == cursor_key_of(sales, "INBOX")]
        assert cursors and cursors[-1][1] is None  # the newest record of its cursor: a tombstone
        raw = (sales_inbox[0].value or {}).get("raw_ref")
        assert raw, "the mail's raw MIME is in the claim-check store"
        assert not Path(raw["uri"].split("#")[0].removeprefix("file://")).exists()

        # -- 5. backup and restore of the claims directory -------------------------------------
        claims = tmp_path / "claims"
        listing = book.run("backup-claims", CLAIMS_DIR=str(claims))
        assert listing.strip(), "the backup holds files"
        restored = tmp_path / "restored"
        book.run("restore-claims", CLAIMS_DIR=str(claims), RESTORE_DIR=str(restored))
        originals = sorted(p.relative_to(claims) for p in claims.rglob("*") if p.is_file())
        copies = sorted(p.relative_to(restored) for p in restored.rglob("*") if p.is_file())
        assert originals and copies == originals
        for name in originals:
            assert (restored / name).read_bytes() == (claims / name).read_bytes()
    finally:
        for component in components.values():
            component.stop()


def cursor_key_of(account_name: str, folder: str) -> bytes:
    from connectors.core.source.ownership.group import WorkUnit

    return cursor_key(WorkUnit("imap", account_name, folder))


def read_offsets(kafka: KafkaSettings) -> list[tuple[bytes, bytes | None]]:
    """Every record of the offsets topic as (key, value) bytes, in order per partition."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from connectors.core.kafka.clients import consumer_config

    consumer = Consumer(
        consumer_config(kafka, group_id=f"rb-{uuid.uuid4().hex[:8]}", enable_partition_eof=True)
    )
    topic = kafka.topics.offsets
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    out: list[tuple[bytes, bytes | None]] = []
    ended: set[int] = set()
    try:
        while ended != set(parts):
            msg = consumer.poll(5)
            assert msg is not None, "the offsets topic did not reach its end"
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(msg.partition())
                continue
            out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out
