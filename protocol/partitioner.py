"""Choosing a partition for a record, as Kafka's default partitioner does.

Keyed records go to ``murmur2(key) & 0x7fffffff`` modulo the partition count,
the same function and mapping as Kafka's Java client, so a key lands on the
same partition whichever client wrote it and whichever client reads it
expects it there. Records without a key "stick" to one partition until the
producer closes a batch for it, then move to another (KIP-480): batches fill
up instead of spreading one record per partition.

Pure and synchronous; the producer calls ``partition_for`` per record and
``on_batch_closed`` when it sends a batch.
"""

from __future__ import annotations

import random
from collections.abc import Callable

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 (``Utils.murmur2``), as a signed int like Java's."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length % 4
    if tail:  # Java's fall-through switch over the last 1-3 bytes
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's ``toPositive(murmur2(key)) % numPartitions``."""
    if num_partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Per topic: keyed records by ``partition_for_key``; keyless ones to the
    current sticky partition, chosen anew (another one when there are
    several) each time ``on_batch_closed`` reports its batch was closed."""

    def __init__(self, choose: Callable[[int], int] | None = None) -> None:
        # choose(n) -> a partition in [0, n); injectable for tests.
        self._choose = choose or (lambda n: random.randrange(n))
        self._sticky: dict[str, int] = {}

    def partition_for(self, topic: str, key: bytes | None, num_partitions: int) -> int:
        if key is not None:
            return partition_for_key(key, num_partitions)
        current = self._sticky.get(topic)
        if current is None or current >= num_partitions:
            current = self._choose(num_partitions)
            self._sticky[topic] = current
        return current

    def on_batch_closed(self, topic: str, partition: int, num_partitions: int) -> None:
        """The batch of ``partition`` was sent: keyless records move on."""
        if self._sticky.get(topic) != partition:
            return
        if num_partitions <= 1:
            return
        choice = self._choose(num_partitions - 1)
        self._sticky[topic] = choice if choice < partition else choice + 1
