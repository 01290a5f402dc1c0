"""A faust table seen from one partition (streams.partitions): writes and walks stay on it."""

from __future__ import annotations

import random
from typing import Any

from streams.partitions import PartitionedTable, PrefixIndex


class _Store(dict[str, Any]):
    """The memory store's shape: a dict with faust's key -> partition map."""

    def __init__(self) -> None:
        super().__init__()
        self._key_partition: dict[str, int] = {}

    @property
    def data(self) -> dict[str, Any]:
        return self  # the memory store's dict of values


class _Table:
    prefix_index: PrefixIndex | None = None

    def __init__(self) -> None:
        self.data: _Store = _Store()
        self.changelog: list[tuple[int, str, Any]] = []

    def send_changelog(self, partition: int, key: str, value: Any, **_: Any) -> None:
        self.changelog.append((partition, key, value))


def test_items_are_this_partitions_entries_in_one_walk_as_iteration_sees_them() -> None:
    table = _Table()
    PartitionedTable(table, 0)["approval/request/a"] = {"status": "PENDING"}
    PartitionedTable(table, 1)["approval/request/b"] = {"status": "PENDING"}
    table.data["restored/without/owner"] = 7  # recovery fills the store; no owner recorded
    one = PartitionedTable(table, 1)
    assert one.items() == [
        ("approval/request/b", {"status": "PENDING"}),
        ("restored/without/owner", 7),
    ]
    assert [k for k, _ in one.items()] == list(one) and len(one) == 2
    zero = PartitionedTable(table, 0)
    assert (
        [k for k, _ in zero.items()]
        == list(zero)
        == ["approval/request/a", "restored/without/owner"]
    )
    assert [p for p, _, _ in table.changelog] == [0, 1]


class _CountingStore(_Store):
    walks = 0

    def keys(self) -> Any:
        self.walks += 1
        return super().keys()

    def items(self) -> Any:
        self.walks += 1
        return super().items()


def _indexed() -> tuple[_Table, PrefixIndex]:
    table = _Table()
    table.data = _CountingStore()
    index = table.prefix_index = PrefixIndex(table.data)
    return table, index


def _naive(table: _Table, partition: int, prefix: str) -> list[tuple[str, Any]]:
    owners = table.data._key_partition
    return sorted(
        (k, v)
        for k, v in table.data.items()
        if k.startswith(prefix) and owners.get(k, partition) == partition
    )


def test_a_scan_reads_the_prefix_index_not_the_whole_store() -> None:
    """The tick's scans (issue 29: every tick walked every key of the state)."""
    table, _ = _indexed()
    for n in range(50):
        PartitionedTable(table, n % 3)[f"ticket_intake/ticket/T-{n}"] = {"n": n}
    PartitionedTable(table, 1)["approval/request/a"] = {"status": "PENDING"}
    PartitionedTable(table, 2)["approval/request/b"] = {"status": "PENDING"}
    PartitionedTable(table, 1)["approval/thread/<m/with/slashes@x>"] = "a"
    one = PartitionedTable(table, 1)
    assert one.scan("approval/request/") == [("approval/request/a", {"status": "PENDING"})]
    walks = table.data.walks
    assert sorted(one.scan("approval/")) == _naive(table, 1, "approval/")
    assert one.scan("approval/request/b") == []
    assert PartitionedTable(table, 2).scan("approval/req") == [
        ("approval/request/b", {"status": "PENDING"})
    ]
    del one["approval/request/a"]
    assert one.scan("approval/request/") == []
    assert table.data.walks == walks + 1  # _naive walked once; the scans walked nothing


def test_the_index_follows_writes_recovery_and_keys_without_a_partition() -> None:
    """Whatever writes the store, a scan answers what a walk of it would."""
    rng = random.Random(29)
    table, index = _indexed()
    prefixes = ["", "a", "a/", "a/x/", "a/x/1", "b/y/", "c", "c/"]
    for step in range(3_000):
        key = rng.choice(["a/x/", "a/y/", "b/y/", "c/", "c", "a/x/1/"]) + str(rng.randrange(40))
        partition = rng.randrange(3)
        action = rng.random()
        view = PartitionedTable(table, partition)
        if action < 0.55:
            view[key] = step
        elif action < 0.8:
            if key in view:
                del view[key]
        elif action < 0.9:  # recovery: faust writes the store and its map, then says so
            table.data[key] = step
            table.data._key_partition[key] = partition
            index.invalidate()
        elif action < 0.95:  # a key restored without a recorded partition, unannounced
            if key not in table.data:
                table.data[key] = step
        else:  # a rebalance dropped partition 2's keys
            for k in [k for k, p in table.data._key_partition.items() if p == 2]:
                del table.data[k]
                del table.data._key_partition[k]
            index.invalidate()
        prefix = rng.choice(prefixes)
        partition = rng.randrange(3)
        assert sorted(PartitionedTable(table, partition).scan(prefix)) == _naive(
            table, partition, prefix
        ), (step, prefix, partition)


def test_a_table_without_an_index_scans_by_walking() -> None:
    table = _Table()
    PartitionedTable(table, 0)["approval/request/a"] = 1
    PartitionedTable(table, 1)["approval/request/b"] = 2
    assert PartitionedTable(table, 1).scan("approval/") == [("approval/request/b", 2)]
