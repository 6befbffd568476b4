"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on the groups HTTP's
heartbeat uses: the same `consumer_groups` row (its generation), the same `group_members` rows
(sessions, subscribed topics: what expiry, DescribeGroups, lag and the console read), the same
committed offsets. What only this protocol has (the rebalance state, the chosen protocol, the
leader, each member's protocols and the assignment bytes the leader computed) is the group row's
`assignment[CLASSIC_STATE_KEY]` (app/storage/groups/groups.py).

The broker relays, it never assigns: the leader's SyncGroup carries every member's assignment
bytes, whatever its assignor (range, roundrobin, cooperative-sticky).

A rebalance, as Kafka's coordinator runs it, with PostgreSQL as the only shared state (members of
one group reach different workers and nodes):
- a JoinGroup moves the group to PreparingRebalance (every member must rejoin) and waits;
- the JoinGroup that finds every member rejoined, or any waiter that finds the rebalance deadline
  passed (the members' largest rebalance timeout), completes it under the group row lock: members
  that did not rejoin are removed, the generation is bumped, a protocol every member supports is
  chosen, a leader kept or picked, and the group is CompletingRebalance;
- the waiters see the new generation (they poll the row) and answer; the leader's SyncGroup stores
  the assignments and makes the group Stable; the others' SyncGroups wait for that.
Every change holds the group row FOR UPDATE, so two processes never complete one rebalance twice.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections import Counter
from dataclasses import dataclass

import asyncpg
from kio.schema.consumer_protocol_assignment.v3.data import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v3.data import ConsumerProtocolSubscription
from kio.serial import entity_reader

from app.clock import now_ms
from app.errors import BrokerError, ErrorCode
from app.storage.groups import groups
from app.storage.groups.groups import CLASSIC_STATE_KEY, Group, Member

PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
EMPTY = "Empty"
# How often a JoinGroup or SyncGroup waiting for the rest of the group re-reads the group row.
POLL_S = 0.05
# Kafka's "consumer" protocol type: its metadata and assignments are ConsumerProtocol messages,
# which this module reads for the subscribed topics and assigned partitions others describe.
CONSUMER_PROTOCOL = "consumer"


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    member_id: str
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str
    members: list[JoinedMember]  # the leader's answer only
    member_id_required: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    protocol_type: str | None
    protocol_name: str | None
    assignment: bytes


def classic_state(group: Group) -> dict | None:
    return group.assignment.get(CLASSIC_STATE_KEY)


def _inconsistent(group_id: str, detail: str) -> BrokerError:
    return BrokerError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"group {group_id!r}: {detail}")


def _unknown_member(group_id: str, member_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_MEMBER_ID,
        f"member {member_id!r} is not in group {group_id!r} (left, or removed when its session timed out "
        f'or it did not rejoin a rebalance in time): rejoin with member_id ""',
    )


def _rebalancing(group_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.REBALANCE_IN_PROGRESS,
        f"group {group_id!r} is rebalancing: rejoin (JoinGroup) to get the new generation",
    )


def _decoded(data_class, data: bytes):
    """A ConsumerProtocol message of any version (newer ones only append fields), or None."""
    if len(data) < 2:
        return None
    try:
        return entity_reader(data_class)(data, 2)[0]
    except Exception:  # a client's own bytes: what they hold is only described, never relied on
        return None


def subscribed_topics(protocol_type: str, protocols: list[tuple[str, bytes]]) -> list[str]:
    if protocol_type != CONSUMER_PROTOCOL:
        return []
    topics: set[str] = set()
    for _, metadata in protocols:
        subscription = _decoded(ConsumerProtocolSubscription, metadata)
        if subscription is not None:
            topics.update(subscription.topics)
    return sorted(topics)


def assigned_partitions(protocol_type: str, assignment: bytes) -> dict[str, list[int]]:
    decoded = _decoded(ConsumerProtocolAssignment, assignment) if protocol_type == CONSUMER_PROTOCOL else None
    if decoded is None:
        return {}
    return {entry.topic: sorted(int(p) for p in entry.partitions) for entry in decoded.assigned_partitions}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bytes(text: str) -> bytes:
    return base64.b64decode(text)


def _fresh(protocol_type: str) -> dict:
    return {
        "state": EMPTY,
        "protocol_type": protocol_type,
        "protocol": None,
        "leader": None,
        "deadline_ms": 0,
        "members": {},
    }


def _choose_protocol(classic: dict) -> str:
    """Kafka's vote: among the protocols every member supports, each member votes its most preferred."""
    members = list(classic["members"].values())
    common = set.intersection(*({name for name, _ in m["protocols"]} for m in members))
    votes = Counter(next(name for name, _ in m["protocols"] if name in common) for m in members)
    return max(sorted(votes), key=lambda name: votes[name])


def _metadata(member: dict, protocol: str) -> bytes:
    return next((_bytes(data) for name, data in member["protocols"] if name == protocol), b"")


class ClassicGroups:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # ---- the group row's classic state

    async def _save(self, conn: asyncpg.Connection, group: Group, classic: dict, now: int) -> None:
        """Saves the state with each member's assigned partitions decoded beside it (for describe and lag)."""
        assignment = {
            member_id: assigned_partitions(classic["protocol_type"], _bytes(member["assignment"]))
            for member_id, member in classic["members"].items()
            if member["assignment"]
        }
        assignment[CLASSIC_STATE_KEY] = classic
        group.assignment = assignment
        group.last_update_ms = now
        await groups.save_generation(conn, group)

    @staticmethod
    def _prepare(classic: dict, now: int) -> None:
        """Every member must rejoin, within the largest of their rebalance timeouts."""
        classic["state"] = PREPARING
        classic["deadline_ms"] = now + max((m["rebalance_timeout_ms"] for m in classic["members"].values()), default=0)
        for member in classic["members"].values():
            member["joined"] = False

    async def _try_complete(self, conn: asyncpg.Connection, group: Group, classic: dict, now: int) -> None:
        """Completes a rebalance once every member rejoined or the deadline passed (the caller holds the row)."""
        if classic["state"] != PREPARING:
            return
        late = [member_id for member_id, m in classic["members"].items() if not m["joined"]]
        if late and now < classic["deadline_ms"]:
            return
        if late:
            await groups.remove_members(conn, group.group_id, late)
            for member_id in late:
                del classic["members"][member_id]
        group.generation_id += 1
        for member in classic["members"].values():
            member["assignment"] = ""
        if not classic["members"]:
            classic.update(state=EMPTY, protocol=None, leader=None)
            return
        classic["protocol"] = _choose_protocol(classic)
        if classic["leader"] not in classic["members"]:
            classic["leader"] = min(classic["members"])
        classic["state"] = COMPLETING

    async def members_removed(self, conn: asyncpg.Connection, group: Group, now: int) -> None:
        """After members left or were evicted (their group_members rows are gone): the rest rebalance,
        or the group becomes Empty (a new generation either way, as Kafka)."""
        classic = classic_state(group)
        remaining = {m.member_id for m in await groups.members(conn, group.group_id)}
        for member_id in [m for m in classic["members"] if m not in remaining]:
            del classic["members"][member_id]
        if classic["state"] != PREPARING:
            self._prepare(classic, now)
        await self._try_complete(conn, group, classic, now)
        await self._save(conn, group, classic, now)

    # ---- JoinGroup

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        member_id_required: bool,
    ) -> JoinResult:
        """Joins and waits for the rebalance to complete. A new member (member_id "") of a client
        that can take MEMBER_ID_REQUIRED (JoinGroup v4+) first gets its id and rejoins with it; the
        id is not remembered (a member id this group does not know joins as a new member)."""
        now = now_ms()
        if not protocols:
            raise _inconsistent(group_id, f"a JoinGroup of protocol type {protocol_type!r} named no protocol")
        if member_id == "":
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if member_id_required:
                return JoinResult(member_id, -1, protocol_type, None, "", [], member_id_required=True)
        encoded = [[name, _b64(metadata)] for name, metadata in protocols]
        async with self.pool.acquire() as conn, conn.transaction():
            group = await groups.lock(conn, group_id, now)
            classic = classic_state(group)
            current = await groups.members(conn, group_id)
            kafka_members = set(classic["members"]) if classic else set()
            if any(m.member_id not in kafka_members for m in current):
                raise _inconsistent(
                    group_id,
                    "its members joined over HTTP (POST /v1/groups/{group_id}/heartbeat): a group takes the "
                    "kind of its first member; use another group id, or wait until its HTTP members left",
                )
            if classic is None or not classic["members"]:
                classic = _fresh(protocol_type)
            elif protocol_type != classic["protocol_type"]:
                raise _inconsistent(
                    group_id,
                    f"protocol type {protocol_type!r} received, the group's members use {classic['protocol_type']!r}",
                )
            elif not set.intersection(
                {name for name, _ in protocols}, *({n for n, _ in m["protocols"]} for m in classic["members"].values())
            ):
                raise _inconsistent(
                    group_id,
                    f"none of the protocols {sorted(name for name, _ in protocols)} is supported by every "
                    f"member of the group",
                )
            previous = classic["members"].get(member_id)
            topics = subscribed_topics(protocol_type, protocols)
            if previous is None:
                await groups.add_member(conn, group_id, Member(member_id, topics, session_timeout_ms, now, now))
            else:
                await groups.touch_member(conn, group_id, member_id, topics, session_timeout_ms, now)
            if (
                previous is not None
                and classic["state"] == STABLE
                and previous["protocols"] == encoded
                and member_id != classic["leader"]
            ):
                # As Kafka: a follower rejoining with what it had gets the current generation, no rebalance.
                return self._join_result(group, classic, member_id)
            if classic["state"] != PREPARING:
                self._prepare(classic, now)
            classic["members"][member_id] = {
                "protocols": encoded,
                "rebalance_timeout_ms": rebalance_timeout_ms,
                "session_timeout_ms": session_timeout_ms,
                "client_id": client_id,
                "client_host": client_host,
                "group_instance_id": group_instance_id,
                "joined": True,
                "assignment": "",
            }
            classic["deadline_ms"] = max(classic["deadline_ms"], now + rebalance_timeout_ms)
            target = group.generation_id + 1
            await self._try_complete(conn, group, classic, now)
            await self._save(conn, group, classic, now)
        return await self._await_join(group_id, member_id, target)

    @staticmethod
    def _join_result(group: Group, classic: dict, member_id: str) -> JoinResult:
        members = []
        if member_id == classic["leader"]:
            members = [
                JoinedMember(mid, m["group_instance_id"], _metadata(m, classic["protocol"]))
                for mid, m in sorted(classic["members"].items())
            ]
        return JoinResult(
            member_id, group.generation_id, classic["protocol_type"], classic["protocol"], classic["leader"], members
        )

    async def _await_join(self, group_id: str, member_id: str, target_generation: int) -> JoinResult:
        while True:
            async with self.pool.acquire() as conn:
                now = now_ms()
                # Waiting in a rebalance is not a lapse of the session (as Kafka).
                if not await groups.touch(conn, group_id, member_id, now):
                    raise _unknown_member(group_id, member_id)
                group = await groups.get(conn, group_id)
                classic = classic_state(group)
                if classic is None or member_id not in classic["members"]:
                    raise _unknown_member(group_id, member_id)
                if group.generation_id >= target_generation:
                    return self._join_result(group, classic, member_id)
                if classic["state"] == PREPARING and now >= classic["deadline_ms"]:
                    async with conn.transaction():
                        group = await groups.lock(conn, group_id, now)
                        classic = classic_state(group)
                        if classic is not None and classic["state"] == PREPARING:
                            await self._try_complete(conn, group, classic, now)
                            await self._save(conn, group, classic, now)
                    continue
            await asyncio.sleep(POLL_S)

    # ---- SyncGroup

    async def sync(
        self, group_id: str, member_id: str, generation_id: int, assignments: dict[str, bytes]
    ) -> SyncResult:
        """The leader's SyncGroup stores every member's assignment (the group is then Stable); each
        member's SyncGroup answers its own, once the leader's has come."""
        now = now_ms()
        async with self.pool.acquire() as conn, conn.transaction():
            group = await groups.lock(conn, group_id, now)
            classic = self._checked(group, member_id, generation_id)
            await groups.touch(conn, group_id, member_id, now)
            if classic["state"] == COMPLETING and member_id == classic["leader"]:
                for mid, member in classic["members"].items():
                    member["assignment"] = _b64(assignments.get(mid, b""))
                classic["state"] = STABLE
                await self._save(conn, group, classic, now)
        # A leader that never syncs: after the rebalance timeout the member rejoins (as Kafka's
        # newer coordinators answer), so that no request waits without end.
        deadline = now + classic["members"][member_id]["rebalance_timeout_ms"]
        while True:
            async with self.pool.acquire() as conn:
                group = await groups.get(conn, group_id)
            classic = self._checked(group, member_id, generation_id)
            if classic["state"] == STABLE:
                member = classic["members"][member_id]
                return SyncResult(classic["protocol_type"], classic["protocol"], _bytes(member["assignment"]))
            if now_ms() >= deadline:
                raise _rebalancing(group_id)
            await asyncio.sleep(POLL_S)

    @staticmethod
    def _checked(group: Group | None, member_id: str, generation_id: int) -> dict:
        """The group's classic state, if this member of this generation may sync or heartbeat."""
        classic = None if group is None else classic_state(group)
        if classic is None or member_id not in classic["members"]:
            raise _unknown_member(group.group_id if group else "", member_id)
        if classic["state"] == PREPARING:
            raise _rebalancing(group.group_id)
        if generation_id != group.generation_id:
            raise BrokerError(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {generation_id} of group {group.group_id!r} is not the current one "
                f"({group.generation_id}): rejoin",
            )
        return classic

    # ---- Heartbeat, LeaveGroup

    async def heartbeat(self, group_id: str, member_id: str, generation_id: int) -> None:
        now = now_ms()
        async with self.pool.acquire() as conn:
            if not await groups.touch(conn, group_id, member_id, now):
                raise _unknown_member(group_id, member_id)
            group = await groups.get(conn, group_id)
            classic = None if group is None else classic_state(group)
            if classic is not None and classic["state"] == PREPARING and now >= classic["deadline_ms"]:
                async with conn.transaction():  # nobody is waiting to complete it: the late are removed
                    group = await groups.lock(conn, group_id, now)
                    classic = classic_state(group)
                    await self._try_complete(conn, group, classic, now)
                    await self._save(conn, group, classic, now)
        self._checked(group, member_id, generation_id)

    async def leave(self, group_id: str, member_ids: list[str]) -> list[BrokerError | None]:
        now = now_ms()
        async with self.pool.acquire() as conn, conn.transaction():
            group = await groups.lock(conn, group_id, now)
            classic = classic_state(group)
            known = set(classic["members"]) if classic else set()
            errors = [None if m in known else _unknown_member(group_id, m) for m in member_ids]
            leaving = sorted({m for m in member_ids if m in known})
            if leaving:
                await groups.remove_members(conn, group_id, leaving)
                await self.members_removed(conn, group, now)
        return errors

    # ---- describe

    @staticmethod
    def described_members(group: Group) -> dict[str, dict]:
        """Each member's client id and host, and its metadata and assignment bytes."""
        classic = classic_state(group)
        if classic is None:
            return {}
        return {
            member_id: {
                "client_id": m["client_id"],
                "client_host": m["client_host"],
                "group_instance_id": m["group_instance_id"],
                "metadata": _metadata(m, classic["protocol"]) if classic["protocol"] else b"",
                "assignment": _bytes(m["assignment"]),
            }
            for member_id, m in classic["members"].items()
        }
