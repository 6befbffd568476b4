"""Kafka's admin APIs with confluent_kafka.admin.AdminClient and kafka-python's KafkaAdminClient:
CreateTopics (configs by Kafka's names, validate only), DescribeConfigs, IncrementalAlterConfigs,
CreatePartitions (validate only, an increase only; the new partitions produced to and consumed),
DeleteRecords, DeleteTopics, ListGroups and DescribeGroups; each checked over HTTP too. Then KIP-664's
ListTransactions, DescribeTransactions and DescribeProducers against real transactions (open,
committed, none begun, KIP-939 Prepared), with kafka-python's KafkaAdminClient (confluent-kafka's
AdminClient has none of them) and raw requests for each version and filter."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from confluent_kafka.error import KafkaException
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, ConfluentKafka, KafkaPython, bootstrap, create_topic
from tests.kafka.group_clients import MEMBERS, poll_until
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.raw_transactions import RawProducer, add_partitions, end_txn, init_producer, produce


def http_topic(server, name: str) -> dict | None:
    response = server.client.get(f"/v1/topics/{name}")
    return response.json() if response.status_code == 200 else None


def test_confluent_admin_client(module_kafka_server):
    server = module_kafka_server
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    topic = "admin-confluent"
    futures = admin.create_topics(
        [NewTopic(topic, 3, 1, config={"retention.ms": "3600000", "cleanup.policy": "compact"})],
        validate_only=True,
    )
    futures[topic].result(WAIT_S)
    assert http_topic(server, topic) is None  # validate only: nothing created
    admin.create_topics([NewTopic(topic, 3, 1, config={"retention.ms": "3600000", "cleanup.policy": "compact"})])[
        topic
    ].result(WAIT_S)
    created = http_topic(server, topic)
    assert created["partitions"] == 3 or len(created["partitions"]) == 3
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(WAIT_S)
    assert refused.value.args[0].name() == "TOPIC_ALREADY_EXISTS"

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(WAIT_S)
    assert configs["retention.ms"].value == "3600000" and not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].value == "compact"
    assert configs["max.message.bytes"].is_default

    admin.incremental_alter_configs(
        [
            ConfigResource(
                ConfigResource.Type.TOPIC,
                topic,
                incremental_configs=[
                    ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
                    ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND),
                ],
            )
        ]
    )[resource].result(WAIT_S)
    configs = admin.describe_configs([resource])[resource].result(WAIT_S)
    assert (configs["retention.ms"].value, configs["cleanup.policy"].value) == ("60000", "compact,delete")
    with pytest.raises(KafkaException) as invalid:
        admin.incremental_alter_configs(
            [
                ConfigResource(
                    ConfigResource.Type.TOPIC,
                    topic,
                    incremental_configs=[
                        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)
                    ],
                )
            ]
        )[resource].result(WAIT_S)
    assert invalid.value.args[0].name() == "INVALID_CONFIG"

    admin.create_partitions([NewPartitions(topic, 6)], validate_only=True)[topic].result(WAIT_S)
    assert len(http_topic(server, topic)["partitions"]) == 3  # validate only: nothing added
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result(WAIT_S)
    assert len(http_topic(server, topic)["partitions"]) == 6
    for fewer in (6, 2):
        with pytest.raises(KafkaException) as refused_growth:
            admin.create_partitions([NewPartitions(topic, fewer)])[topic].result(WAIT_S)
        assert refused_growth.value.args[0].name() == "INVALID_PARTITIONS"
    producer = Producer({"bootstrap.servers": bootstrap(server)})
    producer.produce(topic, key=b"k", value=b"grown", partition=5)  # compacted: keys required
    assert producer.flush(WAIT_S) == 0
    [received] = ConfluentKafka().consume(server, topic, 5, 1)
    assert (received.offset, received.value) == (0, b"grown")

    http_side.produce(server, topic, 1, [{"key": "k", "value": f"v{i}"} for i in range(5)])
    deleted = admin.delete_records([TopicPartition(topic, 1, 3)])
    [(partition, future)] = deleted.items()
    assert future.result(WAIT_S).low_watermark == 3
    response = server.client.post(
        "/v1/fetch", json={"partitions": [{"topic": topic, "partition": 1, "offset": 0}], "max_wait_ms": 0}
    )
    assert response.json()["partitions"][0]["error"]["code"] == "OFFSET_OUT_OF_RANGE"  # below the new log start

    admin.delete_topics([topic])[topic].result(WAIT_S)
    assert http_topic(server, topic) is None


def test_delete_records_of_a_compacted_topic_is_a_policy_violation(module_kafka_server):
    """As Kafka's Partition.deleteRecordsOnLeader: a topic whose cleanup.policy lacks delete keeps its
    log start (only compaction removes its records), its partitions answered POLICY_VIOLATION; once
    the policy includes delete, the same request moves it."""
    server = module_kafka_server
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    topic = "admin-delete-records-compacted"
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(WAIT_S)
    http_side.produce(server, topic, 0, [{"key": "k", "value": f"v{i}"} for i in range(5)])
    [future] = admin.delete_records([TopicPartition(topic, 0, 3)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(WAIT_S)
    assert refused.value.args[0].name() == "POLICY_VIOLATION"
    assert http_topic(server, topic)["partitions"][0]["log_start_offset"] == 0

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND)],
    )
    admin.incremental_alter_configs([resource])[resource].result(WAIT_S)
    [future] = admin.delete_records([TopicPartition(topic, 0, 3)]).values()
    assert future.result(WAIT_S).low_watermark == 3


def test_confluent_lists_every_topic(module_kafka_server):
    """Regression: librdkafka's Metadata v12 for every topic carries 3 bytes the schema does not
    have; the listener closed the connection instead of ignoring them as Kafka does."""
    server = module_kafka_server
    server.client.post("/v1/topics", json={"name": "admin-listed", "partitions": 2, "config": {}})
    cluster = AdminClient({"bootstrap.servers": bootstrap(server)}).list_topics(timeout=WAIT_S)
    assert len(cluster.topics["admin-listed"].partitions) == 2
    assert list(cluster.brokers) == [0]


def test_kafka_python_admin_client(module_kafka_server):
    from kafka import KafkaProducer
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    server = module_kafka_server
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    topic = "admin-kafka-python"
    try:
        admin.create_topics([KpNewTopic(topic, 2, 1, topic_configs={"retention.bytes": "1000000"})])
        assert http_topic(server, topic) is not None
        described = admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, topic)])
        modified = described["topic"][topic]  # the configs that are not the defaults
        assert list(modified) == ["retention.bytes"]
        assert modified["retention.bytes"]["value"] == "1000000"
        admin.create_partitions({topic: 3})
        assert len(http_topic(server, topic)["partitions"]) == 3
        producer = KafkaProducer(bootstrap_servers=bootstrap(server))
        try:
            assert producer.send(topic, value=b"grown", partition=2).get(WAIT_S).offset == 0
        finally:
            producer.close()
        assert [r.value for r in KafkaPython().consume(server, topic, 2, 1)] == [b"grown"]
        admin.delete_topics([topic])
        assert http_topic(server, topic) is None
    finally:
        admin.close()


@pytest.mark.parametrize("admin_name", ["confluent-kafka", "kafka-python"])
def test_list_and_describe_groups_of_both_doors(module_kafka_server, admin_name):
    server = module_kafka_server
    topic = f"admin-groups-{admin_name}"
    server.client.post("/v1/topics", json={"name": topic, "partitions": 2, "config": {}})
    kafka_group, http_group = f"kafka-group-{admin_name}", f"http-group-{admin_name}"
    response = server.client.post(
        f"/v1/groups/{http_group}/heartbeat", json={"member_id": "", "generation_id": -1, "topics": [topic]}
    )
    assert response.status_code == 200, response.text
    member = MEMBERS["confluent-kafka"](server, kafka_group, topic)
    try:
        poll_until([member], lambda _: member.assignment() == {0, 1}, "assigned")
        if admin_name == "confluent-kafka":
            admin = AdminClient({"bootstrap.servers": bootstrap(server)})
            listed = {g.group_id: g for g in admin.list_consumer_groups().result(WAIT_S).valid}
            assert str(listed[kafka_group].state).endswith("STABLE")
            assert http_group not in listed  # librdkafka lists the groups of the "consumer" protocol type only
            described = admin.describe_consumer_groups([kafka_group])[kafka_group].result(WAIT_S)
            assert described.partition_assignor == "range" or described.partition_assignor
            [only] = described.members
            assert {tp.partition for tp in only.assignment.topic_partitions} == {0, 1}
        else:
            from kafka.admin import KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
            try:
                listed = {g["group_id"]: (g["protocol_type"], g["group_state"]) for g in admin.list_groups()}
                assert listed[kafka_group] == ("consumer", "Stable")
                assert listed[http_group] == ("http", "Stable")
                described = admin.describe_groups([kafka_group])[kafka_group]
                assert (described["group_state"], described["protocol_data"]) == ("Stable", "range")
                [only] = described["members"]
                assert only["member_metadata"]["topics"] == [topic]
                assert only["member_assignment"]["assigned_partitions"] == [{"topic": topic, "partitions": [0, 1]}]
            finally:
                admin.close()
    finally:
        member.close()


def test_a_kafka_group_rebalances_onto_grown_partitions(module_kafka_server):
    """A subscribed member learns of the new partitions from Metadata (its own refresh), rejoins,
    and is assigned them; a record produced to one of them is consumed."""
    server = module_kafka_server
    topic = "admin-grown-group"
    server.client.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {}})
    member = MEMBERS["confluent-kafka"](server, "grown-group", topic, **{"topic.metadata.refresh.interval.ms": 200})
    try:
        poll_until([member], lambda _: member.assignment() == {0}, "assigned the one partition")
        response = server.client.post(f"/v1/topics/{topic}/partitions", json={"partitions": 3})
        assert response.status_code == 200, response.text
        poll_until([member], lambda _: member.assignment() == {0, 1, 2}, "assigned the grown partitions")
        http_side.produce(server, topic, 2, [{"value": "on-a-new-partition"}])
        consumed = poll_until([member], lambda got: len(got[0]) == 1, "the record of the new partition")
        assert [(c.partition, c.offset, c.value) for c in consumed[0]] == [(2, 0, b"on-a-new-partition")]
    finally:
        member.close()


# ---- KIP-664: transactions and producers

TXN_TOPIC = "txn-admin"
OPEN, COMMITTED, EMPTY = "txn-admin-open", "txn-admin-committed", "txn-admin-empty"
PREPARED = "txn-admin-prepared"  # KIP-939's Prepared, begun over HTTP: Kafka's coordinator calls it Ongoing


@pytest.fixture(scope="module")
def transactions(module_kafka_server):
    """An open transaction (two batches to partition 1), a committed one (partition 0), and an id
    with none begun: the raw producers of each, by id."""
    create_topic(module_kafka_server, TXN_TOPIC, 2)
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        committed = init_producer(connection, COMMITTED)
        assert add_partitions(connection, committed, TXN_TOPIC, [0]) == [KafkaError.none]
        assert produce(connection, committed, TXN_TOPIC, 0, [b"c0", b"c1"], 0) == KafkaError.none
        assert end_txn(connection, committed, True, 3).error_code == KafkaError.none
        still_open = init_producer(connection, OPEN)
        assert add_partitions(connection, still_open, TXN_TOPIC, [1]) == [KafkaError.none]
        assert produce(connection, still_open, TXN_TOPIC, 1, [b"o0"], 0) == KafkaError.none
        assert produce(connection, still_open, TXN_TOPIC, 1, [b"o1", b"o2"], 1) == KafkaError.none
        empty = init_producer(connection, EMPTY)
    return {COMMITTED: committed, OPEN: still_open, EMPTY: empty, PREPARED: _prepared(module_kafka_server)}


def _prepared(server):
    init = server.client.post("/v1/producers/init", json={"transactional_id": PREPARED}).json()
    ids = {"transactional_id": PREPARED, "producer_id": init["producer_id"], "producer_epoch": init["producer_epoch"]}
    added = server.client.post(
        "/v1/txn/add-partitions", json={**ids, "partitions": [{"topic": TXN_TOPIC, "partition": 0}]}
    )
    assert added.status_code == 200, added.text
    prepared = server.client.post("/v1/txn/prepare", json=ids)
    assert prepared.json()["state"] == "Prepared", prepared.text
    return RawProducer(PREPARED, init["producer_id"], init["producer_epoch"])


def _list(server, version: int = 2, prefix: str = "txn-admin", **filters):
    """ListTransactions with `filters`: the response, and what it listed of the ids with `prefix`."""
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
    return response, {name: value for name, value in listed.items() if name.startswith(prefix)}


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
        assert opened.topic_partitions == {TopicPartition(TXN_TOPIC, 1)}
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

        producers = admin.describe_producers([TopicPartition(TXN_TOPIC, 0), TopicPartition(TXN_TOPIC, 1)])
        [on_open] = producers[TopicPartition(TXN_TOPIC, 1)].active_producers
        assert (on_open.producer_id, on_open.producer_epoch) == (opened.producer_id, opened.producer_epoch)
        assert (on_open.last_sequence, on_open.current_transaction_start_offset) == (2, 0)
        assert on_open.last_timestamp == 1_700_000_000_000 and on_open.coordinator_epoch == -1
        [on_committed] = producers[TopicPartition(TXN_TOPIC, 0)].active_producers
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
                    nested(key, 0, "TopicRequest", name=TXN_TOPIC, partition_indexes=(1, 7)),
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


def test_a_pattern_that_backtracks_without_end_stalls_nothing(module_kafka_server):
    """Regression: ListTransactions' pattern was matched by Python's backtracking engine in the
    worker's event loop, where `(a+)+` against an id of 40 a's that then fails to match takes 2^40
    steps: one request stalled every connection of the worker, for good. PostgreSQL matches it
    now, within a statement timeout; a pattern it cannot compile is INVALID_REGULAR_EXPRESSION
    whether or not any id is there to match."""
    long_id = "redos-" + "a" * 40 + "-b"
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        init_producer(connection, long_id)

    def listed(pattern: str):
        response, found = _list(module_kafka_server, pattern=pattern, prefix="redos-")
        return response.error_code, list(found)

    assert listed("redos-(a+)+") == (KafkaError.none, [])
    assert listed("redos-(a+)+-b") == (KafkaError.none, [long_id])
    assert listed("redos-(a+)+-[b") == (KafkaError.invalid_regular_expression, [])
    assert listed("no-such-id-(") == (KafkaError.invalid_regular_expression, [])
