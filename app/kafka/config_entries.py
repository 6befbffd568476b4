"""DescribeConfigs' entries as a Kafka broker gives them: each with its source and synonyms (KIP-226)
and its type and documentation (KIP-569). A topic is described by txbroker's topic configs under
Kafka's names; the broker (this node) by the server settings that are Kafka broker configs, under
those configs' names; a group by its own configs (Kafka 4.0's group configs). Tools read them: Kafka
UIs, Terraform providers and kafka-python show a broker's `advertised.listeners`, and read each
config's type to parse its value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from app.kafka.listener_addresses import node_listeners
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
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    DYNAMIC_CLIENT_METRICS_CONFIG = 7
    DYNAMIC_GROUP_CONFIG = 8


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


# Each topic config's synonym, as Kafka's ServerTopicConfigSynonyms names it: the broker config that
# gives topics their default, and the server setting that is it (None: txbroker's default is Kafka's
# and fixed). A topic config without one (throttled replicas, tiered storage) has its default alone.
TOPIC_CONFIG_SYNONYMS: dict[str, tuple[str, str | None]] = {
    "cleanup.policy": ("log.cleanup.policy", "log_cleanup_policy"),
    "compression.gzip.level": ("compression.gzip.level", None),
    "compression.lz4.level": ("compression.lz4.level", None),
    "compression.type": ("compression.type", None),
    "compression.zstd.level": ("compression.zstd.level", None),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms", "log_delete_retention_ms"),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms", None),
    "flush.messages": ("log.flush.interval.messages", None),
    "flush.ms": ("log.flush.interval.ms", None),
    "index.interval.bytes": ("log.index.interval.bytes", None),
    "local.retention.bytes": ("log.local.retention.bytes", None),
    "local.retention.ms": ("log.local.retention.ms", None),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms", None),
    "max.message.bytes": ("message.max.bytes", None),
    "message.timestamp.after.max.ms": ("log.message.timestamp.after.max.ms", None),
    "message.timestamp.before.max.ms": ("log.message.timestamp.before.max.ms", None),
    "message.timestamp.type": ("log.message.timestamp.type", None),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio", None),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms", None),
    "min.insync.replicas": ("min.insync.replicas", None),
    "preallocate": ("log.preallocate", None),
    "retention.bytes": ("log.retention.bytes", "log_retention_bytes"),
    "retention.ms": ("log.retention.ms", "log_retention_ms"),
    "segment.bytes": ("log.segment.bytes", None),
    "segment.index.bytes": ("log.index.size.max.bytes", None),
    "segment.jitter.ms": ("log.roll.jitter.ms", None),
    "segment.ms": ("log.roll.ms", None),
    "unclean.leader.election.enable": ("unclean.leader.election.enable", None),
}


def _server_source(settings: Settings, setting: str | None) -> ConfigSource:
    """Set by the operator (flag or environment): Kafka's static broker config; else the default."""
    if setting is not None and setting in settings.model_fields_set:
        return ConfigSource.STATIC_BROKER_CONFIG
    return ConfigSource.DEFAULT_CONFIG


def topic_config(
    settings: Settings, name: str, value: str, server_default: str, kind: str, documentation: str
) -> DescribedConfig:
    """A topic config (`kind`: Kafka's type name, e.g. LONG): the topic's own value when it differs
    from the server's default for new topics (Kafka: a topic override), else that default, from where
    the server has it."""
    config_type = ConfigType[kind]
    synonym = TOPIC_CONFIG_SYNONYMS.get(name)
    if synonym is None:
        server = Synonym(name, server_default, ConfigSource.DEFAULT_CONFIG)
        defaults: tuple[Synonym, ...] = ()
    else:
        server = Synonym(synonym[0], server_default, _server_source(settings, synonym[1]))
        defaults = (server,)
    if value != server_default:
        source = ConfigSource.DYNAMIC_TOPIC_CONFIG
        synonyms = (Synonym(name, value, source), *defaults)
    else:
        source, synonyms = server.source, defaults
    return DescribedConfig(name, value, source, config_type, documentation, False, synonyms)


@dataclass(frozen=True, slots=True)
class _BrokerConfig:
    config_type: ConfigType
    setting: str | None  # the server setting that is it (None: fixed by txbroker)
    documentation: str
    # (settings, this node's listeners as clients reach them, "PROTOCOL://host:port,...")
    value: Callable[[Settings, str], object]


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
        "what Metadata gives Kafka clients as this node's addresses, one per listener (--kafka-advertised-listener)",
        lambda _settings, advertised: advertised,
    ),
    "auto.create.topics.enable": _config(
        ConfigType.BOOLEAN, "kafka_auto_create_topics", "Metadata creates unknown topics a client asks for"
    ),
    "connections.max.idle.ms": _config(
        ConfigType.LONG, "kafka_connections_max_idle_ms", "a Kafka connection idle this long is closed"
    ),
    "default.replication.factor": _BrokerConfig(
        ConfigType.INT,
        None,
        "replicas of a topic created without a replication factor: one (a partition's durability is PostgreSQL's)",
        _fixed(1),
    ),
    "fetch.max.bytes": _config(
        ConfigType.INT, "kafka_fetch_max_bytes", "the most bytes of batches one Fetch is answered"
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
        "where this node's Kafka listeners are bound (--kafka-listener)",
        lambda settings, _advertised: _bound_listeners(settings),
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
    "num.partitions": _config(
        ConfigType.INT, "num_partitions", "partitions of a topic created without a count (or auto-created)"
    ),
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


def _bound_listeners(settings: Settings) -> str:
    """Kafka's `listeners`: each listener as PROTOCOL://HOST:PORT, comma-separated."""
    return ",".join(listener.text for listener in node_listeners(settings))


def broker_configs(settings: Settings, advertised: str, names: list[str] | None) -> list[DescribedConfig]:
    """This node's broker configs (`names`: only those, in Kafka's way: unknown names left out;
    None: every one), `advertised` its Kafka listeners as clients reach them ("PROTOCOL://host:port,...")."""
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


def group_configs(settings: Settings, entries, names: list[str] | None) -> list[DescribedConfig]:
    """A group's configs (`entries`: the core's GroupConfigEntry, each with the group's own value or
    None and the server's default; `names`: only those, unknown names left out; None: every one), as
    Kafka's broker describes a group: its own value `DYNAMIC_GROUP_CONFIG`, else the broker config
    that is its default (Kafka's name: "group." and the group config's), `STATIC_BROKER_CONFIG`
    when the operator set it, else `DEFAULT_CONFIG`; that broker config its synonym."""
    described = []
    for entry in entries:
        if names is not None and entry.name not in names:
            continue
        default = Synonym(f"group.{entry.name}", str(entry.default), _server_source(settings, entry.setting))
        synonyms: tuple[Synonym, ...] = (default,)
        if entry.own is not None:
            synonyms = (Synonym(entry.name, str(entry.own), ConfigSource.DYNAMIC_GROUP_CONFIG), default)
        described.append(
            DescribedConfig(
                entry.name,
                synonyms[0].value,
                synonyms[0].source,
                ConfigType.INT,
                entry.documentation,
                False,
                synonyms,
            )
        )
    return described
