"""The audit trail: one record per console action on the compacted ``mailtap.audit`` topic
(``kafka.topics.audit``).

An action is written *before* it is done (``outcome: "started"``) and again with its outcome
under the same key (the action id), so compaction keeps one record per action and a crash in
between still leaves who tried what. If Kafka does not acknowledge the first record, the
action is refused: nothing is changed that the trail does not show. Value, JSON::

    {"id": "20261205T131500Z-4f1c…", "at": "2026-12-05T13:15:00+00:00", "who": "alice",
     "role": "operator", "action": "dlq.replay", "target": "0:42", "params": {},
     "outcome": "done"}
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from typing import Any

from confluent_kafka import Producer

from connectors.core.config import KafkaSettings
from connectors.core.kafka.clients import producer_config
from mailtap.commands.errors import NotAcknowledged
from mailtap.console.tokens import Principal

#: Kafka must confirm an audit record within this long, or the action is refused.
ACK_TIMEOUT_S = 15.0


class AuditTrail:
    """Writes audit records; one producer for the process (the calls come from worker threads)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._topic = kafka.topics.audit
        self._producer = Producer({**producer_config(kafka), "linger.ms": 0})
        self._lock = threading.Lock()

    def started(
        self, who: Principal, action: str, target: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        """Record the intent; :class:`NotAcknowledged` means: do not act."""
        now = dt.datetime.now(dt.UTC)
        entry = {
            "id": f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:12]}",
            "at": now.isoformat(timespec="seconds"),
            "who": who.name,
            "role": who.role,
            "action": action,
            "target": target,
            "params": params,
            "outcome": "started",
        }
        self._write(entry)
        return entry

    def finished(self, entry: dict[str, Any], outcome: str) -> None:
        """The outcome (``done`` or the error sentence) under the same key."""
        self._write({**entry, "outcome": outcome})

    def _write(self, entry: dict[str, Any]) -> None:
        failures: list[object] = []
        with self._lock:
            self._producer.produce(
                self._topic,
                key=entry["id"].encode(),
                value=json.dumps(entry).encode(),
                on_delivery=lambda err, _msg: failures.append(err) if err else None,
            )
            if self._producer.flush(ACK_TIMEOUT_S) or failures:
                raise NotAcknowledged(
                    f"the audit record was not acknowledged by {self._topic}; nothing was done"
                )
