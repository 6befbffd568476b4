"""Produce v5+'s `log_start_offset`: Kafka's leader answers every appended batch with its
partition's log start offset at the append (ReplicaManager: the LogAppendInfo's), a retried
duplicate too; aiokafka hands it to the application (RecordMetadata.log_start_offset), KafkaJS too
(its send()'s `logStartOffset`), and Java's and kafka-python's producers read it to tell an
UNKNOWN_PRODUCER_ID caused by retention from a lost state. Found probing with KafkaJS 2.2.4, whose
every send() reported -1."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode as KafkaError

from tests.api.test_log_lifecycle import delete_records
from tests.kafka.clients import bootstrap, create_topic
from tests.kafka.raw import RawConnection, record_batch
from tests.kafka.test_produce_raw import init_producer, produce_request, records


def aiokafka_log_starts(server, topic: str, values: list[bytes], idempotent: bool) -> list[int]:
    """The log_start_offset of each record's RecordMetadata, sent one after the other by aiokafka."""
    from aiokafka import AIOKafkaProducer

    async def run() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap(server), enable_idempotence=idempotent, acks=-1)
        await producer.start()
        try:
            return [(await producer.send_and_wait(topic, value, partition=0)).log_start_offset for value in values]
        finally:
            await producer.stop()

    return asyncio.run(run())


def test_produce_answers_the_partitions_log_start_offset(module_kafka_server):
    topic = "produce-log-start"
    create_topic(module_kafka_server, topic)
    # A plain producer (a lone plain batch: the append's one-statement path), then an idempotent
    # one (the path that locks the partitions first).
    assert aiokafka_log_starts(module_kafka_server, topic, [b"a", b"b", b"c"], idempotent=False) == [0, 0, 0]
    assert delete_records(module_kafka_server.client, topic, {0: 2}).status_code == 200
    assert aiokafka_log_starts(module_kafka_server, topic, [b"d"], idempotent=False) == [2]
    assert aiokafka_log_starts(module_kafka_server, topic, [b"e", b"f"], idempotent=True) == [2, 2]


def test_a_duplicate_is_answered_with_the_log_start_offset_now(module_kafka_server):
    """As Kafka's UnifiedLog answers a retried batch: its original offsets, the log start of now."""
    topic = "produce-log-start-duplicate"
    create_topic(module_kafka_server, topic)
    with RawConnection(module_kafka_server.extra["kafka_bootstrap"]) as connection:
        producer_id, epoch = init_producer(connection)
        batch = record_batch(records(3), producer_id, epoch, 0)

        def send():
            [topic_answer] = connection.call(produce_request(topic, 0, batch)).responses
            [answer] = topic_answer.partition_responses
            return answer.error_code, answer.base_offset, answer.log_start_offset

        assert send() == (KafkaError.none, 0, 0)
        assert delete_records(module_kafka_server.client, topic, {0: 1}).status_code == 200
        assert send() == (KafkaError.none, 0, 1)
