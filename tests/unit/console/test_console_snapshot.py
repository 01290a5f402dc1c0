"""The console's snapshot cache: a DLQ record handled by an action while a reading of the
topics is under way does not come back with that reading; a later reading decides again."""

from __future__ import annotations

import datetime as dt
import threading

from mailtap.console.snapshot import Snapshot, SnapshotCache


def snapshot(*ids: str) -> Snapshot:
    return Snapshot(
        taken_at=dt.datetime.now(dt.UTC),
        took_s=0.0,
        status={},
        mailboxes=[],
        dlq=[{"id": rid} for rid in ids],
    )


def test_a_record_handled_during_a_reading_stays_gone_until_a_later_reading() -> None:
    reading, release = threading.Event(), threading.Event()
    answers = iter([snapshot("0:1", "0:2"), snapshot("0:1", "0:2"), snapshot("0:1", "0:2")])

    def reader() -> Snapshot:
        reading.set()
        release.wait(10)
        return next(answers)

    cache = SnapshotCache(reader, interval_s=3600)
    release.set()
    assert [r["id"] for r in cache.refresh().dlq] == ["0:1", "0:2"]

    release.clear()
    reading.clear()
    slow = threading.Thread(target=cache.refresh)
    slow.start()
    assert reading.wait(10)
    cache.without_dlq(["0:1"])  # the action finished while the reading ran
    assert [r["id"] for r in cache.get().dlq] == ["0:2"]
    release.set()
    slow.join(10)
    assert [r["id"] for r in cache.get().dlq] == ["0:2"]  # the older reading did not undo it

    # A reading begun after the action is the truth again (here the record is still open).
    assert [r["id"] for r in cache.refresh().dlq] == ["0:1", "0:2"]
