"""The server's num_partitions (Kafka's num.partitions): the partition count of every topic created
without one, by either door: auto-created by a Kafka Metadata request, created by Kafka's
CreateTopics asking -1 (confluent-kafka's NewTopic without a count), created by HTTP's
POST /v1/topics without `partitions`. A count given is kept; Kafka's default is 1. A manual
partition assignment (CreateTopics' `assignments`) makes as many partitions as it lists, checked as
Kafka's controller checks it (librdkafka's own test 0081 creates topics so)."""

from __future__ import annotations

import datetime

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
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


def _created_with(server, name: str, assignments, num_partitions: int = -1, replication_factor: int = -1):
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
    with RawConnection(bootstrap(server)) as connection:
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
    result = _created_with(server_of_four, name, [(p, replicas.get(b, b)) for p, b in assignments], *counts)
    assert (result.error_code, message in result.error_message) == (error, True), result
    assert server_of_four.client.get(f"/v1/topics/{name}").status_code == 404
