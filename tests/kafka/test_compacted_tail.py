"""A Kafka consumer reaches the end of a compacted log: compaction never removes the log's last batch,
as Kafka's cleaner never cleans its active segment (which holds it). Kafka consumers move only by the
batches they fetch (a position is the last batch's next offset), so when the cleaner removed every
batch at a partition's tail (a value and its tombstone, an aborted transaction, a committed
transaction of tombstones), a consumer positioned inside that range fetched nothing and its position
stayed short of the high watermark, its lag above 0, until something new was appended. A marker
that ends the log stays with it: consumers step over the control batch to the high watermark. Each
of clients.py's three clients, at both isolation levels."""

from __future__ import annotations

import pytest

from tests.api.test_log_lifecycle import RARELY, clean, create, produce, send_keyed
from tests.api.test_transactions import TxnProducer
from tests.kafka.clients import CLIENTS

# The tests run the cleaner themselves, so that each step is deterministic.
KAFKA_SERVER_SETTINGS = {"log_cleaner_interval_ms": RARELY}


def high_watermark(server, topic: str) -> int:
    return server.client.get(f"/v1/topics/{topic}").json()["partitions"][0]["high_watermark"]


def tombstone_at_the_end(server, topic: str) -> list:
    """k's value (0) and tombstone (1); what a consumer from 0 then receives."""
    produce(server.client, topic, [{"key": "k", "value": "v"}])
    produce(server.client, topic, [{"key": "k", "value": None}])
    return [(1, b"k", None)]


def aborted_transaction_at_the_end(server, topic: str) -> list:
    """k's value (0), then a transaction that overwrites it (1) and aborts (2: its marker)."""
    produce(server.client, topic, [{"key": "k", "value": "v"}])
    writer = TxnProducer(server.client, f"{topic}-writer")
    writer.init()
    send_keyed(writer, topic, [{"key": "k", "value": "aborted"}])
    writer.abort()
    return [(0, b"k", b"v")]


def committed_tombstones_at_the_end(server, topic: str) -> list:
    """k's value (0), then a transaction that deletes it (1) and commits (2: its marker): once the
    tombstone's delete horizon passed, nothing of the records is left, only the marker."""
    produce(server.client, topic, [{"key": "k", "value": "v"}])
    writer = TxnProducer(server.client, f"{topic}-writer")
    writer.init()
    send_keyed(writer, topic, [{"key": "k", "value": None}])
    writer.commit()
    return []


@pytest.mark.parametrize("client", CLIENTS, ids=lambda client: client.name)
@pytest.mark.parametrize(
    "tail", [tombstone_at_the_end, aborted_transaction_at_the_end, committed_tombstones_at_the_end]
)
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_a_consumer_in_a_compacted_tail_reaches_the_high_watermark(module_kafka_server, client, tail, isolation):
    server = module_kafka_server
    topic = f"tail-{tail.__name__}-{client.name}-{isolation}".replace("_", "-")
    create(server.client, topic, cleanup_policy="compact", delete_retention_ms=0)
    expected = tail(server, topic)
    clean(server)
    clean(server)
    end = high_watermark(server, topic)
    # From the first offset (which compaction emptied, but for the aborted transaction's tail) and
    # from the last batch's: each consumer's position is the high watermark once it has read to the
    # end (its lag 0), with what is left.
    for offset in (0, end - 1):
        read = client.read_to_end(server, topic, 0, offset=offset, isolation=isolation)
        received = [(record.offset, record.key, record.value) for record in read.received]
        assert received == [record for record in expected if record[0] >= offset], (offset, received)
        lag = read.end - read.position
        assert (read.position, read.end) == (end, end), f"from {offset}: position {read.position}, lag {lag}"
