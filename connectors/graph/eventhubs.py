"""Change notifications through Azure Event Hubs (``notifications.mode: eventhubs``): Graph
writes each notification collection as one event to the hub
(learn.microsoft.com/graph/change-notifications-delivery-event-hubs), and Event Hubs speaks the
Kafka protocol (a namespace is a Kafka cluster, a hub a topic), so the source reads the hub
with the Kafka client it already has (confluent-kafka).

Every instance reads every notification (its own consumer group, from the newest event on, no
commits): an instance ignores the subscriptions it does not run. Nothing here is the source of
truth: what is missed (a restart, a lag) the periodic sweep finds.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from connectors.core.kafka.clients import consumer_config
from connectors.graph.config import NotificationSettings
from connectors.graph.inbox import NotificationInbox

log = logging.getLogger(__name__)

__all__ = ["EventHubReader"]

#: How long one poll blocks: a stop is seen within this time.
POLL_S = 0.5
#: Asking a partition's end when it is assigned.
WATERMARK_TIMEOUT_S = 10.0


class EventHubReader:
    """A thread that hands every event of the hub to the inbox."""

    def __init__(self, settings: NotificationSettings, inbox: NotificationInbox) -> None:
        assert settings.event_hubs is not None and settings.event_hub_name is not None
        self.inbox = inbox
        self._topic = settings.event_hub_name
        self._consumer = Consumer(
            consumer_config(
                settings.event_hubs,
                group_id=f"mailtap-graph-notifications-{uuid.uuid4().hex[:12]}",
                auto_offset_reset="latest",
                enable_auto_commit=False,
            )
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="graph-eventhubs", daemon=True)
        #: Set once the consumer has its partitions, each at its end as of then (every event
        #: from then on is read).
        self.assigned = threading.Event()

    def start(self) -> None:
        self._consumer.subscribe([self._topic], on_assign=self._on_assign)
        self._thread.start()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Start each partition at its end as of now, not at "latest": librdkafka resolves
        "latest" at the first fetch, so an event written between the assignment and that fetch
        was skipped (the Event Hubs test failed now and then on a loaded machine)."""
        starts = []
        for tp in partitions:
            try:
                _, end = consumer.get_watermark_offsets(tp, timeout=WATERMARK_TIMEOUT_S)
            except KafkaException as exc:  # the sweep finds what a late start misses
                log.warning(
                    "graph event hub %s: end of partition %d unknown (%s)",
                    tp.topic,
                    tp.partition,
                    exc,
                )
                end = OFFSET_END
            starts.append(TopicPartition(tp.topic, tp.partition, end))
        consumer.assign(starts)
        self.assigned.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(POLL_S)
            if message is None:
                continue
            if message.error():
                log.warning("graph event hub %s: %s", self._topic, message.error())
                continue
            try:
                body = json.loads(message.value() or b"{}")
            except ValueError:
                log.warning("graph event hub %s: an event that is not JSON, ignored", self._topic)
                continue
            self.inbox.collection(body)
