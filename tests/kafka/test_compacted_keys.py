"""A compacted topic refuses records without a key, as Kafka's LogValidator does: compaction keeps
the latest record per key, and a keyless record has none. The whole batch is refused,
INVALID_RECORD, nothing of it written; over Kafka the response names the keyless records
(record_errors), so a client fails them with INVALID_RECORD and the rest of their batch with an
error of its own (librdkafka's 0011 counts both). Over HTTP, the partition's error."""

from __future__ import annotations

from confluent_kafka import Producer
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka.record_batches import KafkaRecord
from tests.kafka.clients import WAIT_S, bootstrap
from tests.kafka.raw import RawConnection, record_batch
from tests.kafka.test_produce_raw import high_watermark, produce_request


def compacted_topic(server, name: str) -> None:
    response = server.client.post("/v1/topics", json={"name": name, "config": {"cleanup_policy": "compact"}})
    assert response.status_code == 201, response.text


def test_a_batch_with_keyless_records_is_refused_naming_them(module_kafka_server):
    topic = "compacted-raw"
    compacted_topic(module_kafka_server, topic)
    keys = [b"k0", None, b"k2", None]
    batch = record_batch([KafkaRecord(1_700_000_000_000, key, b"v", []) for key in keys])
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        [answer] = connection.call(produce_request(topic, 0, batch)).responses[0].partition_responses
        assert answer.error_code == KafkaError.invalid_record
        assert [error.batch_index for error in answer.record_errors] == [1, 3]
        keyed = record_batch([KafkaRecord(1_700_000_000_000, b"k", b"v", [])])
        [answer] = connection.call(produce_request(topic, 0, keyed)).responses[0].partition_responses
        assert (answer.error_code, answer.base_offset) == (KafkaError.none, 0)
    assert high_watermark(module_kafka_server, topic) == 1


def test_confluent_kafka_gets_invalid_record_for_a_keyless_record(module_kafka_server):
    topic = "compacted-confluent"
    compacted_topic(module_kafka_server, topic)
    producer = Producer({"bootstrap.servers": bootstrap(module_kafka_server), "linger.ms": 0})
    reports = {}

    def delivered(error, message):
        reports[message.key()] = None if error is None else error.name()

    producer.produce(topic, value=b"no key", partition=0, on_delivery=delivered)
    producer.flush(WAIT_S)
    producer.produce(topic, key=b"key", value=b"keyed", partition=0, on_delivery=delivered)
    producer.flush(WAIT_S)
    assert reports == {None: "INVALID_RECORD", b"key": None}


def test_http_produce_of_a_keyless_record_to_a_compacted_topic_is_refused(module_kafka_server):
    topic = "compacted-http"
    compacted_topic(module_kafka_server, topic)
    records = [{"key": "k", "value": "a"}, {"key": None, "value": "b"}]
    body = {"encoding": "utf8", "partitions": [{"topic": topic, "partition": 0, "records": records}]}
    response = module_kafka_server.client.post("/v1/produce", json=body)
    assert response.status_code == 200, response.text
    [entry] = response.json()["partitions"]
    assert entry["error"]["code"] == "INVALID_RECORD", entry
    assert high_watermark(module_kafka_server, topic) == 0
