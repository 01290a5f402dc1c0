"""Faults: kill -9 at every step of a batch, fencing, a silent connection, a Dovecot restart.

After each fault the connector (restarted where it died) must leave every mail in Kafka exactly
once: nothing lost, no duplicate record.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from mailtap.commands.imap import EXIT_FENCED
from mailtap.dev import Account, DevServices, dovecot, process
from tests.integration.imap.imap_harness import (
    ImapHarness,
    changes,
    keys_of,
    running,
    wait_for,
)
from tests.support.crashpoints import EXIT_CODE, crash_env
from tests.support.private_kafka import PrivateKafka, private_broker
from tests.support.tcp_proxy import TcpProxy


def _children(parent: int) -> list[int]:
    """Processes whose parent is ``parent`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def assert_once_each(imap: ImapHarness, ids: list[str]) -> None:
    events = imap.events()
    added = Counter(r.key for r in events if r.value is not None and r.value["change"] == "ADDED")
    assert set(added) == {f"acct/mid:{m}" for m in ids}, "every mail published"
    assert max(added.values()) == 1, f"duplicates: {[k for k, n in added.items() if n > 1]}"


@pytest.mark.parametrize("point", ["before_write:2", "in_transaction:2", "in_transaction:4"])
def test_kill_9_in_the_middle_of_a_batch_loses_and_duplicates_nothing(
    imap: ImapHarness, point: str
) -> None:
    # 10 batches: even with the committer putting up to 4 ready batches into one transaction,
    # there are at least 3 backfill transactions after the one that pins the start position.
    ids = imap.append_numbered(100)
    config = imap.write_config(batch_size=10)
    crashed = imap.spawn(config, env=crash_env(point), log_name="crash")
    assert crashed.wait(180) == EXIT_CODE, imap.log("crash")
    assert f"crashing at {point}" in imap.log("crash")
    imap.spawn(config)
    wait_for(lambda: imap.cursor_at(100), "the restarted source to catch up")
    events = imap.events()
    assert len(events) == 100
    assert_once_each(imap, ids)


@pytest.mark.parametrize("point", ["after_commit:2", "after_side_effect:2", "in_transaction:3"])
def test_kill_9_around_the_after_commit_move_is_repaired_at_start(
    imap: ImapHarness, point: str
) -> None:
    ids = imap.append_numbered(30)
    config = imap.write_config(batch_size=10, account={"after_commit": "move:Processed"})
    crashed = imap.spawn(config, env=crash_env(point), log_name="crash")
    assert crashed.wait(180) == EXIT_CODE, imap.log("crash")
    imap.spawn(config)
    wait_for(
        lambda: (c := imap.cursor()) is not None and c["last_uid"] >= 30 and c["pending"] is None,
        "every batch published and moved",
    )
    client = imap.client()
    assert client.search(["ALL"]) == []
    processed = client.select_folder("Processed")
    uids = client.search(["ALL"])
    assert len(uids) == 30
    client.logout()
    assert_once_each(imap, ids)
    latest = {r.key: r.value for r in imap.events()}
    assert all(v is not None and v["source"]["folder"] == "Processed" for v in latest.values())
    # Where each mail is now (COPYUID, or the target read back when the crash was after the move)
    assert sorted(v["source"]["uid"] for v in latest.values() if v is not None) == sorted(uids)
    assert {v["source"]["uidvalidity"] for v in latest.values() if v is not None} == {
        processed[b"UIDVALIDITY"]
    }


def test_sigkill_during_a_large_backfill(imap: ImapHarness) -> None:
    ids = imap.append_numbered(600)
    config = imap.write_config(batch_size=20)
    first = imap.spawn(config, log_name="first")
    wait_for(lambda: imap.cursor_at(100), "the backfill under way")
    pool = _children(first.pid)
    assert pool, "a backfill parses in a process pool"
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    # The parse processes watch their parent: nothing of the killed source lives on.
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pool), "no orphans")
    imap.spawn(config, log_name="second")
    wait_for(lambda: imap.cursor_at(600), "the backfill to finish after the restart")
    assert len(imap.events()) == 600
    assert_once_each(imap, ids)


def test_two_instances_on_one_mailbox_one_is_fenced_no_duplicates(imap: ImapHarness) -> None:
    ids = imap.append_numbered(20)
    config = imap.write_config(batch_size=5)
    first = imap.spawn(config, log_name="first")
    wait_for(lambda: imap.cursor_at(20), "the first instance's backfill")
    second = imap.spawn(config, log_name="second")
    wait_for(
        lambda: (
            "SYNCING -> IDLE" in imap.log("second")
            or imap.log("second").count("transactional writer ready")
        ),
        "the second instance to own the transactional id",
    )
    ids += imap.append_numbered(20, start=20)
    # The first instance tries to commit the new mail, is fenced and exits on its own.
    assert first.wait(180) == EXIT_FENCED, imap.log("first")
    assert "fenced" in imap.log("first")
    wait_for(lambda: imap.cursor_at(40), "the second instance publishes the new mail")
    assert second.poll() is None
    assert len(imap.events()) == 40
    assert_once_each(imap, ids)


def test_a_silent_connection_is_detected_by_timeout_and_nothing_is_lost(
    imap: ImapHarness,
) -> None:
    ids = imap.append_numbered(5)
    with (
        TcpProxy(imap.host, imap.port) as proxy,
        running(
            imap,
            port=proxy.port,
            read_timeout_seconds=2,
            idle_renew_seconds=3,
            catchup_poll_seconds=3,
        ) as source,
    ):
        wait_for(lambda: imap.cursor_at(5), "first pass through the proxy")
        worker = source.workers[0]
        proxy.stall()  # the connection stays open but nothing moves: a half-open peer
        ids += imap.append_numbered(5, start=5)
        wait_for(lambda: "BACKOFF" in [s.value for s in worker.machine.history], "a timeout")
        accepted = proxy.accepted
        proxy.resume()
        wait_for(lambda: imap.cursor_at(10), "catch-up after the reconnect")
        assert proxy.accepted > accepted or proxy.accepted >= 2
    assert len(imap.events()) == 10
    assert_once_each(imap, ids)


@pytest.fixture
def private_dovecot() -> Iterator[tuple[dovecot.DovecotLayout, int]]:
    """A Dovecot of this test alone, so it can be stopped and started again on the same port."""
    root = Path(tempfile.mkdtemp(prefix="mailtap-imap-restart-"))
    root.chmod(0o755)
    layout = dovecot.layout_for(root)
    port = process.free_port()
    dovecot.render(layout, "127.0.0.1", port)
    pid = dovecot.start(layout)
    dovecot.wait_ready(layout, pid, "127.0.0.1", port)
    try:
        yield layout, port
    finally:
        process.stop_group(pid)
        restarted = dovecot.leftover_master(layout)  # the test starts it again under a new pid
        if restarted is not None:
            # The master's group: in a test session it runs under process.spawn's group guard.
            process.stop_group(os.getpgid(restarted))
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(layout.mail_dir, ignore_errors=True)


def test_dovecot_stopped_and_restarted_the_source_recovers_and_catches_up(
    imap: ImapHarness, private_dovecot: tuple[dovecot.DovecotLayout, int]
) -> None:
    layout, port = private_dovecot
    imap.account = Account("alice@example.com", dovecot.DEFAULT_PASSWORD)
    imap.port = port
    ids = imap.append_numbered(5)
    with running(imap, read_timeout_seconds=5, idle_renew_seconds=5) as source:
        wait_for(lambda: imap.cursor_at(5), "first pass")
        pid = dovecot.leftover_master(layout)
        assert pid is not None
        process.stop_group(os.getpgid(pid))  # its group: the master runs under the group guard
        worker = source.workers[0]
        wait_for(lambda: "BACKOFF" in [s.value for s in worker.machine.history], "disconnect")
        new_pid = dovecot.start(layout)
        dovecot.wait_ready(layout, new_pid, "127.0.0.1", port)
        ids += imap.append_numbered(5, start=5)
        wait_for(lambda: imap.cursor_at(10), "catch-up after the restart")
    events = imap.events()
    assert len(events) == 10 and len(keys_of(events)) == 10
    assert set(changes(events)) == {"ADDED"}
    assert_once_each(imap, ids)


@pytest.fixture
def private_kafka() -> Iterator[PrivateKafka]:
    """A Kafka broker of this test alone, so it can be stopped and started again."""
    with private_broker("mailtap-imap-kafka-") as broker:
        yield broker


def test_kafka_stopped_and_restarted_nothing_lost_nothing_duplicated(
    services: DevServices,
    imap_account: Account,
    unique: str,
    tmp_path: Path,
    private_kafka: PrivateKafka,
) -> None:
    imap = ImapHarness(services, imap_account, unique, tmp_path, bootstrap=private_kafka.bootstrap)
    ids = imap.append_numbered(10)
    with running(imap) as source:
        wait_for(lambda: imap.cursor_at(10), "first pass")
        private_kafka.stop()
        ids += imap.append_numbered(10, start=10)
        worker = source.workers[0]
        # The source fetched the new mail and is stuck writing it (or backing off).
        wait_for(lambda: worker.machine.state.value != "IDLE", "the source noticing new mail")
        private_kafka.start()
        wait_for(lambda: imap.cursor_at(20), "catch-up once Kafka is back", timeout=300)
    assert len(imap.events()) == 20
    assert_once_each(imap, ids)


def test_a_second_instance_started_mid_backfill_fences_the_first_without_duplicates(
    imap: ImapHarness,
) -> None:
    ids = imap.append_numbered(300)
    with TcpProxy(imap.host, imap.port) as slow:
        slow.delay = 0.3  # the first instance reads through a slow link: its backfill lasts
        first = imap.spawn(
            imap.write_config("first.yaml", batch_size=10, port=slow.port), log_name="first"
        )
        wait_for(lambda: imap.cursor_at(30), "the first instance's backfill under way")
        imap.spawn(imap.write_config("second.yaml", batch_size=10), log_name="second")
        assert first.wait(180) == EXIT_FENCED, imap.log("first")
        assert "fenced by another instance" in imap.log("first")
    wait_for(lambda: imap.cursor_at(300), "the second instance finishes the backfill")
    assert len(imap.events()) == 300
    assert_once_each(imap, ids)
