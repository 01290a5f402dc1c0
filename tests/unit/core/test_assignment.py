"""The unit -> partition mapping, the owned-set computation and the mailboxes catalog (no Kafka)."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest

from connectors.core.metrics import SourceMetrics
from connectors.core.source.ownership.catalog import (
    ADDED,
    REMOVED,
    MailboxCatalog,
    decode,
    unit_key,
)
from connectors.core.source.ownership.group import (
    Assignment,
    GroupMembership,
    GroupSettings,
    WorkUnit,
    by_account,
    by_folder,
    owned_units,
    partition_of,
)

UNITS = [
    WorkUnit("imap", f"acct{a}", folder) for a in range(40) for folder in ("INBOX", "Sent", "X")
]


def test_partition_is_pinned_across_processes_and_releases() -> None:
    # Every instance (and every release) must place a unit on the same partition: a value that
    # moved between versions would run a mailbox twice during a rolling upgrade (fenced) or not.
    assert partition_of("support", 32) == 29
    assert [partition_of(f"a{i}", 7) for i in range(5)] == [
        partition_of(f"a{i}", 7) for i in range(5)
    ]
    assert all(0 <= partition_of(f"k{i}", 5) < 5 for i in range(200))


def test_partitions_are_spread() -> None:
    used = {partition_of(f"account-{i}", 32) for i in range(500)}
    assert used == set(range(32))


def test_every_unit_has_exactly_one_owner_whatever_the_split() -> None:
    count = 12
    members = [set(range(0, 5)), set(range(5, 9)), set(range(9, 12))]
    owned = [owned_units(UNITS, parts, count, by_account) for parts in members]
    for a, b in itertools.combinations(owned, 2):
        assert not a & b
    assert frozenset().union(*owned) == frozenset(UNITS)


def test_by_account_keeps_an_accounts_folders_together_and_by_folder_does_not() -> None:
    for parts in ({0, 1, 2}, {3, 4}, {5}):
        for unit in owned_units(UNITS, parts, 6, by_account):
            siblings = {u for u in UNITS if u.account == unit.account}
            assert siblings <= owned_units(UNITS, parts, 6, by_account)
    split = [
        a
        for a in {u.account for u in UNITS}
        if len({partition_of(by_folder(u), 6) for u in UNITS if u.account == a}) > 1
    ]
    assert split  # EWS folders are placed each on its own


class _Membership:
    partitions = 8


def _assignment(wanted: set[WorkUnit]) -> tuple[Assignment, list[frozenset[WorkUnit]]]:
    applied: list[frozenset[WorkUnit]] = []
    membership = cast(GroupMembership, _Membership())
    assignment = Assignment(lambda: frozenset(wanted), by_account, applied.append, membership)
    return assignment, applied


def test_assignment_applies_assigned_then_revoked_partitions() -> None:
    wanted = set(UNITS)
    assignment, applied = _assignment(wanted)
    assignment.partitions_changed(frozenset({1, 2}))
    first = owned_units(UNITS, {1, 2}, 8, by_account)
    assert applied == [first] and assignment.owned == first
    assignment.partitions_changed(frozenset({1}))
    assert applied[-1] == owned_units(UNITS, {1}, 8, by_account)
    assignment.partitions_changed(frozenset({1}))  # nothing changed: apply not called again
    assert len(applied) == 2


def test_assignment_follows_the_wanted_units_and_stops_everything_on_close() -> None:
    wanted = {WorkUnit("imap", "a", "INBOX")}
    assignment, applied = _assignment(wanted)
    assignment.partitions_changed(frozenset(range(8)))
    new = WorkUnit("imap", "a", "Archive")
    wanted.add(new)
    assignment.refresh()
    assert new in applied[-1]
    assignment.close()
    assert applied[-1] == frozenset()
    assignment.partitions_changed(frozenset(range(8)))  # a late rebalance starts nothing
    assert applied[-1] == frozenset()


def test_without_a_group_every_wanted_unit_is_owned() -> None:
    applied: list[frozenset[WorkUnit]] = []
    assignment = Assignment(lambda: frozenset(UNITS), by_account, applied.append, None)
    assignment.refresh()
    assert applied == [frozenset(UNITS)]


def test_catalog_adds_removes_and_restores_folders() -> None:
    catalog = MailboxCatalog("imap", {"support": ("INBOX",), "sales": ("INBOX", "Sent")})
    base = catalog.wanted()
    assert WorkUnit("imap", "sales", "Sent") in base and len(base) == 3
    archive = WorkUnit("imap", "support", "Archive")
    assert catalog.record(archive, ADDED)
    assert archive in catalog.wanted()
    assert not catalog.record(archive, ADDED)  # again: no change
    sent = WorkUnit("imap", "sales", "Sent")
    assert catalog.record(sent, REMOVED)
    assert sent not in catalog.wanted()
    assert catalog.record(sent, None)  # forgotten: the configuration's folders again
    assert sent in catalog.wanted()


def test_catalog_ignores_unknown_accounts_and_other_sources() -> None:
    catalog = MailboxCatalog("imap", {"support": ("INBOX",)})
    assert not catalog.record(WorkUnit("imap", "stranger", "INBOX"), ADDED)
    assert not catalog.record(WorkUnit("ews", "support", "inbox"), ADDED)
    assert catalog.wanted() == {WorkUnit("imap", "support", "INBOX")}


def test_mailbox_records_round_trip_and_foreign_ones_are_skipped() -> None:
    unit = WorkUnit("ews", "sales", "inbox")
    assert decode(unit_key(unit), b'{"state":"removed"}') == (unit, REMOVED)
    assert decode(unit_key(unit), None) == (unit, None)
    assert decode(b"not json", b"{}") is None
    assert decode(unit_key(unit), b'{"state":"paused"}') is None


def test_health_reports_the_owned_mailboxes_and_forgets_moved_ones() -> None:
    metrics = SourceMetrics()
    metrics.watch("imap", "a", "INBOX")
    metrics.watch("imap", "b", "INBOX")
    metrics.set_state("imap", "b", "INBOX", "FENCED")
    metrics.unwatch("imap", "b", "INBOX")
    ok, detail = metrics.health(600)
    assert detail["mailboxes"] == ["imap/a/INBOX"]
    assert ok  # a fenced mailbox that moved away is no longer this instance's trouble
    text = _metrics_text(metrics)
    assert 'mailtap_source_mailbox_owned{account="a",folder="INBOX",source="imap"} 1.0' in text
    assert 'account="b"' not in text


def _metrics_text(metrics: SourceMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("session_timeout_seconds", 2, "greater than or equal to 6"),
        ("work_partitions", 0, "greater than or equal to 1"),
        ("id", "", "at least 1 character"),
    ],
)
def test_group_settings_refuse_bad_values(field: str, value: Any, fragment: str) -> None:
    raw: dict[str, Any] = {"id": "g", field: value}
    with pytest.raises(ValueError, match=fragment):
        GroupSettings(**raw)


def test_work_topic_defaults_per_source() -> None:
    assert GroupSettings(id="g").topic("imap") == "mailtap.imap-work"
    assert GroupSettings(id="g", work_topic="w").topic("ews") == "w"


def test_a_failed_apply_is_retried_and_does_not_escape_into_the_rebalance() -> None:
    calls: list[frozenset[WorkUnit]] = []

    def apply(owned: frozenset[WorkUnit]) -> None:
        calls.append(owned)
        if len(calls) == 1:
            raise TimeoutError("the key index could not be read")

    membership = cast(GroupMembership, _Membership())
    assignment = Assignment(lambda: frozenset(UNITS), by_account, apply, membership)
    assignment.partitions_changed(frozenset({0, 1}))  # raises inside: logged, not propagated
    assert assignment.owned == frozenset()
    assignment.retry()
    assert assignment.owned == owned_units(UNITS, {0, 1}, 8, by_account)
    assignment.retry()  # nothing failed since: not applied again
    assert len(calls) == 2
