"""bench.kafka's section 2 consumer (bench/kafka/clients.py, consume_records) against a server's
Kafka listener: what it times is the reading, never a wait for records the topic does not have."""

from __future__ import annotations

from bench.kafka import clients
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection
from tests.kafka.test_fetch_read_ahead import batch_of, produce_batches

# What consume_records waits at most for a batch of consume() to fill (its timeout).
CONSUME_TIMEOUT_S = 1.0


def test_reading_every_record_of_the_topic_ends_with_the_last_record_not_a_consume_timeout(kafka_server):
    """Regression: section 2 reads at most as many records as section 1 produced, so all of the
    topic when section 1 produced fewer than --consume-records (a million by default); the last
    consume() asked for 10,000 records whatever was left to read and waited its whole timeout (1 s)
    for records that never come, which the round's time counted."""
    topic = "bench-consume-all"
    create_topic(kafka_server, topic, 2)
    with RawConnection(kafka_server.extra["kafka_bootstrap"]) as connection:
        for partition in (0, 1):
            produce_batches(connection, topic, partition, [batch_of(*[f"p{partition}-{i}" for i in range(125)])])
    seconds, read, _, first_s = clients.consume_records(kafka_server.extra["kafka_bootstrap"], topic, 2, 250)
    assert read == 250
    assert first_s <= seconds < CONSUME_TIMEOUT_S, f"read the topic's 250 records in {seconds:.2f} s"
