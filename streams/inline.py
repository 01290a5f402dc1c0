"""A topic handled in faust's fetch loop itself, without an agent.

faust hands every record it fetched to the agents through one loop
(``Consumer._drain_messages``): it puts the record on the queue of the agent that reads its
topic and waits when that queue is full. ``mail.events`` used to go to a re-keying agent like
that. With a backlog its queue was full most of the time, so the loop waited on a
``mail.events`` record while records of the conversation topic fetched in the same batch waited
behind it, and the conversation agent sat idle: with 40,000 events waiting, one worker re-keyed
for about 11 s before it answered its first mail (``mailtap bench streams``, issue 29). Every
record also went through the agent machinery (an event, a queue, a task switch) for what is a
header lookup and a send that is not awaited.

:class:`InlineConductor` is faust's conductor with a handler of ours for a topic's partitions
in place of the agents' queues: the fetch loop calls it with the record and goes on with the
next when it returns. The handler does what faust's stream does before an agent sees a record
(:func:`admit`: drop a record of an old consumer generation or fetched while flow control is
off, track the rest for acknowledgement) and acknowledges the record itself; the commit barrier
(:mod:`streams.acks`) keeps the commit behind the acknowledgement of what it sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from faust.transport.conductor import Conductor
from faust.types import TP, AppT, Message, TopicT

#: A handler of one record of an inline topic.
InlineHandler = Callable[[Message], Awaitable[None]]


class InlineConductor(Conductor):
    """faust's conductor, with some topics handled in the fetch loop (:meth:`handle_inline`)."""

    def __init__(self, app: AppT, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._inline: dict[str, InlineHandler] = {}
        self._inline_topics: list[TopicT] = []

    def handle_inline(self, topic: TopicT, handler: InlineHandler) -> None:
        """Subscribe to ``topic`` at start and hand its records to ``handler`` (before start)."""
        for name in topic.topics:
            self._inline[name] = handler
        self._inline_topics.append(topic)

    async def on_start(self) -> None:
        await super().on_start()
        # Before the subscriber task, which subscribes to what was added by then (an agent
        # adds its topic when it starts iterating it).
        for topic in self._inline_topics:
            self.add(topic)

    def _build_handler(self, tp: TP, channels: Any) -> Any:
        handler = self._inline.get(tp.topic)
        return super()._build_handler(tp, channels) if handler is None else handler


def admit(app: AppT, message: Message) -> bool:
    """What faust's stream checks before an agent is given ``message``: False for a record
    fetched before the current consumer generation or while flow control is off (a rebalance:
    not acknowledged, read again); otherwise the record is tracked, so that it holds the
    partition's commit back until :meth:`~faust.types.ConsumerT.ack`."""
    if not app.flow_control.is_active() or message.generation_id != app.consumer_generation_id:
        return False
    if not message.tracked:
        message.tracked = True
        app.consumer.track_message(message)
    return True
