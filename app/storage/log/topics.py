"""Topics: names, partition counts and configs (CreateTopics, DeleteTopics, Metadata)."""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from app.errors import BrokerError, ErrorCode
from app.storage.log.topic_configs import KAFKA_DEFAULTS, checked_config, checked_value, spec_of

TOPIC_NAME_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
INTERNAL_PREFIX = "__"
TRANSACTION_STATE_TOPIC = "__transaction_state"
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
MAX_PARTITIONS = 10_000

RETENTION_FOREVER = -1

# cleanup_policy values, as Kafka's cleanup.policy: delete old batches (retention), keep the latest
# record per key (compaction), or both.
CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"

# The configs every topic stores from its creation on: those the server's settings give a default
# (settings.topic_defaults), which a topic keeps as it was when created. Every other config of
# Kafka's (topic_configs.py) is stored once set, and reads as its default until then.
DEFAULT_TOPIC_CONFIG: dict[str, Any] = {
    key: KAFKA_DEFAULTS[key]
    for key in ("retention_ms", "retention_bytes", "max_message_bytes", "cleanup_policy", "delete_retention_ms")
}
# The internal topics' keys are transactional ids and group/topic/partition: compacted, their size
# follows the number of live ids, not of transactions or commits ever made.
INTERNAL_TOPIC_CONFIG: dict[str, Any] = {"cleanup_policy": CLEANUP_COMPACT}


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic_id: int
    name: str
    partition_count: int
    config: dict[str, Any]
    is_internal: bool
    # Kafka's topic id (KIP-516, migration 0009): fixed for the topic's life, new for a re-created one.
    topic_uuid: uuid.UUID

    @property
    def max_message_bytes(self) -> int:
        return self.config["max_message_bytes"]

    def setting(self, key: str) -> Any:
        """A config value; one the topic never set (or was created before the key existed) has its default."""
        return self.config.get(key, KAFKA_DEFAULTS[key])

    @property
    def cleanup_policy(self) -> frozenset[str]:
        return frozenset(self.setting("cleanup_policy").split(","))


def kafka_topic_id(topic_uuid: uuid.UUID) -> str:
    """A topic id as Kafka's tools and clients print it (Uuid.toString: URL-safe base64, unpadded)."""
    return base64.urlsafe_b64encode(topic_uuid.bytes).rstrip(b"=").decode()


def check_topic_name(name: str, *, allow_internal: bool = False) -> None:
    if not TOPIC_NAME_PATTERN.fullmatch(name) or name in (".", ".."):
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name[:300]!r} is invalid: expected 1 to 249 characters of [a-zA-Z0-9._-], not '.' or '..'",
        )
    if name.startswith(INTERNAL_PREFIX) and not allow_internal:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} starts with '{INTERNAL_PREFIX}', which is reserved for internal "
            f"topics such as {TRANSACTION_STATE_TOPIC}: choose another name",
        )


def effective_config(
    config: dict[str, Any], defaults: dict[str, Any] | None = None, stored: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The topic's config with the server's `defaults` (then the built-in ones) filled in for
    DEFAULT_TOPIC_CONFIG's keys; each value checked as Kafka checks it (topic_configs.checked_value:
    INVALID_CONFIG for an unknown key or a bad value), but for one the topic already stores
    (`stored`, an alteration's): that is kept as stored, as Kafka validates only the configs a change
    sets, so that a value stored before a bound it breaks existed (a `max_message_bytes` above 2^31-1
    set over HTTP) does not refuse every later change of the topic's other configs. The whole
    config is then checked as Kafka checks the config a change leaves (topic_configs.checked_config)."""
    stored = stored or {}
    result = {**DEFAULT_TOPIC_CONFIG, **(defaults or {})}
    for key, value in config.items():
        unchanged = key in stored and type(stored[key]) is type(value) and stored[key] == value
        result[key] = value if unchanged else checked_value(spec_of(key, kafka_name=False), value)
    checked_config(result)
    return result


def topic_from_row(row: asyncpg.Record) -> TopicInfo:
    return TopicInfo(
        row["topic_id"], row["name"], row["partition_count"], row["config"], row["is_internal"], row["topic_uuid"]
    )


TOPIC_COLUMNS = "topic_id, name, partition_count, config, is_internal, topic_uuid"


async def create_topic(
    conn: asyncpg.Connection,
    name: str,
    partition_count: int,
    config: dict[str, Any],
    *,
    internal: bool = False,
    defaults: dict[str, Any] | None = None,
) -> TopicInfo:
    """`defaults`: the server-wide values of the keys `config` leaves out (settings.topic_defaults).
    Refused for its name, its partition count, its config, then TOPIC_ALREADY_EXISTS, or
    TopicNameCollision for a name that differs from an existing topic's by '.' and '_' alone."""
    check_topic_name(name, allow_internal=internal)
    if not 1 <= partition_count <= MAX_PARTITIONS:
        raise BrokerError(
            ErrorCode.INVALID_PARTITIONS, f"partitions is {partition_count}: expected 1 to {MAX_PARTITIONS}"
        )
    full_config = effective_config(config, defaults)
    async with conn.transaction():
        await _lock_colliding_names(conn, name)
        # ON CONFLICT DO NOTHING makes two concurrent creates of one name answer exactly one 201.
        row = await conn.fetchrow(
            f"INSERT INTO topics (name, partition_count, config, is_internal) VALUES ($1, $2, $3, $4) "
            f"ON CONFLICT (name) DO NOTHING RETURNING {TOPIC_COLUMNS}",
            name,
            partition_count,
            full_config,
            internal,
        )
        if row is None:
            raise topic_exists(name)
        colliding = await colliding_topic(conn, name)
        if colliding is not None:
            raise TopicNameCollision(name, colliding)
        await conn.execute(
            "INSERT INTO partitions (topic_id, partition) SELECT $1, generate_series(0, $2 - 1)",
            row["topic_id"],
            partition_count,
        )
    return topic_from_row(row)


async def alter_config(
    conn: asyncpg.Connection, name: str, change, defaults: dict[str, Any] | None = None
) -> TopicInfo:
    """Replaces the topic's config by change(current config), validated as at creation (the values
    it changes: effective_config keeps those it leaves as stored); the row is
    locked FOR UPDATE so two concurrent alterations apply one after the other, none lost. The
    caller holds the PostgreSQL transaction (its rollback is a validate-only alteration)."""
    row = await conn.fetchrow(f"SELECT {TOPIC_COLUMNS} FROM topics WHERE name = $1 FOR UPDATE", name)
    if row is None:
        raise unknown_topic(name)
    topic = topic_from_row(row)
    if topic.is_internal:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r} is internal to txbroker: its config is the server's"
        )
    config = effective_config(change({**DEFAULT_TOPIC_CONFIG, **topic.config}), defaults, topic.config)
    row = await conn.fetchrow(
        f"UPDATE topics SET config = $2 WHERE topic_id = $1 RETURNING {TOPIC_COLUMNS}", topic.topic_id, config
    )
    return topic_from_row(row)


async def grow_partitions(conn: asyncpg.Connection, name: str, partition_count: int) -> tuple[TopicInfo, int]:
    """Kafka's CreatePartitions: the topic's partition count raised to `partition_count`, the new
    partitions empty (offset 0); (the topic as grown, its partition count before). Only an increase
    (INVALID_PARTITIONS otherwise, as Kafka). The caller holds the PostgreSQL transaction (its
    rollback is a validate-only growth).

    FOR NO KEY UPDATE serializes a growth with another growth, a config alteration and DeleteTopics
    (FOR UPDATE) of the topic, yet not with produces and offset commits (hold_topics' FOR KEY SHARE):
    they only need the topic to stay, and the partitions they resolved are untouched. The count and
    the new partitions rows commit together, so whoever reads the new count finds their rows; a
    reader of the old count never names a new partition (each checks against the count it read).
    """
    row = await conn.fetchrow(f"SELECT {TOPIC_COLUMNS} FROM topics WHERE name = $1 FOR NO KEY UPDATE", name)
    if row is None:
        raise unknown_topic(name)
    topic = topic_from_row(row)
    current = topic.partition_count
    if topic.is_internal:
        raise BrokerError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic {name!r} is internal to txbroker: its partition count is the server's (keys are mapped to "
            f"its partitions by that count)",
        )
    if partition_count == current:
        raise BrokerError(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r} already has {current} partition(s): ask for more than {current} to add some",
        )
    if partition_count < current:
        raise BrokerError(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r} currently has {current} partition(s); {partition_count} would not be an increase: "
            f"partitions can be added, never removed",
        )
    if partition_count > MAX_PARTITIONS:
        raise BrokerError(
            ErrorCode.INVALID_PARTITIONS,
            f"partitions is {partition_count}: expected {current + 1} to {MAX_PARTITIONS} for topic {name!r}",
        )
    row = await conn.fetchrow(
        f"UPDATE topics SET partition_count = $2 WHERE topic_id = $1 RETURNING {TOPIC_COLUMNS}",
        topic.topic_id,
        partition_count,
    )
    # No partitions row of this topic_id at or above the old count can exist: counts never shrink.
    await conn.execute(
        "INSERT INTO partitions (topic_id, partition) SELECT $1, generate_series($2::int, $3::int - 1)",
        topic.topic_id,
        current,
        partition_count,
    )
    return topic_from_row(row), current


async def ensure_internal_topics(
    conn: asyncpg.Connection, transaction_log_partitions: int, offsets_partitions: int
) -> None:
    for name, count in (
        (TRANSACTION_STATE_TOPIC, transaction_log_partitions),
        (CONSUMER_OFFSETS_TOPIC, offsets_partitions),
    ):
        if await find_topic(conn, name) is None:
            try:
                await create_topic(conn, name, count, INTERNAL_TOPIC_CONFIG, internal=True)
            except BrokerError as error:
                if error.code != ErrorCode.TOPIC_ALREADY_EXISTS:  # another server created it first
                    raise


def could_exist(name: str) -> bool:
    """Only names matching the pattern can exist (internal ones too), so others need no query, and
    a name PostgreSQL could not even store (NUL, lone surrogates) never reaches it."""
    return TOPIC_NAME_PATTERN.fullmatch(name) is not None


async def find_topic(conn: asyncpg.Connection, name: str) -> TopicInfo | None:
    if not could_exist(name):
        return None
    row = await conn.fetchrow(f"SELECT {TOPIC_COLUMNS} FROM topics WHERE name = $1", name)
    return None if row is None else topic_from_row(row)


# Built once (an f-string in the function would be built on every produce).
_FIND_TOPICS_SQL = f"SELECT {TOPIC_COLUMNS} FROM topics WHERE name = ANY($1::text[])"


async def find_topics(conn: asyncpg.Connection, names: list[str]) -> dict[str, TopicInfo]:
    rows = await conn.fetch(_FIND_TOPICS_SQL, [name for name in names if could_exist(name)])
    return {row["name"]: topic_from_row(row) for row in rows}


_FIND_TOPICS_BY_UUID_SQL = f"SELECT {TOPIC_COLUMNS} FROM topics WHERE topic_uuid = ANY($1::uuid[])"


async def find_topics_by_uuid(conn: asyncpg.Connection, topic_uuids: list[uuid.UUID]) -> dict[uuid.UUID, TopicInfo]:
    """The topics of these Kafka topic ids that exist, by id (an id is never reused: a missing one
    is a topic deleted, or never made)."""
    rows = await conn.fetch(_FIND_TOPICS_BY_UUID_SQL, topic_uuids)
    return {row["topic_uuid"]: topic_from_row(row) for row in rows}


# FOR KEY SHARE: holders never wait for each other, nor for a partition growth (FOR NO KEY UPDATE: it
# leaves the key and the partitions a holder resolved as they were); a config change and DeleteTopics
# (FOR UPDATE) wait for them, and they for those in flight (after a delete, the row is gone).
_HOLD_TOPICS_SQL = f"SELECT {TOPIC_COLUMNS} FROM topics WHERE name = ANY($1::text[]) ORDER BY name FOR KEY SHARE"


async def hold_topics(conn: asyncpg.Connection, names: list[str]) -> dict[str, TopicInfo]:
    """`find_topics`, each topic found held until the caller's PostgreSQL transaction ends, so that
    what the caller writes under the topic's name commits before a DeleteTopics of it begins."""
    rows = await conn.fetch(_HOLD_TOPICS_SQL, [name for name in names if could_exist(name)])
    return {row["name"]: topic_from_row(row) for row in rows}


async def get_topic(conn: asyncpg.Connection, name: str) -> TopicInfo:
    topic = await find_topic(conn, name)
    if topic is None:
        raise unknown_topic(name)
    return topic


async def find_topic_by_id(conn: asyncpg.Connection, topic_id: int) -> TopicInfo | None:
    """The topic of this id as it is now (None once deleted: a re-created one has another id)."""
    row = await conn.fetchrow(f"SELECT {TOPIC_COLUMNS} FROM topics WHERE topic_id = $1", topic_id)
    return None if row is None else topic_from_row(row)


# RE2's leading flag for a case-insensitive match, which PostgreSQL's AREs take only at the very
# start of an expression (their "embedded options"), so before the anchors, not inside them.
CASE_INSENSITIVE_FLAG = "(?i)"


def whole_name_regex(pattern: str) -> str:
    """`pattern` (RE2's syntax, as Kafka's coordinator takes a subscription's regex) as a PostgreSQL
    ARE that must match a whole topic name: anchored, a leading `(?i)` kept in front."""
    flags = CASE_INSENSITIVE_FLAG if pattern.startswith(CASE_INSENSITIVE_FLAG) else ""
    return f"{flags}^(?:{pattern[len(flags) :]})$"


async def topics_matching(conn: asyncpg.Connection, patterns: list[str]) -> dict[str, list[str]]:
    """For each regular expression of `patterns`, the names of the topics, not internal, that it
    matches whole (`whole_name_regex`; sorted; none: an empty list). Matched by PostgreSQL's regular
    expression engine (its ARE syntax), which never backtracks exponentially and is interruptible,
    unlike Python's: a client's expression cannot hold up the server. An expression it cannot
    compile raises asyncpg's InvalidRegularExpressionError (`check_topic_regex` finds it first)."""
    rows = await conn.fetch(
        "SELECT p.pattern, array_remove(array_agg(t.name ORDER BY t.name), NULL) AS names "
        "FROM unnest($1::text[], $2::text[]) AS p(pattern, whole) "
        "LEFT JOIN topics t ON NOT t.is_internal AND t.name ~ p.whole "
        "GROUP BY p.pattern",
        patterns,
        [whole_name_regex(pattern) for pattern in patterns],
    )
    return {row["pattern"]: list(row["names"]) for row in rows}


async def check_topic_regex(conn: asyncpg.Connection, pattern: str) -> None:
    """Raises asyncpg's InvalidRegularExpressionError when PostgreSQL cannot compile `pattern` as
    `topics_matching` uses it (matching it against nothing still compiles it), or alone: one with
    an unbalanced ')' compiles inside '^(?:...)$', whose group it closes early ('a)|(b' then
    matches every name that starts with 'a'), and not alone."""
    await conn.fetchrow("SELECT '' ~ $1::text AS alone, '' ~ $2::text AS wrapped", pattern, whole_name_regex(pattern))


async def topics_fingerprint(conn: asyncpg.Connection) -> str:
    """A digest of the set of topic ids: it changes whenever a topic is created or deleted (topic
    ids are never reused), so a regular expression resolved at one fingerprint needs resolving
    again only at another. Not the count and the highest id: ids come from a sequence, but
    creations commit in any order, so a topic committed after a higher-numbered one, while another
    was deleted, changed neither. One index-only look at the topics."""
    return await conn.fetchval(
        "SELECT md5(coalesce(string_agg(topic_id::text, ',' ORDER BY topic_id), '')) FROM topics"
    )


async def list_topics(conn: asyncpg.Connection) -> list[TopicInfo]:
    rows = await conn.fetch(f"SELECT {TOPIC_COLUMNS} FROM topics ORDER BY name")
    return [topic_from_row(row) for row in rows]


async def delete_topic(conn: asyncpg.Connection, name: str, topic_uuid: uuid.UUID | None = None) -> uuid.UUID:
    """Deletes the topic of this name (and, given, of this Kafka topic id: a topic re-created under
    the name since the caller learned the id is not the one meant, UNKNOWN_TOPIC_ID); returns its id."""
    if not could_exist(name):
        raise unknown_topic(name)
    async with conn.transaction():
        # The row is locked by name and id together, so the topic checked is the one deleted.
        row = await conn.fetchrow(
            "SELECT topic_id, is_internal, topic_uuid FROM topics "
            "WHERE name = $1 AND ($2::uuid IS NULL OR topic_uuid = $2) FOR UPDATE",
            name,
            topic_uuid,
        )
        if row is None:
            raise unknown_topic(name) if topic_uuid is None else unknown_topic_id(topic_uuid)
        if row["is_internal"]:
            raise BrokerError(
                ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic {name!r} is internal to txbroker and cannot be deleted"
            )
        # Deleting the partitions rows waits for in-flight appends (they hold those rows), so no
        # batch can be appended to the topic once this commits. Its batches, markers and producer
        # states are left to the log cleaner (deleted_topics), a bounded chunk per run: one DELETE of
        # millions of rows here would hold this request for minutes. topic_id is never reused, so
        # nothing ever reads them again.
        await conn.execute("DELETE FROM topics WHERE topic_id = $1", row["topic_id"])
        await conn.execute(
            "INSERT INTO deleted_topics (topic_id, deleted_ms) VALUES ($1, (extract(epoch FROM now()) * 1000)::bigint)",
            row["topic_id"],
        )
        # Its group offsets go with it, as in Kafka, or a topic re-created with the name would start
        # where the old one's consumers were: the committed ones, and the transactional ones still
        # pending (their transaction's COMMIT would write them). Offset commits hold the topics they
        # name (hold_topics), so none for this topic is in flight now, and none can be made once
        # this commits. A transaction's COMMIT marker settles pending offsets (group_offsets.settle)
        # without the topic's row, so pending first, then committed, each a statement of its own: a
        # settle that took a pending row of the topic before us has committed when the first
        # statement gets past that row, so the second one's snapshot sees the offset it wrote. Both
        # scan their table (keyed by group first): DeleteTopics is rare, and groups x partitions few.
        await conn.execute("DELETE FROM pending_txn_offsets WHERE topic = $1", name)
        await conn.execute("DELETE FROM group_offsets WHERE topic = $1", name)
    return row["topic_uuid"]


# Kafka's Topic.hasCollisionChars and unifyCollisionChars: '.' and '_' are one character in the
# metric names Kafka makes from topic names, so no two topics may differ by them alone.
COLLISION_CHARACTERS = frozenset("._")
# The class id of the advisory locks that serialize creations of colliding names: 0, which no
# topic_id is (the log cleaner's locks are (topic_id, partition), topic ids from 1).
_NAME_LOCK_CLASS = 0


def _unified(name: str) -> str:
    return name.replace(".", "_")


class TopicNameCollision(BrokerError):
    """INVALID_TOPIC_EXCEPTION for a new topic whose name differs from an existing topic's by '.' and
    '_' alone, with the message of Kafka's controller (ReplicationControlManager.validateNewTopicNames);
    its own class, for the Kafka door's Metadata, whose auto-creation Kafka's broker answers otherwise."""

    def __init__(self, name: str, colliding: str) -> None:
        super().__init__(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic '{name}' collides with existing topic: {colliding} ('.' and '_' are one character in "
            f"Kafka's metric names: no two topics may differ by them alone); choose another name",
        )


async def _lock_colliding_names(conn: asyncpg.Connection, name: str) -> None:
    """Serializes the creations of names that collide with each other (one advisory lock for all the
    names that unify alike, held until the caller's PostgreSQL transaction ends), so that of two
    concurrent ones the second sees the first (Kafka's controller creates topics one at a time)."""
    if COLLISION_CHARACTERS.intersection(name):
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _NAME_LOCK_CLASS, _unified(name))


async def colliding_topic(conn: asyncpg.Connection, name: str) -> str | None:
    """An existing topic whose name differs from `name` by '.' and '_' alone (Kafka's collision), or
    None. Read without an index: a creation's cost, and only for a name with either character."""
    if not COLLISION_CHARACTERS.intersection(name):
        return None
    return await conn.fetchval(
        "SELECT name FROM topics WHERE replace(name, '.', '_') = $1 AND name <> $2 ORDER BY name LIMIT 1",
        _unified(name),
        name,
    )


def topic_exists(name: str) -> BrokerError:
    return BrokerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists: use it, or delete it first")


def unknown_topic(name: str) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        f"topic {name!r} does not exist: create it with POST /v1/topics, or check the name",
    )


def unknown_topic_id(topic_uuid: uuid.UUID) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_TOPIC_ID,
        f"no topic has the topic id {topic_uuid}: the topic was deleted (a re-created one has a new id); "
        f"refresh the topic's metadata",
    )


def unknown_partition(topic: TopicInfo, partition: int) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        f"partition {partition} of topic {topic.name!r} does not exist: the topic has partitions "
        f"0 to {topic.partition_count - 1}",
    )
