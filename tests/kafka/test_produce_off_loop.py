"""A Produce's large batches are checked off the worker's event loop (record_batches.py,
CHECKED_ON_LOOP_BYTES): while one is decompressed and its records read, the worker answers its
other connections and goes on with their PostgreSQL transactions; small batches are checked on the
loop, and refused as a check in a thread refuses them."""

from __future__ import annotations

import threading

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode as KafkaError

from app import record_batch_codecs as codecs
from app.kafka import api_table
from app.kafka.record_batches import (
    CHECKED_ON_LOOP_BYTES,
    HEADER,
    BatchRefused,
    read_produced,
    read_produced_on_loop,
)
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection
from tests.kafka.test_partitions_named_twice import produce_request as produce_with_entries
from tests.kafka.test_produce_raw import PRODUCE_VERSION, answer_of, produce_request

# How long the held check waits for the test's go-ahead at most: on main's code the event loop
# itself waits, and the small request is answered only after this.
HOLD_S = 5


def batch(records: int, codec: int = codecs.CODEC_NONE, value: bytes = b"v" * 100) -> bytes:
    """A client's batch of `records` 100-byte records (compressing well), in `codec`."""
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 2**31 - 1)
    for index in range(records):
        builder.append(index, 1_700_000_000_000 + index, None, value, [])
    return bytes(builder.build())


def small_produce_answered_during_the_large_check(
    server, monkeypatch, large_batches: list[bytes]
) -> tuple[list[str], list[tuple[KafkaError, int]], list[int]]:
    """Sends a Produce of `large_batches` (partitions 0..n-1 of a topic of n + 1) whose first
    decompression beyond the loop's share (a batch's check in a thread; on main's code, on the
    loop) is held until the test lets it go, then, on another connection to the same worker, a
    Produce of 10 records to the last partition: the order of the events, each request's answers
    (error, base offset) and every partition's high watermark."""
    topic = "produce-off-loop-" + str(len(large_batches))
    create_topic(server, topic, partitions=len(large_batches) + 1)
    real_decompress = codecs.decompress
    check_started, may_finish = threading.Event(), threading.Event()
    events: list[str] = []

    def held_decompress(codec: int, data: bytes, limit: int) -> bytes:
        if limit > CHECKED_ON_LOOP_BYTES and not check_started.is_set():  # not a look within the loop's share
            check_started.set()
            may_finish.wait(HOLD_S)
            events.append("large batch checked")
        return real_decompress(codec, data, limit)

    monkeypatch.setattr(codecs, "decompress", held_decompress)
    bootstrap = server.extra["kafka_bootstrap"]
    with RawConnection(bootstrap) as large_connection, RawConnection(bootstrap) as small_connection:
        large_id = large_connection.send(
            produce_with_entries(server, PRODUCE_VERSION, topic, tuple(enumerate(large_batches)))
        )
        assert check_started.wait(60), "the large batch's check never started"
        small_answer = small_connection.call(produce_request(topic, len(large_batches), batch(10)))
        events.append("small produce answered")
        may_finish.set()
        large_answer = large_connection.receive(api_table.PRODUCE, PRODUCE_VERSION, large_id)
    answers = [(p.error_code, p.base_offset) for p in large_answer.responses[0].partition_responses]
    watermarks = [p["high_watermark"] for p in server.client.get(f"/v1/topics/{topic}").json()["partitions"]]
    return events, answers + [answer_of(small_answer)], watermarks


def test_a_small_produce_is_answered_while_a_large_batch_of_another_connection_is_checked(kafka_server, monkeypatch):
    """A gzip batch of 4 MiB of records (under 256 KiB sent), its decompression held: a small
    Produce on another connection to the same worker is answered (written in PostgreSQL)
    meanwhile, then the large one. On the event loop, the small one waited for the whole check."""
    large = batch(40_000, codecs.CODEC_GZIP)
    assert len(large) < 256 * 1024  # large by what it decompresses to, not by what it is sent as
    events, answers, watermarks = small_produce_answered_during_the_large_check(kafka_server, monkeypatch, [large])
    assert events == ["small produce answered", "large batch checked"]
    assert answers == [(KafkaError.none, 0), (KafkaError.none, 0)]
    assert watermarks == [40_000, 10]


def test_the_loop_share_is_the_requests_batches_together(kafka_server, monkeypatch):
    """Two batches of 0.7 MiB each in one request: the first is checked on the loop, the second,
    beyond what is left of the request's share, in a thread, the small Produce answered meanwhile."""
    halves = [batch(6_500, codecs.CODEC_GZIP) for _ in range(2)]
    assert all(
        CHECKED_ON_LOOP_BYTES // 2 < read_produced(b, 1 << 30).uncompressed_bytes < CHECKED_ON_LOOP_BYTES
        for b in halves
    )
    events, answers, watermarks = small_produce_answered_during_the_large_check(kafka_server, monkeypatch, halves)
    assert events == ["small produce answered", "large batch checked"]
    assert answers == [(KafkaError.none, 0)] * 3
    assert watermarks == [6_500, 6_500, 10]


def test_a_batch_within_the_loop_share_is_read_on_the_loop_as_in_a_thread():
    for codec in (codecs.CODEC_NONE, codecs.CODEC_LZ4):
        data = batch(100, codec)
        assert read_produced_on_loop(data, 1 << 20, CHECKED_ON_LOOP_BYTES) == read_produced(data, 1 << 20)


@pytest.mark.parametrize(
    "codec", [codecs.CODEC_NONE, codecs.CODEC_GZIP, codecs.CODEC_ZSTD], ids=["none", "gzip", "zstd"]
)
def test_a_batch_beyond_the_loop_share_is_left_for_a_thread_after_decompressing_the_share_at_most(codec, monkeypatch):
    data = batch(20_000, codec)
    limits: list[int] = []
    real_decompress = codecs.decompress
    monkeypatch.setattr(codecs, "decompress", lambda c, d, limit: limits.append(limit) or real_decompress(c, d, limit))
    share = 1024 * 1024
    assert read_produced_on_loop(data, 100 << 20, share) is None
    assert limits == ([] if codec == codecs.CODEC_NONE else [share])
    assert read_produced(data, 100 << 20).uncompressed_bytes > share


def test_what_the_loop_refuses_a_thread_refuses_alike():
    """Errors found on the loop are read_produced's: a corrupt CRC, and a batch beyond what the
    request may still carry though within the loop's share; beyond the share, the thread finds them."""
    data = bytearray(batch(100))
    data[HEADER.size] ^= 1  # a record's byte: the CRC no longer matches
    corrupt = bytes(data)
    small = batch(100, codecs.CODEC_GZIP)
    for args in ((corrupt, 1 << 20), (small, 1024)):
        with pytest.raises(BatchRefused) as on_loop:
            read_produced_on_loop(*args, CHECKED_ON_LOOP_BYTES)
        with pytest.raises(BatchRefused) as in_thread:
            read_produced(*args)
        assert (on_loop.value.error, on_loop.value.message) == (in_thread.value.error, in_thread.value.message)
    assert read_produced_on_loop(corrupt, 1 << 20, 100) is None  # beyond the share: left to the thread
