"""SharedReads: mailboxes starting together read the offsets topic once, and never a read that
started before they asked (it could miss their fenced predecessor's last commit)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from connectors.core.kafka.offsets import SharedReads


class Topic:
    """A stand-in for the offsets topic: ``commit`` adds a record, a read returns what was
    committed when the read started, and the first read waits until released."""

    def __init__(self) -> None:
        self.committed = 0
        self.reads = 0
        self.first_started = threading.Event()
        self.release_first = threading.Event()
        self.fail = False

    def read(self) -> Mapping[bytes, Mapping[str, Any]]:
        self.reads += 1
        seen = self.committed
        if self.reads == 1:
            self.first_started.set()
            assert self.release_first.wait(10)
        if self.fail:
            raise TimeoutError("the topic did not settle")
        return {b"seen": {"committed": seen}}


def test_callers_during_a_read_share_the_next_one_which_sees_their_commits() -> None:
    topic = Topic()
    reads = SharedReads(topic.read)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(reads)
        assert topic.first_started.wait(10)
        topic.committed = 1  # e.g. a later caller's init_transactions aborted its zombie's txn
        later = [pool.submit(reads) for _ in range(6)]
        time.sleep(0.2)  # let them all gather behind the read in flight
        topic.release_first.set()
        assert first.result(10)[b"seen"]["committed"] == 0
        assert {f.result(10)[b"seen"]["committed"] for f in later} == {1}
    assert topic.reads == 2  # not 7


def test_a_failed_read_fails_every_caller_that_shared_it_and_the_next_works() -> None:
    topic = Topic()
    reads = SharedReads(topic.read)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(reads)
        assert topic.first_started.wait(10)
        topic.fail = True
        later = [pool.submit(reads) for _ in range(3)]
        time.sleep(0.2)
        topic.release_first.set()
        for future in [first, *later]:
            with pytest.raises(TimeoutError):
                future.result(10)
    topic.fail = False
    assert reads()[b"seen"]["committed"] == 0
    assert topic.reads == 3
