"""The consumer: group membership with server-side assignment (POST /v1/groups/{g}/heartbeat) or
manual assignment, fetch long-polls, positions, and offset commits.

`AsyncConsumer` is the one implementation; `txbroker.Consumer` runs it on a private event loop
thread (txbroker.sync), where the heartbeat task keeps the membership alive between polls, as
Kafka's heartbeat thread does.

Invariants:
- The heartbeat task only records what the server answered (`_latest`); `poll()` adopts it. So the
  assignment, and the generation `group_metadata()` reports, are those of the records poll()
  returned: a transactional offset commit for records of a revoked partition carries the old
  generation and is refused (KIP-447), instead of committing for a partition someone else owns.
- A newly assigned partition starts at its committed offset, read with `require_stable` (it waits
  while a transactional commit for it is pending), else at `auto_offset_reset`.
- A position is the offset of the next record poll() returns. It advances as poll() hands out
  records (a fetch brings up to fetch_max_records, buffered), past markers and aborted records to
  a fetch's `next_offset`, or by a seek; buffered records whose position changed are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from txbroker import errors
from txbroker.connection import DEFAULT_URL, Connection
from txbroker.errors import IllegalStateError, TxbrokerError
from txbroker.records import (BASE64, NO_GENERATION, NO_MEMBER, ConsumerGroupMetadata, ConsumerRecord,
                              OffsetAndMetadata, TopicPartition, consumer_record)
from txbroker.retry import Backoff, retrying

log = logging.getLogger("txbroker.consumer")

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
OFFSET_RESETS = {"earliest": -2, "latest": -1, "none": None}
EARLIEST, LATEST = -2, -1
MAX_WAIT_MS = 30_000

Listener = Callable[[set[TopicPartition]], Any]


@dataclass(frozen=True)
class RebalanceEvent:
    """What changed when poll() adopted a new assignment: callbacks to run, in this order."""
    revoked: set[TopicPartition]
    assigned: set[TopicPartition]
    on_revoke: Listener | None
    on_assign: Listener | None

    def calls(self) -> list[tuple[Listener, set[TopicPartition]]]:
        calls = []
        if self.on_revoke is not None and self.revoked:
            calls.append((self.on_revoke, self.revoked))
        if self.on_assign is not None and self.assigned:
            calls.append((self.on_assign, self.assigned))
        return calls


@dataclass
class _Fetched:
    """One partition's fetched records not yet returned. `position` is what the consumer's position
    must still be for them to be returned: a seek, reset or revocation meanwhile discards them."""
    records: deque[ConsumerRecord]
    position: int
    next_offset: int


def _group_path(group_id: str, action: str = "") -> str:
    return f"/v1/groups/{quote(group_id, safe='')}" + (f"/{action}" if action else "")


class AsyncConsumer:
    """An asyncio consumer; like Kafka's, not meant to be shared by concurrent tasks.

    Options (Kafka's names, in snake_case):
    - group_id: needed for subscribe(), commits and group_metadata(); None with assign() only.
    - isolation_level ("read_committed", the server's default; Kafka's is read_uncommitted).
    - auto_offset_reset ("latest"): where a partition without a committed offset starts
      ("earliest", "latest", or "none": raise NoOffsetForPartitionError).
    - enable_auto_commit (True), auto_commit_interval_ms (5000): commit positions from poll().
      Off for consume-transform-produce: the producer's transaction commits the offsets.
    - max_poll_records (500): records per poll(); fetch_max_records (5000): records per fetch
      (the rest is buffered for the next polls); prefetch (True): fetch the next records while
      the caller processes the last ones.
    - session_timeout_ms (30000), heartbeat_interval_ms (3000, or the server's if shorter).
    - request_timeout_ms (30000), default_api_timeout_ms (60000): how long calls retry retriable
      errors; retry_backoff_ms (100), retry_backoff_max_ms (1000).
    - token, headers, transport: see txbroker.connection.Connection.
    """

    def __init__(self, url: str = DEFAULT_URL, *, group_id: str | None = None, token: str | None = None,
                 headers: Mapping[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | httpx.BaseTransport | None = None,
                 isolation_level: str = "read_committed", auto_offset_reset: str = "latest",
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5_000,
                 max_poll_records: int = 500, session_timeout_ms: int = 30_000, heartbeat_interval_ms: int = 3_000,
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1_000,
                 default_api_timeout_ms: int = 60_000, fetch_max_records: int = 5_000, prefetch: bool = True) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of {ISOLATION_LEVELS}, not {isolation_level!r}")
        if auto_offset_reset not in OFFSET_RESETS:
            raise ValueError(f"auto_offset_reset must be one of {sorted(OFFSET_RESETS)}, not {auto_offset_reset!r}")
        if not 1 <= max_poll_records <= 10_000:
            raise ValueError("max_poll_records must be in 1..10000")
        if not 1 <= fetch_max_records <= 10_000:
            raise ValueError("fetch_max_records must be in 1..10000")
        self.url = url
        self.group_id = group_id
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self._auto_commit_interval_s = auto_commit_interval_ms / 1000
        self._max_poll_records = max_poll_records
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        self._api_timeout_s = default_api_timeout_ms / 1000
        self._backoff = Backoff(retry_backoff_ms, retry_backoff_max_ms)
        self._connection = Connection(url, token=token, headers=headers, transport=transport,
                                      request_timeout_ms=request_timeout_ms)
        # subscription (group-managed) or manual assignment
        self._subscription: list[str] | None = None
        self._on_assign: Listener | None = None
        self._on_revoke: Listener | None = None
        self._member_id = NO_MEMBER
        self._latest: tuple[int, frozenset[TopicPartition]] | None = None  # from the last heartbeat
        self._generation = NO_GENERATION  # of the adopted assignment
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._assignment_changed = asyncio.Event()
        self._heartbeat_task: asyncio.Task | None = None
        self._heartbeat_error: TxbrokerError | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._last_auto_commit = time.monotonic()
        # Fetched records not yet returned by poll(): a fetch asks for up to fetch_max_records (the
        # server reads whole stored batches, so small fetches cost it more), poll() hands out up to
        # max_poll_records at a time.
        self._fetch_max_records = max(fetch_max_records, max_poll_records)
        self._fetched: dict[TopicPartition, _Fetched] = {}
        # The next fetch, sent while poll() hands out the last fetched records and the caller
        # processes them.
        self._prefetch_enabled = prefetch
        self._prefetch: tuple[dict[TopicPartition, int], asyncio.Future] | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")

    async def _call(self, what: str, method: str, path: str, body: Any = None, *, params=None) -> Any:
        return await retrying(lambda: self._connection.request(method, path, body, params=params), what=what,
                              timeout_s=self._api_timeout_s, backoff=self._backoff)

    # ---- subscription and assignment

    def subscribe(self, topics: Iterable[str], on_assign: Listener | None = None,
                  on_revoke: Listener | None = None) -> None:
        """Joins the group (at the next poll) for these topics; the server assigns the partitions.
        on_revoke(partitions) / on_assign(partitions) run inside poll() when the assignment changes."""
        self._check_open()
        if self.group_id is None:
            raise IllegalStateError("subscribe() needs a group_id (or use assign())")
        topics = sorted(set([topics] if isinstance(topics, str) else topics))
        if not topics:
            raise ValueError("subscribe() needs at least one topic (unsubscribe() to stop)")
        self._subscription = topics
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._assignment_changed.set()

    def subscription(self) -> set[str]:
        return set(self._subscription or ())

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manual assignment: no group membership (commits, if group_id is set, are simple ones)."""
        self._check_open()
        if self._subscription is not None:
            raise IllegalStateError("assign() on a subscribed consumer: unsubscribe() first")
        self._assignment = frozenset(TopicPartition(*tp) for tp in partitions)
        self._positions = {tp: offset for tp, offset in self._positions.items() if tp in self._assignment}

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    async def unsubscribe(self) -> None:
        await self._leave_group()
        self._subscription = None
        self._assignment = frozenset()
        self._positions.clear()
        self._generation = NO_GENERATION

    def group_metadata(self) -> ConsumerGroupMetadata:
        """For Producer.send_offsets_to_transaction: the group, and the generation and member id of
        the assignment of the records last returned by poll()."""
        if self.group_id is None:
            raise IllegalStateError("group_metadata() needs a group_id")
        return ConsumerGroupMetadata(self.group_id, self._generation, self._member_id)

    # ---- membership

    async def _heartbeat(self) -> None:
        assert self.group_id is not None and self._subscription is not None
        body = {"member_id": self._member_id, "generation_id": self._generation,
                "topics": self._subscription, "session_timeout_ms": self._session_timeout_ms}
        try:
            answer = await self._connection.request("POST", _group_path(self.group_id, "heartbeat"), body)
        except errors.UnknownMemberIdError:
            log.warning("consumer %s was evicted from group %r (session timeout?): rejoining",
                        self._member_id, self.group_id)
            self._member_id = NO_MEMBER
            body["member_id"] = NO_MEMBER
            answer = await self._connection.request("POST", _group_path(self.group_id, "heartbeat"), body)
        self._member_id = answer["member_id"]
        server_interval = answer.get("heartbeat_interval_ms")
        if server_interval:
            self._heartbeat_interval_s = min(self._heartbeat_interval_s, server_interval / 1000)
        assignment = frozenset(TopicPartition(a["topic"], p) for a in answer["assignment"] for p in a["partitions"])
        latest = (answer["generation_id"], assignment)
        if latest != self._latest:
            self._latest = latest
            if latest != (self._generation, self._assignment):
                self._assignment_changed.set()

    async def _heartbeat_loop(self) -> None:
        attempt = 0
        while self._subscription is not None and not self._closed:
            try:
                await asyncio.sleep(self._heartbeat_interval_s if attempt == 0 else self._backoff.delay_s(attempt))
                await self._heartbeat()
                attempt, self._heartbeat_error = 0, None
            except asyncio.CancelledError:
                raise
            except TxbrokerError as error:
                self._heartbeat_error = error
                attempt += 1
                log.warning("heartbeat of group %r failed: %s", self.group_id, error)

    async def _leave_group(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            await asyncio.gather(self._heartbeat_task, return_exceptions=True)
            self._heartbeat_task = None
        if self.group_id is not None and self._member_id:
            try:
                await self._connection.request("POST", _group_path(self.group_id, "leave"),
                                               {"member_id": self._member_id})
            except TxbrokerError as error:
                log.info("leaving group %r: %s", self.group_id, error)
        self._member_id = NO_MEMBER
        self._latest = None

    async def _update_assignment(self) -> RebalanceEvent | None:
        """Joins if needed and adopts the latest assignment the heartbeats brought; returns what
        changed, for the caller to run the listeners on its own thread."""
        self._check_open()
        if self._subscription is None:
            if not self._assignment:
                raise IllegalStateError("poll() needs subscribe() or assign() first")
            return None
        if not self._member_id:
            await retrying(self._heartbeat, what=f"joining group {self.group_id!r}", timeout_s=self._api_timeout_s,
                           backoff=self._backoff)
        error, self._heartbeat_error = self._heartbeat_error, None
        if error is not None and not error.retriable:
            raise error  # e.g. GROUP_AUTHORIZATION_FAILED: heartbeats will not succeed by waiting
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        self._assignment_changed.clear()
        if self._latest is None or self._latest == (self._generation, self._assignment):
            return None
        generation, assignment = self._latest
        revoked, added = set(self._assignment - assignment), set(assignment - self._assignment)
        self._generation, self._assignment = generation, assignment
        for tp in revoked:
            self._positions.pop(tp, None)
            self._paused.discard(tp)
        log.info("group %r generation %d: assigned %s", self.group_id, generation, sorted(assignment))
        return RebalanceEvent(revoked, added, self._on_revoke, self._on_assign)

    @staticmethod
    async def _run_listeners(event: RebalanceEvent) -> None:
        for listener, partitions in event.calls():
            result = listener(partitions)
            if isinstance(result, Awaitable):
                await result

    # ---- positions

    async def _list_offsets(self, partitions: Iterable[TopicPartition], timestamp: int) -> dict[TopicPartition, int]:
        wanted = list(partitions)
        if not wanted:
            return {}
        answer = await self._call("ListOffsets", "POST", "/v1/offsets/list", {
            "isolation_level": self.isolation_level,
            "partitions": [{"topic": tp.topic, "partition": tp.partition, "timestamp": timestamp} for tp in wanted]})
        found = {}
        for entry in answer["partitions"]:
            if entry["error"] is not None:
                raise errors.from_body(entry["error"])
            found[TopicPartition(entry["topic"], entry["partition"])] = entry["offset"]
        return found

    async def _reset_positions(self, partitions: Iterable[TopicPartition]) -> None:
        partitions = list(partitions)
        timestamp = OFFSET_RESETS[self.auto_offset_reset]
        if timestamp is None and partitions:
            raise errors.NoOffsetForPartitionError(
                f"no committed offset for {sorted(partitions)} and auto_offset_reset='none': seek() first")
        self._positions.update(await self._list_offsets(partitions, timestamp))

    async def _fetch_committed(self, partitions: list[TopicPartition], require_stable: bool
                               ) -> dict[TopicPartition, tuple[int, str | None] | TxbrokerError]:
        assert self.group_id is not None
        answer = await self._call(f"OffsetFetch({self.group_id})", "POST", _group_path(self.group_id, "offsets/fetch"),
                                  {"partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in partitions],
                                   "require_stable": require_stable})
        found: dict[TopicPartition, tuple[int, str | None] | TxbrokerError] = {}
        for entry in answer["offsets"]:
            tp = TopicPartition(entry["topic"], entry["partition"])
            found[tp] = errors.from_body(entry["error"]) if entry["error"] else (entry["offset"], entry.get("metadata"))
        return found

    async def _initialize_positions(self, deadline: float) -> None:
        """Positions for assigned partitions that have none: the committed offset (waiting out
        pending transactional commits until `deadline`), else auto_offset_reset."""
        missing = [tp for tp in self._assignment if tp not in self._positions]
        if not missing:
            return
        to_reset = []
        if self.group_id is not None:
            attempt = 0
            while missing:
                committed = await self._fetch_committed(missing, require_stable=True)
                unstable = []
                for tp in missing:
                    found = committed.get(tp)
                    if isinstance(found, TxbrokerError):
                        if not found.retriable:
                            raise found
                        unstable.append(tp)
                    elif found is None or found[0] < 0:
                        to_reset.append(tp)
                    else:
                        self._positions[tp] = found[0]
                missing = unstable
                if missing:
                    delay = self._backoff.delay_s(attempt)
                    if time.monotonic() + delay > deadline:
                        break  # these wait for the next poll
                    attempt += 1
                    await asyncio.sleep(delay)
        else:
            to_reset = missing
        await self._reset_positions(to_reset)

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record poll() returns for an assigned partition."""
        tp = TopicPartition(*partition)
        if tp not in self._assignment:
            raise IllegalStateError(f"position(): {tp} is not assigned to this consumer")
        if tp not in self._positions:
            await self._initialize_positions(time.monotonic() + self._api_timeout_s)
        return self._positions[tp]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        tp = TopicPartition(*partition)
        if tp not in self._assignment:
            raise IllegalStateError(f"seek(): {tp} is not assigned to this consumer")
        if offset < 0:
            raise ValueError(f"seek(): offset must be >= 0, not {offset}")
        self._positions[tp] = offset

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._positions.update(await self._list_offsets(self._seekable(partitions), EARLIEST))

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """To the end: the LSO under read_committed, the high watermark under read_uncommitted."""
        self._positions.update(await self._list_offsets(self._seekable(partitions), LATEST))

    async def seek_to_committed(self, *partitions: TopicPartition) -> None:
        """Back to the committed offsets (auto_offset_reset where none): after abort_transaction(),
        so the records of the aborted transaction are processed again."""
        for tp in self._seekable(partitions):
            self._positions.pop(tp, None)
        await self._initialize_positions(time.monotonic() + self._api_timeout_s)

    def _seekable(self, partitions: tuple) -> list[TopicPartition]:
        chosen = [TopicPartition(*tp) for tp in partitions] or sorted(self._assignment)
        strangers = [tp for tp in chosen if tp not in self._assignment]
        if strangers:
            raise IllegalStateError(f"{strangers} are not assigned to this consumer")
        return chosen

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._list_offsets([TopicPartition(*tp) for tp in partitions], EARLIEST)

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._list_offsets([TopicPartition(*tp) for tp in partitions], LATEST)

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The first offset whose timestamp is at or after each time (-1: none)."""
        found = {}
        for tp, timestamp in timestamps.items():
            found.update(await self._list_offsets([TopicPartition(*tp)], timestamp))
        return found

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused.update(TopicPartition(*tp) for tp in partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused.difference_update(TopicPartition(*tp) for tp in partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    # ---- fetching

    async def poll(self, timeout_ms: int = 0) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to `timeout_ms` for some (the fetch
        long-poll). Runs the rebalance listeners when the assignment changed."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            event = await self._update_assignment()
            if event is not None:
                await self._run_listeners(event)
            records = await self._fetch(deadline)
            if records or time.monotonic() >= deadline:
                return records

    async def _fetch(self, deadline: float) -> list[ConsumerRecord]:
        """Buffered records, else one fetch (long-polling until `deadline`), or a wait for an
        assignment; [] early when the assignment changes meanwhile."""
        await self._maybe_auto_commit()
        try:
            await self._initialize_positions(deadline)
        except TxbrokerError as error:
            if not error.retriable:
                raise
            log.warning("initializing positions: %s", error)
            return await self._pause_until(deadline, self._backoff.max_ms / 1000)
        records = self._take_fetched()
        if records:
            return records
        fetchable = [tp for tp in sorted(self._assignment) if tp not in self._paused and tp in self._positions]
        if not fetchable:
            self._drop_prefetch()
            return await self._pause_until(deadline)
        requested = {tp: self._positions[tp] for tp in fetchable}
        answer = await self._prefetched(requested)
        if answer is None:
            max_wait_ms = min(max(0, int((deadline - time.monotonic()) * 1000)), MAX_WAIT_MS)
            try:
                answer = await self._until_assignment_changes(self._connection.request(
                    "POST", "/v1/fetch", self._fetch_body(requested, max_wait_ms), extra_timeout_s=max_wait_ms / 1000))
            except TxbrokerError as error:
                if not error.retriable:
                    raise
                log.warning("fetch from %s failed: %s", self.url, error)
                return await self._pause_until(deadline, self._backoff.max_ms / 1000)
            if answer is None:
                return []
        await self._keep_fetched(answer, requested)
        return self._take_fetched()

    def _fetch_body(self, positions: dict[TopicPartition, int], max_wait_ms: int) -> dict:
        return {"isolation_level": self.isolation_level, "max_wait_ms": max_wait_ms,
                "max_records": self._fetch_max_records, "encoding": BASE64,
                "partitions": [{"topic": tp.topic, "partition": tp.partition, "offset": offset}
                               for tp, offset in positions.items()]}

    async def _prefetched(self, requested: dict[TopicPartition, int]) -> dict | None:
        """The prefetch's answer if it asked for exactly these positions (no seek, rebalance or
        pause since), else None."""
        if self._prefetch is None:
            return None
        asked, task = self._prefetch
        self._prefetch = None
        if asked != requested:
            task.cancel()
            return None
        try:
            return await task
        except TxbrokerError:
            return None  # fetched again, now

    def _drop_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch[1].cancel()
            self._prefetch = None

    async def _keep_fetched(self, answer: dict, requested: dict[TopicPartition, int]) -> None:
        """Buffers a fetch's records; positions of partitions without records move to next_offset
        (past markers and aborted records)."""
        reset: list[TopicPartition] = []
        for entry in answer["partitions"]:
            tp = TopicPartition(entry["topic"], entry["partition"])
            if self._positions.get(tp) != requested.get(tp):
                continue  # seeked, or revoked, meanwhile
            error = entry["error"]
            if error is not None:
                if error["code"] == "OFFSET_OUT_OF_RANGE" and self.auto_offset_reset != "none":
                    log.warning("%s: offset %d out of range: resetting to %s", tp, requested[tp],
                                self.auto_offset_reset)
                    reset.append(tp)
                    continue
                raise errors.from_body(error)
            if entry["records"]:
                self._fetched[tp] = _Fetched(
                    deque(consumer_record(tp.topic, tp.partition, wire) for wire in entry["records"]),
                    requested[tp], entry["next_offset"])
            else:
                self._positions[tp] = entry["next_offset"]
        if reset:
            await self._reset_positions(reset)

    def _take_fetched(self) -> list[ConsumerRecord]:
        """Up to max_poll_records buffered records, advancing positions; starts the prefetch when
        the next poll will empty the buffer."""
        records: list[ConsumerRecord] = []
        budget = self._max_poll_records
        for tp, fetched in list(self._fetched.items()):
            if tp not in self._assignment or self._positions.get(tp) != fetched.position:
                del self._fetched[tp]  # revoked, seeked or reset since the fetch
                continue
            if tp in self._paused or budget <= 0:
                continue
            take = min(budget, len(fetched.records))
            chunk = [fetched.records.popleft() for _ in range(take)]
            records += chunk
            budget -= take
            if fetched.records:
                fetched.position = self._positions[tp] = chunk[-1].offset + 1
            else:
                self._positions[tp] = fetched.next_offset
                del self._fetched[tp]
        remaining = sum(len(fetched.records) for fetched in self._fetched.values())
        if records and remaining <= self._max_poll_records and self._prefetch is None and self._prefetch_enabled:
            # The next poll empties the buffer: fetch what follows it now.
            following = {tp: self._fetched[tp].next_offset if tp in self._fetched else self._positions[tp]
                         for tp in sorted(self._assignment) if tp not in self._paused and tp in self._positions}
            if following:
                task = asyncio.ensure_future(
                    self._connection.request("POST", "/v1/fetch", self._fetch_body(following, 0)))
                task.add_done_callback(lambda done: done.cancelled() or done.exception())  # a dropped one's error
                self._prefetch = (following, task)
        return records

    async def _until_assignment_changes(self, request: Awaitable[Any]) -> Any:
        """The request's answer, or None if the assignment changed first (the request is dropped)."""
        if self._subscription is None:
            return await request
        task = asyncio.ensure_future(request)
        changed = asyncio.ensure_future(self._assignment_changed.wait())
        try:
            await asyncio.wait({task, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None

    async def _pause_until(self, deadline: float, at_most_s: float | None = None) -> list[ConsumerRecord]:
        """Nothing to fetch: wait for an assignment change, the deadline, or `at_most_s`."""
        wait = max(0.0, deadline - time.monotonic())
        if at_most_s is not None:
            wait = min(wait, at_most_s)
        try:
            await asyncio.wait_for(self._assignment_changed.wait(), wait)
        except asyncio.TimeoutError:
            pass
        return []

    # ---- commits

    def _commit_identity(self) -> tuple[str, int]:
        if self._subscription is not None:
            return self._member_id, self._generation
        return NO_MEMBER, NO_GENERATION

    def _offsets_body(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None) -> list[dict]:
        if offsets is None:
            offsets = {tp: offset for tp, offset in self._positions.items() if tp in self._assignment}
        entries = []
        for tp, offset in offsets.items():
            offset, metadata = (offset.offset, offset.metadata) if isinstance(offset, OffsetAndMetadata) else (
                offset, None)
            entries.append({"topic": tp[0], "partition": tp[1], "offset": int(offset), "metadata": metadata})
        return entries

    async def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None) -> None:
        """Commits `offsets` (the next offset to read, per partition), or the positions of every
        assigned partition. A subscribed consumer's commit carries its generation: after a
        rebalance it is refused (IllegalGenerationError / UnknownMemberIdError)."""
        self._check_open()
        if self.group_id is None:
            raise IllegalStateError("commit() needs a group_id")
        entries = self._offsets_body(offsets)
        if not entries:
            return
        member_id, generation = self._commit_identity()
        answer = await self._call(f"OffsetCommit({self.group_id})", "POST",
                                  _group_path(self.group_id, "offsets/commit"),
                                  {"member_id": member_id, "generation_id": generation, "offsets": entries})
        for entry in answer["offsets"]:
            if entry["error"] is not None:
                raise errors.from_body(entry["error"])
        self._last_auto_commit = time.monotonic()

    def commit_async(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
                     callback: Callable[[dict, BaseException | None], Any] | None = None) -> asyncio.Future:
        """commit() in the background; `callback(offsets, error)` runs when it is done."""
        entries = {TopicPartition(e["topic"], e["partition"]): e["offset"] for e in self._offsets_body(offsets)}
        task = asyncio.ensure_future(self.commit(entries))
        if callback is not None:
            task.add_done_callback(lambda t: callback(entries, None if t.cancelled() else t.exception()))
        return task

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None: none); pending transactional ones are not visible."""
        if self.group_id is None:
            raise IllegalStateError("committed() needs a group_id")
        wanted = [TopicPartition(*tp) for tp in partitions]
        found = await self._fetch_committed(wanted, require_stable=False)
        result: dict[TopicPartition, int | None] = {}
        for tp in wanted:
            entry = found.get(tp)
            if isinstance(entry, TxbrokerError):
                raise entry
            result[tp] = None if entry is None or entry[0] < 0 else entry[0]
        return result

    async def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit or time.monotonic() - self._last_auto_commit < self._auto_commit_interval_s:
            return
        try:
            await self.commit()
        except TxbrokerError as error:
            log.warning("auto-commit of group %r failed: %s", self.group_id, error)
        self._last_auto_commit = time.monotonic()

    # ---- closing

    async def close(self) -> None:
        """Commits (with enable_auto_commit), leaves the group (it rebalances at once), closes."""
        if self._closed:
            return
        if self.enable_auto_commit and self._assignment:
            try:
                await self.commit()
            except TxbrokerError as error:
                log.warning("final auto-commit of group %r failed: %s", self.group_id, error)
        self._closed = True
        self._drop_prefetch()
        await self._leave_group()
        await self._connection.close()
