"""Idempotent producers of unmodified Kafka clients whose producer id expired: idle for
producer_id_expiration_ms, the server forgets the id and its state on every partition, and answers
the next write UNKNOWN_PRODUCER_ID. Each client recovers its own way (kafka-python asks InitProducerId
with its ids, KIP-360), and its later records must be written."""

from __future__ import annotations

import time

from tests.kafka import http_side
from tests.kafka.clients import bootstrap, create_topic

EXPIRING = {"producer_id_expiration_ms": 300, "producer_id_expiration_check_interval_ms": 50}


def _expired(server, topic: str) -> None:
    """Until the producer's state on partition 0 went, and its id with it (one expiry run)."""
    deadline = time.monotonic() + 20
    while server.client.get(f"/v1/topics/{topic}/partitions/0/producers").json()["producers"]:
        assert time.monotonic() < deadline, "the producer's state did not expire"
        time.sleep(0.05)


def test_kafka_python_takes_a_new_producer_id_once_its_own_expired(make_server):
    """Regression: kafka-python answers UNKNOWN_PRODUCER_ID with InitProducerId carrying its producer id
    and epoch (KIP-360), which Kafka answers, without a transactional id, with a new producer id
    whatever the request carries; the server answered UNKNOWN_PRODUCER_ID again, a fatal error for
    the client: every later record failed. The record that met the expiry is lost to kafka-python's
    own bump (its in-flight batches fail), the next are written."""
    from kafka import KafkaProducer

    server = make_server(kafka_listener="127.0.0.1:0", **EXPIRING)
    topic = "expired-kafka-python"
    create_topic(server, topic, 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap(server), enable_idempotence=True, linger_ms=0)
    try:
        producer.send(topic, value=b"before", partition=0).get(10)
        _expired(server, topic)
        met = producer.send(topic, value=b"met-the-expiry", partition=0)
        try:
            met.get(10)
        except Exception as error:  # kafka-python fails the batch in flight when it bumps
            assert type(error).__name__ == "UnknownProducerIdError", repr(error)
        for value in (b"after-1", b"after-2"):
            producer.send(topic, value=value, partition=0).get(10)
    finally:
        producer.close(5)
    written = [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, 0)]
    assert written in ([b"before", b"after-1", b"after-2"], [b"before", b"met-the-expiry", b"after-1", b"after-2"])
