"""The classic members of a KIP-848 consumer group (Kafka 4's online migration): Kafka consumers of
the classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) that stayed members when their
classic group became a consumer group (consumer_groups.py `_upgraded`), or joined it since. As
Kafka's GroupMetadataManager serves them (classicGroupJoinToConsumerGroup,
classicGroupSyncToConsumerGroup, classicGroupHeartbeatToConsumerGroup,
classicGroupLeaveToConsumerGroup), the consumer group's logic assigns them:

- a JoinGroup updates the member (its subscription read from its protocols' ConsumerProtocol
  metadata, the partitions it says it owns, its protocols and session timeout kept as its
  `classic` entry), recomputes the target when the group epoch moves, reconciles the member as a
  heartbeat of the consumer protocol would, and is answered at once: the member's epoch as the
  generation, no leader's work (the server assigned);
- a SyncGroup answers the member's assigned partitions as a ConsumerProtocolAssignment in its
  subscription's version, or REBALANCE_IN_PROGRESS when the group epoch moved past the member's
  (unless it is revoking: it first gets what it keeps, and gives up the rest);
- a Heartbeat answers REBALANCE_IN_PROGRESS when the member must rejoin to move on: the group epoch
  moved past its epoch, it has partitions to give up, or the partitions it waits for were released;
- a LeaveGroup removes the member (the group epoch is bumped; once no member of the consumer
  protocol remains, the group is a classic one again: consumer_groups.py `_downgrade`).

Every request holds the group row (FOR UPDATE; a Heartbeat reads it), as the consumer protocol's do.
Not as Kafka: no member id is remembered between MEMBER_ID_REQUIRED and the JoinGroup that brings it
back (any id is taken then, as Kafka takes it for such a group), and the SyncGroup that follows a
JoinGroup is not timed (the member's session and revocation deadline still are).
"""

from __future__ import annotations

import uuid

import asyncpg

from app.coordinator.classic_groups import (
    CONSUMER_PROTOCOL,
    Caller,
    ClassicJoin,
    JoinResult,
    SyncResult,
    decoded_protocols,
    decoded_subscription,
    encoded_assignment,
    encoded_protocols,
    inconsistent_protocol,
    metadata_version,
    owned_partitions,
    unknown_classic_member,
)
from app.coordinator.consumer_groups import (
    UNRELEASED,
    UNREVOKED,
    ConsumerGroups,
    check_instance,
    consumer_state,
    is_classic,
    new_member,
    owned_elsewhere,
    partition_set,
    resolve_subscription,
)
from app.coordinator.identifiers import within_limit
from app.errors import BrokerError, ErrorCode
from app.storage.groups import groups
from app.storage.groups.groups import Group, Member


def _rebalancing(group_id: str, member_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.REBALANCE_IN_PROGRESS,
        f"consumer group {group_id!r} has a new assignment for member {member_id!r}: rejoin (JoinGroup) to get it",
    )


def _first_protocol_version(member: dict) -> int:
    """The ConsumerProtocol version of the member's first protocol's metadata, which its assignment
    is encoded in (the protocol a JoinGroup of this group answers)."""
    protocols = decoded_protocols(member["classic"]["protocols"])
    return metadata_version(protocols[0][1]) if protocols else 0


def _waiting_on_unreleased(state: dict, member_id: str, member: dict) -> bool:
    """Whether a partition of the member's target it has not got is still another member's (Kafka's
    ConsumerGroup.waitingOnUnreleasedPartition): until none is, it need not rejoin."""
    wanted = partition_set(state["target"].get(member_id, {})) - partition_set(member["assigned"])
    return bool(wanted & owned_elsewhere(state, member_id))


class ClassicMembers:
    def __init__(self, consumer: ConsumerGroups) -> None:
        self.consumer = consumer

    @staticmethod
    def _member(state: dict, group_id: str, member_id: str, instance_id: str | None) -> dict:
        """The classic member a SyncGroup, Heartbeat or LeaveGroup names (UNKNOWN_MEMBER_ID,
        FENCED_INSTANCE_ID as Kafka's validateConsumerGroupMember; a member of the consumer protocol
        is none: Kafka's throwIfMemberDoesNotUseClassicProtocol)."""
        if instance_id is not None:
            check_instance(group_id, state, member_id, instance_id)
        member = state["members"].get(member_id)
        if member is None or not is_classic(member):
            raise unknown_classic_member(group_id, member_id)
        return member

    @classmethod
    def _of_generation(cls, state: dict, group_id: str, caller: Caller) -> dict:
        """The classic member a SyncGroup or Heartbeat names, if its generation is the member's epoch
        (ILLEGAL_GENERATION, as Kafka's throwIfGenerationIdUnmatched)."""
        member_id, generation_id, instance_id = caller
        member = cls._member(state, group_id, member_id, instance_id)
        if generation_id != member["member_epoch"]:
            raise BrokerError(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {generation_id} of member {member_id!r} of consumer group {group_id!r} is not its "
                f"current one ({member['member_epoch']}): rejoin",
            )
        return member

    async def join(
        self, conn: asyncpg.Connection, group: Group, current: list[Member], request: ClassicJoin, now: int
    ) -> JoinResult:
        """A classic member's JoinGroup of the consumer group (the caller holds its row)."""
        group_id = group.group_id
        member_id, instance_id, protocol_type, protocols = (
            request.member_id,
            request.group_instance_id,
            request.protocol_type,
            request.protocols,
        )
        session_timeout_ms, rebalance_timeout_ms = request.session_timeout_ms, request.rebalance_timeout_ms
        state = consumer_state(group)
        names = {name for name, _ in protocols}
        if protocol_type != CONSUMER_PROTOCOL:
            raise inconsistent_protocol(
                group_id,
                f"a JoinGroup of protocol type {protocol_type!r} received, a consumer group takes Kafka consumers' "
                f"({CONSUMER_PROTOCOL!r}) only: use another group id",
            )
        for other_id, other in state["members"].items():
            supported = {name for name, _ in other["classic"]["protocols"]} if is_classic(other) else names
            if other_id != member_id and not names & supported:
                raise inconsistent_protocol(
                    group_id,
                    f"none of the protocols {sorted(names)} is supported by classic member {other_id!r}: use an "
                    f"assignor every classic member names (partition.assignment.strategy)",
                )
        subscription = decoded_subscription(protocols)
        if subscription is None:
            raise inconsistent_protocol(
                group_id,
                f"none of the protocols {sorted(names)} carries a ConsumerProtocol subscription this server can "
                f"read: a consumer group's classic members must be Kafka consumers",
            )
        unknown = member_id == ""
        if unknown:
            member_id = within_limit(request.client_id or "member", f"-{uuid.uuid4()}")
            if instance_id is None and request.member_id_required:
                return JoinResult(member_id, -1, protocol_type, None, "", [], member_id_required=True)
        bumped = await self.consumer.remove_lapsed(conn, group, state, current, now)
        member = state["members"].get(member_id)
        replacing = False  # a static member's instance joining under a new member id
        if instance_id is not None:
            if member is None and unknown:
                member = await self.consumer.static_member_returns(
                    conn, group_id, state, member_id, instance_id, now, session_timeout_ms, require_released=False
                )
                # Its previous member may be of either protocol (a rolling downgrade restarts a
                # consumer-protocol one as a classic one): it is replaced, as Kafka replaces it.
                replacing = member is not None
            else:
                check_instance(group_id, state, member_id, instance_id)
        if member is not None and not replacing and not is_classic(member):
            raise inconsistent_protocol(
                group_id,
                f"member {member_id!r} joined with the consumer protocol (ConsumerGroupHeartbeat): it cannot "
                f'rejoin with JoinGroup under its id; join with member_id ""',
            )
        if member is None:
            member = state["members"][member_id] = new_member(rebalance_timeout_ms)
            await groups.add_member(conn, group_id, Member(member_id, [], session_timeout_ms, now, now))
            bumped = True
        topics = sorted(set(subscription.topics))
        bumped |= topics != member["names"]
        member.update(
            names=topics,
            rebalance_timeout_ms=rebalance_timeout_ms,
            instance_id=instance_id,
            rack_id=getattr(subscription, "rack_id", None),
            client_id=request.client_id,
            client_host=request.client_host,
            classic={"session_timeout_ms": session_timeout_ms, "protocols": encoded_protocols(protocols)},
        )
        bumped |= resolve_subscription(state, member)
        await self.consumer.update(
            conn,
            group,
            state,
            now,
            bumped,
            reconciling=(member_id, owned_partitions(subscription), lambda _topic: True),
        )
        await groups.touch_member(conn, group_id, member_id, member["subscribed"], session_timeout_ms, now)
        return JoinResult(member_id, member["member_epoch"], CONSUMER_PROTOCOL, protocols[0][0], "", [])

    async def sync(
        self, conn: asyncpg.Connection, group: Group, caller: Caller, protocol: tuple[str | None, str | None], now: int
    ) -> SyncResult:
        """A classic member's SyncGroup (the caller holds the row): its assigned partitions.
        `protocol`: the protocol type and name SyncGroup v5+ names (None: not named)."""
        group_id, member_id = group.group_id, caller.member_id
        protocol_type, protocol_name = protocol
        state = consumer_state(group)
        member = self._of_generation(state, group_id, caller)
        protocols = decoded_protocols(member["classic"]["protocols"])
        if protocol_type is not None and protocol_type != CONSUMER_PROTOCOL:
            raise inconsistent_protocol(
                group_id, f"SyncGroup names protocol type {protocol_type!r}, the group's is 'consumer'"
            )
        if protocol_name is not None and protocol_name not in {name for name, _ in protocols}:
            raise inconsistent_protocol(
                group_id,
                f"SyncGroup names protocol {protocol_name!r}, which member {member_id!r} did not join with: sync with "
                f"the protocol JoinGroup answered",
            )
        # As Kafka's throwIfRebalanceInProgress: a member revoking has rejoined already; it first
        # gets what it keeps.
        if group.generation_id > member["member_epoch"] and member["state"] != UNREVOKED:
            raise _rebalancing(group_id, member_id)
        await groups.touch(conn, group_id, member_id, now)
        assignment = encoded_assignment(member["assigned"], _first_protocol_version(member))
        return SyncResult(CONSUMER_PROTOCOL, protocol_name or protocols[0][0], assignment)

    async def heartbeat(self, conn: asyncpg.Connection, group: Group, caller: Caller, now: int) -> None:
        """A classic member's Heartbeat: its session goes on; REBALANCE_IN_PROGRESS when it must rejoin
        (Kafka's classicGroupHeartbeatToConsumerGroup)."""
        group_id, member_id = group.group_id, caller.member_id
        state = consumer_state(group)
        member = self._of_generation(state, group_id, caller)
        if not await groups.touch(conn, group_id, member_id, now):
            raise unknown_classic_member(group_id, member_id)
        if (
            member["member_epoch"] < group.generation_id
            or member["state"] == UNREVOKED
            or (member["state"] == UNRELEASED and not _waiting_on_unreleased(state, member_id, member))
        ):
            raise _rebalancing(group_id, member_id)

    async def leave(
        self, conn: asyncpg.Connection, group: Group, leaving: list[tuple[str, str | None]], now: int
    ) -> list[BrokerError | None]:
        """A LeaveGroup of the consumer group (the caller holds the row): each named member (by its
        instance id when its member id is "") is removed, whatever its protocol, as Kafka's
        classicGroupLeaveToConsumerGroup; the group epoch is bumped once."""
        group_id = group.group_id
        state = consumer_state(group)
        errors: list[BrokerError | None] = []
        removed: set[str] = set()
        for member_id, instance_id in leaving:
            if member_id == "" and instance_id is not None:
                member_id = next(
                    (mid for mid, m in state["members"].items() if m.get("instance_id") == instance_id), ""
                )
            try:
                if instance_id is not None:
                    check_instance(group_id, state, member_id, instance_id)
                if member_id not in state["members"]:
                    raise unknown_classic_member(group_id, member_id)
            except BrokerError as error:
                errors.append(error)
                continue
            removed.add(member_id)
            errors.append(None)
        if removed:
            await groups.remove_members(conn, group_id, sorted(removed))
            await self.consumer.members_removed(conn, group, now)
        return errors
