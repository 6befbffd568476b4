"""The SDK's producer and consumer under errors, against real servers (real HTTP, real PostgreSQL):
servers killed, frozen and restarted by pid, answers delayed on their way, states no test could
reach by sending (two billion records), and what the clients then hand out, commit and raise."""

from __future__ import annotations

from tests.api.test_log_lifecycle import sql
from tests.sdk.test_sdk_integration import FAST, read_all
from txbroker import Admin, Producer, TopicPartition

INT32_MAX = 2**31 - 1


def test_an_idempotent_producer_goes_on_past_sequence_int_max(server):
    """Sequences wrap to 0 past Int.MaxValue, as Kafka's producer and txbroker's server count them:
    a long-lived idempotent producer that wrote 2**31 records to a partition in one epoch (hours at
    a high rate) goes on writing it. Before, the SDK sent the next batch's sequence past
    Int.MaxValue, which the contract refuses (INVALID_REQUEST), and so every later batch of that
    partition failed. Both sides are set just below the wrap, as if those records had been sent."""
    tp = TopicPartition("wrapping", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    with Producer(server.url, linger_ms=50, **FAST) as producer:
        producer.send(tp.topic, value="first", partition=0).result(10)
        sql(
            server.database_url,
            "UPDATE producer_states SET last_sequence = $1 WHERE producer_id = $2",
            INT32_MAX - 2,
            producer.producer_id,
        )
        producer._core._tm.take_sequence(tp, INT32_MAX - 2)  # the next sequence: Int.MaxValue - 1
        across = [producer.send(tp.topic, value=f"across-{i}", partition=0) for i in range(5)]
        producer.flush()
        after = [producer.send(tp.topic, value=f"after-{i}", partition=0) for i in range(3)]
        producer.flush()
        assert [future.result(10).offset for future in across + after] == list(range(1, 9))
        producer_id = producer.producer_id
    with Admin(server.url) as admin:
        [state] = admin.describe_producers(tp.topic, 0)
    assert (state["producer_id"], state["last_sequence"]) == (producer_id, 5), (
        "Int.MaxValue - 1, Int.MaxValue, 0..2, then 3..5"
    )
    values = [record.value for record in read_all(server.url, tp.topic, 1)]
    assert values == [b"first", *(f"across-{i}".encode() for i in range(5)), *(f"after-{i}".encode() for i in range(3))]
