"""ElectLeaders (43): a partition's one replica leads it on every node, so a known partition is
ELECTION_NOT_NEEDED (Kafka's answer when the preferred replica leads already), an unknown one
UNKNOWN_TOPIC_OR_PARTITION; asked for every partition (null), Kafka's controller answers each topic
with none of its partitions. With confluent-kafka's `elect_leaders`, kafka-python's, and each
version raw; the Cluster ACL it needs: test_security.py."""

from __future__ import annotations

import datetime

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.errors import UnknownTopicOrPartitionError
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_of

TOPIC = "elected"
VERSIONS = list(api_table.SUPPORTED_VERSIONS[api_table.ELECT_LEADERS])
PREFERRED, UNCLEAN = 0, 1


@pytest.fixture(scope="module")
def server(module_kafka_server):
    create_topic(module_kafka_server, TOPIC, 2)
    return module_kafka_server


def elect_leaders(server, version: int, asked: dict[str, list[int]] | None, election_type: int = PREFERRED):
    with RawConnection(bootstrap(server)) as connection:
        return connection.call(
            request_of(
                api_table.ELECT_LEADERS,
                version,
                election_type=election_type,
                topic_partitions=None
                if asked is None
                else tuple(
                    nested(api_table.ELECT_LEADERS, version, "TopicPartitions", topic=topic, partitions=tuple(ps))
                    for topic, ps in asked.items()
                ),
                timeout=datetime.timedelta(seconds=30),
            )
        )


def answers(response) -> dict[tuple[str, int], KafkaError]:
    return {
        (result.topic, partition.partition_id): partition.error_code
        for result in response.replica_election_results
        for partition in result.partition_result
    }


def test_confluent_kafka_elect_leaders(server):
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    asked = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1), TopicPartition(TOPIC, 5), TopicPartition("none", 0)]
    for election_type in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        elected = admin.elect_leaders(election_type, asked).result(WAIT_S)
        assert {(tp.topic, tp.partition): error.code() for tp, error in elected.items()} == {
            (TOPIC, 0): ConfluentError.ELECTION_NOT_NEEDED,
            (TOPIC, 1): ConfluentError.ELECTION_NOT_NEEDED,
            (TOPIC, 5): ConfluentError.UNKNOWN_TOPIC_OR_PART,
            ("none", 0): ConfluentError.UNKNOWN_TOPIC_OR_PART,
        }
    # Every partition: none needed an election, so none is answered.
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(WAIT_S) == {}


def test_kafka_python_elect_leaders(server):
    """kafka-python ignores ELECTION_NOT_NEEDED, and raises an unknown partition's error."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    try:
        response = admin.elect_leaders(PREFERRED, {TOPIC: [0, 1]})
        assert {
            (result.topic, p.partition_id): p.error_code
            for result in response.replica_election_results
            for p in result.partition_result
        } == {(TOPIC, 0): KafkaError.election_not_needed, (TOPIC, 1): KafkaError.election_not_needed}
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.elect_leaders(PREFERRED, {"none": [0]})
    finally:
        admin.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_each_partition_is_answered_on_its_own(server, version):
    response = elect_leaders(server, version, {TOPIC: [0, 1, 2], "none": [0]})
    assert getattr(response, "error_code", KafkaError.none) == KafkaError.none
    assert answers(response) == {
        (TOPIC, 0): KafkaError.election_not_needed,
        (TOPIC, 1): KafkaError.election_not_needed,
        (TOPIC, 2): KafkaError.unknown_topic_or_partition,
        ("none", 0): KafkaError.unknown_topic_or_partition,
    }
    messages = {
        (result.topic, p.partition_id): p.error_message
        for result in response.replica_election_results
        for p in result.partition_result
    }
    assert "not needed" in messages[TOPIC, 0]
    assert f"{TOPIC}-2" in messages[TOPIC, 2] and "0 to 1" in messages[TOPIC, 2]
    assert "No such topic as none" in messages["none", 0]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_partition_asked_answers_each_topic_without_partitions(server, version):
    """Kafka's controller: every topic listed, none of its partitions (no election was needed)."""
    response = elect_leaders(server, version, None)
    assert getattr(response, "error_code", KafkaError.none) == KafkaError.none
    topics = {result.topic: result.partition_result for result in response.replica_election_results}
    assert topics[TOPIC] == ()
    assert all(partitions == () for partitions in topics.values())


@pytest.mark.parametrize("version", VERSIONS[1:])
def test_an_unknown_election_type_fails_the_request(server, version):
    response = elect_leaders(server, version, {TOPIC: [0]}, election_type=2)
    assert response.error_code == KafkaError.invalid_request
    assert answers(response) == {(TOPIC, 0): KafkaError.invalid_request}
    (result,) = response.replica_election_results
    assert "Unknown election type 2" in result.partition_result[0].error_message
    assert answers(elect_leaders(server, version, {TOPIC: [0]}, election_type=UNCLEAN)) == {
        (TOPIC, 0): KafkaError.election_not_needed
    }
