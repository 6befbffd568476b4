"""The SDK's producer and consumer under errors, against real servers (real HTTP, real PostgreSQL):
servers killed, frozen and restarted by pid, answers delayed on their way, states no test could
reach by sending (two billion records), and what the clients then hand out, commit and raise."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.api.test_log_lifecycle import sql
from tests.sdk.test_sdk_integration import FAST, read_all
from txbroker import Admin, Consumer, Producer, TopicPartition, errors

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


class FirstCommitDelayed(httpx.AsyncHTTPTransport):
    """Holds the first offset commit for half a second on its way to the server, as a slow
    connection would: a commit made after it, on another connection, arrives first."""

    def __init__(self) -> None:
        super().__init__()
        self.commits = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/offsets/commit"):
            self.commits += 1
            if self.commits == 1:
                await asyncio.sleep(0.5)
        return await super().handle_async_request(request)


def test_commits_are_applied_in_the_order_they_were_made(server):
    """As Kafka's commitAsync promises, and commitSync waits for the commits before it: the group's
    offset is the last one committed. Before, two commits in flight at once took two connections,
    and the one that arrived last won: the older offset, so a restarted member read again what had
    been processed and committed."""
    tp = TopicPartition("ordered", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    done: list[tuple[dict, BaseException | None]] = []
    transport = FirstCommitDelayed()
    with Consumer(server.url, group_id="ordered", transport=transport, enable_auto_commit=False, **FAST) as consumer:
        consumer.assign([tp])
        first = consumer.commit_async({tp: 5}, callback=lambda offsets, error: done.append((offsets, error)))
        second = consumer.commit_async({tp: 10}, callback=lambda offsets, error: done.append((offsets, error)))
        first.result(10), second.result(10)
        assert consumer.committed([tp]) == {tp: 10}
        consumer.commit_async({tp: 15}, callback=lambda offsets, error: done.append((offsets, error)))
        consumer.commit({tp: 20})
        assert done == [({tp: 5}, None), ({tp: 10}, None), ({tp: 15}, None)], "commit() after the ones before it"
        assert consumer.committed([tp]) == {tp: 20}
    assert transport.commits == 4


def test_position_while_a_transaction_holds_the_committed_offset_is_a_timeout_then_the_offset(server):
    """position() of a partition whose committed offset a transaction still holds (read with
    require_stable, UNSTABLE_OFFSET_COMMIT) waits default_api_timeout_ms, then raises
    TxbrokerTimeoutError, as Kafka's position() times out; once the transaction commits, it is the
    offset it committed. Before, it raised KeyError."""
    tp = TopicPartition("pending-offsets", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    with (
        Producer(server.url, transactional_id="pending-offsets", **FAST) as producer,
        Consumer(server.url, group_id="pending", default_api_timeout_ms=500, **FAST) as consumer,
    ):
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 7}, "pending")
        consumer.assign([tp])
        with pytest.raises(errors.TxbrokerTimeoutError, match="UNSTABLE_OFFSET_COMMIT") as raised:
            consumer.position(tp)
        assert raised.value.retriable
        assert consumer.poll(timeout_ms=200) == [], "poll() waits for it too, without an error"
        producer.commit_transaction()
        assert consumer.position(tp) == 7
