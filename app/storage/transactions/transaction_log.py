"""The coordinator's transaction metadata: the `transactions` rows (current state per transactional
id) and the internal topic `__transaction_state`, which receives every state transition.

Invariants:
- A row change and its `__transaction_state` records are written in the same PostgreSQL
  transaction (`save`), so the log and the materialized state never disagree.
- Coordinator requests serialize on the row (`lock`, SELECT ... FOR UPDATE), taken before any
  partition row. The transitions of one request are kept on the metadata (`record`) and appended
  to `__transaction_state` as one batch by `save`, which callers run LAST, after every data
  partition they lock: so no PostgreSQL transaction ever holds a transaction-log partition while
  waiting for a data partition, and coordinator requests cannot deadlock with markers or produce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import asyncpg
import orjson

from app.storage.log import record_codec
from app.storage.log.append import BatchAppend, append_batch_or_raise
from app.storage.log.fused_writes import WriteStatement
from app.storage.log.partition_log import (
    APPENDS_CHANNEL,
    BATCH_COLUMNS,
)
from app.storage.log.topics import (
    TOPIC_COLUMNS,
    TRANSACTION_STATE_TOPIC,
    TopicInfo,
    could_exist,
    get_topic,
    topic_from_row,
)
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, partition_for_key

NO_START_TIME = -1


@dataclass(frozen=True, slots=True)
class TxnPartition:
    topic: str
    partition: int
    topic_id: int


@dataclass(slots=True)
class TransactionRow:
    """One transactional id's persisted state. The owner of the state machine gives its
    TransactionLog the type rows are read as (the coordinator's TransactionMetadata, which adds the
    transitions) and the parser of `state`, run once when the row is read (the coordinator's
    TransactionState: a str enum, so storage persists it as the text it is without knowing it)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    txn_start_ms: int
    last_update_ms: int
    last_producer_id: int | None = None
    last_producer_epoch: int | None = None
    txn_producer_id: int | None = None
    txn_producer_epoch: int | None = None
    partitions: list[TxnPartition] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    principal: str | None = None  # who created the id, for the per-principal quota
    # How the last EndTxn ended a transaction: 1 (classic, the epoch carries over) or 2 (KIP-890's
    # epoch bump), transaction_metadata.TRANSACTION_VERSION_* in the coordinator; None until an
    # EndTxn ends one of the id's transactions (a transaction aborted by a fence sets none).
    transaction_version: int | None = None
    # Transitions made by the current request, not yet in __transaction_state (see `save`).
    pending_records: list[dict] = field(default_factory=list)

    def log_value(self) -> dict:
        """The `__transaction_state` record of this state."""
        return {
            "state": self.state,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "txn_producer_id": self.txn_producer_id,
            "txn_producer_epoch": self.txn_producer_epoch,
            "timeout_ms": self.timeout_ms,
            "txn_start_ms": self.txn_start_ms,
            "last_update_ms": self.last_update_ms,
            "partitions": [[p.topic, p.partition] for p in self.partitions],
            "groups": self.groups,
            "transaction_version": self.transaction_version,
        }


Row = TypeVar("Row", bound=TransactionRow)

_COLUMNS = (
    "transactional_id, producer_id, producer_epoch, state, timeout_ms, txn_start_ms, last_update_ms, "
    "last_producer_id, last_producer_epoch, txn_producer_id, txn_producer_epoch, partitions, groups, principal, "
    "transaction_version"
)


# `lock` for several ids in one statement, in id order (the LockRows node sits above the Sort), so
# two PostgreSQL transactions that lock overlapping sets cannot deadlock; ids without a row are left
# out. Built once (an f-string would be built on every produce and EndTxn).
_LOCK_MANY_SQL = (
    f"SELECT {_COLUMNS} FROM transactions WHERE transactional_id = ANY($1::text[]) ORDER BY transactional_id FOR UPDATE"
)


# lock_many_and_find_topics: the rows of _LOCK_MANY_SQL, then the topics of find_topics, as one result
# (each row has the other's columns NULL; a transactions row is the one with a transactional_id).
# One statement is as right as the two were: the topics are read from the statement's snapshot,
# taken before any wait for a row, as they were read before the rows were locked; the locked rows
# are re-read once ours.
_COLUMN_NAMES = tuple(name.strip() for name in _COLUMNS.split(","))
_NO_COLUMNS = ", ".join("NULL" for _ in _COLUMN_NAMES)  # a topic's row has these NULL
_NO_TOPIC_COLUMNS = ", ".join(f"NULL AS {name}" for name in TOPIC_COLUMNS.split(", "))  # and a transaction's these
_LOCK_MANY_AND_FIND_TOPICS_SQL = f"""
WITH locked AS MATERIALIZED ({_LOCK_MANY_SQL})
SELECT {_COLUMNS}, {_NO_TOPIC_COLUMNS}
FROM locked
UNION ALL
SELECT {_NO_COLUMNS}, {TOPIC_COLUMNS} FROM topics WHERE name = ANY($2::text[])
"""


def _from_row(row: asyncpg.Record, row_type: type[Row], parse_state: Callable[[str], str]) -> Row:
    values = {name: row[name] for name in _COLUMN_NAMES}
    values["state"] = parse_state(values["state"])
    values["partitions"] = [TxnPartition(*p) for p in values["partitions"]]
    return row_type(**values)


def _row_values(meta: TransactionRow) -> list:
    return [
        meta.transactional_id,
        meta.producer_id,
        meta.producer_epoch,
        meta.state,
        meta.timeout_ms,
        meta.txn_start_ms,
        meta.last_update_ms,
        meta.last_producer_id,
        meta.last_producer_epoch,
        meta.txn_producer_id,
        meta.txn_producer_epoch,
        [[p.topic, p.partition, p.topic_id] for p in meta.partitions],
        meta.groups,
        meta.principal,
        meta.transaction_version,
    ]


# TransactionLog.save_statement, one round trip (or none of its own, fused: fused_writes.py): the
# ids' rows (already locked by this PostgreSQL transaction, `lock`/`lock_many_and_find_topics`) are updated (`r`,
# one row per id); the epoch of each id's producer id recorded as the latest issued, if it is newer
# (an epoch bump of producer_ids.next_epoch, written here rather than by a statement of its own; a
# no-op otherwise); and the transitions appended to __transaction_state (`l`, one batch per
# partition of that topic, holding the records of every id that hashes there) as append.py
# appends a plain batch: bump the high watermark (locking that partition's row, the last locks the
# request takes), insert the batch at the old one, wake long polls at commit. A group's ids hash to
# several of those partitions: `locked` takes their rows in lock_order (a row is locked as the Sort
# below LockRows hands it up, and `log_head` only updates rows `locked` has handed up), so two groups
# cannot deadlock on them, without a statement of its own.
_SAVE_QUERIES = f"""r AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::int[], $4::text[], $5::int[], $6::bigint[], $7::bigint[],
                         $8::bigint[], $9::int[], $10::bigint[], $11::int[], $12::text[], $13::text[], $21::int[])
        AS r(transactional_id, producer_id, producer_epoch, state, timeout_ms, txn_start_ms, last_update_ms,
             last_producer_id, last_producer_epoch, txn_producer_id, txn_producer_epoch, partitions, groups,
             transaction_version)
), saved AS (
    UPDATE transactions t SET producer_id = r.producer_id, producer_epoch = r.producer_epoch, state = r.state,
        timeout_ms = r.timeout_ms, txn_start_ms = r.txn_start_ms, last_update_ms = r.last_update_ms,
        last_producer_id = r.last_producer_id, last_producer_epoch = r.last_producer_epoch,
        txn_producer_id = r.txn_producer_id, txn_producer_epoch = r.txn_producer_epoch,
        partitions = r.partitions::jsonb, groups = r.groups::jsonb, transaction_version = r.transaction_version
    FROM r WHERE t.transactional_id = r.transactional_id
), issued AS (
    UPDATE producer_ids i SET producer_epoch = r.producer_epoch
    FROM r WHERE i.producer_id = r.producer_id AND i.producer_epoch < r.producer_epoch
), l AS (
    SELECT * FROM unnest($14::int[], $15::int[], $16::int[], $17::bigint[], $18::bigint[], $19::int[], $20::bytea[])
        AS l(topic_id, partition, record_count, first_timestamp_ms, max_timestamp_ms, size_bytes, records)
), locked AS MATERIALIZED (
    SELECT p.topic_id, p.partition FROM partitions p JOIN l ON p.topic_id = l.topic_id AND p.partition = l.partition
    ORDER BY p.topic_id, p.partition
    FOR UPDATE OF p
), log_head AS (
    UPDATE partitions p SET high_watermark = p.high_watermark + l.record_count
    FROM l JOIN locked ON locked.topic_id = l.topic_id AND locked.partition = l.partition
    WHERE p.topic_id = l.topic_id AND p.partition = l.partition
    RETURNING p.topic_id, p.partition, p.high_watermark - l.record_count AS base_offset
), log_appended AS (
    INSERT INTO record_batches ({BATCH_COLUMNS})
    SELECT l.topic_id, l.partition, log_head.base_offset, log_head.base_offset + l.record_count - 1, {NO_PRODUCER_ID},
        {NO_PRODUCER_EPOCH}, {NO_SEQUENCE}, false, NULL, l.first_timestamp_ms, l.max_timestamp_ms, l.record_count,
        l.size_bytes, l.records
    FROM l JOIN log_head ON log_head.topic_id = l.topic_id AND log_head.partition = l.partition
    RETURNING topic_id, partition
)"""
_SAVE_FINAL = f"SELECT pg_notify('{APPENDS_CHANNEL}', topic_id::text || ':' || partition::text) FROM log_appended"


# The class id of the advisory locks that serialize one principal's creations of transactional ids:
# -1, which neither the topic names' locks (0) nor the log cleaner's ((topic_id, partition), topic
# ids from 1) use.
_CREATIONS_LOCK_CLASS = -1


class TransactionLog(Generic[Row]):
    """Reads and writes transaction metadata; caches the internal topic's (never deleted) info.
    Rows are read as `row_type`; `parse_state` turns a persisted state name into the caller's state
    type (see TransactionRow)."""

    def __init__(self, row_type: type[Row] = TransactionRow, parse_state: Callable[[str], str] = str) -> None:
        self._topic: TopicInfo | None = None
        self._row_type = row_type
        self._parse_state = parse_state

    async def _log_topic(self, conn: asyncpg.Connection) -> TopicInfo:
        if self._topic is None:
            self._topic = await get_topic(conn, TRANSACTION_STATE_TOPIC)
        return self._topic

    async def lock(self, conn: asyncpg.Connection, transactional_id: str) -> Row | None:
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM transactions WHERE transactional_id = $1 FOR UPDATE", transactional_id
        )
        return None if row is None else _from_row(row, self._row_type, self._parse_state)

    async def lock_many_and_find_topics(
        self, conn: asyncpg.Connection, transactional_ids: list[str], topic_names: list[str]
    ) -> tuple[dict[str, Row], dict[str, TopicInfo]]:
        """The ids' rows locked (`lock` for several ids, in id order; ids without a row are left out)
        and the topics that exist (topics.find_topics), in one statement: one round trip for a write
        batch of produce and EndTxn requests."""
        rows = await conn.fetch(
            _LOCK_MANY_AND_FIND_TOPICS_SQL,
            sorted(transactional_ids),
            [name for name in topic_names if could_exist(name)],
        )
        metas, topics = {}, {}
        for row in rows:
            if row["transactional_id"] is not None:
                metas[row["transactional_id"]] = _from_row(row, self._row_type, self._parse_state)
            else:
                topics[row["name"]] = topic_from_row(row)
        return metas, topics

    async def lock_new(self, conn: asyncpg.Connection, meta: TransactionRow) -> bool:
        """Inserts a new id's row unless one exists (a racing InitProducerId may have made it);
        True when this call created it. Either way the caller then `lock`s it."""
        status = await conn.execute(
            f"INSERT INTO transactions ({_COLUMNS}) "
            f"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) "
            f"ON CONFLICT (transactional_id) DO NOTHING",
            *_row_values(meta),
        )
        created = status.endswith(" 1")
        if created:  # nothing else is locked yet in this PostgreSQL transaction: log it now
            self.record(meta)
            await self._append_records(conn, meta)
        return created

    async def get(self, conn: asyncpg.Connection, transactional_id: str) -> Row | None:
        row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM transactions WHERE transactional_id = $1", transactional_id)
        return None if row is None else _from_row(row, self._row_type, self._parse_state)

    @staticmethod
    def record(meta: TransactionRow) -> None:
        """Notes the metadata's current state as a transition to log when `save` runs."""
        meta.pending_records.append(meta.log_value())

    async def save(self, conn: asyncpg.Connection, meta: TransactionRow) -> None:
        """Writes the row (and its epoch into producer_ids, see _SAVE_QUERIES) and appends the recorded
        transitions to __transaction_state as one batch, in one statement. Run it last in the
        PostgreSQL transaction (see the module's invariants)."""
        statement = await self.save_statement(conn, [meta])
        if statement is not None:
            await statement.execute(conn)

    async def save_statement(self, conn: asyncpg.Connection, metas: list[TransactionRow]) -> WriteStatement | None:
        """`save` for the distinct ids of a write batch of requests committed together, as one statement
        (which locks the __transaction_state partitions their records go to in lock_order first),
        for the caller to run last (fused with its own last write: fused_writes.py); None when no id
        has a transition to log. The recorded transitions go into the statement: the metadata has
        none pending after this call."""
        metas = [meta for meta in metas if meta.pending_records]
        if not metas:
            return None
        topic = await self._log_topic(conn)
        by_partition: dict[int, list[record_codec.TextRecord]] = {}
        for meta in metas:
            by_partition.setdefault(self._partition_of(meta, topic), []).extend(self._records(meta))
        batches = [
            record_codec.encode_batch(records, "utf8", max(r.timestamp_ms for r in records), "transaction log")
            for records in by_partition.values()
        ]
        # jsonb columns as JSON text: asyncpg would take nested lists for a multidimensional array
        rows = [
            [*values[:11], *(orjson.dumps(v).decode() for v in values[11:13])] for values in map(_row_values, metas)
        ]
        args = (
            *(list(column) for column in zip(*rows)),
            [topic.topic_id] * len(by_partition),
            list(by_partition),
            [batch.record_count for batch in batches],
            [batch.first_timestamp_ms for batch in batches],
            [batch.max_timestamp_ms for batch in batches],
            [batch.size_bytes for batch in batches],
            [batch.payload for batch in batches],
            [meta.transaction_version for meta in metas],
        )
        for meta in metas:
            meta.pending_records.clear()
        return WriteStatement(_SAVE_QUERIES, _SAVE_FINAL, args)

    async def delete(self, conn: asyncpg.Connection, meta: TransactionRow) -> None:
        """The id expires (Dead): its row goes; the log gets the Dead record, then a tombstone (as
        Kafka's coordinator writes), so compaction forgets the id after delete_retention_ms."""
        await conn.execute("DELETE FROM transactions WHERE transactional_id = $1", meta.transactional_id)
        await self._append_records(conn, meta, tombstone=True)

    @staticmethod
    def _partition_of(meta: TransactionRow, topic: TopicInfo) -> int:
        """The __transaction_state partition of the id."""
        return partition_for_key(meta.transactional_id.encode(), topic.partition_count)

    @staticmethod
    def _records(meta: TransactionRow, tombstone: bool = False) -> list[record_codec.TextRecord]:
        """The recorded transitions (and a tombstone) as records keyed by the id."""
        records = [
            record_codec.TextRecord(meta.transactional_id, orjson.dumps(value).decode(), (), value["last_update_ms"])
            for value in meta.pending_records
        ]
        if tombstone:
            records.append(record_codec.TextRecord(meta.transactional_id, None, (), meta.last_update_ms))
        return records

    async def _pending_batch(
        self, conn: asyncpg.Connection, meta: TransactionRow, tombstone: bool = False
    ) -> tuple[TopicInfo, int, record_codec.EncodedBatch]:
        """The recorded transitions (and a tombstone) as one batch, and the __transaction_state
        partition of the id that receives it."""
        topic = await self._log_topic(conn)
        records = self._records(meta, tombstone)
        batch = record_codec.encode_batch(records, "utf8", meta.last_update_ms, "transaction log")
        return topic, self._partition_of(meta, topic), batch

    async def _append_records(self, conn: asyncpg.Connection, meta: TransactionRow, tombstone: bool = False) -> None:
        topic, partition, batch = await self._pending_batch(conn, meta, tombstone)
        await append_batch_or_raise(conn, BatchAppend(topic, partition, batch))
        meta.pending_records.clear()

    async def hold_creations_by(self, conn: asyncpg.Connection, principal: str) -> None:
        """Serializes the creations of transactional ids by one principal (an advisory lock held until
        the caller's PostgreSQL transaction ends), so that of two concurrent ones the second counts
        the first against the principal's quota (`count_created_by`, a statement run after this)."""
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _CREATIONS_LOCK_CLASS, principal)

    async def count_created_by(self, conn: asyncpg.Connection, principal: str) -> int:
        return await conn.fetchval("SELECT count(*) FROM transactions WHERE principal = $1", principal)

    async def list(
        self,
        conn: asyncpg.Connection,
        states: list[str] | None,
        prefix: str | None,
        producer_id: int | None,
        started_before_ms: int | None,
        limit: int,
        after: str | None = None,
        id_pattern: str | None = None,
    ) -> list[Row]:
        """Filtered listing, ordered by transactional id, paginated by `after` (keyset);
        `id_pattern`: a regular expression the whole id matches (raises InvalidIdPattern)."""
        query = (
            f"SELECT {_COLUMNS} FROM transactions WHERE ($1::text[] IS NULL OR state = ANY($1::text[])) "
            f"AND ($2::text IS NULL OR starts_with(transactional_id, $2)) "
            f"AND ($3::bigint IS NULL OR producer_id = $3) "
            f"AND ($4::bigint IS NULL OR (txn_start_ms <> -1 AND txn_start_ms <= $4)) "
            f"AND ($6::text IS NULL OR transactional_id > $6) "
            f"AND ($7::text IS NULL OR transactional_id ~ ('^(?:' || $7 || ')$')) "
            f"ORDER BY transactional_id LIMIT $5"
        )
        arguments = (states, prefix, producer_id, started_before_ms, limit, after, id_pattern)
        if id_pattern is None:
            rows = await conn.fetch(query, *arguments)
        else:
            rows = await _fetch_matching(conn, query, arguments, id_pattern)
        return [_from_row(row, self._row_type, self._parse_state) for row in rows]

    async def claim(self, conn: asyncpg.Connection, where_sql: str, *args, limit: int = 100) -> list[str]:
        """Ids matching `where_sql` whose rows no other server is working on (SKIP LOCKED), locked
        for the caller's transaction: how background workers on several servers share the work."""
        rows = await conn.fetch(
            f"SELECT transactional_id FROM transactions WHERE {where_sql} "
            f"ORDER BY last_update_ms LIMIT {int(limit)} FOR UPDATE SKIP LOCKED",
            *args,
        )
        return [row["transactional_id"] for row in rows]


class InvalidIdPattern(ValueError):
    """A transactional id pattern PostgreSQL does not compile, or that took longer than
    PATTERN_TIMEOUT to match."""


# A client's pattern is matched by PostgreSQL, not in the server's event loop: Python's (and
# Java's) backtracking engines take exponential time on patterns such as `(a+)+` against a long
# id, which would stall every connection of the worker. PostgreSQL's engine matches most patterns
# without backtracking, and a statement timeout bounds the rest.
PATTERN_TIMEOUT = "2s"


async def _fetch_matching(conn: asyncpg.Connection, query: str, arguments: tuple, id_pattern: str) -> list:
    try:
        async with conn.transaction(readonly=True):
            await conn.execute(f"SET LOCAL statement_timeout = '{PATTERN_TIMEOUT}'")
            # Compiled once whether or not any row is there to match, so that a bad pattern is
            # always refused.
            await conn.fetchval("SELECT '' ~ ('^(?:' || $1::text || ')$')", id_pattern)
            return await conn.fetch(query, *arguments)
    except asyncpg.InvalidRegularExpressionError as error:
        raise InvalidIdPattern(
            f"transactional id pattern {id_pattern!r} is not a valid regular expression ({error}): "
            f"send one in PostgreSQL's regular expression syntax, which shares Java's common forms"
        ) from None
    except asyncpg.QueryCanceledError:
        raise InvalidIdPattern(
            f"transactional id pattern {id_pattern!r} took longer than {PATTERN_TIMEOUT} to match: "
            f"send a simpler pattern (nested quantifiers such as (a+)+ are the usual cause)"
        ) from None
