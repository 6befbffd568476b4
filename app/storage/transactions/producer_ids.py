"""Producer ids and epochs (InitProducerId's allocation side).

Ids come from the PostgreSQL sequence `producer_id_seq`, so they are unique across restarts and
across server processes; every id issued is recorded with the latest epoch issued for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from app.storage.rows import all_from_rows, count_rows

# Kafka rolls over to a new producer id rather than let an epoch reach Short.MaxValue, so that the
# bumped epoch of a fencing abort always fits.
MAX_EPOCH = 32_766


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    producer_epoch: int


async def issue(
    conn: asyncpg.Connection, now_ms: int, transactional_id: str | None = None, *, principal: str | None = None
) -> ProducerIdAndEpoch:
    """A new producer id at epoch 0; `principal`: the owner of an idempotent one (ProducerIdRecord)."""
    producer_id = await conn.fetchval(
        "INSERT INTO producer_ids (producer_id, producer_epoch, transactional_id, issued_ms, principal) "
        "VALUES (nextval('producer_id_seq'), 0, $1, $2, $3) RETURNING producer_id",
        transactional_id,
        now_ms,
        principal,
    )
    return ProducerIdAndEpoch(producer_id, 0)


async def bump(
    conn: asyncpg.Connection,
    current: ProducerIdAndEpoch,
    now_ms: int,
    transactional_id: str | None = None,
    *,
    principal: str | None = None,
) -> ProducerIdAndEpoch:
    """The next epoch of this producer, or a new producer id at epoch 0 once epochs are exhausted
    (with the same transactional id, or owner: `principal`)."""
    if current.producer_epoch >= MAX_EPOCH:
        return await issue(conn, now_ms, transactional_id, principal=principal)
    await conn.execute(
        "UPDATE producer_ids SET producer_epoch = $2 WHERE producer_id = $1",
        current.producer_id,
        current.producer_epoch + 1,
    )
    return ProducerIdAndEpoch(current.producer_id, current.producer_epoch + 1)


def next_epoch(current: ProducerIdAndEpoch) -> ProducerIdAndEpoch | None:
    """`bump`'s answer without its write, or None once epochs are exhausted (then `bump` issues a new
    id). For a transactional id's producer only: TransactionLog.save records the epoch of the id's
    row here, in the PostgreSQL transaction that saves it."""
    if current.producer_epoch >= MAX_EPOCH:
        return None
    return ProducerIdAndEpoch(current.producer_id, current.producer_epoch + 1)


@dataclass(frozen=True, slots=True)
class IssuedProducer:
    producer_epoch: int  # the latest epoch issued
    transactional_id: str | None
    principal: str | None = None  # an idempotent producer id's owner (ProducerIdRecord)


async def lookup(conn: asyncpg.Connection, producer_id: int) -> IssuedProducer | None:
    """What was issued for this id, or None if it was never issued (or expired)."""
    return (await lookup_many(conn, [producer_id])).get(producer_id)


async def lookup_many(conn: asyncpg.Connection, producer_ids: list[int]) -> dict[int, IssuedProducer]:
    """`lookup` for several ids in one statement; ids never issued (or expired) are left out."""
    rows = await conn.fetch(
        "SELECT producer_id, producer_epoch, transactional_id, principal FROM producer_ids "
        "WHERE producer_id = ANY($1::bigint[])",
        sorted(set(producer_ids)),
    )
    return {
        row["producer_id"]: IssuedProducer(row["producer_epoch"], row["transactional_id"], row["principal"])
        for row in rows
    }


async def take_up_expired(
    conn: asyncpg.Connection, producers: dict[int, int], now_ms: int, principal: str | None
) -> dict[int, IssuedProducer]:
    """Records again, at the epoch given (`producers`: id → epoch), the ids among `producers` that
    were issued once and have expired since, as idempotent ones owned by `principal`: Kafka's
    leaders keep no list of issued ids, and Kafka's clients go on writing with an id whose state
    expired (ProduceCommand.takes_expired_producers). Ids never issued stay unknown: an id above
    the sequence's last value is one it will issue to another producer. Returns what is now
    recorded for each id taken up (also by a concurrent request that recorded it first)."""
    if not producers:
        return {}
    ids = sorted(producers)
    await conn.execute(
        "INSERT INTO producer_ids (producer_id, producer_epoch, transactional_id, issued_ms, principal) "
        "SELECT expired.producer_id, expired.producer_epoch, NULL, $3, $4 "
        "FROM unnest($1::bigint[], $2::smallint[]) AS expired(producer_id, producer_epoch) "
        "WHERE expired.producer_id >= 0 "
        "  AND expired.producer_id <= (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END "
        "                              FROM producer_id_seq) "
        "ON CONFLICT (producer_id) DO NOTHING",
        ids,
        [producers[i] for i in ids],
        now_ms,
        principal,
    )
    return await lookup_many(conn, ids)


async def highest_epoch_written(conn: asyncpg.Connection, producer_id: int) -> int | None:
    """The highest epoch this producer's state holds on any partition (an idempotent producer may
    start an epoch above the one issued itself, as Kafka's leaders let it), or None where it has none."""
    return await conn.fetchval("SELECT max(producer_epoch) FROM producer_states WHERE producer_id = $1", producer_id)


# Expiry, run as one PostgreSQL transaction at READ COMMITTED (`expire`). Each statement's WHERE
# is judged on the statement's snapshot, but when a row it is about to delete was changed by a
# transaction that committed meanwhile, PostgreSQL re-checks only that row's new version against the
# conditions on its own columns (EvalPlanQual): what a subquery said of other rows is not looked at
# again. So every condition below that reads another row must stay true once true (and it is said
# why), and whatever a concurrent append can change is a condition on the deleted row itself.
#
# An idempotent producer is idle when it has appended nowhere since the cutoff $1 (by the server's
# clock, `last_append_ms`). Its id goes as a whole: a producer that still writes one partition keeps
# its state on the others, however long they idle, so its next batch there continues its sequence
# (Kafka expires per partition, and then has to accept any sequence from a producer it no longer
# knows there). An append that commits after this statement's snapshot is not seen (appends never
# change an id's row; a KIP-360 epoch bump does, but not the columns re-checked here): its producer
# is told UNKNOWN_PRODUCER_ID at its next request (the id went), which it recovers from with a new
# id, and what was acknowledged stays. Never OUT_OF_ORDER_SEQUENCE_NUMBER: see the states below.
_EXPIRE_IDLE_IDS_SQL = """
DELETE FROM producer_ids i WHERE i.transactional_id IS NULL AND i.issued_ms < $1
  AND NOT EXISTS (SELECT 1 FROM producer_states busy WHERE busy.producer_id = i.producer_id
                  AND (busy.last_append_ms >= $1 OR busy.current_txn_first_offset IS NOT NULL))
"""
# A state row goes when it is idle itself (no append since the cutoff, no transaction open there:
# its own columns, which an append racing this statement sets, and which are re-checked on the
# version that append committed, so an Ongoing transaction's row, which pins the LSO, never goes)
# and its producer is not a live idempotent one: its id is transactional, or gone (an idempotent
# producer's state goes only after its id, so a produce that finds its state gone finds its id gone
# too, and is told UNKNOWN_PRODUCER_ID, never OUT_OF_ORDER_SEQUENCE_NUMBER). That condition on
# another table holds forever once it holds: ids come from a sequence and are never issued again
# once gone, and an id's transactional_id never changes. A transactional producer's state goes row
# by row, as in Kafka: its next batch where its state went is taken at any sequence (with transaction
# version 1 its sequences carry over from one transaction to the next; sequences.check_batch).
_EXPIRE_IDLE_STATES_SQL = """
DELETE FROM producer_states s
WHERE s.last_append_ms < $1 AND s.current_txn_first_offset IS NULL
  AND NOT EXISTS (SELECT 1 FROM producer_ids i WHERE i.producer_id = s.producer_id AND i.transactional_id IS NULL)
"""
# A producer id issued for a transactional id that no longer uses it: the id expired, or moved on to
# a new producer id when its epochs ran out. One its transactional id may still answer for (the
# current one, the last transaction's, the open transaction's) or with state left on a partition
# stays. Both subqueries stay true once true: a transactional id never goes back to a producer id
# it left (a new one is issued), and only a producer its transactional id uses writes state.
_EXPIRE_DEAD_TRANSACTIONAL_SQL = """
DELETE FROM producer_ids i WHERE i.transactional_id IS NOT NULL AND i.issued_ms < $1
  AND NOT EXISTS (SELECT 1 FROM transactions t WHERE t.transactional_id = i.transactional_id
                  AND i.producer_id IN (t.producer_id, t.last_producer_id, t.txn_producer_id))
  AND NOT EXISTS (SELECT 1 FROM producer_states s WHERE s.producer_id = i.producer_id)
"""


async def expire(conn: asyncpg.Connection, older_than_ms: int) -> int:
    """Forgets, in one PostgreSQL transaction, the ids of idempotent producers idle since
    `older_than_ms` (issued before it), then the idle state rows (see above), then the producer
    ids transactional ids no longer use. Ids first: the states statement then sees the ids gone.
    Returns how many rows went."""
    async with conn.transaction():
        ids = count_rows(await conn.execute(_EXPIRE_IDLE_IDS_SQL, older_than_ms))
        states = count_rows(await conn.execute(_EXPIRE_IDLE_STATES_SQL, older_than_ms))
        ids += count_rows(await conn.execute(_EXPIRE_DEAD_TRANSACTIONAL_SQL, older_than_ms))
    return ids + states


@dataclass(frozen=True, slots=True)
class PartitionProducer:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    current_txn_start_offset: int | None


async def describe_partition_producers(
    conn: asyncpg.Connection, topic_id: int, partition: int, limit: int = 1000
) -> list[PartitionProducer]:
    """DescribeProducers: the producers with state on one partition."""
    rows = await conn.fetch(
        "SELECT producer_id, producer_epoch, last_sequence, last_timestamp_ms, "
        "       current_txn_first_offset AS current_txn_start_offset "
        "FROM producer_states WHERE topic_id = $1 AND partition = $2 ORDER BY producer_id LIMIT $3",
        topic_id,
        partition,
        limit,
    )
    return all_from_rows(PartitionProducer, rows)
