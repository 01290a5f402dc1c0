"""A faust table seen from one partition (streams.partitions): writes and walks stay on it."""

from __future__ import annotations

from typing import Any

from streams.partitions import PartitionedTable


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
