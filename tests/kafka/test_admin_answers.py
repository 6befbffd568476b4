"""The fields of Kafka's admin answers that its tools read, as a Kafka broker fills them, with raw
requests (each field seen as sent): CreateTopics' configs of a topic it created (v5+, KIP-525; Java's
admin client reads them for every topic created); DescribeConfigs' empty key list (every config); an
invalid topic name told from an unknown one (Metadata without creation, DescribeConfigs); a DeleteTopics
entry naming neither a topic nor an id; Kafka's order of a creation's refusals (the name, the topic existing,
then its configs and partition count)."""

from __future__ import annotations

import datetime

import pytest
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.config_entries import ConfigSource
from tests.kafka.clients import bootstrap
from tests.kafka.raw import RawConnection, nested, request_of, topic_metadata

CREATE_TOPICS = api_table.CREATE_TOPICS
# Kafka 4.0's topic configs (test_describe_configs.py lists them): CreateTopics answers each.
TOPIC_CONFIG_COUNT = 33


def creatable(version: int, name: str, partitions: int = 1, **configs: str):
    return nested(
        CREATE_TOPICS,
        version,
        "CreatableTopic",
        name=name,
        num_partitions=partitions,
        replication_factor=-1,
        assignments=(),
        configs=tuple(
            nested(CREATE_TOPICS, version, "CreatableTopicConfig", name=key, value=value)
            for key, value in configs.items()
        ),
    )


def create_topics(server, version: int, *topics, validate_only: bool = False):
    with RawConnection(bootstrap(server)) as connection:
        return connection.call(
            request_of(
                CREATE_TOPICS,
                version,
                topics=topics,
                timeout=datetime.timedelta(seconds=30),
                validate_only=validate_only,
            )
        ).topics


@pytest.mark.parametrize("version", [5, 7])
@pytest.mark.parametrize("validate_only", [False, True])
def test_a_created_topic_is_answered_with_its_counts_and_every_config(module_kafka_server, version, validate_only):
    """Kafka's controller answers a topic it creates (or would create) with its partition count,
    replication factor and every config, its value and source (a config given at creation is the
    topic's own); never null configs, which Java's admin client would fail on (NullPointerException)."""
    name = f"created-configs-v{version}-{validate_only}"
    (result,) = create_topics(
        module_kafka_server,
        version,
        creatable(version, name, 3, **{"retention.ms": "3600000"}),
        validate_only=validate_only,
    )
    assert (result.error_code, result.topic_config_error_code) == (KafkaError.none, KafkaError.none)
    assert (result.num_partitions, result.replication_factor) == (3, 1)
    assert result.configs is not None
    configs = {config.name: config for config in result.configs}
    assert len(configs) == TOPIC_CONFIG_COUNT
    assert [config.name for config in result.configs] == sorted(configs)  # Kafka's order: by name
    given = configs["retention.ms"]
    assert (given.value, given.config_source, given.read_only, given.is_sensitive) == (
        "3600000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
        False,
        False,
    )
    default = configs["segment.bytes"]
    assert (default.value, default.config_source) == ("1073741824", ConfigSource.DEFAULT_CONFIG)


def test_a_topic_not_created_has_unknown_counts_and_no_configs(module_kafka_server):
    """As Kafka's controller: a refused creation leaves its result's counts at -1 and its configs an
    empty list."""
    (result,) = create_topics(module_kafka_server, 7, creatable(7, "not created!"))
    assert result.error_code == KafkaError.invalid_topic_exception
    assert (result.num_partitions, result.replication_factor, result.configs) == (-1, -1, ())


def describe_configs(server, resource_type: int, name: str, keys):
    describe = api_table.DESCRIBE_CONFIGS
    resource = nested(
        describe, 4, "DescribeConfigsResource", resource_type=resource_type, resource_name=name, configuration_keys=keys
    )
    with RawConnection(bootstrap(server)) as connection:
        (result,) = connection.call(
            request_of(describe, 4, resources=(resource,), include_synonyms=False, include_documentation=False)
        ).results
    assert result.error_code == KafkaError.none
    return [config.name for config in result.configs]


@pytest.mark.parametrize("resource_type", [2, 4], ids=["topic", "broker"])
def test_describe_configs_with_an_empty_key_list_describes_every_config(module_kafka_server, resource_type):
    """A Kafka broker describes every config of a resource whose key list is null or empty
    (ConfigHelper.describeConfigs); kafka-python sends an empty list for a resource given `configs={}`."""
    name = "described-whole" if resource_type == 2 else ""
    if resource_type == 2:
        create_topics(module_kafka_server, 7, creatable(7, name))
    every = describe_configs(module_kafka_server, resource_type, name, None)
    assert len(every) > 10
    assert describe_configs(module_kafka_server, resource_type, name, ()) == every


def test_kafka_python_describes_every_config_of_a_resource_given_no_keys(module_kafka_server):
    """kafka-python's describe_configs of a resource with `configs={}` sends an empty key list: a
    Kafka broker answers every config."""
    name = "described-by-kafka-python"
    create_topics(module_kafka_server, 7, creatable(7, name))
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(module_kafka_server))
    try:
        described = admin.describe_configs(
            [KpConfigResource(ConfigResourceType.TOPIC, name, configs={})], config_filter="all"
        )
    finally:
        admin.close()
    assert len(described["topic"][name]) == TOPIC_CONFIG_COUNT


# Names no topic may have (Kafka's Topic.validate): a character outside [a-zA-Z0-9._-], empty, too long.
INVALID_NAMES = ["no spaces!", "", "x" * 250]


@pytest.mark.parametrize("name", INVALID_NAMES, ids=["character", "empty", "long"])
def test_metadata_without_creation_tells_an_invalid_name_from_an_unknown_one(module_kafka_server, name):
    """As a Kafka broker answers Metadata not allowed to create a topic (a consumer's): a name no
    topic could have is INVALID_TOPIC_EXCEPTION (librdkafka reports a permanent topic error), one
    that could UNKNOWN_TOPIC_OR_PARTITION (it may be created)."""
    assert topic_metadata(bootstrap(module_kafka_server), name, False).error_code == KafkaError.invalid_topic_exception
    unknown = topic_metadata(bootstrap(module_kafka_server), "not-yet-created", False)
    assert unknown.error_code == KafkaError.unknown_topic_or_partition


@pytest.mark.parametrize("name", INVALID_NAMES, ids=["character", "empty", "long"])
def test_describe_configs_of_an_invalid_topic_name_is_invalid_topic_exception(module_kafka_server, name):
    """As a Kafka broker (ConfigHelper: Topic.validate before the topic is looked up)."""
    describe = api_table.DESCRIBE_CONFIGS
    resources = tuple(
        nested(describe, 4, "DescribeConfigsResource", resource_type=2, resource_name=topic, configuration_keys=None)
        for topic in (name, "not-yet-created")
    )
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        results = connection.call(
            request_of(describe, 4, resources=resources, include_synonyms=False, include_documentation=False)
        ).results
    assert [(result.error_code, result.configs) for result in results] == [
        (KafkaError.invalid_topic_exception, ()),
        (KafkaError.unknown_topic_or_partition, ()),
    ]


def test_a_deletion_naming_neither_a_topic_nor_an_id_is_an_invalid_request(module_kafka_server):
    """DeleteTopics v6 as Kafka's controller answers an entry without a name and with the zero id:
    INVALID_REQUEST for each such entry (none taken for a duplicate of another), the others deleted."""
    delete = api_table.DELETE_TOPICS
    create_topics(module_kafka_server, 7, creatable(7, "deleted-beside"))
    entries = (
        nested(delete, 6, "DeleteTopicState", name=None, topic_id=None),
        nested(delete, 6, "DeleteTopicState", name="deleted-beside", topic_id=None),
        nested(delete, 6, "DeleteTopicState", name=None, topic_id=None),
    )
    with RawConnection(bootstrap(module_kafka_server)) as connection:
        answered = connection.call(
            request_of(delete, 6, topics=entries, timeout=datetime.timedelta(seconds=30))
        ).responses
    assert [(r.name, r.topic_id, r.error_code) for r in answered] == [
        (None, None, KafkaError.invalid_request),
        ("deleted-beside", answered[1].topic_id, KafkaError.none),
        (None, None, KafkaError.invalid_request),
    ]
    assert "Neither topic name nor id were specified" in answered[0].error_message
    assert module_kafka_server.client.get("/v1/topics/deleted-beside").status_code == 404


@pytest.mark.parametrize(
    ("partitions", "configs"),
    [
        (1, {"retention.ms": "soon"}),
        (1, {"confluent.value.schema.validation": "true"}),
        (0, {}),
        (100_000, {}),
    ],
    ids=["bad-value", "unknown-config", "no-partitions", "too-many-partitions"],
)
def test_creating_a_topic_that_exists_is_topic_already_exists_whatever_else_it_asks(
    module_kafka_server, partitions, configs
):
    """Kafka's controller checks a creation's name, then whether the topic exists, before its
    configs and partition count: a client that creates its topics when absent (Connect, Streams,
    schema registries) takes TOPIC_ALREADY_EXISTS for "there already". A name no topic may have is
    refused for it first."""
    name = "exists-already"
    create_topics(module_kafka_server, 7, creatable(7, name))
    existing, invalid, new = create_topics(
        module_kafka_server,
        7,
        creatable(7, name, partitions, **configs),
        creatable(7, "no spaces!", partitions, **configs),
        creatable(7, f"absent-{partitions}", partitions, **configs),
    )
    assert existing.error_code == KafkaError.topic_already_exists
    assert invalid.error_code == KafkaError.invalid_topic_exception
    assert new.error_code in (KafkaError.invalid_config, KafkaError.invalid_partitions)
    assert module_kafka_server.client.get(f"/v1/topics/absent-{partitions}").status_code == 404
