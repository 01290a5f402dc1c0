"""The faust app in-process with ``agent.test_context()`` and the memory store.

No broker: the worker's sends (``streams.sends``) are replaced by a recorder and the producer's
partitioner by a constant (faust needs a started producer to place changelog records of
``use_partitioner`` tables). Everything else — decoding, the agent, the tables, the timer body,
the acknowledgement gate — is the real code.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka.errors import IllegalStateError
from faust.types import TP, Message
from faust.types.tuples import ConsumerMessage

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.errors import RegistryUnavailable
from streams import app as streams_app
from streams.app import StreamsWorker
from streams.config import StreamsSettings
from streams.errors import OutputLost
from streams.inline import InlineConductor, admit
from streams.pipeline import Outcome
from streams.testing import EPOCH, mail_record
from streams.workflows.approval import approval_id

KAFKA = KafkaSettings(bootstrap_servers="127.0.0.1:1")  # never contacted
MAIL = AvroSerde.for_schema("MailEvent")
COMMAND = AvroSerde.for_schema("ReplyCommand")
EVENT = AvroSerde.for_schema("WorkflowEvent")


class Recorder:
    """Stands in for Kafka: what was sent where, in order, including changelog writes.

    Outputs are logged under a short name (``commands``, ``workflow``, ``conversations``);
    ``overrides[name]`` replaces the send of one of them (a send left unacknowledged, or lost).
    """

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.log: list[tuple[str, bytes | None, Any]] = []
        self.placed: list[tuple[str, int | None]] = []
        self.overrides: dict[str, Any] = {}

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[None]:
        name = self.names.get(topic, topic)
        if name in self.overrides:
            return cast(
                asyncio.Future[None],
                await self.overrides[name](key=key, value=value, headers=headers),
            )
        self.log.append((name, key, value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def queue(self, topic: str, partition: int | None, key: bytes | None, value: Any) -> None:
        self.log.append((topic, key, value))
        self.placed.append((topic, partition))

    def partitions(self) -> list[tuple[str, int | None]]:
        """(topic, partition) of every changelog write."""
        return list(self.placed)

    def topics(self) -> list[str]:
        return [t for t, _, _ in self.log]

    def commands(self) -> list[dict[str, Any]]:
        return [COMMAND.decode(v) for t, _, v in self.log if t == "commands"]

    def events(self) -> list[dict[str, Any]]:
        return [EVENT.decode(v) for t, _, v in self.log if t == "workflow"]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[StreamsWorker, Recorder]]:
    settings = StreamsSettings.model_validate(
        {
            "from_address": {"address": "help@example.com"},
            "auth_policy": "none",
            "data_dir": str(tmp_path),
            "rules": [
                {"match": {"recipient": "approvals@example.com"}, "workflow": "approval"},
                {"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"},
            ],
            "workflows": {
                "approval": {
                    "options": {"approver": "boss@example.com", "reminder_after_seconds": 60}
                }
            },
        }
    )
    # The mails are built at streams.testing.EPOCH: the worker reads them then, not today.
    w = StreamsWorker(settings, KAFKA, partitions=3, clock=lambda: EPOCH)
    recorder = Recorder(
        {
            KAFKA.topics.commands: "commands",
            KAFKA.topics.workflow: "workflow",
            w.conversations_topic_name: "conversations",
        }
    )
    w.app.sends.send = recorder.send  # type: ignore[method-assign]
    w.app.sends.queue = recorder.queue  # type: ignore[method-assign]
    w.app.producer.key_partition = lambda topic, key: TP(topic, 0)
    yield w, recorder


def encoded(record: dict[str, Any]) -> tuple[bytes, bytes]:
    return record["key"].encode(), MAIL.encode(record, "mail.events")


async def test_agent_turns_a_mail_event_into_a_reply_command(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker
    key, value = encoded(mail_record(message_id="req@example.com"))
    async with w.agent.test_context() as agent:
        await agent.put(value, key=key)
    (command,) = sent.commands()
    assert command["workflow"] == "ticket_intake" and command["in_reply_to"] == "req@example.com"
    assert [e["status"] for e in sent.events()] == ["TICKET_OPENED"]
    # Outputs first, table writes after, the dedupe mark last.
    assert sent.topics() == [
        "commands",
        "workflow",
        "mailtap-streams-state-changelog",
        "mailtap-streams-state-changelog",
        "mailtap-streams-rates-changelog",  # the sender's window
        "mailtap-streams-rates-changelog",  # the recipient's window
        "mailtap-streams-runs-changelog",
    ]
    (run,) = w.tables.runs.values()
    assert run == {"commands": [command["command_id"]], "at": EPOCH.timestamp()}


async def test_table_writes_reach_the_changelog_only_after_the_outputs_were_acknowledged(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    """Sends are pipelined (streams.acks): the next mail sees the new state at once, but the
    changelog (what a restarted worker restores) waits for the acknowledgements."""
    w, sent = worker
    acks: list[asyncio.Future[None]] = []

    async def send(*, key: bytes, value: bytes, headers: Any = None) -> asyncio.Future[None]:
        sent.log.append(("commands", key, value))
        acks.append(asyncio.get_running_loop().create_future())
        return acks[-1]

    sent.overrides["commands"] = send
    opening = mail_record(message_id="req@example.com")
    await w.on_record(*encoded(opening))
    assert sent.topics() == ["commands", "workflow"]  # nothing durable in the tables yet
    again = await w.on_record(*encoded(opening))  # the same mail again...
    assert again.already_ran == "ticket_intake"  # ...deduped: nothing published
    assert [e["status"] for e in sent.events()] == ["TICKET_OPENED"]
    acks[0].set_result(None)
    await w.app.output_acks.settled()
    assert sent.topics()[-1] == "mailtap-streams-runs-changelog"


async def test_a_lost_command_leaves_its_dedupe_mark_out_of_the_changelog(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker

    async def send(*, key: bytes, value: bytes, headers: Any = None) -> asyncio.Future[None]:
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lost.set_exception(ConnectionError("the broker refused the record"))
        return lost

    crashed: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashed.append(exc)

    w.app.crash = crash  # type: ignore[method-assign]
    sent.overrides["commands"] = send
    await w.on_record(*encoded(mail_record()))
    with pytest.raises(OutputLost):
        await w.app.output_acks.settled()
    assert not [t for t in sent.topics() if t.endswith("-changelog")]
    assert [type(e) for e in crashed] == [ConnectionError]


def _count_decodes(w: StreamsWorker) -> list[bytes]:
    """The values the worker's MailEvent serde decodes from now on, in order."""
    decodes: list[bytes] = []
    decode = w.mail_serde.decode

    def counting(data: bytes, topic: str = "") -> dict[str, Any]:
        decodes.append(data)
        return decode(data, topic)

    w.mail_serde.decode = counting  # type: ignore[method-assign]
    return decodes


async def test_a_forwarded_record_is_decoded_once_for_both_agents(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, _ = worker
    decodes = _count_decodes(w)
    forwarded = encoded(mail_record(message_id="one@example.com"))
    await w.forward(*forwarded)
    outcome = await w.on_record(*forwarded)
    assert len(decodes) == 1 and len(outcome.commands) == 1
    other = encoded(mail_record(message_id="two@example.com"))  # another worker forwarded it
    assert len((await w.on_record(*other)).commands) == 1
    assert len(decodes) == 2 and (w.decoded.hits, w.decoded.misses) == (1, 1)


async def test_a_record_with_its_conversation_header_is_forwarded_without_a_decode(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    """The sources send ``mailtap.conversation`` (issue 29: the forward's decode was ~5 % of a
    worker); a record without the header (or with an empty one) is decoded as before."""
    w, sent = worker
    decodes = _count_decodes(w)
    key, value = encoded(mail_record(message_id="r@example.com", references=["<root@x>"]))
    header = [("traceparent", b"00-x"), ("mailtap.conversation", b"root@x")]
    assert await w.forward(key, value, header) == b"root@x"
    assert await w.forward(key, value, {"mailtap.conversation": b"root@x"}) == b"root@x"
    assert decodes == []
    assert await w.forward(key, value, [("mailtap.conversation", b"")]) == b"root@x"
    assert await w.forward(key, value) == b"root@x"
    assert len(decodes) == 2
    assert [(t, k, v) for t, k, v in sent.log] == [("conversations", b"root@x", value)] * 4


async def test_mail_events_are_rekeyed_by_conversation_with_value_and_headers_unchanged(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker
    opening = mail_record(message_id="<Root@Example.com>")
    reply = mail_record(
        message_id="r2@example.com",
        in_reply_to="ack@mailtap",
        references=["<root@example.com>", "ack@mailtap"],
        key="other-account/r2@example.com",
    )
    for record in (opening, reply):
        await w.forward(*encoded(record), headers=[("traceparent", b"00-x")])
    assert await w.forward(b"gone", None) is None  # a tombstone is not forwarded
    assert [(t, k) for t, k, _ in sent.log] == [
        ("conversations", b"root@example.com"),
        ("conversations", b"root@example.com"),
    ]
    assert [MAIL.decode(v)["key"] for _, _, v in sent.log] == [opening["key"], reply["key"]]


class TrackingConsumer:
    """What the re-keying asks of faust's consumer: tracking and acknowledgement."""

    def __init__(self) -> None:
        self.tracked: list[int] = []
        self.acked: list[int] = []

    def track_message(self, message: Message) -> None:
        self.tracked.append(message.offset)

    def ack(self, message: Message) -> bool:
        self.acked.append(message.offset)
        return True


def fetched(topic: str, offset: int, generation: int, key: bytes, value: bytes) -> Message:
    """A record as faust's consumer hands it on (tracked once something takes it)."""
    headers = [("mailtap.conversation", b"root@x")]
    return ConsumerMessage(
        topic, 0, offset, 0.0, 0, headers, key, value, None, generation_id=generation
    )


async def test_mail_events_are_rekeyed_in_the_fetch_loop_without_an_agent(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    """faust's fetch loop hands a ``mail.events`` record to the re-keying itself (no agent
    queue for a backlog to fill while the conversation topic's records wait behind it): it is
    forwarded, tracked and acknowledged; one of an old generation (a rebalance) is left for
    the next owner; one given again in the same generation is acknowledged, not forwarded."""
    w, sent = worker
    conductor = w.app.topics
    assert isinstance(conductor, InlineConductor)
    events = KAFKA.topics.events
    handler = conductor._build_handler(TP(events, 0), set())
    assert handler == w._rekey
    faust_handler = conductor._build_handler(TP(w.conversations_topic_name, 0), set())
    assert faust_handler != w._rekey  # the conversation agent's queue, as faust builds it
    consumer = TrackingConsumer()
    w.app.consumer = consumer  # type: ignore[assignment]
    w.app.consumer_generation_id = 4
    w.app.flow_control.resume()
    key, value = encoded(mail_record(message_id="r@example.com", references=["<root@x>"]))
    await handler(fetched(events, 10, 4, key, value))
    await handler(fetched(events, 9, 3, key, value))  # fetched before the rebalance
    await handler(fetched(events, 10, 4, key, value))  # again, after the settled re-seek
    assert [(t, k) for t, k, _ in sent.log] == [("conversations", b"root@x")]
    assert (consumer.tracked, consumer.acked) == ([10, 10], [10, 10])
    w.app.flow_control.suspend()  # a rebalance began: nothing is handed on
    assert not admit(w.app, fetched(events, 11, 4, key, value))
    assert consumer.tracked == [10, 10]


async def test_the_inline_topic_is_subscribed_when_the_conductor_starts(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, _ = worker
    conductor = w.app.topics
    assert KAFKA.topics.events not in {t for topic in conductor for t in topic.topics}
    await conductor.on_start()
    assert KAFKA.topics.events in {t for topic in conductor for t in topic.topics}


async def test_tick_fires_only_for_the_partitions_this_worker_owns(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker
    request = mail_record(to=["approvals@example.com"], message_id="req@example.com")
    await w.on_record(*encoded(request), partition=2)
    assert [c["step"] for c in sent.commands()] == ["request", "received"]
    later = EPOCH + dt.timedelta(seconds=61)
    w.owned_partitions = lambda: {0, 1}  # type: ignore[method-assign]
    assert (await w.on_tick(later)).commands == []
    w.owned_partitions = lambda: {2}  # type: ignore[method-assign]
    (reminder,) = (await w.on_tick(later)).commands
    assert reminder["step"] == "reminder-1"
    # The reminder's state update went to the request's own changelog partition.
    assert (
        w.tables.state.data._key_partition[f"approval/request/{approval_id(request['key'])}"] == 2
    )


async def test_redelivery_is_absorbed_and_tombstones_are_ignored(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker
    outcomes: list[Outcome] = []
    w.outcome_hooks.append(lambda outcome, _record: outcomes.append(outcome))
    key, value = encoded(mail_record())
    async with w.agent.test_context() as agent:
        await agent.put(value, key=key)
        await agent.put(value, key=key)
        await agent.put(None, key=key)
    assert len(sent.commands()) == 1
    # The repeat publishes nothing (a SKIPPED under the mail's key would replace its status on
    # the compacted mail.workflow); the worker counts it.
    assert [e["status"] for e in sent.events()] == ["TICKET_OPENED"]
    assert [o.already_ran for o in outcomes] == [None, "ticket_intake", None]


async def test_undecodable_record_is_reported_not_fatal(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker
    key, value = encoded(mail_record())
    async with w.agent.test_context() as agent:
        await agent.put(b"not avro", key=b"bad-key")
        await agent.put(value, key=key)
    bad, opened = sent.events()
    assert bad["status"] == "SKIPPED" and bad["instance_id"] == "bad-key"
    assert bad["attributes"]["guard"] == "decode"
    assert opened["status"] == "TICKET_OPENED"


async def test_timer_body_sends_the_approval_reminder_from_table_state(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker
    request = mail_record(to=["approvals@example.com"], message_id="req@example.com")
    key, value = encoded(request)
    async with w.agent.test_context() as agent:
        await agent.put(value, key=key)
    assert [c["step"] for c in sent.commands()] == ["request", "received"]
    w.owned_partitions = lambda: {0}  # type: ignore[method-assign]
    outcome = await w.on_tick(EPOCH + dt.timedelta(seconds=61))
    (reminder,) = outcome.commands
    assert reminder["step"] == "reminder-1" and sent.commands()[-1] == reminder
    pending = w.tables.state[f"approval/request/{approval_id(request['key'])}"]
    assert pending["reminders"] == 1
    assert (await w.on_tick(EPOCH + dt.timedelta(seconds=62))).commands == []


class FakeConsumer:
    """Records seeks; partition 0 has a committed offset, partition 1 none (a fresh group)."""

    def __init__(self, events_topic: str) -> None:
        self.committed = {
            TP(events_topic, 0): 7,
            TP(events_topic, 1): None,
            TP("x-changelog", 0): 3,
        }
        self.seeks: list[tuple[int, int]] = []
        self.start_offsets: dict[TP, int] = {}

    async def committed_offsets(self) -> dict[TP, int | None]:
        return dict(self.committed)

    async def seek_to_committed(self) -> dict[TP, int | None]:
        # The re-seek used this to read the committed offsets, and so rewound every partition.
        self.seeks.extend((tp.partition, o) for tp, o in self.committed.items() if o)
        return dict(self.committed)

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return {tp: 2 for tp in tps}

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        # No ``seek``: faust's runs aiokafka's seek outside the consumer's thread.
        self.seeks.extend((tp.partition, offset) for tp, offset in partitions.items())


async def test_settled_generation_rewinds_events_to_committed_or_earliest(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, _ = worker
    fake = FakeConsumer(KAFKA.topics.events)
    w.app.consumer = fake
    w.app.consumer_generation_id = 0
    await w._reseek_after_rebalance()  # nothing assigned yet
    w.app.consumer_generation_id = 3
    await w._reseek_after_rebalance()  # first tick of generation 3: let faust's seek finish
    assert fake.seeks == []
    await w._reseek_after_rebalance()
    assert sorted(fake.seeks) == [(0, 7), (1, 2)]  # the changelog partition is left alone
    # partition 1 was never committed: it may commit from its earliest offset on (streams.seeks)
    assert fake.start_offsets == {TP(KAFKA.topics.events, 1): 2}
    await w._reseek_after_rebalance()  # once per generation
    assert len(fake.seeks) == 2


async def test_settled_generation_leaves_partitions_delivered_from_their_target(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    """A partition the agents were given from its committed (or earliest) offset on in this
    generation skipped nothing: rewinding it would hand them again what they handled."""
    w, _ = worker
    fake = FakeConsumer(KAFKA.topics.events)
    fake.committed[TP(KAFKA.topics.events, 2)] = None
    w.app.consumer = fake
    w.app.consumer_generation_id = 3
    events = KAFKA.topics.events
    w.stall_guard.delivered(TP(events, 0), 7, 3)  # from the committed offset
    w.stall_guard.delivered(TP(events, 0), 8, 3)
    w.stall_guard.delivered(TP(events, 1), 5, 3)  # 2 to 4 were fetched and dropped
    w.stall_guard.delivered(TP(events, 2), 2, 2)  # the earliest, but in the last generation
    await w._reseek_after_rebalance()
    await w._reseek_after_rebalance()
    assert sorted(fake.seeks) == [(1, 2), (2, 2)]
    assert w._reseeked_generation == 3


class RevokingConsumer(FakeConsumer):
    """A rebalance revokes partition 1 between ``committed_offsets`` and the seeks (aiokafka
    raises IllegalStateError for a seek of an unassigned partition)."""

    def __init__(self, events_topic: str, app: Any, revoke_by_generation: bool) -> None:
        super().__init__(events_topic)
        self.app = app
        self.revoke_by_generation = revoke_by_generation

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        if self.revoke_by_generation:
            self.app.consumer_generation_id += 1  # the new generation is assigned meanwhile
        return await super().earliest_offsets(*tps)

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        for tp, offset in partitions.items():  # aiokafka seeks one after another
            if tp.partition == 1:
                raise IllegalStateError(f"No current assignment for partition {tp}")
            self.seeks.append((tp.partition, offset))


@pytest.mark.parametrize("revoke_by_generation", [False, True])
async def test_a_rebalance_during_the_reseek_leaves_the_worker_running(
    worker: tuple[StreamsWorker, Recorder], revoke_by_generation: bool
) -> None:
    """Found by `mailtap soak` (seed 4): the second worker joined while the first re-seeked,
    and the seek of a revoked partition crashed the first one."""
    w, _ = worker
    fake = RevokingConsumer(KAFKA.topics.events, w.app, revoke_by_generation)
    w.app.consumer = fake
    w.app.consumer_generation_id = 3
    await w._reseek_after_rebalance()  # settling tick
    await w._reseek_after_rebalance()  # must not raise
    assert w._reseeked_generation != 3  # not done: the next generation re-seeks itself
    assert fake.start_offsets == {}  # so a never-committed partition does not commit yet
    if revoke_by_generation:
        assert fake.seeks == []  # nothing seeked for a generation that is gone
        return
    w.app.consumer = FakeConsumer(KAFKA.topics.events)  # the next generation, settled
    w.app.consumer_generation_id = 4
    await w._reseek_after_rebalance()
    await w._reseek_after_rebalance()
    assert sorted(w.app.consumer.seeks) == [(0, 7), (1, 2)]


async def test_state_of_a_revoked_partition_leaves_the_worker_at_the_next_recovery(
    worker: tuple[StreamsWorker, Recorder],
) -> None:
    w, sent = worker
    kept = mail_record(message_id="kept@example.com")
    moved = mail_record(message_id="moved@example.com")
    await w.on_record(*encoded(kept), partition=1)
    await w.on_record(*encoded(moved), partition=2)
    changelog = "mailtap-streams-state-changelog"
    assert {p for t, p in sent.partitions() if t == changelog} == {1, 2}
    # faust's memory store after a rebalance that left this worker partition 1 only.
    await w.tables.state.data.on_recovery_completed({TP(changelog, 1)}, set())
    assert "ticket_intake/thread/kept@example.com" in w.tables.state
    assert "ticket_intake/thread/moved@example.com" not in w.tables.state


class _RegistryDownFor:
    """The worker's serde, with the registry down for its first ``outages`` decodes."""

    def __init__(self, serde: Any, outages: int) -> None:
        self.serde, self.outages, self.calls = serde, outages, 0

    def decode(self, value: bytes, topic: str = "") -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.outages:
            raise RegistryUnavailable("the schema registry did not answer: connection refused")
        return cast(dict[str, Any], self.serde.decode(value, topic))


async def test_a_registry_outage_waits_and_the_workflow_runs_once_it_answers(
    worker: tuple[StreamsWorker, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by `mailtap soak`: an outage is not bad data. Reported as undecodable, the mail's
    workflow would never run; out of the agent, the exception would crash it."""
    w, sent = worker
    monkeypatch.setattr(streams_app, "REGISTRY_RETRY_FIRST_S", 0.01)
    w.mail_serde = cast(Any, _RegistryDownFor(w.mail_serde, outages=3))
    key, value = encoded(mail_record(message_id="req@example.com"))
    outcome = await w.on_record(key, value)
    assert [e["status"] for e in outcome.events] == ["TICKET_OPENED"]
    assert [e["status"] for e in sent.events()] == ["TICKET_OPENED"]
    assert len(sent.commands()) == 1
    assert w.mail_serde.calls == 4  # type: ignore[attr-defined]


async def test_a_registry_outage_holds_the_forward_until_it_answers(
    worker: tuple[StreamsWorker, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    w, sent = worker
    monkeypatch.setattr(streams_app, "REGISTRY_RETRY_FIRST_S", 0.01)
    w.mail_serde = cast(Any, _RegistryDownFor(w.mail_serde, outages=2))
    opening = mail_record(message_id="<Root@Example.com>")
    assert await w.forward(*encoded(opening)) == b"root@example.com"
    assert [(t, k) for t, k, _ in sent.log] == [("conversations", b"root@example.com")]


def test_outputs_of_one_record_are_one_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    """One line per record naming every output (issue 29: one per output cost ~1.5 %), at
    DEBUG (a line per mail at INFO cost ~11 %); a tick's outputs at INFO."""
    from streams.pipeline import Outcome

    command: Any = {
        "command_id": "0123456789abcdef",
        "workflow": "ticket_intake",
        "step": "acknowledge",
        "event_key": "demo/mid:a@b",
    }
    event: Any = {
        "workflow": "ticket_intake",
        "status": "TICKET_OPENED",
        "instance_id": "T-1",
        "attributes": {},
    }
    with caplog.at_level("INFO", "streams.app"):
        streams_app._log_outputs(Outcome(commands=[command], events=[event]))
        streams_app._log_outputs(Outcome(events=[event]), logging.INFO)
    assert caplog.messages == ["workflow event ticket_intake TICKET_OPENED T-1"]
    caplog.clear()
    with caplog.at_level("DEBUG", "streams.app"):
        streams_app._log_outputs(Outcome(commands=[command], events=[event]))
        streams_app._log_outputs(Outcome())
    assert caplog.messages == [
        "command 0123456789ab ticket_intake/acknowledge for demo/mid:a@b; "
        "workflow event ticket_intake TICKET_OPENED T-1"
    ]
    assert caplog.records[0].levelno == logging.DEBUG


def test_the_producer_lingers_to_batch_the_pipelined_sends(worker: Any) -> None:
    """faust's default linger (0) sends a produce request as soon as anything is queued."""
    w, _ = worker
    assert w.app.conf.producer_linger == streams_app.PRODUCER_LINGER_S > 0
    assert w.app.producer.linger_ms == round(streams_app.PRODUCER_LINGER_S * 1000)
