"""A faust table seen from one partition (streams.partitions): writes and walks stay on it."""

from __future__ import annotations

from typing import Any

from streams.partitions import PartitionedTable, split_by_partition


class _Store(dict[str, Any]):
    """The memory store's shape: a dict with faust's key -> partition map."""

    def __init__(self) -> None:
        super().__init__()
        self._key_partition: dict[str, int] = {}


class _Table:
    def __init__(self) -> None:
        self.data = _Store()
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

    def items(self) -> Any:
        self.walks += 1
        return super().items()


def test_split_by_partition_walks_the_store_once_and_each_view_sees_what_its_walk_saw() -> None:
    """The timer's one walk per tick (issue 29: it walked the store once per owned partition)."""
    table = _Table()
    table.data = _CountingStore()
    PartitionedTable(table, 0)["approval/request/a"] = {"status": "PENDING"}
    PartitionedTable(table, 1)["approval/request/b"] = {"status": "PENDING"}
    PartitionedTable(table, 2)["approval/request/c"] = {"status": "PENDING"}
    table.data["restored/without/owner"] = 7
    entries = split_by_partition(table, [0, 1])
    assert table.data.walks == 1
    for partition in (0, 1):
        view = PartitionedTable(table, partition, entries[partition])
        assert view.items() == PartitionedTable(table, partition).items()
    assert table.data.walks == 3  # the two views without entries walked again


def test_a_view_with_entries_sees_its_own_writes_and_keys_another_partition_took() -> None:
    table = _Table()
    PartitionedTable(table, 0)["a"] = 1
    table.data["restored/without/owner"] = 7
    entries = split_by_partition(table, [0, 1])
    zero = PartitionedTable(table, 0, entries[0])
    zero["a"] = 2
    zero["new"] = 3
    zero["restored/without/owner"] = 8  # now partition 0's: partition 1 no longer sees it
    del zero["a"]
    assert zero.items() == PartitionedTable(table, 0).items()
    assert sorted(zero.items()) == [("new", 3), ("restored/without/owner", 8)]
    one = PartitionedTable(table, 1, entries[1])
    assert one.items() == PartitionedTable(table, 1).items() == []
