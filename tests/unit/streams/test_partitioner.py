"""The producer's key partitioner (streams.partitioner): the same partition as Kafka's default
partitioner for every key, so outputs keep landing where other producers put the same keys."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from streams.partitioner import KeyPartitioner, murmur2


def test_murmur2_matches_aiokafkas_for_every_length_and_tail() -> None:
    rng = random.Random(29)
    for length in range(70):
        for _ in range(50):
            key = rng.randbytes(length)
            assert murmur2(key) == aiokafka_murmur2(key), key


def test_murmur2_matches_the_java_clients_known_values() -> None:
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed ints there).
    known = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536}
    for key, signed in known.items():
        assert murmur2(key) == signed & 0xFFFFFFFF


def test_a_key_goes_to_the_partition_kafkas_default_partitioner_gives() -> None:
    ours, theirs = KeyPartitioner(), DefaultPartitioner()
    for n in range(500):
        key = f"bench/bench-{n}@customer{n % 211}.example".encode()
        for count in (1, 3, 6, 12):
            partitions = list(range(count))
            assert ours(key, partitions, partitions[:1]) == theirs(key, partitions, partitions[:1])


def test_no_key_goes_to_an_available_partition() -> None:
    assert {KeyPartitioner()(None, [0, 1, 2, 3], [2]) for _ in range(20)} == {2}
