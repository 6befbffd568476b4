"""The server's num_partitions (Kafka's num.partitions): the partition count of every topic created
without one, by either door: auto-created by a Kafka Metadata request, created by Kafka's
CreateTopics asking -1 (confluent-kafka's NewTopic without a count), created by HTTP's
POST /v1/topics without `partitions`. A count given is kept; Kafka's default is 1."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode as KafkaError

from tests.conftest import start_server_on_fresh_database, stop_in_process_server
from tests.kafka.clients import WAIT_S, bootstrap
from tests.kafka.raw import topic_metadata

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
