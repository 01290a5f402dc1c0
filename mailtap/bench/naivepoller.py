"""The naive poller: what an IMAP -> Kafka script with no guarantees spends, the ingest bench's
second baseline.

It is the loop a team writes in an afternoon: imapclient FETCH of ``BODY.PEEK[]`` in batches,
each raw mail produced as it is by a plain confluent-kafka producer (lz4, like mailtap's), then
one flush. No parsing, no claim-check store, no Avro, no transaction, no cursor: a crash loses or
repeats mails, a bad mail is just bytes. mailtap's ingest does all of that on top, so the ratio
of the two rates (and of their CPU per mail) is the price of the guarantees.

Wire sample of what it sends: key ``<user>/<uid>``, value the raw MIME, topic
``mailtap.naive.bench-<tag>`` (deleted with the round's other topics).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # re-exported, no __all__
from imapclient import IMAPClient

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import admin_client, client_config

#: The naive loop's FETCH round trip, as the ingest's (``imap.batch_size`` of the bench).
NAIVE_BATCH = 200


@dataclass(frozen=True)
class NaivePoll:
    """Mails/s of the naive poller and its CPU seconds: this process (the imapclient client and
    the producer's librdkafka threads), the broker and Dovecot, while it ran."""

    rate: float
    mails: int
    client_cpu_s: float
    kafka_cpu_s: float
    dovecot_cpu_s: float

    def cpu_us_per_mail(self) -> dict[str, float]:
        parts = {
            "client": self.client_cpu_s,
            "kafka": self.kafka_cpu_s,
            "dovecot": self.dovecot_cpu_s,
        }
        per = {name: round(s / max(self.mails, 1) * 1e6, 1) for name, s in parts.items()}
        per["total"] = round(sum(parts.values()) / max(self.mails, 1) * 1e6, 1)
        return per


def naive_poll(
    host: str,
    port: int,
    username: str,
    password: str,
    kafka: KafkaSettings,
    topic: str,
    services_cpu: Callable[[], dict[str, float]],
) -> NaivePoll:
    """Poll every mail of INBOX once into ``topic`` (created here); ``services_cpu()`` reads the
    CPU seconds so far of the run's services (``kafka``, ``dovecot``; a missing name counts 0)."""
    admin = admin_client(kafka)
    admin.create_topics([NewTopic(topic, kafka.partitions, 1)])[topic].result()
    producer = Producer({**client_config(kafka), "linger.ms": 5, "compression.type": "lz4"})
    client = IMAPClient(host, port=port, ssl=False)
    client.login(username, password)
    client.select_folder("INBOX", readonly=True)
    uids = client.search(["ALL"])
    before = services_cpu()
    cpu_before = time.process_time()
    started = time.monotonic()
    sent = 0
    for i in range(0, len(uids), NAIVE_BATCH):
        for uid, item in client.fetch(uids[i : i + NAIVE_BATCH], [b"BODY.PEEK[]"]).items():
            key = f"{username}/{uid}".encode()
            while True:
                try:
                    producer.produce(topic, key=key, value=item[b"BODY[]"])
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    producer.poll(0.1)
            producer.poll(0)
            sent += 1
    left = producer.flush(60)
    elapsed = time.monotonic() - started
    client_cpu = time.process_time() - cpu_before
    after = services_cpu()
    client.logout()
    if left:
        raise RuntimeError(f"the naive poller's producer could not deliver {left} mails")
    return NaivePoll(
        rate=sent / max(elapsed, 1e-6),
        mails=sent,
        client_cpu_s=client_cpu,
        kafka_cpu_s=after.get("kafka", 0.0) - before.get("kafka", 0.0),
        dovecot_cpu_s=after.get("dovecot", 0.0) - before.get("dovecot", 0.0),
    )
