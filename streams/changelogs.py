"""The changelog topics of the worker's tables, created (and waited for) before faust starts.

Why not let faust create them: faust declares a table's changelog topic when the table starts,
then refreshes its producer's metadata once (the fix of faust-streaming #499). On a fresh
``app_id`` the topics are new, and a broker whose metadata has not caught up with the creation
yet (a loaded machine, several brokers) answers without them: the consumer logs ``Topic
<app_id>-state-changelog not found in cluster metadata``, the assignor leaves the changelog
partitions out, and the first table write fails in the producer's ``key_partition`` with
``TypeError: 'NoneType' object is not iterable``. The producer never asks for that topic again,
so the agent is restarted by faust every few seconds and crashes again, until the process is
restarted by hand. Created here first, and waited for until the broker lists every partition with
a leader, the topics are in the producer's metadata from its first request on, and faust's own
declaration finds them in place.

The internal topic ``mail.events`` is re-keyed onto (``<app_id>-mail-events-by-conversation``,
:mod:`connectors.core.mail.conversation`) is created here too, for the same reason and with the same
partition count: faust's assignor gives partition N of it and of every changelog to the same
worker only when the counts are equal, which keeps a conversation and its state together.

The topics get what faust would give them: a table's partition count (that of ``mail.events``,
which its partitions mirror) and a compacted cleanup policy (plus ``delete`` and the retention
for a windowed table). An existing changelog with another partition count is refused at start:
its records would be restored into the wrong partitions of the table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import faust

from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import admin_client
from connectors.core.kafka.retry import retry_retriable
from connectors.core.kafka.topics import COMPACTED, DELETED, TopicSpec, ensure_topic_specs

log = logging.getLogger(__name__)

#: Creating three topics takes well under a second on a healthy broker; a minute covers a broker
#: that is still starting up or busy, and then start-up fails with a sentence instead of hanging.
TOPICS_READY_TIMEOUT_S = 60.0
#: Between two metadata requests while waiting for the new topics' leaders.
POLL_INTERVAL_S = 0.2


def changelog_specs(app: faust.App) -> list[TopicSpec]:
    """Name, partitions and configs of every table's changelog, as faust would declare them."""
    specs = []
    for table in app.tables.values():
        topic: Any = table.changelog_topic
        policy = {"compact"} if topic.compacting else set()
        if topic.deleting:
            policy.add("delete")
        config: dict[str, str] = dict(COMPACTED) if policy == {"compact"} else {}
        if policy:
            config["cleanup.policy"] = ",".join(sorted(policy))
        if topic.retention:
            config["retention.ms"] = str(int(topic.retention * 1000))
        config.update({k: str(v) for k, v in (topic.config or {}).items()})
        partitions = topic.partitions or app.conf.topic_partitions
        specs.append(TopicSpec(topic.get_topic_name(), partitions, config))
    return specs


def repartition_spec(name: str, partitions: int) -> TopicSpec:
    """The conversation topic: a plain delete topic (its records are consumed within seconds;
    the broker's default retention covers a worker that is down for a while)."""
    return TopicSpec(name, partitions, dict(DELETED))


def ensure_changelog_topics(
    app: faust.App,
    kafka: KafkaSettings,
    timeout: float = TOPICS_READY_TIMEOUT_S,
    also: Sequence[TopicSpec] = (),
) -> list[TopicSpec]:
    """Create the missing changelog topics (and ``also``), align their policy, wait until all
    are usable."""
    specs = [*changelog_specs(app), *also]
    states = ensure_topic_specs(kafka, specs, timeout)
    admin = admin_client(kafka)
    deadline = time.monotonic() + timeout
    waiting = {s.name: s for s in specs}
    while waiting:
        topics = retry_retriable(
            lambda: admin.list_topics(timeout=10).topics, deadline, "metadata of changelog topics"
        )
        for name, spec in list(waiting.items()):
            found = topics.get(name)
            if found is None or found.error is not None or not found.partitions:
                continue
            if len(found.partitions) != spec.partitions:
                raise ConfigError(
                    f"topic {name} has {len(found.partitions)} partitions, but the worker "
                    f"needs {spec.partitions} (those of {kafka.topics.events}): state would be "
                    f"restored into the wrong partitions. Use a new streams.app_id, or delete "
                    f"{name} (losing what it holds) and start again"
                )
            if all(p.leader >= 0 for p in found.partitions.values()):
                del waiting[name]
        if not waiting:
            break
        if time.monotonic() > deadline:
            raise ConfigError(
                f"changelog topics {sorted(waiting)} are not usable on "
                f"{kafka.bootstrap_servers} after {timeout:g}s (no leader yet); check the brokers"
            )
        time.sleep(POLL_INTERVAL_S)
    for name, state in sorted(states.items()):
        log.info("changelog topic %s %s", name, state)
    return specs
