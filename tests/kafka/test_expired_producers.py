"""Idempotent producers of unmodified Kafka clients whose producer id expired: idle for
producer_id_expiration_ms, the server forgets the id and its state on every partition. Kafka's
leaders keep no list of issued ids and take a producer they hold no state for at any sequence, and
Kafka's clients rely on it: each goes on its own way (librdkafka bumps its epoch and starts again at
sequence 0, aiokafka and kafka-python go on with their sequences), and its later records must be
written, once and in order. HTTP's contract answers UNKNOWN_PRODUCER_ID instead (tests/api)."""

from __future__ import annotations

import time

from kio.schema.errors import ErrorCode as KafkaError

from app.kafka.record_batches import KafkaRecord
from tests.kafka import http_side
from tests.kafka.clients import bootstrap, create_topic

EXPIRING = {"producer_id_expiration_ms": 300, "producer_id_expiration_check_interval_ms": 50}


def _expired(server, topic: str) -> None:
    """Until the producer's state on partition 0 went, and its id with it (one expiry run)."""
    deadline = time.monotonic() + 20
    while server.client.get(f"/v1/topics/{topic}/partitions/0/producers").json()["producers"]:
        assert time.monotonic() < deadline, "the producer's state did not expire"
        time.sleep(0.05)


def test_kafka_python_writes_on_once_its_producer_id_expired(make_server):
    """kafka-python goes on with its producer id after an idle spell past the expiry, and is taken
    at any sequence as by Kafka's leaders: every record is written once, in order. (Before, the
    server answered UNKNOWN_PRODUCER_ID, and kafka-python lost the batch in flight to its KIP-360
    bump; that InitProducerId with its expired id gets a new id is tested below.)"""
    from kafka import KafkaProducer

    server = make_server(kafka_listener="127.0.0.1:0", **EXPIRING)
    topic = "expired-kafka-python"
    create_topic(server, topic, 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap(server), enable_idempotence=True, linger_ms=0)
    try:
        producer.send(topic, value=b"before", partition=0).get(10)
        _expired(server, topic)
        for value in (b"after-1", b"after-2"):
            producer.send(topic, value=value, partition=0).get(10)
    finally:
        producer.close(5)
    written = [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, 0)]
    assert written == [b"before", b"after-1", b"after-2"]


def test_librdkafka_writes_again_once_its_producer_id_expired(make_server):
    """Regression: librdkafka answers UNKNOWN_PRODUCER_ID by bumping its epoch itself and sending
    its batch again at sequence 0, with the same producer id; the server answered UNKNOWN_PRODUCER_ID
    again, forever, so a confluent-kafka producer idle for producer_id_expiration_ms never wrote
    again. Kafka's leaders keep no list of issued ids: a producer they hold no state for is taken
    at any sequence. Every record is written once, in order, across both partitions."""
    from confluent_kafka import Producer

    server = make_server(kafka_listener="127.0.0.1:0", **EXPIRING)
    topic = "expired-librdkafka"
    create_topic(server, topic, 2)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(server),
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": 10_000,
        }
    )
    failures = []

    def delivered(error, message):
        if error is not None:
            failures.append(error)

    def send(value: bytes) -> None:
        for partition in (0, 1):
            producer.produce(topic, value=value, partition=partition, on_delivery=delivered)
        assert producer.flush(15) == 0, "records were still undelivered"

    send(b"before")
    _expired(server, topic)
    for value in (b"after-1", b"after-2"):
        send(value)
    assert failures == []
    for partition in (0, 1):
        written = [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, partition)]
        assert written == [b"before", b"after-1", b"after-2"]


def test_aiokafka_writes_again_once_its_producer_id_expired(make_server):
    """Regression: aiokafka goes on with its producer id, epoch and next sequence after
    UNKNOWN_PRODUCER_ID (it never asks a new id), so the server answered every later batch with it
    again. Taken at any sequence, as by Kafka's leaders, its later records are written."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    server = make_server(kafka_listener="127.0.0.1:0", **EXPIRING)
    topic = "expired-aiokafka"
    create_topic(server, topic, 1)

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap(server), enable_idempotence=True)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"before", partition=0)
            await asyncio.to_thread(_expired, server, topic)
            for value in (b"after-1", b"after-2"):
                await asyncio.wait_for(producer.send_and_wait(topic, value, partition=0), 15)
        finally:
            await producer.stop()

    asyncio.run(run())
    written = [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, 0)]
    assert written == [b"before", b"after-1", b"after-2"]


def test_an_expired_id_is_taken_up_again_and_keeps_fencing_and_its_number(make_server):
    """Raw requests, Kafka's leaders' rule and its limits: an expired id continues at any sequence
    (recorded again at the batch's epoch, so a lower epoch is fenced after it); an id the server
    never issued stays UNKNOWN_PRODUCER_ID (the sequence will issue it to another producer); the
    next ids issued are new ones. InitProducerId naming the expired id (kafka-python's KIP-360 bump
    before) gets a new id, as Kafka answers without a transactional id."""
    from tests.kafka.raw import RawConnection, record_batch
    from tests.kafka.test_produce_raw import answer_of, init_producer, produce_request

    server = make_server(kafka_listener="127.0.0.1:0", **EXPIRING)
    topic = "expired-raw"
    create_topic(server, topic, 1)

    def batch(producer_id: int, epoch: int, sequence: int, value: bytes) -> bytes:
        return record_batch([KafkaRecord(0, None, value, ())], producer_id, epoch, sequence)

    with RawConnection(bootstrap(server)) as connection:
        producer_id, epoch = init_producer(connection)
        assert answer_of(connection.call(produce_request(topic, 0, batch(producer_id, epoch, 0, b"a")))) == (0, 0)
        _expired(server, topic)
        assert answer_of(connection.call(produce_request(topic, 0, batch(producer_id, epoch + 2, 7, b"b")))) == (0, 1)
        # Its retry is a duplicate again, and its next sequence follows on.
        assert answer_of(connection.call(produce_request(topic, 0, batch(producer_id, epoch + 2, 7, b"b")))) == (0, 1)
        assert answer_of(connection.call(produce_request(topic, 0, batch(producer_id, epoch + 2, 8, b"c")))) == (0, 2)
        fenced, _ = answer_of(connection.call(produce_request(topic, 0, batch(producer_id, epoch + 1, 9, b"x"))))
        assert fenced == KafkaError.invalid_producer_epoch
        never_issued = producer_id + 1_000_000
        unknown, _ = answer_of(connection.call(produce_request(topic, 0, batch(never_issued, 0, 3, b"y"))))
        assert unknown == KafkaError.unknown_producer_id
        new_id, _ = init_producer(connection)
        assert new_id > producer_id
        _expired(server, topic)
        renewed, renewed_epoch = init_producer(connection, producer_id, epoch + 2)
        assert (renewed, renewed_epoch) != (producer_id, epoch + 3) and renewed > new_id
    written = [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, 0)]
    assert written == [b"a", b"b", b"c"]
