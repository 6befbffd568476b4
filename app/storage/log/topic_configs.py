"""Kafka 4.0's topic configs, the core's one table of them: each config's type, Kafka's default and
bounds (its LogConfig's definitions), and what txbroker does with it. Both doors validate through
`checked_value` (HTTP's JSON values) and `parsed_text` (Kafka's text values, read as Kafka's ConfigDef
reads them), so a value is refused by one rule, with Kafka's reason, over either door.

What txbroker does with a config is one of two things (`Effect`):

- APPLIED: what Kafka does with it (retention, compaction, the stored codec, ...);
- NOTHING_TO_APPLY: txbroker's storage has nothing it applies to (PostgreSQL has no segment files,
  indexes or page-cache flushes; a partition has one replica, PostgreSQL's, and no tiered storage).
  The value is validated as Kafka validates it, kept and described, and changes nothing.

`checked_config` then checks a topic's whole config as Kafka's LogConfig.validateValues does (a rule
between two configs: min.compaction.lag.ms at most max.compaction.lag.ms).

Configs Kafka 4.0 removed (`message.format.version`, `message.timestamp.difference.max.ms`,
`message.downconversion.enable`, KIP-724 and KIP-937) are unknown names, as a Kafka 4.0 broker
answers them.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.errors import BrokerError, ErrorCode

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# Kafka's ConfigDef reads a number as Java's Integer.parseInt / Long.parseLong does: an optional sign
# and decimal digits (no spaces inside, no underscores), the whole value trimmed first.
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
# ... and a list as its comma-separated items, spaces around the commas dropped.
_LIST_SEPARATOR = re.compile(r"\s*,\s*")
# Kafka's ThrottledReplicaListValidator: `*`, or items `partition:broker`.
_REPLICA_ITEM = re.compile(r"([0-9]+:[0-9]+)?")


class ConfigKind(enum.StrEnum):
    """Kafka's ConfigDef.Type of a config (DescribeConfigs v3+ names it)."""

    BOOLEAN = "BOOLEAN"
    STRING = "STRING"
    INT = "INT"
    LONG = "LONG"
    DOUBLE = "DOUBLE"
    LIST = "LIST"


class Effect(enum.Enum):
    APPLIED = "applied"
    NOTHING_TO_APPLY = "nothing to apply to"


@dataclass(frozen=True, slots=True)
class TopicConfigSpec:
    """One topic config. Values are stored typed: an int (INT, LONG), a float (DOUBLE), a bool
    (BOOLEAN), or text (STRING, and LIST as its items joined by commas)."""

    name: str  # Kafka's name; txbroker's key (HTTP's) is it with underscores: `key`
    kind: ConfigKind
    default: Any  # Kafka's (txbroker's, for the five the server's settings default)
    effect: Effect
    documentation: str
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[str, ...] | None = None  # STRING: one of them; LIST: each item one of them
    # A rule of its own: the reason a (typed) value is refused, or None.
    rule: Callable[[Any], str | None] | None = None

    @property
    def key(self) -> str:
        return self.name.replace(".", "_")


def _gzip_level(level: int) -> str | None:
    # Kafka's GZIP levelValidator: zlib's 1 to 9, or -1 (zlib's default, 6).
    if level > 9 or (level < 1 and level != -1):
        return "Value must be between 1 and 9 or equal to -1"
    return None


def _replica_list(value: str) -> str | None:
    items = [item.strip() for item in value.split(",")]
    if value == "*" or all(_REPLICA_ITEM.fullmatch(item) for item in items):
        return None
    return "it must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],..."


def _no_tiered_storage(enabled: bool) -> str | None:
    if enabled:
        return (
            "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log "
            "storage (txbroker keeps every batch in PostgreSQL)"
        )
    return None


def _timestamp_bound(name: str, direction: str) -> TopicConfigSpec:
    """How far a produced record's timestamp may be from the broker's clock (KIP-937), applied as
    Kafka's LogValidator applies it (storage's append.py). txbroker's default is no bound (2^63-1)
    for both, where Kafka 4.0 bounds `after` to an hour: an HTTP client that timestamps its records
    ahead of the server's clock keeps working across an upgrade; a topic that sets a value gets
    Kafka's behaviour."""
    return TopicConfigSpec(
        name,
        ConfigKind.LONG,
        LONG_MAX,
        Effect.APPLIED,
        f"with CreateTime, a batch with a record timestamped more than this many ms {direction} the broker's "
        f"clock is refused (INVALID_TIMESTAMP; INVALID_RECORD over HTTP); ignored with LogAppendTime",
        minimum=0,
    )


_NO_SEGMENTS = "txbroker keeps a partition as rows in PostgreSQL, without segment files: accepted, no effect"
_NO_FLUSH = "an append is durable when PostgreSQL commits it, before it is answered: accepted, no effect"
_ONE_REPLICA = "a partition has one replica, PostgreSQL's, which every node reaches: accepted, no effect"
_NO_TIERS = "txbroker has no tiered storage (every batch is in PostgreSQL): accepted, no effect"
_COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

SPECS: tuple[TopicConfigSpec, ...] = (
    # Applied.
    TopicConfigSpec(
        "cleanup.policy",
        ConfigKind.LIST,
        "delete",
        Effect.APPLIED,
        "delete (retention by time and size), compact (the last record of each key kept), both, or neither",
        choices=("compact", "delete"),
    ),
    TopicConfigSpec(
        "compression.type",
        ConfigKind.STRING,
        "producer",
        Effect.APPLIED,
        "the codec batches are stored and fetched in: producer keeps the producer's, uncompressed stores none",
        choices=_COMPRESSION_TYPES,
    ),
    TopicConfigSpec(
        "compression.gzip.level",
        ConfigKind.INT,
        -1,
        Effect.APPLIED,
        "the gzip level of batches the broker compresses (-1: zlib's default)",
        rule=_gzip_level,
    ),
    TopicConfigSpec(
        "compression.lz4.level",
        ConfigKind.INT,
        9,
        Effect.APPLIED,
        "the lz4 level of batches the broker compresses",
        minimum=1,
        maximum=17,
    ),
    TopicConfigSpec(
        "compression.zstd.level",
        ConfigKind.INT,
        3,
        Effect.APPLIED,
        "the zstd level of batches the broker compresses",
        minimum=-131072,
        maximum=22,
    ),
    TopicConfigSpec(
        "delete.retention.ms",
        ConfigKind.LONG,
        86_400_000,
        Effect.APPLIED,
        "how long compaction keeps a tombstone (a null value) once it reaches it",
        minimum=0,
    ),
    TopicConfigSpec(
        "max.compaction.lag.ms",
        ConfigKind.LONG,
        LONG_MAX,
        Effect.APPLIED,
        "the longest a record not yet compacted waits for min.cleanable.dirty.ratio before compaction runs anyway",
        minimum=1,
    ),
    TopicConfigSpec(
        "max.message.bytes",
        ConfigKind.INT,
        1_048_576,
        Effect.APPLIED,
        "the most bytes of one record (key, value and headers)",
        minimum=1,
    ),
    _timestamp_bound("message.timestamp.after.max.ms", "after"),
    _timestamp_bound("message.timestamp.before.max.ms", "before"),
    TopicConfigSpec(
        "message.timestamp.type",
        ConfigKind.STRING,
        "CreateTime",
        Effect.APPLIED,
        "CreateTime keeps the producers' timestamps; LogAppendTime gives records the time the broker appends them",
        choices=("CreateTime", "LogAppendTime"),
    ),
    TopicConfigSpec(
        "min.cleanable.dirty.ratio",
        ConfigKind.DOUBLE,
        0.5,
        Effect.APPLIED,
        "compaction runs once the batches written since its last run are this share of the log",
        minimum=0,
        maximum=1,
    ),
    TopicConfigSpec(
        "min.compaction.lag.ms",
        ConfigKind.LONG,
        0,
        Effect.APPLIED,
        "compaction never takes a record newer than this, by its batch's newest timestamp, nor anything after it",
        minimum=0,
    ),
    TopicConfigSpec(
        "retention.bytes",
        ConfigKind.LONG,
        -1,
        Effect.APPLIED,
        "the most bytes a partition keeps before retention deletes its oldest batches (-1: no limit)",
        minimum=-1,
    ),
    TopicConfigSpec(
        "retention.ms",
        ConfigKind.LONG,
        -1,
        Effect.APPLIED,
        "how long a batch is kept before retention deletes it (-1: forever)",
        minimum=-1,
    ),
    # Nothing to apply to.
    TopicConfigSpec("file.delete.delay.ms", ConfigKind.LONG, 60_000, Effect.NOTHING_TO_APPLY, _NO_SEGMENTS, minimum=0),
    TopicConfigSpec("flush.messages", ConfigKind.LONG, LONG_MAX, Effect.NOTHING_TO_APPLY, _NO_FLUSH, minimum=1),
    TopicConfigSpec("flush.ms", ConfigKind.LONG, LONG_MAX, Effect.NOTHING_TO_APPLY, _NO_FLUSH, minimum=0),
    TopicConfigSpec(
        "follower.replication.throttled.replicas",
        ConfigKind.LIST,
        "",
        Effect.NOTHING_TO_APPLY,
        _ONE_REPLICA,
        rule=_replica_list,
    ),
    TopicConfigSpec("index.interval.bytes", ConfigKind.INT, 4096, Effect.NOTHING_TO_APPLY, _NO_SEGMENTS, minimum=0),
    TopicConfigSpec(
        "leader.replication.throttled.replicas",
        ConfigKind.LIST,
        "",
        Effect.NOTHING_TO_APPLY,
        _ONE_REPLICA,
        rule=_replica_list,
    ),
    TopicConfigSpec("local.retention.bytes", ConfigKind.LONG, -2, Effect.NOTHING_TO_APPLY, _NO_TIERS, minimum=-2),
    TopicConfigSpec("local.retention.ms", ConfigKind.LONG, -2, Effect.NOTHING_TO_APPLY, _NO_TIERS, minimum=-2),
    TopicConfigSpec(
        "min.insync.replicas",
        ConfigKind.INT,
        1,
        Effect.NOTHING_TO_APPLY,
        "an acknowledged append is committed by PostgreSQL, the partition's one replica (its own replication, "
        "e.g. synchronous standbys, is PostgreSQL's): accepted, no effect",
        minimum=1,
    ),
    TopicConfigSpec("preallocate", ConfigKind.BOOLEAN, False, Effect.NOTHING_TO_APPLY, _NO_SEGMENTS),
    TopicConfigSpec("remote.log.copy.disable", ConfigKind.BOOLEAN, False, Effect.NOTHING_TO_APPLY, _NO_TIERS),
    TopicConfigSpec("remote.log.delete.on.disable", ConfigKind.BOOLEAN, False, Effect.NOTHING_TO_APPLY, _NO_TIERS),
    TopicConfigSpec(
        "remote.storage.enable", ConfigKind.BOOLEAN, False, Effect.NOTHING_TO_APPLY, _NO_TIERS, rule=_no_tiered_storage
    ),
    TopicConfigSpec(
        "segment.bytes", ConfigKind.INT, 1_073_741_824, Effect.NOTHING_TO_APPLY, _NO_SEGMENTS, minimum=1_048_576
    ),
    TopicConfigSpec(
        "segment.index.bytes", ConfigKind.INT, 10_485_760, Effect.NOTHING_TO_APPLY, _NO_SEGMENTS, minimum=4
    ),
    TopicConfigSpec("segment.jitter.ms", ConfigKind.LONG, 0, Effect.NOTHING_TO_APPLY, _NO_SEGMENTS, minimum=0),
    TopicConfigSpec("segment.ms", ConfigKind.LONG, 604_800_000, Effect.NOTHING_TO_APPLY, _NO_SEGMENTS, minimum=1),
    TopicConfigSpec("unclean.leader.election.enable", ConfigKind.BOOLEAN, False, Effect.NOTHING_TO_APPLY, _ONE_REPLICA),
)

SPECS_BY_NAME: dict[str, TopicConfigSpec] = {spec.name: spec for spec in SPECS}
SPECS_BY_KEY: dict[str, TopicConfigSpec] = {spec.key: spec for spec in SPECS}
# Every config's value when a topic has none of its own (the five the server's settings default
# are always stored: topics.DEFAULT_TOPIC_CONFIG).
KAFKA_DEFAULTS: dict[str, Any] = {spec.key: spec.default for spec in SPECS}
# Names Kafka 4.0 no longer has (KIP-724, KIP-937): unknown, as Kafka 4.0 answers them; the message says why.
REMOVED_IN_KAFKA_4 = ("message.downconversion.enable", "message.format.version", "message.timestamp.difference.max.ms")


def unknown_config(name: str) -> BrokerError:
    """Kafka's answer for a name it does not have (LogConfig.validateNames), with what to do."""
    removed = name.replace("_", ".") in REMOVED_IN_KAFKA_4
    why = (
        "removed in Kafka 4.0; txbroker does not have it either" if removed else "expected one of Kafka's topic configs"
    )
    return BrokerError(
        ErrorCode.INVALID_CONFIG,
        f"Unknown topic config name: {name} ({why}; HTTP names them with underscores, e.g. retention_ms, "
        f"the Kafka listener with dots, e.g. retention.ms; docs/kafka.md lists them)",
    )


def spec_of(name: str, *, kafka_name: bool) -> TopicConfigSpec:
    """The config of a name as a door gives it (Kafka's dotted name, or HTTP's key); INVALID_CONFIG if none."""
    spec = (SPECS_BY_NAME if kafka_name else SPECS_BY_KEY).get(name)
    if spec is None:
        raise unknown_config(name)
    return spec


def _invalid(spec: TopicConfigSpec, shown: object, reason: str) -> BrokerError:
    """Kafka's ConfigException text ("Invalid value V for configuration N: reason"), then HTTP's key."""
    return BrokerError(
        ErrorCode.INVALID_CONFIG,
        f"Invalid value {shown} for configuration {spec.name}: {reason} (over HTTP the config is {spec.key})",
    )


def java_integer(text: str, low: int, high: int) -> int | None:
    """The number `text` holds as Kafka's ConfigDef reads an INT or a LONG (trimmed, then as Java's
    Integer.parseInt / Long.parseLong: an optional sign and decimal digits, within low..high); None
    when it holds none (Python's int() would also take "1_000")."""
    trimmed = text.strip()
    if not _INTEGER_TEXT.fullmatch(trimmed) or not low <= int(trimmed) <= high:
        return None
    return int(trimmed)


def parsed_text(spec: TopicConfigSpec, text: str | None) -> Any:
    """A value as Kafka's protocol carries it (text), read as Kafka's ConfigDef.parseType reads it
    (trimmed; numbers as Java parses them), then checked as `checked_value`. Raises INVALID_CONFIG."""
    if text is None:
        raise _invalid(spec, None, "a value is needed (leave the config out for its default)")
    trimmed = text.strip()
    kind = spec.kind
    if kind in (ConfigKind.INT, ConfigKind.LONG):
        low, high = (INT_MIN, INT_MAX) if kind == ConfigKind.INT else (LONG_MIN, LONG_MAX)
        value: Any = java_integer(text, low, high)
        if value is None:
            raise _invalid(spec, text, f"Not a number of type {kind}")
    elif kind == ConfigKind.DOUBLE:
        try:
            value = float(trimmed)
        except ValueError:
            raise _invalid(spec, text, f"Not a number of type {kind}") from None
    elif kind == ConfigKind.BOOLEAN:
        if trimmed.lower() not in ("true", "false"):
            raise _invalid(spec, text, "Expected value to be either true or false")
        value = trimmed.lower() == "true"
    else:
        value = trimmed
    return checked_value(spec, value, shown=text)


def checked_value(spec: TopicConfigSpec, value: Any, shown: object = None) -> Any:
    """The value as stored, checked as Kafka's LogConfig checks it (type, bounds, choices, its rule).
    Raises INVALID_CONFIG with Kafka's reason."""
    shown = described_text(value) if shown is None else shown
    kind = spec.kind
    if kind in (ConfigKind.INT, ConfigKind.LONG):
        low, high = (INT_MIN, INT_MAX) if kind == ConfigKind.INT else (LONG_MIN, LONG_MAX)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _invalid(spec, shown, f"expected an integer of type {kind} ({low} to {high})")
    elif kind == ConfigKind.DOUBLE:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _invalid(spec, shown, "expected a finite number of type DOUBLE")
        value = float(value)
    elif kind == ConfigKind.BOOLEAN:
        if not isinstance(value, bool):
            raise _invalid(spec, shown, "Expected value to be either true or false")
    elif not isinstance(value, str):
        raise _invalid(spec, shown, f"expected text ({kind})")
    elif kind == ConfigKind.LIST:
        items = _LIST_SEPARATOR.split(value.strip()) if value.strip() else []
        if spec.choices is not None and any(item not in spec.choices for item in items):
            raise _invalid(spec, shown, f"expected a comma-separated list of {', '.join(spec.choices)}, or none")
        value = ",".join(items)
    elif spec.choices is not None and value not in spec.choices:
        raise _invalid(spec, shown, f"String must be one of: {', '.join(spec.choices)}")
    if spec.minimum is not None and value < spec.minimum:
        raise _invalid(spec, shown, f"Value must be at least {spec.minimum}")
    if spec.maximum is not None and value > spec.maximum:
        raise _invalid(spec, shown, f"Value must be no more than {spec.maximum}")
    reason = spec.rule(value) if spec.rule is not None else None
    if reason is not None:
        raise _invalid(spec, shown, reason)
    return value


def checked_config(config: dict[str, Any]) -> None:
    """A topic's whole config (by HTTP's keys; a key left out has Kafka's default) checked as Kafka's
    LogConfig.validateValues checks it: the rules between configs. Raises INVALID_CONFIG with Kafka's reason."""
    min_lag_ms = config.get("min_compaction_lag_ms", KAFKA_DEFAULTS["min_compaction_lag_ms"])
    max_lag_ms = config.get("max_compaction_lag_ms", KAFKA_DEFAULTS["max_compaction_lag_ms"])
    if min_lag_ms > max_lag_ms:
        raise BrokerError(
            ErrorCode.INVALID_CONFIG,
            f"conflict topic config setting min.compaction.lag.ms ({min_lag_ms}) > max.compaction.lag.ms "
            f"({max_lag_ms}): a record cannot be both kept from compaction and due for it; set "
            f"min.compaction.lag.ms at most max.compaction.lag.ms (over HTTP min_compaction_lag_ms and "
            f"max_compaction_lag_ms)",
        )


def described_text(value: Any) -> str:
    """A value as Kafka describes it (DescribeConfigs' text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
