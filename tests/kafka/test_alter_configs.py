"""Kafka's AlterConfigs (33), the non-incremental one: a topic's configs become those the request
gives, every other one back to the server's default. With confluent-kafka's (deprecated)
`alter_configs`, aiokafka's and kafka-python's (told not to use IncrementalAlterConfigs), and raw
requests for what the clients hide: per-resource errors, validate_only, null values, a resource
or a config named twice (also IncrementalAlterConfigs'). Each checked over HTTP."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from kio.schema.errors import ErrorCode as KafkaError

from app.coordinator.topic_admin import KAFKA_CONFIG_DEFAULTS
from app.kafka import api_table
from tests.api.test_log_lifecycle import sql
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_of

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
SET, DELETE = 0, 1  # IncrementalAlterConfigs' operations


def http_config(server, topic: str) -> dict:
    response = server.client.get(f"/v1/topics/{topic}")
    response.raise_for_status()
    return response.json()["config"]


def confluent_replace(server, topic: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config=configs)
    admin.alter_configs([resource])[resource].result(WAIT_S)


def aiokafka_replace(server, topic: str, configs: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType

    async def run() -> list:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap(server))
        await admin.start()
        try:
            return await admin.alter_configs([AioConfigResource(ConfigResourceType.TOPIC, topic, configs)])
        finally:
            await admin.close()

    [response] = asyncio.run(run())
    assert [(r[0], r[3]) for r in response.resources] == [(0, topic)], response  # (error_code, ..., name)


def confluent_described(server, topic: str) -> dict[str, tuple[str, bool]]:
    """Kafka's DescribeConfigs of the topic: (value, is_default) by config name."""
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {
        name: (e.value, e.is_default) for name, e in admin.describe_configs([resource])[resource].result(WAIT_S).items()
    }


@pytest.mark.parametrize("replace", [confluent_replace, aiokafka_replace], ids=["confluent-kafka", "aiokafka"])
def test_alter_configs_replaces_the_topics_configs(module_kafka_server, replace):
    server = module_kafka_server
    topic = f"alter-configs-{replace.__name__}"
    create_topic(server, topic)
    defaults = http_config(server, topic)

    replace(server, topic, {"retention.ms": "60000", "cleanup.policy": "compact"})
    assert http_config(server, topic) == {**defaults, "retention_ms": 60000, "cleanup_policy": "compact"}
    described = confluent_described(server, topic)
    assert described["retention.ms"] == ("60000", False)
    assert described["cleanup.policy"] == ("compact", False)

    # Not incremental: what the second request leaves out goes back to the server's default.
    replace(server, topic, {"retention.bytes": "5000000"})
    assert http_config(server, topic) == {**defaults, "retention_bytes": 5000000}
    described = confluent_described(server, topic)
    assert described["retention.ms"] == (str(defaults["retention_ms"]), True)
    assert described["cleanup.policy"] == (defaults["cleanup_policy"], True)
    assert described["retention.bytes"] == ("5000000", False)


def test_kafka_python_alter_configs_without_incremental(module_kafka_server):
    """kafka-python sends AlterConfigs when told not to use IncrementalAlterConfigs, and adds the
    configs already set that the call leaves out (so its calls never reset any)."""
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    server = module_kafka_server
    topic = "alter-configs-kafka-python"
    create_topic(server, topic)
    defaults = http_config(server, topic)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(server))
    try:
        for configs in ({"retention.ms": "60000"}, {"max.message.bytes": "500000"}):
            answered = admin.alter_configs(
                [KpConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)], incremental=False
            )
            assert answered == {"topic": {topic: "OK"}}
        described = admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, topic)])
        assert {name: c["value"] for name, c in described["topic"][topic].items()} == {
            "retention.ms": "60000",
            "max.message.bytes": "500000",
        }
    finally:
        admin.close()
    assert http_config(server, topic) == {**defaults, "retention_ms": 60000, "max_message_bytes": 500000}


def alter_configs(
    version: int,
    resources: list[tuple[int, str, dict[str, str | None] | list[tuple[str, str | None]]]],
    validate_only: bool = False,
    key: int = api_table.ALTER_CONFIGS,
    operation: int = SET,
):
    """An AlterConfigs request (`key` IncrementalAlterConfigs: each config's `operation`); a
    resource's configs by name, or as (name, value) pairs, which may name a config twice."""
    return request_of(
        key,
        version,
        resources=tuple(
            nested(
                key,
                version,
                "AlterConfigsResource",
                resource_type=resource_type,
                resource_name=name,
                configs=tuple(
                    nested(key, version, "AlterableConfig", name=n, value=v, config_operation=operation)
                    for n, v in (configs.items() if isinstance(configs, dict) else configs)
                ),
            )
            for resource_type, name, configs in resources
        ),
        validate_only=validate_only,
    )


@pytest.mark.parametrize("version", api_table.SUPPORTED_VERSIONS[api_table.ALTER_CONFIGS])
def test_each_resource_is_answered_on_its_own(module_kafka_server, version):
    """An invalid value or an unknown config fails its resource only (INVALID_CONFIG with a message),
    a broker's configs are answered as IncrementalAlterConfigs answers them; a config left out goes
    back to its default."""
    server = module_kafka_server
    applied, invalid, unknown = (f"alter-configs-v{version}-{n}" for n in ("applied", "invalid", "unknown"))
    for topic in (applied, invalid, unknown):
        create_topic(server, topic)
    defaults = http_config(server, applied)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        # Configs set before, which the next request leaves out: back to the defaults where applied.
        before = {"max.message.bytes": "500000", "cleanup.policy": "compact"}
        set_before = [(TOPIC_RESOURCE, t, before) for t in (applied, invalid, unknown)]
        assert {r.error_code for r in connection.call(alter_configs(version, set_before)).responses} == {
            KafkaError.none
        }
        response = connection.call(
            alter_configs(
                version,
                [
                    (TOPIC_RESOURCE, applied, {"retention.ms": "60000"}),
                    (TOPIC_RESOURCE, invalid, {"retention.ms": "soon"}),
                    (TOPIC_RESOURCE, unknown, {"no.such.config": "1"}),
                    (BROKER_RESOURCE, "0", {"log.retention.ms": "1"}),
                ],
            )
        )
    answers = [(r.resource_name, r.error_code) for r in response.responses]
    assert answers == [
        (applied, KafkaError.none),
        (invalid, KafkaError.invalid_config),
        (unknown, KafkaError.invalid_config),
        ("0", KafkaError.invalid_request),
    ]
    messages = [r.error_message for r in response.responses]
    assert messages[0] is None
    # Kafka's own messages (its ConfigException and LogConfig.validateNames).
    assert "Invalid value soon for configuration retention.ms" in messages[1]
    assert "Not a number of type LONG" in messages[1]
    assert "Unknown topic config name: no.such.config" in messages[2]
    assert http_config(server, applied) == {**defaults, "retention_ms": 60000}
    for untouched in (invalid, unknown):
        assert http_config(server, untouched) == {**defaults, "max_message_bytes": 500000, "cleanup_policy": "compact"}


@pytest.mark.parametrize(
    "key", [api_table.ALTER_CONFIGS, api_table.INCREMENTAL_ALTER_CONFIGS], ids=["AlterConfigs", "Incremental"]
)
def test_a_resource_named_twice_is_altered_by_neither_mention(module_kafka_server, key):
    """As a Kafka broker: each mention of a repeated resource is INVALID_REQUEST and none applied;
    the other resources are altered."""
    server = module_kafka_server
    twice, once = f"alter-configs-{key}-twice", f"alter-configs-{key}-once"
    for topic in (twice, once):
        create_topic(server, topic)
    defaults = http_config(server, twice)
    resources = [
        (TOPIC_RESOURCE, twice, {"retention.ms": "60000"}),
        (TOPIC_RESOURCE, once, {"retention.ms": "70000"}),
        (TOPIC_RESOURCE, twice, {"max.message.bytes": "500000"}),
    ]
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        response = connection.call(alter_configs(max(api_table.SUPPORTED_VERSIONS[key]), resources, key=key))
    assert [(r.resource_name, r.error_code) for r in response.responses] == [
        (twice, KafkaError.invalid_request),
        (once, KafkaError.none),
        (twice, KafkaError.invalid_request),
    ]
    assert all("named 2 times" in response.responses[i].error_message for i in (0, 2))
    assert http_config(server, twice) == defaults
    assert http_config(server, once) == {**defaults, "retention_ms": 70000}


# Resources a Kafka broker refuses whole in its preprocessing (ConfigAdminManager.preprocess), with
# what its message says: a config named twice, and a null value where one is needed.
REFUSED_RESOURCES = {
    "config-twice": (
        [("retention.ms", "60000"), ("max.message.bytes", "500000"), ("retention.ms", "70000")],
        ("duplicate config keys", "['retention.ms']"),
    ),
    "null-value": (
        {"retention.ms": "60000", "cleanup.policy": None},
        ("Null value not supported for : cleanup.policy",),
    ),
}


@pytest.mark.parametrize("refused", sorted(REFUSED_RESOURCES))
@pytest.mark.parametrize(
    "key", [api_table.ALTER_CONFIGS, api_table.INCREMENTAL_ALTER_CONFIGS], ids=["AlterConfigs", "Incremental"]
)
def test_a_refused_resource_is_left_unaltered_and_the_others_are_altered(module_kafka_server, key, refused):
    """As a Kafka broker: a resource naming a config more than once, or giving one a null value
    (IncrementalAlterConfigs: setting one to null), is INVALID_REQUEST and none of its alterations
    applies, not even its other configs; the other resources are altered."""
    server = module_kafka_server
    configs, said = REFUSED_RESOURCES[refused]
    refused_topic, altered_topic = f"alter-configs-{key}-{refused}", f"alter-configs-{key}-{refused}-beside"
    for topic in (refused_topic, altered_topic):
        create_topic(server, topic)
    defaults = http_config(server, refused_topic)
    request = alter_configs(
        max(api_table.SUPPORTED_VERSIONS[key]),
        [(TOPIC_RESOURCE, refused_topic, configs), (TOPIC_RESOURCE, altered_topic, {"retention.ms": "80000"})],
        key=key,
    )
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        response = connection.call(request)
    assert [(r.resource_name, r.error_code) for r in response.responses] == [
        (refused_topic, KafkaError.invalid_request),
        (altered_topic, KafkaError.none),
    ]
    assert all(text in response.responses[0].error_message for text in said)
    assert http_config(server, refused_topic) == defaults
    assert http_config(server, altered_topic) == {**defaults, "retention_ms": 80000}


def test_an_incremental_delete_takes_no_value(module_kafka_server):
    """IncrementalAlterConfigs' DELETE puts a config back to its default, its null value as Kafka takes it."""
    server = module_kafka_server
    topic = "alter-configs-incremental-delete"
    create_topic(server, topic)
    defaults = http_config(server, topic)
    key = api_table.INCREMENTAL_ALTER_CONFIGS
    version = max(api_table.SUPPORTED_VERSIONS[key])
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        connection.call(alter_configs(version, [(TOPIC_RESOURCE, topic, {"retention.ms": "60000"})], key=key))
        assert http_config(server, topic) == {**defaults, "retention_ms": 60000}
        deleted = alter_configs(version, [(TOPIC_RESOURCE, topic, {"retention.ms": None})], key=key, operation=DELETE)
        response = connection.call(deleted)
    assert [r.error_code for r in response.responses] == [KafkaError.none]
    assert http_config(server, topic) == defaults


def test_validate_only_changes_nothing(module_kafka_server):
    server = module_kafka_server
    topic = "alter-configs-validated"
    create_topic(server, topic)
    with RawConnection(server.extra["kafka_bootstrap"]) as connection:
        connection.call(alter_configs(2, [(TOPIC_RESOURCE, topic, {"retention.ms": "60000"})]))
        before = http_config(server, topic)
        checked = connection.call(
            alter_configs(2, [(TOPIC_RESOURCE, topic, {"retention.bytes": "5000"})], validate_only=True)
        )
        refused = connection.call(
            alter_configs(2, [(TOPIC_RESOURCE, topic, {"retention.bytes": "lots"})], validate_only=True)
        )
    assert [r.error_code for r in checked.responses] == [KafkaError.none]
    assert [r.error_code for r in refused.responses] == [KafkaError.invalid_config]
    assert http_config(server, topic) == before
    assert before["retention_ms"] == 60000


def test_cleanup_policy_is_kafkas_list_in_the_order_given_and_may_be_empty(module_kafka_server):
    """Regression (found by confluent-kafka-python's own test_incremental_alter_configs): APPEND of
    `compact` to `delete` was described `compact,delete` (txbroker sorted the list, Kafka appends at
    its end: `delete,compact`), and SUBTRACT of the last policy was INVALID_CONFIG where Kafka keeps
    the empty list (neither policy). Each read back over Kafka and over HTTP."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    server = module_kafka_server
    appended, emptied = "cleanup-policy-appended", "cleanup-policy-emptied"
    for topic in (appended, emptied):
        create_topic(server, topic, 1)
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})
    alterations = {
        appended: ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        emptied: ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
    }
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t, incremental_configs=[e]) for t, e in alterations.items()]
    for future in admin.incremental_alter_configs(resources).values():
        future.result(WAIT_S)
    assert confluent_described(server, appended)["cleanup.policy"] == ("delete,compact", False)
    assert confluent_described(server, emptied)["cleanup.policy"] == ("", False)
    assert (http_config(server, appended)["cleanup_policy"], http_config(server, emptied)["cleanup_policy"]) == (
        "delete,compact",
        "",
    )


def test_a_stored_value_that_breaks_a_newer_bound_refuses_only_a_change_of_its_own_key(module_kafka_server):
    """Regression: a value stored before a bound it breaks existed (a `max_message_bytes` above
    2^31-1, which HTTP's CreateTopics once took) refused every later change of the topic's configs,
    where Kafka validates only the configs a change sets. A change of another key is made and the
    old value kept and described as stored; setting that key is checked; AlterConfigs, which
    replaces every config, takes it back to the default."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    server = module_kafka_server
    topic, beyond_int32 = "alter-beside-an-old-value", 3_000_000_000
    create_topic(server, topic, 1)
    sql(
        server.database_url,
        "UPDATE topics SET config = jsonb_set(config, '{max_message_bytes}', to_jsonb($2::bigint)) WHERE name = $1",
        topic,
        beyond_int32,
    )
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})

    def incremental_set(name: str, value: str) -> None:
        entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
        admin.incremental_alter_configs([resource])[resource].result(WAIT_S)

    incremental_set("retention.ms", "1234")
    assert http_config(server, topic)["retention_ms"] == 1234
    assert http_config(server, topic)["max_message_bytes"] == beyond_int32
    assert confluent_described(server, topic)["max.message.bytes"] == (str(beyond_int32), False)
    with pytest.raises(KafkaException) as refused:
        incremental_set("max.message.bytes", str(beyond_int32 + 1))
    assert refused.value.args[0].code() == KafkaError.invalid_config
    assert http_config(server, topic)["max_message_bytes"] == beyond_int32
    confluent_replace(server, topic, {"retention.ms": "5678"})
    assert (http_config(server, topic)["retention_ms"], http_config(server, topic)["max_message_bytes"]) == (
        5678,
        KAFKA_CONFIG_DEFAULTS["max_message_bytes"],
    )
