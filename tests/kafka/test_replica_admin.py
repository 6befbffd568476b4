"""Kafka's APIs that move replicas: AlterReplicaLogDirs (34), AlterPartitionReassignments (45) and
ListPartitionReassignments (46). A txbroker partition has one replica, in PostgreSQL, which every
node reaches and leads: moving it to its own log dir or to any one live node is answered at once
with nothing to do, and no reassignment is ever in progress. With kafka-python's admin client (the
calls Kafka's own tools make too) and raw requests for what it hides."""

from __future__ import annotations

import datetime

import pytest
from kafka.admin import KafkaAdminClient
from kafka.errors import NoError
from kafka.structs import TopicPartition, TopicPartitionReplica
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.clients import bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_of

TOPIC = "replicas"
TIMEOUT = datetime.timedelta(seconds=30)


@pytest.fixture
def admin(kafka_server):
    create_topic(kafka_server, TOPIC, partitions=2)
    client = KafkaAdminClient(bootstrap_servers=bootstrap(kafka_server))
    yield client
    client.close()


def test_a_replica_moved_to_its_log_dir_is_a_no_op(admin):
    (broker,) = admin.describe_log_dirs()
    (log_dir,) = broker["log_dirs"]
    replica = TopicPartitionReplica(TOPIC, 0, broker["broker"])
    assert admin.alter_replica_log_dirs({replica: log_dir["log_dir"]}) == {replica: NoError}


def test_moving_a_replica_elsewhere_or_of_no_partition_is_refused_as_kafka_does(kafka_server):
    """Another dir is not in the broker's log dirs (LOG_DIR_NOT_FOUND); a partition the node does
    not host REPLICA_NOT_AVAILABLE; each partition answered on its own."""
    create_topic(kafka_server, TOPIC, partitions=2)
    version = 2

    def moved(path: str, partitions: tuple[int, ...], topic: str = TOPIC):
        return nested(
            api_table.ALTER_REPLICA_LOG_DIRS,
            version,
            "AlterReplicaLogDir",
            path=path,
            topics=(
                nested(
                    api_table.ALTER_REPLICA_LOG_DIRS,
                    version,
                    "AlterReplicaLogDirTopic",
                    name=topic,
                    partitions=partitions,
                ),
            ),
        )

    request = request_of(
        api_table.ALTER_REPLICA_LOG_DIRS,
        version,
        dirs=(moved("postgresql", (0, 1, 2)), moved("/var/lib/kafka", (0,)), moved("postgresql", (0,), "nosuch")),
    )
    with RawConnection(bootstrap(kafka_server)) as connection:
        response = connection.call(request)
    answered = [(t.topic_name, p.partition_index, p.error_code) for t in response.results for p in t.partitions]
    assert sorted(answered) == sorted(
        [
            (TOPIC, 0, KafkaError.none),
            (TOPIC, 1, KafkaError.none),
            (TOPIC, 2, KafkaError.replica_not_available),
            (TOPIC, 0, KafkaError.log_dir_not_found),
            ("nosuch", 0, KafkaError.replica_not_available),
        ]
    )


def test_a_partition_reassigned_to_a_live_node_is_done_at_once_and_none_is_ever_in_progress(admin, kafka_server):
    node = kafka_server.settings.node_id
    assert admin.alter_partition_reassignments({TopicPartition(TOPIC, 0): [node]}) == {TopicPartition(TOPIC, 0): None}
    assert admin.list_partition_reassignments() == {}
    assert admin.list_partition_reassignments([TopicPartition(TOPIC, 0)]) == {}


def reassign(address: str, *partitions: tuple[str, int, tuple[int, ...] | None], version: int = 1):
    """A raw AlterPartitionReassignments: (topic, partition, replicas or None to cancel) each."""
    topics: dict[str, list] = {}
    for topic, partition, replicas in partitions:
        topics.setdefault(topic, []).append(
            nested(
                api_table.ALTER_PARTITION_REASSIGNMENTS,
                version,
                "ReassignablePartition",
                partition_index=partition,
                replicas=replicas,
            )
        )
    request = request_of(
        api_table.ALTER_PARTITION_REASSIGNMENTS,
        version,
        timeout=TIMEOUT,
        allow_replication_factor_change=True,
        topics=tuple(
            nested(
                api_table.ALTER_PARTITION_REASSIGNMENTS,
                version,
                "ReassignableTopic",
                name=name,
                partitions=tuple(entries),
            )
            for name, entries in topics.items()
        ),
    )
    with RawConnection(address) as connection:
        return connection.call(request)


def test_reassignments_txbroker_cannot_make_are_answered_as_kafkas_controller_does(kafka_server):
    create_topic(kafka_server, TOPIC, partitions=4)
    node = kafka_server.settings.node_id
    response = reassign(
        bootstrap(kafka_server),
        (TOPIC, 0, None),  # a cancellation, with none in progress
        (TOPIC, 1, ()),
        (TOPIC, 2, (node + 7,)),  # no such node
        (TOPIC, 3, (node, node)),
        (TOPIC, 9, (node,)),
        ("nosuch", 0, (node,)),
    )
    assert response.error_code == KafkaError.none
    answered = [(t.name, p.partition_index, p.error_code) for t in response.responses for p in t.partitions]
    assert answered == [
        (TOPIC, 0, KafkaError.no_reassignment_in_progress),
        (TOPIC, 1, KafkaError.invalid_replica_assignment),
        (TOPIC, 2, KafkaError.invalid_replica_assignment),
        (TOPIC, 3, KafkaError.invalid_replica_assignment),
        (TOPIC, 9, KafkaError.unknown_topic_or_partition),
        ("nosuch", 0, KafkaError.unknown_topic_or_partition),
    ]
    messages = [p.error_message for t in response.responses for p in t.partitions]
    assert f"broker {node + 7}, but no such broker" in messages[2]
    assert f"broker {node} more than once" in messages[3]


def test_any_one_live_node_takes_a_partition_but_not_two_replicas(make_server):
    """With two nodes on one database, either may be a partition's replica (each leads it when it
    answers); two replicas are a replication factor txbroker does not have."""
    first = make_server(kafka_listener="127.0.0.1:0", node_id=0)
    make_server(kafka_listener="127.0.0.1:0", node_id=1)
    create_topic(first, TOPIC, partitions=1)
    response = reassign(bootstrap(first), (TOPIC, 0, (1,)))
    ((answered,),) = [t.partitions for t in response.responses]
    assert answered.error_code == KafkaError.none
    response = reassign(bootstrap(first), (TOPIC, 0, (0, 1)))
    ((answered,),) = [t.partitions for t in response.responses]
    assert answered.error_code == KafkaError.invalid_replica_assignment
    assert "one replica" in answered.error_message
