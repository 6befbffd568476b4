"""A connection's next Fetch read ahead (app/coordinator/fetch.py, ReadAhead): while a consumer that is
behind parses an answer, the server reads the request it sends next, and answers it from that read
when it comes. Each test makes the first answer stop short of the partition's end (a small
partition_max_bytes), so that the next fetch is read ahead, then checks that the answer is the one a
fresh read gives: what changed between the two fetches (records appended, DeleteRecords, the topic
deleted and created again, a transaction committed) shows in it, and a consumer reading the whole
log, its partitions in turn rotated as librdkafka rotates them, gets every record once and in order.
/metrics counts the fetches answered from a read made ahead, which shows the reads were taken."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import re
import time

import asyncpg
import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.coordinator import fetch as fetch_module
from app.kafka import api_table
from app.kafka.record_batches import KafkaRecord
from tests.api.test_log_lifecycle import delete_records
from tests.kafka import http_side
from tests.kafka.clients import create_topic, topic_uuid
from tests.kafka.raw import RawConnection, nested, record_batch, request_of
from tests.kafka.test_api_versions import sample_request

# Fetch by topic name (v12, the last before topic ids) and by id (v16, what librdkafka 2.x sends).
BY_NAME, BY_ID = 12, 16
READ_COMMITTED = 1
# Long enough for the read made ahead to have run before the test changes the log, well inside the
# age after which it is no longer used (READ_AHEAD_MAX_AGE_S, 0.5 s).
READ_AHEAD_SETTLES_S = 0.15


def batch_of(*values: str) -> bytes:
    return record_batch([KafkaRecord(1_700_000_000_000, None, value.encode(), []) for value in values])


def produce_batches(connection: RawConnection, topic: str, partition: int, batches: list[bytes]) -> None:
    """Each batch in a Produce of its own (acks=all), so each is stored as a batch of its own."""
    for batch in batches:
        response = connection.call(
            request_of(
                api_table.PRODUCE,
                9,
                transactional_id=None,
                acks=-1,
                timeout=datetime.timedelta(seconds=30),
                topic_data=(
                    nested(
                        api_table.PRODUCE,
                        9,
                        "TopicProduceData",
                        name=topic,
                        partition_data=(
                            nested(api_table.PRODUCE, 9, "PartitionProduceData", index=partition, records=batch),
                        ),
                    ),
                ),
            )
        )
        [[answer]] = [entry.partition_responses for entry in response.responses]
        assert answer.error_code == KafkaError.none, answer


def fetch_request(
    server, version: int, topic: str, offsets: list[tuple[int, int]], partition_max_bytes: int, isolation: int = 0
):
    """A Fetch of (partition, fetch offset) each, in that order, at most partition_max_bytes each."""
    topic_id = None
    if version >= 13:
        topic_id = topic_uuid(server.client.get(f"/v1/topics/{topic}").json()["topic_id"])
    sample = sample_request(api_table.FETCH, version, None, topic_id)
    [sample_topic] = sample.topics
    [sample_partition] = sample_topic.partitions
    partitions = tuple(
        dataclasses.replace(
            sample_partition, partition=index, fetch_offset=offset, partition_max_bytes=partition_max_bytes
        )
        for index, offset in offsets
    )
    named = {} if version >= 13 else {"topic": topic}
    return dataclasses.replace(
        sample,
        isolation_level=isolation,
        topics=(dataclasses.replace(sample_topic, partitions=partitions, **named),),
    )


def answered(response) -> dict[int, object]:
    [entry] = response.responses
    return {partition.partition_index: partition for partition in entry.partitions}


def values_of(partition) -> list[tuple[int, bytes]]:
    """(offset, value) of each data record the answer carries."""
    from kafka.record.memory_records import MemoryRecords

    records = MemoryRecords(bytes(partition.records))
    found = []
    while (batch := records.next_batch()) is not None:
        if not batch.is_control_batch:
            found += [(record.offset, record.value) for record in batch]
    return found


def counter(server, name: str) -> float:
    text = server.client.get("/metrics").text
    match = re.search(rf"^{name}_total (\S+)$", text, re.MULTILINE)
    assert match, f"{name} is missing from /metrics"
    return float(match.group(1))


def fetches_read_ahead(server) -> float:
    return counter(server, "txbroker_kafka_fetches_read_ahead")


def reads_ahead_unused(server) -> float:
    return counter(server, "txbroker_kafka_fetch_reads_ahead_unused")


@pytest.mark.parametrize("version", [BY_NAME, BY_ID])
def test_a_consumer_behind_reads_every_record_once_in_order_its_partitions_rotated(module_kafka_server, version):
    server = module_kafka_server
    topic = f"read-ahead-rotated-v{version}"
    create_topic(server, topic, 2)
    batches = {p: [batch_of(f"p{p}-{i}") for i in range(6)] for p in (0, 1)}
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        for partition in (0, 1):
            produce_batches(connection, topic, partition, batches[partition])
        # Room for one batch of each partition per answer, not two: every answer but the last
        # leaves the consumer behind in both.
        one_batch = len(batches[0][0]) + 8
        read_ahead_before = fetches_read_ahead(server)
        offsets = {0: 0, 1: 0}
        seen: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
        order = [0, 1]
        for _ in range(12):
            if offsets == {0: 6, 1: 6}:
                break
            response = connection.call(
                fetch_request(server, version, topic, [(p, offsets[p]) for p in order], one_batch)
            )
            [entry] = response.responses
            assert [p.partition_index for p in entry.partitions] == order, "answered in the order asked, as Kafka"
            for partition, answer in answered(response).items():
                assert answer.error_code == KafkaError.none, answer
                assert answer.high_watermark == 6
                values = values_of(answer)
                assert len(values) <= 1, "one batch per partition fits"
                seen[partition] += values
                offsets[partition] += len(values)
            order.reverse()  # as librdkafka rotates the partitions of its Fetch requests
    expected = {p: [(i, f"p{p}-{i}".encode()) for i in range(6)] for p in (0, 1)}
    assert seen == expected
    # Six answers; the five after the first were read ahead, in the other order than asked.
    assert fetches_read_ahead(server) - read_ahead_before == 5


# Room for one of the tests' batches (values of at most 8 characters) but not two.
ONE_BATCH = len(batch_of("12345678")) + 8


def fetch_one_batch(server, connection, topic: str, offset: int, version: int = BY_ID, isolation: int = 0):
    """Partition 0 of `topic` from `offset`, with room for one batch."""
    return answered(connection.call(fetch_request(server, version, topic, [(0, offset)], ONE_BATCH, isolation)))[0]


def behind_after_a_first_fetch(server, connection, topic: str, values: list[str], **fetch) -> object:
    """Creates `topic`, produces each value as a batch of its own to partition 0, and fetches the
    first: the answer leaves the consumer behind, so the server reads the next fetch ahead, which
    has run by the time this returns. Returns the first answer."""
    create_topic(server, topic, 1)
    produce_batches(connection, topic, 0, [batch_of(value) for value in values])
    first = fetch_one_batch(server, connection, topic, 0, **fetch)
    assert values_of(first) == [(0, values[0].encode())]
    time.sleep(READ_AHEAD_SETTLES_S)
    return first


def test_records_appended_since_the_read_ahead_raise_the_answers_high_watermark(module_kafka_server):
    server = module_kafka_server
    topic = "read-ahead-high-watermark"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        first = behind_after_a_first_fetch(server, connection, topic, ["v0", "v1", "v2"])
        assert first.high_watermark == 3
        produce_batches(connection, topic, 0, [batch_of("v3")])
        read_ahead_before = fetches_read_ahead(server)
        second = fetch_one_batch(server, connection, topic, 1)
    assert fetches_read_ahead(server) - read_ahead_before == 1
    assert values_of(second) == [(1, b"v1")]
    assert second.high_watermark == 4, "the high watermark of the log as it is when answered"


def test_delete_records_past_the_fetch_offset_since_the_read_ahead_is_out_of_range(module_kafka_server):
    """Regression guard: the batches read ahead are of offsets DeleteRecords has removed since;
    answering them would show deleted records. The fetch is read afresh: OFFSET_OUT_OF_RANGE."""
    server = module_kafka_server
    topic = "read-ahead-delete-records"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        behind_after_a_first_fetch(server, connection, topic, ["v0", "v1", "v2", "v3"])
        assert delete_records(server.client, topic, {0: 3}).status_code == 200
        second = fetch_one_batch(server, connection, topic, 1)
    assert second.error_code == KafkaError.offset_out_of_range
    assert values_of(second) == []


def test_a_topic_deleted_and_created_again_since_the_read_ahead_is_read_afresh(module_kafka_server):
    """Regression guard: fetched by name, the new topic's records are answered, never the old one's
    read ahead."""
    server = module_kafka_server
    topic = "read-ahead-recreated"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        behind_after_a_first_fetch(server, connection, topic, ["old-0", "old-1", "old-2"], version=BY_NAME)
        assert server.client.delete(f"/v1/topics/{topic}").status_code in (200, 204)
        create_topic(server, topic, 1)
        produce_batches(connection, topic, 0, [batch_of(f"new-{i}") for i in range(3)])
        second = fetch_one_batch(server, connection, topic, 1, version=BY_NAME)
    assert second.error_code == KafkaError.none
    assert values_of(second) == [(1, b"new-1")]


def test_read_committed_a_transaction_committed_since_the_read_ahead_raises_the_last_stable_offset(
    module_kafka_server,
):
    server = module_kafka_server
    topic = "read-ahead-read-committed"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        create_topic(server, topic, 1)
        produce_batches(connection, topic, 0, [batch_of(f"v{i}") for i in range(3)])
        transaction = http_side.HttpTransaction(server, "read-ahead-txn")
        transaction.produce(topic, 0, ["open"])
        first = fetch_one_batch(server, connection, topic, 0, isolation=READ_COMMITTED)
        assert (values_of(first), first.last_stable_offset) == ([(0, b"v0")], 3)
        time.sleep(READ_AHEAD_SETTLES_S)
        transaction.end(committed=True)
        second = fetch_one_batch(server, connection, topic, 1, isolation=READ_COMMITTED)
    assert values_of(second) == [(1, b"v1")]
    assert second.last_stable_offset == 5, "the open transaction's record and its marker are below it now"


def test_a_read_ahead_short_of_min_bytes_waits_as_a_fresh_fetch_and_is_not_counted(module_kafka_server):
    """Regression: a fetch asking what was read ahead, but for more bytes (min_bytes) than it holds,
    long-polls as a fresh fetch does and is answered from the reads of its wait, not from the read
    ahead: /metrics did count it among the fetches answered from a read made ahead."""
    server = module_kafka_server
    topic = "read-ahead-min-bytes"
    max_wait_ms = 300
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        behind_after_a_first_fetch(server, connection, topic, ["v0", "v1", "v2"])
        read_ahead_before = fetches_read_ahead(server)
        request = dataclasses.replace(
            fetch_request(server, BY_ID, topic, [(0, 1)], ONE_BATCH),
            min_bytes=10 * ONE_BATCH,
            max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        )
        started = time.monotonic()
        second = answered(connection.call(request))[0]
        waited_s = time.monotonic() - started
    assert values_of(second) == [(1, b"v1")]
    assert waited_s >= max_wait_ms / 1000 * 0.9, "min_bytes not reached: answered once max_wait has passed"
    assert fetches_read_ahead(server) - read_ahead_before == 0


def test_a_negative_partition_max_bytes_leaves_the_fetch_limit_binding_in_the_order_asked(module_kafka_server):
    """Regression: the partitions' limits added up to at most max_bytes only thanks to a negative
    partition_max_bytes (a partition that takes nothing, having nothing to read), so the fetch's
    max_bytes did cut the others' and their order mattered; the read made in the first order
    answered the rotated fetch, not what a fresh read of it gives."""
    server = module_kafka_server
    topic = "read-ahead-negative-limit"
    create_topic(server, topic, 3)
    one_batch = len(batch_of("v1-0"))
    # Partition 0 is empty, 1 and 2 have eight batches each: room for two of a partition's, three in all.
    limits = {0: -1000, 1: 2 * one_batch + 10, 2: 2 * one_batch + 10}

    def fetch_in(order: list[tuple[int, int]]):
        request = fetch_request(server, BY_NAME, topic, order, 0)
        [asked] = request.topics
        partitions = tuple(
            dataclasses.replace(partition, partition_max_bytes=limits[partition.partition])
            for partition in asked.partitions
        )
        return dataclasses.replace(
            request, max_bytes=3 * one_batch + 20, topics=(dataclasses.replace(asked, partitions=partitions),)
        )

    def read(answer) -> dict[int, list[tuple[int, bytes]]]:
        return {partition: values_of(data) for partition, data in answered(answer).items()}

    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        for partition in (1, 2):
            produce_batches(connection, topic, partition, [batch_of(f"v{partition}-{i}") for i in range(8)])
        first = read(connection.call(fetch_in([(0, 0), (1, 0), (2, 0)])))
        assert [len(first[partition]) for partition in (0, 1, 2)] == [0, 2, 1]
        time.sleep(READ_AHEAD_SETTLES_S)
        rotated = fetch_in([(0, 0), (2, 1), (1, 2)])
        second = read(connection.call(rotated))
    with RawConnection(server.extra["kafka_bootstrap"]) as fresh_connection:
        fresh = read(fresh_connection.call(rotated))
    assert fresh == {0: [], 2: [(1, b"v2-1"), (2, b"v2-2")], 1: [(2, b"v1-2")]}
    assert second == fresh


async def _until_waiting_for_locks(observer: asyncpg.Connection, count: int) -> None:
    """Returns once `count` sessions of the database wait for a lock."""
    deadline = time.monotonic() + 30
    waiting_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while await observer.fetchval(waiting_sql) < count:
        assert time.monotonic() < deadline, f"expected {count} sessions waiting for a lock"
        await asyncio.sleep(0.02)


def test_a_topic_created_again_before_the_read_ahead_ran_is_read_afresh(make_server, database_url, monkeypatch):
    """Regression: the topic was deleted and created again under its name after the answer before,
    but before the read made ahead ran (it waited for a connection of the node's pool): that read met
    the new, empty topic and answered OFFSET_OUT_OF_RANGE; with records produced to the new topic
    since, the fetch took that error, beside a high watermark above its offset, where a fresh read
    answers the records (a consumer resetting its offset to the latest would skip them).

    The node's pool has one connection, and sessions of the test order the reads: the first fetch's
    read waits for a table lock while a DeleteRecords queues for the pool; the DeleteRecords then
    holds the connection, waiting for a row lock, while the read ahead waits for it and the topic is
    deleted and created again through another node."""
    # The steps take longer than a consumer takes to ask again: the read ahead must still be taken.
    monkeypatch.setattr(fetch_module, "READ_AHEAD_MAX_AGE_S", 60)
    server = make_server(kafka_listener="127.0.0.1:0", database_pool_size=1)
    other_node = make_server()
    topic, held_topic = "read-ahead-created-again", "read-ahead-holds-the-pool"
    create_topic(server, topic, 1)
    create_topic(server, held_topic, 1)

    async def run(connection: RawConnection) -> object:
        row_holder = await asyncpg.connect(database_url)
        table_holder = await asyncpg.connect(database_url)
        try:
            await row_holder.execute("BEGIN")
            await row_holder.execute(
                "SELECT 1 FROM partitions p JOIN topics t USING (topic_id) WHERE t.name = $1 FOR UPDATE OF p",
                held_topic,
            )
            await table_holder.execute("BEGIN")
            await table_holder.execute("LOCK TABLE record_batches IN ACCESS EXCLUSIVE MODE")
            first = asyncio.create_task(asyncio.to_thread(fetch_one_batch, server, connection, topic, 0, BY_NAME))
            await _until_waiting_for_locks(table_holder, 1)  # the first fetch's read
            holding_the_pool = asyncio.create_task(asyncio.to_thread(delete_records, server.client, held_topic, {0: 0}))
            await asyncio.sleep(0.5)  # queued for the pool's connection, before the read ahead
            await table_holder.execute("COMMIT")
            first_answer = await first
            await _until_waiting_for_locks(table_holder, 1)  # the DeleteRecords, holding the connection
            assert other_node.client.delete(f"/v1/topics/{topic}").status_code in (200, 204)
            create_topic(other_node, topic, 1)
            await row_holder.execute("COMMIT")
            assert (await holding_the_pool).status_code == 200
            await asyncio.sleep(0.3)  # the read ahead has read the new topic, empty
            return first_answer
        finally:
            await row_holder.close()
            await table_holder.close()

    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        produce_batches(connection, topic, 0, [batch_of(f"old-{i}") for i in range(3)])
        first = asyncio.run(run(connection))
        assert values_of(first) == [(0, b"old-0")]
        produce_batches(connection, topic, 0, [batch_of(f"new-{i}") for i in range(3)])
        second = fetch_one_batch(server, connection, topic, 1, BY_NAME)
    assert second.error_code == KafkaError.none, second
    assert values_of(second) == [(1, b"new-1")]


def test_a_client_whose_next_request_never_matches_pauses_the_read_ahead(module_kafka_server):
    """Java's consumer and kafka-python's fetch only the partitions whose records they have drained,
    so their next request is never the one read ahead: after two reads dropped unused the connection
    reads ahead no more for a while, rather than reading every answer twice."""
    server = module_kafka_server
    topic = "read-ahead-subsets"
    create_topic(server, topic, 2)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        for partition in (0, 1):
            produce_batches(connection, topic, partition, [batch_of(f"p{partition}-{i}") for i in range(8)])
        unused_before = reads_ahead_unused(server)
        offsets = {0: 0, 1: 0}
        # Both partitions, then one at a time, as a Java consumer that drained one of them asks.
        asked = [[0, 1], [0], [1], [0], [1], [0], [1]]
        for partitions in asked:
            response = connection.call(
                fetch_request(server, BY_ID, topic, [(p, offsets[p]) for p in partitions], ONE_BATCH)
            )
            for partition, answer in answered(response).items():
                assert answer.error_code == KafkaError.none, answer
                values = values_of(answer)
                assert values == [(offsets[partition], f"p{partition}-{offsets[partition]}".encode())]
                offsets[partition] += 1
    assert reads_ahead_unused(server) - unused_before == 2, "two reads dropped, then none read ahead"


def test_a_read_ahead_no_fetch_takes_is_dropped_after_its_age(module_kafka_server):
    """A consumer that stops asking (paused, or slower than READ_AHEAD_MAX_AGE_S) leaves no read
    held: it is dropped at that age, not at the connection's next Fetch or its end."""
    server = module_kafka_server
    topic = "read-ahead-dropped"
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        unused_before = reads_ahead_unused(server)
        behind_after_a_first_fetch(server, connection, topic, ["v0", "v1", "v2"])
        assert reads_ahead_unused(server) == unused_before, "held, not yet dropped"
        time.sleep(fetch_module.READ_AHEAD_MAX_AGE_S + 0.3)
        assert reads_ahead_unused(server) - unused_before == 1
        later = fetch_one_batch(server, connection, topic, 1)
    assert values_of(later) == [(1, b"v1")]


def test_batches_read_ahead_past_a_high_watermark_that_went_down_are_read_afresh(make_server, database_url):
    """Regression guard: should a partition's high watermark go down between the read ahead and the
    fetch that takes it (a failover to a PostgreSQL standby that had not received the last commits:
    simulated here by removing the last batches and lowering the partition's high watermark), the
    records read ahead past it are not answered: the fetch is read afresh."""
    server = make_server(kafka_listener="127.0.0.1:0")
    topic = "read-ahead-lost-commits"

    async def lose_commits_after(offset: int) -> None:
        conn = await asyncpg.connect(database_url)
        try:
            async with conn.transaction():
                topic_id = await conn.fetchval("SELECT topic_id FROM topics WHERE name = $1", topic)
                await conn.execute(
                    "DELETE FROM record_batches WHERE topic_id = $1 AND partition = 0 AND base_offset >= $2",
                    topic_id,
                    offset,
                )
                await conn.execute(
                    "UPDATE partitions SET high_watermark = $2 WHERE topic_id = $1 AND partition = 0", topic_id, offset
                )
        finally:
            await conn.close()

    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        behind_after_a_first_fetch(server, connection, topic, ["v0", "v1", "v2"])
        asyncio.run(lose_commits_after(1))
        second = fetch_one_batch(server, connection, topic, 1)
    assert second.error_code == KafkaError.none, second
    assert (values_of(second), second.high_watermark) == ([], 1)
