"""The suppression list waits for an unreachable schema registry instead of skipping records:
a skipped record is a forgotten suppression, and the sink would mail a hard-bounced address.
Found by `mailtap soak` (a sink started during a registry-down fault logged every record of
mail.suppressions as undecodable and went on without them)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from connectors.core.config import KafkaSettings
from connectors.core.errors import DataError, RegistryUnavailable
from connectors.smtp import suppression
from connectors.smtp.suppression import SuppressionTable

ENTRY = {"address": "gone@bounce.example", "suppressed": True}


class Record:
    def __init__(self, key: bytes, value: bytes) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "mail.events"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


class FlakySerde:
    """Unavailable for the first ``outages`` calls, then decodes; ``bad`` values are bad data."""

    def __init__(self, outages: int) -> None:
        self.outages = outages
        self.calls = 0

    def decode(self, value: bytes, topic: str = "") -> dict[str, Any]:
        self.calls += 1
        if value == b"bad":
            raise DataError("not an Avro record")
        if self.calls <= self.outages:
            raise RegistryUnavailable("the schema registry did not answer: connection refused")
        return dict(ENTRY)


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> SuppressionTable:
    monkeypatch.setattr(suppression, "REGISTRY_RETRY_S", 0.01)
    return SuppressionTable(KafkaSettings(bootstrap_servers="127.0.0.1:9"), "mail.suppressions")


def test_a_record_read_while_the_registry_is_down_is_applied_once_it_is_back(
    table: SuppressionTable,
) -> None:
    serde = FlakySerde(outages=3)
    table._serde = serde  # type: ignore[assignment]
    table._take([Record(b"gone@bounce.example", b"\x00\x00\x00\x00\x07\x02")])  # type: ignore[list-item]
    assert serde.calls == 4
    assert table.suppressed("gone@bounce.example") is not None
    assert table.applied == 1


def test_bad_data_is_still_skipped(table: SuppressionTable) -> None:
    table._serde = FlakySerde(outages=0)  # type: ignore[assignment]
    table._take([Record(b"x@y.example", b"bad"), Record(b"gone@bounce.example", b"ok")])  # type: ignore[list-item]
    assert table.get("x@y.example") is None
    assert table.suppressed("gone@bounce.example") is not None


def test_a_stop_ends_the_wait_for_the_registry(table: SuppressionTable) -> None:
    table._serde = FlakySerde(outages=10**9)  # type: ignore[assignment]
    done = threading.Event()

    def take() -> None:
        table._take([Record(b"gone@bounce.example", b"ok")])  # type: ignore[list-item]
        done.set()

    worker = threading.Thread(target=take, daemon=True)
    worker.start()
    assert not done.wait(0.2)  # waiting, not skipping
    table._stop.set()
    assert done.wait(5)
    assert table.get("gone@bounce.example") is None


def test_the_bounce_reader_does_not_skip_a_dsn_while_the_registry_is_down() -> None:
    """Raised before the batch's transaction: its offsets stay uncommitted and the DSN is read
    again after the restart, instead of being skipped as an undecodable MailEvent."""
    from connectors.smtp.bounce_reader import BounceReader

    reader = BounceReader.__new__(BounceReader)  # no Kafka clients: only the decoding step
    reader.events_serde = FlakySerde(outages=1)  # type: ignore[assignment]
    reader.accounts = {"soak-bounces"}
    record = Record(b"soak-bounces/mid:dsn@relay.example", b"\x00\x00\x00\x00\x01\x02")
    with pytest.raises(RegistryUnavailable):
        reader._bounces_in(record, {})  # type: ignore[arg-type]
    bad = Record(b"soak-bounces/mid:junk@relay.example", b"bad")
    assert reader._bounces_in(bad, {}) == []  # type: ignore[arg-type]  # bad data: skipped
