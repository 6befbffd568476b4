"""Appends to the partition log: batches with dense offsets, checked against their producers'
sequences.

Invariant: offsets of a partition are dense and unique. An append takes its partition's row lock
until commit and inserts its batch at the high watermark it read under that lock, which it advances
past the batch. Concurrent appends to one partition therefore queue on the row; appends to other
partitions never wait. A multi-partition append locks its partitions in (topic_id, partition) order
(locks.py), so two of them cannot deadlock.

One path for every append (`append_batches`): check each batch where it lands (`plan_appends`:
a client's batch against its producer's sequence, a coordinator's without one, see AppendOrigin),
then write them all with one statement (`_write_appends`). A lone plain batch takes a shortcut,
`_append_one_plain`: one statement locks, appends and advances the head.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import asyncpg
import orjson

from app.clock import now_ms
from app.errors import BrokerError, ErrorCode, InvalidRecords, InvalidTimestamps
from app.storage.log import record_codec, sequences
from app.storage.log.batch_form import uses_log_append_time
from app.storage.log.fused_writes import WriteStatement, execute_fused
from app.storage.log.locks import LockedPartitions, PartitionLocks, lock_partitions, producer_entry_from_row
from app.storage.log.partition_log import APPENDS_CHANNEL, BATCH_COLUMNS
from app.storage.log.record_codec import EncodedBatch
from app.storage.log.topics import CLEANUP_COMPACT, TopicInfo, unknown_partition
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP


class AppendOrigin(enum.Enum):
    """Who writes a batch, as Kafka's AppendOrigin. A CLIENT's batch of a producer is checked
    against the producer's sequence on the partition. A COORDINATOR's is a transactional batch
    written on the producer's behalf (its TxnOffsetCommit in __consumer_offsets): it carries the
    transaction's producer id and epoch, so read_committed readers hide it until the COMMIT marker
    (and forever after an ABORT), and opens the producer's transaction on the partition (pinning the
    LSO) unless already open; it has no sequence (NO_SEQUENCE) to check, the coordinator checked the
    producer (sequences.coordinator_batch)."""

    CLIENT = "client"
    COORDINATOR = "coordinator"


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """One partition's part of a produce request (or of the coordinator's own write), validated and
    encoded."""

    topic: TopicInfo
    partition: int
    batch: EncodedBatch
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    is_transactional: bool = False
    origin: AppendOrigin = AppendOrigin.CLIENT
    # The server's clock when its write batch appends it (Kafka's LogValidator's `now`): the
    # LogAppendTime its records take (batch_form.py) and what its topic's timestamp bounds measure
    # from. None for a batch the server writes itself (its transaction log, its groups' offsets),
    # timestamped by that clock and never bounded (internal topics keep their default configs).
    appended_ms: int | None = None
    # Kafka's leaders' rule: an idempotent producer with no state on the partition is taken at any
    # sequence (sequences.check_batch; set by the Kafka door, ProduceCommand.takes_expired_producers).
    stateless_takes_any_sequence: bool = False


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    # The partition's log start offset at the append (a duplicate's: at its retry), which Kafka's
    # leader answers a Produce with (v5+; Java's and kafka-python's producers read it).
    log_start_offset: int
    duplicate: bool = False
    # The append time its records took (a topic with Kafka's LogAppendTime), else None: `answered`.
    log_append_time_ms: int | None = None


def answered(
    append: BatchAppend,
    base_offset: int,
    last_offset: int,
    max_timestamp_ms: int,
    log_start_offset: int,
    duplicate: bool = False,
) -> AppendResult:
    """The answer for a batch stored at these offsets with this max timestamp (a duplicate: the
    original's). In a topic with LogAppendTime its log_append_time is that max timestamp, the append
    time the batch took (batch_form.py), a retry's too, as Kafka answers a duplicate with its
    BatchMetadata's timestamp (UnifiedLog.append); none when a retry's original was remembered
    before its timestamp was (sequences.RecentBatch). Under CreateTime none (-1), as Kafka's protocol
    defines the field: Kafka's broker answers a duplicate there with its max timestamp all the same,
    which its clients would then report as every record's timestamp, of type LogAppendTime."""
    log_append_time = uses_log_append_time(append.topic) and max_timestamp_ms != NO_TIMESTAMP
    return AppendResult(
        base_offset, last_offset, log_start_offset, duplicate, max_timestamp_ms if log_append_time else None
    )


# `_append_one_plain`: bumps the high watermark (locking the partition's row until commit), inserts
# the batch at the old one, and tells long-polling fetches on every server (NOTIFY is delivered at
# commit). A plain batch has no producer state to read under the lock, so this one statement does
# what `lock_partitions` then `_write_appends` do in two.
_APPEND_ONE_PLAIN_SQL = f"""
WITH head AS (
    UPDATE partitions SET high_watermark = high_watermark + $3
    WHERE topic_id = $1 AND partition = $2
    RETURNING high_watermark - $3 AS base_offset, log_start_offset
), appended AS (
    INSERT INTO record_batches ({BATCH_COLUMNS}, untimestamped_appended_ms)
    SELECT $1, $2, base_offset, base_offset + $3 - 1, $4, $5, $6, $7, NULL, $8, $9, $3, $10, $11, $12 FROM head
    RETURNING base_offset, last_offset
)
SELECT appended.base_offset, appended.last_offset, head.log_start_offset,
       pg_notify('{APPENDS_CHANNEL}', $1::text || ':' || $2::text)
FROM appended, head
"""


def untimestamped_appended_ms(append: BatchAppend) -> int | None:
    """What the batch's row keeps as `untimestamped_appended_ms`: its append time when its records
    have no timestamp (all -1, which only a Kafka client sends), which retention and compaction's
    minimum lag then go by (log_cleaner.py); None for any other, and for a batch the server writes itself."""
    return append.appended_ms if append.batch.max_timestamp_ms == NO_TIMESTAMP else None


def check_appendable(append: BatchAppend) -> BrokerError | None:
    """The partition-level checks that need no database, the same for both doors' batches:
    partition exists, records fit, their timestamps are within the topic's bounds, a compacted
    topic's have keys. A refused batch is written nowhere and takes no sequence number."""
    topic = append.topic
    if not 0 <= append.partition < topic.partition_count:
        return unknown_partition(topic, append.partition)
    if append.batch.largest_record_bytes > topic.max_message_bytes:
        return BrokerError(
            ErrorCode.RECORD_TOO_LARGE,
            f"a record of {append.batch.largest_record_bytes} bytes (key, value and headers) was sent "
            f"to {topic.name}-{append.partition}, whose max_message_bytes is {topic.max_message_bytes}: "
            f"send smaller records or create the topic with a larger max_message_bytes",
        )
    if append.appended_ms is not None and (
        refused := marked_log_append_time(append, append.appended_ms)
        or out_of_timestamp_bounds(append, append.appended_ms)
    ):
        return refused
    if append.batch.keyless_records and CLEANUP_COMPACT in topic.cleanup_policy:
        # As Kafka's LogValidator: compaction keeps the latest record per key, and a record without
        # one has nothing to be kept by; the whole batch is refused, its keyless records named.
        keyless = append.batch.keyless_records
        return InvalidRecords(
            keyless,
            f"{topic.name}-{append.partition} is compacted (cleanup_policy {topic.setting('cleanup_policy')}) and "
            f"records {', '.join(map(str, keyless[:10]))}{' ...' if len(keyless) > 10 else ''} of the batch have "
            f"no key: give every record a key, or produce to a topic that is not compacted",
        )
    return None


def marked_log_append_time(append: BatchAppend, now_ms: int) -> InvalidTimestamps | None:
    """The batch refused, as Kafka's LogValidator refuses it, when its producer marked it
    LogAppendTime (a Kafka client's batch) and there is no timestamp of its producer's to keep:
    its topic gives its records the append time, or its max timestamp, which readers give each of
    its records, is -1. In a CreateTime topic one with a max timestamp is bounded as any other."""
    topic, batch = append.topic, append.batch
    if not batch.marked_log_append_time:
        return None
    log_append_time = uses_log_append_time(topic)
    if batch.producer_timestamps is None:
        timestamp = NO_TIMESTAMP
    elif log_append_time:
        timestamp = batch.producer_timestamps[1]
    else:
        return None
    before_ms = topic.setting("message_timestamp_before_max_ms")
    after_ms = topic.setting("message_timestamp_after_max_ms")
    why = "its message_timestamp_type is LogAppendTime" if log_append_time else "its records have no timestamp (-1)"
    return InvalidTimestamps(
        tuple((index, timestamp) for index in range(batch.record_count)),
        now_ms - before_ms,
        now_ms + after_ms,
        f"the batch to {topic.name}-{append.partition} is marked LogAppendTime (its attributes' timestamp "
        f"type), which only the broker sets, and {why}; nothing of the batch was written: produce batches "
        f"marked CreateTime, as Kafka's clients do (the topic's message_timestamp_type decides the timestamps)",
        marked_log_append_time=True,
    )


def out_of_timestamp_bounds(append: BatchAppend, now_ms: int) -> InvalidTimestamps | None:
    """The batch refused, as Kafka's LogValidator refuses it, when its topic keeps its producers'
    timestamps (CreateTime) and a record's is more than message.timestamp.before.max.ms before
    `now_ms`, the server's clock, or more than message.timestamp.after.max.ms after it; None
    otherwise (with LogAppendTime the records take the append time: nothing to bound). Records
    without a timestamp of their producer's are not bounded (EncodedBatch.producer_timestamps)."""
    topic, batch = append.topic, append.batch
    if batch.producer_timestamps is None or uses_log_append_time(topic):
        return None
    before_ms = topic.setting("message_timestamp_before_max_ms")
    after_ms = topic.setting("message_timestamp_after_max_ms")
    earliest_ms, latest_ms = now_ms - before_ms, now_ms + after_ms
    given_earliest, given_latest = batch.producer_timestamps
    if earliest_ms <= given_earliest and given_latest <= latest_ms:
        return None
    # Refused (rarely): which records, read back from the batch. A record the server timestamped
    # (HTTP's without timestamp_ms) is named too if its time fell out of the window while queued.
    refused = tuple(
        (index, timestamp)
        for index, timestamp in enumerate(record_codec.record_timestamps(batch.payload))
        if timestamp is not None and timestamp != NO_TIMESTAMP and not earliest_ms <= timestamp <= latest_ms
    )
    index, timestamp = refused[0]
    if timestamp < earliest_ms:
        key, bound_ms, how_far = "message_timestamp_before_max_ms", before_ms, f"{now_ms - timestamp} ms before"
    else:
        key, bound_ms, how_far = "message_timestamp_after_max_ms", after_ms, f"{timestamp - now_ms} ms after"
    others = ", ".join(str(i) for i, _ in refused[1:11]) + (" ..." if len(refused) > 11 else "")
    also = ""
    if len(refused) == 2:
        also = f"; record {others} is out of bounds too"
    elif len(refused) > 2:
        also = f"; records {others} are out of bounds too"
    return InvalidTimestamps(
        refused,
        earliest_ms,
        latest_ms,
        f"record {index} of the batch to {topic.name}-{append.partition} has timestamp {timestamp}, {how_far} "
        f"the server's clock ({now_ms}), more than the topic's {key} ({bound_ms}) allows (its "
        f"message_timestamp_type is CreateTime){also}; nothing of the batch was written: send records "
        f"timestamped within the topic's bounds (over HTTP, a record without timestamp_ms takes the server's "
        f"clock), or alter its {key} (Kafka's {key.replace('_', '.')})",
    )


async def append_batch(conn: asyncpg.Connection, append: BatchAppend) -> AppendResult | BrokerError:
    """Appends one batch (append_batches); the caller holds a PostgreSQL transaction and orders its
    appends. A batch of a producer (producer_id >= 0) is checked against the producer's sequence
    state first."""
    return (await append_batches(conn, [append]))[0]


async def append_batch_or_raise(conn: asyncpg.Connection, append: BatchAppend) -> AppendResult:
    """append_batch for the coordinator's own batches (its transaction log, its groups' offsets), in
    internal topics that are never deleted: an error is a broken invariant, raised."""
    result = await append_batch(conn, append)
    if isinstance(result, BrokerError):
        raise result
    return result


async def _append_one_plain(conn: asyncpg.Connection, append: BatchAppend) -> AppendResult:
    batch = append.batch
    row = await conn.fetchrow(
        _APPEND_ONE_PLAIN_SQL,
        append.topic.topic_id,
        append.partition,
        batch.record_count,
        append.producer_id,
        append.producer_epoch,
        append.base_sequence,
        append.is_transactional,
        batch.first_timestamp_ms,
        batch.max_timestamp_ms,
        batch.size_bytes,
        batch.payload,
        untimestamped_appended_ms(append),
    )
    if row is None:  # the topic was deleted since it was looked up
        raise unknown_partition(append.topic, append.partition)
    return answered(append, row["base_offset"], row["last_offset"], batch.max_timestamp_ms, row["log_start_offset"])


# Then, with every lock held, a fresh statement (a fresh snapshot) reads the other producers'
# states: nothing else serializes an idempotent producer's appends but the partition's lock, and a
# statement that waited for a row lock re-reads only the locked row, so a producer state joined in
# the locking statement could predate a concurrent append of that producer that committed while we
# waited (a retry racing its original would then be appended twice).
_PRODUCER_STATES_SQL = """
SELECT s.topic_id, s.partition, s.producer_id, s.producer_epoch, s.last_sequence, s.recent_batches,
       s.current_txn_first_offset
FROM producer_states s JOIN unnest($1::int[], $2::int[], $3::bigint[]) AS wanted(topic_id, partition, producer_id)
  ON s.topic_id = wanted.topic_id AND s.partition = wanted.partition AND s.producer_id = wanted.producer_id
"""

# Run with the partitions locked and their heads known: sets each partition's new high watermark
# (`h`, one row per partition), inserts every batch at the offsets computed under the locks (`b`,
# several per partition when several requests append to it together), upserts each producer's
# state after its last batch there (`st`, one row per partition and producer) and notifies long
# polls at commit. One round trip however many batches, partitions and producers (and whatever
# statement the caller fuses after it: fused_writes.py).
_WRITE_APPENDS_QUERIES = f"""h AS (
    SELECT * FROM unnest($1::int[], $2::int[], $3::bigint[]) AS h(topic_id, partition, high_watermark)
), head AS (
    UPDATE partitions p SET high_watermark = h.high_watermark
    FROM h WHERE p.topic_id = h.topic_id AND p.partition = h.partition
), appended AS (
    INSERT INTO record_batches ({BATCH_COLUMNS}, untimestamped_appended_ms)
    SELECT b.topic_id, b.partition, b.base_offset, b.base_offset + b.record_count - 1, b.producer_id,
        b.producer_epoch, b.base_sequence, b.is_transactional, NULL, b.first_timestamp_ms, b.max_timestamp_ms,
        b.record_count, b.size_bytes, b.records, b.untimestamped_appended_ms
    FROM unnest($4::int[], $5::int[], $6::bigint[], $7::int[], $8::bigint[], $9::int[], $10::int[], $11::bool[],
                $12::bigint[], $13::bigint[], $14::int[], $15::bytea[], $25::bigint[])
        AS b(topic_id, partition, base_offset, record_count, producer_id, producer_epoch, base_sequence,
             is_transactional, first_timestamp_ms, max_timestamp_ms, size_bytes, records, untimestamped_appended_ms)
), state AS (
    INSERT INTO producer_states (topic_id, partition, producer_id, producer_epoch, last_sequence,
        last_timestamp_ms, last_append_ms, recent_batches, current_txn_first_offset)
    SELECT st.topic_id, st.partition, st.producer_id, st.producer_epoch, st.last_sequence, st.last_timestamp_ms,
        $24, st.recent_batches::jsonb, st.current_txn_first_offset
    FROM unnest($16::int[], $17::int[], $18::bigint[], $19::int[], $20::int[], $21::bigint[], $22::text[],
                $23::bigint[])
        AS st(topic_id, partition, producer_id, producer_epoch, last_sequence, last_timestamp_ms, recent_batches,
              current_txn_first_offset)
    ON CONFLICT (topic_id, partition, producer_id) DO UPDATE SET producer_epoch = EXCLUDED.producer_epoch,
        last_sequence = EXCLUDED.last_sequence, last_timestamp_ms = EXCLUDED.last_timestamp_ms,
        last_append_ms = EXCLUDED.last_append_ms, recent_batches = EXCLUDED.recent_batches,
        current_txn_first_offset = EXCLUDED.current_txn_first_offset
)"""

_WRITE_APPENDS_FINAL = f"SELECT pg_notify('{APPENDS_CHANNEL}', h.topic_id::text || ':' || h.partition::text) FROM h"


@dataclass(frozen=True, slots=True)
class _CheckedAppend:
    """A producer's batch that passed its sequence check, with where it goes and the producer's state after it."""

    append: BatchAppend
    base_offset: int
    state: sequences.ProducerEntry


async def _check_at_head(
    conn: asyncpg.Connection, append: BatchAppend, entry: sequences.ProducerEntry | None, head: int, log_start: int
) -> _CheckedAppend | AppendResult | BrokerError:
    """The producer's batch checked against its state: a duplicate's original offsets, an error, or
    the batch to write. `entry` is the producer's state on the partition and `head` its high
    watermark, as read under the partition's lock and advanced by the batches appended before this
    one in the same PostgreSQL transaction; `log_start` its log start offset, read under that lock."""
    topic, batch = append.topic, append.batch
    if append.origin is AppendOrigin.COORDINATOR:
        return _CheckedAppend(append, head, sequences.coordinator_batch(entry, append.producer_epoch, head))
    if entry is None and append.base_sequence != 0 and not append.stateless_takes_any_sequence:
        state_gone = await _state_gone(conn, append)
        if state_gone is not None:
            return state_gone
    outcome = sequences.check_batch(
        entry,
        append.producer_id,
        append.producer_epoch,
        append.base_sequence,
        batch.record_count,
        append.is_transactional,
        f"{topic.name}-{append.partition}",
        stateless_takes_any_sequence=append.stateless_takes_any_sequence,
    )
    if isinstance(outcome, BrokerError):
        return outcome
    if isinstance(outcome, sequences.Duplicate):
        return answered(
            append, outcome.base_offset, outcome.last_offset, outcome.max_timestamp_ms, log_start, duplicate=True
        )
    base_offset = head
    updated = sequences.remember(
        entry,
        append.producer_epoch,
        append.base_sequence,
        outcome.last_sequence,
        base_offset,
        base_offset + batch.record_count - 1,
        batch.max_timestamp_ms,
        append.is_transactional,
    )
    return _CheckedAppend(append, base_offset, updated)


@dataclass(frozen=True, slots=True)
class _Write:
    """A batch to write at `base_offset`; `state` is its producer's state after it (None for a plain batch)."""

    append: BatchAppend
    base_offset: int
    state: sequences.ProducerEntry | None = None


def _recent_batches_json(state: sequences.ProducerEntry) -> str:
    return orjson.dumps(
        [
            [r.base_sequence, r.last_sequence, r.base_offset, r.last_offset, r.max_timestamp_ms]
            for r in state.recent_batches
        ]
    ).decode()


def _write_appends(writes: list[_Write], heads: dict[tuple[int, int], int]) -> WriteStatement:
    """The statement that writes checked batches (in the order they were given offsets) to their
    locked partitions, with each partition's new head and each producer's last state there."""
    touched = list(dict.fromkeys((w.append.topic.topic_id, w.append.partition) for w in writes))
    last_state: dict[tuple[int, int, int], _Write] = {}
    for write in writes:
        if write.state is not None:  # a later batch of the same producer and partition replaces it
            last_state[(write.append.topic.topic_id, write.append.partition, write.append.producer_id)] = write
    states = list(last_state.values())
    appends = [w.append for w in writes]
    args = (
        [topic_id for topic_id, _ in touched],
        [partition for _, partition in touched],
        [heads[key] for key in touched],
        [a.topic.topic_id for a in appends],
        [a.partition for a in appends],
        [w.base_offset for w in writes],
        [a.batch.record_count for a in appends],
        [a.producer_id for a in appends],
        [a.producer_epoch for a in appends],
        [a.base_sequence for a in appends],
        [a.is_transactional for a in appends],
        [a.batch.first_timestamp_ms for a in appends],
        [a.batch.max_timestamp_ms for a in appends],
        [a.batch.size_bytes for a in appends],
        [a.batch.payload for a in appends],
        [w.append.topic.topic_id for w in states],
        [w.append.partition for w in states],
        [w.append.producer_id for w in states],
        [w.state.producer_epoch for w in states],
        [w.state.last_sequence for w in states],
        [w.append.batch.max_timestamp_ms for w in states],
        [_recent_batches_json(w.state) for w in states],
        [w.state.current_txn_first_offset for w in states],
        now_ms(),
        [untimestamped_appended_ms(a) for a in appends],
    )
    return WriteStatement(_WRITE_APPENDS_QUERIES, _WRITE_APPENDS_FINAL, args)


# When the producer id was issued (NULL: it is gone) and when the partition's topic was created, in
# the same clock (milliseconds since the epoch).
_ISSUED_AND_CREATED_SQL = """
SELECT (SELECT issued_ms FROM producer_ids WHERE producer_id = $1) AS issued_ms,
       (SELECT (extract(epoch FROM created_at) * 1000)::bigint FROM topics WHERE topic_id = $2) AS created_ms
"""


async def _state_gone(conn: asyncpg.Connection, append: BatchAppend) -> BrokerError | None:
    """For a producer with no state on the partition that sends a sequence above 0: UNKNOWN_PRODUCER_ID
    when its state here may have gone (the error the producer recovers from with a new id, as the
    contract answers a producer whose state went), rather than a gap in a partition it never wrote
    to (OUT_OF_ORDER_SEQUENCE_NUMBER, fatal to an idempotent producer); None otherwise."""
    row = await conn.fetchrow(_ISSUED_AND_CREATED_SQL, append.producer_id, append.topic.topic_id)
    if row["issued_ms"] is None:
        # Its state and its id expired together (it was idle everywhere) between the request's
        # check of the id and this lock: answered as that check would answer now. (Expiry deletes
        # an idempotent producer's state only once its id is gone, producer_ids.py, so once the
        # state is seen gone, a gone id is seen too.)
        return BrokerError(
            ErrorCode.UNKNOWN_PRODUCER_ID,
            f"producer id {append.producer_id} has expired (it wrote nowhere for the server's "
            f"producer_id_expiration_ms): get a new one from POST /v1/producers/init",
        )
    if not append.is_transactional and row["created_ms"] >= row["issued_ms"]:
        # The topic was created since the id was issued: the producer may have written to a topic
        # of this name deleted since, whose producer states went with it (Kafka's leaders, which
        # keep no state of a new partition's producers, take it at any sequence there).
        return BrokerError(
            ErrorCode.UNKNOWN_PRODUCER_ID,
            f"producer id {append.producer_id} has no state on {append.topic.name}-{append.partition} and sent "
            f"sequence {append.base_sequence}: the topic was created after the id was issued, so its state may "
            f"have gone with a topic of this name deleted since; get a new id from POST /v1/producers/init",
        )
    return None


async def append_for_coordinator(
    conn: asyncpg.Connection,
    topic: TopicInfo,
    partition: int,
    batch: EncodedBatch,
    producer_id: int,
    producer_epoch: int,
) -> AppendResult:
    """Appends a batch of the transaction of (producer_id, producer_epoch) written by the coordinator
    itself (AppendOrigin.COORDINATOR); the caller holds the PostgreSQL transaction and, since an
    earlier statement, the transactional id's row (append_batches' contract)."""
    return await append_batch_or_raise(
        conn,
        BatchAppend(topic, partition, batch, producer_id, producer_epoch, NO_SEQUENCE, True, AppendOrigin.COORDINATOR),
    )


@dataclass(slots=True)
class AppendPlan:
    """Appends checked against their locked partitions (`plan_appends`): each one's partition-level
    error or duplicate's answer, and the statement that writes the others (None if none is to be
    written). `results()` once that statement ran."""

    _results: list[AppendResult | BrokerError | None]
    _writes: dict[int, _Write]
    _log_starts: dict[tuple[int, int], int]  # each written partition's, read under its lock
    statement: WriteStatement | None

    @property
    def written_partitions(self) -> set[tuple[int, int]]:
        return {(w.append.topic.topic_id, w.append.partition) for w in self._writes.values()}

    def results(self) -> list[AppendResult | BrokerError]:
        results = list(self._results)
        for index, write in self._writes.items():
            batch = write.append.batch
            key = (write.append.topic.topic_id, write.append.partition)
            results[index] = answered(
                write.append,
                write.base_offset,
                write.base_offset + batch.record_count - 1,
                batch.max_timestamp_ms,
                self._log_starts[key],
            )
        return results


def locks_for_appends(appends: list[BatchAppend]) -> PartitionLocks:
    """What plan_appends needs locked: the appends' partitions and their transactional producers' states."""
    appendable = [a for a in appends if check_appendable(a) is None]
    return PartitionLocks(
        frozenset((a.topic.topic_id, a.partition) for a in appendable),
        frozenset((a.topic.topic_id, a.partition, a.producer_id) for a in appendable if a.is_transactional),
    )


async def plan_appends(conn: asyncpg.Connection, appends: list[BatchAppend], locked: LockedPartitions) -> AppendPlan:
    """Checks the appends in the given order, as if appended one after the other, against their
    partitions locked by lock_partitions (`locks_for_appends` or more), and advances `locked` past
    them. Reads the states of idempotent producers among them (a statement of its own, now that the
    locks are held)."""
    results: list[AppendResult | BrokerError | None] = [check_appendable(append) for append in appends]
    heads, entries = locked.heads, locked.states
    producers = sorted(
        {
            (a.topic.topic_id, a.partition, a.producer_id)
            for a, result in zip(appends, results)
            if result is None
            and a.producer_id != NO_PRODUCER_ID
            and not a.is_transactional
            and (a.topic.topic_id, a.partition) in heads
        }
    )
    if producers:
        rows = await conn.fetch(
            _PRODUCER_STATES_SQL, [k[0] for k in producers], [k[1] for k in producers], [k[2] for k in producers]
        )
        entries.update(
            {(row["topic_id"], row["partition"], row["producer_id"]): producer_entry_from_row(row) for row in rows}
        )
    writes: dict[int, _Write] = {}
    for index, append in enumerate(appends):
        if results[index] is not None:
            continue
        key = (append.topic.topic_id, append.partition)
        head = heads.get(key)
        if head is None:  # its topic was deleted since it was looked up
            results[index] = unknown_partition(append.topic, append.partition)
            continue
        if append.producer_id == NO_PRODUCER_ID:
            writes[index] = _Write(append, head)
        else:
            producer_key = (*key, append.producer_id)
            try:
                outcome = await _check_at_head(conn, append, entries.get(producer_key), head, locked.log_starts[key])
            except BrokerError as error:
                results[index] = error
                continue
            if not isinstance(outcome, _CheckedAppend):
                results[index] = outcome
                continue
            entries[producer_key] = outcome.state
            writes[index] = _Write(append, head, outcome.state)
        heads[key] = head + append.batch.record_count
    statement = _write_appends(list(writes.values()), heads) if writes else None
    return AppendPlan(results, writes, locked.log_starts, statement)


async def append_batches(
    conn: asyncpg.Connection, appends: list[BatchAppend], then: WriteStatement | None = None
) -> list[AppendResult | BrokerError]:
    """Appends batches of any producers (plain ones included), several to one partition if need be:
    each entry's result or partition-level error, in the given order, as if appended one after the
    other. The caller holds the PostgreSQL transaction, so nothing is visible before all are durable,
    and, for every transactional append, has held its transactional id's row (TransactionLog.lock,
    lock_many_and_find_topics) since an earlier statement (see _LOCK_HEADS_SQL). Two statements whatever their
    number: lock every partition (lock_order) and read its head and the transactional producers'
    states there, write everything; a third reads the states of idempotent producers, if any, once
    the locks are held. `then`: a statement of the caller's to run last, fused with the write (or
    alone when nothing is written)."""
    if then is None and len(appends) == 1 and appends[0].producer_id == NO_PRODUCER_ID:
        # A lone plain batch (a plain produce of one partition, a transaction log's first record)
        # skips the lock statement: one round trip instead of two, which bench.partition_log and
        # bench.produce_ceiling (their produce rows, producer -1) measure. It writes what
        # _write_appends would, at the head the same lock gives it.
        if (refused := check_appendable(appends[0])) is not None:
            return [refused]
        try:  # one statement locks, reads and bumps the head (and may run without a transaction)
            return [await _append_one_plain(conn, appends[0])]
        except BrokerError as error:
            return [error]
    plan = await plan_appends(conn, appends, await lock_partitions(conn, locks_for_appends(appends)))
    await execute_fused(conn, plan.statement, then)
    return plan.results()
