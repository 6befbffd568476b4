"""Kafka clients against a test server's listener: confluent-kafka (librdkafka), the real client."""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

# Generous: a long poll must never be what ends a test, and nothing here is timed.
WAIT_S = 60


def create_topic(server, name: str, partitions: int = 1) -> None:
    response = server.client.post("/v1/topics", json={"name": name, "partitions": partitions, "config": {}})
    assert response.status_code == 201, response.text


def producer(server, **config) -> Producer:
    return Producer({"bootstrap.servers": server.extra["kafka_bootstrap"], **config})


def produce_all(server, topic: str, messages: list[dict], **config) -> list:
    """Produces each message (kwargs of Producer.produce) and flushes; the delivered messages, in order."""
    client = producer(server, **config)
    delivered = []

    def on_delivery(error, message):
        assert error is None, error
        delivered.append(message)

    for message in messages:
        client.produce(topic, on_delivery=on_delivery, **message)
    assert client.flush(WAIT_S) == 0
    return delivered


def consume(server, topic: str, partition: int, count: int, offset: int = OFFSET_BEGINNING, **config) -> list:
    """`count` messages of one partition from `offset` (assign + seek, no group), then polls once
    more briefly to catch anything beyond them."""
    consumer = Consumer(
        {
            "bootstrap.servers": server.extra["kafka_bootstrap"],
            "group.id": "unused-no-commits",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **config,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        messages = []
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF and len(messages) >= count:
                    break
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                continue
            messages.append(message)
        return messages
    finally:
        consumer.close()
