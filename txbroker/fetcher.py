"""A consumer's reads (Kafka's Fetcher and OffsetFetcher): fetch long-polls, the buffer of fetched
records not yet returned, the prefetch, and positions (from committed offsets, ListOffsets, resets).

Invariants:
- A newly assigned partition starts at its committed offset, read with `require_stable` (it waits
  while a transactional commit for it is pending), else at `auto_offset_reset`.
- A position advances as poll() hands out records (a fetch brings up to fetch_max_records,
  buffered), past markers and aborted records to a fetch's `next_offset`, or by a seek; buffered
  records whose position changed are dropped.
- A subscribed topic deleted under a group member is no error of poll(): its partitions are
  skipped until the heartbeat brings the assignment without them (or with the topic re-created).
- poll() waits for no request past its deadline (FETCH_ANSWER_GRACE_S past it for a fetch's
  answer): retriable errors are retried until then, and a fetch still unanswered stays in flight
  for the next poll (`_prefetch`: at most one fetch is in flight, for the positions it names), as
  does the lookup of new partitions' positions (`_positioning`, for the partitions it names).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from txbroker import errors
from txbroker.connection import Connection
from txbroker.consumer_coordinator import Call, ConsumerCoordinator
from txbroker.errors import TxbrokerError
from txbroker.records import BASE64, ConsumerRecord, TopicPartition, consumer_record, listed_offsets
from txbroker.retry import Backoff
from txbroker.subscription_state import SubscriptionState
from txbroker.wire import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP

log = logging.getLogger("txbroker.consumer")

OFFSET_RESETS = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP, "none": None}
MAX_WAIT_MS = 30_000
# How long poll() waits past its deadline for the answer of a fetch: a long poll is answered at its
# max_wait (the deadline), and a fetch sent at the deadline (poll(0)) takes a round trip. A fetch
# unanswered by then outlives the poll (Fetcher._answer_by).
FETCH_ANSWER_GRACE_S = 0.5
NO_ANSWER = object()  # poll() returns [] without a fetch's answer: the assignment changed, or time is up


@dataclass
class _Fetched:
    """One partition's fetched records not yet returned. `position` is what the consumer's position
    must still be for them to be returned: a seek, reset or revocation meanwhile discards them."""

    records: deque[ConsumerRecord]
    position: int
    next_offset: int


class Fetcher:
    def __init__(
        self,
        subscriptions: SubscriptionState,
        connection: Connection,
        call: Call,
        coordinator: ConsumerCoordinator | None,
        *,
        url: str,
        isolation_level: str,
        auto_offset_reset: str,
        max_poll_records: int,
        fetch_max_records: int,
        prefetch: bool,
        backoff: Backoff,
    ) -> None:
        self._subscriptions = subscriptions
        self._connection = connection
        self._call = call
        self._coordinator = coordinator  # None without a group: positions start at auto_offset_reset
        self._url = url
        self._isolation_level = isolation_level
        self._auto_offset_reset = auto_offset_reset
        self._max_poll_records = max_poll_records
        # Fetched records not yet returned by poll(): a fetch asks for up to fetch_max_records (the
        # server reads whole stored batches, so small fetches cost it more), poll() hands out up to
        # max_poll_records at a time.
        self._fetch_max_records = max(fetch_max_records, max_poll_records)
        self._backoff = backoff
        self._fetched: dict[TopicPartition, _Fetched] = {}
        # The fetch in flight: the next one, sent while poll() hands out the last fetched records
        # and the caller processes them, or one a poll's deadline came before the answer of. Its
        # answer serves the next poll that fetches the positions it asked for.
        self._prefetch_enabled = prefetch
        self._prefetch: tuple[dict[TopicPartition, int], asyncio.Future] | None = None
        # The positions lookup in flight, for the partitions it names, one a poll's deadline came
        # before the answer of (`_positioned`).
        self._positioning: tuple[frozenset[TopicPartition], asyncio.Future] | None = None

    # ---- positions

    async def list_offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int, deadline: float | None = None
    ) -> dict[TopicPartition, int]:
        wanted = list(partitions)
        if not wanted:
            return {}
        return await self._call(
            "ListOffsets",
            "POST",
            "/v1/offsets/list",
            {
                "isolation_level": self._isolation_level,
                "partitions": [{"topic": tp.topic, "partition": tp.partition, "timestamp": timestamp} for tp in wanted],
            },
            deadline=deadline,
            answered=listed_offsets,
        )

    async def reset_positions(self, partitions: Iterable[TopicPartition], deadline: float | None = None) -> None:
        self._subscriptions.positions.update(await self._reset_offsets(list(partitions), deadline))

    async def _reset_offsets(
        self, partitions: list[TopicPartition], deadline: float | None
    ) -> dict[TopicPartition, int]:
        """Where auto_offset_reset starts `partitions` (NoOffsetForPartitionError with "none")."""
        timestamp = OFFSET_RESETS[self._auto_offset_reset]
        if timestamp is None and partitions:
            raise errors.NoOffsetForPartitionError(
                f"no committed offset for {sorted(partitions)} and auto_offset_reset='none': seek() first"
            )
        return await self.list_offsets(partitions, timestamp, deadline)

    async def initialize_positions(self, deadline: float) -> None:
        """Positions for assigned partitions that have none: the committed offset (waiting out
        pending transactional commits until `deadline`), else auto_offset_reset. Retriable errors
        are retried until `deadline` too (one attempt at least)."""
        missing = self._subscriptions.missing_positions()
        if missing:
            self._subscriptions.positions.update(await self._initial_positions(missing, deadline))

    async def _initial_positions(self, missing: list[TopicPartition], deadline: float) -> dict[TopicPartition, int]:
        """initialize_positions()'s positions for `missing`, found, not set."""
        if self._coordinator is None:
            committed, to_reset = {}, missing
        else:
            committed, to_reset = await self._coordinator.committed_positions(missing, deadline)
        return committed | await self._reset_offsets(to_reset, deadline)

    async def _positioned(self, deadline: float) -> bool:
        """poll()'s initialize_positions(), waited for until FETCH_ANSWER_GRACE_S past `deadline`
        and no longer, as a fetch's answer: whether it ended (its error raised). The lookup (an
        OffsetFetch, a ListOffsets) left unanswered goes on, for the next poll to wait for, whose
        positions it sets for the partitions still assigned without one (not seeked meanwhile).
        Before 2026-11-28 poll(timeout_ms=0) waited for it, up to request_timeout_ms."""
        missing = self._subscriptions.missing_positions()
        if self._positioning is not None and self._positioning[0] != frozenset(missing):
            self._drop_positioning()
        if not missing:
            return True
        if self._positioning is None:
            task = asyncio.ensure_future(self._initial_positions(missing, deadline))
            self._positioning = (frozenset(missing), task)
        task = self._positioning[1]
        await asyncio.wait([task], timeout=max(0.0, deadline - time.monotonic()) + FETCH_ANSWER_GRACE_S)
        if not task.done():
            return False
        self._positioning = None
        subscriptions = self._subscriptions
        for tp, offset in task.result().items():
            if tp in subscriptions.assignment and tp not in subscriptions.positions:
                subscriptions.positions[tp] = offset
        return True

    def _drop_positioning(self) -> None:
        if self._positioning is not None:
            task = self._positioning[1]
            task.cancel()
            task.add_done_callback(lambda done: done.cancelled() or done.exception())  # its error, dropped
            self._positioning = None

    # ---- fetching

    async def fetch(self, deadline: float) -> list[ConsumerRecord]:
        """Buffered records, else one fetch (long-polling until `deadline`), or a wait for an
        assignment; [] early when the assignment changes meanwhile."""
        try:
            if not await self._positioned(deadline):
                return []
        except TxbrokerError as error:
            if not error.retriable and not self._topic_deleted_under_group(error):
                raise
            log.warning("initializing positions: %s", error)
            return await self._pause_until(deadline, self._backoff.max_ms / 1000)
        records = self._take_fetched()
        if records:
            return records
        fetchable = self._subscriptions.fetchable()
        if not fetchable:
            self.drop_prefetch()
            return await self._pause_until(deadline)
        positions = self._subscriptions.positions
        requested = {tp: positions[tp] for tp in fetchable}
        answer = await self._prefetched(requested, deadline)
        if answer is None:
            max_wait_ms = min(max(0, int((deadline - time.monotonic()) * 1000)), MAX_WAIT_MS)
            try:
                answer = await self._answer_by(requested, self._send_fetch(requested, max_wait_ms), deadline)
            except TxbrokerError as error:
                if not error.retriable:
                    raise
                log.warning("fetch from %s failed: %s", self._url, error)
                return await self._pause_until(deadline, self._backoff.max_ms / 1000)
        if answer is NO_ANSWER:
            return []
        try:
            deleted = await self._keep_fetched(answer, requested, deadline)
        except errors.InvalidResponseError as error:
            # An answer without the contract's fields is as good as none: what it held up to the
            # odd field is kept, and the rest is fetched again, as after a page that is not JSON.
            log.warning("fetch from %s: %s", self._url, error)
            return await self._pause_until(deadline, self._backoff.max_ms / 1000)
        records = self._take_fetched()
        if not records and deleted:  # the fetch answered at once: not again before the heartbeat may have come
            return await self._pause_until(deadline, self._backoff.max_ms / 1000)
        return records

    def _topic_deleted_under_group(self, error: TxbrokerError) -> bool:
        """A subscribed topic deleted since the assignment that names it: the group's next
        generation leaves its partitions out, a member's next heartbeat brings it. (A manually
        assigned partition of a topic that does not exist is the caller's error.)"""
        return self._subscriptions.subscribed and isinstance(error, errors.UnknownTopicOrPartitionError)

    def _fetch_body(self, positions: dict[TopicPartition, int], max_wait_ms: int) -> dict:
        return {
            "isolation_level": self._isolation_level,
            "max_wait_ms": max_wait_ms,
            "max_records": self._fetch_max_records,
            "encoding": BASE64,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "offset": offset} for tp, offset in positions.items()
            ],
        }

    def _send_fetch(self, positions: dict[TopicPartition, int], max_wait_ms: int) -> asyncio.Task:
        task = asyncio.ensure_future(
            self._connection.request(
                "POST", "/v1/fetch", self._fetch_body(positions, max_wait_ms), extra_timeout_s=max_wait_ms / 1000
            )
        )
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # a dropped one's error
        return task

    async def _prefetched(self, requested: dict[TopicPartition, int], deadline: float) -> Any:
        """The answer of the fetch in flight (a prefetch, or one an earlier poll left unanswered) if it
        asked for exactly these positions (no seek, rebalance or pause since), or NO_ANSWER (see
        `_answer_by`); else None: fetch now (a fetch for other positions is dropped, and one that
        failed is sent again)."""
        if self._prefetch is None:
            return None
        asked, task = self._prefetch
        self._prefetch = None
        if asked != requested:
            task.cancel()
            return None
        try:
            return await self._answer_by(asked, task, deadline)
        except TxbrokerError:
            return None  # fetched again, now

    def forget(self, partitions: set[TopicPartition]) -> None:
        """Drops what was fetched (buffered, prefetching) for partitions revoked: also those assigned
        again, whose new position may equal the one the records were fetched at by chance (a topic
        re-created under its name, whose records those are not)."""
        for tp in partitions:
            self._fetched.pop(tp, None)
        if self._prefetch is not None and not partitions.isdisjoint(self._prefetch[0]):
            self.drop_prefetch()
        if self._positioning is not None and not partitions.isdisjoint(self._positioning[0]):
            self._drop_positioning()  # a committed offset from before: another member may have moved it

    def drop_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch[1].cancel()
            self._prefetch = None
        self._drop_positioning()

    async def _keep_fetched(
        self, answer: dict, requested: dict[TopicPartition, int], deadline: float
    ) -> list[TopicPartition]:
        """Buffers a fetch's records; positions of partitions without records move to next_offset
        (past markers and aborted records). Returns the partitions of subscribed topics deleted
        meanwhile (skipped)."""
        positions = self._subscriptions.positions
        reset: list[TopicPartition] = []
        deleted: list[TopicPartition] = []
        for entry in answer["partitions"]:
            tp = TopicPartition(entry["topic"], entry["partition"])
            if positions.get(tp) != requested.get(tp):
                continue  # seeked, or revoked, meanwhile
            error = entry["error"]
            if error is not None:
                if error["code"] == "OFFSET_OUT_OF_RANGE" and self._auto_offset_reset != "none":
                    log.warning(
                        "%s: offset %d out of range: resetting to %s", tp, requested[tp], self._auto_offset_reset
                    )
                    reset.append(tp)
                    continue
                failure = errors.from_body(error)
                if self._topic_deleted_under_group(failure):
                    log.warning("%s: %s (skipped until the group's next assignment)", tp, failure)
                    deleted.append(tp)
                    continue
                raise failure
            if entry["records"]:
                self._fetched[tp] = _Fetched(
                    deque(entry["records"].read_each(partial(consumer_record, tp.topic, tp.partition))),
                    requested[tp],
                    entry["next_offset"],
                )
            else:
                positions[tp] = entry["next_offset"]
        if reset:
            try:
                await self.reset_positions(reset, deadline)
            except TxbrokerError as error:
                if not error.retriable:
                    raise
                # Their positions stay out of range: the next fetch answers so again, and resets.
                log.warning("resetting %s: %s", sorted(reset), error)
        return deleted

    def _take_fetched(self) -> list[ConsumerRecord]:
        """Up to max_poll_records buffered records, advancing positions; starts the prefetch when
        the next poll will empty the buffer."""
        subscriptions = self._subscriptions
        positions = subscriptions.positions
        records: list[ConsumerRecord] = []
        budget = self._max_poll_records
        for tp, fetched in list(self._fetched.items()):
            if (
                tp not in subscriptions.assignment
                or tp in subscriptions.revoking
                or positions.get(tp) != fetched.position
            ):
                del self._fetched[tp]  # revoked (or being revoked), seeked or reset since the fetch
                continue
            if tp in subscriptions.paused or budget <= 0:
                continue
            take = min(budget, len(fetched.records))
            chunk = [fetched.records.popleft() for _ in range(take)]
            records += chunk
            budget -= take
            if fetched.records:
                fetched.position = positions[tp] = chunk[-1].offset + 1
            else:
                positions[tp] = fetched.next_offset
                del self._fetched[tp]
        remaining = sum(len(fetched.records) for fetched in self._fetched.values())
        if records and remaining <= self._max_poll_records and self._prefetch is None and self._prefetch_enabled:
            # The next poll empties the buffer: fetch what follows it now.
            following = {
                tp: self._fetched[tp].next_offset if tp in self._fetched else positions[tp]
                for tp in subscriptions.fetchable()
            }
            if following:
                self._prefetch = (following, self._send_fetch(following, 0))
        return records

    async def _answer_by(self, asked: dict[TopicPartition, int], fetch: asyncio.Task, deadline: float) -> Any:
        """The fetch's answer (or its error), or NO_ANSWER: when the assignment changes first, the
        fetch is dropped; when it is still unanswered FETCH_ANSWER_GRACE_S past `deadline` (a server
        frozen, an answer lost on the network), poll() returns and the fetch stays in flight, its
        answer kept for the next poll of the same positions. So poll() waits for no request past
        its timeout, as Kafka's poll(), where request_timeout_ms (30 s) bounded it before."""
        changed = None
        waiting = {fetch}
        if self._subscriptions.subscribed:
            changed = asyncio.ensure_future(self._subscriptions.assignment_changed.wait())
            waiting.add(changed)
        try:
            timeout = max(0.0, deadline - time.monotonic()) + FETCH_ANSWER_GRACE_S
            await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if changed is not None:
                changed.cancel()
        if fetch.done():
            return fetch.result()
        if changed is not None and changed.done() and not changed.cancelled():
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
        else:
            self._prefetch = (asked, fetch)
        return NO_ANSWER

    async def _pause_until(self, deadline: float, at_most_s: float | None = None) -> list[ConsumerRecord]:
        """Nothing to fetch: wait for an assignment change, the deadline, or `at_most_s`."""
        wait = max(0.0, deadline - time.monotonic())
        if at_most_s is not None:
            wait = min(wait, at_most_s)
        try:
            await asyncio.wait_for(self._subscriptions.assignment_changed.wait(), wait)
        except asyncio.TimeoutError:
            pass
        return []
