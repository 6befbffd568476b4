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
generation without waiting for its members (there is no JoinGroup barrier; its revocation barrier
holds a moved partition back from its next owner only until its previous one acknowledged, left,
or let its rebalance timeout pass), so poll() may adopt a generation several after its last:
a partition another member owned in a generation in between
(heartbeats answered generations g and g+2, or this member rejoined under a new member id) was
processed, and maybe committed, by that member, and is taken up again from the committed offset,
as a partition newly assigned. So is a partition whose topic id changed (the topic was deleted and
re-created under its name): the position was one in the deleted topic.

Invariant: a heartbeat's `generation_id` is the generation whose revocations are done
(`SubscriptionState.acknowledged_generation`: set once the pre-revocation auto-commit and on_revoke
ended), never merely the adopted one: the server gives the revoked partitions to their next owners
as soon as it has it (its revocation barrier), and a commit in on_revoke must land before they read
from the committed offset. A partition the heartbeats bring within the same generation (released
by its previous owner) is not `_kept`: it is newly assigned, from the committed offset.

Invariant: the membership lasts while the application polls (Kafka's max.poll.interval.ms, KIP-62).
When poll() has not been called for max_poll_interval_ms, the heartbeat task leaves the group (one
LeaveGroup) and stops, so that the other members take the partitions over from an application that
is stuck; it records the loss (`_left_on_poll_timeout`), and from then on no commit of the lost
membership is sent. The next poll() adopts the loss, as it adopts an assignment: it revokes every
partition (on_revoke: the SDK has no on_lost), then rejoins. Until the rejoin the member id and
generation stay the lost ones, which the server refuses (a transactional offset commit with this
consumer's group_metadata()). As Kafka's pollTimer: every poll() call restarts the timer, whether or
not records come back, and a poll waiting for records is polling; the timer runs only while the
heartbeat task does, from the join on (Kafka resets it when its heartbeat thread is enabled). It
runs while poll() runs the listeners, so poll() adopts again after them (a listener that outlasted
it lost the membership) before it fetches.

Invariant: a membership lost is never committed for. When the heartbeats found this member evicted
(its session timed out) and rejoined under a new member id, poll() first revokes every partition of
the lost membership (as Kafka's onPartitionsLost), during which commits are refused
(`_lost_membership`), then adopts the new membership's assignment. Revoked together with
the new assignment adopted, an on_revoke that commits (the usual place to) committed under the new
membership, which the server accepts, offsets of partitions another member may have read further
since: the group's offset went back, and those records were read twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
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
        max_poll_interval_s: float,
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
        # The join in flight (its retries included): a poll whose timeout ends first returns, and
        # the next poll waits for the same join (`_joined`).
        self._join_task: asyncio.Task | None = None
        self._commit_order = asyncio.Lock()  # FIFO: commits are sent in the order they were made
        self._heartbeat_error: TxbrokerError | None = None
        self._stopped = False
        # The poll timer (max_poll_interval_ms): when poll() last ran, and whether it is waiting for
        # records now (the timer does not run meanwhile; it restarts when the wait ends).
        self._max_poll_interval_s = max_poll_interval_s
        self._polled_at = time.monotonic()
        self._waiting_for_records = False
        # The heartbeat task left the group (poll() was not called for max_poll_interval_ms), and
        # poll() has not rejoined yet: commits are refused (`_check_not_left`).
        self._left_on_poll_timeout = False
        # The member id of the adopted assignment (the one the records poll() returns come from).
        self._adopted_member_id = NO_MEMBER
        # Why the adopted membership is lost, while poll() revokes its partitions (None: it is not).
        self._lost_membership: str | None = None

    # ---- membership

    async def _heartbeat(self) -> None:
        subscriptions = self._subscriptions
        if subscriptions.topics is None:
            raise IllegalStateError(f"a heartbeat of group {self.group_id!r} without a subscription")
        body = {
            "member_id": self.member_id,
            # Not the adopted generation: the one whose revocations are done (its on_revoke and
            # pre-revocation commits ended), after which the server gives them to their next owners.
            "generation_id": subscriptions.acknowledged_generation,
            "topics": subscriptions.topics,
            "session_timeout_ms": self._session_timeout_ms,
            # As Kafka's rebalance timeout: a partition this member does not revoke within it goes
            # to its next owner all the same (the poll timeout leaves the group by then anyway).
            "rebalance_timeout_ms": min(round(self.rebalance_timeout_s * 1000), 2**31 - 1),
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
            delay = self._heartbeat_interval_s if attempt == 0 else self._backoff.delay_s(attempt)
            if not await self._sleep_while_polled(time.monotonic() + delay):
                await self._leave_on_poll_timeout()
                return  # no heartbeat of the lost membership: poll() rejoins
            try:
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

    # ---- the poll timer (max_poll_interval_ms)

    def polled(self) -> None:
        """poll() was called: the poll timer restarts."""
        self._polled_at = time.monotonic()

    @contextlib.contextmanager
    def waiting_for_records(self) -> Iterator[None]:
        """poll()'s wait for records (a fetch's long poll, which may outlast max_poll_interval_ms)
        is polling: the timer does not run during it, and restarts when it ends."""
        self._waiting_for_records = True
        try:
            yield
        finally:
            self._waiting_for_records = False
            self.polled()

    def _poll_deadline(self, now: float) -> float:
        """When the poll timer expires, unless poll() is called before: while poll() waits for
        records, not before max_poll_interval_ms from now."""
        return (now if self._waiting_for_records else self._polled_at) + self._max_poll_interval_s

    async def _sleep_while_polled(self, until: float) -> bool:
        """Sleeps until `until` (the next heartbeat's time), or until poll() finished revoking
        partitions (a heartbeat then tells the server at once, which gives them to their next
        owners); False as soon as the poll timer expires."""
        revocations_done = self._subscriptions.revocations_done
        while True:
            now = time.monotonic()
            poll_deadline = self._poll_deadline(now)
            if now >= poll_deadline:
                return False
            if now >= until or revocations_done.is_set():
                revocations_done.clear()
                return True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(revocations_done.wait(), min(until, poll_deadline) - now)

    async def _leave_on_poll_timeout(self) -> None:
        """poll() was not called for max_poll_interval_ms: the application is stuck, or spends too
        long on what one poll returned. As Kafka's heartbeat thread ("consumer poll timeout has
        expired"), the member leaves the group, one LeaveGroup, so that the other members take its
        partitions over now, instead of never (its heartbeats would keep it in the group). Recorded
        before the LeaveGroup is sent: no commit of the lost membership is sent from then on."""
        self._left_on_poll_timeout = True
        log.warning(
            "consumer %s of group %r: poll() was not called for max_poll_interval_ms (%d ms): leaving the group, "
            "so that its other members take over its partitions (%s); the next poll() calls on_revoke for them and "
            "rejoins, and commits until then fail. The application spends too long between two polls (or is "
            "stuck): raise max_poll_interval_ms, or reduce max_poll_records or the time spent on each record",
            self.member_id,
            self.group_id,
            round(self._max_poll_interval_s * 1000),
            ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(self._subscriptions.assignment)) or "none",
        )
        try:
            await self._leave_request()
        except TxbrokerError as error:
            log.warning(
                "leaving group %r after the poll timeout: %s: the group rebalances once member %s's session times out",
                self.group_id,
                error,
                self.member_id,
            )

    async def _leave_answered(self, deadline: float | None) -> bool:
        """Whether the heartbeat task's LeaveGroup (after the poll timeout) has ended, waited for
        until `deadline`. Never cancelled here: a LeaveGroup cut short might never reach the server,
        and the member would keep its partitions, unconsumed, until its session timed out. The
        rejoin waits for it, so that the group does not rebalance twice (once for the new member,
        once for the old one's leave)."""
        task = self._heartbeat_task
        if task is None or task.done():
            return True
        await asyncio.wait([task], timeout=_time_left(deadline))
        return task.done()

    def _leave_request(self) -> Awaitable[Any]:
        return self._connection.request("POST", group_path(self.group_id, "leave"), {"member_id": self.member_id})

    @property
    def rebalance_timeout_s(self) -> float:
        """After it a partition this member has not revoked goes to its next owner all the same
        (the heartbeat's rebalance_timeout_ms: max_poll_interval_ms, as Kafka's)."""
        return self._max_poll_interval_s

    def membership_lost(self) -> bool:
        """Whether the adopted membership is lost (its commits are refused: `_check_not_left`)."""
        return self._lost_membership is not None or self._left_on_poll_timeout

    def _check_not_left(self) -> None:
        """A commit of a membership the poll timeout ended fails, unsent, as Kafka's
        CommitFailedException: its partitions may be another member's now, whose progress the
        commit would overwrite."""
        if self._lost_membership is not None:
            raise errors.UnknownMemberIdError(
                f"consumer {self._adopted_member_id} of group {self.group_id!r} (generation "
                f"{self._subscriptions.generation}) {self._lost_membership}: its partitions may be another member's "
                f"now, whose progress the commit would take back, so it was not sent. The records not committed are "
                f"read again from the group's committed offsets"
            )
        if self._left_on_poll_timeout:
            raise errors.UnknownMemberIdError(
                f"consumer {self.member_id} left group {self.group_id!r} (generation "
                f"{self._subscriptions.generation}) because poll() was not called for max_poll_interval_ms "
                f"({round(self._max_poll_interval_s * 1000)} ms): its partitions may be another member's now, so "
                f"the commit was not sent. Call poll(): it calls on_revoke and rejoins, and the records not "
                f"committed are read again from the group's committed offsets. Raise max_poll_interval_ms, or "
                f"reduce max_poll_records or the time spent on each record"
            )

    async def update_assignment(self, deadline: float | None = None) -> RebalanceEvent | None:
        """Joins if needed and adopts the latest assignment the heartbeats brought; returns what
        changed, for the caller to run the listeners on its own thread. After the poll timeout
        left the group: first every partition revoked (`_revoke_lost`), then, at the next call,
        the rejoin, once the LeaveGroup is answered, which is waited for until `deadline` (poll()'s:
        a time.monotonic() value; None: until it ends) and no longer: the poll returns without
        records, the LeaveGroup goes on, and a later poll() rejoins. The join, too, is waited for
        until `deadline` only (`_joined`): None meanwhile."""
        self.polled()
        subscriptions = self._subscriptions
        if self._left_on_poll_timeout:
            if subscriptions.assignment:  # revoked before the rejoin, as Kafka's onPartitionsLost
                return self._revoke_lost()
            if not await self._leave_answered(deadline):
                return None
            await self._stop_heartbeats()  # ended: its LeaveGroup answered, the rejoin is another member
            self._left_on_poll_timeout = False
            self.member_id, self._join_id = NO_MEMBER, None
            self._latest, self._kept = None, frozenset()
        if not self.member_id and not await self._joined(deadline):
            return None
        error, self._heartbeat_error = self._heartbeat_error, None
        if error is not None and not error.retriable:
            raise error  # e.g. GROUP_AUTHORIZATION_FAILED: heartbeats will not succeed by waiting
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self.polled()  # the timer starts with the heartbeats: a long join does not count
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        subscriptions.assignment_changed.clear()
        if self._latest is None or subscriptions.is_adopted(*self._latest):
            return None
        if subscriptions.assignment and self._adopted_member_id not in (NO_MEMBER, self.member_id):
            # Evicted, and rejoined by the heartbeats as another member: revoked as lost first.
            self._lost_membership = f"was evicted (its session timed out) and rejoined as {self.member_id}"
            return self._revoke_lost()
        generation, assignment = self._latest
        event = subscriptions.adopt(generation, assignment, kept=self._kept)
        self._adopted_member_id, self._lost_membership = self.member_id, None
        self._kept = assignment
        log.info("group %r generation %d: assigned %s", self.group_id, generation, sorted(assignment))
        return event

    async def _joined(self, deadline: float | None) -> bool:
        """Whether this consumer joined the group: the join (the first heartbeat of a membership,
        retried for default_api_timeout_ms, then TxbrokerTimeoutError) is waited for until
        `deadline` (poll()'s; None: until it ends), and no longer. As Kafka's poll(), whose timer
        ending during a join returns no record: the join goes on in the background, and the next
        poll waits for the same one (raising its error, if it failed; the poll after starts
        another). Before 2026-11-28 even poll(timeout_ms=0) waited for the whole join."""
        if self._join_task is None:
            self._join_task = asyncio.get_running_loop().create_task(
                retrying(
                    self._heartbeat,
                    what=f"joining group {self.group_id!r}",
                    timeout_s=self._api_timeout_s,
                    backoff=self._backoff,
                )
            )
        task = self._join_task
        await asyncio.wait([task], timeout=_time_left(deadline))
        if not task.done():
            return False
        self._join_task = None
        task.result()  # the join's error, raised
        return True

    async def _end_join(self, deadline: float | None) -> None:
        """Leaving with a join in flight: its answer is waited for until `deadline` (the close
        timeout; None: until the join ends, its retries bounded by default_api_timeout_ms), so that
        the membership the server made for it is left at once (`leave`), then the join is given up.
        Before 2026-11-28 it was cancelled at once: the server kept a membership whose member id
        never came back, its partitions with it, until its session timed out."""
        task, self._join_task = self._join_task, None
        if task is None:
            return
        await asyncio.wait([task], timeout=_time_left(deadline))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def _revoke_lost(self) -> RebalanceEvent:
        """Every partition of a lost membership revoked, no other assigned (Kafka's
        onPartitionsLost), after which poll() rejoins, or adopts the new membership's assignment."""
        return self._subscriptions.adopt(self._subscriptions.generation, frozenset(), kept=frozenset())

    async def leave(self, deadline: float | None = None) -> None:
        """Stops the heartbeats, then leaves the group: one LeaveGroup, whose answer is waited for
        until `deadline` (a time.monotonic() value: the consumer's close timeout), or for
        request_timeout_ms. Unanswered, the group rebalances once the member's session times out."""
        await self._end_join(deadline)
        await self._stop_heartbeats(deadline)
        if self.member_id and not self._left_on_poll_timeout:  # that one left already
            try:
                await asyncio.wait_for(self._leave_request(), _time_left(deadline))
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
        self._left_on_poll_timeout = False
        self._adopted_member_id, self._lost_membership = NO_MEMBER, None

    async def _stop_heartbeats(self, deadline: float | None = None) -> None:
        """Ends the heartbeat task: cancelled, unless it is leaving on the poll timeout, whose
        LeaveGroup is waited for (until `deadline`): cancelled, it might never reach the server,
        and the member would keep its partitions until its session timed out."""
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is None:
            return
        if not self._left_on_poll_timeout:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        with contextlib.suppress(asyncio.TimeoutError):  # not answered in time: cancelled by wait_for
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), _time_left(deadline))

    async def close(self, deadline: float | None = None) -> None:
        self._stopped = True
        await self.leave(deadline)

    # ---- offsets

    def commit_identity(self) -> tuple[str, int]:
        """A subscribed consumer's commits carry its membership (refused after a rebalance); a
        manually assigned one's are simple commits. A subscribed consumer that has not joined yet
        has no membership to commit with: refused, unsent, as Kafka's consumer fails a commit
        locally without a stable generation. Sent, it was a simple commit (no generation), which
        the server applies whoever owns the partitions: it could take back the offsets the
        group's members committed."""
        if not self._subscriptions.subscribed:
            return NO_MEMBER, NO_GENERATION
        if self._adopted_member_id == NO_MEMBER:
            raise IllegalStateError(
                f"commit of group {self.group_id!r} before this consumer joined it: it is subscribed to "
                f"{self._subscriptions.topics} but has no member id or generation yet, so the commit was not sent "
                f"(without them the server would apply it whoever owns the partitions, over the offsets of the "
                f"group's members). Call poll() first: it joins the group; commit the partitions it assigns"
            )
        return self.adopted_membership()

    def adopted_membership(self) -> tuple[str, int]:
        """The member id and generation of the adopted assignment, the one of the records poll()
        returned (group_metadata()'s, and the commits'): not the member id the heartbeats brought
        since, when they found this member evicted and rejoined, until poll() adopts it."""
        return self._adopted_member_id, self._subscriptions.generation

    def commit_body(self, entries: list[dict]) -> dict:
        """The OffsetCommit of `entries` with the membership of now, or its refusal, unsent: a lost
        membership (`_check_not_left`), or none yet (`commit_identity`). A commit's membership is
        the one of its call: commit_async() and the auto-commit take it here, at their call, for
        their task may first run after poll() adopted another membership, whose commits the server
        accepts (Kafka's commitAsync checks the generation in the call too)."""
        self._check_not_left()
        member_id, generation = self.commit_identity()
        return {"member_id": member_id, "generation_id": generation, "offsets": entries}

    async def commit(self, entries: list[dict], deadline: float | None = None) -> None:
        """`send_commit(commit_body(entries))`: a commit with the membership of now."""
        await self.send_commit(self.commit_body(entries), deadline)

    async def send_commit(self, body: dict, deadline: float | None = None) -> None:
        """Commits (a `commit_body`), one after the other in the order they were made: Kafka's
        commitAsync sends its commits in the order of the calls, and commitSync returns after the
        ones made before it. Over HTTP two commits in flight at once travel on two connections,
        and the server could apply the older one last, taking the group's offset back. Retriable
        errors are retried for the API timeout, or until `deadline` (one attempt at least)."""
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

    async def committed_positions(
        self, missing: list[TopicPartition], deadline: float
    ) -> tuple[dict[TopicPartition, int], list[TopicPartition]]:
        """The committed offsets of `missing`, as positions, waiting out pending transactional
        commits until `deadline` (fetch_stable), and the partitions without a committed offset (to
        reset); those still pending at the deadline are in neither: they wait for the next poll."""
        found, _ = await self.fetch_stable(missing, deadline)
        committed: dict[TopicPartition, int] = {}
        to_reset: list[TopicPartition] = []
        for tp, entry in found.items():
            if entry is None or entry[0] < 0:
                to_reset.append(tp)
            else:
                committed[tp] = entry[0]
        return committed, to_reset


def _time_left(deadline: float | None) -> float | None:
    """The seconds until `deadline` (a time.monotonic() value; None: no bound), for asyncio.wait_for."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _committed(answer: dict) -> Committed:
    """Each partition's committed offset and metadata, or its error, of an OffsetFetch answer."""
    found: Committed = {}
    for entry in answer["offsets"]:
        tp = TopicPartition(entry["topic"], entry["partition"])
        found[tp] = errors.from_body(entry["error"]) if entry["error"] else (entry["offset"], entry.get("metadata"))
    return found
