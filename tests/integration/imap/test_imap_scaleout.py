"""Three IMAP source processes share 30 mailboxes through a Kafka consumer group (imap.group): one is
killed -9, a fourth joins later, mail arrives all along. Every mail is on mail.events exactly once
(read_committed), every mailbox is owned by exactly one live instance after each rebalance (read
from each instance's /healthz), and the time from the kill until the orphaned mailboxes publish
again is printed."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from imapclient import IMAPClient

from connectors.core.kafka.clients import consumer_config
from connectors.core.source.ownership.group import (
    WorkUnit,
    by_account,
    describe_owners,
)
from mailtap.dev import DevServices
from tests.integration.imap.imap_harness import ImapHarness, make_mail, wait_for
from tests.support.scaleout import (
    Instance,
    names_covering,
    settled,
    start_instance,
    stop_instances,
)

ACCOUNTS = 10
FOLDERS = ("INBOX", "Work", "Later")
#: Few partitions, so that each of three members holds two and every partition an account.
PARTITIONS = 6
SESSION_S = 6


def _account_names(unique: str) -> list[str]:
    """Ten names that together cover every work partition: whichever partitions an instance
    holds, it owns mailboxes (so killing one always orphans some, and a newcomer gets some)."""
    return names_covering("imap", by_account, lambda i: f"so{i}-{unique}", ACCOUNTS, PARTITIONS)


@dataclass
class Feed:
    """Appends mails round-robin over the mailboxes until stopped; remembers each one."""

    services: DevServices
    host: str
    port: int
    accounts: dict[str, tuple[str, str]]
    unique: str
    sent: dict[str, tuple[str, float]] = field(default_factory=dict)  # message id -> (unit, at)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self) -> None:
        clients = {}
        try:
            for name, (user, password) in self.accounts.items():
                client = IMAPClient(self.host, port=self.port, ssl=False)
                client.login(user, password)
                clients[name] = client
            units = [(a, f) for a in self.accounts for f in FOLDERS]
            for n in itertools.count():
                if self.stop.wait(0.05):
                    break
                account, folder = units[n % len(units)]
                mid = f"feed{n}-{self.unique}@example.com"
                clients[account].append(folder, make_mail(mid, f"feed {n}"))
                self.sent[mid] = (f"imap/{account}/{folder}", time.monotonic())
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            for client in clients.values():
                client.logout()


class EventWatch:
    """Reads mail.events (read_committed) on a thread: how often each key was seen, and when."""

    def __init__(self, harness: ImapHarness) -> None:
        self.counts: Counter[str] = Counter()
        self.first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._consumer = Consumer(consumer_config(harness.kafka, f"t-{uuid.uuid4().hex[:8]}"))
        self._consumer.subscribe([harness.kafka.topics.events])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.2):
                if msg.error() is None and msg.key() is not None:
                    key = msg.key().decode()
                    self.counts[key] += 1
                    self.first_seen.setdefault(key, time.monotonic())
        self._consumer.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _config(
    harness: ImapHarness, accounts: dict[str, tuple[str, str]], unique: str
) -> dict[str, Any]:
    config = harness.config_dict(parse_workers=0)
    template = config["imap"]["accounts"][0]
    config["imap"]["accounts"] = [
        {**template, "name": name, "username": user, "password": password, "folders": list(FOLDERS)}
        for name, (user, password) in accounts.items()
    ]
    config["imap"]["group"] = {
        "id": f"imap-group-{unique}",
        "work_topic": f"mailtap.imap-work.{unique}",
        "work_partitions": PARTITIONS,
        "session_timeout_seconds": SESSION_S,
    }
    return config


def _settled(instances: list[Instance], expected: set[str], what: str) -> dict[str, set[str]]:
    return settled(instances, expected, 120, what)


def test_three_instances_share_thirty_mailboxes_through_a_kill_and_a_newcomer(
    imap: ImapHarness, services: DevServices, unique: str, tmp_path: Path
) -> None:
    names = _account_names(unique)
    accounts = {}
    for name in names:
        account = services.add_user(f"{name}@example.com", f"pw-{name}")
        accounts[name] = (account.username, account.password)
        setup = IMAPClient(imap.host, port=imap.port, ssl=False)
        setup.login(account.username, account.password)
        for folder in FOLDERS[1:]:
            setup.create_folder(folder)
        setup.logout()
    expected = {f"imap/{a}/{f}" for a in names for f in FOLDERS}
    config = _config(imap, accounts, unique)
    group = config["imap"]["group"]

    instances = [start_instance("imap-source", config, tmp_path, f"i{n}") for n in range(3)]
    watch = EventWatch(imap)
    feed = Feed(services, imap.host, imap.port, accounts, unique)
    feeder = threading.Thread(target=feed.run, daemon=True)
    try:
        owned = _settled(instances, expected, "30 mailboxes split over three instances")
        print(f"\nfirst split: { {k: len(v) for k, v in owned.items()} }")

        # The same answer from Kafka: the coordinator's member assignments + the mapping.
        units = [WorkUnit("imap", a, f) for a in names for f in FOLDERS]
        owners = describe_owners(imap.kafka, group["id"], group["work_topic"], units, by_account)
        by_pid = {str(i.proc.pid): i.name for i in instances}
        for unit, owner in owners.items():
            assert owner is not None, unit
            assert str(unit) in owned[by_pid[owner.client_id.rsplit(":", 1)[1]]]

        # Each instance's /healthz also says which work partitions the group gave it.
        held = [set(i.health()["assignment"]["partitions"]) for i in instances]
        assert set().union(*held) == set(range(PARTITIONS)), held
        assert sum(len(h) for h in held) == PARTITIONS, held

        feeder.start()
        time.sleep(8)

        victim = max(instances, key=lambda i: len(owned[i.name]))
        orphaned = owned[victim.name]
        victim.proc.kill()
        killed_at = time.monotonic()
        victim.proc.wait(10)
        owned = _settled(instances, expected, "the victim's mailboxes taken over")
        print(f"after kill -9 of {victim.name}: { {k: len(v) for k, v in owned.items()} }")

        def republished() -> float | None:
            # Per orphaned mailbox: the first mail appended after the kill, once on Kafka.
            latest = 0.0
            for mailbox in orphaned:
                after = [
                    mid
                    for mid, (unit, at) in list(feed.sent.items())
                    if unit == mailbox and at > killed_at
                ]
                account = mailbox.split("/")[1]
                keys = [f"{account}/mid:{m}" for m in after]
                seen = [watch.first_seen[k] for k in keys if k in watch.first_seen]
                if not seen:
                    return None
                latest = max(latest, min(seen))
            return latest

        back = wait_for(republished, "the orphaned mailboxes publishing again", timeout=120)
        print(
            f"kill -9 -> all {len(orphaned)} orphaned mailboxes publish again: "
            f"{back - killed_at:.1f}s (session timeout {SESSION_S}s)"
        )

        instances.append(start_instance("imap-source", config, tmp_path, "i3"))
        owned = _settled(instances, expected, "the newcomer's share")
        print(f"after a fourth joined: { {k: len(v) for k, v in owned.items()} }")
        time.sleep(3)
    finally:
        feed.stop.set()
        if feeder.is_alive() or feeder.ident is not None:
            feeder.join(30)
        try:
            if feed.error is None and feed.sent:
                wanted = {f"{unit.split('/')[1]}/mid:{mid}" for mid, (unit, _) in feed.sent.items()}
                wait_for(
                    lambda: wanted <= set(watch.counts),
                    f"all {len(wanted)} mails on mail.events",
                    timeout=120,
                )
                time.sleep(2)  # a duplicate committed late would show up here
        finally:
            watch.close()
            stop_instances(instances)
    assert feed.error is None, feed.error
    print(f"mails appended: {len(feed.sent)}")
    duplicates = {k: n for k, n in watch.counts.items() if n != 1}
    assert not duplicates, f"published more than once: {sorted(duplicates.items())[:10]}"
    wanted = {f"{unit.split('/')[1]}/mid:{mid}" for mid, (unit, _) in feed.sent.items()}
    assert set(watch.counts) == wanted
    for instance in instances:
        assert "Traceback" not in instance.log_text(), instance.log_text()[-3000:]
