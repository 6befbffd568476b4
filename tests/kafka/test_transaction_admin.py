"""KIP-664's ListTransactions, DescribeTransactions and DescribeProducers over the Kafka listener,
against real transactions (one open, one committed, begun with raw transactional requests): with
kafka-python's KafkaAdminClient (confluent-kafka's AdminClient has none of them), and with raw
requests for each version and filter; the same transactions as HTTP's /v1/transactions shows."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.clients import bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.raw_transactions import RawProducer, add_partitions, end_txn, init_producer, produce

TOPIC = "txn-admin"
OPEN, COMMITTED, EMPTY = "txn-admin-open", "txn-admin-committed", "txn-admin-empty"
PREPARED = "txn-admin-prepared"  # KIP-939's Prepared, begun over HTTP: Kafka's coordinator calls it Ongoing


@pytest.fixture(scope="module")
def transactions(module_kafka_server):
    """An open transaction (two batches to partition 1), a committed one (partition 0), and an id
    with none begun: the raw producers of each, by id."""
    create_topic(module_kafka_server, TOPIC, 2)
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        committed = init_producer(connection, COMMITTED)
        assert add_partitions(connection, committed, TOPIC, [0]) == [KafkaError.none]
        assert produce(connection, committed, TOPIC, 0, [b"c0", b"c1"], 0) == KafkaError.none
        assert end_txn(connection, committed, True, 3).error_code == KafkaError.none
        still_open = init_producer(connection, OPEN)
        assert add_partitions(connection, still_open, TOPIC, [1]) == [KafkaError.none]
        assert produce(connection, still_open, TOPIC, 1, [b"o0"], 0) == KafkaError.none
        assert produce(connection, still_open, TOPIC, 1, [b"o1", b"o2"], 1) == KafkaError.none
        empty = init_producer(connection, EMPTY)
    return {COMMITTED: committed, OPEN: still_open, EMPTY: empty, PREPARED: _prepared(module_kafka_server)}


def _prepared(server):
    init = server.client.post("/v1/producers/init", json={"transactional_id": PREPARED}).json()
    ids = {"transactional_id": PREPARED, "producer_id": init["producer_id"], "producer_epoch": init["producer_epoch"]}
    added = server.client.post("/v1/txn/add-partitions", json={**ids, "partitions": [{"topic": TOPIC, "partition": 0}]})
    assert added.status_code == 200, added.text
    prepared = server.client.post("/v1/txn/prepare", json=ids)
    assert prepared.json()["state"] == "Prepared", prepared.text
    return RawProducer(PREPARED, init["producer_id"], init["producer_epoch"])


def _list(server, version: int = 2, **filters):
    with RawConnection(bootstrap(server)) as connection:
        response = connection.call(
            request_of(
                api_table.LIST_TRANSACTIONS,
                version,
                state_filters=tuple(filters.get("states", ())),
                producer_id_filters=tuple(filters.get("producer_ids", ())),
                duration_filter=filters.get("duration", -1),
                transactional_id_pattern=filters.get("pattern"),
            )
        )
    listed = {t.transactional_id: (t.producer_id, t.transaction_state) for t in response.transaction_states}
    return response, {name: value for name, value in listed.items() if name.startswith("txn-admin")}


def test_kafka_python_lists_and_describes_transactions_and_producers(module_kafka_server, transactions):
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap(module_kafka_server))
    try:
        [listed] = admin.list_transactions().values()  # one broker
        states = {t.transactional_id: (t.producer_id, t.state.value) for t in listed}
        assert states[OPEN] == (transactions[OPEN].producer_id, "Ongoing")
        assert states[COMMITTED] == (transactions[COMMITTED].producer_id, "CompleteCommit")
        assert states[EMPTY] == (transactions[EMPTY].producer_id, "Empty")
        assert states[PREPARED] == (transactions[PREPARED].producer_id, "Ongoing")
        [ongoing] = admin.list_transactions(state_filters=["Ongoing"]).values()
        assert sorted(t.transactional_id for t in ongoing) == [OPEN, PREPARED]

        described = admin.describe_transactions([OPEN, COMMITTED, EMPTY])
        http = module_kafka_server.client.get(f"/v1/transactions/{OPEN}").json()
        opened = described[OPEN]
        assert (opened.state.value, opened.producer_id, opened.producer_epoch) == (
            "Ongoing",
            http["producer_id"],
            http["producer_epoch"],
        )
        assert opened.transaction_timeout_ms == http["timeout_ms"]
        assert opened.transaction_start_time_ms == http["start_time_ms"] > 0
        assert opened.topic_partitions == {TopicPartition(TOPIC, 1)}
        done = described[COMMITTED]
        assert (done.state.value, done.topic_partitions, done.transaction_start_time_ms) == (
            "CompleteCommit",
            set(),
            -1,
        )
        empty = described[EMPTY]
        assert (empty.state.value, empty.producer_id, empty.transaction_start_time_ms) == (
            "Empty",
            transactions[EMPTY].producer_id,
            -1,
        )

        producers = admin.describe_producers([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
        [on_open] = producers[TopicPartition(TOPIC, 1)].active_producers
        assert (on_open.producer_id, on_open.producer_epoch) == (opened.producer_id, opened.producer_epoch)
        assert (on_open.last_sequence, on_open.current_transaction_start_offset) == (2, 0)
        assert on_open.last_timestamp == 1_700_000_000_000 and on_open.coordinator_epoch == -1
        [on_committed] = producers[TopicPartition(TOPIC, 0)].active_producers
        assert (on_committed.last_sequence, on_committed.current_transaction_start_offset) == (1, -1)
    finally:
        admin.close()


def test_list_transactions_filters(module_kafka_server, transactions):
    server = module_kafka_server
    every = {name: (p.producer_id, None) for name, p in transactions.items()}
    response, listed = _list(server)
    assert {name: pid for name, (pid, _) in listed.items()} == {name: pid for name, (pid, _) in every.items()}
    assert response.error_code == KafkaError.none and response.unknown_state_filters == ()

    response, listed = _list(server, states=["CompleteCommit", "Bogus", "Prepared"])
    assert set(listed) == {COMMITTED}
    assert response.unknown_state_filters == ("Bogus", "Prepared")  # Prepared is txbroker's, not Kafka's
    response, listed = _list(server, states=["Bogus"])
    assert listed == {} and response.unknown_state_filters == ("Bogus",)

    wanted = [transactions[OPEN].producer_id, transactions[EMPTY].producer_id]
    assert set(_list(server, producer_ids=wanted)[1]) == {OPEN, EMPTY}
    assert set(_list(server, producer_ids=wanted[:1])[1]) == {OPEN}
    assert set(_list(server, states=["Ongoing"])[1]) == {OPEN, PREPARED}

    assert set(_list(server, version=1, duration=0)[1]) == {OPEN, PREPARED}  # the ones with a start time
    assert _list(server, version=1, duration=3_600_000)[1] == {}
    assert set(_list(server, version=0)[1]) == set(transactions)  # v0: no duration filter

    assert set(_list(server, pattern="txn-admin-(open|empty)")[1]) == {OPEN, EMPTY}
    assert _list(server, pattern="admin")[1] == {}  # the whole id must match, as Java's Pattern.matches
    assert set(_list(server, pattern="")[1]) == set(transactions)
    response, listed = _list(server, pattern="txn-admin-(")
    assert response.error_code == KafkaError.invalid_regular_expression and listed == {}


def test_describe_transactions_unknown_and_empty_ids(module_kafka_server, transactions):
    """(Raw: kio's reader refuses the start time -1 of a described id with no transaction open,
    which Kafka sends too; kafka-python's reads it, above.)"""
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        response = connection.call(
            request_of(api_table.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("txn-admin-never", ""))
        )
    unknown, empty_id = response.transaction_states
    assert (unknown.transactional_id, unknown.error_code) == ("txn-admin-never", KafkaError.transactional_id_not_found)
    assert empty_id.error_code == KafkaError.invalid_request


def test_describe_producers_unknown_topic_and_partition(module_kafka_server, transactions):
    key = api_table.DESCRIBE_PRODUCERS
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        response = connection.call(
            request_of(
                key,
                0,
                topics=(
                    nested(key, 0, "TopicRequest", name=TOPIC, partition_indexes=(1, 7)),
                    nested(key, 0, "TopicRequest", name="txn-admin-no-topic", partition_indexes=(0,)),
                ),
            )
        )
    known, unknown = response.topics
    assert [(p.partition_index, p.error_code) for p in known.partitions] == [
        (1, KafkaError.none),
        (7, KafkaError.unknown_topic_or_partition),
    ]
    assert [p.producer_id for p in known.partitions[0].active_producers] == [transactions[OPEN].producer_id]
    assert [p.error_code for p in unknown.partitions] == [KafkaError.unknown_topic_or_partition]
