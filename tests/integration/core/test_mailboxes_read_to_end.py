"""Reading the mailboxes topic at start-up ends at the topic's end as of the read (not at an
end-of-partition event a fetch later), with every record before it taken, and the watcher then
follows the records written after it."""

from __future__ import annotations

import threading

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.topics import ensure_topic_specs
from connectors.core.source.ownership.catalog import (
    ADDED,
    REMOVED,
    MailboxCatalog,
    MailboxWatcher,
    read_changes,
    topic_spec,
    write_change,
)
from connectors.core.source.ownership.group import WorkUnit
from connectors.core.source.ownership.wiring import read_mailboxes
from mailtap.dev import DevServices


def _kafka(services: DevServices, unique: str) -> KafkaSettings:
    topics = TopicNames(mailboxes=f"{TopicNames().mailboxes}.{unique}")
    kafka = KafkaSettings(bootstrap_servers=services.kafka.bootstrap_servers, topics=topics)
    ensure_topic_specs(kafka, [topic_spec(kafka)])
    return kafka


def test_an_empty_mailboxes_topic_reads_as_the_configuration(
    services: DevServices, unique: str
) -> None:
    kafka = _kafka(services, unique)
    assert read_changes(kafka, timeout=30) == {}
    read = read_mailboxes(kafka, "imap", {"a": ("INBOX",)})
    try:
        assert read.catalog.wanted() == {WorkUnit("imap", "a", "INBOX")}
    finally:
        read.watcher.close()


def test_the_read_takes_every_record_then_follows_the_new_ones(
    services: DevServices, unique: str
) -> None:
    kafka = _kafka(services, unique)
    write_change(kafka, WorkUnit("imap", "a", "Sent"), ADDED)
    write_change(kafka, WorkUnit("imap", "a", "INBOX"), REMOVED)
    write_change(kafka, WorkUnit("imap", "a", "Drafts"), ADDED)
    write_change(kafka, WorkUnit("imap", "a", "Drafts"), None)  # forgotten again
    assert read_changes(kafka, timeout=30) == {
        WorkUnit("imap", "a", "Sent"): ADDED,
        WorkUnit("imap", "a", "INBOX"): REMOVED,
    }

    catalog = MailboxCatalog("imap", {"a": ("INBOX",)})
    changed = threading.Event()
    watcher = MailboxWatcher(kafka, catalog.record, on_change=changed.set)
    try:
        watcher.read_to_end(timeout=30)
        assert catalog.wanted() == {WorkUnit("imap", "a", "Sent")}
        watcher.start()
        write_change(kafka, WorkUnit("imap", "a", "Archive"), ADDED)
        assert changed.wait(30), "the watcher did not follow a change written after the read"
        assert catalog.wanted() == {WorkUnit("imap", "a", "Sent"), WorkUnit("imap", "a", "Archive")}
    finally:
        watcher.request_stop()
        watcher.close()
