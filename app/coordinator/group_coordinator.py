"""The group coordinator: membership with server-side range assignment (one heartbeat endpoint
instead of Join/Sync/Heartbeat), offset commits plain and transactional, and session expiry.

Invariants:
- Membership changes lock the group's row; every change (join, leave, topics changed, session
  expired) bumps the generation and recomputes the assignment in the same PostgreSQL transaction.
- Commits that name a generation are checked against the group's current one (KIP-447: a zombie
  consumer's commits, plain or transactional, are refused), holding the group row FOR SHARE so a
  rebalance cannot slip in between the check and the commit.
- Lock order: transactional id row -> group row -> the committed topics' rows (FOR KEY SHARE, so
  a DeleteTopics, which removes the topic's offsets, never interleaves) -> __consumer_offsets
  partition -> offsets rows -> __transaction_state (the coordinator's own order, with the group
  row and the topics in between). DeleteTopics locks its topic's row first. A commit
  makes sure the group row exists and holds it FOR KEY SHARE (`groups.hold`) before it locks
  anything else; DeleteGroups and OffsetDelete lock the group row FOR UPDATE, then the topics of
  the offsets they delete FOR KEY SHARE (as a commit), then the group's __consumer_offsets partition
  (their tombstones), so they wait for the commits in flight and none interleaves. A commit with
  require_advance locks the __consumer_offsets partition (in its place in the order) before it reads
  the committed offsets it checks, and holds it to its write: no commit of the group comes between.
- Every operation on a group id checks it first (`check_group_id`: INVALID_GROUP_ID over the
  identifier limit), look-ups too, as Kafka's coordinator validates the group id of every group
  API: an id no group can have never reaches a statement, nor a write. The empty id too where
  Kafka's coordinator refuses it (`check_member_group_id`: a member's heartbeat and leave,
  TxnOffsetCommit, OffsetDelete), not for commits, fetches, describes and deletes of the group.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.coordinator import http_revocations
from app.coordinator.assignment import range_assignment
from app.coordinator.audit import Actor, record
from app.coordinator.classic_groups import (
    ANY_SESSION_TIMEOUT,
    COMPLETING,
    CONSUMER_PROTOCOL,
    ClassicGroups,
    SessionTimeoutBounds,
    classic_state,
    instance_error,
)
from app.coordinator.classic_members import ClassicMembers
from app.coordinator.confirmed_reads import (
    ReplicationBarrier,
    confirmed_by_the_standby,
    reads_confirmed_by_the_standby,
)
from app.coordinator.consumer_groups import (
    ConsumerGroupDescription,
    ConsumerGroups,
    consumer_state,
    credit_revocations,
    describe_consumer_group,
    is_classic,
    refuse_other_kinds,
    stale_member_epoch,
    stale_transactional_epoch,
    unknown_member,
)
from app.coordinator.identifiers import check_group_id, check_member_group_id
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.errors import BrokerError, ErrorCode
from app.storage.database import CONNECTION_ERRORS
from app.storage.groups import group_offsets, groups
from app.storage.groups.group_offsets import CommittedOffset, OffsetEntry, PartitionLag
from app.storage.groups.groups import (
    CLASSIC_STATE_KEY,
    CONSUMER_STATE_KEY,
    HTTP_STATE_KEY,
    TOPIC_IDS_KEY,
    Group,
    Member,
)
from app.storage.log.topics import (
    CONSUMER_OFFSETS_TOPIC,
    find_topics,
    get_topic,
    hold_topics,
    kafka_topic_id,
    unknown_partition,
    unknown_topic,
)
from txbroker.wire import NO_GENERATION, NO_MEMBER

# Kafka's default heartbeat.interval.ms: members learn of a rebalance within this long.
MAX_HEARTBEAT_INTERVAL_MS = 3000


def heartbeat_interval(session_timeout_ms: int) -> int:
    """At most a third of the session (three missed heartbeats before eviction), at most 3 s."""
    return max(min(session_timeout_ms // 3, MAX_HEARTBEAT_INTERVAL_MS), 1)


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    member_id: str
    generation_id: int
    heartbeat_interval_ms: int
    assignment: dict[str, list[int]]
    topic_ids: dict[str, str]  # of the assigned topics: another one for a topic re-created under its name


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group: Group
    members: list[Member]
    offsets: list[PartitionLag]


def _unknown_member(group_id: str, member_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_MEMBER_ID,
        f"member {member_id!r} is not in group {group_id!r} (never joined, left, or evicted after its "
        f'session timed out): rejoin with member_id ""',
    )


def unknown_group(group_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.GROUP_ID_NOT_FOUND,
        f"group {group_id!r} does not exist: a group exists once a member heartbeats or offsets are "
        f"committed for it (and until it is deleted)",
    )


async def _locked_for_deletion(conn: asyncpg.Connection, group_id: str) -> tuple[Group, list[Member]]:
    """The group with its row locked FOR UPDATE (after the commits in flight) and its members, or
    GROUP_ID_NOT_FOUND."""
    group = await groups.lock_existing(conn, group_id)
    if group is None:
        raise unknown_group(group_id)
    return group, await groups.members(conn, group_id)


def _non_empty(group_id: str, members: list[Member], why: str) -> BrokerError:
    return BrokerError(
        ErrorCode.NON_EMPTY_GROUP,
        f"group {group_id!r} has {len(members)} member(s) (e.g. {members[0].member_id!r}) and {why}: stop its "
        f"consumers (or wait until their sessions expire), then try again",
    )


def _subscribed(group_id: str, topic: str) -> BrokerError:
    return BrokerError(
        ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        f"a member of group {group_id!r} subscribes to topic {topic!r}: its offsets are in use; delete them "
        f"once no member subscribes to it",
    )


def _no_such_group(group_id: str, generation_id: int, code: ErrorCode) -> BrokerError:
    """A commit naming generation `generation_id` of a group that does not exist, refused with `code`."""
    if code == ErrorCode.GROUP_ID_NOT_FOUND:
        return unknown_group(group_id)
    return BrokerError(
        code,
        f"group {group_id!r} does not exist, so generation {generation_id} is none of its: join the group "
        f"and commit with the generation it gives, or commit with generation -1 (no group management)",
    )


def _simple_commit_refused(group_id: str, member_count: int) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_MEMBER_ID,
        f"group {group_id!r} has {member_count} member(s): a commit without a generation and member id "
        f"(a consumer that assigns itself its partitions, or an admin tool) is accepted only while the group "
        f"has no members (Kafka's Empty state), as Kafka's group coordinator accepts it; commit as a member "
        f"(with the generation and member id JoinGroup gave), use another group id, or stop its consumers first",
    )


def _assignment_pending(group_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.REBALANCE_IN_PROGRESS,
        f"group {group_id!r} is completing a rebalance (its leader's assignment has not come): commit once "
        f"SyncGroup has answered this member's assignment",
    )


async def _nothing_accepted(
    conn: asyncpg.Connection, group_id: str, created: bool, errors: list[BrokerError | None]
) -> bool:
    """True when a commit refused every entry (a zombie's, or an invalid one): it writes nothing,
    so the group it made to hold its offsets (`created`, this transaction's own row) goes too."""
    if any(error is None for error in errors):
        return False
    if created:
        await groups.delete(conn, group_id)
    return True


def _not_advancing(
    group_id: str, entry: OffsetEntry, committed: dict[tuple[str, int], OffsetEntry]
) -> BrokerError | None:
    """A commit with require_advance writes an offset only past the partition's committed one (or
    where none is): the first commit of an offset wins, and a later one -- a zombie's, a late
    duplicate's -- never replaces it, nor moves it back. The commit that wrote it, repeated exactly
    (its answer lost), is no error (nothing is written again)."""
    current = committed.get((entry.topic, entry.partition))
    if current is None or current.offset < entry.offset or current == entry:
        return None
    return BrokerError(
        ErrorCode.OFFSET_NOT_ADVANCED,
        f"group {group_id!r} has offset {current.offset} committed for {entry.topic}-{entry.partition} "
        f"(metadata {current.metadata!r:.200}), and this commit of offset {entry.offset} with require_advance "
        f"would not move it forward: nothing was written. The first commit of an offset wins; fetch the "
        f"committed offset and go on from it",
    )


def _advancing(
    group_id: str,
    entries: list[OffsetEntry],
    errors: list[BrokerError | None],
    committed: dict[tuple[str, int], OffsetEntry],
) -> tuple[list[BrokerError | None], list[OffsetEntry]]:
    """A commit with require_advance: (each entry's error, the entries to write). The entries are
    judged in the request's order, each against the committed offset as the entries before it leave
    it, so a partition the request names twice is written at most once, and never moved back by its
    second entry (judged both against the offset committed before, both were written, the last
    over the first). A repeat of the commit that wrote the committed offset is answered as written:
    nothing is written again. Both that answer and OFFSET_NOT_ADVANCED tell what is committed, which
    may be on the primary alone (its commit's wait for the standby cancelled): they are answered
    once the standby has it, because the check reads under the lock of the group's
    __consumer_offsets partition (`group_offsets.committed_under_lock`), which makes the caller's
    COMMIT wait for the standby past it (app/storage/database.py; tests/crash/test_failover.py)."""
    judged: list[BrokerError | None] = []
    written: list[OffsetEntry] = []
    for entry, error in zip(entries, errors):
        error = error or _not_advancing(group_id, entry, committed)
        judged.append(error)
        key = (entry.topic, entry.partition)
        if error is None and committed.get(key) != entry:
            written.append(entry)
            committed[key] = entry
    return judged, written


def _consumer_commit_error(
    state: dict, group_id: str, member_id: str, member_epoch: int, transactional: bool = False
) -> BrokerError | None:
    """A commit (plain or transactional) or a fetch of a KIP-848 consumer group with members, as
    Kafka's ConsumerGroup.validateOffsetCommit judges it: the member must be one (UNKNOWN_MEMBER_ID)
    at its current epoch (STALE_MEMBER_EPOCH; a transactional commit's ILLEGAL_GENERATION, as Kafka's
    coordinator answers TxnOffsetCommit, and a classic member's, whose generation is its epoch and
    which knows no STALE_MEMBER_EPOCH: Kafka's validateMemberEpoch for a member of the classic protocol)."""
    member = state["members"].get(member_id)
    if member is None:
        return unknown_member(group_id, member_id)
    if member_epoch != member["member_epoch"]:
        refused = stale_transactional_epoch if transactional or is_classic(member) else stale_member_epoch
        return refused(group_id, member_id, member_epoch, member["member_epoch"])
    return None


def _re_created_since(group_id: str, generation_id: int, topic: str) -> BrokerError:
    return BrokerError(
        ErrorCode.ILLEGAL_GENERATION,
        f"topic {topic!r} was deleted and created again since generation {generation_id} of group {group_id!r} "
        f"assigned its partitions: those were the deleted topic's, not this one's; heartbeat to get the new "
        f"generation, and read the new topic from the group's committed offsets",
    )


def _illegal_generation(group_id: str, received: int, current: int) -> BrokerError:
    return BrokerError(
        ErrorCode.ILLEGAL_GENERATION,
        f"generation {received} of group {group_id!r} is not the current one ({current}): a rebalance "
        f"happened; heartbeat to get the new generation and assignment, and commit only for "
        f"partitions still assigned",
    )


# The least unheard time credited to the sessions (`GroupCoordinator.expire_sessions`): a shorter one
# is the ordinary gap between two heartbeats while servers hear the members (a server starting
# beside live ones finds the latest heartbeat that recent), which the sessions allow for (a session
# is 1 s at least); crediting it would cost a transaction per group with members, at each start.
UNHEARD_CREDIT_MIN_MS = 1000


def joining_member_id(join_id: str | None) -> str:
    """The member id a join gets: a new one each time, or, for a join with a `join_id` (a value its
    client makes unique, a UUID), one derived from it, so that every attempt of that join names the
    same member. A digest: the member id, which DescribeGroups and the console show, does not give
    away the join_id that would join as that member."""
    if join_id is None:
        return f"member-{uuid.uuid4().hex}"
    return f"member-{hashlib.sha256(join_id.encode()).hexdigest()[:32]}"


class GroupCoordinator:
    def __init__(
        self,
        pool: asyncpg.Pool,
        transactions: TransactionCoordinator,
        initial_rebalance_delay_ms: int = 0,
        session_timeout_bounds: SessionTimeoutBounds = ANY_SESSION_TIMEOUT,
        replication_barrier: ReplicationBarrier | None = None,
        consumer_session_timeout_ms: int = 45_000,
        consumer_heartbeat_interval_ms: int = 5_000,
    ) -> None:
        """`consumer_session_timeout_ms`, `consumer_heartbeat_interval_ms`: KIP-848's consumer groups'
        (Kafka's group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms)."""
        self.pool = pool
        self.transactions = transactions
        # Committed offsets are answered once the synchronous standby has them (fetch_offsets).
        self.replication_barrier = replication_barrier
        # Kafka's JoinGroup/SyncGroup/Heartbeat/LeaveGroup, on the same groups, members and offsets.
        self.classic = ClassicGroups(pool, initial_rebalance_delay_ms, session_timeout_bounds)
        # KIP-848's ConsumerGroupHeartbeat, on the same groups, members and offsets.
        self.consumer = ConsumerGroups(
            pool,
            self.classic.changing,
            consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms,
            announce=self.classic.announce,
        )
        # Kafka 4's online migration: the classic members of a consumer group (classic_members.py).
        self.classic.consumer_members = ClassicMembers(self.consumer)
        # The session check's view of the database (`expire_sessions`): when its last check that
        # reached it began (None: none yet), and since when it was away (None: it is not).
        self._last_check_ms: int | None = None
        self._database_away_since_ms: int | None = None

    # ---- membership

    async def _assignment_now(self, conn: asyncpg.Connection, group_id: str) -> dict:
        """The range assignment of the group's members, with the ids of the topics it assigns
        (TOPIC_IDS_KEY)."""
        current = await groups.members(conn, group_id)
        subscribed = sorted({topic for member in current for topic in member.topics})
        topics = await find_topics(conn, subscribed)
        assignment: dict = range_assignment(
            {m.member_id: m.topics for m in current}, {name: t.partition_count for name, t in topics.items()}
        )
        assignment[TOPIC_IDS_KEY] = {name: kafka_topic_id(t.topic_uuid) for name, t in topics.items()}
        return assignment

    async def _rebalance(
        self, conn: asyncpg.Connection, group: Group, now: int, assignment: dict | None = None
    ) -> None:
        classic = classic_state(group)
        if classic is not None and classic["members"]:  # a Kafka group: its members rejoin and assign
            await self.classic.members_removed(conn, group, now)
            return
        consumer = consumer_state(group)
        if consumer is not None and consumer["members"]:  # KIP-848's: the coordinator assigns anew
            await self.consumer.members_removed(conn, group, now)
            return
        # The barrier's state as the ending generation left it, for the members that remain: what
        # each still owns is held back from the others' answers in the new one.
        barrier = http_revocations.loaded(
            group.assignment, group.generation_id, await groups.members(conn, group.group_id)
        )
        group.generation_id += 1
        group.assignment = assignment if assignment is not None else await self._assignment_now(conn, group.group_id)
        group.last_update_ms = now
        http_revocations.settle(barrier, group.assignment, now)
        await self._save_barrier(conn, group, barrier)

    @staticmethod
    async def _save_barrier(conn: asyncpg.Connection, group: Group, barrier: dict) -> None:
        """Writes an HTTP group's row with its revocation barrier's state (http_revocations), and its
        members' revocation deadlines on their rows (only those that changed), where the eviction
        worker finds the overdue ones."""
        group.assignment = {**http_revocations.targets(group.assignment), HTTP_STATE_KEY: barrier}
        await groups.save_generation(conn, group)
        await groups.set_revocation_deadlines(conn, group.group_id, http_revocations.deadlines(barrier))

    async def heartbeat(
        self,
        group_id: str,
        member_id: str,
        topics: list[str],
        session_timeout_ms: int,
        join_id: str | None = None,
        generation_id: int = NO_GENERATION,
        rebalance_timeout_ms: int | None = None,
    ) -> HeartbeatResult:
        """Joins (member_id ""), or keeps a member alive. A join with a `join_id` is the same join
        whenever it is repeated (its answer lost): the member it made, while it lives, not another
        one, which would hold partitions until its session timed out. `generation_id`: the
        generation whose revocations the member has finished (-1: none); `rebalance_timeout_ms`:
        how long it may take to revoke a partition before the partition goes to its next owner all
        the same (None: its session timeout). The answered assignment is the member's target less
        the partitions another member has still to revoke (http_revocations)."""
        check_member_group_id(group_id)
        if join_id is not None and member_id != NO_MEMBER:
            raise BrokerError(
                ErrorCode.INVALID_REQUEST,
                f'join_id names a join, whose member_id is "": received it with member_id {member_id[:100]!r}; '
                f"send join_id only when joining",
            )
        now = now_ms()
        topics = sorted(set(topics))
        # No Kafka member waits on an HTTP group (one joining it is refused at once), and a Kafka
        # group's members refuse this heartbeat: nobody to announce its change to.
        async with self.classic.changing(group_id, announce=False) as conn:
            group = await groups.lock(conn, group_id, now)
            classic = classic_state(group)
            if classic is not None and classic["members"]:
                raise BrokerError(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"group {group_id!r} has members that joined over Kafka's protocol (JoinGroup): a group "
                    f"takes the kind of its first member; use another group id, or wait until they left",
                )
            current = await groups.members(conn, group_id)
            refuse_other_kinds(group, current)
            members = {m.member_id: m for m in current}
            changed = False
            joining = member_id == NO_MEMBER
            if joining:
                member_id = joining_member_id(join_id)
            member = members.get(member_id)  # when joining: the member an earlier attempt of this join made
            if member is None and not joining:
                raise _unknown_member(group_id, member_id)
            if member is None:
                await groups.add_member(conn, group_id, Member(member_id, topics, session_timeout_ms, now, now))
                changed = True
            else:
                changed = sorted(member.topics) != topics
                await groups.touch_member(conn, group_id, member_id, topics, session_timeout_ms, now)
            expired = [
                m.member_id
                for m in members.values()
                if m.member_id != member_id and m.last_heartbeat_ms + m.session_timeout_ms < now
            ]
            if expired:
                await groups.remove_members(conn, group_id, expired)
            # Also when nobody changed but the topics did (a subscribed topic was created, deleted,
            # grew, or was re-created: another topic id): the assignment the members hold is no
            # longer the one they would get.
            assignment = await self._assignment_now(conn, group_id)
            if changed or expired or assignment != http_revocations.targets(group.assignment):
                await self._rebalance(conn, group, now, assignment)
            joined_ms = now if member is None else member.joined_ms
            present = [m for m in members.values() if m.member_id not in expired and m.member_id != member_id]
            present.append(Member(member_id, topics, session_timeout_ms, joined_ms, now))
            barrier = http_revocations.loaded(group.assignment, group.generation_id, present)
            timeout = session_timeout_ms if rebalance_timeout_ms is None else rebalance_timeout_ms
            barrier[member_id]["rebalance_timeout_ms"] = timeout
            http_revocations.acknowledge(barrier, member_id, generation_id)
            http_revocations.settle(barrier, group.assignment, now)
            assigned = http_revocations.answer(
                barrier, member_id, group.assignment.get(member_id, {}), group.generation_id
            )
            if barrier != group.assignment.get(HTTP_STATE_KEY):
                await self._save_barrier(conn, group, barrier)
        topic_ids = group.assignment.get(TOPIC_IDS_KEY, {})
        return HeartbeatResult(
            member_id,
            group.generation_id,
            heartbeat_interval(session_timeout_ms),
            assigned,
            {topic: topic_ids[topic] for topic in assigned},
        )

    async def leave(self, group_id: str, member_id: str) -> None:
        check_member_group_id(group_id)
        now = now_ms()
        async with self.classic.changing(group_id) as conn:
            group = await groups.lock(conn, group_id, now)
            if member_id not in {m.member_id for m in await groups.members(conn, group_id)}:
                raise _unknown_member(group_id, member_id)
            await groups.remove_members(conn, group_id, [member_id])
            await self._rebalance(conn, group, now)

    async def expire_sessions(self) -> int:
        """Evicts members whose session ran out; each affected group rebalances once. The time no
        server could hear the members does not count: every session, rebalance underway and
        SyncGroup awaited is first put off by it (`ClassicGroups.credit_timers`), as Kafka's
        coordinator holds no time before against them when it loads a group (a coordinator
        failover, a broker restarted). That time is, for this process's first check (the server
        just started: every node may have been down), the time since the last heartbeat any member
        of any group sent (none is that old while a server is up); after a check that failed on
        the database, the time from this process's last check that reached it (each request
        answered COORDINATOR_NOT_AVAILABLE meanwhile). Without the credit, the first check after a
        restart or outage longer than the sessions evicted every member of every group before any
        could send a heartbeat: every group rebalanced, static members too. Only that time: a
        member gone before is evicted that much later, not a whole session later (a database that
        keeps failing briefly does not keep dead members in their groups)."""
        now = now_ms()
        try:
            unheard_since = self._database_away_since_ms
            if self._last_check_ms is None:
                async with self.pool.acquire() as conn:
                    unheard_since = await groups.last_heartbeat_ms(conn)
            if unheard_since is not None and now - unheard_since > UNHEARD_CREDIT_MIN_MS:
                await self._credit(now - unheard_since, now)
            self._database_away_since_ms = None
            evicted = await self._evict_lapsed_members(now)
        except CONNECTION_ERRORS:
            # Since the last check that reached it (requests after it may have failed); a process
            # that never reached it reads the last heartbeat at its first check that does.
            if self._database_away_since_ms is None and self._last_check_ms is not None:
                self._database_away_since_ms = self._last_check_ms
            raise
        self._last_check_ms = now
        return evicted

    async def _credit(self, credit_ms: int, now: int) -> None:
        """Puts each group's sessions, classic timers and consumer groups' revocations off by
        `credit_ms` (`expire_sessions`), each group in a transaction of its own under its row lock,
        the order every membership change keeps (group row, then its members)."""
        async with self.pool.acquire() as conn:
            group_ids = await groups.groups_with_members(conn)
        for group_id in group_ids:
            async with self.classic.changing(group_id) as conn:
                group = await groups.lock_existing(conn, group_id)
                if group is not None:
                    await groups.credit_sessions(conn, group_id, credit_ms, now)
                    await self.classic.credit_timers(conn, group, credit_ms, now)
                    await self.consumer.credit_timers(conn, group, credit_ms, now)
                    barrier = group.assignment.get(HTTP_STATE_KEY)
                    if barrier is not None:
                        credit_revocations(barrier.values(), credit_ms, now)
                        await self._save_barrier(conn, group, barrier)

    async def _evict_lapsed_members(self, now: int) -> int:
        evicted = await self._remove_overdue_revocations(now)
        async with self.pool.acquire() as conn:
            for group_id in await groups.groups_with_expired_members(conn, now):
                expired: list[str] = []
                async with conn.transaction():
                    group = await groups.lock_if_free(conn, group_id)
                    if group is None:
                        continue  # another server is on it
                    expired = [
                        m.member_id
                        for m in await groups.members(conn, group_id)
                        if m.last_heartbeat_ms + m.session_timeout_ms < now
                    ]
                    if expired:
                        await groups.remove_members(conn, group_id, expired)
                        await self._rebalance(conn, group, now)
                        await self.classic.announce(conn, group_id)
                        evicted += len(expired)
                if expired:  # committed: the group's waiting JoinGroups and SyncGroups re-read
                    self.classic.wake_ups.changed(group_id)
        return evicted

    async def _remove_overdue_revocations(self, now: int) -> int:
        """KIP-848's rebalance timeout: a consumer group member that has not revoked its partitions
        within it is removed, as Kafka's coordinator's timer removes it, whether or not another
        member heartbeats meanwhile. An HTTP group member's overdue partitions are released instead
        (http_revocations.settle; it stays a member), so that the describe shows them free and the
        worker does not find the member again; its next owner's heartbeat would release them too."""
        removed = 0
        async with self.pool.acquire() as conn:
            for group_id in await groups.groups_with_overdue_revocations(conn, now):
                async with conn.transaction():
                    group = await groups.lock_if_free(conn, group_id)
                    if group is not None and HTTP_STATE_KEY in group.assignment:
                        barrier = group.assignment[HTTP_STATE_KEY]
                        http_revocations.settle(barrier, group.assignment, now)
                        await self._save_barrier(conn, group, barrier)
                        continue
                    if group is None or not await self.consumer.settle_overdue(conn, group, now):
                        continue
                    await self.classic.announce(conn, group_id)
                    removed += 1
        return removed

    # ---- offsets

    async def _generation_error(
        self,
        conn: asyncpg.Connection,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> BrokerError | None:
        """KIP-447's check for a commit naming a generation; holds the group row FOR SHARE. A commit
        naming a group.instance.id another member now has is FENCED_INSTANCE_ID (KIP-345)."""
        if generation_id == NO_GENERATION and group_instance_id is None:
            return None
        row = await conn.fetchrow(
            "SELECT generation_id, assignment FROM consumer_groups WHERE group_id = $1 FOR SHARE", group_id
        )
        fenced = instance_error(
            None if row is None else row["assignment"].get(CLASSIC_STATE_KEY), group_id, member_id, group_instance_id
        )
        if fenced is not None or generation_id == NO_GENERATION:
            return fenced
        exists = row is not None and await conn.fetchval(
            "SELECT 1 FROM group_members WHERE group_id = $1 AND member_id = $2", group_id, member_id
        )
        if not exists:
            return _unknown_member(group_id, member_id)
        if generation_id != row["generation_id"]:
            return _illegal_generation(group_id, generation_id, row["generation_id"])
        return None

    async def _commit_error(
        self,
        conn: asyncpg.Connection,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        unknown_group_error: ErrorCode | None,
        transactional: bool,
    ) -> BrokerError | None:
        """A commit's error against its group (None: accepted): Kafka's coordinator's rules for one
        of Kafka's door (which gives `unknown_group_error`), HTTP's contract's for the others."""
        if unknown_group_error is None:
            return await self._generation_error(conn, group_id, member_id, generation_id, group_instance_id)
        return await self._kafka_commit_error(
            conn, group_id, member_id, generation_id, group_instance_id, transactional
        )

    async def _kafka_commit_error(
        self,
        conn: asyncpg.Connection,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        transactional: bool,
    ) -> BrokerError | None:
        """A commit over Kafka's door, judged as Kafka's group coordinator judges it
        (ClassicGroup.validateOffsetCommit), the group row (which exists: `groups.hold`) held FOR
        SHARE: without a generation (below 0) it is accepted while the group has no members (Kafka's
        Empty: a consumer without group management, an admin tool resetting offsets); then, without a
        member id or instance id, a plain one is UNKNOWN_MEMBER_ID and a transactional one accepted
        (older producers name no member); one naming a member is that member's, checked
        (FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION: generation -1 is none of the
        group's); and a member's plain commit while the group awaits its leader's assignment
        (CompletingRebalance) is REBALANCE_IN_PROGRESS. HTTP's commits keep their contract
        (`_generation_error`: generation -1 commits whatever the group)."""
        # The members cannot change meanwhile: the commit's hold on the group row keeps a join,
        # leave or eviction (each FOR UPDATE of it) waiting until the commit ends.
        membership = await conn.fetchrow(
            "SELECT count(*) AS members, coalesce(bool_or(member_id = $2), false) AS is_member "
            "FROM group_members WHERE group_id = $1",
            group_id,
            member_id,
        )
        if generation_id < 0 and not membership["members"]:
            return None
        row = await conn.fetchrow(
            "SELECT generation_id, assignment FROM consumer_groups WHERE group_id = $1 FOR SHARE", group_id
        )
        consumer = row["assignment"].get(CONSUMER_STATE_KEY)
        if consumer is not None and consumer["members"]:
            # As Kafka's ConsumerGroup.validateOffsetCommit: a transactional commit naming no member
            # (older producers name none) is not checked.
            if transactional and generation_id < 0 and member_id == NO_MEMBER and group_instance_id is None:
                return None
            return _consumer_commit_error(consumer, group_id, member_id, generation_id, transactional)
        classic = row["assignment"].get(CLASSIC_STATE_KEY)
        if generation_id >= 0 or member_id != NO_MEMBER or group_instance_id is not None:
            fenced = instance_error(classic, group_id, member_id, group_instance_id)
            if fenced is not None:
                return fenced
            if not membership["is_member"]:
                return _unknown_member(group_id, member_id)
            if generation_id != row["generation_id"]:
                return _illegal_generation(group_id, generation_id, row["generation_id"])
        elif not transactional:
            return _simple_commit_refused(group_id, membership["members"])
        if not transactional and classic is not None and classic["state"] == COMPLETING:
            return _assignment_pending(group_id)
        return None

    async def _judged_entries(
        self,
        conn: asyncpg.Connection,
        group_id: str,
        created: bool,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        entries: list[OffsetEntry],
        unknown_group_error: ErrorCode | None,
        transactional: bool,
    ) -> list[BrokerError | None]:
        """Each entry's error (None: accepted), in Kafka's broker's order: a topic or partition that
        does not exist is UNKNOWN_TOPIC_OR_PARTITION whatever the commit (KafkaApis checks them before
        its group coordinator judges the commit, and leaves the coordinator out when none is left);
        the others get the commit's error against its group, if any. A commit of Kafka's door naming
        a generation (0 or more) of a group that did not exist (`created`: this transaction made its
        row) gets `unknown_group_error`; the group is then removed with the rest of what it refused
        (`_nothing_accepted`). A commit in the current generation of an HTTP group for a topic
        deleted and re-created since that generation's assignment is ILLEGAL_GENERATION: the
        member's positions were the deleted topic's (its next heartbeat brings a new generation)."""
        if created and unknown_group_error is not None and generation_id >= 0:
            group_error = _no_such_group(group_id, generation_id, unknown_group_error)
        else:
            group_error = await self._commit_error(
                conn, group_id, member_id, generation_id, group_instance_id, unknown_group_error, transactional
            )
        entry_errors = await self._entry_errors(conn, [(e.topic, e.partition) for e in entries])
        re_created: set[str] = set()
        if group_error is None and generation_id >= 0:
            assigned_ids = await groups.assigned_topic_ids(conn, group_id)
            # The topics are held (`_entry_errors`): none is deleted or created again meanwhile.
            current = await find_topics(conn, sorted({e.topic for e in entries} & assigned_ids.keys()))
            re_created = {
                name for name, topic in current.items() if kafka_topic_id(topic.topic_uuid) != assigned_ids[name]
            }
        return [
            entry_error
            or (_re_created_since(group_id, generation_id, e.topic) if e.topic in re_created else group_error)
            for e, entry_error in zip(entries, entry_errors)
        ]

    async def _entry_errors(self, conn: asyncpg.Connection, entries: list[tuple[str, int]]) -> list[BrokerError | None]:
        """Each (topic, partition)'s error (a topic or partition that does not exist), the topics
        held until the transaction ends: a DeleteTopics waits for it, and then removes what it
        committed."""
        topics = await hold_topics(conn, sorted({name for name, _ in entries}))
        errors: list[BrokerError | None] = []
        for name, partition in entries:
            topic = topics.get(name)
            if topic is None:
                errors.append(unknown_topic(name))
            elif not 0 <= partition < topic.partition_count:
                errors.append(unknown_partition(topic, partition))
            else:
                errors.append(None)
        return errors

    async def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        entries: list[OffsetEntry],
        group_instance_id: str | None = None,
        unknown_group_error: ErrorCode | None = None,
        require_advance: bool = False,
    ) -> list[BrokerError | None]:
        """`unknown_group_error`, given by Kafka's door: what a commit naming a generation (0 or more)
        of a group that does not exist answers for each partition that exists, creating nothing:
        Kafka's group coordinator answers GROUP_ID_NOT_FOUND from OffsetCommit v9, ILLEGAL_GENERATION
        below (OffsetMetadataManager.validateOffsetCommit); and the commit is judged against its
        group as Kafka's coordinator judges it (`_kafka_commit_error`). Without (HTTP's), the group
        is made and the commit's member is unknown to it (UNKNOWN_MEMBER_ID), and generation -1
        commits whatever the group. Either way a partition that does not exist is
        UNKNOWN_TOPIC_OR_PARTITION first (`_judged_entries`). `require_advance` (HTTP's; Kafka's
        OffsetCommit has no such field): the first commit of an offset wins (`_advancing`)."""
        check_group_id(group_id)
        now = now_ms()
        async with self.pool.acquire() as conn, conn.transaction():
            created = await groups.hold(conn, group_id, now)  # before any partition lock: see the lock order
            errors = await self._judged_entries(
                conn,
                group_id,
                created,
                member_id,
                generation_id,
                group_instance_id,
                entries,
                unknown_group_error,
                transactional=False,
            )
            partition = await self.transactions.offsets_partition(conn, group_id)
            offsets_topic = await get_topic(conn, CONSUMER_OFFSETS_TOPIC)
            written = [e for e, error in zip(entries, errors) if error is None]
            if require_advance and written:
                committed = await group_offsets.committed_under_lock(
                    conn, offsets_topic, partition.partition, group_id, [(e.topic, e.partition) for e in written]
                )
                errors, written = _advancing(group_id, entries, errors, committed)
            if await _nothing_accepted(conn, group_id, created, errors):
                return errors
            await group_offsets.commit(conn, offsets_topic, partition.partition, group_id, written, now)
        return errors

    async def txn_offset_commit(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        entries: list[OffsetEntry],
        group_instance_id: str | None = None,
        unknown_group_error: ErrorCode | None = None,
    ) -> list[BrokerError | None]:
        """Offsets that become visible with the transaction's COMMIT marker (and vanish on abort).
        Adds the group's offsets partition to the transaction if AddOffsetsToTxn was not called. One
        unit of work: the transactional id's row first, the transaction log saved last. The group id
        is checked first, as Kafka's group coordinator, which serves it, does. `unknown_group_error`
        as commit_offsets' (Kafka's group coordinator: ILLEGAL_GENERATION at every version,
        OffsetMetadataManager.validateTransactionalOffsetCommit; and its rules for a transactional
        commit, `_kafka_commit_error`)."""
        check_member_group_id(group_id)
        now = now_ms()
        async with self.transactions.unit_of_work() as unit:
            conn = unit.conn
            meta = await self.transactions.lock_producer(unit, transactional_id, producer_id, producer_epoch)
            created = await groups.hold(conn, group_id, now)
            errors = await self._judged_entries(
                conn,
                group_id,
                created,
                member_id,
                generation_id,
                group_instance_id,
                entries,
                unknown_group_error,
                transactional=True,
            )
            accepted = [e for e, error in zip(entries, errors) if error is None]
            if await _nothing_accepted(conn, group_id, created, errors):  # nor begins a transaction
                return errors
            partition = await self.transactions.join_for_offsets(unit, meta, group_id)
            offsets_topic = await get_topic(conn, CONSUMER_OFFSETS_TOPIC)
            await group_offsets.stage(
                conn,
                offsets_topic,
                partition.partition,
                group_id,
                accepted,
                meta.txn_producer_id,
                meta.txn_producer_epoch,
                now,
            )
        return errors

    async def fetch_offsets(
        self,
        group_id: str,
        partitions: list[tuple[str, int]] | None,
        require_stable: bool,
        member_id: str | None = None,
        member_epoch: int = NO_GENERATION,
    ) -> list[tuple[CommittedOffset, BrokerError | None]]:
        """`member_id`, `member_epoch`: OffsetFetch v9's, checked (a KIP-848 consumer group's only,
        as Kafka's ConsumerGroup.validateOffsetFetch: an admin's fetch names neither)."""
        check_group_id(group_id)
        # A member epoch refused (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID: the consumer rejoins) is read
        # from the group as its offsets are: a heartbeat the standby lacks is taken back by a failover.
        async with self._offsets_confirmed(group_id), self.pool.acquire() as conn:
            if member_id is not None or member_epoch >= 0:
                group = await groups.get(conn, group_id)
                consumer = None if group is None else consumer_state(group)
                if consumer is not None:
                    error = _consumer_commit_error(consumer, group_id, member_id or "", member_epoch)
                    if error is not None:
                        raise error
            found = await group_offsets.fetch(conn, group_id, partitions)
        results = []
        for committed in found:
            error = None
            if require_stable and committed.pending:
                error = BrokerError(
                    ErrorCode.UNSTABLE_OFFSET_COMMIT,
                    f"a transactional offset commit of group {group_id!r} for {committed.topic}-"
                    f"{committed.partition} awaits its transaction's outcome: retry shortly",
                )
            results.append((committed, error))
        return results

    def _offsets_confirmed(self, group_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The block's reads of the committed offsets of `group_id` (and of the group), answered once
        the synchronous standby has them (docs/operations-high-availability.md, What readers see);
        COORDINATOR_NOT_AVAILABLE (retriable) when it has not confirmed them within READ_WAIT_MIN_S.
        A consumer starts from them, and a person or tool reading a group's description acts on them
        too: an offset whose commit (an EndTxn's, an OffsetCommit's) the standby has not confirmed
        could be lost by a failover with the output that went with it, and a consumer positioned past
        its inputs would skip them for good."""
        return reads_confirmed_by_the_standby(self.replication_barrier, f"the committed offsets of group {group_id!r}")

    # ---- deletion

    async def _offsets_deleted(
        self, conn: asyncpg.Connection, group_id: str, now: int, partitions: list[tuple[str, int]] | None = None
    ) -> int:
        partition = await self.transactions.offsets_partition(conn, group_id)
        offsets_topic = await get_topic(conn, CONSUMER_OFFSETS_TOPIC)
        return await group_offsets.delete_offsets(conn, offsets_topic, partition.partition, group_id, now, partitions)

    async def delete(self, actor: Actor, group_id: str) -> int:
        """[DeleteGroups] Deletes a group without members (Kafka: Empty) with all its offsets, the
        pending transactional ones included (their transaction's COMMIT then writes none, as
        DeleteTopics does for a topic's); the next member or commit of this id starts a fresh group.
        NON_EMPTY_GROUP while it has members, GROUP_ID_NOT_FOUND when there is no such group. Returns
        how many partitions had offsets. One PostgreSQL transaction, the audit entry in it."""
        check_group_id(group_id)
        now = now_ms()
        async with self.classic.changing(group_id) as conn:
            _, members = await _locked_for_deletion(conn, group_id)
            if members:
                raise _non_empty(group_id, members, "a group can be deleted only once empty")
            removed = await self._offsets_deleted(conn, group_id, now)
            await groups.delete(conn, group_id)
            await record(conn, actor, "delete group", group_id, f"offsets={removed}", at_ms=now)
        return removed

    async def delete_offsets(
        self, actor: Actor, group_id: str, partitions: list[tuple[str, int]]
    ) -> list[BrokerError | None]:
        """[OffsetDelete] Deletes the group's offsets of these (topic, partition)s, committed and
        pending transactional, as DeleteGroups does for all of them; one error or None each:
        UNKNOWN_TOPIC_OR_PARTITION, or GROUP_SUBSCRIBED_TO_TOPIC for a topic a member of the group
        subscribes to (its offsets are in use). A partition without an offset is no error. Kafka's
        rules: GROUP_ID_NOT_FOUND when there is no such group, NON_EMPTY_GROUP for a Kafka group with
        members whose protocol is not the consumer one (its subscriptions are unknown); a group left
        without members and offsets is deleted, as Kafka removes it. One PostgreSQL transaction."""
        check_member_group_id(group_id)
        now = now_ms()
        async with self.classic.changing(group_id) as conn:
            group, members = await _locked_for_deletion(conn, group_id)
            classic = classic_state(group)
            if members and classic is not None and classic["members"] and classic["protocol_type"] != CONSUMER_PROTOCOL:
                raise _non_empty(group_id, members, f"its protocol type is {classic['protocol_type']!r}, not consumer")
            subscribed = {topic for member in members for topic in member.topics}
            errors = [
                error or (_subscribed(group_id, topic) if topic in subscribed else None)
                for (topic, _), error in zip(partitions, await self._entry_errors(conn, partitions))
            ]
            eligible = [key for key, error in zip(partitions, errors) if error is None]
            if eligible:
                removed = await self._offsets_deleted(conn, group_id, now, eligible)
                if not members and not await group_offsets.has_offsets(conn, group_id):
                    await groups.delete(conn, group_id)
                await record(conn, actor, "delete offsets", group_id, f"offsets={removed}", at_ms=now)
        return errors

    # ---- describe

    async def describe(self, group_id: str, with_offsets: bool = True) -> GroupDescription:
        """The group, its members and, `with_offsets` (HTTP's describe; Kafka's DescribeGroups shows
        none), its committed offsets with their lag, answered once the synchronous standby has them
        as OffsetFetch's are (`_offsets_confirmed`; without offsets, `_group_confirmed`); so is
        GROUP_ID_NOT_FOUND then (a group whose deletion the standby lacks comes back with its
        offsets)."""
        check_group_id(group_id)
        # None is an answer too: an OffsetDelete or a group deletion the standby lacks would come back.
        # Without offsets (Kafka's DescribeGroups), the members and state: an operator acts on them too
        # (resets the offsets of a group it found Empty, takes Dead for deleted).
        confirmed = self._offsets_confirmed(group_id) if with_offsets else self._group_confirmed(group_id)
        # One snapshot: a rebalance committing between the reads must not pair one generation's
        # assignment with another's members.
        async with confirmed:
            async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
                group = await groups.get(conn, group_id)
                if group is None:
                    raise unknown_group(group_id)
                members = await groups.members(conn, group_id)
                offsets = await group_offsets.lags(conn, group_id) if with_offsets else []
        return GroupDescription(group, members, offsets)

    async def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        """[ConsumerGroupDescribe] A KIP-848 consumer group: GROUP_ID_NOT_FOUND for no such group or
        one of another kind."""
        check_group_id(group_id)
        async with self._group_confirmed(group_id), self.pool.acquire() as conn:
            return describe_consumer_group(await groups.get(conn, group_id), group_id)

    def _group_confirmed(self, group_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The block's reads of a group's state and members, answered once the synchronous standby
        has them (GROUP_ID_NOT_FOUND too: a deletion it lacks comes back), as `_offsets_confirmed`."""
        return reads_confirmed_by_the_standby(self.replication_barrier, f"the state of group {group_id!r}")

    async def list(self) -> list[tuple[Group, int]]:
        """Every group with its member count, once the synchronous standby has them: a group whose
        creation or deletion it lacks is taken back, or brought back, by a failover."""
        async with self.pool.acquire() as conn:
            listed = await groups.list_groups(conn)
        await confirmed_by_the_standby(self.replication_barrier, "the groups' list")
        return listed
