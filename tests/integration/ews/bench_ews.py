"""Figures (never assertions) for the Exchange source, against the EWS test server and real Kafka.

    .venv/bin/python -m tests.integration.ews.bench_ews [--items 2000] [--latency-samples 50]

Uses ``MAILTAP_KAFKA_BOOTSTRAP`` when set, else starts the local services (``mailtap.dev.up``) in a
temporary state dir and stops them afterwards. One run measures:

1. baseline: plain exchangelib GetItem (MIME) of every item, 100 ids per request;
2. catch-up ingest: ``start: all`` on a folder of ``--items`` mails, exactly once into Kafka
   (FindItem, GetItem, shared parser, Avro, one transaction per batch with the cursor), counted
   by a read_committed consumer; its ratio to (1); the same rate without the start-up;
3. streaming latency: deliver -> event visible to a read_committed consumer, p50/p99, next to the
   server-side deliver -> notification written latency of a plain exchangelib stream.

The server is in the same process as the source here, so both share the CPU (2 cores, shared):
compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from exchangelib import BASIC, DELEGATE, Account, Configuration, Credentials

from connectors.core.config import KafkaSettings, TopicNames, config_from_dict
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.topics import ensure_topics
from connectors.ews.source import EwsSource
from tests.ews_server.fixture import PASSWORD, USER, fast_server
from tests.integration.ews.ews_kafka import source_config

BODY_BYTES = 4_500


def mail(i: int, tag: str) -> bytes:
    body = (f"line {i} of the benchmark mail, some text to make it realistic. " * 80)[:BODY_BYTES]
    return (
        f"Message-ID: <ews-bench-{i}-{tag}@example.com>\r\nFrom: Sender <s{i}@example.com>\r\n"
        f"To: {USER}\r\nSubject: benchmark mail {i}\r\nDate: Sun, 29 Nov 2026 12:00:00 +0000\r\n"
        f"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    ).encode()


class CommittedWatcher:
    """A read_committed consumer on the events topic: when did each key become visible?"""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.seen: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._consumer = Consumer(
            consumer_config(
                kafka,
                group_id=f"bench-{uuid.uuid4().hex[:6]}",
                isolation_level="read_committed",
                auto_offset_reset="earliest",
            )
        )
        self._consumer.subscribe([kafka.topics.events])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.05)
            if msg is not None and not msg.error():
                self.seen.setdefault(msg.key(), time.monotonic())

    def wait_for(self, count: int, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


def _kafka(bootstrap: str) -> KafkaSettings:
    unique = uuid.uuid4().hex[:8]
    names = {f: f"{getattr(TopicNames(), f)}.bench{unique}" for f in TopicNames.model_fields}
    settings = KafkaSettings(bootstrap_servers=bootstrap, topics=TopicNames(**names))
    ensure_topics(settings, retry_tiers=["1m"])
    return settings


def bench(bootstrap: str, items: int, samples: int, work: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {"items": items, "mail_bytes": len(mail(0, "x"))}
    kafka = _kafka(bootstrap)
    with fast_server(seconds_per_minute=60.0, keepalive_seconds=5.0) as ews:
        tag = uuid.uuid4().hex[:6]
        delivered = [ews.deliver(USER, mail(i, tag)) for i in range(items)]

        # 1. Baseline: exchangelib GetItem of every item's MIME.
        config = Configuration(
            service_endpoint=ews.url,
            credentials=Credentials(USER, PASSWORD),
            auth_type=BASIC,
            max_connections=2,
        )
        account = Account(USER, config=config, autodiscover=False, access_type=DELEGATE)
        ids = [(d.item_id, d.change_key) for d in delivered]
        start = time.monotonic()
        fetched = sum(1 for _ in account.fetch(ids=ids, only_fields=["mime_content"]))
        baseline = fetched / (time.monotonic() - start)
        figures["baseline_getitem_per_s"] = round(baseline, 1)

        # 2. Catch-up ingest, exactly once into Kafka.
        raw = source_config(kafka, ews, work / "claims", connection_timeout_minutes=30)
        source = EwsSource.from_config(config_from_dict(raw), serve_health=False)
        watcher = CommittedWatcher(kafka)
        start = time.monotonic()
        source.start()
        watcher.wait_for(items)
        ingest = len(watcher.seen) / (time.monotonic() - start)
        figures["ingest_committed_per_s"] = round(ingest, 1)
        figures["ingest_vs_baseline"] = round(ingest / baseline, 3)
        # Without the start-up (version guess, GetFolder, init_transactions, offsets read):
        # from the first committed batch to the last.
        first, last = min(watcher.seen.values()), max(watcher.seen.values())
        first_batch = sum(1 for t in watcher.seen.values() if t == first)
        steady = (len(watcher.seen) - first_batch) / (last - first) if last > first else 0.0
        figures["ingest_steady_per_s"] = round(steady, 1)
        figures["startup_to_first_commit_s"] = round(first - start, 2)

        # 3. Streaming latency, one mail at a time.
        ews.wait_until(lambda: ews.open_streams() == 1, 60)
        latencies = []
        for i in range(samples):
            raw_mail = mail(items + i, tag)
            key = f"ops/mid:ews-bench-{items + i}-{tag}@example.com".encode()
            sent = time.monotonic()
            ews.deliver(USER, raw_mail)
            deadline = sent + 30
            while key not in watcher.seen and time.monotonic() < deadline:
                time.sleep(0.002)
            if key in watcher.seen:
                latencies.append(watcher.seen[key] - sent)
        source.stop()
        watcher.close()
    if latencies:
        latencies.sort()
        figures["stream_latency_ms_p50"] = round(statistics.median(latencies) * 1000, 1)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        figures["stream_latency_ms_p99"] = round(p99 * 1000, 1)
        figures["stream_latency_samples"] = len(latencies)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--latency-samples", type=int, default=50)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ews-bench-"))
    bootstrap = os.environ.get("MAILTAP_KAFKA_BOOTSTRAP")
    state_dir = None
    try:
        if not bootstrap:
            from mailtap.dev import down, up

            state_dir = work / "services"
            state_dir.mkdir()
            print(f"starting local services in {state_dir} ...", file=sys.stderr)
            bootstrap = up(state_dir).kafka.bootstrap_servers
        print(json.dumps(bench(bootstrap, args.items, args.latency_samples, work), sort_keys=True))
    finally:
        if state_dir is not None:
            down(state_dir)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
