"""A faust table seen from one partition: every write goes to an explicit changelog partition.

Why not faust's own ``table[key] = value``: with ``use_partitioner=False`` it takes the
partition from the current stream event, which a timer does not have ("Cannot modify table key
from outside of stream iteration"); with ``use_partitioner=True`` it hashes the key, which
scatters a conversation's state over partitions owned by other workers. Here a write goes to
the partition the key already lives on, else to the partition of the conversation being
handled, and that choice is recorded in the memory store's key -> partition map, the map faust
itself uses after a rebalance to drop the keys of partitions this worker no longer owns
(``faust/stores/memory.py``, ``on_recovery_completed``; it is filled there only from changelog
recovery, not from live writes, so without this a revoked conversation would stay visible and
its reminders would fire on two workers).

Reads (``get``, ``[]``) see every local key; iteration (``items()``, which ``on_tick`` and the
retention sweep walk) sees only this partition's keys, so each worker runs time-driven steps
only for the partitions it owns, each exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any


class PartitionedTable(MutableMapping[str, Any]):
    """``table`` (a faust Table on the ``memory://`` store) as seen from ``partition``."""

    def __init__(
        self, table: Any, partition: int, entries: list[tuple[str, Any]] | None = None
    ) -> None:
        """``entries``: this partition's entries, from :func:`split_by_partition` of the same
        table, for a caller that walks several partitions at once; ``items()`` returns them
        (with this view's own writes since) instead of walking the store again."""
        self._table = table
        self._entries = entries
        self._store = table.data
        # Private in faust 0.15 (memory store); checked at construction so that a faust upgrade
        # that renames it fails at start, not after the first rebalance.
        self._owners: MutableMapping[str, int] = self._store._key_partition
        self.partition = partition

    def partition_of(self, key: str) -> int:
        """Where ``key`` lives: its recorded partition, else this one (a new key)."""
        return self._owners.get(key, self.partition)

    def __getitem__(self, key: str) -> Any:
        return self._store[key]

    def __contains__(self, key: object) -> bool:
        return key in self._store

    def __iter__(self) -> Iterator[str]:
        return iter([k for k in list(self._store.keys()) if self.partition_of(k) == self.partition])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def items(self) -> list[tuple[str, Any]]:  # type: ignore[override]
        """This partition's entries, in one pass over the store.

        Why not the mixin's ItemsView: ``list()`` of it asks ``len()`` first (one more walk of
        every key) and then reads each key back; ``on_tick`` walks this once per owned
        partition every second, so the cost grows with the state (issue 29).
        """
        owners, partition = self._owners, self.partition
        if self._entries is not None:
            # Ownership checked again: a key seen by every partition (none recorded) that an
            # earlier partition's tick wrote is that partition's now.
            return [(k, v) for k, v in self._entries if owners.get(k, partition) == partition]
        return [
            (k, v) for k, v in list(self._store.items()) if owners.get(k, partition) == partition
        ]

    def __setitem__(self, key: str, value: Any) -> None:
        partition = self.partition_of(key)
        self._table.send_changelog(partition, key, value)
        self._store[key] = value
        self._owners[key] = partition
        if self._entries is not None:
            # In the store's order: a changed key keeps its place, a new one comes last.
            found = [i for i, (k, _) in enumerate(self._entries) if k == key]
            if found:
                self._entries[found[0]] = (key, value)
            else:
                self._entries.append((key, value))

    def __delitem__(self, key: str) -> None:
        if key not in self._store:
            raise KeyError(key)
        partition = self.partition_of(key)
        # A null value is faust's tombstone (value_serializer raw, as Table.on_key_del sends it).
        self._table.send_changelog(partition, key, None, value_serializer="raw")
        del self._store[key]
        self._owners.pop(key, None)
        if self._entries is not None:
            self._entries = [(k, v) for k, v in self._entries if k != key]


def split_by_partition(table: Any, partitions: Iterable[int]) -> dict[int, list[tuple[str, Any]]]:
    """The entries of ``table`` (a faust Table on the ``memory://`` store) of each of
    ``partitions``, in one pass over the store.

    Why: the timer asks every owned partition for its entries each tick; walking the whole
    store once per partition cost the owned-partition count times the state (issue 29: the
    largest cost of ours that grows with the state, 2-4 % of the worker in a 3,000-6,000 mail
    bench).
    """
    store = table.data
    owners: MutableMapping[str, int] = store._key_partition
    found: dict[int, list[tuple[str, Any]]] = {p: [] for p in partitions}
    for key, value in list(store.items()):
        # A key without a recorded partition is seen by every partition's view (partition_of).
        owner = owners.get(key)
        if owner is None:
            for entries in found.values():
                entries.append((key, value))
        elif owner in found:
            found[owner].append((key, value))
    return found
