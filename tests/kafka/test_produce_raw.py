"""Produce requests built by hand (kio messages, kafka.record batches) where a test must choose
the sequences, epochs and bytes: Kafka's answers for duplicates and every idempotence error, answers
in request order for pipelined requests, no answer at all for acks=0, and batches refused whole
(bad CRC, decompressing beyond the bound) with nothing written."""

from __future__ import annotations

import datetime
import logging
import time

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.listener import MAX_PENDING_ANSWERS
from app.kafka.record_batches import KafkaRecord
from tests.api.test_log_lifecycle import sql
from tests.kafka.clients import ConfluentKafka, create_topic
from tests.kafka.raw import RawConnection, nested, record_batch, request_frame, request_of, topic_metadata
from tests.kafka.test_api_versions import sample_request

PRODUCE_VERSION = 9


def produce_request(topic: str, partition: int, records: bytes, acks: int = -1):
    data = nested(api_table.PRODUCE, PRODUCE_VERSION, "PartitionProduceData", index=partition, records=records)
    return request_of(
        api_table.PRODUCE,
        PRODUCE_VERSION,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            nested(api_table.PRODUCE, PRODUCE_VERSION, "TopicProduceData", name=topic, partition_data=(data,)),
        ),
    )


def answer_of(response):
    [topic] = response.responses
    [partition] = topic.partition_responses
    return partition.error_code, partition.base_offset


def init_producer(connection: RawConnection, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
    response = connection.call(
        request_of(
            api_table.INIT_PRODUCER_ID,
            4,
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=producer_id,
            producer_epoch=epoch,
        )
    )
    assert response.error_code == KafkaError.none
    return response.producer_id, response.producer_epoch


def records(count: int, prefix: str = "r") -> list[KafkaRecord]:
    return [KafkaRecord(1_700_000_000_000 + i, None, f"{prefix}{i}".encode(), []) for i in range(count)]


def high_watermark(server, topic: str) -> int:
    return server.client.get(f"/v1/topics/{topic}").json()["partitions"][0]["high_watermark"]


def test_idempotent_sequences_duplicates_and_errors_as_kafka_answers_them(module_kafka_server):
    topic = "raw-idempotent"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        producer_id, epoch = init_producer(connection)

        def send(base_sequence: int, count: int, send_epoch: int = epoch, pid: int = producer_id):
            batch = record_batch(records(count), pid, send_epoch, base_sequence)
            return answer_of(connection.call(produce_request(topic, 0, batch)))

        assert send(0, 2) == (KafkaError.none, 0)
        assert send(2, 3) == (KafkaError.none, 2)
        # A retry of either of the last batches: its original offsets, no error, nothing appended.
        assert send(0, 2) == (KafkaError.none, 0)
        assert send(2, 3) == (KafkaError.none, 2)
        assert high_watermark(module_kafka_server, topic) == 5
        assert send(7, 1)[0] == KafkaError.out_of_order_sequence_number  # a gap: 5 was expected
        assert send(5, 1)[0] == KafkaError.none
        assert send(0, 1, pid=987_654_321)[0] == KafkaError.unknown_producer_id
        # KIP-360: the producer bumps its epoch; the old epoch is fenced, the new one starts at 0.
        bumped_id, bumped_epoch = init_producer(connection, producer_id, epoch)
        assert (bumped_id, bumped_epoch) == (producer_id, epoch + 1)
        assert send(6, 1)[0] == KafkaError.invalid_producer_epoch
        assert send(3, 1, send_epoch=bumped_epoch)[0] == KafkaError.out_of_order_sequence_number
        assert send(0, 1, send_epoch=bumped_epoch) == (KafkaError.none, 6)
    assert high_watermark(module_kafka_server, topic) == 7


def _fetch_request(topic: str, partition_max_bytes: int, partition: int = 0, fetch_offset: int = 0):
    fetch_partition = nested(
        api_table.FETCH,
        12,
        "FetchPartition",
        partition=partition,
        fetch_offset=fetch_offset,
        partition_max_bytes=partition_max_bytes,
    )
    return request_of(
        api_table.FETCH,
        12,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=(nested(api_table.FETCH, 12, "FetchTopic", topic=topic, partitions=(fetch_partition,)),),
        forgotten_topics_data=(),
    )


def _records_of(fetch_response) -> bytes:
    [topic_response] = fetch_response.responses
    [answer] = topic_response.partitions
    assert answer.error_code == KafkaError.none
    return bytes(answer.records)


def fetched_records(connection: RawConnection, topic: str, partition_max_bytes: int) -> bytes:
    """The records (batches) one Fetch v12 of partition 0 from offset 0 returns."""
    return _records_of(connection.call(_fetch_request(topic, partition_max_bytes)))


def _batches_of(fetch_response) -> list:
    """The batches (kafka.record's) of a Fetch's answer for one partition."""
    from kafka.record.memory_records import MemoryRecords

    batches, records = [], MemoryRecords(_records_of(fetch_response))
    while (batch := records.next_batch()) is not None:
        batches.append(batch)
    return batches


def _fetch(connection: RawConnection, topic: str, partition_max_bytes: int = 1 << 20) -> list:
    """The batches one Fetch v12 of partition 0 from offset 0 returns."""
    return _batches_of(connection.call(_fetch_request(topic, partition_max_bytes)))


def _fetched_batches(connection: RawConnection, topic: str, partition_max_bytes: int) -> list[int]:
    """The base offsets of the batches one Fetch v12 from offset 0 returns."""
    return [batch.base_offset for batch in _fetch(connection, topic, partition_max_bytes)]


def test_fetch_returns_batches_within_the_bytes_asked_and_always_the_first(module_kafka_server):
    topic = "raw-fetch-bytes"
    create_topic(module_kafka_server, topic)
    batch = record_batch(records(2))
    size = len(batch)  # what a batch stored as the client sent it counts
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        for _ in range(3):
            connection.call(produce_request(topic, 0, batch))
        assert _fetched_batches(connection, topic, 1) == [0], "the first batch whatever its size"
        assert _fetched_batches(connection, topic, 2 * size) == [0, 2], "batches while their sizes fit"
        assert _fetched_batches(connection, topic, 2 * size - 1) == [0], "not one that would exceed the bytes"
        assert _fetched_batches(connection, topic, 1 << 20) == [0, 2, 4]


@pytest.mark.parametrize(
    ("fetch_max_bytes", "second_partition_max_bytes"),
    [(3, 4), (100, 1)],
    ids=["the-fetch-limit-left", "the-partition-limit"],
)
def test_only_the_first_partition_with_batches_may_exceed_the_limits(
    module_kafka_server, fetch_max_bytes, second_partition_max_bytes
):
    """Kafka's KIP-74: the first batch of the first partition that has one is sent whatever its
    size; a later partition's batch is sent only if it fits its own max_bytes and what is left of
    the fetch's (librdkafka's 0082 sets receive.message.max.bytes just above fetch.max.bytes and
    drops the connection when the answer is larger)."""
    topic = "raw-fetch-limits-" + "-".join(map(str, (fetch_max_bytes, second_partition_max_bytes)))
    create_topic(module_kafka_server, topic, partitions=2)
    batch = record_batch(records(2))
    half = len(batch) // 2  # limits in half batches: a batch never fits in what is left after one
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        for partition in (0, 1):
            connection.call(produce_request(topic, partition, batch))
        request = request_of(
            api_table.FETCH,
            12,
            max_wait=datetime.timedelta(0),
            min_bytes=1,
            max_bytes=fetch_max_bytes * half,
            isolation_level=0,
            topics=(
                nested(
                    api_table.FETCH,
                    12,
                    "FetchTopic",
                    topic=topic,
                    partitions=tuple(
                        nested(
                            api_table.FETCH,
                            12,
                            "FetchPartition",
                            partition=partition,
                            fetch_offset=0,
                            partition_max_bytes=max_bytes * half,
                        )
                        for partition, max_bytes in ((0, 1), (1, second_partition_max_bytes))
                    ),
                ),
            ),
            forgotten_topics_data=(),
        )
        [topic_response] = connection.call(request).responses
    first, second = topic_response.partitions
    assert (first.error_code, second.error_code) == (KafkaError.none, KafkaError.none)
    assert (len(first.records), len(second.records)) == (len(batch), 0)


@pytest.mark.parametrize(
    ("partition", "fetch_offset", "error"),
    [(0, 5, KafkaError.offset_out_of_range), (3, 0, KafkaError.unknown_topic_or_partition)],
    ids=["past-the-end", "no-such-partition"],
)
def test_a_fetch_error_carries_empty_records_never_null(module_kafka_server, partition, fetch_offset, error):
    """As Kafka's read path answers a partition it cannot read (MemoryRecords.EMPTY): librdkafka
    refuses a null records field in any partition ("invalid MessageSetSize -1"), so one partition's
    error (auto.offset.reset's OFFSET_OUT_OF_RANGE) would fail the whole Fetch."""
    topic = f"raw-fetch-error-{partition}"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        connection.call(produce_request(topic, 0, record_batch(records(2))))
        request = _fetch_request(topic, 1 << 20, partition, fetch_offset)
        [topic_response] = connection.call(request).responses
        [answer] = topic_response.partitions
    assert (answer.error_code, answer.records) == (error, b"")


def test_unknown_topics_and_partitions(module_kafka_server):
    create_topic(module_kafka_server, "raw-one-partition")
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        for topic, partition in (("raw-no-such-topic", 0), ("raw-one-partition", 3)):
            response = connection.call(produce_request(topic, partition, record_batch(records(1))))
            assert answer_of(response)[0] == KafkaError.unknown_topic_or_partition


def test_pipelined_requests_are_answered_in_order_and_appended_in_sequence(module_kafka_server):
    topic = "raw-pipelined"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        producer_id, epoch = init_producer(connection)
        sent = [
            connection.send(produce_request(topic, 0, record_batch(records(2, f"p{i}-"), producer_id, epoch, 2 * i)))
            for i in range(5)
        ]
        answers = [answer_of(connection.receive(api_table.PRODUCE, PRODUCE_VERSION, c)) for c in sent]
    assert answers == [(KafkaError.none, 2 * i) for i in range(5)]


def test_produce_requests_that_arrive_together_are_committed_in_one_postgresql_transaction(module_kafka_server):
    # librdkafka sends one Produce request per partition, back to back: a transaction to two
    # partitions sends two at once. The write batch that commits the first takes the second too
    # (write_batching.py), one commit for both rather than one each. Both frames go in one send here,
    # so that they arrive together whatever the machine's scheduling.
    topic = "raw-produced-together"
    create_topic(module_kafka_server, topic, partitions=2)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        producer_id, epoch = init_producer(connection)
        requests = [
            produce_request(topic, p, record_batch(records(2, f"p{p}-"), producer_id, epoch, 0)) for p in (0, 1)
        ]
        correlation_ids = [connection.correlation_id + 1, connection.correlation_id + 2]
        connection.correlation_id += 2
        connection.send_bytes(b"".join(map(request_frame, requests, correlation_ids)))
        answers = [answer_of(connection.receive(api_table.PRODUCE, PRODUCE_VERSION, c)) for c in correlation_ids]
    assert answers == [(KafkaError.none, 0), (KafkaError.none, 0)]
    transactions = sql(
        module_kafka_server.database_url,
        "SELECT DISTINCT b.xmin::text AS txid FROM record_batches b JOIN topics t USING (topic_id) WHERE t.name = $1",
        topic,
    )
    assert len(transactions) == 1, f"the two partitions' batches were committed by {len(transactions)} transactions"


def _pipelined_produces(connection: RawConnection, topic: str, sequences: list[int], records_each: int) -> list[int]:
    """Sends an idempotent producer's Produce requests with these base sequences without waiting for
    an answer; their correlation ids."""
    producer_id, epoch = init_producer(connection)
    return [
        connection.send(
            produce_request(
                topic, 0, record_batch(records(records_each, f"s{sequence}-"), producer_id, epoch, sequence)
            )
        )
        for sequence in sequences
    ]


def test_pipelined_produces_are_answered_in_order_then_the_request_after_them(module_kafka_server):
    # More than the listener lets wait at once (MAX_PENDING_ANSWERS): it then reads the next request
    # once the oldest is answered.
    topic = "raw-pipelined-then-metadata"
    create_topic(module_kafka_server, topic)
    count = MAX_PENDING_ANSWERS + 4
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        sent = _pipelined_produces(connection, topic, [3 * i for i in range(count)], 3)
        metadata = connection.send(sample_request(api_table.METADATA, 9))
        # receive checks each answer's correlation id: the answers come in request order.
        answers = [answer_of(connection.receive(api_table.PRODUCE, PRODUCE_VERSION, c)) for c in sent]
        assert connection.receive(api_table.METADATA, 9, metadata) is not None
    assert answers == [(KafkaError.none, 3 * i) for i in range(count)]
    assert high_watermark(module_kafka_server, topic) == 3 * count


def test_a_request_after_pipelined_produces_is_served_once_they_are_written(module_kafka_server):
    # A Fetch sent right behind the Produce requests, without waiting for their answers, sees every
    # record they wrote: it is served after them, as Kafka serves a connection's requests.
    topic = "raw-pipelined-then-fetch"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        sent = _pipelined_produces(connection, topic, [2 * i for i in range(5)], 2)
        fetch = connection.send(_fetch_request(topic, 1 << 20))
        answers = [answer_of(connection.receive(api_table.PRODUCE, PRODUCE_VERSION, c)) for c in sent]
        fetched = _batches_of(connection.receive(api_table.FETCH, 12, fetch))
    assert answers == [(KafkaError.none, 2 * i) for i in range(5)]
    assert [(b.base_offset, b.base_sequence) for b in fetched] == [(2 * i, 2 * i) for i in range(5)]


def test_a_refused_pipelined_produce_is_its_own_and_the_ones_after_it_are_judged_in_order(module_kafka_server):
    # A gap in the middle (sequence 99): refused as Kafka refuses it; the next, in sequence after the
    # one before the gap, is appended; nothing is appended twice or out of order.
    topic = "raw-pipelined-gap"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        sent = _pipelined_produces(connection, topic, [0, 2, 99, 4, 4, 6], 2)
        answers = [answer_of(connection.receive(api_table.PRODUCE, PRODUCE_VERSION, c)) for c in sent]
        fetched = _fetch(connection, topic)
    assert [error for error, _ in answers] == [KafkaError.none] * 2 + [KafkaError.out_of_order_sequence_number] + [
        KafkaError.none
    ] * 3
    assert [offset for _, offset in answers[3:]] == [4, 4, 6]  # the second 4 is a duplicate: its original offset
    assert [(b.base_offset, b.base_sequence) for b in fetched] == [(0, 0), (2, 2), (4, 4), (6, 6)]


def test_a_connection_closed_with_answers_pending_drops_them_and_its_writes_go_on(module_kafka_server, caplog):
    caplog.set_level(logging.INFO, logger="txbroker.kafka")
    topic = "raw-pipelined-closed"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        _pipelined_produces(connection, topic, [2 * i for i in range(5)], 2)
    # Closed without reading an answer: the batches are written all the same, as a client's that went away.
    deadline = time.monotonic() + 30
    while high_watermark(module_kafka_server, topic) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)  # polls the condition
    assert high_watermark(module_kafka_server, topic) == 10
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        assert [(b.base_offset, b.base_sequence) for b in _fetch(connection, topic)] == [
            (2 * i, 2 * i) for i in range(5)
        ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_producer_with_five_requests_in_flight_loses_duplicates_and_reorders_nothing(module_kafka_server):
    topic = "confluent-pipelined"
    create_topic(module_kafka_server, topic)
    values = [f"m{i}".encode() for i in range(3000)]
    delivered = ConfluentKafka().produce(
        module_kafka_server,
        topic,
        [{"value": value} for value in values],
        **{"max.in.flight.requests.per.connection": 5, "linger.ms": 5, "batch.num.messages": 50},
    )
    assert sorted((d.offset, d.value) for d in delivered) == list(enumerate(values))
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        fetched = _fetch(connection, topic)
    assert len(fetched) >= 3000 // 50  # many requests, several in flight at once
    assert len({b.producer_id for b in fetched}) == 1
    # One producer from a fresh partition: each batch's first sequence is its first offset.
    assert [(b.base_offset, b.base_sequence) for b in fetched] == [(b.base_offset, b.base_offset) for b in fetched]
    assert [b.base_offset for b in fetched[1:]] == [b.next_offset for b in fetched[:-1]]
    assert fetched[-1].next_offset == len(values)


def test_acks_zero_gets_no_answer_at_all(module_kafka_server):
    topic = "raw-acks-zero"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        connection.send(produce_request(topic, 0, record_batch(records(3)), acks=0))
        versions = connection.send(sample_request(api_table.API_VERSIONS, 3))
        # The next frame on the connection is ApiVersions' answer (receive checks its correlation id).
        assert connection.receive(api_table.API_VERSIONS, 3, versions).error_code == KafkaError.none
    assert high_watermark(module_kafka_server, topic) == 3


def test_an_acks_zero_produce_that_fails_closes_the_connection_after_the_answers_before_it(module_kafka_server):
    """Regression: an acks=0 Produce that failed was dropped silently and the connection kept. Kafka's
    broker closes the connection, so that the client, which reads no answer, notices and refreshes
    its metadata (KafkaApis.handleProduceRequest); the answers of the requests before it are sent
    first, and the requests after it are not answered."""
    topic = "raw-acks-zero-failed"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        answered = connection.send(produce_request(topic, 0, record_batch(records(2))))
        connection.send(produce_request(topic, 3, record_batch(records(1)), acks=0))  # no partition 3
        connection.send(sample_request(api_table.API_VERSIONS, 3))
        first = connection.receive(api_table.PRODUCE, PRODUCE_VERSION, answered)
        assert answer_of(first) == (KafkaError.none, 0)
        assert connection.closed_by_peer()
    assert high_watermark(module_kafka_server, topic) == 2


def _bad_crc_batch() -> bytes:
    batch = bytearray(record_batch(records(1)))
    batch[-1] ^= 0xFF  # a byte of the last record's value
    return bytes(batch)


@pytest.mark.parametrize(
    ("failing", "partition", "batch"),
    [("written", 3, lambda: record_batch(records(1))), ("checked", 0, _bad_crc_batch)],
    ids=["failing-at-its-write", "refused-before-its-write"],
)
def test_nothing_sent_after_a_failing_acks_zero_produce_is_written(module_kafka_server, failing, partition, batch):
    """Regression: the Produce requests read after a failing acks=0 one were written all the same
    (pipelined, they were queued before its failure was known). Kafka's broker reads a connection's
    next request only once the current one is handled, and closes the connection on that failure:
    nothing sent after it is written. The frames go in one write, so that the broker reads them
    together; the failure comes from the write (no partition 3) or from the checks (a bad CRC)."""
    topic = f"raw-acks-zero-then-more-{failing}"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        connection.send_bytes(
            request_frame(produce_request(topic, partition, batch(), acks=0), 1)
            + request_frame(produce_request(topic, 0, record_batch(records(2)), acks=0), 2)
            + request_frame(produce_request(topic, 0, record_batch(records(3))), 3)
        )
        assert connection.closed_by_peer()
    assert high_watermark(module_kafka_server, topic) == 0


def test_a_transactional_batch_without_a_transactional_id_is_refused(module_kafka_server):
    topic = "raw-transactional-flag"
    create_topic(module_kafka_server, topic)
    builder = DefaultRecordBatchBuilder(2, 0, True, 1, 0, 0, 2**30)  # transactional, no transactional id sent
    builder.append(0, 1, None, b"v", [])
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        response = connection.call(produce_request(topic, 0, bytes(builder.build())))
    assert answer_of(response)[0] == KafkaError.invalid_record
    assert high_watermark(module_kafka_server, topic) == 0


def test_a_batch_with_a_bad_crc_is_refused_and_nothing_written(module_kafka_server):
    topic = "raw-bad-crc"
    create_topic(module_kafka_server, topic)
    batch = bytearray(record_batch(records(2)))
    batch[-1] ^= 0xFF  # a byte of the last record's value
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        response = connection.call(produce_request(topic, 0, bytes(batch)))
    assert answer_of(response)[0] == KafkaError.corrupt_message
    assert high_watermark(module_kafka_server, topic) == 0


def test_a_batch_that_does_not_decompress_is_refused_and_the_connection_kept(module_kafka_server):
    import struct

    from kafka.record.util import calc_crc32c

    topic = "raw-bad-gzip"
    create_topic(module_kafka_server, topic)
    batch = bytearray(record_batch(records(2)))
    struct.pack_into(">h", batch, 21, 1)  # attributes: gzip, though the records are not compressed
    struct.pack_into(">I", batch, 17, calc_crc32c(memoryview(batch)[21:]))
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        assert answer_of(connection.call(produce_request(topic, 0, bytes(batch))))[0] == KafkaError.corrupt_message
        assert answer_of(connection.call(produce_request(topic, 0, record_batch(records(1))))) == (KafkaError.none, 0)


def test_decompression_is_bounded(make_server):
    """A gzip batch of a few KiB that inflates beyond kafka_max_request_bytes is refused without
    being inflated; the node keeps serving."""
    server = make_server(kafka_listener="127.0.0.1:0", kafka_max_request_bytes=64 * 1024)
    create_topic(server, "raw-bomb")
    builder = DefaultRecordBatchBuilder(2, 1, False, -1, -1, -1, 2**30)  # gzip
    builder.append(0, 1, None, b"\0" * (1 << 20), [])
    bomb = bytes(builder.build())
    assert len(bomb) < 64 * 1024
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        assert answer_of(connection.call(produce_request("raw-bomb", 0, bomb)))[0] == KafkaError.corrupt_message
        small = connection.call(produce_request("raw-bomb", 0, record_batch(records(1))))
        assert answer_of(small) == (KafkaError.none, 0)
    assert high_watermark(server, "raw-bomb") == 1


def test_metadata_creates_topics_only_when_the_request_and_the_server_allow(make_server):
    def metadata(server, topic: str, allow: bool):
        answer = topic_metadata(server.extra["kafka_bootstrap"], topic, allow)
        return answer.error_code, len(answer.partitions)

    allowing = make_server(kafka_listener="127.0.0.1:0")
    assert metadata(allowing, "not-asked-to-create", allow=False) == (KafkaError.unknown_topic_or_partition, 0)
    assert metadata(allowing, "asked-to-create", allow=True) == (KafkaError.none, 1)
    refusing = make_server(kafka_listener="127.0.0.1:0", kafka_auto_create_topics=False)
    assert metadata(refusing, "server-refuses", allow=True) == (KafkaError.unknown_topic_or_partition, 0)
    assert refusing.client.get("/v1/topics/server-refuses").status_code == 404
