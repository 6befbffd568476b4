"""The SDK's two-phase commit (KIP-939), which the Spark sink is built on: Producer.prepare_transaction()
and txbroker.two_phase.TwoPhaseClient, against a real server over HTTP on a real PostgreSQL."""

from __future__ import annotations

import time

import pytest

from txbroker import Admin, Consumer, PreparedTransaction, Producer, TopicPartition, TransactionState, TwoPhaseClient
from txbroker.errors import IllegalStateError, InvalidTxnStateError, ProducerFencedError


def read_all(url: str, topic: str, partition: int = 0, isolation_level: str = "read_committed") -> list[bytes]:
    with Consumer(url, isolation_level=isolation_level, auto_offset_reset="earliest") as consumer:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        values = []
        while consumer.position(tp) < end:
            values += [r.value for r in consumer.poll(timeout_ms=200)]
        return values


def state_of(url: str, transactional_id: str) -> str:
    with TwoPhaseClient(url) as client:
        return client.describe(transactional_id)["state"]


def prepared_producer(
    url: str, transactional_id: str, topic: str, values: list[bytes], **config
) -> tuple[Producer, PreparedTransaction]:
    producer = Producer(url, transactional_id=transactional_id, **config)
    producer.init_transactions()
    producer.begin_transaction()
    for value in values:
        producer.send(topic, value, partition=0)
    return producer, producer.prepare_transaction()


@pytest.fixture
def topic(server) -> str:
    with Admin(server.url) as admin:
        admin.create_topic("two-phase", partitions=1)
    return "two-phase"


def test_a_prepared_transaction_is_durable_invisible_and_takes_no_more_records(server, topic):
    producer, prepared = prepared_producer(server.url, "job/7/0/0", topic, [b"a", b"b"])
    try:
        assert prepared == PreparedTransaction("job/7/0/0", producer.producer_id, producer.producer_epoch)
        assert producer.prepare_transaction() == prepared  # asked again: the same answer
        assert state_of(server.url, "job/7/0/0") == "Prepared"
        assert read_all(server.url, topic) == []
        assert read_all(server.url, topic, isolation_level="read_uncommitted") == [b"a", b"b"]
        with Admin(server.url) as admin:
            [partition] = admin.describe_topic(topic)["partitions"]
        assert partition["last_stable_offset"] == 0  # held at the transaction's first offset
        with pytest.raises(IllegalStateError, match="prepared"):
            producer.send(topic, b"c", partition=0)
    finally:
        producer.close()


def test_another_process_commits_a_prepared_transaction_and_a_repeated_commit_succeeds(server, topic):
    producer, prepared = prepared_producer(server.url, "job/7/0/1", topic, [b"x"])
    producer.close()  # the worker is gone; the transaction stays Prepared
    with TwoPhaseClient(server.url) as coordinator:
        coordinator.commit(prepared)
        assert read_all(server.url, topic) == [b"x"]
        coordinator.commit(prepared)  # a coordinator that crashed after committing commits again
        with pytest.raises(InvalidTxnStateError):
            coordinator.abort(prepared)  # an abort never undoes a commit
    assert read_all(server.url, topic) == [b"x"]


def test_an_aborted_prepared_transaction_is_never_visible_and_abort_is_repeatable(server, topic):
    producer, prepared = prepared_producer(server.url, "job/7/1/0", topic, [b"gone"])
    producer.close()
    with TwoPhaseClient(server.url) as coordinator:
        coordinator.abort_all([prepared, prepared])
        coordinator.abort(prepared)
        with pytest.raises(InvalidTxnStateError):
            coordinator.commit(prepared)
    assert state_of(server.url, "job/7/1/0") == "CompleteAbort"
    assert read_all(server.url, topic) == []


def test_the_producer_itself_may_complete_its_prepared_transaction(server, topic):
    producer, _ = prepared_producer(server.url, "self-complete", topic, [b"1"])
    with producer:
        producer.commit_transaction()
        assert producer.prepared_transaction is None
        producer.begin_transaction()
        producer.send(topic, b"2", partition=0)
        producer.prepare_transaction()
        producer.abort_transaction()
        assert producer.transaction_state is TransactionState.READY
    assert read_all(server.url, topic) == [b"1"]


def test_preparing_an_empty_transaction_ends_it(server, topic):
    with Producer(server.url, transactional_id="empty") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        assert producer.prepare_transaction() is None
        assert producer.transaction_state is TransactionState.READY


def test_list_by_prefix_pages_and_abort_open_fences_an_orphan(server, topic):
    producers = []
    try:
        for tid in ("sink/3/0/0-1", "sink/3/1/0-2", "sink/30/0/0-3", "other/3/0/0-4"):
            producer = Producer(server.url, transactional_id=tid)
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, tid.encode(), partition=0).result(30)
            producers.append(producer)
        prepared = producers[1].prepare_transaction()
        with TwoPhaseClient(server.url) as coordinator:
            found = coordinator.list("sink/3/")
            assert [(t["transactional_id"], t["state"]) for t in found] == [
                ("sink/3/0/0-1", "Ongoing"),
                ("sink/3/1/0-2", "Prepared"),
            ]
            assert [t["transactional_id"] for t in coordinator.list("sink/")] == [
                "sink/3/0/0-1",
                "sink/3/1/0-2",
                "sink/30/0/0-3",
            ]
            orphan = found[0]
            assert coordinator.abort_open(orphan["transactional_id"], orphan["producer_id"], orphan["producer_epoch"])
            assert not coordinator.abort_open(orphan["transactional_id"])  # nothing open any more
            coordinator.abort(prepared)
            assert [t["transactional_id"] for t in coordinator.list("sink/")] == ["sink/30/0/0-3"]
        with pytest.raises(ProducerFencedError):  # the orphan's producer was fenced
            producers[0].send(topic, b"late", partition=0).result(30)
    finally:
        for producer in producers:
            producer.close()


def test_the_timeout_aborts_an_ongoing_transaction_but_never_a_prepared_one(make_server):
    server = make_server(abort_timed_out_transaction_interval_ms=100)
    with Admin(server.url) as admin:
        admin.create_topic("timeouts", partitions=1)
    ongoing = Producer(server.url, transactional_id="ongoing", transaction_timeout_ms=500)
    prepared_one, prepared = prepared_producer(
        server.url, "prepared", "timeouts", [b"kept"], transaction_timeout_ms=500
    )
    try:
        ongoing.init_transactions()
        ongoing.begin_transaction()
        ongoing.send("timeouts", b"dropped", partition=0).result(30)
        deadline = time.monotonic() + 30
        while state_of(server.url, "ongoing") != "CompleteAbort":
            assert time.monotonic() < deadline, "the timed-out transaction was never aborted"
            time.sleep(0.05)
        assert state_of(server.url, "prepared") == "Prepared"
        with TwoPhaseClient(server.url) as coordinator:
            coordinator.commit(prepared)
        assert read_all(server.url, "timeouts") == [b"kept"]
    finally:
        ongoing.close()
        prepared_one.close()
