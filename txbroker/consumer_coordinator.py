"""A consumer's side of its group (Kafka's ConsumerCoordinator): membership through the one heartbeat
endpoint (POST /v1/groups/{g}/heartbeat joins, keeps alive and answers the generation and this
member's assignment, computed by the server), leaving, and the group's offsets (OffsetCommit,
OffsetFetch).

Invariant: the heartbeat task only records what the server answered (`latest`); poll() adopts it
(`update_assignment`). So the assignment, and the generation `group_metadata()` reports, are those
of the records poll() returned: a transactional offset commit for records of a revoked partition
carries the old generation and is refused (KIP-447), instead of committing for a partition someone
else owns.

Invariant: a partition keeps its position (and its buffered records) across an adoption only if
every generation since the adopted one assigned it to this member (`_kept`). The server bumps the
generation without waiting for its members (there is no JoinGroup barrier), so poll() may adopt a
generation several after its last: a partition another member owned in a generation in between
(heartbeats answered generations g and g+2, or this member rejoined under a new member id) was
processed, and maybe committed, by that member, and is taken up again from the committed offset,
as a partition newly assigned. So is a partition whose topic id changed (the topic was deleted and
re-created under its name): the position was one in the deleted topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from txbroker import errors
from txbroker.connection import Connection
from txbroker.errors import IllegalStateError, TxbrokerError
from txbroker.records import TopicPartition, offset_errors
from txbroker.retry import Backoff, retrying
from txbroker.subscription_state import RebalanceEvent, SubscriptionState
from txbroker.wire import NO_GENERATION, NO_MEMBER

log = logging.getLogger("txbroker.consumer")

# (what, method, path, body, deadline=None): retried until the API timeout, or the deadline before it
Call = Callable[..., Awaitable[Any]]
Committed = dict[TopicPartition, tuple[int, str | None] | TxbrokerError]


def group_path(group_id: str, action: str = "") -> str:
    return f"/v1/groups/{quote(group_id, safe='')}" + (f"/{action}" if action else "")


class ConsumerCoordinator:
    def __init__(
        self,
        group_id: str,
        subscriptions: SubscriptionState,
        connection: Connection,
        call: Call,
        *,
        session_timeout_ms: int,
        heartbeat_interval_s: float,
        backoff: Backoff,
        api_timeout_s: float,
    ) -> None:
        self.group_id = group_id
        self.member_id = NO_MEMBER
        # The join under way (None: none): sent with every attempt of it, so that one whose answer
        # was lost and the attempt after it join as one member, not two (the first would hold its
        # partitions, unconsumed, until its session timed out).
        self._join_id: str | None = None
        self._subscriptions = subscriptions
        self._connection = connection
        self._call = call
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_s = heartbeat_interval_s
        self._backoff = backoff
        self._api_timeout_s = api_timeout_s
        self._latest: tuple[int, frozenset[TopicPartition]] | None = None  # from the last heartbeat
        # The partitions of the adopted assignment that every generation answered since (without a
        # gap: each the previous one or the next) assigned to this member too, and the generation
        # of the last answer.
        self._kept: frozenset[TopicPartition] = frozenset()
        self._answered_generation = NO_GENERATION
        self._answered_topic_ids: dict[str, str | None] = {}
        self._heartbeat_task: asyncio.Task | None = None
        self._commit_order = asyncio.Lock()  # FIFO: commits are sent in the order they were made
        self._heartbeat_error: TxbrokerError | None = None
        self._stopped = False

    # ---- membership

    async def _heartbeat(self) -> None:
        subscriptions = self._subscriptions
        if subscriptions.topics is None:
            raise IllegalStateError(f"a heartbeat of group {self.group_id!r} without a subscription")
        body = {
            "member_id": self.member_id,
            "generation_id": subscriptions.generation,
            "topics": subscriptions.topics,
            "session_timeout_ms": self._session_timeout_ms,
        }
        if self.member_id == NO_MEMBER:
            body["join_id"] = self._joining()
        try:
            answer = await self._connection.request("POST", group_path(self.group_id, "heartbeat"), body)
        except errors.UnknownMemberIdError:
            log.warning(
                "consumer %s was evicted from group %r (session timeout?): rejoining", self.member_id, self.group_id
            )
            body["member_id"], body["join_id"] = NO_MEMBER, self._joining()
            answer = await self._connection.request("POST", group_path(self.group_id, "heartbeat"), body)
        self._join_id = None  # joined, or was a member already: the next join is another
        assignment = frozenset(TopicPartition(a["topic"], p) for a in answer["assignment"] for p in a["partitions"])
        topic_ids = {a["topic"]: a.get("topic_id") for a in answer["assignment"]}
        generation = answer["generation_id"]
        if answer["member_id"] == self.member_id and generation - self._answered_generation in (0, 1):
            self._kept = frozenset(
                tp for tp in self._kept & assignment if topic_ids[tp.topic] == self._answered_topic_ids[tp.topic]
            )
        else:  # a generation not seen, or a new membership: any partition may have had another owner since
            self._kept = frozenset()
        self._answered_generation, self._answered_topic_ids = generation, topic_ids
        self.member_id = answer["member_id"]
        server_interval = answer.get("heartbeat_interval_ms")
        if server_interval:
            self._heartbeat_interval_s = min(self._heartbeat_interval_s, server_interval / 1000)
        latest = (generation, assignment)
        if latest != self._latest:
            self._latest = latest
            if not subscriptions.is_adopted(*latest):
                subscriptions.assignment_changed.set()

    def _joining(self) -> str:
        """The join_id of the join under way, or of a new one."""
        if self._join_id is None:
            self._join_id = uuid.uuid4().hex
        return self._join_id

    async def _heartbeat_loop(self) -> None:
        attempt = 0
        while self._subscriptions.subscribed and not self._stopped:
            try:
                await asyncio.sleep(self._heartbeat_interval_s if attempt == 0 else self._backoff.delay_s(attempt))
                await self._heartbeat()
                attempt, self._heartbeat_error = 0, None
            except asyncio.CancelledError:
                raise
            except TxbrokerError as error:  # an answer without the contract's fields too: retried
                self._heartbeat_error = error
                attempt += 1
                log.warning("heartbeat of group %r failed: %s", self.group_id, error)
            except Exception:
                # Not the SDK's error (a bug): the task must not end on it, silently, and leave the
                # membership to lapse until the next poll() starts heartbeats again.
                attempt += 1
                log.exception("heartbeat of group %r failed unexpectedly", self.group_id)

    async def update_assignment(self) -> RebalanceEvent | None:
        """Joins if needed and adopts the latest assignment the heartbeats brought; returns what
        changed, for the caller to run the listeners on its own thread."""
        if not self.member_id:
            await retrying(
                self._heartbeat,
                what=f"joining group {self.group_id!r}",
                timeout_s=self._api_timeout_s,
                backoff=self._backoff,
            )
        error, self._heartbeat_error = self._heartbeat_error, None
        if error is not None and not error.retriable:
            raise error  # e.g. GROUP_AUTHORIZATION_FAILED: heartbeats will not succeed by waiting
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        subscriptions = self._subscriptions
        subscriptions.assignment_changed.clear()
        if self._latest is None or subscriptions.is_adopted(*self._latest):
            return None
        event = subscriptions.adopt(*self._latest, kept=self._kept)
        self._kept = subscriptions.assignment
        log.info(
            "group %r generation %d: assigned %s",
            self.group_id,
            subscriptions.generation,
            sorted(subscriptions.assignment),
        )
        return event

    async def leave(self, deadline: float | None = None) -> None:
        """Stops the heartbeats, then leaves the group: one LeaveGroup, whose answer is waited for
        until `deadline` (a time.monotonic() value: the consumer's close timeout), or for
        request_timeout_ms. Unanswered, the group rebalances once the member's session times out."""
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            await asyncio.gather(self._heartbeat_task, return_exceptions=True)
            self._heartbeat_task = None
        if self.member_id:
            leave = self._connection.request("POST", group_path(self.group_id, "leave"), {"member_id": self.member_id})
            try:
                await asyncio.wait_for(leave, None if deadline is None else max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                log.warning(
                    "leaving group %r: no answer within the close timeout: the group rebalances once member %s's "
                    "session times out",
                    self.group_id,
                    self.member_id,
                )
            except TxbrokerError as error:
                log.info("leaving group %r: %s", self.group_id, error)
        self.member_id, self._join_id = NO_MEMBER, None
        self._latest = None
        self._kept = frozenset()

    async def close(self, deadline: float | None = None) -> None:
        self._stopped = True
        await self.leave(deadline)

    # ---- offsets

    def commit_identity(self) -> tuple[str, int]:
        """A subscribed consumer's commits carry its membership (refused after a rebalance); a
        manually assigned one's are simple commits."""
        if self._subscriptions.subscribed:
            return self.member_id, self._subscriptions.generation
        return NO_MEMBER, NO_GENERATION

    async def commit(self, entries: list[dict], deadline: float | None = None) -> None:
        """Commits, one after the other in the order they were made: Kafka's commitAsync sends its
        commits in the order of the calls, and commitSync returns after the ones made before it.
        Over HTTP two commits in flight at once travel on two connections, and the server could
        apply the older one last, taking the group's offset back. The membership is the one of the
        call, whenever the commit is sent. Retriable errors are retried for the API timeout, or
        until `deadline` (one attempt at least)."""
        member_id, generation = self.commit_identity()
        body = {"member_id": member_id, "generation_id": generation, "offsets": entries}
        async with self._commit_order:
            entry_errors = await self._call(
                f"OffsetCommit({self.group_id})",
                "POST",
                group_path(self.group_id, "offsets/commit"),
                body,
                deadline=deadline,
                answered=offset_errors,
            )
        for entry_error in entry_errors:
            if entry_error is not None:
                raise errors.from_body(entry_error)

    async def fetch_committed(
        self, partitions: list[TopicPartition], require_stable: bool, deadline: float | None = None
    ) -> Committed:
        return await self._call(
            f"OffsetFetch({self.group_id})",
            "POST",
            group_path(self.group_id, "offsets/fetch"),
            {
                "partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in partitions],
                "require_stable": require_stable,
            },
            deadline=deadline,
            answered=_committed,
        )

    async def fetch_stable(
        self, partitions: list[TopicPartition], deadline: float
    ) -> tuple[Committed, list[TopicPartition]]:
        """The committed offsets of `partitions`, read with require_stable: an offset a transaction
        is committing (UNSTABLE_OFFSET_COMMIT, retriable) is asked again with backoff until `deadline`,
        as Kafka's consumer does for read_committed (KIP-447). Returns what was found (a
        non-retriable error raised) and the partitions still pending at the deadline."""
        found: Committed = {}
        attempt = 0
        while partitions:
            committed = await self.fetch_committed(partitions, require_stable=True, deadline=deadline)
            unstable = []
            for tp in partitions:
                entry = committed.get(tp)
                if isinstance(entry, TxbrokerError):
                    if not entry.retriable:
                        raise entry
                    unstable.append(tp)
                else:
                    found[tp] = entry
            partitions = unstable
            if partitions:
                delay = self._backoff.delay_s(attempt)
                if time.monotonic() + delay > deadline:
                    break
                attempt += 1
                await asyncio.sleep(delay)
        return found, partitions

    async def position_from_committed(self, missing: list[TopicPartition], deadline: float) -> list[TopicPartition]:
        """Sets the positions of `missing` to their committed offsets, waiting out pending
        transactional commits until `deadline` (fetch_stable). Returns the partitions without a
        committed offset (to reset); those still pending at the deadline get no position: they wait
        for the next poll."""
        found, _ = await self.fetch_stable(missing, deadline)
        to_reset: list[TopicPartition] = []
        for tp, entry in found.items():
            if entry is None or entry[0] < 0:
                to_reset.append(tp)
            else:
                self._subscriptions.positions[tp] = entry[0]
        return to_reset


def _committed(answer: dict) -> Committed:
    """Each partition's committed offset and metadata, or its error, of an OffsetFetch answer."""
    found: Committed = {}
    for entry in answer["offsets"]:
        tp = TopicPartition(entry["topic"], entry["partition"])
        found[tp] = errors.from_body(entry["error"]) if entry["error"] else (entry["offset"], entry.get("metadata"))
    return found
