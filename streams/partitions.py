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

Reads (``get``, ``[]``) see every local key; iteration (``items()``, and ``scan(prefix)``,
which ``on_tick`` and the retention sweep use) sees only this partition's keys, so each worker
runs time-driven steps only for the partitions it owns, each exactly once.

``scan`` reads a :class:`PrefixIndex` when the table has one (the state table does): the 5 s
tick asked for a few prefixes of each owned partition (``approval/request/``) and walked every
key of the state to answer, a cost that grew with the state (issue 29: 4-6 % of a worker over
40,000 mails, and the state keeps 30 days).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any


class PartitionedTable(MutableMapping[str, Any]):
    """``table`` (a faust Table on the ``memory://`` store) as seen from ``partition``."""

    def __init__(self, table: Any, partition: int) -> None:
        self._table = table
        self._store = table.data
        # Private in faust 0.15 (memory store); checked at construction so that a faust upgrade
        # that renames it fails at start, not after the first rebalance.
        self._owners: MutableMapping[str, int] = self._store._key_partition
        self._index: PrefixIndex | None = getattr(table, "prefix_index", None)
        #: The store's own dict, for reads: the store's ``__getitem__`` asks ``hasattr`` first,
        #: and the mixin's ``get`` raises and catches a KeyError for every key not there (most
        #: of the workflows' lookups: a thread seen for the first time), ~4 % of a worker.
        self._values: dict[str, Any] = self._store.data
        self.partition = partition

    def partition_of(self, key: str) -> int:
        """Where ``key`` lives: its recorded partition, else this one (a new key)."""
        return self._owners.get(key, self.partition)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter([k for k in list(self._store.keys()) if self.partition_of(k) == self.partition])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def items(self) -> list[tuple[str, Any]]:  # type: ignore[override]
        """This partition's entries, in one pass over the store.

        Why not the mixin's ItemsView: ``list()`` of it asks ``len()`` first (one more walk of
        every key) and then reads each key back.
        """
        owners, partition = self._owners, self.partition
        return [
            (k, v) for k, v in list(self._store.items()) if owners.get(k, partition) == partition
        ]

    def scan(self, prefix: str) -> list[tuple[str, Any]]:
        """This partition's entries whose key starts with ``prefix`` (in no set order)."""
        if self._index is None:
            return [(k, v) for k, v in self.items() if k.startswith(prefix)]
        values = self._values
        return [(k, values[k]) for k in self._index.keys(self.partition, prefix) if k in values]

    def __setitem__(self, key: str, value: Any) -> None:
        partition = self.partition_of(key)
        self._table.send_changelog(partition, key, value)
        self._store[key] = value
        self._owners[key] = partition
        if self._index is not None:
            self._index.added(key, partition)

    def __delitem__(self, key: str) -> None:
        if key not in self._store:
            raise KeyError(key)
        partition = self.partition_of(key)
        # A null value is faust's tombstone (value_serializer raw, as Table.on_key_del sends it).
        self._table.send_changelog(partition, key, None, value_serializer="raw")
        del self._store[key]
        owner = self._owners.pop(key, None)
        if self._index is not None:
            self._index.removed(key, owner)


class PrefixIndex:
    """The keys of a ``memory://`` store by partition and by *bucket*: the key up to its second
    ``/`` (``approval/request/``), else its first, so that a prefix scan reads the buckets that
    can hold the prefix instead of every key.

    Kept up to date by :class:`PartitionedTable`'s writes; built again from the store at the
    next scan after :meth:`invalidate` (faust wrote the store itself: changelog recovery, a
    rebalance) and whenever the store holds another number of keys than the index (a write
    that did not come through a view). A key without a recorded partition (the store's map)
    is seen by every partition, as :meth:`PartitionedTable.partition_of` sees it.
    """

    def __init__(self, store: Any) -> None:
        self._store = store
        self._owners: MutableMapping[str, int] = store._key_partition
        #: partition (None: no recorded one) -> bucket -> keys (a dict as an ordered set)
        self._buckets: dict[int | None, dict[str, dict[str, None]]] = {}
        #: How many keys are indexed; -1: build at the next scan.
        self._size = -1

    def invalidate(self) -> None:
        self._size = -1

    def added(self, key: str, partition: int) -> None:
        if self._size < 0:
            return
        bucket = _bucket(key)
        unowned = self._buckets.get(None, {}).get(bucket)
        if unowned is not None and key in unowned:  # recorded now: it is this partition's
            del unowned[key]
            self._size -= 1
        keys = self._buckets.setdefault(partition, {}).setdefault(bucket, {})
        if key not in keys:
            keys[key] = None
            self._size += 1

    def removed(self, key: str, partition: int | None) -> None:
        if self._size < 0:
            return
        keys = self._buckets.get(partition, {}).get(_bucket(key))
        if keys is not None and key in keys:
            del keys[key]
            self._size -= 1

    def keys(self, partition: int, prefix: str) -> list[str]:
        """The keys of ``partition`` (and those of none) that start with ``prefix``."""
        if self._size != len(self._store):
            self._build()
        found: list[str] = []
        for owner in (partition, None):
            for bucket, keys in self._buckets.get(owner, {}).items():
                if bucket.startswith(prefix):
                    found += keys
                elif prefix.startswith(bucket):
                    found += [k for k in keys if k.startswith(prefix)]
        return found

    def _build(self) -> None:
        owners = self._owners
        buckets: dict[int | None, dict[str, dict[str, None]]] = {}
        keys = list(self._store.keys())
        for key in keys:
            buckets.setdefault(owners.get(key), {}).setdefault(_bucket(key), {})[key] = None
        self._buckets, self._size = buckets, len(keys)


def _bucket(key: str) -> str:
    first = key.find("/")
    if first < 0:
        return ""
    second = key.find("/", first + 1)
    return key[: (second if second >= 0 else first) + 1]
