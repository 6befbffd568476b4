"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on the groups HTTP's
heartbeat uses: the same `consumer_groups` row (its generation), the same `group_members` rows
(sessions, subscribed topics: what expiry, DescribeGroups, lag and the console read), the same
committed offsets. What only this protocol has (the rebalance state, the chosen protocol, the
leader, each member's protocols and the assignment bytes the leader computed) is the group row's
`assignment[CLASSIC_STATE_KEY]` (app/storage/groups/groups.py), with the ids MEMBER_ID_REQUIRED gave
out (pending members, each until its session timeout) and the initial rebalance delay's timer.

The broker relays, it never assigns: the leader's SyncGroup carries every member's assignment
bytes, whatever its assignor (range, roundrobin, cooperative-sticky).

A rebalance, as Kafka's coordinator runs it, with PostgreSQL as the only shared state (members of
one group reach different workers and nodes):
- a JoinGroup moves the group to PreparingRebalance (every member must rejoin) and waits;
- the JoinGroup that finds every member rejoined, or any waiter that finds the rebalance deadline
  passed (the members' largest rebalance timeout, set when the rebalance began and never put off by
  a later join, as Kafka's prepareRebalance), completes it under the group row lock: dynamic
  members that did not rejoin are removed (static ones stay, as in Kafka), the generation is bumped,
  a protocol every member supports is chosen, a leader kept or picked among those that rejoined, and
  the group is CompletingRebalance;
- the waiters see the new generation (a change to their group wakes them at once: one committed in
  their process directly, group_wake_ups.py, one in another by its NOTIFY; they also poll the row,
  for a notification lost) and answer; the leader's SyncGroup stores
  the assignments and makes the group Stable; the others' SyncGroups wait for that; a member that
  sends no SyncGroup within the rebalance timeout is removed (Kafka's pending sync), found overdue
  by a Heartbeat or a waiting SyncGroup, as Kafka's timers would have.
Every change holds the group row FOR UPDATE, so two processes never complete one rebalance twice.

As Kafka's coordinator also:
- a new member of a client that can take MEMBER_ID_REQUIRED (JoinGroup v4+, KIP-394) gets an id it
  must rejoin with within its session timeout (a pending member, which a rebalance waits for); a
  member id the group never gave out, or forgot, is UNKNOWN_MEMBER_ID;
- static members (KIP-345, group.instance.id): one joining with a known instance id takes the old
  member's place (and assignment) under a new member id, without a rebalance when the group is
  Stable and its metadata unchanged; the old member id is then FENCED_INSTANCE_ID wherever it is
  sent with the instance id. A static member sends no LeaveGroup when it stops: its session lapse
  (or a LeaveGroup naming its instance id, v3+) removes it;
- the first rebalance of an Empty group waits `group_initial_rebalance_delay_ms` for more members,
  again while new ones keep joining, at most the rebalance timeout (group.initial.rebalance.delay.ms),
  so that a group starting together is assigned once;
- a JoinGroup whose session timeout is outside `group_min_session_timeout_ms` ..
  `group_max_session_timeout_ms` (group.min/max.session.timeout.ms) is INVALID_SESSION_TIMEOUT before
  the group is looked at: no member is added, replaced or forgotten, no rebalance starts; a known or
  static member rejoining is held to the same bounds.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from typing import NamedTuple

import asyncpg
from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment as AssignmentV0
from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as AssignedTopicV0
from kio.schema.consumer_protocol_assignment.v1.data import ConsumerProtocolAssignment as AssignmentV1
from kio.schema.consumer_protocol_assignment.v1.data import TopicPartition as AssignedTopicV1
from kio.schema.consumer_protocol_assignment.v2.data import ConsumerProtocolAssignment as AssignmentV2
from kio.schema.consumer_protocol_assignment.v2.data import TopicPartition as AssignedTopicV2
from kio.schema.consumer_protocol_assignment.v3.data import ConsumerProtocolAssignment as AssignmentV3
from kio.schema.consumer_protocol_assignment.v3.data import TopicPartition as AssignedTopicV3
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription as SubscriptionV0
from kio.schema.consumer_protocol_subscription.v1.data import ConsumerProtocolSubscription as SubscriptionV1
from kio.schema.consumer_protocol_subscription.v2.data import ConsumerProtocolSubscription as SubscriptionV2
from kio.schema.consumer_protocol_subscription.v3.data import ConsumerProtocolSubscription as SubscriptionV3
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from app.clock import now_ms
from app.coordinator.group_wake_ups import GroupWakeUps
from app.coordinator.identifiers import check_identifier, check_member_group_id, within_limit
from app.errors import BrokerError, ErrorCode
from app.storage.groups import groups
from app.storage.groups.groups import CLASSIC_STATE_KEY, CONSUMER_STATE_KEY, ClassicKind, Group, Member
from app.storage.log.append_notifier import AppendNotifier

PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
EMPTY = "Empty"
# How often a JoinGroup or SyncGroup waiting for the rest of the group re-reads the group row when
# nothing wakes it. A change committed in its own process wakes it at once (group_wake_ups.py), one
# committed in another worker or node by its NOTIFY (`listen_for_changes`): the poll only bounds the
# wait for a notification lost while the listening connection was down, or not yet up.
POLL_S = 0.5
# Kafka's "consumer" protocol type: its metadata and assignments are ConsumerProtocol messages,
# which this module reads for the subscribed topics and assigned partitions others describe.
CONSUMER_PROTOCOL = "consumer"


@dataclass(frozen=True, slots=True)
class SessionTimeoutBounds:
    """The session timeouts a JoinGroup may ask for, both included (Kafka's group.min.session.timeout.ms
    and group.max.session.timeout.ms; the server's come from its settings)."""

    min_ms: int
    max_ms: int

    def check(self, group_id: str, session_timeout_ms: int) -> None:
        if not self.min_ms <= session_timeout_ms <= self.max_ms:
            raise BrokerError(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"JoinGroup of group {group_id!r} asked for a session timeout of {session_timeout_ms} ms; this server "
                f"accepts {self.min_ms}..{self.max_ms} ms (group_min_session_timeout_ms, "
                f"group_max_session_timeout_ms): set the consumer's session.timeout.ms within them",
            )


# A coordinator made without the server's settings (tests of other parts) takes any session timeout
# the wire can carry (an int32).
ANY_SESSION_TIMEOUT = SessionTimeoutBounds(0, 2**31 - 1)


class Caller(NamedTuple):
    """Who sends a SyncGroup or Heartbeat to a consumer group: its member id, generation and group
    instance id (classic_members.py)."""

    member_id: str
    generation_id: int
    instance_id: str | None


@dataclass(frozen=True, slots=True)
class ClassicJoin:
    """A JoinGroup as the Kafka door received it: ClassicGroups.join's request, and a classic
    member's of a KIP-848 consumer group (classic_members.py). `member_id_required`: the client can
    take MEMBER_ID_REQUIRED (JoinGroup v4+); `skip_assignment_allowed`: JoinGroup v9+, whose leader
    may be told to keep the assignment."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    member_id_required: bool
    skip_assignment_allowed: bool = False


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
    # JoinGroup v9+: the leader of a Stable group whose static member rejoined keeps the assignment.
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    protocol_type: str | None
    protocol_name: str | None
    assignment: bytes


def classic_state(group: Group) -> dict | None:
    return group.assignment.get(CLASSIC_STATE_KEY)


# How HTTP's groups (server-side assignment) are listed to Kafka's admin clients.
HTTP_PROTOCOL_TYPE = "http"


def group_kind(group: Group, member_count: int) -> tuple[str, str, str]:
    """(protocol type, state, protocol) of a group of either door, as Kafka's ListGroups and
    DescribeGroups, HTTP's listing and describe and the console show it (`kind_of` of its row)."""
    return kind_of(groups.classic_kind(group.assignment), member_count)


# KIP-848's group types, as ListGroups v5 names them.
CLASSIC_GROUP_TYPE = groups.CLASSIC_GROUP_TYPE
CONSUMER_GROUP_TYPE = groups.CONSUMER_GROUP_TYPE


def group_type(group: Group) -> str:
    """KIP-848's type of a group: "consumer" for ConsumerGroupHeartbeat's groups, "classic" for the
    others (JoinGroup's; HTTP's, which Kafka has no type for)."""
    kind = groups.classic_kind(group.assignment)
    return CLASSIC_GROUP_TYPE if kind is None else kind.group_type


def kind_of(classic: ClassicKind | None, member_count: int) -> tuple[str, str, str]:
    """(protocol type, state, protocol) of a group whose classic state says `classic` and which has
    `member_count` members: a Kafka group's own rebalance state and the protocol its members chose,
    an HTTP group Stable with the server's range assignment while it has members. The one rule every
    view applies (the console's group list to the kind its query reads, `groups.classic_kind_sql`)."""
    if classic is not None and classic.has_members:
        return classic.protocol_type, classic.state, classic.protocol or ""
    if classic is not None and not member_count:
        return classic.protocol_type, EMPTY, ""
    return (
        (HTTP_PROTOCOL_TYPE if member_count else ""),
        (STABLE if member_count else EMPTY),
        ("range" if member_count else ""),
    )


def described_assignment(group: Group, state: str) -> dict[str, dict[str, list[int]]]:
    """The members' assigned partitions (member id -> topic -> partitions) a describe shows of a group
    in `state`: as Kafka's coordinator describes a group, only a Stable one's; a rebalancing Kafka
    group's are those of a generation that is ending, or none yet, and are not shown. A KIP-848
    consumer group's members own their assigned partitions whatever its state (as Kafka's
    ConsumerGroupDescribe shows them): always shown."""
    if (
        state == STABLE
        or groups.classic_kind(group.assignment) is not None
        and group_type(group) == CONSUMER_GROUP_TYPE
    ):
        return group.assignment
    return {}


def inconsistent_protocol(group_id: str, detail: str) -> BrokerError:
    return BrokerError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"group {group_id!r}: {detail}")


def unknown_classic_member(group_id: str, member_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_MEMBER_ID,
        f"member {member_id!r} is not in group {group_id!r} (left, or removed when its session timed out "
        f'or it did not rejoin a rebalance in time): rejoin with member_id ""',
    )


def _fenced_instance(group_id: str, member_id: str, group_instance_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.FENCED_INSTANCE_ID,
        f"member {member_id!r} of group {group_id!r} is no longer group instance {group_instance_id!r}: a "
        f"newer member joined with that group.instance.id; this instance must stop (two instances have "
        f"one group.instance.id)",
    )


def static_member_id(classic: dict | None, group_instance_id: str) -> str | None:
    """The member id the static member of this group.instance.id has now."""
    members = classic["members"] if classic else {}
    return next((mid for mid, m in members.items() if m.get("group_instance_id") == group_instance_id), None)


def fenced_instance_error(
    classic: dict | None, group_id: str, member_id: str, group_instance_id: str | None
) -> BrokerError | None:
    """FENCED_INSTANCE_ID for a request naming an instance id that another member id now holds (a
    JoinGroup: an instance id no member holds is a new static member)."""
    if group_instance_id is None:
        return None
    current = static_member_id(classic, group_instance_id)
    if current is not None and current != member_id:
        return _fenced_instance(group_id, member_id, group_instance_id)
    return None


def instance_error(
    classic: dict | None, group_id: str, member_id: str, group_instance_id: str | None
) -> BrokerError | None:
    """A member's request other than JoinGroup (Heartbeat, SyncGroup, LeaveGroup, a commit) naming a
    group.instance.id, checked as Kafka's coordinator validates a member: FENCED_INSTANCE_ID when
    another member id holds it, UNKNOWN_MEMBER_ID when no member does (the member id alone, a dynamic
    member's say, does not make the request a member's)."""
    if group_instance_id is not None and static_member_id(classic, group_instance_id) is None:
        return BrokerError(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"group {group_id!r} has no member of group instance {group_instance_id!r} (received with member id "
            f"{member_id!r}): it left or its session lapsed; rejoin the group",
        )
    return fenced_instance_error(classic, group_id, member_id, group_instance_id)


def _rebalancing(group_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.REBALANCE_IN_PROGRESS,
        f"group {group_id!r} is rebalancing: rejoin (JoinGroup) to get the new generation",
    )


# The ConsumerProtocol messages by version (their first two bytes): each version is read with its
# own schema, since an older one lacks the fields a newer one appends.
SUBSCRIPTION_VERSIONS = (SubscriptionV0, SubscriptionV1, SubscriptionV2, SubscriptionV3)
ASSIGNMENT_VERSIONS = (AssignmentV0, AssignmentV1, AssignmentV2, AssignmentV3)
ASSIGNED_TOPIC_VERSIONS = (AssignedTopicV0, AssignedTopicV1, AssignedTopicV2, AssignedTopicV3)


def _decoded(versions: tuple, data: bytes):
    """A ConsumerProtocol message in the version it names (one newer than known is read as the
    newest known: versions only append fields), or None."""
    if len(data) < 2:
        return None
    version = int.from_bytes(data[:2], "big", signed=True)
    if version < 0:
        return None
    try:
        return entity_reader(versions[min(version, len(versions) - 1)])(data, 2)[0]
    except Exception:  # a client's own bytes: what they hold is only described, never relied on
        return None


def subscribed_topics(protocol_type: str, protocols: list[tuple[str, bytes]]) -> list[str]:
    if protocol_type != CONSUMER_PROTOCOL:
        return []
    topics: set[str] = set()
    for _, metadata in protocols:
        subscription = _decoded(SUBSCRIPTION_VERSIONS, metadata)
        if subscription is not None:
            topics.update(subscription.topics)
    return sorted(topics)


def assigned_partitions(protocol_type: str, assignment: bytes) -> dict[str, list[int]]:
    decoded = _decoded(ASSIGNMENT_VERSIONS, assignment) if protocol_type == CONSUMER_PROTOCOL else None
    if decoded is None:
        return {}
    return {entry.topic: sorted(int(p) for p in entry.partitions) for entry in decoded.assigned_partitions}


def readable_assignment(assignment: bytes) -> bool:
    """Whether assignment bytes are a ConsumerProtocolAssignment this server reads."""
    return _decoded(ASSIGNMENT_VERSIONS, assignment) is not None


def decoded_subscription(protocols: list[tuple[str, bytes]]):
    """The first of a member's protocols' metadata that reads as a ConsumerProtocolSubscription (as
    Kafka's coordinator reads a classic member's subscription), or None."""
    return next(
        (found for _, metadata in protocols if (found := _decoded(SUBSCRIPTION_VERSIONS, metadata)) is not None), None
    )


def owned_partitions(subscription) -> set[tuple[str, int]]:
    """The partitions a Kafka consumer's subscription (v1+) says it owns; none before v1, or when an
    eager member revoked them all before rejoining."""
    owned = getattr(subscription, "owned_partitions", None) or ()
    return {(entry.topic, int(p)) for entry in owned for p in entry.partitions}


def encoded_assignment(partitions: dict[str, list[int]], version: int) -> bytes:
    """A ConsumerProtocolAssignment of `partitions` (topic -> partitions) in `version` (the version of
    the member's subscription, as Kafka's coordinator answers a classic member), its version first."""
    version = max(0, min(version, len(ASSIGNMENT_VERSIONS) - 1))
    schema, topic_partition = ASSIGNMENT_VERSIONS[version], ASSIGNED_TOPIC_VERSIONS[version]
    assignment = schema(
        assigned_partitions=tuple(
            topic_partition(topic=TopicName(topic), partitions=tuple(i32(p) for p in ps))
            for topic, ps in sorted(partitions.items())
        )
    )
    buffer = io.BytesIO()
    buffer.write(version.to_bytes(2, "big", signed=True))
    entity_writer(schema)(buffer, assignment)
    return buffer.getvalue()


def metadata_version(metadata: bytes) -> int:
    """The version a ConsumerProtocol message names (its first two bytes; 0 when it names none)."""
    return max(0, int.from_bytes(metadata[:2], "big", signed=True)) if len(metadata) >= 2 else 0


def _same_subscription(protocol_type: str, old: list, new: list) -> bool:
    """Whether a restarted static member asks for what it had: the same protocols, and under Kafka's
    consumer protocol the same topics (the rest, such as the partitions it owned before it stopped,
    differs after a restart and is no reason to rebalance); other protocols' bytes as they are."""

    def asked(protocols: list) -> list:
        return [(name, subscribed_topics(protocol_type, [(name, _bytes(data))]) or data) for name, data in protocols]

    return asked(old) == asked(new)


def encoded_protocols(protocols: list[tuple[str, bytes]]) -> list[list[str]]:
    """A JoinGroup's protocols as a group's state keeps them: [name, base64 metadata] each."""
    return [[name, _b64(metadata)] for name, metadata in protocols]


def decoded_protocols(encoded: list[list[str]]) -> list[tuple[str, bytes]]:
    return [(name, _bytes(data)) for name, data in encoded]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bytes(text: str) -> bytes:
    return base64.b64decode(text)


def _fresh(protocol_type: str, pending: dict[str, int]) -> dict:
    return {
        "state": EMPTY,
        "protocol_type": protocol_type,
        "protocol": None,
        "leader": None,
        "deadline_ms": 0,
        "members": {},
        "pending": pending,  # member id -> when it is forgotten unless it rejoins (ms)
        "initial_delay": None,  # the first rebalance's timer (its initial delay), while it runs
        "awaiting_sync": None,  # the generation's members yet to send SyncGroup, and until when
    }


def _pending(classic: dict | None, now: int) -> dict[str, int]:
    """The pending members (ids MEMBER_ID_REQUIRED gave out) whose session has not lapsed."""
    found = classic.get("pending", {}) if classic else {}
    return {member_id: expires for member_id, expires in found.items() if expires > now}


def _completion_due(classic: dict, now: int) -> bool:
    """Whether a rebalance may complete now: the first of an Empty group once its initial delay ran
    out (0: at once; as Kafka's InitialDelayedJoin, pending members are not waited for); any other
    once every member rejoined and no pending member may still join, or at the deadline (the late
    dynamic members are removed, the static ones kept: `_try_complete`)."""
    if classic["state"] != PREPARING:
        return False
    delay = classic.get("initial_delay")
    if delay is not None:
        return now >= delay["until_ms"]
    if now >= classic["deadline_ms"]:
        return True
    return all(m["joined"] for m in classic["members"].values()) and not _pending(classic, now)


def _assigned(classic: dict, generation_id: int) -> bool:
    """Whether the leader of `generation_id` (the group's current one) has synced, storing every
    member's assignment, though the group may have begun the next rebalance since (its leader
    rejoined at once). A member's SyncGroup of that generation is then answered its assignment,
    where Kafka's coordinator answers one that comes in PreparingRebalance REBALANCE_IN_PROGRESS:
    here a member's JoinGroup is answered later than the leader's (its wait re-reads the group),
    and a leader that syncs and rejoins at once (a cooperative one giving up partitions) would take
    the generation from it, which then never sees the one that took it in (librdkafka's 0113 waits
    for it). It is safe: the next generation cannot complete without this member (it must rejoin,
    or be removed at the deadline), so what it is given belongs to no one else meanwhile."""
    return classic.get("assigned_generation") == generation_id


def _next_due_ms(classic: dict) -> int | None:
    """When the next of the group's timers runs out (Kafka's coordinator's timers): the initial
    delay or the rebalance deadline and the pending members' expiries while it rebalances, the
    deadline of the SyncGroups awaited after; None without one."""
    times = []
    if classic["state"] == PREPARING:
        delay = classic.get("initial_delay")
        times.append(delay["until_ms"] if delay is not None else classic["deadline_ms"])
        times.extend(classic.get("pending", {}).values())
    awaiting = classic.get("awaiting_sync")
    if awaiting is not None and classic["state"] in (COMPLETING, STABLE):
        times.append(awaiting["until_ms"])
    return min(times, default=None)


def _overdue_syncs(classic: dict, now: int) -> list[str]:
    """The members of the current generation that have not sent their SyncGroup within its rebalance
    timeout (Kafka's pending sync: a static member kept without rejoining and gone since, a member
    stuck between its JoinGroup and its SyncGroup); they are removed, and the rest rebalance."""
    awaiting = classic.get("awaiting_sync")
    if awaiting is None or classic["state"] not in (COMPLETING, STABLE) or now < awaiting["until_ms"]:
        return []
    return [member_id for member_id in awaiting["member_ids"] if member_id in classic["members"]]


def _choose_protocol(classic: dict) -> str:
    """Kafka's vote: among the protocols every member supports, each member votes its most preferred."""
    members = list(classic["members"].values())
    common = set.intersection(*({name for name, _ in m["protocols"]} for m in members))
    votes = Counter(next(name for name, _ in m["protocols"] if name in common) for m in members)
    return max(sorted(votes), key=lambda name: votes[name])


def _metadata(member: dict, protocol: str) -> bytes:
    return next((_bytes(data) for name, data in member["protocols"] if name == protocol), b"")


async def save_classic_state(conn: asyncpg.Connection, group: Group, classic: dict, now: int) -> None:
    """Saves the state with each member's assigned partitions decoded beside it (for describe and lag)."""
    assignment = {
        member_id: assigned_partitions(classic["protocol_type"], _bytes(member["assignment"]))
        for member_id, member in classic["members"].items()
        if member["assignment"]
    }
    classic["pending"] = _pending(classic, now)  # the lapsed ones are forgotten
    assignment[CLASSIC_STATE_KEY] = classic
    group.assignment = assignment
    group.last_update_ms = now
    await groups.save_generation(conn, group)


def has_consumer_members(group: Group) -> bool:
    """Whether the group is a KIP-848 consumer group with members (some may be classic ones)."""
    state = group.assignment.get(CONSUMER_STATE_KEY)
    return state is not None and bool(state["members"])


def classic_member_entry(
    protocols: list,
    rebalance_timeout_ms: int,
    session_timeout_ms: int,
    client_id: str,
    client_host: str,
    group_instance_id: str | None,
) -> dict:
    """A member of the classic state (`protocols`: [name, base64 metadata] each), not yet rejoined."""
    return {
        "protocols": protocols,
        "rebalance_timeout_ms": rebalance_timeout_ms,
        "session_timeout_ms": session_timeout_ms,
        "client_id": client_id,
        "client_host": client_host,
        "group_instance_id": group_instance_id,
        "joined": False,
        "assignment": "",
    }


def downgraded(consumer: dict, now: int) -> dict:
    """The classic state of a KIP-848 consumer group whose members are all classic ones (Kafka's
    ClassicGroup.fromConsumerGroup): each member keeps its protocols, timeouts and client, its target
    assignment encoded as a ConsumerProtocolAssignment in its subscription's version, the protocol
    chosen by vote, the first member the leader; then every member must rejoin (PreparingRebalance,
    as Kafka's convertToClassicGroup starts a rebalance when a member's leave brought it about)."""
    classic = _fresh(CONSUMER_PROTOCOL, {})
    for member_id, member in sorted(consumer["members"].items()):
        kept = member["classic"]
        classic["members"][member_id] = classic_member_entry(
            kept["protocols"],
            member["rebalance_timeout_ms"],
            kept["session_timeout_ms"],
            member.get("client_id", ""),
            member.get("client_host", ""),
            member.get("instance_id"),
        )
    classic["protocol"] = _choose_protocol(classic)
    for member_id, member in classic["members"].items():
        version = metadata_version(_metadata(member, classic["protocol"]))
        member["assignment"] = _b64(encoded_assignment(consumer["target"].get(member_id, {}), version))
    classic["leader"] = min(classic["members"])
    classic["assigned_generation"] = None
    ClassicGroups._prepare(classic, now)
    return classic


class ClassicGroups:
    def __init__(
        self,
        pool: asyncpg.Pool,
        initial_rebalance_delay_ms: int = 0,
        session_timeout_bounds: SessionTimeoutBounds = ANY_SESSION_TIMEOUT,
    ) -> None:
        self.pool = pool
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.session_timeout_bounds = session_timeout_bounds
        # The classic members of KIP-848 consumer groups (classic_members.ClassicMembers, set by the
        # group coordinator): this protocol's requests to a consumer group with members go there
        # (Kafka 4's online migration). None: such a request is INCONSISTENT_GROUP_PROTOCOL.
        self.consumer_members = None
        # Fired by every change to a group made in this process (group_coordinator.py's HTTP
        # membership, DeleteGroups and expiry too): the group's waiting JoinGroups and SyncGroups
        # re-read at once, so the members of a generation are answered together, as Kafka's
        # coordinator answers them (one woken a poll later could find the leader already
        # rejoining, and its SyncGroup REBALANCE_IN_PROGRESS).
        self.wake_ups = GroupWakeUps()
        # Who this process is in the notifications of group changes: it ignores its own (its
        # waiters were woken at the commit already).
        self.origin = uuid.uuid4().hex

    def listen_for_changes(self, notifier: AppendNotifier) -> None:
        """Before the notifier starts: a change to a group committed in another process (worker or
        node) wakes the group's waiters in this one at once."""

        def on_payload(payload: str) -> None:
            origin, group_id = groups.announced_change(payload)
            if origin != self.origin:
                self.wake_ups.changed(group_id)

        notifier.also_listen(groups.GROUP_CHANGES_CHANNEL, on_payload)

    async def announce(self, conn: asyncpg.Connection, group_id: str) -> None:
        """In the transaction that changes `group_id`: its waiters in the other processes re-read
        once it commits (the caller wakes this process's, `wake_ups.changed`, after the commit)."""
        await groups.announce_change(conn, group_id, self.origin)

    @contextlib.asynccontextmanager
    async def changing(self, group_id: str, announce: bool = True):
        """A connection in a transaction that changes `group_id`; once it ends, the group's waiters
        in this process re-read, and once it commits, those of the other processes (unless
        `announce` is False: a change no waiter can be waiting for)."""
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                yield conn
                if announce:
                    await self.announce(conn, group_id)
        finally:
            self.wake_ups.changed(group_id)

    @staticmethod
    async def _until_changed(seen: asyncio.Event, classic: dict, member_id: str) -> None:
        """Until a change to the group committed after `seen` was taken, or the next of: POLL_S, a
        third of the waiting member's session timeout (each re-read touches its session: waiting is
        not a lapse), the group's next timer (`_next_due_ms`: the re-read acts on it, as Kafka's
        coordinator's timer would)."""
        wait_ms = min(POLL_S * 1000, classic["members"][member_id]["session_timeout_ms"] / 3)
        due_ms = _next_due_ms(classic)
        if due_ms is not None:
            wait_ms = min(wait_ms, max(0, due_ms - now_ms()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(seen.wait(), wait_ms / 1000)

    # ---- the group row's classic state

    async def _save(self, conn: asyncpg.Connection, group: Group, classic: dict, now: int) -> None:
        await save_classic_state(conn, group, classic, now)

    @staticmethod
    def _prepare(classic: dict, now: int) -> None:
        """Every member must rejoin, within the largest of their rebalance timeouts."""
        classic["state"] = PREPARING
        classic["deadline_ms"] = now + max((m["rebalance_timeout_ms"] for m in classic["members"].values()), default=0)
        classic["awaiting_sync"] = None
        for member in classic["members"].values():
            member["joined"] = False

    async def _try_complete(self, conn: asyncpg.Connection, group: Group, classic: dict, now: int) -> None:
        """Completes a rebalance when it is due (the caller holds the row)."""
        if not _completion_due(classic, now):
            return
        delay = classic.get("initial_delay")
        if delay is not None:
            # As Kafka's InitialDelayedJoin: members joined during the last delay, so wait one more
            # (within the limit); else complete.
            if delay["member_added"] and delay["until_ms"] < delay["limit_ms"] and self.initial_rebalance_delay_ms:
                delay.update(
                    until_ms=min(delay["until_ms"] + self.initial_rebalance_delay_ms, delay["limit_ms"]),
                    member_added=False,
                )
                return
            classic["initial_delay"] = None
        # As Kafka's coordinator: the dynamic members that did not rejoin are removed; a static one
        # stays a member of the next generation (its instance restarting, or slow to rejoin, gets its
        # place back without one more rebalance); its session lapse removes it if it is gone.
        late = [
            member_id
            for member_id, m in classic["members"].items()
            if not m["joined"] and m["group_instance_id"] is None
        ]
        if late:
            await groups.remove_members(conn, group.group_id, late)
            for member_id in late:
                del classic["members"][member_id]
        rejoined = sorted(member_id for member_id, m in classic["members"].items() if m["joined"])
        if classic["members"] and not rejoined:
            # Only static members that did not rejoin: no generation without a leader to assign
            # it; wait one more rebalance timeout (their sessions may lapse meanwhile), as Kafka.
            self._prepare(classic, now)
            return
        group.generation_id += 1
        for member in classic["members"].values():
            member["assignment"] = ""
        if not classic["members"]:
            classic.update(state=EMPTY, protocol=None, leader=None)
            return
        classic["protocol"] = _choose_protocol(classic)
        if classic["leader"] not in rejoined:  # the leader assigns: one that rejoined
            classic["leader"] = rejoined[0]
        classic["state"] = COMPLETING
        # As Kafka's coordinator: every member must send its SyncGroup within the rebalance timeout.
        classic["awaiting_sync"] = {
            "member_ids": sorted(classic["members"]),
            "until_ms": now + max(m["rebalance_timeout_ms"] for m in classic["members"].values()),
        }

    async def _settle_timeouts(self, conn: asyncpg.Connection, group: Group | None, now: int) -> None:
        """What Kafka's coordinator's timers would have done by now (the caller holds the row, None
        when the group is gone): remove the members overdue to sync (the rest rebalance), complete a
        rebalance that is due."""
        classic = None if group is None else classic_state(group)
        if classic is None:
            return
        overdue = _overdue_syncs(classic, now)
        if overdue:
            await groups.remove_members(conn, group.group_id, overdue)
            await self.members_removed(conn, group, now)
        else:
            await self._try_complete(conn, group, classic, now)
            await self._save(conn, group, classic, now)

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

    async def credit_timers(self, conn: asyncpg.Connection, group: Group, credit_ms: int, now: int) -> None:
        """After `credit_ms` in which no server could hear the members (the database away, every
        node down), the group's rebalance underway and SyncGroups awaited get that time back (at most
        their whole rebalance timeout from `now`): no member is removed as late for the time it could
        not reach the group (its JoinGroup or SyncGroup answered COORDINATOR_NOT_AVAILABLE, or not
        answered), as Kafka's coordinator that loads a group (a coordinator failover, a broker
        restarted) holds no time before against a rebalance. The caller holds the group row."""
        classic = classic_state(group)
        if classic is None or not classic["members"]:
            return
        whole = now + max(m["rebalance_timeout_ms"] for m in classic["members"].values())
        if classic["state"] == PREPARING and classic.get("initial_delay") is None:
            classic["deadline_ms"] = min(classic["deadline_ms"] + credit_ms, whole)
        awaiting = classic.get("awaiting_sync")
        if awaiting is not None:
            awaiting["until_ms"] = min(awaiting["until_ms"] + credit_ms, whole)
        await self._save(conn, group, classic, now)

    # ---- JoinGroup

    async def join(self, request: ClassicJoin) -> JoinResult:
        """Joins and waits for the rebalance to complete. A new dynamic member (member_id "") of a
        client that can take MEMBER_ID_REQUIRED (JoinGroup v4+) first gets its id and must rejoin
        with it within its session timeout; a static member (group_instance_id) is never asked to."""
        group_id, member_id, group_instance_id = request.group_id, request.member_id, request.group_instance_id
        protocol_type, protocols = request.protocol_type, request.protocols
        session_timeout_ms, rebalance_timeout_ms = request.session_timeout_ms, request.rebalance_timeout_ms
        client_id, client_host = request.client_id, request.client_host
        # First the ids (as Kafka's GroupCoordinator validates the group id), then the session timeout
        # (as Kafka checks it, before the group, its protocols and its members): a refused JoinGroup
        # changes nothing. The group instance id is kept with the member: the identifier limit holds it too.
        check_member_group_id(group_id)
        if group_instance_id is not None:
            check_identifier("the group instance id (group.instance.id)", group_instance_id)
        self.session_timeout_bounds.check(group_id, session_timeout_ms)
        now = now_ms()
        if not protocols:
            raise inconsistent_protocol(group_id, f"a JoinGroup of protocol type {protocol_type!r} named no protocol")
        encoded = encoded_protocols(protocols)
        topics = subscribed_topics(protocol_type, protocols)
        async with self.changing(group_id) as conn:
            group = await groups.lock(conn, group_id, now)
            current = await groups.members(conn, group_id)
            if self.consumer_members is not None and has_consumer_members(group):
                return await self.consumer_members.join(conn, group, current, request, now)
            classic = self._joinable(group, current, protocol_type, protocols, now)
            replaced = None  # the member id a static member rejoining under a new one had
            if member_id == "":
                # Kafka's form, client id and a UUID; a long client id is cut short, so that the id
                # stays within the identifier limit (the member's row indexes it).
                member_id = within_limit(client_id or "member", f"-{uuid.uuid4()}")
                replaced = None if group_instance_id is None else static_member_id(classic, group_instance_id)
                if group_instance_id is None and request.member_id_required:
                    classic["pending"][member_id] = now + session_timeout_ms
                    await self._save(conn, group, classic, now)
                    return JoinResult(member_id, -1, protocol_type, None, "", [], member_id_required=True)
            elif classic["pending"].pop(member_id, None) is None:
                error = fenced_instance_error(classic, group_id, member_id, group_instance_id)
                if error is not None:
                    raise error
                if member_id not in classic["members"] or (
                    group_instance_id is not None and static_member_id(classic, group_instance_id) is None
                ):
                    raise unknown_classic_member(group_id, member_id)
            if replaced is not None:
                previous = await self._replace_static_member(
                    conn, group, classic, replaced, Member(member_id, topics, session_timeout_ms, now, now)
                )
                if classic["state"] == STABLE and _same_subscription(protocol_type, previous["protocols"], encoded):
                    # As Kafka: the restarted instance takes its place in the current generation.
                    previous.update(
                        protocols=encoded,
                        session_timeout_ms=session_timeout_ms,
                        rebalance_timeout_ms=rebalance_timeout_ms,
                        client_id=client_id,
                        client_host=client_host,
                    )
                    await self._save(conn, group, classic, now)
                    return self._static_rejoin_result(
                        group, classic, member_id, replaced, request.skip_assignment_allowed
                    )
            else:
                previous = classic["members"].get(member_id)
                if previous is None:
                    await groups.add_member(conn, group_id, Member(member_id, topics, session_timeout_ms, now, now))
                else:
                    await groups.touch_member(conn, group_id, member_id, topics, session_timeout_ms, now)
                if (
                    previous is not None
                    and previous["protocols"] == encoded
                    and (
                        classic["state"] == COMPLETING
                        or (classic["state"] == STABLE and member_id != classic["leader"])
                    )
                ):
                    # As Kafka: a member rejoining with what it had (a lost JoinGroup answer, or a
                    # follower of a Stable group) gets the current generation, no rebalance.
                    await self._save(conn, group, classic, now)
                    return self._join_result(group, classic, member_id)
            begins_rebalance = classic["state"] != PREPARING
            initial = classic["state"] == EMPTY
            if not begins_rebalance and previous is None and classic.get("initial_delay") is not None:
                classic["initial_delay"]["member_added"] = True
            classic["members"][member_id] = classic_member_entry(
                encoded, rebalance_timeout_ms, session_timeout_ms, client_id, client_host, group_instance_id
            )
            classic["members"][member_id]["joined"] = True
            if begins_rebalance:
                # As Kafka's prepareRebalance, once the joiner is added or updated: the deadline is
                # the members' largest rebalance timeout from now, the joiner's included, and stays
                # so; a join during the rebalance never puts it off (it only ends the rebalance
                # sooner, as the last member awaited).
                self._prepare(classic, now)
                classic["members"][member_id]["joined"] = True
                if initial:
                    delay = self.initial_rebalance_delay_ms
                    classic["initial_delay"] = {
                        "until_ms": now + delay,
                        "limit_ms": now + max(delay, rebalance_timeout_ms),
                        "member_added": False,
                    }
            target = group.generation_id + 1
            await self._try_complete(conn, group, classic, now)
            await self._save(conn, group, classic, now)
        return await self._await_join(group_id, member_id, group_instance_id, target)

    @staticmethod
    def _joinable(
        group: Group, current: list[Member], protocol_type: str, protocols: list[tuple[str, bytes]], now: int
    ) -> dict:
        """The group's classic state, if a member of this protocol type and protocols may join it."""
        group_id = group.group_id
        if has_consumer_members(group) and current:
            raise inconsistent_protocol(
                group_id,
                "it has members of Kafka's consumer group protocol (ConsumerGroupHeartbeat, group.protocol=consumer), "
                "which this server does not serve to classic members here: use another group id, or wait until "
                "they left",
            )
        classic = classic_state(group)
        kafka_members = set(classic["members"]) if classic else set()
        if any(m.member_id not in kafka_members for m in current):
            raise inconsistent_protocol(
                group_id,
                "its members joined over HTTP (POST /v1/groups/{group_id}/heartbeat): a group takes the "
                "kind of its first member; use another group id, or wait until its HTTP members left",
            )
        if classic is None or not classic["members"]:
            return _fresh(protocol_type, _pending(classic, now))
        classic.setdefault("initial_delay", None)
        classic["pending"] = _pending(classic, now)
        if protocol_type != classic["protocol_type"]:
            raise inconsistent_protocol(
                group_id,
                f"protocol type {protocol_type!r} received, the group's members use {classic['protocol_type']!r}",
            )
        if not set.intersection(
            {name for name, _ in protocols}, *({n for n, _ in m["protocols"]} for m in classic["members"].values())
        ):
            raise inconsistent_protocol(
                group_id,
                f"none of the protocols {sorted(name for name, _ in protocols)} is supported by every member of "
                f"the group",
            )
        return classic

    @staticmethod
    async def _replace_static_member(
        conn: asyncpg.Connection, group: Group, classic: dict, old_id: str, new: Member
    ) -> dict:
        """The static member's entry (its protocols, assignment, leadership) under its new member id;
        the old id is no longer a member (FENCED_INSTANCE_ID with the instance id)."""
        member = classic["members"].pop(old_id)
        classic["members"][new.member_id] = member
        if classic["leader"] == old_id:
            classic["leader"] = new.member_id
        await groups.remove_members(conn, group.group_id, [old_id])
        await groups.add_member(conn, group.group_id, new)
        return member

    @staticmethod
    def _static_rejoin_result(
        group: Group, classic: dict, member_id: str, old_id: str, skip_assignment_allowed: bool
    ) -> JoinResult:
        """As Kafka answers a static member that rejoined a Stable group unchanged: v9+ tells a leader
        to skip the assignment (it keeps the group's); before v9 the answer names the old leader id,
        so that the new instance does not assign (a Stable group would not relay it)."""
        result = ClassicGroups._join_result(group, classic, member_id)
        if skip_assignment_allowed:
            return replace(result, skip_assignment=member_id == classic["leader"])
        leader = old_id if classic["leader"] == member_id else classic["leader"]
        return replace(result, leader=leader, members=[])

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

    async def _await_join(
        self, group_id: str, member_id: str, group_instance_id: str | None, target_generation: int
    ) -> JoinResult:
        while True:
            seen = self.wake_ups.before_read(group_id)  # a change committed after it wakes the wait
            async with self.pool.acquire() as conn:
                now = now_ms()
                group = await groups.get(conn, group_id)
                classic = self._member_state(group, group_id, member_id, group_instance_id)
                # Waiting in a rebalance is not a lapse of the session (as Kafka).
                if not await groups.touch(conn, group_id, member_id, now):
                    raise unknown_classic_member(group_id, member_id)
                if group.generation_id >= target_generation:
                    return self._join_result(group, classic, member_id)
                if _completion_due(classic, now):
                    async with conn.transaction():
                        group = await groups.lock(conn, group_id, now)
                        classic = classic_state(group)
                        if classic is not None and _completion_due(classic, now):
                            await self._try_complete(conn, group, classic, now)
                            await self._save(conn, group, classic, now)
                            await self.announce(conn, group_id)
                    self.wake_ups.changed(group_id)
                    continue
            await self._until_changed(seen, classic, member_id)

    @staticmethod
    def _member_state(group: Group | None, group_id: str, member_id: str, group_instance_id: str | None) -> dict:
        """The group's classic state, if member_id is a member (FENCED_INSTANCE_ID when its instance
        id now belongs to another member id, UNKNOWN_MEMBER_ID when it is not a member)."""
        classic = None if group is None else classic_state(group)
        if classic is None and group is not None and has_consumer_members(group):
            # Converted to a consumer group while this member waited (Kafka's convertToConsumerGroup
            # answers the waiting JoinGroups and SyncGroups so): it rejoins, as a classic member of it.
            raise _rebalancing(group_id)
        error = instance_error(classic, group_id, member_id, group_instance_id)
        if error is not None:
            raise error
        if classic is None or member_id not in classic["members"]:
            raise unknown_classic_member(group_id, member_id)
        return classic

    # ---- SyncGroup

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        assignments: dict[str, bytes],
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncResult:
        """The leader's SyncGroup stores every member's assignment (the group is then Stable); each
        member's SyncGroup answers its own, once the leader's has come. `protocol_type` and
        `protocol_name`: the ones SyncGroup v5+ names, each checked when named (`_checked`)."""
        check_member_group_id(group_id)
        now = now_ms()
        async with self.changing(group_id) as conn:
            group = await groups.lock(conn, group_id, now)
            if self.consumer_members is not None and has_consumer_members(group):
                caller = Caller(member_id, generation_id, group_instance_id)
                return await self.consumer_members.sync(conn, group, caller, (protocol_type, protocol_name), now)
            classic = self._checked(
                group, group_id, member_id, generation_id, group_instance_id, protocol_type, protocol_name, syncing=True
            )
            await groups.touch(conn, group_id, member_id, now)
            awaiting = classic.get("awaiting_sync")
            synced = awaiting is not None and member_id in awaiting["member_ids"]
            if synced:
                awaiting["member_ids"].remove(member_id)
            stores_assignments = classic["state"] == COMPLETING and member_id == classic["leader"]
            if stores_assignments:
                for mid, member in classic["members"].items():
                    member["assignment"] = _b64(assignments.get(mid, b""))
                classic["state"] = STABLE
                classic["assigned_generation"] = group.generation_id
            if synced or stores_assignments:
                await self._save(conn, group, classic, now)
        # A leader that never syncs: after the rebalance timeout the member rejoins (as Kafka's
        # newer coordinators answer), so that no request waits without end.
        deadline = now + classic["members"][member_id]["rebalance_timeout_ms"]
        while True:
            seen = self.wake_ups.before_read(group_id)
            async with self.pool.acquire() as conn:
                group = await groups.get(conn, group_id)
                classic = self._of_generation(group, group_id, member_id, generation_id, group_instance_id)
                # Waiting for the leader's assignment is not a lapse of the session, as Kafka's
                # coordinator keeps a member awaiting sync alive (a slow leader must not get the
                # followers waiting for it evicted).
                await groups.touch(conn, group_id, member_id, now_ms())
                # Kafka's coordinator answers every waiting SyncGroup when the leader's comes. A
                # waiter in another process sees the leader's only at its NOTIFY (or poll, when
                # that is lost), by which time the leader may have rejoined (Preparing, same
                # generation): its generation's assignment is still its answer (`_assigned`).
                if classic["state"] == STABLE or _assigned(classic, generation_id):
                    member = classic["members"][member_id]
                    return SyncResult(classic["protocol_type"], classic["protocol"], _bytes(member["assignment"]))
                if classic["state"] == PREPARING:
                    raise _rebalancing(group_id)
                if _overdue_syncs(classic, now_ms()):  # a leader that never synced: removed, the rest rejoin
                    async with conn.transaction():
                        await self._settle_timeouts(conn, await groups.lock_existing(conn, group_id), now_ms())
                        await self.announce(conn, group_id)
                    self.wake_ups.changed(group_id)
                    continue
            if now_ms() >= deadline:
                raise _rebalancing(group_id)
            await self._until_changed(seen, classic, member_id)

    @classmethod
    def _of_generation(
        cls, group: Group | None, group_id: str, member_id: str, generation_id: int, group_instance_id: str | None
    ) -> dict:
        """The group's classic state, if this member is one of its current generation
        (FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION), whatever the rebalance state."""
        classic = cls._member_state(group, group_id, member_id, group_instance_id)
        if generation_id != group.generation_id:
            raise BrokerError(
                ErrorCode.ILLEGAL_GENERATION,
                f"generation {generation_id} of group {group_id!r} is not the current one "
                f"({group.generation_id}): rejoin",
            )
        return classic

    @classmethod
    def _checked(
        cls,
        group: Group | None,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        syncing: bool = False,
    ) -> dict:
        """The group's classic state, if this member of this generation may sync (`syncing`) or
        heartbeat. The
        generation is checked before the rebalance state, as Kafka's coordinator checks it: a member
        of an older generation is ILLEGAL_GENERATION in PreparingRebalance too (a cooperative
        consumer then knows its partitions lost, where REBALANCE_IN_PROGRESS would let it keep them).
        Between them, as Kafka's validateSyncGroup, the protocol type and name a SyncGroup names (v5+;
        None: not named) must be the group's: INCONSISTENT_GROUP_PROTOCOL. A SyncGroup in
        PreparingRebalance is REBALANCE_IN_PROGRESS unless its generation's leader has synced
        (`_assigned`): it is then answered its assignment of that generation."""
        classic = cls._of_generation(group, group_id, member_id, generation_id, group_instance_id)
        for what, named, chosen in (
            ("protocol type", protocol_type, classic["protocol_type"]),
            ("protocol", protocol_name, classic["protocol"]),
        ):
            if named is not None and chosen is not None and named != chosen:
                raise inconsistent_protocol(
                    group_id,
                    f"SyncGroup names {what} {named!r}, the group's generation {group.generation_id} has "
                    f"{chosen!r}: assign with the protocol JoinGroup answered (its protocol_type and "
                    f"protocol_name)",
                )
        if classic["state"] == PREPARING and not (syncing and _assigned(classic, generation_id)):
            raise _rebalancing(group_id)
        return classic

    # ---- Heartbeat, LeaveGroup

    async def heartbeat(
        self, group_id: str, member_id: str, generation_id: int, group_instance_id: str | None = None
    ) -> None:
        check_member_group_id(group_id)
        now = now_ms()
        async with self.pool.acquire() as conn:
            group = await groups.get(conn, group_id)
            if self.consumer_members is not None and group is not None and has_consumer_members(group):
                await self.consumer_members.heartbeat(
                    conn, group, Caller(member_id, generation_id, group_instance_id), now
                )
                return
            classic = self._member_state(group, group_id, member_id, group_instance_id)
            if _completion_due(classic, now) or _overdue_syncs(classic, now):
                # Nobody else may be there to act on the timeouts: the late are removed.
                async with conn.transaction():
                    group = await groups.lock_existing(conn, group_id)
                    await self._settle_timeouts(conn, group, now)
                    await self.announce(conn, group_id)
                self.wake_ups.changed(group_id)
            # As Kafka's coordinator (classicGroupHeartbeatToClassicGroup): only a member of the
            # current generation keeps its session, in PreparingRebalance too; one stuck on an older
            # generation (ILLEGAL_GENERATION, and it does not rejoin) lapses and is removed.
            self._of_generation(group, group_id, member_id, generation_id, group_instance_id)
            if not await groups.touch(conn, group_id, member_id, now):
                raise unknown_classic_member(group_id, member_id)
        self._checked(group, group_id, member_id, generation_id, group_instance_id)

    async def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> list[BrokerError | None]:
        """leaving: (member id, group instance id) each, as LeaveGroup names them; a member id ""
        with an instance id removes that static member (v3+), a pending member id is forgotten.
        One error or None each; UNKNOWN_MEMBER_ID for the request when the group does not exist."""
        check_member_group_id(group_id)
        now = now_ms()
        async with self.changing(group_id) as conn:
            # Never makes the group (as Kafka's coordinator, which answers a LeaveGroup of a group it
            # does not have UNKNOWN_MEMBER_ID): a consumer closing after its group was deleted must
            # not bring the group back, Empty, into ListGroups and DescribeGroups.
            group = await groups.lock_existing(conn, group_id)
            if group is None:
                raise BrokerError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"group {group_id!r} does not exist (never joined, or deleted), so no member of it can "
                    f"leave: nothing to do; a consumer that wants the group joins it anew (JoinGroup)",
                )
            if self.consumer_members is not None and has_consumer_members(group):
                return await self.consumer_members.leave(conn, group, leaving, now)
            classic = classic_state(group)
            errors: list[BrokerError | None] = []
            removed: set[str] = set()
            forgotten = False
            for member_id, group_instance_id in leaving:
                if member_id == "" and group_instance_id is not None:
                    member_id = static_member_id(classic, group_instance_id) or ""
                if classic is not None and classic.get("pending", {}).pop(member_id, None) is not None:
                    errors.append(None)
                    forgotten = True
                    continue
                error = instance_error(classic, group_id, member_id, group_instance_id)
                if error is None and (classic is None or member_id not in classic["members"]):
                    error = unknown_classic_member(group_id, member_id)
                if error is None:
                    removed.add(member_id)
                errors.append(error)
            if removed:
                await groups.remove_members(conn, group_id, sorted(removed))
                await self.members_removed(conn, group, now)
            elif forgotten:
                await self._save(conn, group, classic, now)
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
