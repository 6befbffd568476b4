"""The fields of Kafka's admin answers that its tools read, as a Kafka broker fills them, with raw
requests (each field seen as sent): CreateTopics' configs of a topic it created (v5+, KIP-525; Java's
admin client reads them for every topic created)."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.kafka.config_entries import ConfigSource
from tests.kafka.clients import bootstrap
from tests.kafka.raw import RawConnection, nested, request_of

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
