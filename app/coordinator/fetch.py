"""Fetch and ListOffsets: reading the log. `fetch` reads several partitions' records at once,
long-polling (through the AppendNotifier every front door shares) until a record arrives or time is
up; `fetch_batches` reads whole stored batches, for a door that answers batches rather than
records, long-polling until enough bytes are read, and reads a connection's next request ahead while
its consumer is behind (`ReadAhead`); `find_offsets` (ListOffsets) answers latest, earliest, or the
first offset at or after a time, per partition. With a synchronous standby, each answers only what
the standby has (`ReplicationBarrier`, docs/operations-high-availability.md#what-readers-see)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg

from app.errors import BrokerError, ErrorCode
from app.storage.log import batch_form, partition_log
from app.storage.log.append_notifier import AppendNotifier
from app.storage.log.batch_reads import StoredBatch, read_batches
from app.storage.log.fetching import FetchPosition, PartitionFetch, fetch
from app.storage.log.partition_log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    NO_OFFSET,
    NO_TIMESTAMP,
    PartitionState,
)
from app.storage.log.topics import TopicInfo, find_topics, unknown_partition, unknown_topic, unknown_topic_id
from app.storage.replication_barrier import READ_WAIT_MIN_S, ReplicationBarrier
from txbroker.wire import READ_COMMITTED, READ_UNCOMMITTED

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "NO_OFFSET",
    "NO_TIMESTAMP",
    "AppendNotifier",
    "BatchFetchPosition",
    "FetchPosition",
    "FetchedBatches",
    "OffsetFound",
    "PartitionFetch",
    "ReadAhead",
    "StoredBatch",
    "fetch",
    "fetch_batches",
    "find_offsets",
]

log = logging.getLogger("txbroker.fetch")

# The most batches one partition's fetch reads in one statement (within the bytes asked for).
MAX_BATCHES_PER_READ = 200
# How long a read made ahead is held for a fetch to take it: a consumer that is behind asks again as
# soon as it has parsed the answer before, far sooner (docs/kafka.md, "Fetch read-ahead"); one that
# comes later is read afresh, so no answer is older than this, and no memory is held longer.
READ_AHEAD_MAX_AGE_S = 0.5
# A connection whose reads ahead went unused this many times in a row (its client's next request is
# never the one read: Java's consumer, and kafka-python's, fetch only the partitions they have drained)
# stops reading ahead for READ_AHEAD_PAUSE_FETCHES answers, then tries again.
READ_AHEAD_MISSES_BEFORE_PAUSE = 2
READ_AHEAD_PAUSE_FETCHES = 100


@dataclass(frozen=True, slots=True)
class OffsetFound:
    """ListOffsets' answer for one partition: the offset and its record's timestamp (-1 when there
    is none), or why the partition could not be read."""

    topic: str
    partition: int
    offset: int = NO_OFFSET
    timestamp_ms: int = NO_TIMESTAMP
    error: BrokerError | None = None


async def find_offsets(
    pool: asyncpg.Pool, barrier: ReplicationBarrier, requested: list[tuple[str, int, int]], isolation_level: str
) -> list[OffsetFound]:
    """For each (topic, partition, timestamp): latest (-1: the high watermark, or the last stable
    offset under read_committed), earliest (-2), or the first offset whose timestamp is at or
    after a time. An offset the synchronous standby does not confirm within READ_WAIT_MIN_S is
    OFFSET_NOT_AVAILABLE (retriable, Kafka's answer for a high watermark not known yet)."""
    answers = []
    async with pool.acquire() as conn:
        topics = await find_topics(conn, sorted({topic for topic, _, _ in requested}))
        for topic_name, partition, timestamp in requested:
            try:
                topic = topics.get(topic_name)
                if topic is None:
                    raise unknown_topic(topic_name)
                offset, timestamp_ms = await partition_log.offset_for(
                    conn, topic, partition, timestamp, isolation_level
                )
                answers.append(OffsetFound(topic_name, partition, offset, timestamp_ms))
            except BrokerError as error:
                answers.append(OffsetFound(topic_name, partition, error=error))
    if await barrier.confirm(READ_WAIT_MIN_S):
        return answers
    return [
        answer
        if answer.error is not None
        else OffsetFound(
            answer.topic,
            answer.partition,
            error=BrokerError(
                ErrorCode.OFFSET_NOT_AVAILABLE,
                f"the offset of {answer.topic}-{answer.partition} is not confirmed by the database's "
                f"synchronous standby after {READ_WAIT_MIN_S:g} s (it is away or slow): retry",
            ),
        )
        for answer in answers
    ]


@dataclass(frozen=True, slots=True)
class BatchFetchPosition:
    topic: str
    partition: int
    offset: int
    max_bytes: int
    # Kafka's Fetch v13+ names topics by id: then only the topic of that id is read, so a topic
    # deleted and re-created under the name since the caller resolved the id is UNKNOWN_TOPIC_ID.
    topic_uuid: uuid.UUID | None = None


@dataclass(slots=True)
class FetchedBatches:
    """One partition's answer to fetch_batches: its batches from the offset asked, or why none."""

    position: BatchFetchPosition
    error: BrokerError | None = None
    state: PartitionState | None = None
    batches: list[StoredBatch] = field(default_factory=list)
    # The codec its topic's batches are sent in (compression.type; the producer's own: none).
    codec: batch_form.TopicCodec = batch_form.PRODUCERS_CODEC

    def in_topic_codec(self, rendered: bytes) -> bytes:
        """A batch the door rendered from the JSON form (uncompressed) in the codec its topic sends,
        so that every data batch of a topic with a codec comes in it, whichever door produced it."""
        # Uncompressed, it is never decompressed: its own length bounds its records.
        return batch_form.in_codec(rendered, self.codec, len(rendered))

    @property
    def size(self) -> int:
        """What the answer carries toward min_bytes and max_bytes: every batch, a marker's control
        batch too (Kafka counts the bytes read, so a fetch whose only batch is a marker is answered at
        once, and a marker takes its share of the bytes a fetch may answer)."""
        return sum(batch.size_bytes for batch in self.batches)

    def leave_out_unconfirmed(self) -> None:
        """Answers nothing past the position (ReplicationBarrier.answer): no batches, the watermarks
        of a reader caught up; an error stays."""
        if self.error is None and self.state is not None:
            self.batches = []
            self.state = self.state.no_further_than(self.position.offset)


async def fetch_batches(
    pool: asyncpg.Pool,
    notifier: AppendNotifier,
    barrier: ReplicationBarrier,
    positions: list[BatchFetchPosition],
    refused: dict[str, BrokerError | None],
    read_committed: bool,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    read_ahead: ReadAhead | None = None,
) -> list[FetchedBatches]:
    """Whole stored batches of each position, at most max_bytes in all (and each position's own
    max_bytes), the first batch always (a reader must make progress whatever the sizes). Returns
    once the batches read reach min_bytes (or any partition has an error), else once max_wait_ms
    has passed, re-reading whenever one of the partitions gets an append. `refused`: the error of
    each topic the caller may not read (None for the others); its positions are answered with it,
    not read. `read_ahead`: the connection's, when the door has one: the first read may come from
    it, and an answer that leaves the reader behind starts the next one. With a synchronous standby
    the answer waits for it to have what was read (ReplicationBarrier.answer: the batches read ahead
    too, since their partitions' states were read again after them; the next read ahead, started
    before, overlaps the wait)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    request = _ReadRequest(tuple(positions), read_committed, max_bytes)
    # Only for a reader of every topic asked: a refusal is answered from this request's authorization.
    read_earlier = (
        await read_ahead.take(pool, request) if read_ahead is not None and not any(refused.values()) else None
    )
    results, found = read_earlier or await _read_batches(pool, positions, refused, read_committed, max_bytes)

    def done() -> bool:
        return (
            loop.time() >= deadline
            or any(r.error is not None for r in results)
            or sum(r.size for r in results) >= max(min_bytes, 1)
        )

    if done():
        if read_ahead is not None:
            # Counted here, not when taken: one short of min_bytes is answered from the wait's reads.
            if read_earlier is not None:
                read_ahead.answered()
            read_ahead.start_after(pool, request, refused, results)
        return await barrier.answer(results, deadline)
    watched = [(found[p.topic].topic_id, p.partition) for p in positions if p.topic in found]
    with notifier.watching(watched) as appended:
        while True:
            appended.clear()
            results, _ = await _read_batches(pool, positions, refused, read_committed, max_bytes)
            if done():
                if read_ahead is not None:
                    read_ahead.start_after(pool, request, refused, results)
                return await barrier.answer(results, deadline)
            try:
                await asyncio.wait_for(appended.wait(), min(deadline - loop.time(), notifier.fallback_s))
            except TimeoutError:
                pass


async def _read_batches(
    pool: asyncpg.Pool,
    positions: list[BatchFetchPosition],
    refused: dict[str, BrokerError | None],
    read_committed: bool,
    max_bytes: int,
) -> tuple[list[FetchedBatches], dict[str, TopicInfo]]:
    results = []
    budget = max_bytes
    async with pool.acquire() as conn:
        found, states = await partition_log.topics_and_states(conn, [(p.topic, p.partition) for p in positions])
        for position in positions:
            result = FetchedBatches(position, error=refused[position.topic])
            results.append(result)
            topic = found.get(position.topic)
            if result.error is not None:
                continue
            if position.topic_uuid is not None and (topic is None or topic.topic_uuid != position.topic_uuid):
                result.error = unknown_topic_id(position.topic_uuid)
                continue
            if topic is None:
                result.error = unknown_topic(position.topic)
                continue
            state = states.get((position.topic, position.partition))
            if state is None:
                result.error = unknown_partition(topic, position.partition)
                continue
            result.state = state
            result.codec = batch_form.topic_codec(topic)
            if not state.log_start_offset <= position.offset <= state.high_watermark:
                result.error = BrokerError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {position.offset} is outside {topic.name}-{position.partition}: expected "
                    f"{state.log_start_offset} to {state.high_watermark}",
                )
                continue
            upper = state.upper_bound(READ_COMMITTED if read_committed else READ_UNCOMMITTED)
            # Kafka's KIP-74: the first partition that returns batches gets its first batch whatever
            # the limits (a reader must make progress); every partition after it only batches that
            # fit both its own max_bytes and what is left of the fetch's.
            exempt = not any(earlier.batches for earlier in results)
            limit = min(position.max_bytes, budget)
            if position.offset >= upper or (limit <= 0 and not exempt):
                continue
            batches = await read_batches(
                conn, topic, position.partition, position.offset, upper, MAX_BATCHES_PER_READ, limit, read_committed
            )
            # read_batches returns a first batch whatever its size: past the exempt partition, one
            # that does not fit is not sent (Kafka sends it cut short, which clients discard).
            result.batches = batches if exempt or not batches or batches[0].size_bytes <= limit else []
            budget -= result.size
    return results, found


@dataclass(frozen=True, slots=True)
class _ReadRequest:
    """What a fetch reads (its answer's other inputs, the waits, do not change what is read)."""

    positions: tuple[BatchFetchPosition, ...]
    read_committed: bool
    max_bytes: int

    def same_reads(self, other: _ReadRequest) -> bool:
        """The same partitions from the same offsets with the same limits, in any order."""
        return (
            self.read_committed == other.read_committed
            and self.max_bytes == other.max_bytes
            and len(self.positions) == len(other.positions)
            and set(self.positions) == set(other.positions)
        )

    def order_free(self, results: list[FetchedBatches]) -> bool:
        """True when these results, read in this request's order, are what any order of its
        partitions reads: the fetch's max_bytes never cut a partition's own (their sum fits in it),
        and KIP-74's exemption gave no partition its first batch (which goes to the first partition
        with batches, so depends on the order): every batch sent fits its partition's max_bytes, and
        a partition with nothing sent had nothing to send. A negative limit counts as none: its
        partition takes nothing (unless exempt, refused below), so it leaves the others no more room."""
        if sum(max(position.max_bytes, 0) for position in self.positions) > self.max_bytes:
            return False
        isolation = READ_COMMITTED if self.read_committed else READ_UNCOMMITTED
        for position, result in zip(self.positions, results, strict=True):
            if result.error is not None or result.state is None:
                return False
            if result.batches:
                if result.batches[0].size_bytes > position.max_bytes:
                    return False
            elif position.offset < result.state.upper_bound(isolation):
                return False
        return True

    def after(self, results: list[FetchedBatches]) -> _ReadRequest | None:
        """The request a reader sends next once it has this answer: each partition from where its
        batches end (where it was, when none came); None unless some partition has more to read
        below its upper bound, or when any has an error (the reader then does something else)."""
        isolation = READ_COMMITTED if self.read_committed else READ_UNCOMMITTED
        behind = False
        positions = []
        for position, result in zip(self.positions, results, strict=True):
            if result.error is not None or result.state is None:
                return None
            offset = result.batches[-1].last_offset + 1 if result.batches else position.offset
            behind = behind or offset < result.state.upper_bound(isolation)
            positions.append(dataclasses.replace(position, offset=offset))
        return _ReadRequest(tuple(positions), self.read_committed, self.max_bytes) if behind else None


class ReadAhead:
    """One connection's next fetch, read while its client parses the answer before it.

    Kafka's consumers keep one Fetch in flight per broker, so without it the server's read and the
    client's parse take turns, and a consumer that is behind waits for both. When an answer leaves
    some partition with more to read, the request the client will send next (the same partitions,
    each from where its answer ended, the same limits and isolation) is read at once, in a task; a
    fetch that asks exactly that takes it (awaiting it if still running), any other discards it.

    Its batches are what serving that request a moment earlier gives, and they still answer it:
    below the upper bound they were read under (the high watermark, or the last stable offset under
    read_committed), which only rises, nothing is appended and no batch's fate changes. What may have
    changed since is read again when it is taken (`_refreshed`, one statement): the partitions'
    states, so the answer's high watermark, last stable offset and log start are current, and a log
    start moved past the fetch offset (DeleteRecords, retention) or a topic deleted since is read
    afresh, so answered with its error, as is a read that met an error. Compaction's removals may
    still be in it, as in any answer read a moment before them.

    A read is dropped READ_AHEAD_MAX_AGE_S after it began, taken or not, so that it holds no memory
    past its use. At most one read is held per connection, of at most the request's max_bytes;
    `close` (the connection's end) cancels it. A connection whose reads go unused
    READ_AHEAD_MISSES_BEFORE_PAUSE times in a row pauses for READ_AHEAD_PAUSE_FETCHES answers, so a
    client whose requests never match costs a read now and then, not one per fetch. `on_answered`
    and `on_unused` are told of each read taken as an answer and of each dropped unused (the
    node's metrics)."""

    def __init__(self, on_answered: Callable[[], None] = lambda: None, on_unused: Callable[[], None] = lambda: None):
        self._request: _ReadRequest | None = None
        self._task: asyncio.Task | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._misses = 0  # reads dropped unused since the last one taken
        self._paused_for = 0  # answers left before the next read ahead
        self._on_answered = on_answered
        self._on_unused = on_unused

    def answered(self) -> None:
        """The read taken answered the fetch (fetch_batches: one short of min_bytes does not)."""
        self._misses = 0
        self._on_answered()

    async def take(
        self, pool: asyncpg.Pool, request: _ReadRequest
    ) -> tuple[list[FetchedBatches], dict[str, TopicInfo]] | None:
        """The read made ahead for `request`, its partitions' states read again now, or None (none
        held, another request's, failed, or no longer an answer: the caller reads afresh, and meets
        the error itself if there is one)."""
        task = self._task
        if task is None:
            return None
        held = self._request
        if not held.same_reads(request):
            self._drop_unused()
            return None
        self._task = None
        self._expiry.cancel()
        try:
            results, found = await task
        except Exception as error:  # noqa: BLE001 - the fresh read that follows meets it again if it lasts
            log.debug("a fetch read ahead failed (%r); reading afresh", error)
            return None
        if held.positions != request.positions:
            # The same partitions in another order (librdkafka rotates them from one Fetch to the
            # next): the answer is the same only when no partition's limit depended on those before.
            if not held.order_free(results):
                return None
            by_position = dict(zip(held.positions, results, strict=True))
            results = [by_position[position] for position in request.positions]
        return await _refreshed(pool, results, found, request.read_committed)

    def start_after(
        self,
        pool: asyncpg.Pool,
        request: _ReadRequest,
        refused: dict[str, BrokerError | None],
        results: list[FetchedBatches],
    ) -> None:
        """Reads the request that follows this answer, when it leaves the reader behind."""
        self.close()
        if self._paused_for > 0:
            self._paused_for -= 1
            return
        following = None if any(refused.values()) else request.after(results)
        if following is None:
            return
        loop = asyncio.get_running_loop()
        self._request = following
        self._task = asyncio.create_task(
            _read_batches(pool, list(following.positions), refused, following.read_committed, following.max_bytes)
        )
        self._task.add_done_callback(_retrieved)
        self._expiry = loop.call_later(READ_AHEAD_MAX_AGE_S, self._drop_unused)

    def _drop_unused(self) -> None:
        """Drops the read held, which no fetch took: another request came, or none in time."""
        self.close()
        self._on_unused()
        self._misses += 1
        if self._misses >= READ_AHEAD_MISSES_BEFORE_PAUSE:
            self._misses = 0
            self._paused_for = READ_AHEAD_PAUSE_FETCHES

    def close(self) -> None:
        """Cancels the read held, if any."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
            self._expiry.cancel()


async def _refreshed(
    pool: asyncpg.Pool, results: list[FetchedBatches], found: dict[str, TopicInfo], read_committed: bool
) -> tuple[list[FetchedBatches], dict[str, TopicInfo]] | None:
    """Batches read ahead, with their partitions' states as they are now (one statement), or None
    when they no longer answer the fetch: a topic deleted (or deleted and created again) since, or a
    log start offset moved past the fetch offset (DeleteRecords, retention), which a fresh read
    answers with its error; or an error read ahead, which may no longer hold (a topic created again
    under its name just before the read, its offsets not reached then, may have them now).
    Otherwise the batches still stand: below the upper bound they were read under, which only
    rises, nothing is appended and no batch's fate changes; the fresh high watermark and last stable
    offset may stand above them, as when a fetch's limits stop it short. Should the bound have gone
    down (a PostgreSQL failover to a standby that had not received the last commits), batches past
    it are not answered: the fetch is read afresh."""
    if any(result.error is not None for result in results):
        return None
    async with pool.acquire() as conn:
        now_found, states = await partition_log.topics_and_states(
            conn, [(result.position.topic, result.position.partition) for result in results]
        )
    for result in results:
        then, now = found.get(result.position.topic), now_found.get(result.position.topic)
        state = states.get((result.position.topic, result.position.partition))
        if then is None or now is None or now.topic_id != then.topic_id or state is None:
            return None
        if result.position.offset < state.log_start_offset:
            return None
        upper = state.upper_bound(READ_COMMITTED if read_committed else READ_UNCOMMITTED)
        if result.batches and result.batches[-1].last_offset >= upper:
            return None
        result.state = state
    return results, now_found


def _retrieved(task: asyncio.Task) -> None:
    # A read ahead that failed and was never taken is not an error of anyone's request.
    if not task.cancelled():
        task.exception()
