"""What an IMAP source's transactional writers cost in memory, and when: the soak's RSS
slopes of source instances (docs/soak.md, "The sources' RSS slopes").

``python -m mailtap.soak.writer_memory BOOTSTRAP [WRITERS] [ROUNDS]`` creates WRITERS
transactional producers with the settings of the source's writer
(connectors/core/kafka/transactions.py: idempotent, lz4, linger 5 ms, every broker connected
from the start), then runs ROUNDS rounds of one transaction per writer (3 records of 3 KB to a
12-partition topic of its own, deleted at the end) and prints the process's RSS per writer
after each step. Figures, not assertions. ``MAILTAP_WRITER_COMPRESSION=none`` shows what lz4
takes.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(bootstrap: str, writers: int = 40, rounds: int = 6) -> None:
    topic = f"writer-memory-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 12, 1)])[topic].result(30)
    compression = os.environ.get("MAILTAP_WRITER_COMPRESSION", "lz4")
    try:
        start = rss_mb()
        print(f"start: {start:.1f} MB")
        producers = []
        for i in range(writers):
            producer = Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "transactional.id": f"{topic}-{i}",
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "compression.type": compression,
                    "enable.sparse.connections": False,
                    "log_level": 3,
                }
            )
            producer.init_transactions(60)
            producers.append(producer)
        ready = rss_mb()
        print(f"{writers} writers ready: +{(ready - start) / writers * 1024:.0f} KB each")
        for n in range(1, rounds + 1):
            before = rss_mb()
            for i, producer in enumerate(producers):
                producer.begin_transaction()
                for j in range(3):
                    producer.produce(topic, key=f"{n}-{i}-{j}".encode(), value=os.urandom(3000))
                producer.commit_transaction(60)
            print(
                f"transaction {n} of every writer ({compression}): "
                f"+{(rss_mb() - before) / writers * 1024:.0f} KB each"
            )
    finally:
        admin.delete_topics([topic])[topic].result(30)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
