"""Kafka's default partitioner: murmur2 of the key bytes, made positive, modulo the partition count.

Pure and dependency-free: the SDK partitions with it, and the server's convenience endpoint
(POST /v1/topics/{topic}/records) uses the same function, so a key lands on the same partition
whichever way it was written -- and on the same partition as with Kafka's Java client.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit hash."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length - length % 4
    for i in range(0, full, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[full + 2] << 16
    if tail >= 2:
        h ^= data[full + 1] << 8
    if tail >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partition_count: int) -> int:
    """Kafka's `toPositive(murmur2(key)) % numPartitions`."""
    return (murmur2(key) & 0x7FFFFFFF) % partition_count
