"""The real Kafka clients the tests drive against a test server's listener, behind one small
interface so that a test runs unchanged with each: confluent-kafka (librdkafka 2.x), kafka-python
and aiokafka. Each produces with its own partitioner and batching, and consumes one partition by
assign + seek (no group), reading to the partition's end for its isolation level, so that a record
that should not be seen would be."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

# Generous: a wait must never be what ends a test, and nothing here is timed.
WAIT_S = 60


@dataclass(frozen=True)
class Received:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list
    timestamp_ms: int


@dataclass(frozen=True)
class ReadToEnd:
    """What a consumer read to a partition's end: the records, then its position and the partition's
    end as the client sees them (its lag is end - position)."""

    received: list[Received]
    position: int
    end: int


@dataclass(frozen=True)
class Delivered:
    partition: int
    offset: int  # -1 with acks=0
    value: bytes | None


def create_topic(server, name: str, partitions: int = 1) -> None:
    response = server.client.post("/v1/topics", json={"name": name, "partitions": partitions, "config": {}})
    assert response.status_code == 201, response.text


def topic_uuid(topic_id: str) -> uuid.UUID:
    """HTTP's `topic_id` (Kafka's text form: URL-safe base64, unpadded) as the UUID Kafka's messages carry."""
    return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=="))


def bootstrap(server) -> str:
    return server.extra["kafka_bootstrap"]


class ConfluentKafka:
    name = "confluent-kafka"
    # What the client lets an application send (kafka-python's and aiokafka's send() refuse these).
    sends_null_key_and_value = True
    sends_null_header_values = True

    def produce(self, server, topic, messages, idempotent=True, acks="all", compression=None, **extra):
        config = {"bootstrap.servers": bootstrap(server), "enable.idempotence": idempotent, "acks": acks}
        if compression:
            config["compression.type"] = compression
        config.update(extra)
        producer = Producer(config)
        delivered = []

        def on_delivery(error, message):
            assert error is None, error
            delivered.append(Delivered(message.partition(), message.offset(), message.value()))

        for message in messages:
            producer.produce(topic, on_delivery=on_delivery, **_confluent_message(message))
        assert producer.flush(WAIT_S) == 0
        return delivered

    def consume(self, server, topic, partition, count, offset=0, isolation="read_uncommitted", **extra):
        return self.read_to_end(server, topic, partition, count, offset, isolation, **extra).received

    def read_to_end(self, server, topic, partition, count=0, offset=0, isolation="read_uncommitted", **extra):
        """At least `count` records from `offset`, read on to the partition's end (or WAIT_S): ReadToEnd,
        its end the high watermark (librdkafka's lag: the LSO under read_committed, where they differ)."""
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap(server),
                "group.id": "unused-no-commits",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
                **extra,
            }
        )
        try:
            consumer.assign([TopicPartition(topic, partition, offset)])
            received = []
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                message = consumer.poll(1)
                if message is None:
                    continue
                if message.error():
                    assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                    if len(received) >= count:
                        break  # at the end for this isolation level (librdkafka: the high watermark or LSO)
                    continue
                received.append(
                    Received(
                        message.offset(),
                        message.key(),
                        message.value(),
                        message.headers() or [],
                        message.timestamp()[1],
                    )
                )
            [position] = consumer.position([TopicPartition(topic, partition)])
            _, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=WAIT_S, cached=False)
            return ReadToEnd(received, position.offset, end)
        finally:
            consumer.close()


def _confluent_message(message: dict) -> dict:
    converted = {"key": message.get("key"), "value": message.get("value")}
    if message.get("headers"):
        converted["headers"] = message["headers"]
    if "timestamp" in message:
        converted["timestamp"] = message["timestamp"]
    return converted


class KafkaPython:
    name = "kafka-python"
    sends_null_key_and_value = False
    sends_null_header_values = False

    def produce(self, server, topic, messages, idempotent=True, acks="all", compression=None):
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap(server),
            enable_idempotence=idempotent,
            acks=acks,
            compression_type=compression,
            linger_ms=5,
        )
        try:
            futures = [
                producer.send(
                    topic,
                    key=m.get("key"),
                    value=m.get("value"),
                    headers=m.get("headers"),
                    timestamp_ms=m.get("timestamp"),
                )
                for m in messages
            ]
            producer.flush(WAIT_S)
            return [
                Delivered(f.get(WAIT_S).partition, f.get(WAIT_S).offset, m.get("value"))
                for f, m in zip(futures, messages)
            ]
        finally:
            producer.close(WAIT_S)

    def consume(self, server, topic, partition, count, offset=0, isolation="read_uncommitted"):
        return self.read_to_end(server, topic, partition, count, offset, isolation).received

    def read_to_end(self, server, topic, partition, count=0, offset=0, isolation="read_uncommitted"):
        """As ConfluentKafka's; its end the LSO under read_committed."""
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KafkaPythonPartition

        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap(server), group_id=None, enable_auto_commit=False, isolation_level=isolation
        )
        try:
            assigned = KafkaPythonPartition(topic, partition)
            consumer.assign([assigned])
            consumer.seek(assigned, offset)

            end = consumer.end_offsets([assigned])[assigned]  # the LSO under read_committed
            received = []
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                if consumer.position(assigned) >= end and len(received) >= count:
                    break
                for record in consumer.poll(timeout_ms=1000).get(assigned, []):
                    received.append(
                        Received(record.offset, record.key, record.value, list(record.headers or []), record.timestamp)
                    )
            return ReadToEnd(received, consumer.position(assigned), end)
        finally:
            consumer.close()


class AioKafka:
    name = "aiokafka"
    sends_null_key_and_value = False
    sends_null_header_values = True

    def produce(self, server, topic, messages, idempotent=True, acks="all", compression=None):
        from aiokafka import AIOKafkaProducer

        async def run():
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap(server),
                enable_idempotence=idempotent,
                acks=-1 if acks == "all" else acks,
                compression_type=compression,
                linger_ms=5,
            )
            await producer.start()
            try:
                futures = [
                    await producer.send(
                        topic,
                        key=m.get("key"),
                        value=m.get("value"),
                        headers=m.get("headers"),
                        timestamp_ms=m.get("timestamp"),
                    )
                    for m in messages
                ]
                answers = await asyncio.gather(*futures)  # None for each with acks=0
                return [
                    Delivered(r.partition, r.offset, m.get("value")) if r else Delivered(-1, -1, m.get("value"))
                    for r, m in zip(answers, messages)
                ]
            finally:
                await producer.stop()

        return asyncio.run(run())

    def consume(self, server, topic, partition, count, offset=0, isolation="read_uncommitted"):
        return self.read_to_end(server, topic, partition, count, offset, isolation).received

    def read_to_end(self, server, topic, partition, count=0, offset=0, isolation="read_uncommitted"):
        """As ConfluentKafka's; its end the LSO under read_committed."""
        from aiokafka import AIOKafkaConsumer
        from aiokafka import TopicPartition as AioPartition

        async def run():
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap(server), group_id=None, enable_auto_commit=False, isolation_level=isolation
            )
            await consumer.start()
            try:
                assigned = AioPartition(topic, partition)
                consumer.assign([assigned])
                consumer.seek(assigned, offset)
                end = (await consumer.end_offsets([assigned]))[assigned]  # the LSO under read_committed
                received = []
                deadline = time.monotonic() + WAIT_S
                while time.monotonic() < deadline:
                    if await consumer.position(assigned) >= end and len(received) >= count:
                        break
                    batches = await consumer.getmany(assigned, timeout_ms=1000)
                    for record in batches.get(assigned, []):
                        received.append(
                            Received(
                                record.offset, record.key, record.value, list(record.headers or []), record.timestamp
                            )
                        )
                return ReadToEnd(received, await consumer.position(assigned), end)
            finally:
                await consumer.stop()

        return asyncio.run(run())


def sendable(client, messages: list[dict]) -> list[dict]:
    """The messages as the client's API lets an application send them."""
    kept = []
    for message in messages:
        if message.get("key") is None and message.get("value") is None and not client.sends_null_key_and_value:
            continue
        if message.get("headers") and not client.sends_null_header_values:
            message = {**message, "headers": [(k, v) for k, v in message["headers"] if v is not None]}
        kept.append(message)
    return kept


CLIENTS = [ConfluentKafka(), KafkaPython(), AioKafka()]
