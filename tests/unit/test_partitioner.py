"""txbroker.wire's partitioner against Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2).

The vectors are Kafka's own (UtilsTest.testMurmur2); a key must land on the same partition as with
Kafka's Java client, so the hash must match bit for bit.
"""

from __future__ import annotations

import random

import pytest

from txbroker.wire import murmur2, partition_for_key

# Kafka's UtilsTest.testMurmur2.
KAFKA_VECTORS = [
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
]


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _java_murmur2(data: bytes) -> int:
    """A line-by-line transcription of Kafka's Java Utils.murmur2 (signed 32-bit ints, >>> shifts),
    written independently of the module under test."""
    length = len(data)
    seed = _int32(0x9747B28C)
    m = 0x5BD1E995
    r = 24
    h = _int32(seed ^ length)
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (
            (data[i4] & 0xFF)
            + ((data[i4 + 1] & 0xFF) << 8)
            + ((data[i4 + 2] & 0xFF) << 16)
            + ((data[i4 + 3] & 0xFF) << 24)
        )
        k = _int32(k)
        k = _int32(k * m)
        k ^= (k & 0xFFFFFFFF) >> r
        k = _int32(k * m)
        h = _int32(h * m)
        h = _int32(h ^ k)
    rest = length % 4
    if rest == 3:
        h = _int32(h ^ ((data[(length & ~3) + 2] & 0xFF) << 16))
    if rest >= 2:
        h = _int32(h ^ ((data[(length & ~3) + 1] & 0xFF) << 8))
    if rest >= 1:
        h = _int32(h ^ (data[length & ~3] & 0xFF))
        h = _int32(h * m)
    h = _int32(h ^ ((h & 0xFFFFFFFF) >> 13))
    h = _int32(h * m)
    h = _int32(h ^ ((h & 0xFFFFFFFF) >> 15))
    return h


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka_published_vectors(key, expected):
    assert murmur2(key.encode("utf-8")) == expected


def test_reference_transcription_matches_kafka_vectors_too():
    # Guards the reference used below: it must itself reproduce Kafka's vectors.
    for key, expected in KAFKA_VECTORS:
        assert _java_murmur2(key.encode("utf-8")) == expected


@pytest.mark.parametrize("length", range(0, 13))
def test_murmur2_matches_java_for_every_tail_length(length):
    rng = random.Random(length)
    for _ in range(50):
        data = bytes(rng.randrange(256) for _ in range(length))
        assert murmur2(data) == _java_murmur2(data), data


def test_murmur2_handles_high_bytes_that_are_negative_in_java():
    data = bytes([0xFF, 0x80, 0x81, 0xFE, 0x90, 0xAB, 0xCD])
    assert murmur2(data) == _java_murmur2(data)


def test_murmur2_is_a_signed_32_bit_int():
    rng = random.Random(7)
    results = [murmur2(rng.randbytes(rng.randrange(1, 40))) for _ in range(500)]
    assert all(-(2**31) <= value < 2**31 for value in results)
    assert any(value < 0 for value in results) and any(value > 0 for value in results)


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_partition_for_key_is_kafkas_to_positive_modulo(key, expected):
    for count in (1, 2, 3, 7, 50, 10_000):
        assert partition_for_key(key.encode(), count) == (expected & 0x7FFFFFFF) % count


def test_partition_for_key_of_negative_hash_is_not_python_abs():
    # Kafka's toPositive masks the sign bit; abs() would give a different partition.
    data = b"21"  # murmur2 = -973932308
    assert partition_for_key(data, 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert partition_for_key(data, 7) != abs(-973932308) % 7


def test_partition_for_key_is_always_in_range():
    rng = random.Random(3)
    for count in (1, 2, 3, 5, 16, 100, 10_000):
        for _ in range(200):
            partition = partition_for_key(rng.randbytes(rng.randrange(0, 30)), count)
            assert 0 <= partition < count


def test_partition_for_key_is_deterministic_and_uses_every_partition():
    keys = [f"key-{i}".encode() for i in range(400)]
    first = [partition_for_key(key, 4) for key in keys]
    assert first == [partition_for_key(key, 4) for key in keys]
    assert set(first) == {0, 1, 2, 3}


def test_single_partition_always_zero():
    assert {partition_for_key(f"k{i}".encode(), 1) for i in range(50)} == {0}
