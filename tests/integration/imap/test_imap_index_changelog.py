"""The key index changelog on real Dovecot and real Kafka (issue 12): a source restores its
account's index from its own changelog partition, not from every account's events; keys with
``#<fp8>`` and tombstones behave the same across restarts; a deployment with events but no
changelog (an upgrade) is rebuilt once from ``mail.events`` and written to the changelog.

``mail.events`` carries 200,000 events of other accounts (and the changelog their records, as
their own sources would have written them), produced with a plain producer. The assertions are
on the counts the loader reports (:class:`connectors.imap.index.IndexLoad`), never on time;
``mailtap bench startup`` measures the time.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from typing import Any

import yaml
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.core.config import ClaimCheckSettings
from connectors.core.kafka.clients import consumer_config, producer_config
from connectors.core.kafka.readtoend import read_to_end
from connectors.core.mail import parse_mail
from connectors.core.source.ownership.group import WorkUnit
from connectors.imap.index import AccountIndex, load_indexes
from connectors.imap.indexlog import (
    INDEX_PARTITIONS,
    IndexChangelog,
    location_key,
    marker_key,
    partition_of,
)
from mailtap.cli import main
from mailtap.mailbox_data import PurgePlan, execute_purge
from tests.integration.imap.imap_harness import ImapHarness, make_mail, running, wait_for

OTHER_EVENTS = 200_000
OTHER_ACCOUNTS = 400


def _fill_other_accounts(imap: ImapHarness, changelog: bool) -> Counter[int]:
    """Events of other accounts on the events topic and, with ``changelog``, their changelog
    records and markers; returns the changelog records put in each partition."""
    kafka = imap.kafka
    parsed = parse_mail(
        make_mail("filler@example.com", "another account's mail"),
        account="other",
        source={"kind": "IMAP", "folder": "INBOX", "uidvalidity": 1, "uid": 1, "modseq": None,
                "item_id": None, "change_key": None},
        flags=[],
        internal_date=None,
        observed_at=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    value = imap.serde.encode(dict(parsed.event), kafka.topics.events)
    log = IndexChangelog.open(kafka)
    location = b'{"fingerprint":null,"folder":"INBOX","uid":1,"uidvalidity":1}'
    producer = Producer(producer_config(kafka, linger_ms=50))
    per_partition: Counter[int] = Counter()

    def produce(topic: str, key: bytes, data: bytes, partition: int = -1) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=data, partition=partition)
                return
            except BufferError:
                producer.poll(0.1)

    for i in range(OTHER_EVENTS):
        account = f"other{i % OTHER_ACCOUNTS}-{imap.unique}"
        key = f"{account}/mid:{i}@example.com".encode()
        produce(kafka.topics.events, key, value)
        if changelog:
            partition = partition_of(account, log.partitions)
            produce(log.topic, location_key(key.decode(), "INBOX").encode(), location, partition)
            per_partition[partition] += 1
    if changelog:
        for n in range(OTHER_ACCOUNTS):
            account = f"other{n}-{imap.unique}"
            partition = partition_of(account, log.partitions)
            produce(log.topic, marker_key(account).encode(), b"{}", partition)
            per_partition[partition] += 1
    assert producer.flush(120) == 0
    return per_partition


def _changelog_records(imap: ImapHarness, account: str, topic: str | None = None) -> list[Any]:
    """``(key, value or None)`` of one account on its changelog partition, in order."""
    topic = topic or imap.kafka.topics.imap_index
    kafka = imap.kafka.model_copy(
        update={"topics": imap.kafka.topics.model_copy(update={"imap_index": topic})}
    )
    partition = partition_of(account, IndexChangelog.open(kafka).partitions)
    consumer = Consumer(
        consumer_config(imap.kafka, f"t-{uuid.uuid4().hex[:8]}", fetch_wait_max_ms=10)
    )
    found: list[Any] = []
    try:
        for msg in read_to_end(consumer, [TopicPartition(topic, partition, 0)], 60):
            key = msg.key().decode()
            if key.startswith(f"{account}/"):
                value = msg.value()
                found.append((key, json.loads(value) if value is not None else None))
        return found
    finally:
        consumer.close()


def _latest(records: list[Any]) -> dict[str, Any]:
    return dict(records)


def _inbox(key: str) -> str:
    """The changelog key of ``key``'s record for INBOX."""
    return location_key(key, "INBOX")


def _only_index(source: Any) -> AccountIndex:
    # The key index of the source's one owned account.
    (worker,) = source.workers
    return worker.index  # type: ignore[no-any-return]


def test_a_start_restores_only_its_changelog_partition_and_keeps_fp8_keys_and_tombstones(
    imap: ImapHarness,
) -> None:
    imap.account_name = name = f"ix-{imap.unique}"
    shared = f"shared-{imap.unique}@example.com"
    imap.append(
        [
            make_mail(shared, "first", body="one"),
            make_mail(shared, "second", body="two"),
            make_mail(f"gone-{imap.unique}@example.com", "gone"),
        ]
    )
    per_partition = _fill_other_accounts(imap, changelog=True)
    mine = partition_of(name, IndexChangelog.open(imap.kafka).partitions)
    bare = f"{name}/mid:{shared}"
    gone = f"{name}/mid:gone-{imap.unique}@example.com"

    with running(imap, catchup_poll_seconds=2) as source:
        load = _only_index(source).load
        assert load is not None
        # A new account: its partition read (other accounts' records there included), not
        # the 200,000 events.
        assert (load.events_scanned, load.rebuilt) == (0, False)
        assert load.changelog_records_read == per_partition[mine]
        assert load.changelog_records_kept == 0
        wait_for(lambda: imap.cursor_at(3), "three mails published")
        client = imap.client()
        client.delete_messages([3])
        client.expunge()
        client.logout()
        wait_for(
            lambda: _latest(_changelog_records(imap, name)).get(_inbox(gone), 0) is None,
            "the expunged mail's changelog tombstone",
        )

    written = _changelog_records(imap, name)
    latest = _latest(written)
    second = next(k for k in latest if k.startswith(f"{_inbox(bare)}#"))
    fingerprint = latest[second]["fingerprint"]
    assert second == f"{_inbox(bare)}#{fingerprint[:8]}"
    second = f"{bare}#{fingerprint[:8]}"
    assert latest[_inbox(bare)]["uid"] == 1 and latest[_inbox(second)]["uid"] == 2
    assert latest[_inbox(gone)] is None
    assert latest[marker_key(name)] == {"account": name, "version": 2}

    with running(imap, catchup_poll_seconds=2) as source:
        index = _only_index(source)
        assert index.load is not None
        assert index.load.events_scanned == 0
        assert index.load.changelog_records_kept == len(written)
        assert index.load.changelog_records_read == per_partition[mine] + len(written)
        assert len(index) == 2  # the tombstoned key is not known again
        # A copy of the second mail is the same key (an update), a third mail with the shared
        # Message-ID gets a key of its own, and an expunge of the first is its tombstone.
        imap.append(
            [make_mail(shared, "second", body="two"), make_mail(shared, "third", body="three")]
        )
        wait_for(lambda: imap.cursor_at(5), "the two new mails published")
        client = imap.client()
        client.delete_messages([1])
        client.expunge()
        client.logout()
        wait_for(
            lambda: _latest(_changelog_records(imap, name)).get(_inbox(bare), 0) is None,
            "the first mail's tombstone",
        )

    events = [r for r in imap.events() if r.key is not None and r.key.startswith(f"{name}/")]
    by_uid = {r.value["source"]["uid"]: r for r in events if r.value is not None}
    assert by_uid[4].key == second and by_uid[4].value["change"] == "UPDATED"  # type: ignore[index]
    third = by_uid[5].key
    assert third not in (bare, second) and third.startswith(f"{bare}#")  # type: ignore[union-attr]
    assert [r.value for r in events if r.key == bare][-1] is None
    assert {r.key for r in events if r.value is None} == {gone, bare}


def test_events_without_a_changelog_are_read_once_and_written_to_it(imap: ImapHarness) -> None:
    imap.account_name = name = f"mg-{imap.unique}"
    shared = f"shared-{imap.unique}@example.com"
    imap.append(
        [
            make_mail(shared, "first", body="one"),
            make_mail(shared, "second", body="two"),
            make_mail(f"gone-{imap.unique}@example.com", "gone"),
        ]
    )
    _fill_other_accounts(imap, changelog=False)
    with running(imap, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(3), "three mails published")
        client = imap.client()
        client.delete_messages([3])
        client.expunge()
        client.logout()
        wait_for(
            lambda: (
                _latest(_changelog_records(imap, name)).get(
                    _inbox(f"{name}/mid:gone-{imap.unique}@example.com"), 0
                )
                is None
            ),
            "the expunged mail's tombstone",
        )
    published = _latest(_changelog_records(imap, name))
    second = next(k for k in published if k.startswith(_inbox(f"{name}/mid:{shared}#")))
    second = second.replace("/in:INBOX/", "/", 1)

    # The same deployment as before the changelog existed: events and cursor, no changelog.
    upgraded_topic = f"mailtap.imap-index.{imap.unique}.upgraded"
    upgraded = imap.kafka.model_copy(
        update={"topics": imap.kafka.topics.model_copy(update={"imap_index": upgraded_topic})}
    )
    index = load_indexes(upgraded, imap.serde, [name])[name]
    try:
        assert index.load is not None and index.load.rebuilt
        assert index.load.events_scanned >= OTHER_EVENTS + 4
        assert len(index) == 2
        assert index.uids_in("INBOX", _uidvalidity(imap)) == {1: f"{name}/mid:{shared}", 2: second}
    finally:
        index.close()
    # Written: the changelog holds the account's live keys as the source had them, and its
    # marker, so the next start reads only that.
    rebuilt = _latest(_changelog_records(imap, name, upgraded_topic))
    live = {k: v for k, v in published.items() if v is not None}
    assert rebuilt == live
    again = load_indexes(upgraded, imap.serde, [name])[name]
    try:
        assert again.load is not None and not again.load.rebuilt
        assert again.load.events_scanned == 0
        assert again.load.changelog_records_kept == len(live)
        assert again.uids_in("INBOX", _uidvalidity(imap)) == {1: f"{name}/mid:{shared}", 2: second}
        # The second mail finds its own #fp8 key again through its fingerprint.
        assert again.place(
            f"{name}/mid:{shared}",
            live[_inbox(second)]["fingerprint"],
            "INBOX",
            _uidvalidity(imap),
            2,
        ) == (second, True)
    finally:
        again.close()


def test_a_changelog_of_the_per_key_format_is_rebuilt_once_and_its_records_tombstoned(
    imap: ImapHarness,
) -> None:
    """An upgrade from the version 1 changelog (one record per key, named by the event key,
    marker ``index:v1``): its records are never read as locations; the account is rebuilt
    once from ``mail.events``, its old records tombstoned, then the ``index:v2`` marker."""
    imap.account_name = name = f"v1-{imap.unique}"
    key = f"{name}/mid:kept-{imap.unique}@example.com"
    imap.append([make_mail(f"kept-{imap.unique}@example.com", "published by the source")])
    with running(imap, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(1), "the mail published")
    uidvalidity = _uidvalidity(imap)
    old_topic = f"mailtap.imap-index.{imap.unique}.v1"
    old = imap.kafka.model_copy(
        update={"topics": imap.kafka.topics.model_copy(update={"imap_index": old_topic})}
    )
    changelog = IndexChangelog.open(old)
    partition = partition_of(name, changelog.partitions)
    ghost = f"{name}/mid:ghost-{imap.unique}@example.com"

    def v1(folder: str, uid: int) -> bytes:
        where = {"fingerprint": None, "folder": folder, "uid": uid, "uidvalidity": uidvalidity}
        return json.dumps(where, sort_keys=True, separators=(",", ":")).encode()

    producer = Producer(producer_config(imap.kafka))
    # As version 1 wrote them, but naming places the events do not: read as locations, they
    # would put the key in Junk and a mail the account never published in INBOX.
    for record_key, value in [
        (key, v1("Junk", 7)),
        (ghost, v1("INBOX", 50)),
        (f"{name}/index:v1", b'{"account":"%s","version":1}' % name.encode()),
    ]:
        producer.produce(old_topic, key=record_key.encode(), value=value, partition=partition)
    assert producer.flush(30) == 0

    index = load_indexes(old, imap.serde, [name])[name]
    try:
        assert index.load is not None and index.load.rebuilt and index.load.events_scanned >= 1
        assert index.uids_in("INBOX", uidvalidity) == {1: key}
        assert index.uids_in("Junk", uidvalidity) == {} and len(index) == 1
    finally:
        index.close()
    latest = _latest(_changelog_records(imap, name, old_topic))
    fingerprint = latest[_inbox(key)].pop("fingerprint")
    assert len(fingerprint) == 64
    assert latest == {
        key: None,
        ghost: None,
        f"{name}/index:v1": None,
        _inbox(key): {"folder": "INBOX", "uid": 1, "uidvalidity": uidvalidity},
        marker_key(name): {"account": name, "version": 2},
    }
    again = load_indexes(old, imap.serde, [name])[name]
    try:
        assert again.load is not None and not again.load.rebuilt
        assert again.load.events_scanned == 0
        assert again.uids_in("INBOX", uidvalidity) == {1: key} and len(again) == 1
    finally:
        again.close()


def test_a_purged_mailbox_s_keys_leave_the_changelog_and_are_new_again(imap: ImapHarness) -> None:
    """``mailtap mailboxes purge`` (docs/runbook.md) tombstones the keys' records of that
    folder: a start after it does not know them."""
    imap.account_name = name = f"pg-{imap.unique}"
    key = f"{name}/mid:purged-{imap.unique}@example.com"
    imap.append([make_mail(f"purged-{imap.unique}@example.com", "to be purged")])
    with running(imap, catchup_poll_seconds=2):
        wait_for(lambda: imap.cursor_at(1), "the mail published")
    assert _latest(_changelog_records(imap, name))[_inbox(key)]["uid"] == 1
    claims = ClaimCheckSettings(url=f"file://{imap.tmp}/claims")
    execute_purge(imap.kafka, claims, PurgePlan(WorkUnit("imap", name, "INBOX"), [key]))
    assert _latest(_changelog_records(imap, name))[_inbox(key)] is None
    index = load_indexes(imap.kafka, imap.serde, [name])[name]
    try:
        assert index.load is not None and not index.load.rebuilt and len(index) == 0
    finally:
        index.close()


def _uidvalidity(imap: ImapHarness) -> int:
    cursor = imap.cursor()
    assert cursor is not None
    return int(cursor["uidvalidity"])


def test_topics_ensure_creates_the_changelog_when_an_imap_source_is_configured(
    imap: ImapHarness,
) -> None:
    """Where the source's principal may not create topics, the admin's `topics ensure` does."""
    topic = f"mailtap.imap-index.{imap.unique}.ensured"
    config = imap.config_dict()
    config["kafka"]["topics"]["imap_index"] = topic
    path = imap.tmp / "ensure.yaml"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(main, ["topics", "ensure", "-c", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[topic] == "created"
    kafka = imap.kafka.model_copy(
        update={"topics": imap.kafka.topics.model_copy(update={"imap_index": topic})}
    )
    assert IndexChangelog.open(kafka).partitions == INDEX_PARTITIONS
