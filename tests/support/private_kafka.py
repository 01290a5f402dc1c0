"""A Kafka broker of one test alone, so the test can stop it and start it again (the broker
restart tests of the sources). The session's broker is shared and must never be stopped."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import kafka, process

__all__ = ["PrivateKafka", "private_broker"]


@dataclass
class PrivateKafka:
    layout: kafka.KafkaLayout
    bootstrap: str
    pids: list[int]

    def stop(self) -> None:
        process.stop_group(self.pids[-1])

    def start(self) -> None:
        self.pids.append(kafka.start(self.layout))
        kafka.wait_ready(self.layout, self.pids[-1], self.bootstrap)


@contextmanager
def private_broker(prefix: str) -> Iterator[PrivateKafka]:
    """A started broker (KRaft, loopback, free ports) in a temporary folder named ``prefix``;
    every process it ran is stopped and the folder removed on the way out."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    layout = kafka.KafkaLayout(root)
    broker, controller = process.free_ports(2)
    kafka.render(layout, "127.0.0.1", broker, controller)
    kafka.prepare_storage(layout, broker, controller)
    broker_ = PrivateKafka(layout, f"127.0.0.1:{broker}", [])
    try:
        broker_.start()
        yield broker_
    finally:
        for pid in broker_.pids:
            process.stop_group(pid)
        shutil.rmtree(root, ignore_errors=True)
