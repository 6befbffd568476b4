"""Transactions of unmodified Kafka clients (transaction version 1: EndTxn below v5, the epoch carried
from one transaction to the next): committed ones visible, aborted ones never to read_committed
readers of either door; the transaction seen over HTTP with its epoch, version and markers; a
zombie fenced by a new instance (each client); kafka-python's and aiokafka's consume-transform-produce
loops with send_offsets_to_transaction from a joined group."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, ConfluentKafka, bootstrap, create_topic
from tests.kafka.exactly_once import committed_offsets, committed_values
from tests.kafka.transactional_clients import LOOP_CLIENTS, TRANSACTIONAL_CLIENTS, LoopStep, Transaction

CONFLUENT = ConfluentKafka()


def _values(received) -> list[bytes]:
    return [r.value for r in received]


def _transactions(tag: str) -> list[Transaction]:
    """Commit, abort, commit, abort, commit, each writing to both partitions: with version 1 all
    of them share one epoch, so only the markers' offsets tell them apart."""
    return [
        Transaction(
            [(0, f"{tag}-{n}-a".encode()), (1, f"{tag}-{n}-b".encode()), (0, f"{tag}-{n}-c".encode())], n % 2 == 0
        )
        for n in range(5)
    ]


@pytest.mark.parametrize("client", TRANSACTIONAL_CLIENTS, ids=lambda c: c.name)
def test_committed_visible_aborted_never_read_committed_on_both_doors(module_kafka_server, client):
    server = module_kafka_server
    topic = f"txn-{client.name}"
    create_topic(server, topic, 2)
    transactions = _transactions(client.name)
    client.run(server, f"tid-{client.name}", topic, transactions)

    for partition in (0, 1):
        committed = [v for t in transactions if t.commit for p, v in t.records if p == partition]
        everything = [v for t in transactions for p, v in t.records if p == partition]
        assert _values(CONFLUENT.consume(server, topic, partition, len(committed), isolation="read_committed")) == (
            committed
        )
        assert _values(CONFLUENT.consume(server, topic, partition, len(everything))) == everything
        over_http = http_side.fetch(server, topic, partition, "read_committed")
        assert [http_side.unb64(r["value"]) for r in over_http] == committed

    described = server.client.get(f"/v1/transactions/tid-{client.name}").json()
    assert described["state"] == "CompleteCommit"
    assert described["transaction_version"] == 1
    markers = server.client.get(f"/v1/topics/{topic}/partitions/0/markers").json()["markers"]
    assert [m["type"] for m in markers] == ["COMMIT", "ABORT", "COMMIT", "ABORT", "COMMIT"]
    # Version 1: one epoch for all five transactions (InitProducerId alone bumps it).
    assert {(m["producer_id"], m["producer_epoch"]) for m in markers} == {
        (described["producer_id"], described["producer_epoch"])
    }

    # The console: the transaction's version, and each record of the log once, with its own outcome.
    page = server.client.get(f"/console/transactions/tid-{client.name}")
    assert page.status_code == 200 and "classic: the epoch carries over" in page.text
    log_page = server.client.get(f"/console/topics/{topic}/partitions/0")
    assert log_page.status_code == 200
    for transaction in transactions:
        for partition, value in transaction.records:
            if partition == 0:
                assert log_page.text.count(value.decode()) == 1, value


def test_a_new_instance_fences_the_zombie_and_aborts_its_transaction(module_kafka_server):
    server = module_kafka_server
    topic = "txn-zombie"
    create_topic(server, topic, 1)
    config = {"bootstrap.servers": bootstrap(server), "transactional.id": "tid-zombie"}
    zombie = Producer(config)
    zombie.init_transactions(WAIT_S)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie-1")
    assert zombie.flush(WAIT_S) == 0

    successor = Producer(config)
    successor.init_transactions(WAIT_S)  # fences the zombie: its open transaction is aborted
    successor.begin_transaction()
    successor.produce(topic, value=b"successor-1")
    successor.commit_transaction(WAIT_S)

    zombie.produce(topic, value=b"zombie-2")
    with pytest.raises(KafkaException) as raised:
        zombie.flush(WAIT_S)  # raises the fatal error once the write is refused
        zombie.commit_transaction(WAIT_S)
    assert raised.value.args[0].fatal(), raised.value  # fenced: the zombie can do nothing more
    assert raised.value.args[0].code() == KafkaError._FENCED, raised.value

    assert _values(CONFLUENT.consume(server, topic, 0, 1, isolation="read_committed")) == [b"successor-1"]
    assert [http_side.unb64(r["value"]) for r in http_side.fetch(server, topic, 0, "read_committed")] == [
        b"successor-1"
    ]
    # Nothing of the zombie after the fence was written at all.
    assert b"zombie-2" not in _values(CONFLUENT.consume(server, topic, 0, 2))


@pytest.mark.parametrize("client", LOOP_CLIENTS, ids=lambda c: c.name)
def test_consume_transform_produce_moves_the_group_offsets_only_on_commit(module_kafka_server, client):
    """send_offsets_to_transaction from a subscribed consumer: a committed transaction's offsets
    are the group's, an aborted one's never (the loop reads its records again), and the sink's
    read_committed readers see each input transformed once."""
    server = module_kafka_server
    source, sink, group = f"loop-in-{client.name}", f"loop-out-{client.name}", f"loop-group-{client.name}"
    create_topic(server, source, 1)
    create_topic(server, sink, 1)
    values = [f"v{i}".encode() for i in range(6)]
    http_side.produce(server, source, 0, [{"key": None, "value": v.decode()} for v in values])

    client.run(server, group, source, sink, f"loop-tid-{client.name}", [LoopStep(2, True), LoopStep(2, False)])
    assert committed_offsets(server, group, source, 1) == {0: 2}
    client.run(server, group, source, sink, f"loop-tid-{client.name}", [LoopStep(2, False), LoopStep(4, True)])
    assert committed_offsets(server, group, source, 1) == {0: 6}
    assert committed_values(server, sink, 0) == [b"t-" + v for v in values]
    assert len(http_side.fetch(server, sink, 0)) > len(values)  # the aborted writes are in the log, hidden


@pytest.mark.parametrize("client", LOOP_CLIENTS, ids=lambda c: c.name)
def test_a_zombie_of_either_client_is_fenced_by_a_new_instance(module_kafka_server, client):
    server = module_kafka_server
    topic = f"zombie-{client.name}"
    create_topic(server, topic, 1)
    refused = client.fenced(server, f"zombie-tid-{client.name}", topic)
    assert type(refused).__name__ == client.fenced_error, refused
    assert _values(CONFLUENT.consume(server, topic, 0, 1, isolation="read_committed")) == [b"successor-1"]
    assert b"zombie-2" not in _values(CONFLUENT.consume(server, topic, 0, 2))


def test_a_transaction_writing_where_its_producer_s_state_expired_continues_its_sequence(make_server):
    """Regression: with version 1 a producer's epoch and sequences carry over from one transaction to
    the next, and its state on a partition it left idle for producer_id_expiration_ms expires there
    on its own (the producer stays, writing elsewhere or not). Its next batch there continues its
    sequence; the server refused it (OUT_OF_ORDER_SEQUENCE_NUMBER, which librdkafka takes as a
    fatal error: the producer was dead). Kafka's ProducerAppendInfo takes any sequence from a
    producer with no state on the partition."""
    server = make_server(
        kafka_listener="127.0.0.1:0", producer_id_expiration_ms=300, producer_id_expiration_check_interval_ms=50
    )
    topic = "txn-state-expired"
    create_topic(server, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap(server), "transactional.id": "tid-state-expired"})
    producer.init_transactions(WAIT_S)
    for value in (b"before", b"after"):
        producer.begin_transaction()
        producer.produce(topic, value=value, partition=0)
        assert producer.flush(WAIT_S) == 0
        producer.commit_transaction(WAIT_S)
        deadline = time.monotonic() + 20
        while server.client.get(f"/v1/topics/{topic}/partitions/0/producers").json()["producers"]:
            assert time.monotonic() < deadline, "the producer's state on the partition did not expire"
            time.sleep(0.05)
    assert _values(CONFLUENT.consume(server, topic, 0, 2, isolation="read_committed")) == [b"before", b"after"]
    markers = server.client.get(f"/v1/topics/{topic}/partitions/0/markers").json()["markers"]
    assert [(m["type"], m["producer_epoch"]) for m in markers] == [("COMMIT", 0), ("COMMIT", 0)]
