"""The server's num_partitions (Kafka's num.partitions): the partition count of every topic created
without one, by either door: auto-created by a Kafka Metadata request, created by Kafka's
CreateTopics asking -1 (confluent-kafka's NewTopic without a count), created by HTTP's
POST /v1/topics without `partitions`. A count given is kept; Kafka's default is 1. A manual
partition assignment (CreateTopics' `assignments`) makes as many partitions as it lists, checked as
Kafka's controller checks it (librdkafka's own test 0081 creates topics so)."""

from __future__ import annotations

import datetime

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka.clients import WAIT_S, bootstrap
from tests.kafka.raw import RawConnection, nested, request_of, topic_metadata

SERVER_DEFAULT = 4


def partition_count(server, topic: str) -> int:
    response = server.client.get(f"/v1/topics/{topic}")
    assert response.status_code == 200, response.text
    return len(response.json()["partitions"])


def auto_created_partitions(server, topic: str) -> int:
    """The partitions Metadata (v12, allowing creation) answers for a topic it creates."""
    answer = topic_metadata(bootstrap(server), topic, allow_auto_topic_creation=True)
    assert answer.error_code == KafkaError.none
    return len(answer.partitions)


@pytest.fixture(scope="module")
def server_of_four(request, postgres):
    running = start_server_on_fresh_database(
        postgres, "kafka_num_partitions", kafka_listener="127.0.0.1:0", num_partitions=SERVER_DEFAULT
    )
    yield running
    stop_in_process_server(running)


def test_auto_created_topics_get_num_partitions(server_of_four):
    assert auto_created_partitions(server_of_four, "auto-created") == SERVER_DEFAULT
    assert partition_count(server_of_four, "auto-created") == SERVER_DEFAULT


def test_create_topics_asking_the_default_gets_num_partitions(server_of_four):
    admin = AdminClient({"bootstrap.servers": bootstrap(server_of_four)})
    futures = admin.create_topics([NewTopic("kafka-default-count"), NewTopic("kafka-given-count", 2)])
    for future in futures.values():
        future.result(WAIT_S)
    assert partition_count(server_of_four, "kafka-default-count") == SERVER_DEFAULT
    assert partition_count(server_of_four, "kafka-given-count") == 2


@pytest.mark.parametrize(
    ("body", "expected"),
    [({}, SERVER_DEFAULT), ({"partitions": 3}, 3)],
    ids=["left-out", "given"],
)
def test_http_creation_without_a_count_gets_num_partitions(server_of_four, body, expected):
    name = f"http-{len(body)}-{body.get('partitions')}"
    response = server_of_four.client.post("/v1/topics", json={"name": name, **body})
    assert response.status_code == 201, response.text
    assert len(response.json()["partitions"]) == expected


def test_http_creation_with_a_null_count_is_refused(server_of_four):
    """The contract's partitions is an integer: null is bad input (400), not the default."""
    response = server_of_four.client.post("/v1/topics", json={"name": "http-null-count", "partitions": None})
    assert response.status_code == 400 and response.json()["error"]["code"] == "INVALID_REQUEST"
    assert "partitions" in response.json()["error"]["message"]
    assert server_of_four.client.get("/v1/topics/http-null-count").status_code == 404


def test_kafka_default_is_one_partition(kafka_server):
    assert auto_created_partitions(kafka_server, "auto-created-of-one") == 1
    response = kafka_server.client.post("/v1/topics", json={"name": "http-of-one"})
    assert len(response.json()["partitions"]) == 1


def node_id(server) -> int:
    (node,) = AdminClient({"bootstrap.servers": bootstrap(server)}).list_topics(timeout=WAIT_S).brokers
    return node


def test_a_manual_assignment_gives_the_partition_count(server_of_four):
    """confluent-kafka's NewTopic with a replica assignment (librdkafka sends the counts as -1 and the
    lists): as many partitions as it lists, not num_partitions."""
    node = node_id(server_of_four)
    admin = AdminClient({"bootstrap.servers": bootstrap(server_of_four)})
    topics = [
        NewTopic("assigned-one", 1, replica_assignment=[[node]]),
        NewTopic("assigned-six", 6, replica_assignment=[[node]] * 6),
    ]
    for future in admin.create_topics(topics).values():
        future.result(WAIT_S)
    assert partition_count(server_of_four, "assigned-one") == 1
    assert partition_count(server_of_four, "assigned-six") == 6


def created_with(address: str, name: str, assignments, num_partitions: int = -1, replication_factor: int = -1):
    version = 7
    topic = nested(
        api_table.CREATE_TOPICS,
        version,
        "CreatableTopic",
        name=name,
        num_partitions=num_partitions,
        replication_factor=replication_factor,
        assignments=tuple(
            nested(
                api_table.CREATE_TOPICS, version, "CreatableReplicaAssignment", partition_index=p, broker_ids=tuple(b)
            )
            for p, b in assignments
        ),
        configs=(),
    )
    request = request_of(
        api_table.CREATE_TOPICS, version, topics=(topic,), timeout=datetime.timedelta(seconds=30), validate_only=False
    )
    with RawConnection(address) as connection:
        (result,) = connection.call(request).topics
    return result


@pytest.mark.parametrize(
    ("assignments", "counts", "error", "message"),
    [
        ([(0, "node")], (3, -1), KafkaError.invalid_request, "but numPartitions was not set to -1"),
        ([(0, "node")], (-1, 1), KafkaError.invalid_request, "but replication factor was not set to -1"),
        (
            [(0, "node"), (0, "node")],
            (-1, -1),
            KafkaError.invalid_replica_assignment,
            "multiple manual partition assignments for partition 0",
        ),
        ([(0, ())], (-1, -1), KafkaError.invalid_replica_assignment, "an empty replica list"),
        ([(0, "twice")], (-1, -1), KafkaError.invalid_replica_assignment, "more than once"),
        ([(0, (4242,))], (-1, -1), KafkaError.invalid_replica_assignment, "includes broker 4242, but no such broker"),
        ([(0, "node"), (2, "node")], (-1, -1), KafkaError.invalid_replica_assignment, "consecutive 0-based"),
    ],
    ids=["count-given", "factor-given", "partition-twice", "no-replica", "node-twice", "unknown-node", "gap"],
)
def test_a_bad_manual_assignment_is_refused_as_kafka_refuses_it(server_of_four, assignments, counts, error, message):
    node = node_id(server_of_four)
    replicas = {"node": (node,), "twice": (node, node)}
    name = f"badly-assigned-{len(assignments)}-{counts[0]}-{counts[1]}-{message.split()[0]}"
    result = created_with(bootstrap(server_of_four), name, [(p, replicas.get(b, b)) for p, b in assignments], *counts)
    assert (result.error_code, message in result.error_message) == (error, True), result
    assert server_of_four.client.get(f"/v1/topics/{name}").status_code == 404


def grown_with(address: str, name: str, count: int, assignments, validate_only: bool = False):
    """CreatePartitions v3 of one topic to `count`, with these replica lists (None: no assignment)."""
    version = 3
    topic = nested(
        api_table.CREATE_PARTITIONS,
        version,
        "CreatePartitionsTopic",
        name=name,
        count=count,
        assignments=None
        if assignments is None
        else tuple(
            nested(api_table.CREATE_PARTITIONS, version, "CreatePartitionsAssignment", broker_ids=tuple(b))
            for b in assignments
        ),
    )
    request = request_of(
        api_table.CREATE_PARTITIONS,
        version,
        topics=(topic,),
        timeout=datetime.timedelta(seconds=30),
        validate_only=validate_only,
    )
    with RawConnection(address) as connection:
        (result,) = connection.call(request).results
    return result


def test_create_partitions_takes_an_assignment_of_live_nodes(server_of_four):
    """confluent-kafka's NewPartitions with a replica assignment: one list per partition added, each
    naming one live node, as the topic's partitions have one replica (Metadata's)."""
    node = node_id(server_of_four)
    admin = AdminClient({"bootstrap.servers": bootstrap(server_of_four)})
    server_of_four.client.post("/v1/topics", json={"name": "grown-assigned", "partitions": 1})
    admin.create_partitions([NewPartitions("grown-assigned", 3, replica_assignment=[[node], [node]])])[
        "grown-assigned"
    ].result(WAIT_S)
    assert partition_count(server_of_four, "grown-assigned") == 3


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (["node"], "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified."),
        (["node", "node", "node"], "Attempted to add 2 additional partition(s), but only 3 assignment(s)"),
        ([(), "node"], "an empty replica list"),
        (["node", "twice"], "more than once"),
        (["node", (4242,)], "includes broker 4242, but no such broker is registered"),
    ],
    ids=["too-few", "too-many", "no-replica", "node-twice", "unknown-node"],
)
@pytest.mark.parametrize("validate_only", [False, True], ids=["made", "validated"])
def test_create_partitions_refuses_a_bad_assignment_as_kafka_does(server_of_four, assignments, message, validate_only):
    """As Kafka's controller (ReplicationControlManager.createPartitions): INVALID_REPLICA_ASSIGNMENT
    with its message, and nothing added (validate_only answers alike)."""
    node = node_id(server_of_four)
    replicas = {"node": (node,), "twice": (node, node)}
    name = f"badly-grown-{len(assignments)}-{message.split()[0]}-{validate_only}".lower()
    server_of_four.client.post("/v1/topics", json={"name": name, "partitions": 1})
    result = grown_with(bootstrap(server_of_four), name, 3, [replicas.get(b, b) for b in assignments], validate_only)
    assert (result.error_code, message in result.error_message) == (KafkaError.invalid_replica_assignment, True), result
    assert partition_count(server_of_four, name) == 1


def test_create_partitions_checks_the_count_before_the_assignment(server_of_four):
    """Kafka's order: a topic that does not exist, or a count that is no increase, is that error
    whatever the assignment."""
    server_of_four.client.post("/v1/topics", json={"name": "grown-no-increase", "partitions": 2})
    result = grown_with(bootstrap(server_of_four), "grown-no-increase", 2, [(4242,)])
    assert result.error_code == KafkaError.invalid_partitions
    assert (
        grown_with(bootstrap(server_of_four), "grown-nowhere", 3, [()]).error_code
        == KafkaError.unknown_topic_or_partition
    )


def test_create_partitions_takes_any_one_live_node_but_not_two_replicas(make_server):
    """With two nodes on one database, a new partition's one replica may be either; two replicas are
    not the replication factor of the topic's partitions (one), which Kafka's controller refuses."""
    first = make_server(kafka_listener="127.0.0.1:0", node_id=0)
    make_server(kafka_listener="127.0.0.1:0", node_id=1)
    first.client.post("/v1/topics", json={"name": "grown-on-two", "partitions": 1})
    assert grown_with(bootstrap(first), "grown-on-two", 3, [(1,), (0,)]).error_code == KafkaError.none
    result = grown_with(bootstrap(first), "grown-on-two", 4, [(0, 1)])
    assert result.error_code == KafkaError.invalid_replica_assignment
    assert result.error_message == (
        "The manual partition assignment includes a partition with 2 replica(s), but this is not consistent "
        "with previous partitions, which have 1 replica(s)."
    )
    assert partition_count(first, "grown-on-two") == 3
