"""The sink's state topic is pruned past ``smtp.state_retention`` (a clock driven forward), and
a replay sends nothing twice: inside the window the state says DONE, beyond it the command is
refused by its age (issue 14 item 5, the sink's half)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from smtp_harness import TopicReader, command, produce_commands, run_until, sink_config
from smtp_scripted_server import ScriptedRelay

from connectors.smtp.sink import SmtpSink
from connectors.smtp.state import read_state
from mailtap.dev import DevServices


class Clock:
    """The sink's clock, moved forward by the test."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def ids(cmds: list[dict[str, Any]]) -> set[str]:
    return {c["command_id"] for c in cmds}


async def test_done_states_past_the_retention_become_tombstones_and_replays_send_nothing_twice(
    services: DevServices, unique: str, relay: ScriptedRelay
) -> None:
    cfg, settings, _ = sink_config(
        services.bootstrap_servers, unique, relay.port, state_retention="30d"
    )
    clock = Clock()
    day0 = clock.now
    old = [command([f"old{i}@example.org"], created_at=day0) for i in range(3)]
    produce_commands(cfg, old)
    events = TopicReader(cfg, cfg.kafka.topics.delivery)

    def sent(cmds: list[dict[str, Any]]) -> Any:
        return lambda ev: ids(cmds) <= {e["command_id"] for e in ev if e["status"] == "SENT"}

    await run_until(SmtpSink(cfg, settings, clock=clock), events, sent(old))

    clock.now = day0 + timedelta(days=20)
    recent = [command([f"new{i}@example.org"], created_at=clock.now) for i in range(2)]
    produce_commands(cfg, recent)
    await run_until(SmtpSink(cfg, settings, clock=clock), events, sent(recent))
    state = read_state(cfg.kafka, settings.state_topic)
    assert set(state.states) == ids(old + recent)
    assert len(relay.handler.snapshot()) == 5

    # Day 31: the old commands' DONE states are past the 30 days; the recent ones are not.
    clock.now = day0 + timedelta(days=31)
    produce_commands(cfg, old + recent)  # a replay of everything
    sink = SmtpSink(cfg, settings, clock=clock)

    def refused(ev: list[dict[str, Any]]) -> bool:
        return ids(old) <= {e["command_id"] for e in ev if e["status"] == "FAILED"}

    await run_until(sink, events, lambda ev: refused(ev) and sink.records_total >= 5)
    assert sink.pruned_total == 3
    # Nothing went out twice: the recent ones are DONE, the old ones too old to be trusted.
    assert len(relay.handler.snapshot()) == 5
    for event in events.values:
        if event["command_id"] in ids(old) and event["status"] == "FAILED":
            assert "smtp.state_retention=30d" in event["diagnostic"], event
    events.drain()
    assert not [
        e for e in events.values if e["command_id"] in ids(recent) and e["status"] != "SENT"
    ]
    # The state shrank to the window: the pruned commands are tombstones, and a refusal adds no
    # state of its own.
    state = read_state(cfg.kafka, settings.state_topic)
    assert set(state.states) == ids(recent)
    events.close()
