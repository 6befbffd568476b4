"""Kafka's DescribeConfigs (32) as a Kafka broker answers it: each config's source and synonyms
(KIP-226), type and documentation (KIP-569), for a topic and for the broker, which is this node's
server settings under the Kafka broker configs they are, read-only. With kafka-python's and
confluent-kafka's describe_configs, and raw requests for the documentation."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from app.kafka import api_table
from tests.kafka.clients import WAIT_S, bootstrap
from tests.kafka.raw import RawConnection, nested, request_of

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
# Kafka 4.0's topic configs (its LogConfig; message.format.version, message.timestamp.difference.max.ms
# and message.downconversion.enable are gone since 4.0).
KAFKA_4_TOPIC_CONFIGS = {
    "cleanup.policy",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.type",
    "compression.zstd.level",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "follower.replication.throttled.replicas",
    "index.interval.bytes",
    "leader.replication.throttled.replicas",
    "local.retention.bytes",
    "local.retention.ms",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "min.insync.replicas",
    "preallocate",
    "remote.log.copy.disable",
    "remote.log.delete.on.disable",
    "remote.storage.enable",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.index.bytes",
    "segment.jitter.ms",
    "segment.ms",
    "unclean.leader.election.enable",
}
FIVE_TYPES = {
    "cleanup.policy": "LIST",
    "delete.retention.ms": "LONG",
    "max.message.bytes": "INT",
    "retention.bytes": "LONG",
    "retention.ms": "LONG",
}
NEW_TYPES = {
    "compression.type": "STRING",
    "segment.bytes": "INT",
    "min.cleanable.dirty.ratio": "DOUBLE",
    "preallocate": "BOOLEAN",
    "leader.replication.throttled.replicas": "LIST",
}


def create(server, topic: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(WAIT_S)


def kafka_python_configs(server, resource_type, name: str) -> dict[str, dict]:
    """kafka-python's describe_configs of one resource, every config: {name: its fields}."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    try:
        described = admin.describe_configs([KpConfigResource(resource_type, name)], config_filter="all")
    finally:
        admin.close()
    ((by_name,),) = [list(resources.values()) for resources in described.values()]
    return by_name


def confluent_configs(server, resource: ConfigResource) -> dict:
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    return admin.describe_configs([resource])[resource].result(WAIT_S)


def test_a_topics_configs_carry_kafkas_types_and_sources(kafka_server):
    create(kafka_server, "described", **{"retention.ms": "3600000"})
    configs = kafka_python_configs(kafka_server, ConfigResourceType.TOPIC, "described")
    assert set(configs) == KAFKA_4_TOPIC_CONFIGS  # every one Kafka 4.0 has, as a Kafka broker describes them
    assert {name: configs[name]["config_type"] for name in FIVE_TYPES} == FIVE_TYPES
    assert {name: configs[name]["config_type"] for name in NEW_TYPES} == NEW_TYPES
    # Set on the topic: a topic override; the others are the server's defaults, no one's choice.
    assert (configs["retention.ms"]["value"], configs["retention.ms"]["config_source"]) == (
        "3600000",
        "DYNAMIC_TOPIC_CONFIG",
    )
    assert (configs["retention.bytes"]["value"], configs["retention.bytes"]["config_source"]) == (
        "-1",
        "DEFAULT_CONFIG",
    )
    assert not any(config["read_only"] for config in configs.values())
    assert all(config["synonyms"] == [] for config in configs.values())  # not asked for


def test_synonyms_show_the_servers_default_and_where_it_comes_from(make_server):
    """A topic left with the server's default has it from the server's setting (Kafka's static
    broker config, when the operator set it); a topic override comes first, then that default."""
    server = make_server(kafka_listener="127.0.0.1:0", log_retention_ms=7_200_000)
    create(server, "inherits")
    create(server, "overrides", **{"retention.ms": "1000"})
    inherited = confluent_configs(server, ConfigResource(ConfigResource.Type.TOPIC, "inherits"))["retention.ms"]
    assert (inherited.value, inherited.source) == ("7200000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert [(s.name, s.value, s.source) for s in inherited.synonyms.values()] == [
        ("log.retention.ms", "7200000", ConfigSource.STATIC_BROKER_CONFIG.value)
    ]
    overridden = confluent_configs(server, ConfigResource(ConfigResource.Type.TOPIC, "overrides"))["retention.ms"]
    assert (overridden.value, overridden.source) == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert [(s.name, s.value, s.source) for s in overridden.synonyms.values()] == [
        ("retention.ms", "1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.retention.ms", "7200000", ConfigSource.STATIC_BROKER_CONFIG.value),
    ]
    # A config the server was not told: Kafka's default, from nowhere else.
    bytes_limit = confluent_configs(server, ConfigResource(ConfigResource.Type.TOPIC, "inherits"))["retention.bytes"]
    assert bytes_limit.source == ConfigSource.DEFAULT_CONFIG.value and bytes_limit.is_default


def test_the_broker_is_described_by_the_servers_kafka_settings(make_server):
    server = make_server(kafka_listener="127.0.0.1:0", group_min_session_timeout_ms=1000)
    configs = kafka_python_configs(server, ConfigResourceType.BROKER, str(server.settings.node_id))
    advertised = configs["advertised.listeners"]
    assert advertised["value"] == f"PLAINTEXT://{bootstrap(server)}"
    assert (advertised["config_type"], advertised["config_source"], advertised["read_only"]) == (
        "STRING",
        "DEFAULT_CONFIG",  # not set: the listener's own address
        True,
    )
    assert configs["listeners"]["value"] == "PLAINTEXT://127.0.0.1:0"
    assert (
        configs["group.min.session.timeout.ms"]["value"],
        configs["group.min.session.timeout.ms"]["config_source"],
    ) == (
        "1000",
        "STATIC_BROKER_CONFIG",
    )
    assert configs["group.max.session.timeout.ms"]["config_source"] == "DEFAULT_CONFIG"
    assert (configs["auto.create.topics.enable"]["value"], configs["auto.create.topics.enable"]["config_type"]) == (
        "true",
        "BOOLEAN",
    )
    assert configs["node.id"]["value"] == str(server.settings.node_id)
    assert all(config["read_only"] for config in configs.values())


def describe_request(version: int, resource_type: int, name: str, keys, documentation: bool):
    return request_of(
        api_table.DESCRIBE_CONFIGS,
        version,
        resources=(
            nested(
                api_table.DESCRIBE_CONFIGS,
                version,
                "DescribeConfigsResource",
                resource_type=resource_type,
                resource_name=name,
                configuration_keys=keys,
            ),
        ),
        include_synonyms=False,
        include_documentation=documentation,
    )


@pytest.mark.parametrize("resource_type", [TOPIC_RESOURCE, BROKER_RESOURCE])
def test_documentation_is_sent_when_asked_and_keys_filter_as_kafka_does(kafka_server, resource_type):
    """Only the configs named (a name txbroker does not have is left out, as a Kafka broker leaves
    it), each documented only when the request asks for it (v3+)."""
    create(kafka_server, "documented")
    name, key = ("documented", "retention.ms") if resource_type == TOPIC_RESOURCE else ("", "log.retention.ms")
    with RawConnection(bootstrap(kafka_server)) as connection:
        for documentation in (False, True):
            (result,) = connection.call(
                describe_request(4, resource_type, name, (key, "no.such.config"), documentation)
            ).results
            (config,) = result.configs
            assert config.name == key
            assert (config.documentation is not None) == documentation


def test_the_broker_describes_the_defaults_of_a_topic_created_without_counts(make_server):
    """Regression (found by KafkaJS's own `createTopics.spec.js`, which reads the broker's
    `default.replication.factor` and `num.partitions` and checks a topic created without counts
    against them): txbroker did not describe either, though `num_partitions` is Kafka's
    num.partitions and every partition has one replica."""
    server = make_server(kafka_listener="127.0.0.1:0", num_partitions=3)
    configs = kafka_python_configs(server, ConfigResourceType.BROKER, str(server.settings.node_id))
    described = {
        name: (configs[name]["value"], configs[name]["config_source"], configs[name]["config_type"])
        for name in ("num.partitions", "default.replication.factor")
    }
    assert described == {
        "num.partitions": ("3", "STATIC_BROKER_CONFIG", "INT"),
        "default.replication.factor": ("1", "DEFAULT_CONFIG", "INT"),
    }
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    admin.create_topics([NewTopic("created-without-counts")])["created-without-counts"].result(WAIT_S)
    partitions = admin.list_topics("created-without-counts", timeout=WAIT_S).topics["created-without-counts"].partitions
    assert len(partitions) == 3
    assert {len(partition.replicas) for partition in partitions.values()} == {1}
