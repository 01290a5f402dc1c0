"""Source metrics for operators: build info, owned mailboxes, state gauge, health reasons."""

from __future__ import annotations

from confluent_kafka import TopicPartition
from prometheus_client import generate_latest

from connectors.core.metrics import SourceMetrics
from connectors.smtp.metrics import SinkMetrics


def value(metrics: SourceMetrics | SinkMetrics, line_start: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {line_start}")


def test_state_gauge_keeps_one_state_per_mailbox_and_fenced_is_unhealthy() -> None:
    m = SourceMetrics()
    m.watch("imap", "a", "INBOX")
    m.watch("imap", "b", "INBOX")
    assert value(m, 'mailtap_source_mailboxes{source="imap"}') == 2
    m.set_state("imap", "a", "INBOX", "SYNCING")
    m.set_state("imap", "a", "INBOX", "BACKOFF")
    labels = 'account="a",folder="INBOX",source="imap"'
    assert value(m, f'mailtap_source_state{{{labels},state="SYNCING"}}') == 0
    assert value(m, f'mailtap_source_state{{{labels},state="BACKOFF"}}') == 1
    ok, detail = m.health(600)
    assert ok and detail["backoff"] == ["imap/a/INBOX"]
    m.set_state("imap", "a", "INBOX", "FENCED")
    ok, detail = m.health(600)
    assert not ok and detail["reason"] == "imap/a/INBOX fenced by another instance"


def test_stale_mailbox_reason_and_build_info() -> None:
    m = SourceMetrics()
    m.watch("ews", "x", "Inbox")
    ok, detail = m.health(-1)
    assert not ok and detail["reason"].startswith("ews/x/Inbox not synced for")
    assert value(m, 'mailtap_build_info{component="source"') == 1
    sink = SinkMetrics()
    assert value(sink, 'mailtap_build_info{component="smtp-sink"') == 1
    ok, detail = sink.health(-1)
    assert not ok and "no consume round" in detail["reason"]


def test_the_sink_reports_its_work_units_in_healthz() -> None:
    class Consumer:
        def assignment(self) -> list[TopicPartition]:
            return [TopicPartition("mail.commands", p) for p in (0, 3)]

        def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
            return [TopicPartition(tp.topic, tp.partition, 5) for tp in partitions]

        def get_watermark_offsets(self, tp: TopicPartition, cached: bool) -> tuple[int, int]:
            return 0, 8

    sink = SinkMetrics()
    assert sink.health(600)[1]["assigned_partitions"] == 0
    sink.observe_consumer(Consumer())
    assert sink.health(600)[1]["assigned_partitions"] == 2
    assert value(sink, "mailtap_smtp_assigned_partitions") == 2
    assert value(sink, 'mailtap_smtp_consumer_lag{partition="3",topic="mail.commands"}') == 3


def test_a_worker_that_stops_after_its_mailbox_moved_away_does_not_bring_it_back() -> None:
    """The runtime's join gave up on a slow worker and unwatched its mailbox (it moved to
    another instance); the worker then finished its sync and stopped. Before, that re-added the
    mailbox: /healthz listed it as this instance's, "not synced", unhealthy for good."""
    m = SourceMetrics()
    m.watch("imap", "a", "INBOX")
    m.watch("imap", "b", "INBOX")
    m.set_state("imap", "a", "INBOX", "SYNCING")
    m.unwatch("imap", "a", "INBOX")
    m.synced("imap", "a", "INBOX", 3)
    m.set_state("imap", "a", "INBOX", "STOPPED")
    m.set_fallbacks("imap", "a", "INBOX", ("no IDLE: polling",))
    m.refused("imap", "a", "INBOX", "no Write on mail.events")
    ok, detail = m.health(600)
    assert ok, detail
    assert detail["mailboxes"] == ["imap/b/INBOX"]
    assert "imap/a/INBOX" not in detail["states"] and detail["fallbacks"] == {}
    assert value(m, 'mailtap_source_mailboxes{source="imap"}') == 1
    text = generate_latest(m.registry).decode()
    assert 'account="a"' not in text
    # Handed back later: a new worker's reports count again.
    m.watch("imap", "a", "INBOX")
    m.set_state("imap", "a", "INBOX", "IDLE")
    assert m.health(600)[1]["states"]["imap/a/INBOX"] == "IDLE"


def test_the_sink_drops_the_lag_of_a_partition_it_no_longer_holds() -> None:
    held = [TopicPartition("mail.commands", p) for p in (0, 3)]

    class Consumer:
        def assignment(self) -> list[TopicPartition]:
            return held

        def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
            return [TopicPartition(tp.topic, tp.partition, 5) for tp in partitions]

        def get_watermark_offsets(self, tp: TopicPartition, cached: bool) -> tuple[int, int]:
            return 0, 8

    sink = SinkMetrics()
    sink.observe_consumer(Consumer())
    assert value(sink, 'mailtap_smtp_consumer_lag{partition="0",topic="mail.commands"}') == 3
    held = held[1:]  # a rebalance moved partition 0 to another instance
    sink.observe_consumer(Consumer())
    assert value(sink, 'mailtap_smtp_consumer_lag{partition="3",topic="mail.commands"}') == 3
    text = generate_latest(sink.registry).decode()
    assert 'partition="0",topic="mail.commands"' not in text
