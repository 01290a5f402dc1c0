"""``mailtap bench changes --imap-server KIND``: how long a new mail, a flag change and an
expunge take to reach Kafka on one server of the dev stack, with the source's default timing
(``mode: idle``, ``catchup_poll_seconds`` 300, ``poll_interval_seconds`` 30,
``uidvalidity_check_seconds`` 10): the latencies of the server table in
connectors/imap/README.md ("Servers").

The real ``mailtap run imap-source`` process reads one folder; a read_committed consumer notes
when each record arrives. Each sample APPENDs a mail (-> ADDED), sets \\Flagged on it
(-> UPDATED with the flag) and expunges it (-> tombstone), each timed from the command's answer
to the record in Kafka. Figures, not assertions; a change not seen within ``TIMEOUT_S`` counts
as ``None``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition
from imapclient import IMAPClient

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.topics import ensure_topics
from mailtap.bench.ingest import _account, _mail, _say, services_with
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.process import terminate

#: Longer than the default catch-up (300 s): what nothing announces is found by then.
TIMEOUT_S = 330.0
#: Before each change: the worker is back in IDLE (or polling) after the previous change's
#: sync, so the figure is that of a change arriving while the source waits, not during a sync.
SETTLE_S = 3.0


@dataclass
class Seen:
    """(change, flags, monotonic time) of every record per key, as a consumer sees them."""

    kafka: KafkaSettings
    records: dict[str, list[tuple[str | None, tuple[str, ...], float]]] = field(
        default_factory=dict
    )
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        serde = AvroSerde.for_schema("MailEvent", self.kafka)
        topic = self.kafka.topics.events
        consumer = Consumer(consumer_config(self.kafka, f"bench-{uuid.uuid4().hex[:8]}"))
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        try:
            while not self.stop.is_set():
                msg = consumer.poll(0.05)
                if msg is None or msg.error() is not None:
                    continue
                key = msg.key()
                if key is None:
                    continue
                raw = msg.value()
                value = serde.decode(raw) if raw is not None else None
                entry = (
                    None if value is None else value["change"],
                    tuple(value["flags"]) if value is not None else (),
                    time.monotonic(),
                )
                with self.lock:
                    self.records.setdefault(key.decode(), []).append(entry)
        finally:
            consumer.close()

    def wait(self, key: str, since: float, match: Any) -> float | None:
        """Seconds from ``since`` to the first record of ``key`` after it that ``match``es."""
        deadline = since + TIMEOUT_S
        while time.monotonic() < deadline:
            with self.lock:
                for change, flags, at in self.records.get(key, []):
                    if at >= since and match(change, flags):
                        return at - since
            time.sleep(0.01)
        return None


def _summary(values: list[float | None]) -> dict[str, Any]:
    got = [v for v in values if v is not None]
    return {
        "samples": len(values),
        "missed": len(values) - len(got),
        "p50_s": round(statistics.median(got), 2) if got else None,
        "max_s": round(max(got), 2) if got else None,
    }


def bench_changes(imap_server: str, samples: int) -> dict[str, Any]:
    with services_with(imap_server) as info:
        tag = uuid.uuid4().hex[:8]
        username, password = f"changes-{tag}@example.com", "bench"
        account = f"changes-{tag}"
        info.add_user(username, password)
        names = {f: f"{getattr(TopicNames(), f)}.bench-{tag}" for f in TopicNames.model_fields}
        kafka = KafkaSettings(bootstrap_servers=info.bootstrap_servers, topics=TopicNames(**names))
        ensure_topics(kafka, retry_tiers=["1m"])
        work = Path(tempfile.mkdtemp(prefix="mailtap-bench-changes-"))
        config = {
            "kafka": kafka.model_dump(mode="json", exclude_none=True),
            "claim_check": {"url": (work / "claims").as_uri()},
            "health": {"port": 0},
            "imap": {
                "accounts": [
                    # Its own account name: the transactional id derives from (account, folder),
                    # so another bench's source under "bench" would fence this one.
                    {
                        **_account(info, username, password, name=account),
                        "folders": ["INBOX"],
                        "start": "all",
                    }
                ]
            },
        }
        (work / "mailtap.yaml").write_text(yaml.safe_dump(config))
        seen = Seen(kafka)
        reader = threading.Thread(target=seen.run, daemon=True)
        reader.start()
        log = open(work / "source.log", "wb")  # noqa: SIM115 - closed below
        source = subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", "imap-source", "-c", "mailtap.yaml"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        new: list[float | None] = []
        flagged: list[float | None] = []
        expunged: list[float | None] = []
        client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
        try:
            client.login(username, password)
            client.select_folder("INBOX")
            time.sleep(5.0)  # the source's start and first sync, then IDLE (or polling)
            for i in range(samples):
                key = f"{account}/mid:bench-{i}-{tag}@example.com"
                _say(f"{imap_server}: sample {i + 1} of {samples}")
                since = time.monotonic()
                client.append("INBOX", _mail(tag, i))
                new.append(seen.wait(key, since, lambda c, _f: c == "ADDED"))
                client.noop()
                (uid,) = client.search(["HEADER", "Message-ID", f"bench-{i}-{tag}@example.com"])
                time.sleep(SETTLE_S)
                since = time.monotonic()
                client.add_flags([uid], [b"\\Flagged"])
                flagged.append(seen.wait(key, since, lambda c, f: "\\Flagged" in f))
                time.sleep(SETTLE_S)
                since = time.monotonic()
                client.delete_messages([uid])
                client.uid_expunge([uid])
                expunged.append(seen.wait(key, since, lambda c, _f: c is None))
        finally:
            client.logout()
            terminate(source)
            log.close()
            seen.stop.set()
            reader.join(10)
    figures = {
        "imap_server": imap_server,
        "new_mail": _summary(new),
        "flag_change": _summary(flagged),
        "expunge": _summary(expunged),
        "source_log": str(work / "source.log"),
    }
    for name, value in figures.items():
        print(f"{name:14s} {value}")
    return figures
