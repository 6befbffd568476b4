"""DescribeTopicPartitions (75, KIP-966), as Kafka's broker answers it (its
DescribeTopicPartitionsRequestHandler and KRaftMetadataCache): topics by name or every one, in the
order of their names, pages of at most `response_partition_limit` partitions with the cursor where
the next starts; raw, and through kafka-python's `describe_topic_partitions`. Its ACLs with
`--auth required`: test_security.py."""

from __future__ import annotations

import pytest
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.clients import create_topic, topic_uuid
from tests.kafka.raw import RawConnection, nested, request_of

KEY = api_table.DESCRIBE_TOPIC_PARTITIONS
# Kafka's operations on a Topic (AclEntry.supportedOperations(TOPIC)): Read, Write, Create, Delete,
# Alter, Describe, DescribeConfigs, AlterConfigs, every one with auth off.
EVERY_TOPIC_OPERATION = sum(1 << code for code in (3, 4, 5, 6, 7, 8, 10, 11))


def describe(bootstrap: str, names, limit: int = 2000, cursor: tuple[str, int] | None = None):
    request = request_of(
        KEY,
        0,
        topics=tuple(nested(KEY, 0, "TopicRequest", name=name) for name in names),
        response_partition_limit=limit,
        cursor=None if cursor is None else nested(KEY, 0, "Cursor", topic_name=cursor[0], partition_index=cursor[1]),
    )
    with RawConnection(bootstrap) as connection:
        return connection.call(request)


def pages(response) -> tuple[list[tuple[str, list[int]]], tuple[str, int] | None]:
    """([(topic, partition indexes)], next cursor) of a response."""
    cursor = response.next_cursor
    return (
        [(t.name, [p.partition_index for p in t.partitions]) for t in response.topics],
        None if cursor is None else (cursor.topic_name, cursor.partition_index),
    )


@pytest.fixture(scope="module")
def server(module_kafka_server):
    for name, partitions in (("dtp-a", 3), ("dtp-b", 2), ("dtp-c", 1)):
        create_topic(module_kafka_server, name, partitions)
    return module_kafka_server


@pytest.fixture(scope="module")
def bootstrap(server) -> str:
    return server.extra["kafka_bootstrap"]


def test_a_named_topic_is_described_with_its_id_partitions_and_operations(server, bootstrap):
    (topic,) = describe(bootstrap, ["dtp-a"]).topics
    assert (topic.error_code, topic.name, topic.is_internal) == (KafkaError.none, "dtp-a", False)
    assert topic.topic_id == topic_uuid(server.client.get("/v1/topics/dtp-a").json()["topic_id"])
    assert topic.topic_authorized_operations == EVERY_TOPIC_OPERATION
    node = 0  # the node's id (TXBROKER_NODE_ID, 0 unless set)
    for index, partition in enumerate(topic.partitions):
        assert partition.error_code == KafkaError.none
        assert partition.partition_index == index
        assert (partition.leader_id, partition.leader_epoch) == (node, -1)
        assert (partition.replica_nodes, partition.isr_nodes) == ((node,), (node,))
        assert (partition.eligible_leader_replicas, partition.last_known_elr, partition.offline_replicas) == (
            (),
            (),
            (),
        )
    assert len(topic.partitions) == 3


def test_topics_come_in_name_order_and_a_missing_one_is_unknown(bootstrap):
    response = describe(bootstrap, ["dtp-c", "dtp-missing", "dtp-a", "dtp-c"])
    assert pages(response) == ([("dtp-a", [0, 1, 2]), ("dtp-c", [0]), ("dtp-missing", [])], None)
    missing = response.topics[-1]
    # Kafka's zero id, which kio reads as None.
    assert (missing.error_code, missing.topic_id) == (KafkaError.unknown_topic_or_partition, None)
    (invalid,) = describe(bootstrap, ["no/such"]).topics
    assert invalid.error_code == KafkaError.invalid_topic_exception


def test_pages_follow_the_partition_limit_and_the_cursor(bootstrap):
    names = ["dtp-a", "dtp-b", "dtp-c"]
    assert pages(describe(bootstrap, names, limit=2)) == ([("dtp-a", [0, 1])], ("dtp-a", 2))
    assert pages(describe(bootstrap, names, limit=2, cursor=("dtp-a", 2))) == (
        [("dtp-a", [2]), ("dtp-b", [0])],
        ("dtp-b", 1),
    )
    # A page that ends with a topic's last partition points at the next topic's first.
    assert pages(describe(bootstrap, names, limit=3)) == ([("dtp-a", [0, 1, 2])], ("dtp-b", 0))
    assert pages(describe(bootstrap, names, limit=3, cursor=("dtp-b", 0))) == (
        [("dtp-b", [0, 1]), ("dtp-c", [0])],
        None,
    )
    # A limit below 1 is 1.
    assert pages(describe(bootstrap, names, limit=0)) == ([("dtp-a", [0])], ("dtp-a", 1))


def test_no_topic_named_describes_every_topic_from_the_cursor(bootstrap):
    answered, cursor = pages(describe(bootstrap, [], cursor=("dtp-b", 1)))
    assert answered[:2] == [("dtp-b", [1]), ("dtp-c", [0])]
    assert all(name > "dtp-b" for name, _ in answered[1:]) and cursor is None
    every = [name for name, _ in pages(describe(bootstrap, []))[0]]
    assert every == sorted(every) and {"dtp-a", "dtp-b", "dtp-c"} <= set(every)


@pytest.mark.parametrize(
    ("names", "cursor"),
    [(["dtp-a", "dtp-c"], ("dtp-b", 0)), (["dtp-a"], ("dtp-a", -1)), ([], ("dtp-a", -1))],
    ids=["cursor-not-asked", "negative-partition", "negative-partition-every-topic"],
)
def test_a_cursor_outside_the_request_refuses_it_whole(bootstrap, names, cursor):
    response = describe(bootstrap, names, cursor=cursor)
    assert [(t.name, t.error_code, t.partitions) for t in response.topics] == [
        (name, KafkaError.invalid_request, ()) for name in names
    ]
    assert response.next_cursor is None


def test_kafka_python_pages_through_describe_topic_partitions(bootstrap):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        first = admin.describe_topic_partitions(["dtp-b", "dtp-a"], response_partition_limit=4)
        assert [(t["name"], len(t["partitions"])) for t in first["topics"]] == [("dtp-a", 3), ("dtp-b", 1)]
        second = admin.describe_topic_partitions(["dtp-b", "dtp-a"], cursor=first["next_cursor"])
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in second["topics"]] == [
            ("dtp-b", [1])
        ]
        assert second["next_cursor"] is None
    finally:
        admin.close()
