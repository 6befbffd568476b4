"""Kafka 4.0's group configs (KIP-848): a group's own `consumer.session.timeout.ms` and
`consumer.heartbeat.interval.ms`, set by IncrementalAlterConfigs (and AlterConfigs) on a GROUP
resource (type 32) for a group that need not exist, described by DescribeConfigs with their source,
and taken by the group's consumer-protocol members: the heartbeat interval answered and the session
timeout their eviction counts. With confluent-kafka's AdminClient and raw requests."""

from __future__ import annotations

import time

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from tests.kafka.clients import WAIT_S, bootstrap, create_topic
from tests.kafka.raw import RawConnection, nested, request_of
from tests.kafka.raw_groups import consumer_heartbeat
from tests.kafka.test_alter_configs import alter_configs

# Bounds low enough for a session to lapse within a test (Kafka's defaults are 45000..60000 and
# 5000..15000); the server's own defaults (45000, 5000) stay, so a group's values are told apart.
KAFKA_SERVER_SETTINGS = {
    "group_consumer_min_session_timeout_ms": 500,
    "group_consumer_min_heartbeat_interval_ms": 50,
    "group_session_check_interval_ms": 100,
}
GROUP_RESOURCE = 32
SET, DELETE, APPEND = 0, 1, 2
SESSION, INTERVAL = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"
INT_TYPE, GROUP_CONFIG_SOURCE, DEFAULT_CONFIG_SOURCE = 3, 8, 5


def _alter(server, group: str, configs: dict, operation: int = SET, validate_only: bool = False, key=None):
    """(error code, error message) of one group resource's IncrementalAlterConfigs (or `key`'s)."""
    key = key or api_table.INCREMENTAL_ALTER_CONFIGS
    with RawConnection(bootstrap(server)) as connection:
        (answer,) = connection.call(
            alter_configs(1, [(GROUP_RESOURCE, group, configs)], validate_only, key=key, operation=operation)
        ).responses
    return answer.error_code, answer.error_message


def _described(server, group: str, keys: tuple[str, ...] | None = None):
    """DescribeConfigs v4 of the group, with synonyms and documentation."""
    key, version = api_table.DESCRIBE_CONFIGS, 4
    resource = nested(
        key,
        version,
        "DescribeConfigsResource",
        resource_type=GROUP_RESOURCE,
        resource_name=group,
        configuration_keys=keys,
    )
    with RawConnection(bootstrap(server)) as connection:
        (result,) = connection.call(
            request_of(key, version, resources=(resource,), include_synonyms=True, include_documentation=True)
        ).results
    return result


def _values(server, group: str) -> dict[str, tuple[str, int]]:
    return {config.name: (config.value, config.config_source) for config in _described(server, group).configs}


def test_confluent_kafka_sets_describes_and_deletes_a_groups_configs(module_kafka_server):
    """librdkafka's GROUP resource (its 0081-admin test sets consumer.session.timeout.ms 50000):
    set for a group that does not exist, described as the group's (GROUP_CONFIG), and a DELETE puts
    it back to the server's default."""
    server = module_kafka_server
    group = "group-configs-confluent"
    admin = AdminClient({"bootstrap.servers": bootstrap(server)})

    def alter(*entries: ConfigEntry) -> None:
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=list(entries))
        admin.incremental_alter_configs([resource])[resource].result(WAIT_S)

    def described() -> dict[str, tuple[str, ConfigSource]]:
        resource = ConfigResource(ResourceType.GROUP, group)
        entries = admin.describe_configs([resource])[resource].result(WAIT_S)
        return {name: (entry.value, ConfigSource(entry.source)) for name, entry in entries.items()}

    assert described() == {
        SESSION: ("45000", ConfigSource.DEFAULT_CONFIG),
        INTERVAL: ("5000", ConfigSource.DEFAULT_CONFIG),
    }
    alter(
        ConfigEntry(SESSION, "50000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry(INTERVAL, "6000", incremental_operation=AlterConfigOpType.SET),
    )
    assert described() == {
        SESSION: ("50000", ConfigSource.GROUP_CONFIG),
        INTERVAL: ("6000", ConfigSource.GROUP_CONFIG),
    }
    alter(ConfigEntry(SESSION, None, incremental_operation=AlterConfigOpType.DELETE))
    assert described() == {
        SESSION: ("45000", ConfigSource.DEFAULT_CONFIG),
        INTERVAL: ("6000", ConfigSource.GROUP_CONFIG),
    }


def test_a_groups_config_is_described_with_its_synonym_type_and_documentation(module_kafka_server):
    """As Kafka's broker describes a group: its own value first (DYNAMIC_GROUP_CONFIG, 8), then the
    broker config that is its default ("group." and its name), INT, not read-only; the keys asked
    only; an empty group name is INVALID_REQUEST."""
    server = module_kafka_server
    group = "group-configs-described"
    assert _alter(server, group, {SESSION: "50000"}) == (KafkaError.none, None)

    result = _described(server, group)
    assert result.error_code == KafkaError.none
    configs = {config.name: config for config in result.configs}
    assert set(configs) == {SESSION, INTERVAL}
    session = configs[SESSION]
    assert (session.value, session.config_source, session.config_type, session.read_only) == (
        "50000",
        GROUP_CONFIG_SOURCE,
        INT_TYPE,
        False,
    )
    assert [(s.name, s.value, s.source) for s in session.synonyms] == [
        (SESSION, "50000", GROUP_CONFIG_SOURCE),
        ("group.consumer.session.timeout.ms", "45000", DEFAULT_CONFIG_SOURCE),
    ]
    assert session.documentation
    interval = configs[INTERVAL]
    assert [(s.name, s.value, s.source) for s in interval.synonyms] == [
        ("group.consumer.heartbeat.interval.ms", "5000", DEFAULT_CONFIG_SOURCE)
    ]
    assert interval.config_source == DEFAULT_CONFIG_SOURCE

    assert [c.name for c in _described(server, group, (INTERVAL, "no.such.config")).configs] == [INTERVAL]
    empty = _described(server, "")
    assert (empty.error_code, empty.configs) == (KafkaError.invalid_request, ())


def test_members_heartbeat_at_the_groups_interval_and_lapse_after_its_session_timeout(module_kafka_server):
    """The group's configs, set before it exists, are its members': the interval their heartbeats
    are answered, and the session timeout (800 ms, where the server's is 45 s) after which one
    that stopped heartbeating is removed; deleted, the server's interval is answered again."""
    server = module_kafka_server
    topic, group = "group-configs-members", "group-configs-members-group"
    create_topic(server, topic, 1)
    assert _alter(server, group, {SESSION: "800", INTERVAL: "123"}) == (KafkaError.none, None)

    with RawConnection(bootstrap(server)) as connection:
        joined = consumer_heartbeat(connection, group, "member-a", 0, [topic])
        assert joined.error_code == KafkaError.none
        assert joined.heartbeat_interval.total_seconds() == 0.123
        other = consumer_heartbeat(connection, f"{group}-without-configs", "member-b", 0, [topic])
        assert other.heartbeat_interval.total_seconds() == 5

        time.sleep(1.5)  # past the group's session timeout, far within the server's
        lapsed = consumer_heartbeat(connection, group, "member-a", joined.member_epoch)
        assert lapsed.error_code == KafkaError.unknown_member_id, lapsed

        # The interval alone back to the server's (5000) would not be below the group's session (800).
        assert _alter(server, group, {INTERVAL: None}, operation=DELETE)[0] == KafkaError.invalid_config
        assert _alter(server, group, {SESSION: None, INTERVAL: None}, operation=DELETE) == (KafkaError.none, None)
        rejoined = consumer_heartbeat(connection, group, "member-a", 0, [topic])
        assert rejoined.error_code == KafkaError.none
        assert rejoined.heartbeat_interval.total_seconds() == 5


def test_unknown_names_and_values_outside_the_bounds_are_refused(module_kafka_server):
    """As Kafka's broker validates a group's configs: INVALID_CONFIG for a name that is not one of
    them (share groups' too: txbroker has none), a value that is not an INT of at least 1, one
    outside the server's bounds, a session timeout not above the heartbeat interval (a value the
    group does not set being the server's), and APPEND on an INT; nothing is stored then, nor by
    validate_only."""
    server = module_kafka_server
    group = "group-configs-refused"
    refused = [
        ({"consumer.no.such.config": "1"}, SET, "Unknown group config name"),
        ({"share.session.timeout.ms": "45000"}, SET, "Unknown group config name"),
        ({"consumer.no.such.config": None}, DELETE, "Unknown group config name"),
        ({SESSION: "soon"}, SET, "Not a number of type INT"),
        ({SESSION: "0"}, SET, "at least 1"),
        ({SESSION: "400"}, SET, "greater than or equal to group.consumer.min.session.timeout.ms"),
        ({SESSION: "60001"}, SET, "less than or equal to group.consumer.max.session.timeout.ms"),
        ({INTERVAL: "49"}, SET, "greater than or equal to group.consumer.min.heartbeat.interval.ms"),
        ({INTERVAL: "15001"}, SET, "less than or equal to group.consumer.max.heartbeat.interval.ms"),
        ({SESSION: "1000", INTERVAL: "1000"}, SET, "must be greater than consumer.heartbeat.interval.ms"),
        ({SESSION: "4000"}, SET, "must be greater than consumer.heartbeat.interval.ms"),  # the server's: 5000
        ({SESSION: "1000"}, APPEND, "expected 0 (set) or 1 (delete)"),
    ]
    for configs, operation, message in refused:
        code, text = _alter(server, group, configs, operation)
        assert code == KafkaError.invalid_config and message in text, (configs, operation, text)
    assert _alter(server, group, {SESSION: "50000"}, validate_only=True) == (KafkaError.none, None)
    assert _values(server, group) == {
        SESSION: ("45000", DEFAULT_CONFIG_SOURCE),
        INTERVAL: ("5000", DEFAULT_CONFIG_SOURCE),
    }
    assert _alter(server, "", {SESSION: "50000"})[0] == KafkaError.invalid_request


def test_alter_configs_replaces_a_groups_configs(module_kafka_server):
    """AlterConfigs (the non-incremental one) on a group: the configs given are set, the others go
    back to the server's defaults."""
    server = module_kafka_server
    group = "group-configs-replaced"
    assert _alter(server, group, {SESSION: "50000", INTERVAL: "6000"}) == (KafkaError.none, None)
    assert _alter(server, group, {INTERVAL: "7000"}, key=api_table.ALTER_CONFIGS) == (KafkaError.none, None)
    assert _values(server, group) == {
        SESSION: ("45000", DEFAULT_CONFIG_SOURCE),
        INTERVAL: ("7000", GROUP_CONFIG_SOURCE),
    }


def test_a_value_java_does_not_read_as_an_int_is_refused(module_kafka_server):
    """Regression: a value was read by Python's int(), which also takes "50_000" (Python's digit
    grouping) and stored it as 50000; Kafka's broker reads an INT config with Java's
    Integer.parseInt, which refuses it (INVALID_CONFIG, "Not a number of type INT"), as txbroker's
    topic configs already did. Spaces around the digits are trimmed, as Kafka trims them."""
    server = module_kafka_server
    group = "group-configs-java-ints"
    for text in ("50_000", "5_0000", "50 000"):
        code, message = _alter(server, group, {SESSION: text})
        assert code == KafkaError.invalid_config and "Not a number of type INT" in message, (text, message)
    assert _values(server, group)[SESSION] == ("45000", DEFAULT_CONFIG_SOURCE)
    assert _alter(server, group, {SESSION: " +50000 "}) == (KafkaError.none, None)
    assert _values(server, group)[SESSION] == ("50000", GROUP_CONFIG_SOURCE)
