"""The sink's state: which DONE states are past the retention, the partition-count check, and the
settings that go with them."""

from __future__ import annotations

import pytest

from connectors.core.errors import ConfigError
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.state import CommandState, StateStore, check_copartitioned

DAY_MS = 86_400_000


def test_only_done_states_older_than_the_retention_expire() -> None:
    store = StateStore()
    now = 100 * DAY_MS
    store.put("old-done", 0, CommandState("DONE", 1, updated_ms=now - 31 * DAY_MS))
    store.put("recent-done", 1, CommandState("DONE", 1, updated_ms=now - 29 * DAY_MS))
    # Not final: a retry record or a send in flight still needs them, whatever their age.
    store.put("old-scheduled", 2, CommandState("SCHEDULED", 1, updated_ms=now - 40 * DAY_MS))
    store.put("old-intent", 0, CommandState("INTENT", 1, updated_ms=now - 40 * DAY_MS))
    assert store.expired(now, 30 * DAY_MS) == [("old-done", 0)]


def test_revoked_partitions_are_forgotten() -> None:
    store = StateStore()
    store.put("a", 0, CommandState("DONE", 1))
    store.put("b", 1, CommandState("DONE", 1))
    store.drop_partitions({1})
    assert (store.get("a"), store.get("b"), len(store)) == (CommandState("DONE", 1), None, 1)


def test_partition_counts_must_match_the_commands_topic() -> None:
    check_copartitioned(
        {"mail.commands": 3, "mail.commands.retry.5m": 3, "state": 3}, "mail.commands"
    )
    with pytest.raises(ConfigError) as caught:
        check_copartitioned(
            {"mail.commands": 3, "mail.commands.retry.5m": 3, "mailtap.sink.state": 6},
            "mail.commands",
        )
    text = str(caught.value)
    assert (
        "mailtap.sink.state has 6" in text
        and "need as many partitions as mail.commands (3)" in text
    )


def test_retention_must_outlast_the_lifetime() -> None:
    with pytest.raises(ValueError, match="raise state_retention"):
        SmtpSinkSettings(
            host="relay", from_address="a@example.com", max_lifetime="2d", state_retention="1d"
        )
    with pytest.raises(ValueError, match="not a duration"):
        SmtpSinkSettings(host="relay", from_address="a@example.com", state_retention="a month")
    assert SmtpSinkSettings(host="r", from_address="a@example.com").state_retention_seconds == (
        30 * 86_400
    )


def test_a_state_record_keeps_its_bytes_and_reads_back() -> None:
    # The state topic holds these bytes across versions: their form is the wire format.
    intent = CommandState("INTENT", 1, "<c-1@example.com>", ("a@example.org", "b@example.org"), 7)
    assert intent.to_bytes() == (
        b'{"phase":"INTENT","attempt":1,"message_id":"<c-1@example.com>",'
        b'"pending":["a@example.org","b@example.org"],"updated_ms":7}'
    )
    done = CommandState("DONE", 2)
    assert done.to_bytes() == (
        b'{"phase":"DONE","attempt":2,"message_id":null,"pending":null,"updated_ms":0}'
    )
    assert CommandState.from_bytes(intent.to_bytes()) == intent
    assert CommandState.from_bytes(done.to_bytes()) == done
