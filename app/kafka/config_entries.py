"""DescribeConfigs' entries as a Kafka broker gives them: each with its source and synonyms (KIP-226)
and its type and documentation (KIP-569). A topic is described by txbroker's topic configs under
Kafka's names; the broker (this node) by the server settings that are Kafka broker configs, under
those configs' names. Tools read both: Kafka UIs, Terraform providers and kafka-python show a
broker's `advertised.listeners`, and read each config's type to parse its value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from app.settings import Settings


class ConfigType(IntEnum):
    """Kafka's ConfigEntry.ConfigType ids, as DescribeConfigs v3+ sends them."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(IntEnum):
    """Kafka's DescribeConfigsResponse.ConfigSource ids (v1+)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """One config as DescribeConfigs answers it. `synonyms`: where its value could come from, in
    Kafka's order of precedence, itself first (sent when the request asks for synonyms)."""

    name: str
    value: str | None
    source: ConfigSource
    config_type: ConfigType
    documentation: str
    read_only: bool
    synonyms: tuple[Synonym, ...]

    @property
    def is_default(self) -> bool:
        """DescribeConfigs v0's flag: the value is no one's choice (Kafka: source DEFAULT_CONFIG)."""
        return self.source == ConfigSource.DEFAULT_CONFIG


@dataclass(frozen=True, slots=True)
class _TopicConfig:
    config_type: ConfigType
    # The broker config that gives topics their default (Kafka's synonym), and the server setting
    # that is it (None: txbroker's default is fixed, never set by the operator).
    broker_config: str
    setting: str | None
    documentation: str


# txbroker's topic configs (topic_admin.DEFAULT_TOPIC_CONFIG's keys, under Kafka's names).
TOPIC_CONFIGS = {
    "cleanup.policy": _TopicConfig(
        ConfigType.LIST,
        "log.cleanup.policy",
        "log_cleanup_policy",
        "delete (retention by time and size), compact (the last record of each key kept), or both",
    ),
    "delete.retention.ms": _TopicConfig(
        ConfigType.LONG,
        "log.cleaner.delete.retention.ms",
        "log_delete_retention_ms",
        "how long compaction keeps a tombstone (a null value) once it reaches it",
    ),
    "max.message.bytes": _TopicConfig(
        ConfigType.INT,
        "message.max.bytes",
        None,
        "the largest record batch the topic accepts, in bytes as stored",
    ),
    "retention.bytes": _TopicConfig(
        ConfigType.LONG,
        "log.retention.bytes",
        "log_retention_bytes",
        "the most bytes a partition keeps before retention deletes its oldest batches (-1: no limit)",
    ),
    "retention.ms": _TopicConfig(
        ConfigType.LONG,
        "log.retention.ms",
        "log_retention_ms",
        "how long a batch is kept before retention deletes it (-1: forever)",
    ),
}


def _server_source(settings: Settings, setting: str | None) -> ConfigSource:
    """Set by the operator (flag or environment): Kafka's static broker config; else the default."""
    if setting is not None and setting in settings.model_fields_set:
        return ConfigSource.STATIC_BROKER_CONFIG
    return ConfigSource.DEFAULT_CONFIG


def topic_config(settings: Settings, name: str, value: str, server_default: str) -> DescribedConfig:
    """A topic config: the topic's own value when it differs from the server's default for new
    topics (Kafka: a topic override), else that default, from where the server has it."""
    config = TOPIC_CONFIGS[name]
    server = Synonym(config.broker_config, server_default, _server_source(settings, config.setting))
    if value != server_default:
        source = ConfigSource.DYNAMIC_TOPIC_CONFIG
        synonyms = (Synonym(name, value, source), server)
    else:
        source, synonyms = server.source, (server,)
    return DescribedConfig(name, value, source, config.config_type, config.documentation, False, synonyms)


@dataclass(frozen=True, slots=True)
class _BrokerConfig:
    config_type: ConfigType
    setting: str | None  # the server setting that is it (None: fixed by txbroker)
    documentation: str
    value: Callable[[Settings, str], object]  # (settings, this listener's advertised "PROTOCOL://host:port")


def _setting(name: str) -> Callable[[Settings, str], object]:
    return lambda settings, _advertised: getattr(settings, name)


def _fixed(value: object) -> Callable[[Settings, str], object]:
    return lambda _settings, _advertised: value


def _config(config_type: ConfigType, setting: str, documentation: str) -> _BrokerConfig:
    return _BrokerConfig(config_type, setting, documentation, _setting(setting))


# The server settings that are Kafka broker configs, under Kafka's names; each is read-only here
# (a KRaft broker's static config): they change with a restart, never by AlterConfigs.
BROKER_CONFIGS: dict[str, _BrokerConfig] = {
    "advertised.listeners": _BrokerConfig(
        ConfigType.STRING,
        "kafka_advertised_listener",
        "what Metadata gives Kafka clients as this node's address (--kafka-advertised-listener)",
        lambda _settings, advertised: advertised,
    ),
    "auto.create.topics.enable": _config(
        ConfigType.BOOLEAN, "kafka_auto_create_topics", "Metadata creates unknown topics a client asks for"
    ),
    "connections.max.idle.ms": _config(
        ConfigType.LONG, "kafka_connections_max_idle_ms", "a Kafka connection idle this long is closed"
    ),
    "group.initial.rebalance.delay.ms": _config(
        ConfigType.INT, "group_initial_rebalance_delay_ms", "how long an empty group waits for more members"
    ),
    "group.max.session.timeout.ms": _config(
        ConfigType.INT, "group_max_session_timeout_ms", "the longest session timeout a group member may ask"
    ),
    "group.min.session.timeout.ms": _config(
        ConfigType.INT, "group_min_session_timeout_ms", "the shortest session timeout a group member may ask"
    ),
    "listeners": _BrokerConfig(
        ConfigType.STRING,
        "kafka_listener",
        "where this node's Kafka listener is bound (--kafka-listener)",
        lambda settings, advertised: f"{advertised.partition('://')[0]}://{settings.kafka_listener}",
    ),
    "log.cleaner.delete.retention.ms": _config(
        ConfigType.LONG, "log_delete_retention_ms", "delete.retention.ms of topics created without one"
    ),
    "log.cleanup.policy": _config(
        ConfigType.LIST, "log_cleanup_policy", "cleanup.policy of topics created without one"
    ),
    "log.retention.bytes": _config(
        ConfigType.LONG, "log_retention_bytes", "retention.bytes of topics created without one"
    ),
    "log.retention.check.interval.ms": _config(
        ConfigType.LONG, "log_cleaner_interval_ms", "how often retention, DeleteRecords and compaction are applied"
    ),
    "log.retention.ms": _config(ConfigType.LONG, "log_retention_ms", "retention.ms of topics created without one"),
    "message.max.bytes": _BrokerConfig(
        ConfigType.INT, None, "max.message.bytes of topics created without one", _fixed(1_048_576)
    ),
    "node.id": _config(ConfigType.INT, "node_id", "this node's id"),
    "offset.metadata.max.bytes": _BrokerConfig(
        ConfigType.INT, None, "the longest metadata an offset commit may carry", _fixed(4096)
    ),
    "offsets.topic.num.partitions": _config(
        ConfigType.INT, "offsets_partitions", "partitions of __consumer_offsets (fixed when it is created)"
    ),
    "producer.id.expiration.ms": _config(
        ConfigType.INT, "producer_id_expiration_ms", "how long an idle idempotent producer's state is kept"
    ),
    "socket.request.max.bytes": _config(
        ConfigType.INT, "kafka_max_request_bytes", "the largest Kafka request frame accepted"
    ),
    "transaction.max.timeout.ms": _config(
        ConfigType.INT, "transaction_max_timeout_ms", "the longest transaction timeout a producer may ask"
    ),
    "transaction.state.log.num.partitions": _config(
        ConfigType.INT, "transaction_log_partitions", "partitions of __transaction_state (fixed when it is created)"
    ),
    "transactional.id.expiration.ms": _config(
        ConfigType.INT, "transactional_id_expiration_ms", "how long an idle transactional id is kept"
    ),
}


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def broker_configs(settings: Settings, advertised: str, names: list[str] | None) -> list[DescribedConfig]:
    """This node's broker configs (`names`: only those, in Kafka's way: unknown names left out;
    None: every one), `advertised` its Kafka listener as clients reach it ("PROTOCOL://host:port")."""
    described = []
    for name, config in sorted(BROKER_CONFIGS.items()):
        if names is not None and name not in names:
            continue
        value = _text(config.value(settings, advertised))
        source = _server_source(settings, config.setting)
        described.append(
            DescribedConfig(
                name, value, source, config.config_type, config.documentation, True, (Synonym(name, value, source),)
            )
        )
    return described
