"""A command the sink cannot decode because the schema registry does not answer is read again
later, not dead-lettered: a dead letter is a reply the customer never gets unless an operator
replays it. Found by `mailtap soak` (60 minutes, seed 1): a registry-down fault sent an
acknowledgement command to mail.commands.dlq and the verifier counted it without a final
DeliveryEvent. Bad data still goes to the DLQ."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest

from connectors.core.errors import DataError, RegistryUnavailable
from connectors.smtp import sink as sink_module
from connectors.smtp.admission import CommandAdmission
from connectors.smtp.retry import DueGate
from connectors.smtp.sink import SmtpSink

NOW = datetime(2026, 12, 5, 21, 0, tzinfo=UTC)


class Record:
    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "mail.commands"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None


class Serde:
    def decode(self, value: bytes, topic: str = "") -> dict[str, Any]:
        if value == b"registry-down":
            raise RegistryUnavailable("the schema registry did not answer: connection refused")
        raise DataError("not an Avro record of a known encoding")


class Consumer:
    def __init__(self) -> None:
        self.paused: list[Any] = []
        self.seeks: list[tuple[str, int, int]] = []

    def pause(self, partitions: list[Any]) -> None:
        self.paused.extend((p.topic, p.partition) for p in partitions)

    def seek(self, tp: Any) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))


class Rounds:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def deliver(
        self, recorders: Any, to_send: Any, known: Any, dead: Any, offsets: Any, **kw: Any
    ) -> None:
        self.calls.append({"to_send": to_send, "known": known, "dead": dead, "offsets": offsets})


class Transport:
    def reset_breaker(self) -> None:
        pass


class Lanes:
    recorders: list[Any] = []


def _admission() -> CommandAdmission:
    return CommandAdmission(cast(Any, None), cast(Any, Serde()), cast(Any, None), lambda: NOW)


def test_admission_leaves_a_registry_outage_to_its_caller_and_dead_letters_bad_data() -> None:
    admission = _admission()
    dead: list[Any] = []
    with pytest.raises(RegistryUnavailable):
        admission.admit(cast(Any, Record(5, b"registry-down")), None, set(), dead)
    assert dead == []
    admission.admit(cast(Any, Record(6, b"garbage")), None, set(), dead)
    assert [reason for _, reason, _ in dead] == [
        "undecodable ReplyCommand: not an Avro record of a known encoding"
    ]


@pytest.mark.asyncio
async def test_the_sink_parks_the_partition_at_the_command_and_commits_nothing_past_it() -> None:
    sink = object.__new__(SmtpSink)
    consumer = Consumer()
    rounds = Rounds()
    sink._consumer = cast(Any, consumer)
    sink.clock = lambda: NOW
    sink.retry_topics = set()
    sink.gate = DueGate()
    sink.admission = _admission()
    sink.transport = cast(Any, Transport())
    sink.lanes = cast(Any, Lanes())
    sink.rounds = cast(Any, rounds)
    sink.batch_budget_s = 1.0
    sink._stop = None

    # the undecodable command, then one behind it on the same partition
    await sink._process(cast(Any, [Record(5, b"registry-down"), Record(6, b"garbage")]))

    [call] = rounds.calls
    assert call["dead"] == []  # neither was dead-lettered: 6 is not read before 5
    assert call["offsets"] == {("mail.commands", 0): 5}  # the commit stays at the command
    assert consumer.paused == [("mail.commands", 0)]
    assert consumer.seeks == [("mail.commands", 0, 5)]
    due = sink.gate.paused[("mail.commands", 0)]
    assert due == int(NOW.timestamp() * 1000) + sink_module.REGISTRY_RETRY_MS
