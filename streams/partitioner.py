"""The producer's key partitioner: Kafka's default (murmur2 of the key), computed faster.

Why: every output, forwarded record and ``rates`` changelog record is partitioned by its key,
and aiokafka's ``DefaultPartitioner`` hashes it one byte at a time in pure Python (murmur2
was ~4 % of a worker's CPU, py-spy of ``mailtap bench streams``, issue 29). This one reads
the key four bytes at a time (``struct``) and gives the same partition for every key, the
partition the Java client and librdkafka's ``murmur2_random`` give, which the SMTP sink and
any other producer of the same keys rely on.

>>> murmur2(b"21"), KeyPartitioner()(b"21", [0, 1, 2, 3, 4, 5], [0, 1])
(3321034988, 0)
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from functools import lru_cache

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


@lru_cache(maxsize=256)
def _words(count: int) -> struct.Struct:
    """The little-endian 32-bit words of a key of ``4 * count`` bytes or more."""
    return struct.Struct(f"<{count}I")


@lru_cache(maxsize=4096)
def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as Kafka's ``Utils.murmur2`` computes it, as an unsigned int
    (aiokafka's ``aiokafka.partitioner.murmur2`` gives the same).

    The last keys are kept: a conversation's key (each of its mails is forwarded under it) and
    a sender's ``rates`` key come back often."""
    length = len(data)
    h = _SEED ^ length
    count = length >> 2
    for k in _words(count).unpack_from(data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = count << 2
        if tail >= 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


class KeyPartitioner:
    """aiokafka's partitioner interface (``producer_partitioner`` of faust): a key's partition
    is ``murmur2(key) & 0x7fffffff`` modulo the partition count; no key, a random available one."""

    def __call__(
        self, key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
    ) -> int:
        if key is None:
            return random.choice(available or all_partitions)
        return all_partitions[(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)]
