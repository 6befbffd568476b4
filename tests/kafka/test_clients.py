"""The real clients, unmodified, against the Kafka listener, each test with each client
(confluent-kafka / librdkafka 2.x, kafka-python, aiokafka): produce (idempotent or not, acks=all and
acks=0, every codec, headers, exact timestamps, nulls, the client's own partitioner), consume by
assign + seek under both isolation levels against transactions written over HTTP, and records
crossing the two doors byte for byte."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.api.test_log_lifecycle import delete_records
from tests.kafka import http_side
from tests.kafka.clients import CLIENTS, WAIT_S, ConfluentKafka, Received, create_topic, sendable
from txbroker.wire import partition_for_key

BINARY = bytes(range(256))  # not UTF-8: stored in the base64 form


@pytest.fixture(params=CLIENTS, ids=[client.name for client in CLIENTS])
def client(request):
    return request.param


def topic_for(client, name: str) -> str:
    return f"{name}-{client.name}"


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_produce_and_consume_keep_every_field(module_kafka_server, client, idempotent):
    topic = topic_for(client, f"fields-{idempotent}")
    create_topic(module_kafka_server, topic)
    sent = [
        {"key": b"k1", "value": b"v1", "headers": [("h1", b"x"), ("h2", None), ("h1", b"again")], "timestamp": 1},
        {"key": None, "value": b"null key", "timestamp": 1_700_000_000_123},
        {"key": b"null value", "value": None, "timestamp": 1_700_000_000_124},
        {"key": None, "value": None, "timestamp": 1_700_000_000_125},
        {"key": BINARY, "value": BINARY, "headers": [("bin", BINARY)], "timestamp": 2**41 + 7},
        {"key": "ünïcode".encode(), "value": "välue €".encode(), "timestamp": 1_700_000_000_999},
    ]
    sent = sendable(client, sent)
    delivered = client.produce(module_kafka_server, topic, sent, idempotent=idempotent, acks="all")
    assert [d.offset for d in delivered] == list(range(len(sent)))
    assert client.consume(module_kafka_server, topic, 0, len(sent)) == [
        Received(offset, m["key"], m["value"], m.get("headers", []), m["timestamp"]) for offset, m in enumerate(sent)
    ]


def test_acks_zero_writes_without_answers(module_kafka_server, client):
    topic = topic_for(client, "acks-zero")
    create_topic(module_kafka_server, topic)
    sent = [{"value": f"fire-and-forget-{i}".encode()} for i in range(20)]
    client.produce(module_kafka_server, topic, sent, idempotent=False, acks=0)
    received = client.consume(module_kafka_server, topic, 0, len(sent))
    assert [r.value for r in received] == [m["value"] for m in sent]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_each_compression_codec(module_kafka_server, client, codec):
    topic = topic_for(client, f"codec-{codec}")
    create_topic(module_kafka_server, topic)
    sent = [{"key": f"key-{i % 3}".encode(), "value": b"compressible " * 50 + str(i).encode()} for i in range(200)]
    client.produce(module_kafka_server, topic, sent, compression=codec)
    received = client.consume(module_kafka_server, topic, 0, len(sent))
    assert [(r.key, r.value) for r in received] == [(m["key"], m["value"]) for m in sent]


def test_the_clients_partitioner_decides_and_the_records_are_where_it_said(module_kafka_server, client):
    topic, partitions = topic_for(client, "partitioner"), 6
    create_topic(module_kafka_server, topic, partitions)
    sent = [{"key": f"customer-{i}".encode(), "value": str(i).encode()} for i in range(60)]
    delivered = client.produce(module_kafka_server, topic, sent)
    if not isinstance(client, ConfluentKafka):  # librdkafka's default is its own (consistent_random)
        # the Java client's murmur2, which the HTTP door's records endpoint follows too
        assert [d.partition for d in delivered] == [partition_for_key(m["key"], partitions) for m in sent]
    assert sorted(d.value for d in delivered) == sorted(m["value"] for m in sent)
    by_partition: dict[int, list] = {}
    for where in sorted(delivered, key=lambda d: (d.partition, d.offset)):
        by_partition.setdefault(where.partition, []).append(where.value)
    assert len(by_partition) > 1
    for partition, values in by_partition.items():
        assert [r.value for r in client.consume(module_kafka_server, topic, partition, len(values))] == values


def test_kafka_records_read_back_over_http_byte_for_byte(module_kafka_server, client):
    topic = topic_for(client, "kafka-to-http")
    create_topic(module_kafka_server, topic)
    sent = [
        {"key": BINARY, "value": b"text", "headers": [("h", BINARY)], "timestamp": 1_600_000_000_001},
        {"key": None, "value": "plain ütf-8".encode(), "headers": [("empty", b""), ("null", None)], "timestamp": 5},
        {"key": b"", "value": None, "timestamp": 6},
    ]
    sent = sendable(client, sent)
    client.produce(module_kafka_server, topic, sent)
    records = http_side.fetch(module_kafka_server, topic, 0)
    assert [
        (
            r["offset"],
            http_side.unb64(r["key"]),
            http_side.unb64(r["value"]),
            [(h["key"], http_side.unb64(h["value"])) for h in r["headers"]],
            r["timestamp_ms"],
        )
        for r in records
    ] == [(offset, m["key"], m["value"], m.get("headers", []), m["timestamp"]) for offset, m in enumerate(sent)]


def test_http_records_read_back_over_kafka_byte_for_byte(module_kafka_server, client):
    topic = topic_for(client, "http-to-kafka")
    create_topic(module_kafka_server, topic)
    http_side.produce(
        module_kafka_server,
        topic,
        0,
        [
            {
                "key": http_side.b64(BINARY),
                "value": http_side.b64(b"v"),
                "headers": [{"key": "h", "value": http_side.b64(BINARY)}],
                "timestamp_ms": 1_234_567_890_123,
            },
            {"key": None, "value": None, "headers": [{"key": "n", "value": None}], "timestamp_ms": 7},
        ],
        encoding="base64",
    )
    http_side.produce(
        module_kafka_server, topic, 0, [{"key": "clé", "value": "välue", "timestamp_ms": 1_700_000_000_000}]
    )
    assert client.consume(module_kafka_server, topic, 0, 3) == [
        Received(0, BINARY, b"v", [("h", BINARY)], 1_234_567_890_123),
        Received(1, None, None, [("n", None)], 7),
        Received(2, "clé".encode(), "välue".encode(), [], 1_700_000_000_000),
    ]


def test_isolation_levels_against_http_transactions(module_kafka_server, client):
    """An aborted transaction is never seen by read_committed, and no marker surfaces at either
    level; an open transaction holds read_committed at its first offset (the last stable offset)."""
    topic = topic_for(client, "isolation")
    create_topic(module_kafka_server, topic)

    def offsets_and_values(count, offset=0, isolation="read_uncommitted"):
        return [(r.offset, r.value) for r in client.consume(module_kafka_server, topic, 0, count, offset, isolation)]

    http_side.produce(module_kafka_server, topic, 0, [{"value": "before"}])
    aborted = http_side.HttpTransaction(module_kafka_server, f"{topic}-aborted")
    aborted.produce(topic, 0, ["aborted-1", "aborted-2"])
    aborted.end(committed=False)
    committed = http_side.HttpTransaction(module_kafka_server, f"{topic}-committed")
    committed.produce(topic, 0, ["committed-1"])
    committed.produce(topic, 0, ["committed-2"])
    committed.end(committed=True)
    http_side.produce(module_kafka_server, topic, 0, [{"value": "after"}])
    # offsets: before 0, aborted 1-2, ABORT marker 3, committed 4-5, COMMIT marker 6, after 7
    assert offsets_and_values(4, isolation="read_committed") == [
        (0, b"before"),
        (4, b"committed-1"),
        (5, b"committed-2"),
        (7, b"after"),
    ]
    assert offsets_and_values(6) == [
        (0, b"before"),
        (1, b"aborted-1"),
        (2, b"aborted-2"),
        (4, b"committed-1"),
        (5, b"committed-2"),
        (7, b"after"),
    ]
    # From inside the aborted transaction: the client still learns it is aborted.
    assert offsets_and_values(3, offset=2, isolation="read_committed") == [
        (4, b"committed-1"),
        (5, b"committed-2"),
        (7, b"after"),
    ]

    still_open = http_side.HttpTransaction(module_kafka_server, f"{topic}-open")
    still_open.produce(topic, 0, ["open-1"])  # offset 8: the last stable offset while open
    http_side.produce(module_kafka_server, topic, 0, [{"value": "after-open"}])
    assert offsets_and_values(0, offset=8, isolation="read_committed") == []
    assert offsets_and_values(2, offset=8) == [(8, b"open-1"), (9, b"after-open")]
    still_open.end(committed=True)
    assert offsets_and_values(2, offset=8, isolation="read_committed") == [(8, b"open-1"), (9, b"after-open")]


def test_list_offsets_earliest_latest_and_by_time(module_kafka_server):
    topic = "list-offsets"
    create_topic(module_kafka_server, topic)
    ConfluentKafka().produce(
        module_kafka_server, topic, [{"value": str(i).encode(), "timestamp": 1000 * (i + 1)} for i in range(5)]
    )
    consumer = Consumer({"bootstrap.servers": module_kafka_server.extra["kafka_bootstrap"], "group.id": "unused"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT_S) == (0, 5)
        found = consumer.offsets_for_times([TopicPartition(topic, 0, 2500)], timeout=WAIT_S)
        assert found[0].offset == 2  # the first record at or after 2500 ms is the third
        found = consumer.offsets_for_times([TopicPartition(topic, 0, 10_000)], timeout=WAIT_S)
        assert found[0].offset == -1  # none that late: Kafka answers -1
    finally:
        consumer.close()


def test_list_offsets_max_timestamp_is_the_first_record_of_the_greatest_time(module_kafka_server):
    """Kafka's max timestamp (ListOffsets v7, KIP-734), with confluent-kafka's admin client: the
    record with the greatest timestamp, the first of several in log order, over batches written by
    both doors; within the log start (DeleteRecords moves it past the first such record)."""
    topic = "list-offsets-max-timestamp"
    create_topic(module_kafka_server, topic)
    ConfluentKafka().produce(
        module_kafka_server,
        topic,
        [{"value": b"v", "timestamp": t} for t in (3000, 9000, 2000, 9000, 5000)],  # offsets 0-4
    )
    http_side.produce(module_kafka_server, topic, 0, [{"value": "late", "timestamp_ms": 9000}])  # offset 5
    admin = AdminClient({"bootstrap.servers": module_kafka_server.extra["kafka_bootstrap"]})

    def max_timestamp() -> tuple[int, int]:
        partition = TopicPartition(topic, 0)
        listed = admin.list_offsets({partition: OffsetSpec.max_timestamp()})[partition].result(WAIT_S)
        return listed.offset, listed.timestamp

    assert max_timestamp() == (1, 9000)
    assert delete_records(module_kafka_server.client, topic, {0: 2}).status_code == 200
    assert max_timestamp() == (3, 9000)
    assert delete_records(module_kafka_server.client, topic, {0: 4}).status_code == 200
    assert max_timestamp() == (5, 9000)  # the batch written over HTTP


def test_list_offsets_max_timestamp_under_read_committed_is_none_when_past_the_lso(module_kafka_server):
    """As Kafka's broker (Partition.fetchOffsetForTimestamp, then ReplicaManager): the max timestamp is
    the whole log's, and a read_committed ListOffsets answers it only below the last stable offset,
    else offset -1 and timestamp -1 without an error; it does not look for the greatest timestamp
    below the LSO instead."""
    topic = "list-offsets-max-timestamp-read-committed"
    create_topic(module_kafka_server, topic)
    ConfluentKafka().produce(
        module_kafka_server, topic, [{"value": b"v", "timestamp": t} for t in (3000, 5000)]
    )  # offsets 0, 1
    producer = Producer(
        {"bootstrap.servers": module_kafka_server.extra["kafka_bootstrap"], "transactional.id": "max-timestamp-lso"}
    )
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0, timestamp=9000)  # offset 2, its transaction open
    assert producer.flush(WAIT_S) == 0
    admin = AdminClient({"bootstrap.servers": module_kafka_server.extra["kafka_bootstrap"]})

    def max_timestamp(isolation_level: IsolationLevel) -> tuple[int, int]:
        partition = TopicPartition(topic, 0)
        futures = admin.list_offsets({partition: OffsetSpec.max_timestamp()}, isolation_level=isolation_level)
        listed = futures[partition].result(WAIT_S)
        return listed.offset, listed.timestamp

    assert max_timestamp(IsolationLevel.READ_UNCOMMITTED) == (2, 9000)
    assert max_timestamp(IsolationLevel.READ_COMMITTED) == (-1, -1)
    producer.commit_transaction(WAIT_S)
    assert max_timestamp(IsolationLevel.READ_COMMITTED) == (2, 9000)


def test_a_topic_is_created_when_a_producer_names_it(module_kafka_server, client):
    topic = topic_for(client, "auto-created")
    delivered = client.produce(module_kafka_server, topic, [{"value": b"first"}])
    assert delivered[0].offset == 0
    described = module_kafka_server.client.get(f"/v1/topics/{topic}")
    assert described.status_code == 200 and len(described.json()["partitions"]) == 1


def test_consecutive_aborted_transactions_of_one_producer_stay_hidden(module_kafka_server, client):
    """Each aborted transaction is listed on its own, even when one producer aborted several in a
    row: a client forgets a producer's abort at its marker, so one entry for two transactions would
    let the second one's records through."""
    topic = topic_for(client, "aborted-twice")
    create_topic(module_kafka_server, topic)
    transactional_id = f"{topic}-producer"
    for attempt in range(3):
        transaction = http_side.HttpTransaction(module_kafka_server, transactional_id)
        transaction.produce(topic, 0, [f"aborted-{attempt}"])
        transaction.end(committed=False)
    http_side.produce(module_kafka_server, topic, 0, [{"value": "visible"}])
    received = client.consume(module_kafka_server, topic, 0, 1, isolation="read_committed")
    assert [(r.offset, r.value) for r in received] == [(6, b"visible")]
