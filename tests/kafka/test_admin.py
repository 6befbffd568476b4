"""Kafka's admin APIs with confluent_kafka.admin.AdminClient and kafka-python's KafkaAdminClient:
CreateTopics (configs by Kafka's names, validate only), DescribeConfigs, IncrementalAlterConfigs,
CreatePartitions (validate only, an increase only; the new partitions produced to and consumed),
DeleteRecords, DeleteTopics, ListGroups and DescribeGroups; each checked over HTTP too."""

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

from tests.kafka import http_side
from tests.kafka.clients import WAIT_S, ConfluentKafka, KafkaPython, bootstrap
from tests.kafka.group_clients import MEMBERS, poll_until


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
    producer.produce(topic, value=b"grown", partition=5)
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
