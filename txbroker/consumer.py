"""The consumer: group membership with server-side assignment (POST /v1/groups/{g}/heartbeat) or
manual assignment, fetch long-polls, positions, and offset commits.

`AsyncConsumer` is the one implementation; `txbroker.Consumer` runs it on a private event loop
thread (txbroker.sync), where the heartbeat task keeps the membership alive between polls, as
Kafka's heartbeat thread does. As in Kafka's and aiokafka's consumers, it is a facade over three
parts, each with its invariants in its module: what is read (txbroker.subscription_state), the
group (txbroker.consumer_coordinator: membership and offsets) and the reads (txbroker.fetcher:
fetches, the buffer of fetched records, positions).

poll() is `update_assignment()` (join, adopt the assignment the heartbeats brought) then
`fetch_records()`: two public steps, so that the synchronous Consumer runs the rebalance listeners
between them on the caller's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any

import httpx

from txbroker.connection import DEFAULT_URL, Connection
from txbroker.consumer_coordinator import ConsumerCoordinator
from txbroker.errors import IllegalStateError, TxbrokerError, TxbrokerTimeoutError
from txbroker.fetcher import OFFSET_RESETS, Fetcher
from txbroker.options import check_at_least
from txbroker.records import ConsumerGroupMetadata, ConsumerRecord, OffsetAndMetadata, TopicPartition
from txbroker.retry import Backoff, retrying
from txbroker.subscription_state import Listener, RebalanceEvent, SubscriptionState
from txbroker.wire import EARLIEST_TIMESTAMP, ISOLATION_LEVELS, LATEST_TIMESTAMP

log = logging.getLogger("txbroker.consumer")

DEFAULT_CLOSE_TIMEOUT_S = 30.0  # Kafka's consumer close() default


# The least value of each numeric option (txbroker.options); the server bounds the session timeout
# further (its group session bounds), answered at the first poll.
_OPTION_MINIMUMS = {
    "auto_commit_interval_ms": 1,
    "session_timeout_ms": 1,
    "heartbeat_interval_ms": 1,
    "max_poll_interval_ms": 1,
    "request_timeout_ms": 1,
    "retry_backoff_ms": 0,
    "retry_backoff_max_ms": 0,
    "default_api_timeout_ms": 0,
}


class AsyncConsumer:
    """An asyncio consumer; like Kafka's, not meant to be shared by concurrent tasks.

    Options (Kafka's names, in snake_case):
    - group_id: needed for subscribe(), commits and group_metadata(); None with assign() only.
    - isolation_level ("read_committed", the server's default; Kafka's is read_uncommitted).
    - auto_offset_reset ("latest"): where a partition without a committed offset starts
      ("earliest", "latest", or "none": raise NoOffsetForPartitionError).
    - enable_auto_commit (True), auto_commit_interval_ms (5000): commit positions from poll(), in
      the background (poll() does not wait for it), and at close().
      Off for consume-transform-produce: the producer's transaction commits the offsets.
    - max_poll_records (500): records per poll(); fetch_max_records (5000): records per fetch
      (the rest is buffered for the next polls); prefetch (True): fetch the next records while
      the caller processes the last ones.
    - session_timeout_ms (30000), heartbeat_interval_ms (3000, or the server's if shorter).
    - max_poll_interval_ms (300000): a member that does not call poll() for this long leaves its
      group, and its partitions go to the other members; the next poll() revokes them and rejoins.
    - request_timeout_ms (30000), default_api_timeout_ms (60000): how long calls retry retriable
      errors; retry_backoff_ms (100), retry_backoff_max_ms (1000).
    - token, headers, transport: see txbroker.connection.Connection.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        group_id: str | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | httpx.BaseTransport | None = None,
        isolation_level: str = "read_committed",
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        max_poll_records: int = 500,
        session_timeout_ms: int = 30_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        default_api_timeout_ms: int = 60_000,
        fetch_max_records: int = 5_000,
        prefetch: bool = True,
    ) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of {ISOLATION_LEVELS}, not {isolation_level!r}")
        if auto_offset_reset not in OFFSET_RESETS:
            raise ValueError(f"auto_offset_reset must be one of {sorted(OFFSET_RESETS)}, not {auto_offset_reset!r}")
        check_at_least(_OPTION_MINIMUMS, locals())  # the arguments, by name, as given
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
        self._api_timeout_s = default_api_timeout_ms / 1000
        self._backoff = Backoff(retry_backoff_ms, retry_backoff_max_ms)
        self._connection = Connection(
            url, token=token, headers=headers, transport=transport, request_timeout_ms=request_timeout_ms
        )
        self._subscriptions = SubscriptionState()
        self._coordinator = (
            None
            if group_id is None
            else ConsumerCoordinator(
                group_id,
                self._subscriptions,
                self._connection,
                self._call,
                session_timeout_ms=session_timeout_ms,
                heartbeat_interval_s=heartbeat_interval_ms / 1000,
                max_poll_interval_s=max_poll_interval_ms / 1000,
                backoff=self._backoff,
                api_timeout_s=self._api_timeout_s,
            )
        )
        self._fetcher = Fetcher(
            self._subscriptions,
            self._connection,
            self._call,
            self._coordinator,
            url=url,
            isolation_level=isolation_level,
            auto_offset_reset=auto_offset_reset,
            max_poll_records=max_poll_records,
            fetch_max_records=fetch_max_records,
            prefetch=prefetch,
            backoff=self._backoff,
        )
        self._last_auto_commit = time.monotonic()
        self._auto_commit: asyncio.Future | None = None  # the auto-commit in flight
        # The rebalance whose revoked partitions' auto-commit is in flight: its event is returned
        # (for its listeners) once the commit ended, by this poll or a later one.
        self._revocation_commit: tuple[RebalanceEvent, asyncio.Task] | None = None
        # Every such commit not ended yet, also one an unsubscribe() stopped waiting for: close()
        # gives them up (cancelled), as its own final commit, so that none is sent after it.
        self._revocation_commits: set[asyncio.Task] = set()
        self._closed = False

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")

    async def _call(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        params=None,
        deadline: float | None = None,
        answered: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The request, its retriable errors retried for default_api_timeout_ms, or only until
        `deadline` (a time.monotonic() value: poll()'s) when that comes first; one attempt at least.
        `answered(answer)`, when given, is the result: a retriable error it raises (a partition's)
        is retried too."""
        timeout_s = self._api_timeout_s
        if deadline is not None:
            timeout_s = min(timeout_s, max(0.0, deadline - time.monotonic()))

        return await retrying(
            lambda: self._connection.request(method, path, body, params=params, read=answered),
            what=what,
            timeout_s=timeout_s,
            backoff=self._backoff,
        )

    def _require_group(self, what: str) -> ConsumerCoordinator:
        if self._coordinator is None:
            raise IllegalStateError(f"{what} needs a group_id")
        return self._coordinator

    # ---- subscription and assignment

    def subscribe(
        self, topics: Iterable[str], on_assign: Listener | None = None, on_revoke: Listener | None = None
    ) -> None:
        """Joins the group (at the next poll) for these topics; the server assigns the partitions.
        on_revoke(partitions) / on_assign(partitions) run inside poll() when the assignment changes,
        and on_revoke(every assigned partition) in close() and unsubscribe(), before leaving."""
        self._check_open()
        if self.group_id is None:
            raise IllegalStateError("subscribe() needs a group_id (or use assign())")
        topics = sorted(set([topics] if isinstance(topics, str) else topics))
        if not topics:
            raise ValueError("subscribe() needs at least one topic (unsubscribe() to stop)")
        self._subscriptions.subscribe(topics, on_assign, on_revoke)

    def subscription(self) -> set[str]:
        return set(self._subscriptions.topics or ())

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manual assignment: no group membership (commits, if group_id is set, are simple ones)."""
        self._check_open()
        self._subscriptions.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscriptions.assignment)

    async def unsubscribe(self) -> None:
        """Leaves the group (it rebalances at once) and drops the subscription, or the manual
        assignment. A subscribed consumer first runs on_revoke(every assigned partition), as
        Kafka's does when it leaves its group, so the application commits its work once more while
        it owns them; the group is left even when the listener raises, whose error is then raised.
        Called from on_revoke, the partitions it is revoking are not revoked again (see
        `revoked_on_leave`)."""
        await self._revoking_then(self.revoked_on_leave(), self.leave_group())

    def revoked_on_leave(self) -> RebalanceEvent | None:
        """What leaving the group revokes (Kafka's onLeavePrepare): every partition of a subscribed
        consumer's assignment, for on_revoke to run before unsubscribe() and close() leave. The
        synchronous Consumer runs it on its caller's thread, as it runs poll()'s listeners.

        Kafka calls onPartitionsLost instead when the membership was already lost (whose default is
        onPartitionsRevoked): the SDK's listeners have no on_lost, here as in poll(), so on_revoke
        it is; a commit in it is then refused (ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID).

        Partitions whose on_revoke is running (it called unsubscribe() or close()) are left out, as
        Kafka's consumer does not call the listener again for partitions it is revoking: before
        2026-11-28 on_revoke ran again, inside itself, for them."""
        subscriptions = self._subscriptions
        if self._closed or not subscriptions.subscribed:
            return None
        # A rebalance's revoked partitions whose on_revoke has not run (its auto-commit is in flight)
        not_yet = frozenset() if self._revocation_commit is None else frozenset(self._revocation_commit[0].revoked)
        leaving = subscriptions.revoke_on_leave(not_yet)
        return RebalanceEvent(leaving, set(), subscriptions.on_revoke, None) if leaving else None

    async def _revoking_then(self, event: RebalanceEvent | None, then: Awaitable[None]) -> None:
        """Runs the leave's listener, then `then` (leaving), even when the listener raised."""
        try:
            if event is not None:
                await self._run_listeners(event)
        finally:
            await then

    async def leave_group(self) -> None:
        """unsubscribe()'s second step, after the listener: leaves the group, drops the assignment."""
        self._revocation_commit = None  # its partitions were revoked with the others (revoked_on_leave)
        if self._coordinator is not None:
            await self._coordinator.leave()
        self._fetcher.forget(set(self._subscriptions.assignment))
        self._subscriptions.unsubscribe()

    def group_metadata(self) -> ConsumerGroupMetadata:
        """For Producer.send_offsets_to_transaction: the group, and the generation and member id of
        the assignment of the records last returned by poll()."""
        coordinator = self._require_group("group_metadata()")
        member_id, generation = coordinator.adopted_membership()
        return ConsumerGroupMetadata(coordinator.group_id, generation, member_id)

    async def update_assignment(self, deadline: float | None = None) -> RebalanceEvent | None:
        """poll()'s first step: joins the group if needed and adopts the latest assignment the
        heartbeats brought. Returns what changed (None: nothing), whose listeners the caller runs
        before `fetch_records()` -- the synchronous Consumer on its own thread. `deadline`
        (poll()'s, a time.monotonic() value) bounds the wait for the join, and for the LeaveGroup of
        a membership the poll timeout ended, before the rejoin (see
        ConsumerCoordinator.update_assignment)."""
        self._check_open()
        if not self._subscriptions.subscribed:
            if not self._subscriptions.assignment:
                raise IllegalStateError("poll() needs subscribe() or assign() first")
            return None
        coordinator = self._require_group("subscribe()")
        if self._revocation_commit is None:
            positions = self._subscriptions.assigned_positions()  # the adoption drops the revoked ones'
            event = await coordinator.update_assignment(deadline)
            if event is None:
                return None
            self._fetcher.forget(event.revoked)
            commit = self._auto_commit_revoked(
                coordinator, {tp: positions[tp] for tp in event.revoked if tp in positions}
            )
            if commit is None:
                return event
            self._revocation_commit = (event, commit)
        else:
            coordinator.polled()  # a poll waiting for the commit is polling (max_poll_interval_ms)
        event, commit = self._revocation_commit
        if not commit.done() and not self._subscriptions.assignment_changed.is_set():
            # The partitions the rebalance keeps are read meanwhile (fetch_records(): the revoked
            # ones are `revoking`, never fetched), as Kafka's consumer goes on fetching its owned
            # partitions during a cooperative rebalance; the commit's end wakes that fetch. Before
            # 2026-11-28 the poll waited for the commit until its deadline and returned no record.
            return None
        # The heartbeats brought news meanwhile (another assignment, a membership lost): nothing is
        # read until the commit ended and its listeners ran, so that the news is adopted first.
        await asyncio.wait([commit], timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        if not commit.done():
            return None
        self._revocation_commit = None
        return event

    def _auto_commit_revoked(
        self, coordinator: ConsumerCoordinator, positions: dict[TopicPartition, int]
    ) -> asyncio.Task | None:
        """With auto-commit, the positions of the partitions a rebalance revokes are committed
        before on_revoke runs and they leave the assignment, as Kafka's consumer commits before it
        revokes (the classic one's onJoinPrepare, KIP-848's autoCommitSyncBeforeRevocation): else
        their next owner reads again what poll() handed out since the last auto-commit. Not for a
        lost membership, whose commits are refused unsent (Kafka's onPartitionsLost commits
        nothing). Returns the commit in flight (None: none), which the polls do not wait for while
        nothing else changed: they read the partitions the rebalance keeps meanwhile, and the first
        after it ended runs on_revoke (see update_assignment(); before 2026-11-28 poll() waited for
        it until its deadline, even poll(timeout_ms=0) at first). Retriable errors are retried for
        default_api_timeout_ms, or max_poll_interval_ms (the rebalance timeout, as Kafka's
        joinPrepareTimer) when shorter. A failure is logged, and the rebalance goes on without it,
        as Kafka's: the next owner reads again from the committed offset (at least once)."""
        if not self.enable_auto_commit or not positions or coordinator.membership_lost():
            return None
        try:  # the membership of the adoption, taken now
            body = coordinator.commit_body(self._offsets_body(positions))
        except TxbrokerError as error:
            self._log_revocation_commit_failed(positions, error)
            return None
        deadline = time.monotonic() + coordinator.rebalance_timeout_s
        task = asyncio.ensure_future(self._commit_before_revoking(coordinator, body, positions, deadline))
        self._revocation_commits.add(task)
        task.add_done_callback(self._revocation_commits.discard)
        task.add_done_callback(self._revocation_commit_ended)
        return task

    def _revocation_commit_ended(self, commit: asyncio.Task) -> None:
        """A poll reading the kept partitions meanwhile returns early, for the next one to run
        on_revoke now (not when the commit was given up: closed, unsubscribed)."""
        if self._revocation_commit is not None and self._revocation_commit[1] is commit:
            self._subscriptions.assignment_changed.set()

    async def _commit_before_revoking(
        self, coordinator: ConsumerCoordinator, body: dict, positions: dict[TopicPartition, int], deadline: float
    ) -> None:
        try:
            await coordinator.send_commit(body, deadline)
        except TxbrokerError as error:
            self._log_revocation_commit_failed(positions, error)

    def _log_revocation_commit_failed(self, positions: dict[TopicPartition, int], error: TxbrokerError) -> None:
        log.warning(
            "auto-commit of group %r before revoking %s failed: %s (revoked without it: their next owner reads "
            "again from the committed offsets)",
            self.group_id,
            sorted(positions),
            error,
        )

    async def _run_listeners(self, event: RebalanceEvent) -> bool:
        """on_revoke, while the revoked partitions are still assigned (it may commit their
        positions, seek, ask position()); then they leave the assignment, even when it raised; then
        on_assign, also when on_revoke raised, as Kafka's onJoinComplete: the first error is raised
        after both (else the partitions assigned were read without their on_assign ever running).
        False when on_revoke closed the consumer or unsubscribed (`released`): no on_assign then."""
        revoke_error = None
        try:
            await _called(event.revoke_call())
        except Exception as error:
            revoke_error = error
        finally:
            reading = self.released(event)
        try:
            if reading:
                await _called(event.assign_call())
        finally:
            if revoke_error is not None:
                raise revoke_error
        return reading

    def released(self, event: RebalanceEvent) -> bool:
        """The event's revoked partitions leave the assignment (`release_revoked`), after its
        on_revoke. Whether the consumer still reads its assignment: not when the listener closed
        it or unsubscribed, whose partitions are gone, and whose on_assign is then not called."""
        event.release_revoked()
        return not self._closed and self._subscriptions.subscribed

    # ---- positions

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record poll() returns for an assigned partition. A partition
        without one starts at its committed offset (auto_offset_reset without); while a transaction
        commits an offset for it, that offset is not known yet: waited for up to
        default_api_timeout_ms, then TxbrokerTimeoutError (Kafka's position() times out alike)."""
        tp = self._subscriptions.require_assigned(partition, "position()")
        if tp not in self._subscriptions.positions:
            await self._fetcher.initialize_positions(time.monotonic() + self._api_timeout_s)
        position = self._subscriptions.positions.get(tp)
        if position is None:
            raise TxbrokerTimeoutError(
                f"position({tp.topic!r}, {tp.partition}): group {self.group_id!r} has an offset of it pending in an "
                f"open transaction (UNSTABLE_OFFSET_COMMIT) for default_api_timeout_ms "
                f"({self._api_timeout_s * 1000:.0f}): the position is that offset once the transaction ends; call "
                f"position() again later (the server aborts a transaction left open after its timeout)"
            )
        return position

    def seek(self, partition: TopicPartition, offset: int) -> None:
        tp = self._subscriptions.require_assigned(partition, "seek()")
        if offset < 0:
            raise ValueError(f"seek(): offset must be >= 0, not {offset}")
        self._subscriptions.positions[tp] = offset

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._subscriptions.positions.update(
            await self._fetcher.list_offsets(self._subscriptions.seekable(partitions), EARLIEST_TIMESTAMP)
        )

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """To the end: the LSO under read_committed, the high watermark under read_uncommitted."""
        self._subscriptions.positions.update(
            await self._fetcher.list_offsets(self._subscriptions.seekable(partitions), LATEST_TIMESTAMP)
        )

    async def seek_to_committed(self, *partitions: TopicPartition) -> None:
        """Back to the committed offsets (auto_offset_reset where none): after abort_transaction(),
        so the records of the aborted transaction are processed again."""
        for tp in self._subscriptions.seekable(partitions):
            self._subscriptions.positions.pop(tp, None)
        await self._fetcher.initialize_positions(time.monotonic() + self._api_timeout_s)

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._fetcher.list_offsets([TopicPartition(*tp) for tp in partitions], EARLIEST_TIMESTAMP)

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._fetcher.list_offsets([TopicPartition(*tp) for tp in partitions], LATEST_TIMESTAMP)

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The first offset whose timestamp is at or after each time (-1: none)."""
        found = {}
        for tp, timestamp in timestamps.items():
            found.update(await self._fetcher.list_offsets([TopicPartition(*tp)], timestamp))
        return found

    def pause(self, *partitions: TopicPartition) -> None:
        self._subscriptions.paused.update([self._subscriptions.require_assigned(tp, "pause()") for tp in partitions])

    def resume(self, *partitions: TopicPartition) -> None:
        self._subscriptions.paused.difference_update(TopicPartition(*tp) for tp in partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._subscriptions.paused)

    # ---- fetching

    async def poll(self, timeout_ms: int = 0) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to `timeout_ms` for some (the fetch
        long-poll). Runs the rebalance listeners when the assignment changed. Whatever the server
        does, it returns about in time (a fetch's answer is waited for half a second past it), as
        Kafka's poll(). Joining the group (before the first assignment, or after the poll timeout
        left it: max_poll_interval_ms) goes on past a poll whose timeout ends first, which returns
        no record: the next poll waits for the same join, which retries for default_api_timeout_ms
        and then fails (a poll raises its TxbrokerTimeoutError; the next one joins again). The
        auto-commit before a rebalance's on_revoke goes on past polls too, which meanwhile return
        the records of the partitions the rebalance keeps (`_auto_commit_revoked`). After the
        listeners it adopts again what changed while they ran, as Kafka's joinGroupIfNeeded loops:
        a listener that outlasted max_poll_interval_ms lost the membership, whose records must not
        be handed out (another member has its partitions)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            event = await self.update_assignment(deadline)
            if event is not None:
                if not await self._run_listeners(event):
                    return []  # a listener closed the consumer or unsubscribed: nothing to read
                continue  # what changed while they ran (a membership lost: rejoined) before fetching
            records = await self.fetch_records(deadline)
            if records or time.monotonic() >= deadline:
                return records

    async def fetch_records(self, deadline: float) -> list[ConsumerRecord]:
        """poll()'s second step: starts an auto-commit when due, then buffered records, else one
        fetch long-polling until `deadline` (a time.monotonic() value); [] early when the assignment
        changes meanwhile. Waits for no request past the deadline (see txbroker.fetcher)."""
        self._maybe_auto_commit()
        coordinator = self._coordinator
        with contextlib.nullcontext() if coordinator is None else coordinator.waiting_for_records():
            return await self._fetcher.fetch(deadline)

    # ---- commits

    def offsets_to_commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
    ) -> dict[TopicPartition, int]:
        """What commit(offsets) commits, as {partition: offset}: `offsets`, or the positions of every
        assigned partition (for commit_async's callback)."""
        return {TopicPartition(e["topic"], e["partition"]): e["offset"] for e in self._offsets_body(offsets)}

    def _offsets_body(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None) -> list[dict]:
        if offsets is None:
            offsets = self._subscriptions.assigned_positions()
        entries = []
        for tp, offset in offsets.items():
            offset, metadata = (
                (offset.offset, offset.metadata) if isinstance(offset, OffsetAndMetadata) else (offset, None)
            )
            entries.append({"topic": tp[0], "partition": tp[1], "offset": int(offset), "metadata": metadata})
        return entries

    async def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None) -> None:
        """Commits `offsets` (the next offset to read, per partition), or the positions of every
        assigned partition. A subscribed consumer's commit carries its generation: after a
        rebalance it is refused (IllegalGenerationError / UnknownMemberIdError); before its first
        join it is refused unsent (IllegalStateError: poll() first)."""
        await self.start_commit(offsets)

    def start_commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
    ) -> Coroutine[Any, Any, None]:
        """commit(offsets) with the membership of now (see ConsumerCoordinator.commit): what to
        await. commit_async() (and the synchronous Consumer's) call it at once, so that poll()
        adopting another membership before the commit is sent cannot change whose commit it is."""
        try:
            self._check_open()
            coordinator = self._require_group("commit()")
            entries = self._offsets_body(offsets)
            body = coordinator.commit_body(entries) if entries else None
        except TxbrokerError as error:
            body = error
        return self._send_commit(body)

    async def _send_commit(self, body: dict | TxbrokerError | None) -> None:
        """Sends a commit_body (None: nothing to commit), or raises its refusal, when awaited."""
        if isinstance(body, TxbrokerError):
            raise body
        if body is not None:
            await self._require_group("commit()").send_commit(body)
            self._last_auto_commit = time.monotonic()

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        callback: Callable[[dict, BaseException | None], Any] | None = None,
    ) -> asyncio.Future:
        """commit() in the background; `callback(offsets, error)` runs when it is done. Commits are
        sent one after the other in the order they were made (commit() waits for the ones before
        it), so the group's offset is always the last one committed. The commit carries the
        membership of the call (`start_commit`), whenever its task first runs."""
        entries = self.offsets_to_commit(offsets)  # for the callback; the commit keeps each metadata
        task = asyncio.ensure_future(self.start_commit(offsets))
        if callback is not None:
            task.add_done_callback(lambda t: callback(entries, None if t.cancelled() else t.exception()))
        return task

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None: none). A read_committed consumer waits for an offset
        a transaction is committing, up to default_api_timeout_ms, then TxbrokerTimeoutError, as
        Kafka's consumer asks with require_stable under read_committed (KIP-447): an application that
        seeks to what this answers then never goes back behind an offset its last transaction
        committed. Before, it answered the offset before it. read_uncommitted: pending ones are not
        visible."""
        coordinator = self._require_group("committed()")
        wanted = [TopicPartition(*tp) for tp in partitions]
        if self.isolation_level == "read_committed":
            found, pending = await coordinator.fetch_stable(wanted, time.monotonic() + self._api_timeout_s)
            if pending:
                named = ", ".join(f"{tp.topic}-{tp.partition}" for tp in pending)
                raise TxbrokerTimeoutError(
                    f"committed(): group {self.group_id!r} has offsets of {named} pending "
                    f"in an open transaction (UNSTABLE_OFFSET_COMMIT) for default_api_timeout_ms "
                    f"({self._api_timeout_s * 1000:.0f}): they are known once the transaction ends; call "
                    f"committed() again later (the server aborts a transaction left open after its timeout)"
                )
        else:
            found = await coordinator.fetch_committed(wanted, require_stable=False)
        result: dict[TopicPartition, int | None] = {}
        for tp in wanted:
            entry = found.get(tp)
            if isinstance(entry, TxbrokerError):
                raise entry
            result[tp] = None if entry is None or entry[0] < 0 else entry[0]
        return result

    def _maybe_auto_commit(self) -> None:
        """When auto-commit is due, commits the positions (what poll() handed out) in the
        background, one attempt: poll() never waits for it, as Kafka's auto-commit in poll() is
        asynchronous (before, a server down kept poll() retrying the commit for
        default_api_timeout_ms). One at a time; a retriable failure is tried again after the
        backoff, with the positions of then."""
        if not self.enable_auto_commit or (self._auto_commit is not None and not self._auto_commit.done()):
            return
        now = time.monotonic()
        if now - self._last_auto_commit < self._auto_commit_interval_s:
            return
        self._last_auto_commit = now
        entries = self._offsets_body(None)
        if not entries:
            return
        try:  # the membership of these positions, whenever the task first runs
            body: dict | TxbrokerError = self._require_group("auto-commit").commit_body(entries)
        except TxbrokerError as error:
            body = error  # refused unsent: logged as a failed one
        self._auto_commit = asyncio.ensure_future(self._auto_commit_positions(body, deadline=now))

    async def _auto_commit_positions(self, body: dict | TxbrokerError, deadline: float) -> None:
        try:
            if isinstance(body, TxbrokerError):
                raise body
            await self._require_group("auto-commit").send_commit(body, deadline)
        except TxbrokerError as error:
            log.warning("auto-commit of group %r failed: %s", self.group_id, error)
            if error.retriable:
                self._last_auto_commit = (
                    time.monotonic() - self._auto_commit_interval_s + self._backoff.delay_s(0, error)
                )

    # ---- closing

    async def close(self, timeout: float | None = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Commits the positions (with enable_auto_commit), runs on_revoke(every assigned partition)
        as unsubscribe() does, leaves the group (it rebalances at once) and closes, within `timeout`
        seconds (None: no bound), as Kafka's close(Duration), whose default is 30 s too: a step the
        server does not answer in time (a commit, the leave) is given up, logged, and the consumer
        closes all the same. The listener is the application's code: its time counts, but it is not
        cut short. Its error is raised once the consumer is closed."""
        deadline = close_deadline(timeout)
        await self._revoking_then(await self.prepare_close(deadline), self.finish_close(deadline))

    async def prepare_close(self, deadline: float | None) -> RebalanceEvent | None:
        """close()'s first step: the final auto-commit, until `deadline` (a time.monotonic() value;
        None: none). Returns what leaving revokes, whose listener the caller runs before
        `finish_close()`, as `update_assignment()`'s event before `fetch_records()`."""
        if self._closed:
            return None
        if self._auto_commit is not None:  # its one attempt ends before the final commit is sent
            await self._within(deadline, self._auto_commit, "the auto-commit in flight")
        if self.enable_auto_commit and self._subscriptions.assignment:
            entries = self._offsets_body(None)
            commit = self._require_group("auto-commit").commit(entries, deadline=deadline)
            await self._within(deadline, commit, "the final auto-commit")
        return self.revoked_on_leave()

    async def finish_close(self, deadline: float | None) -> None:
        """close()'s last step, after the listener: leaves the group (until `deadline`), closes."""
        if self._closed:
            return
        self._closed = True
        self._revocation_commit = None
        # Ended by now (the final commit waited behind them), or given up as the final commit
        # was when the close timeout ended first: before 2026-11-28 one went on, and sent its
        # OffsetCommit after close() returned (or was destroyed pending with the sync Consumer's loop).
        unfinished = list(self._revocation_commits)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        self._fetcher.drop_prefetch()
        if self._coordinator is not None:
            await self._coordinator.close(deadline)  # the heartbeats stop whatever the time left
        await self._connection.close()

    async def _within(self, deadline: float | None, step: Awaitable[Any], what: str) -> None:
        """A step of close(), given until the close timeout's `deadline`: one that fails or is not
        done by then (it is cancelled) is logged, and close() goes on without it, as Kafka's."""
        try:
            await asyncio.wait_for(step, None if deadline is None else max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            log.warning(
                "closing the consumer of group %r: %s did not end within the close timeout: closing without it",
                self.group_id,
                what,
            )
        except TxbrokerError as error:
            log.warning("closing the consumer of group %r: %s failed: %s", self.group_id, what, error)
        except Exception:  # not the SDK's error: a bug, or an answer without the contract's fields
            log.exception("closing the consumer of group %r: %s failed unexpectedly", self.group_id, what)


async def _called(call: tuple[Listener, set[TopicPartition]] | None) -> None:
    """A rebalance listener called (None: none), awaited when it is a coroutine function."""
    if call is not None:
        listener, partitions = call
        result = listener(partitions)
        if isinstance(result, Awaitable):
            await result


def close_deadline(timeout: float | None) -> float | None:
    """The time.monotonic() by which close(timeout) ends (None: no bound)."""
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError(f"close(timeout): the timeout must be >= 0 seconds (or None: no bound), not {timeout}")
    return time.monotonic() + timeout
