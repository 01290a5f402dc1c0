"""Helpers of the IMAP source tests: per-test topics and account, APPEND, reading Kafka back.

Every assertion reads what is in Kafka with a read_committed consumer, the way a downstream
consumer would see it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from confluent_kafka import Consumer, KafkaException, TopicPartition
from imapclient import IMAPClient

from connectors.core import checkpoints
from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, MailtapConfig, TopicNames, config_from_dict
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.offsets import OffsetStore
from connectors.core.kafka.readtoend import read_to_end, topic_partitions
from connectors.core.kafka.topics import COMPACTED, TopicSpec, ensure_topic_specs, ensure_topics
from connectors.core.source.location import SourceLocation
from connectors.imap.source import ImapSource
from mailtap.dev import Account, DevServices
from tests.support.crashpoints import ENV as CRASH_ENV

REPO = Path(__file__).resolve().parents[3]
ACCOUNT = "acct"
#: Generous: these machines are shared and slow; a wait ends as soon as its condition holds.
WAIT_S = 180.0

T = TypeVar("T")


@dataclass
class Record:
    topic: str
    key: str | None
    value: dict[str, Any] | None
    headers: dict[str, bytes]
    raw_value: bytes | None


def wait_for(condition: Callable[[], T], what: str, timeout: float = WAIT_S) -> T:
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: T = condition()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
        last = condition()
    return last


def make_mail(message_id: str | None, subject: str, body: str = "hello") -> bytes:
    head = f"Message-ID: <{message_id}>\r\n" if message_id else ""
    return (
        f"{head}From: Sender <sender@example.com>\r\nTo: rcpt@example.com\r\n"
        f"Subject: {subject}\r\nDate: Sun, 29 Nov 2026 12:00:00 +0000\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    ).encode()


@dataclass
class ImapHarness:
    services: DevServices
    account: Account
    unique: str
    tmp: Path
    host: str = ""
    port: int = 0
    bootstrap: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: The account's name in the config, keys and cursors. The transactional id derives from
    #: (account, folder) only, so tests that run at the same time on the shared broker under
    #: the same name fence each other: a test that must not be disturbed uses its own name.
    account_name: str = ACCOUNT
    #: APPEND many mails per command (RFC 3502). Dovecot only: the minimal profile and Courier
    #: lack it, and Cyrus answers imapclient's MULTIAPPEND with "BAD Missing required argument".
    multiappend: bool = True

    def __post_init__(self) -> None:
        self.host = self.host or self.services.imap.host
        self.port = self.port or self.services.imap.port
        names = {f: f"{getattr(TopicNames(), f)}.{self.unique}" for f in TopicNames.model_fields}
        self.kafka = KafkaSettings(
            bootstrap_servers=self.bootstrap or self.services.kafka.bootstrap_servers,
            topics=TopicNames(**names),
        )
        ensure_topics(self.kafka, retry_tiers=["1m"])
        # The key index changelog with 4 partitions instead of the source's 32: the shared test
        # broker holds the topics of every test; the source uses the count it finds.
        ensure_topic_specs(self.kafka, [TopicSpec(self.kafka.topics.imap_index, 4, COMPACTED)])
        self.serde = AvroSerde.for_schema("MailEvent", self.kafka)
        self._wait_for_leaders()

    def _wait_for_leaders(self) -> None:
        """Until the new topics answer a watermark query: on a loaded broker a partition
        created a moment ago answers NOT_LEADER_FOR_PARTITION for a while, and the source's
        start-up read of ``mailboxes`` fails on it (seen in test_imap_servers.py)."""
        consumer = Consumer(consumer_config(self.kafka, f"t-{uuid.uuid4().hex[:8]}"))
        deadline = time.monotonic() + 60
        try:
            for topic in (self.kafka.topics.mailboxes, self.kafka.topics.offsets):
                partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
                for partition in partitions:
                    while True:
                        try:
                            consumer.get_watermark_offsets(
                                TopicPartition(topic, partition), timeout=5, cached=False
                            )
                            break
                        except KafkaException:
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.2)
        finally:
            consumer.close()

    # --- configuration -------------------------------------------------------------------------

    def config_dict(self, *, port: int | None = None, **overrides: Any) -> dict[str, Any]:
        account = {
            "name": self.account_name,
            "host": self.host,
            "port": port or self.port,
            "security": "plain",
            "username": self.account.username,
            "password": self.account.password,
            "folders": ["INBOX"],
            "start": "all",
        }
        account.update(overrides.pop("account", {}))
        imap = {
            "accounts": [account],
            "batch_size": 10,
            "connect_timeout_seconds": 5,
            "read_timeout_seconds": 10,
            "idle_renew_seconds": 30,
            "catchup_poll_seconds": 30,
            "backoff_initial_seconds": 0.2,
            "backoff_cap_seconds": 2,
        }
        imap.update(overrides)
        return {
            "kafka": self.kafka.model_dump(mode="json", exclude_none=True),
            "claim_check": {"url": (self.tmp / "claims").as_uri()},
            "health": {"port": 0, "max_sync_age_seconds": 600},
            "imap": imap,
        }

    def config(self, **overrides: Any) -> MailtapConfig:
        return config_from_dict(self.config_dict(**overrides), env={})

    def write_config(self, name: str = "mailtap.yaml", **overrides: Any) -> Path:
        path = self.tmp / name
        path.write_text(yaml.safe_dump(self.config_dict(**overrides)))
        return path

    # --- the mailbox ---------------------------------------------------------------------------

    def client(self, folder: str = "INBOX") -> IMAPClient:
        client = IMAPClient(self.host, port=self.port, ssl=False)
        client.login(self.account.username, self.account.password)
        if folder:
            client.select_folder(folder)
        return client

    def append(self, mails: Iterable[bytes], folder: str = "INBOX") -> int:
        client = self.client(folder="")
        if not self.multiappend:
            count = 0
            for mail in mails:
                client.append(folder, mail)
                count += 1
            client.logout()
            return count
        count = 0
        batch: list[bytes] = []
        for mail in mails:
            batch.append(mail)
            if len(batch) == 100:
                client.multiappend(folder, batch)
                count += len(batch)
                batch = []
        if batch:
            client.multiappend(folder, batch)
            count += len(batch)
        client.logout()
        return count

    def append_numbered(self, n: int, start: int = 0, tag: str = "m") -> list[str]:
        ids = [f"{tag}{i}-{self.unique}@example.com" for i in range(start, start + n)]
        self.append(
            make_mail(mid, f"{tag} {i}")
            for i, mid in zip(range(start, start + n), ids, strict=True)
        )
        return ids

    def doveadm(self, *args: str) -> str:
        return self.services.doveadm(*args).stdout

    # --- Kafka ---------------------------------------------------------------------------------

    def read(self, topic: str) -> list[Record]:
        consumer = Consumer(
            consumer_config(self.kafka, f"t-{uuid.uuid4().hex[:8]}", fetch_wait_max_ms=10)
        )
        try:
            parts = topic_partitions(consumer, self.kafka, topic, 10) or []
            starts = [TopicPartition(topic, p, 0) for p in parts]
            out: list[Record] = []
            for msg in read_to_end(consumer, starts, 60):
                raw = msg.value()
                key = msg.key()
                value = None
                if raw is not None and topic == self.kafka.topics.events:
                    value = self.serde.decode(raw)
                out.append(
                    Record(
                        topic,
                        key.decode() if key is not None else None,
                        value,
                        {k: v for k, v in (msg.headers() or [])},
                        raw,
                    )
                )
            return out
        finally:
            consumer.close()

    def events(self) -> list[Record]:
        return self.read(self.kafka.topics.events)

    def dlq(self) -> list[Record]:
        return self.read(self.kafka.topics.dlq)

    def cursor(self, folder: str = "INBOX") -> dict[str, Any] | None:
        offsets = OffsetStore(self.kafka).read_all()
        return offsets.get(SourceLocation("imap", self.account_name, folder).partition_key)

    def offsets(self) -> dict[str, dict[str, Any]]:
        """Every IMAP cursor, as ``{"<account>/<folder>": cursor}``."""
        found = {}
        for key, value in OffsetStore(self.kafka).read_all().items():
            partition = json.loads(key)
            found[f"{partition['account']}/{partition['folder']}"] = value
        return found

    def cursor_at(self, last_uid: int, folder: str = "INBOX") -> bool:
        cursor = self.cursor(folder)
        return cursor is not None and cursor["last_uid"] >= last_uid

    # --- the connector as a process ------------------------------------------------------------

    def spawn(
        self, config: Path, env: dict[str, str] | None = None, log_name: str = "source"
    ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{log_name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        full_env = {**os.environ, "PYTHONPATH": str(REPO), "MAILTAP_LOG_LEVEL": "INFO"}
        for hook in (CRASH_ENV, checkpoints.ENV):
            full_env.pop(hook, None)
        full_env.update(env or {})
        proc = subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", "imap-source", "-c", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO,
        )
        self.procs.append(proc)
        return proc

    def log(self, log_name: str = "source") -> str:
        path = self.tmp / f"{log_name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def keys_of(records: Iterable[Record]) -> set[str]:
    return {r.key for r in records if r.key is not None}


def changes(records: Iterable[Record]) -> list[str]:
    return [r.value["change"] for r in records if r.value is not None]


@contextmanager
def running(harness: ImapHarness, **overrides: Any) -> Iterator[ImapSource]:
    """The source in this process (for tests that look at its metrics and workers)."""
    source = ImapSource.from_config(harness.config(**overrides))
    source.start()
    try:
        yield source
    finally:
        source.stop()
