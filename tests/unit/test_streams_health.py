"""The streams worker's /healthz: healthy only while its event loop reports, holding partitions
of the events topic, neither recovering nor rebalancing; served only with a health section."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

from prometheus_client import generate_latest

from connectors.core.config import config_from_dict
from mailtap.commands.streams import serves_health
from mailtap.commands.streams_health import StreamsHealth
from streams.testing import WorkflowHarness, mail_record

KAFKA = {"bootstrap_servers": "127.0.0.1:9092"}


class TP(NamedTuple):  # the shape of faust's TP
    topic: str
    partition: int


def app(*topics: str, in_recovery: bool = False, rebalancing: bool = False) -> SimpleNamespace:
    assignment = {TP(t, i) for i, t in enumerate(topics)}
    consumer = SimpleNamespace(assignment=lambda: assignment)
    return SimpleNamespace(consumer=consumer, in_recovery=in_recovery, rebalancing=rebalancing)


def test_unhealthy_until_the_loop_reports_with_partitions() -> None:
    health = StreamsHealth("mail.events")
    assert health.health(600)[0] is False  # nothing reported yet
    health.observe(app("other.topic"))
    ok, detail = health.health(600)
    assert not ok and detail["assigned_partitions"] == 0
    health.observe(app("mail.events", "mail.events"))
    ok, detail = health.health(600)
    assert ok and detail["assigned_partitions"] == 2


def test_unhealthy_while_recovering_or_when_the_loop_stops_reporting() -> None:
    health = StreamsHealth("mail.events")
    health.observe(app("mail.events", in_recovery=True))
    assert health.health(600)[0] is False
    health.observe(app("mail.events"))
    assert health.health(600)[0] is True
    assert health.health(-1)[0] is False  # the last report is older than the allowed age


def test_served_only_with_a_health_section() -> None:
    assert not serves_health(config_from_dict({"kafka": KAFKA}))
    assert serves_health(config_from_dict({"kafka": KAFKA, "health": {"port": 0}}))
    assert serves_health(config_from_dict({"kafka": KAFKA}, env={"MAILTAP__HEALTH__PORT": "0"}))


def test_guard_decisions_count_the_published_skips_and_the_repeats_that_publish_nothing() -> None:
    harness = WorkflowHarness(
        {
            "from_address": {"address": "help@example.com"},
            "auth_policy": "none",
            "rules": [{"workflow": "ticket_intake"}],
        }
    )
    health = StreamsHealth("mail.events")
    mail = mail_record()
    for record in (mail, mail, {**mail, "change": "UPDATED"}):
        health.observe_outcome(harness.deliver(record), record=True)
    health.observe_outcome(
        harness.deliver(
            mail_record(subject="Out of office", guard_headers={"auto_submitted": "auto-replied"})
        ),
        record=True,
    )

    def decisions(guard: str) -> float | None:
        labels = {"workflow": "ticket_intake", "guard": guard}
        return health.registry.get_sample_value("mailtap_streams_guard_decisions_total", labels)

    assert decisions("dedupe") == 2
    assert decisions("auto_submitted") == 1
    assert health.registry.get_sample_value("mailtap_streams_records_processed_total") == 4


def test_the_lag_of_a_partition_moved_away_is_no_longer_shown() -> None:
    """A rebalance took mail.events/0 to another worker: its series goes (it showed the lag of
    the last observation for good, a partition seemingly stuck that another worker had read)."""
    health = StreamsHealth("mail.events")
    ends = {TP("mail.events", 0): 2000, TP("mail.events", 1): 1500}

    def consumer(*held: TP, committed: int) -> SimpleNamespace:
        return SimpleNamespace(
            assignment=lambda: set(held),
            highwater=ends.__getitem__,
            _committed_offset={tp: committed for tp in held},
        )

    def lags() -> dict[str, float]:
        text = generate_latest(health.registry).decode()
        return {
            line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("mailtap_streams_consumer_lag{")
        }

    both = SimpleNamespace(consumer=consumer(*ends, committed=10), in_recovery=False)
    health.observe(SimpleNamespace(**vars(both), rebalancing=False))
    assert lags() == {
        'partition="0",topic="mail.events"': 1990,
        'partition="1",topic="mail.events"': 1490,
    }
    one = consumer(TP("mail.events", 1), committed=1500)
    health.observe(SimpleNamespace(consumer=one, in_recovery=False, rebalancing=False))
    assert lags() == {'partition="1",topic="mail.events"': 0}
