"""Topics: CreateTopics, DeleteTopics, CreatePartitions, Metadata (the topics with their partitions'
offsets), a topic's config altered, DeleteRecords (KIP-107), and the partitions' stored sizes.
Every change is written with its audit entry (who made it); the caller's authorization is the
front door's (`visible` filters listings by what the caller may see)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from app.coordinator.audit import Actor, record
from app.coordinator.confirmed_reads import (
    ReplicationBarrier,
    confirmed_by_the_standby,
    reads_confirmed_by_the_standby,
)
from app.errors import BrokerError
from app.storage.database import ROLLED_BACK_BY_POSTGRESQL
from app.storage.lifecycle import log_cleaner
from app.storage.log import partition_log, topic_configs, topics
from app.storage.log.partition_log import NO_OFFSET, PartitionState
from app.storage.log.topics import (
    DEFAULT_TOPIC_CONFIG,
    INTERNAL_PREFIX,
    TopicInfo,
    TopicNameCollision,
    check_topic_name,
    kafka_topic_id,
    topic_exists,
    unknown_topic,
    unknown_topic_id,
)

__all__ = [
    "DEFAULT_TOPIC_CONFIG",
    "KAFKA_CONFIG_DEFAULTS",
    "TOPIC_CONFIG_SPECS",
    "PartitionState",
    "RecordsDeleted",
    "TopicInfo",
    "TopicNameCollision",
    "alter_config",
    "create_topic",
    "delete_records",
    "delete_topic",
    "described_config_text",
    "describe_topic",
    "describe_topics",
    "find_topics",
    "find_topics_by_uuid",
    "get_topic",
    "grow_partitions",
    "is_internal_name",
    "kafka_topic_id",
    "parsed_config_text",
    "list_topics",
    "missing_topic",
    "refused_before_its_settings",
    "stored_bytes",
    "topic_config_spec",
    "unknown_topic",
    "unknown_topic_id",
]

TopicWithPartitions = tuple[TopicInfo, list[PartitionState]]

log = logging.getLogger(__name__)

# Kafka's topic configs, the core's one table of them (storage's topic_configs.py), for the doors.
TOPIC_CONFIG_SPECS = topic_configs.SPECS
KAFKA_CONFIG_DEFAULTS = topic_configs.KAFKA_DEFAULTS
topic_config_spec = topic_configs.spec_of
described_config_text = topic_configs.described_text


def parsed_config_text(key: str, text: str | None) -> Any:
    """A config's value as Kafka's protocol carries it (text), read and checked as Kafka does (INVALID_CONFIG)."""
    return topic_configs.parsed_text(topic_configs.SPECS_BY_KEY[key], text)


def _everything(_name: str) -> bool:
    return True


def is_internal_name(name: str) -> bool:
    """Whether `name` is one of txbroker's internal topics' (no other topic may have such a name)."""
    return name.startswith(INTERNAL_PREFIX)


def missing_topic(name: str) -> BrokerError:
    """Why a name no topic has is not described, as Kafka's broker says it (Topic.validate):
    INVALID_TOPIC_EXCEPTION for a name no topic could have, else UNKNOWN_TOPIC_OR_PARTITION."""
    try:
        check_topic_name(name, allow_internal=True)
    except BrokerError as invalid:
        return invalid
    return unknown_topic(name)


async def refused_before_its_settings(pool: asyncpg.Pool, name: str) -> BrokerError | None:
    """What refuses a creation before its partition count and configs are looked at, in the order
    of Kafka's controller (ReplicationControlManager.createTopics): a name no topic may have
    (INVALID_TOPIC_EXCEPTION), then a topic of that name (TOPIC_ALREADY_EXISTS), then one whose name
    differs from it by '.' and '_' alone (INVALID_TOPIC_EXCEPTION, TopicNameCollision); None for none."""
    try:
        check_topic_name(name)
    except BrokerError as invalid:
        return invalid
    async with pool.acquire() as conn:
        found = await topics.find_topics(conn, [name])
        colliding = None if name in found else await topics.colliding_topic(conn, name)
    if name in found:
        return topic_exists(name)
    return None if colliding is None else TopicNameCollision(name, colliding)


class _ValidatedOnly(Exception):
    """Rolls back a validate-only change once it has been checked as if made."""


@dataclass(frozen=True, slots=True)
class RecordsDeleted:
    """DeleteRecords' answer for one partition: its new log start, or why it did not move."""

    partition: int
    low_watermark: int = NO_OFFSET
    error: BrokerError | None = None


async def list_topics(
    pool: asyncpg.Pool, visible: Callable[[str], bool] = _everything, confirmed_by: ReplicationBarrier | None = None
) -> list[TopicInfo]:
    """The topics whose names `visible` admits, once the synchronous standby (`confirmed_by`: the
    server's barrier; None: at once) has them: a topic whose creation it lacks is taken back by a
    failover, one whose deletion it lacks brought back; DatabaseUnavailable (retriable) if it has
    not within READ_WAIT_MIN_S."""
    async with pool.acquire() as conn:
        found = [topic for topic in await topics.list_topics(conn) if visible(topic.name)]
    await confirmed_by_the_standby(confirmed_by, "the list of topics")
    return found


async def get_topic(pool: asyncpg.Pool, name: str) -> TopicInfo:
    """The topic, or UNKNOWN_TOPIC_OR_PARTITION."""
    async with pool.acquire() as conn:
        return await topics.get_topic(conn, name)


async def find_topics(pool: asyncpg.Pool, names: list[str]) -> dict[str, TopicInfo]:
    """The topics of these names that exist, by name."""
    async with pool.acquire() as conn:
        return await topics.find_topics(conn, names)


async def find_topics_by_uuid(pool: asyncpg.Pool, topic_uuids: list[uuid.UUID]) -> dict[uuid.UUID, TopicInfo]:
    """The topics of these Kafka topic ids that exist, by id."""
    async with pool.acquire() as conn:
        return await topics.find_topics_by_uuid(conn, topic_uuids)


async def create_topic(
    pool: asyncpg.Pool,
    actor: Actor,
    name: str,
    partitions: int,
    config: dict[str, Any],
    defaults: dict[str, Any],
    *,
    details: str | None = None,
    validate_only: bool = False,
) -> TopicWithPartitions:
    """Creates the topic (TOPIC_ALREADY_EXISTS when it exists). `details`: the audit entry's
    (default: the partition count). `validate_only`: checked as if created, audit entry included,
    then rolled back; the answer is the topic as it would be."""
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():  # the audit entry is part of the change: both or neither
                topic = await topics.create_topic(conn, name, partitions, config, defaults=defaults)
                await record(conn, actor, "create topic", name, details or f"partitions={partitions}")
                if validate_only:
                    states = await partition_log.partition_states(conn, [topic])
                    raise _ValidatedOnly
        except _ValidatedOnly:
            return topic, states[topic.topic_id]
        states = await partition_log.partition_states(conn, [topic])
    return topic, states[topic.topic_id]


async def alter_config(
    pool: asyncpg.Pool,
    actor: Actor,
    name: str,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    defaults: dict[str, Any],
    details: str,
    *,
    validate_only: bool = False,
) -> TopicInfo:
    """Replaces the topic's config by change(its config), validated as at creation; two concurrent
    alterations apply one after the other, none lost (storage/topics.py locks the row).
    `validate_only`: checked as if made, then rolled back."""
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():  # the audit entry is part of the change: both or neither
                topic = await topics.alter_config(conn, name, change, defaults)
                await record(conn, actor, "alter topic config", name, details)
                if validate_only:
                    raise _ValidatedOnly
        except _ValidatedOnly:
            pass
    return topic


async def grow_partitions(
    pool: asyncpg.Pool,
    actor: Actor,
    name: str,
    partition_count: int,
    *,
    validate_only: bool = False,
    check_added: Callable[[int], None] | None = None,
) -> TopicWithPartitions:
    """[CreatePartitions] Raises the topic's partition count to `partition_count` (an increase only:
    INVALID_PARTITIONS otherwise); the new partitions start empty at offset 0 and take produces,
    fetches and group assignments from the commit on (storage/topics.py says why that is safe with
    those in flight). `validate_only`: checked as if made, audit entry included, then rolled back;
    the answer is the topic as it would be. `check_added`: called with the number of partitions
    added once the topic and the count are checked, under the topic's lock (a door's checks of what
    it was asked with them, Kafka's replica assignments); whatever it raises refuses the growth."""
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():  # the count, the new partitions and the audit entry: all or none
                topic, before = await topics.grow_partitions(conn, name, partition_count)
                if check_added is not None:
                    check_added(partition_count - before)
                await record(conn, actor, "create partitions", name, f"partitions={before}->{partition_count}")
                states = await partition_log.partition_states(conn, [topic])
                if validate_only:
                    raise _ValidatedOnly
        except _ValidatedOnly:
            pass
    return topic, states[topic.topic_id]


async def describe_topics(
    pool: asyncpg.Pool,
    visible: Callable[[str], bool] = _everything,
    wait_for_connection_s: float | None = None,
    confirmed_by: ReplicationBarrier | None = None,
) -> list[TopicWithPartitions]:
    """The topics whose names `visible` admits, with their partitions' offsets; TimeoutError when
    no pooled connection is free within `wait_for_connection_s` (None: no bound). `confirmed_by`:
    the server's barrier, as describe_topic's (None: answered at once, as a /metrics scrape is)."""
    async with pool.acquire(timeout=wait_for_connection_s) as conn:
        found = [topic for topic in await topics.list_topics(conn) if visible(topic.name)]
        states = await partition_log.partition_states(conn, found)
    await confirmed_by_the_standby(confirmed_by, "the topics' descriptions")
    return [(topic, states[topic.topic_id]) for topic in found]


async def describe_topic(pool: asyncpg.Pool, name: str, confirmed_by: ReplicationBarrier | None) -> TopicWithPartitions:
    """The topic with its partitions' offsets, answered once the synchronous standby (`confirmed_by`:
    the server's barrier) has them: a high watermark a failover takes back (records produced on the
    primary alone) would have a reader wait for records that never come, or count ones gone; so is
    UNKNOWN_TOPIC_OR_PARTITION (a deletion the standby lacks comes back); DatabaseUnavailable
    (retriable) if it has not within READ_WAIT_MIN_S."""
    async with reads_confirmed_by_the_standby(confirmed_by, f"the description of topic {name!r}"):
        async with pool.acquire() as conn:
            topic = await topics.get_topic(conn, name)
            states = await partition_log.partition_states(conn, [topic])
    return topic, states[topic.topic_id]


async def stored_bytes(pool: asyncpg.Pool, names: list[str] | None) -> dict[str, dict[int, int]]:
    """The stored bytes of each partition of the named topics that exist (None: of every topic),
    by topic name, as retention by size (`retention_bytes`) counts them."""
    async with pool.acquire() as conn:
        found = await topics.list_topics(conn) if names is None else (await topics.find_topics(conn, names)).values()
        return {topic.name: await log_cleaner.stored_bytes(conn, topic) for topic in found}


async def delete_topic(pool: asyncpg.Pool, actor: Actor, name: str, topic_uuid: uuid.UUID | None = None) -> uuid.UUID:
    """Deletes the topic and all its records (the log cleaner removes its rows in the background);
    given a Kafka topic id, only the topic of that id (else UNKNOWN_TOPIC_ID). Returns its id. A
    deletion PostgreSQL rolls back to break a deadlock is run once more."""
    try:
        return await _deleted_topic(pool, actor, name, topic_uuid)
    except ROLLED_BACK_BY_POSTGRESQL as error:
        # Its cascades lock the topic's partitions' rows, and its offsets' rows, in the order of
        # PostgreSQL's plan, which appends (lock_order) and a transaction's settling of pending
        # offsets do not follow, so it may close a cycle with them. Nothing was written or answered:
        # run again, it waits for whoever won.
        log.warning("the deletion of topic %r was rolled back by PostgreSQL (%s): running it once more", name, error)
        return await _deleted_topic(pool, actor, name, topic_uuid)


async def _deleted_topic(pool: asyncpg.Pool, actor: Actor, name: str, topic_uuid: uuid.UUID | None) -> uuid.UUID:
    async with pool.acquire() as conn, conn.transaction():  # the audit entry is part of the change
        deleted = await topics.delete_topic(conn, name, topic_uuid)
        await record(conn, actor, "delete topic", name)
    return deleted


async def delete_records(
    pool: asyncpg.Pool, actor: Actor, topic_name: str, requested: list[tuple[int, int]]
) -> list[RecordsDeleted]:
    """Moves each (partition, offset)'s log start up to the offset; per-partition errors are
    answers (UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE), in the order asked. Retrying is safe:
    the log start never moves back. The moves and their audit entry commit together (none when no
    log start moved); the partitions are locked in lock order, as appends lock them, so that this
    PostgreSQL transaction cannot deadlock with a write batch's."""
    moved: dict[int, RecordsDeleted] = {}
    async with pool.acquire() as conn, conn.transaction():
        topic = await topics.get_topic(conn, topic_name)
        log_cleaner.check_records_deletable(topic)
        for index, (partition, offset) in sorted(enumerate(requested), key=lambda asked: asked[1][0]):
            try:
                # A savepoint: a refused partition rolls back its own steps only.
                async with conn.transaction():
                    moved[index] = RecordsDeleted(
                        partition, await log_cleaner.delete_records(conn, topic, partition, offset)
                    )
            except BrokerError as error:
                moved[index] = RecordsDeleted(partition, error=error)
        answers = [moved[index] for index in range(len(requested))]
        deleted = [answer for answer in answers if answer.error is None]
        if deleted:
            details = ", ".join(f"partition {answer.partition}: log start {answer.low_watermark}" for answer in deleted)
            await record(conn, actor, "delete records", topic_name, details)
    return answers
