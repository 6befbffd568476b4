"""Fetch: reads several partitions at once, long-polling until a record arrives or time is up; what
it answers the synchronous standby has (replication_barrier.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg

from app.errors import BrokerError, ErrorCode
from app.storage.log import partition_log
from app.storage.log.append_notifier import AppendNotifier
from app.storage.log.partition_log import PartitionState
from app.storage.log.topics import TopicInfo, unknown_topic
from app.storage.replication_barrier import ReplicationBarrier


@dataclass(frozen=True, slots=True)
class FetchPosition:
    topic: str
    partition: int
    offset: int


@dataclass(slots=True)
class PartitionFetch:
    position: FetchPosition
    error: BrokerError | None = None
    state: PartitionState | None = None
    next_offset: int = 0
    records: list[dict] | None = None

    def leave_out_unconfirmed(self) -> None:
        """Answers nothing past the position (ReplicationBarrier.answer): no records, the watermarks
        of a reader caught up; an error stays."""
        if self.error is None and self.state is not None:
            self.records = []
            self.next_offset = self.position.offset
            self.state = self.state.no_further_than(self.position.offset)


async def _read_all(
    pool: asyncpg.Pool,
    positions: list[FetchPosition],
    topics: dict[str, TopicInfo] | None,
    max_records: int,
    isolation_level: str,
    encoding: str,
    max_bytes: int,
) -> tuple[list[PartitionFetch], dict[str, TopicInfo]]:
    """Reads every position; `topics` None: looks them up first, with the partitions' states, in one
    statement. `max_records` and `max_bytes` are shared by the positions in order, as Kafka's fetch
    shares fetch.max.bytes: the first batch read is answered whatever its size (KIP-74)."""
    results = []
    budget = max_records
    bytes_left = max_bytes
    # No transaction: the states come in one statement, and each page of a partition's batches is
    # one statement that is right on its own (partition_log._PAGE_SQL); a fetch is then two round
    # trips where BEGIN and COMMIT made it four.
    async with pool.acquire() as conn:
        states = {}
        if topics is None:
            topics, states = await partition_log.topics_and_states(conn, [(p.topic, p.partition) for p in positions])
        for position in positions:
            topic = topics.get(position.topic)
            if topic is None:
                results.append(PartitionFetch(position, error=unknown_topic(position.topic)))
                continue
            try:
                read = await partition_log.read(
                    conn,
                    topic,
                    position.partition,
                    position.offset,
                    budget,
                    isolation_level,
                    encoding,
                    states.get((position.topic, position.partition)),
                    max_bytes=bytes_left,
                    at_least_one_batch=bytes_left == max_bytes,
                )
            except BrokerError as error:
                state = None
                if error.code == ErrorCode.OFFSET_OUT_OF_RANGE:  # the watermarks say where to reset
                    state = await partition_log.partition_state(conn, topic, position.partition)
                results.append(PartitionFetch(position, error=error, state=state))
                continue
            budget -= len(read.records)
            bytes_left -= read.size_bytes
            results.append(
                PartitionFetch(position, state=read.state, next_offset=read.next_offset, records=read.records)
            )
    return results, topics


async def fetch(
    pool: asyncpg.Pool,
    notifier: AppendNotifier,
    barrier: ReplicationBarrier,
    positions: list[FetchPosition],
    isolation_level: str,
    max_records: int,
    max_wait_ms: int,
    encoding: str,
    max_bytes: int = partition_log.MAX_READ_BYTES,
) -> list[PartitionFetch]:
    """Returns as soon as any partition has records or an error, else after max_wait_ms; with a
    synchronous standby, once it has what is answered (ReplicationBarrier.answer). `max_bytes`: the
    stored bytes of batches the answer may come from (its first batch whatever its size)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    # The usual fetch finds records at once: the topics are looked up in its read's snapshot, one
    # acquire and round trip fewer. Only a fetch that will wait watches for appends, and reads again
    # once watching, so that an append between the two reads is not missed.
    results, topics = await _read_all(pool, positions, None, max_records, isolation_level, encoding, max_bytes)
    if max_wait_ms <= 0 or any(r.error is not None or r.records for r in results):
        return await barrier.answer(results, deadline)
    watched = [(topics[p.topic].topic_id, p.partition) for p in positions if p.topic in topics]
    with notifier.watching(watched) as appended:
        while True:
            appended.clear()
            results, _ = await _read_all(pool, positions, topics, max_records, isolation_level, encoding, max_bytes)
            remaining = deadline - loop.time()
            if remaining <= 0 or any(r.error is not None or r.records for r in results):
                return await barrier.answer(results, deadline)
            try:
                await asyncio.wait_for(appended.wait(), min(remaining, notifier.fallback_s))
            except TimeoutError:
                pass
