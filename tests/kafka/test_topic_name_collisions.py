"""Topic names that differ by '.' and '_' alone collide, as in Kafka (its metric names make them one
character): a topic cannot be created beside an existing one whose name it collides with, over
either door, one rule in the core (storage's topics.create_topic). Kafka's controller answers
CreateTopics INVALID_TOPIC_EXCEPTION "Topic 'a.b' collides with existing topic: a_b", after the name's
own checks and before the configs and the count, a topic of the very name being TOPIC_ALREADY_EXISTS;
Kafka's broker answers a Metadata that would auto-create such a topic UNKNOWN_TOPIC_OR_PARTITION
(KRaft's AutoTopicCreationManager asks its controller, which refuses it, without waiting), and none
is created."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.error import KafkaException
from kio.schema.errors import ErrorCode as KafkaError

from tests.kafka.clients import WAIT_S, bootstrap
from tests.kafka.raw import topic_metadata

INVALID_TOPIC_EXCEPTION = KafkaError.invalid_topic_exception.value  # librdkafka names it TOPIC_EXCEPTION


def http_create(server, name: str, **body):
    return server.client.post("/v1/topics", json={"name": name, "partitions": 1, **body})


def exists(server, name: str) -> bool:
    return server.client.get(f"/v1/topics/{name}").status_code == 200


def kafka_create(server, name: str, **config: str) -> KafkaException | None:
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    try:
        admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(WAIT_S)
    except KafkaException as refused:
        return refused
    return None


@pytest.mark.parametrize(("existing", "new"), [("kafka_dot", "kafka.dot"), ("kafka.under", "kafka_under")])
def test_create_topics_refuses_a_name_colliding_with_an_existing_topic(module_kafka_server, existing, new):
    server = module_kafka_server
    assert http_create(server, existing).status_code == 201
    refused = kafka_create(server, new)
    assert refused is not None and refused.args[0].code() == INVALID_TOPIC_EXCEPTION
    assert refused.args[0].str().startswith(f"Topic '{new}' collides with existing topic: {existing}")
    assert not exists(server, new)
    # As Kafka's controller: the collision before the configs, the very name TOPIC_ALREADY_EXISTS.
    refused = kafka_create(server, new, **{"retention.ms": "not a number"})
    assert refused.args[0].code() == INVALID_TOPIC_EXCEPTION
    assert kafka_create(server, existing).args[0].name() == "TOPIC_ALREADY_EXISTS"


def test_http_creation_refuses_a_colliding_name(module_kafka_server):
    server = module_kafka_server
    assert http_create(server, "http.collision.a").status_code == 201
    refused = http_create(server, "http_collision.a")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "INVALID_TOPIC_EXCEPTION"
    assert "collides with existing topic: http.collision.a" in refused.json()["error"]["message"]
    assert not exists(server, "http_collision.a")
    assert http_create(server, "http-collision-a").status_code == 201  # '-' is a character of its own


def test_metadata_does_not_auto_create_a_colliding_name(module_kafka_server):
    server = module_kafka_server
    assert http_create(server, "auto_collision").status_code == 201
    answer = topic_metadata(bootstrap(server), "auto.collision", allow_auto_topic_creation=True)
    assert (answer.error_code, answer.partitions) == (KafkaError.unknown_topic_or_partition, ())
    assert not exists(server, "auto.collision")


def test_of_two_colliding_names_created_at_once_one_is(module_kafka_server):
    """Creations of colliding names are serialized: never both."""
    server = module_kafka_server

    def create(name: str, statuses: dict[str, int]) -> None:
        statuses[name] = http_create(server, name).status_code

    for attempt in range(10):
        names = [f"race.{attempt}.x", f"race_{attempt}_x", f"race.{attempt}_x"]
        statuses: dict[str, int] = {}
        threads = [threading.Thread(target=create, args=(name, statuses)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(statuses.values()) == [201, 400, 400], statuses
        assert sum(exists(server, name) for name in names) == 1
