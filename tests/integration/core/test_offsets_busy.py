"""Reading the offsets topic while other mailboxes keep committing to it (many source instances
share one offsets partition): the read ends at the end as of the call instead of chasing it."""

from __future__ import annotations

import threading

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.offsets import OffsetStore, canonical_json
from connectors.core.kafka.topics import ensure_topics
from connectors.core.kafka.transactions import TransactionalSourceWriter
from mailtap.dev import DevServices


def test_offsets_read_ends_while_other_mailboxes_commit_continuously(
    services: DevServices, unique: str
) -> None:
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, topics=TopicNames(**names)
    )
    ensure_topics(kafka, retry_tiers=["1m"])
    mine = {"source": "imap", "account": f"a-{unique}", "folder": "INBOX"}
    writer = TransactionalSourceWriter(kafka, f"busy-mine-{unique}")
    writer.write([], [(mine, {"last_uid": 7})])
    writer.close()

    stop = threading.Event()
    commits = [0]

    def busy() -> None:
        other = TransactionalSourceWriter(kafka, f"busy-other-{unique}")
        partition = {"source": "imap", "account": f"b-{unique}", "folder": "INBOX"}
        while not stop.is_set():
            commits[0] += 1
            other.write([], [(partition, {"last_uid": commits[0]})])
        other.close()

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        while commits[0] < 20:  # the other mailbox is committing
            stop.wait(0.1)
        # Before: the reader never saw an end-of-file (a new commit in every fetch) and failed
        # with TimeoutError; settled also waits for the commits open at the call.
        for settled in (False, True):
            read = OffsetStore(kafka).read_all(timeout=20, settled=settled)
            assert read[canonical_json(mine)] == {"last_uid": 7}
    finally:
        stop.set()
        thread.join(30)
    print(f"\n{commits[0]} commits of another mailbox during the reads")
