"""DescribeLogDirs (35): one log dir, "postgresql", holding every partition, each with its stored
bytes as retention by size counts them (a batch produced over HTTP: its records' keys, values and
headers; one produced over Kafka: the stored RecordBatch's length; a marker: its control batch's;
from the log start on), no lag, no future replica. With kafka-python's `describe_log_dirs`, and each
version raw; the Cluster ACL it needs: test_security.py."""

from __future__ import annotations

import pytest
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.record_batches import KafkaRecord
from app.storage.log.partition_log import MARKER_BATCH_BYTES
from tests.api.test_transactions import TxnProducer
from tests.kafka.clients import bootstrap, create_topic
from tests.kafka.http_side import produce
from tests.kafka.raw import RawConnection, nested, record_batch, request_of
from tests.kafka.test_produce_raw import answer_of, produce_request

TOPIC = "log-dirs"
VERSIONS = list(api_table.SUPPORTED_VERSIONS[api_table.DESCRIBE_LOG_DIRS])
# Produced over HTTP to partition 0, one batch: keys and values of 2 + 4 and 2 + 2 bytes.
HTTP_RECORDS = [{"key": "ab", "value": "cdef"}, {"key": "gh", "value": "ij"}]
HTTP_BYTES = 10
KAFKA_BATCH = record_batch([KafkaRecord(1_700_000_000_000, b"key", b"value", [("h", b"x")])])


@pytest.fixture(scope="module")
def server(module_kafka_server):
    create_topic(module_kafka_server, TOPIC, 3)
    produce(module_kafka_server, TOPIC, 0, HTTP_RECORDS)
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        assert answer_of(connection.call(produce_request(TOPIC, 1, KAFKA_BATCH)))[0] == KafkaError.none
    return module_kafka_server


def sizes_of(log_dir: dict) -> dict[tuple[str, int], tuple[int, int, bool]]:
    """(partition_size, offset_lag, is_future_key) by (topic, partition) of a log dir kafka-python described."""
    return {
        (topic["name"], p["partition_index"]): (p["partition_size"], p["offset_lag"], p["is_future_key"])
        for topic in log_dir["topics"]
        for p in topic["partitions"]
    }


def kafka_python_log_dir(server, asked=None) -> dict:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    try:
        (broker,) = admin.describe_log_dirs(asked)
    finally:
        admin.close()
    (log_dir,) = broker["log_dirs"]
    assert (log_dir["error_code"], log_dir["log_dir"]) == (0, "postgresql")
    return log_dir


def test_kafka_python_describes_each_partitions_stored_bytes(server):
    every = sizes_of(kafka_python_log_dir(server))
    assert {key: size for key, size in every.items() if key[0] == TOPIC} == {
        (TOPIC, 0): (HTTP_BYTES, 0, False),
        (TOPIC, 1): (len(KAFKA_BATCH), 0, False),
        (TOPIC, 2): (0, 0, False),
    }
    # Only the partitions asked for that exist.
    asked = sizes_of(kafka_python_log_dir(server, {TOPIC: [1, 7], "no-such-topic": [0]}))
    assert asked == {(TOPIC, 1): (len(KAFKA_BATCH), 0, False)}


def test_the_size_is_what_retention_counts_from_the_log_start(server):
    """A batch the log start has passed in part still counts; one wholly below it does not."""
    topic = "log-dirs-deleted"
    create_topic(server, topic)
    produce(server, topic, 0, HTTP_RECORDS)
    produce(server, topic, 0, HTTP_RECORDS[:1])
    for offset, expected in ((1, HTTP_BYTES + 6), (2, 6), (3, 0)):
        moved = server.client.post(
            f"/v1/topics/{topic}/delete-records", json={"partitions": [{"partition": 0, "offset": offset}]}
        )
        assert moved.status_code == 200, moved.text
        assert sizes_of(kafka_python_log_dir(server, {topic: [0]})) == {(topic, 0): (expected, 0, False)}


def test_a_marker_counts_as_the_control_batch_it_is(server):
    """As Kafka's log size counts a transaction's marker (a control batch) like any batch."""
    topic = "log-dirs-markers"
    create_topic(server, topic)
    writer = TxnProducer(server.client, "log-dirs-writer")
    writer.init()
    writer.send(topic, 0, "committed")  # 9 bytes
    writer.commit()
    assert sizes_of(kafka_python_log_dir(server, {topic: [0]})) == {(topic, 0): (9 + MARKER_BATCH_BYTES, 0, False)}


@pytest.mark.parametrize("version", VERSIONS)
def test_each_version_answers_the_partitions_asked(server, version):
    with RawConnection(bootstrap(server)) as connection:
        asked = (
            nested(api_table.DESCRIBE_LOG_DIRS, version, "DescribableLogDirTopic", topic=TOPIC, partitions=(0, 2)),
        )
        response = connection.call(request_of(api_table.DESCRIBE_LOG_DIRS, version, topics=asked))
    assert getattr(response, "error_code", KafkaError.none) == KafkaError.none
    (result,) = response.results
    assert (result.error_code, result.log_dir) == (KafkaError.none, "postgresql")
    assert getattr(result, "total_bytes", -1) == getattr(result, "usable_bytes", -1) == -1  # v4+: unknown
    assert not getattr(result, "is_cordoned", False)
    assert [
        (t.name, [(p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) for p in t.partitions])
        for t in result.topics
    ] == [(TOPIC, [(0, HTTP_BYTES, 0, False), (2, 0, 0, False)])]
