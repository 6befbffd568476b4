"""KIP-848's consumer group protocol (ConsumerGroupHeartbeat), the third kind of group beside
Kafka's classic one (classic_groups.py) and HTTP's: the coordinator assigns, the members only
heartbeat, each converging on its part of the group's target assignment one partition set at a time.

State: the group row's `assignment[CONSUMER_STATE_KEY]` (app/storage/groups/groups.py), changed only
under the group row's lock (FOR UPDATE), as the classic state is, so every worker and node sees one
group; each member also has its `group_members` row (its session: the eviction worker removes it
once the broker's session timeout passes without a heartbeat; and its revocation deadline, mirrored
from the state, where the worker finds the members overdue to revoke), and the row's `assignment`
keeps each member's assigned partitions beside the state (what describe, lag and the console read).
The group epoch is the row's `generation_id`.

As Kafka's coordinator (GroupMetadataManager, CurrentAssignmentBuilder):
- the group epoch is bumped when a member joins or leaves (or is removed: its session lapsed, or it
  did not revoke within its rebalance timeout), when a member's subscription or preferred assignor
  changes, and when a subscribed topic appears, disappears or grows; the target assignment is then
  recomputed with the group's assignor (`uniform` unless most members name `range`), and its epoch
  is the group epoch;
- each member reconciles towards its target at its own heartbeats: partitions it must give up are
  first revoked (its epoch stays until its heartbeat no longer lists them as owned); partitions it
  is to get are given only once no other member owns them (another member's partitions pending
  revocation are still its own): no partition is ever owned by two members at once. Its epoch
  becomes the target's once nothing is left to revoke;
- a heartbeat's epoch must be the member's (or its previous one, with owned partitions within its
  assignment: the answer that bumped it was lost): FENCED_MEMBER_EPOCH otherwise, and the member
  rejoins with epoch 0 after giving up its partitions.

A member may subscribe with a regular expression. As Kafka's coordinator, the group resolves each
of its members' expressions once for all of them (`_refresh_regexes`; the state's `regexes`), after
the heartbeat that brings a new one is answered (which gets the literal topics first), and again
when topics were created or deleted since (the state's `topics_fingerprint`); a resolution that
changes the members' topics bumps the group epoch, so all the members of a regex share its topics
in one target. A member is never given a topic its principal may not Describe (`_check_describable`,
at its own heartbeats, where its principal is known).

Static members (an instance id): one stopping leaves with epoch -2 and stays with its partitions
until its session lapses (those it was revoking are free at once, as Kafka's coordinator frees
them); its instance joining again under a new member id takes its place and partitions without a
rebalance (`static_member_returns`); another member with its instance id while it is active is
UNRELEASED_INSTANCE_ID.

Kafka 4's online migration (GroupMetadataManager's, with group.consumer.migration.policy's default,
BIDIRECTIONAL): a member joining a classic group of Kafka consumers (protocol type "consumer") that
has members converts it (`_upgraded`): its classic members stay, each at the group's generation with
its current assignment (decoded from the assignment bytes its leader sent) as its target, and keep
being served over JoinGroup, SyncGroup and Heartbeat (classic_members.py) as members of this group,
each with its `classic` entry (its protocols and session timeout). When the group's last member of
this protocol leaves or is removed and classic ones remain, the group becomes a classic group again
and rebalances (`_downgrade`). HTTP groups, and classic ones of another protocol type, are never
converted: a group with such members refuses a member of this protocol (INCONSISTENT_GROUP_PROTOCOL);
an empty one takes the kind of its next member.

Not built (docs/kafka.md): racks (kept, unused).
"""

from __future__ import annotations

import base64
import copy
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import asyncpg

from app.clock import now_ms
from app.coordinator import group_configs
from app.coordinator.classic_groups import (
    CONSUMER_PROTOCOL,
    assigned_partitions,
    decoded_protocols,
    decoded_subscription,
    downgraded,
    owned_partitions,
    readable_assignment,
    save_classic_state,
)
from app.coordinator.consumer_assignors import SERVER_ASSIGNORS, preferred_assignor, target_assignment
from app.coordinator.identifiers import check_identifier, check_member_group_id
from app.errors import BrokerError, ErrorCode
from app.storage.groups import groups
from app.storage.groups.groups import CLASSIC_STATE_KEY, CONSUMER_STATE_KEY, TOPIC_IDS_KEY, Group, Member
from app.storage.log.topics import (
    check_topic_regex,
    find_topics,
    find_topics_by_uuid,
    topics_fingerprint,
    topics_matching,
)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
# The group's states, as Kafka's ListGroups and ConsumerGroupDescribe name them.
EMPTY = "Empty"
ASSIGNING = "Assigning"
RECONCILING = "Reconciling"
STABLE = "Stable"
# A member's reconciliation state (Kafka's MemberState).
MEMBER_STABLE = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"
RESERVED_MEMBER_IDS = frozenset({CLASSIC_STATE_KEY, CONSUMER_STATE_KEY, TOPIC_IDS_KEY})

Partitions = dict[str, list[int]]  # topic -> partitions


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """A ConsumerGroupHeartbeat as the Kafka door received it (None: not sent, unchanged)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: list[str] | None
    subscribed_topic_regex: str | None
    server_assignor: str | None
    owned: list[tuple[uuid.UUID, list[int]]] | None
    client_id: str
    client_host: str
    # Whether the member's principal may Describe a topic: a regular expression subscribes it only
    # to those (the Kafka door's authorizer; everything by default).
    may_describe: Callable[[str], bool] = lambda _topic: True


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatResult:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    # The member's assigned partitions by topic id, when the answer carries them (None: unchanged).
    assignment: list[tuple[uuid.UUID, list[int]]] | None


def consumer_state(group: Group) -> dict | None:
    return group.assignment.get(CONSUMER_STATE_KEY)


def _invalid(message: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, message)


def unknown_member(group_id: str, member_id: str) -> BrokerError:
    return BrokerError(
        ErrorCode.UNKNOWN_MEMBER_ID,
        f"member {member_id!r} is not in consumer group {group_id!r} (it left, or was removed when its session "
        f"timed out or it did not revoke its partitions within its rebalance timeout): rejoin with member epoch 0",
    )


def _epoch_refused(code: ErrorCode, group_id: str, member_id: str, received: int, current: int) -> BrokerError:
    what_to_do = (
        "heartbeat to get the current epoch, then retry with it"
        if code == ErrorCode.STALE_MEMBER_EPOCH
        else "give up the partitions it owns and rejoin with member epoch 0"
    )
    return BrokerError(
        code,
        f"member {member_id!r} of consumer group {group_id!r} sent member epoch {received}, its epoch is "
        f"{current}: {what_to_do}",
    )


def stale_member_epoch(group_id: str, member_id: str, received: int, current: int) -> BrokerError:
    """A commit's or fetch's epoch that is not the member's (it retries once it heartbeat)."""
    return _epoch_refused(ErrorCode.STALE_MEMBER_EPOCH, group_id, member_id, received, current)


def stale_transactional_epoch(group_id: str, member_id: str, received: int, current: int) -> BrokerError:
    """A TxnOffsetCommit's epoch that is not the member's: ILLEGAL_GENERATION, as Kafka's coordinator
    answers it (OffsetMetadataManager.validateTransactionalOffsetCommit): producers know no
    STALE_MEMBER_EPOCH (Java's takes an error it does not know as fatal), and abort the transaction
    on ILLEGAL_GENERATION."""
    return BrokerError(
        ErrorCode.ILLEGAL_GENERATION,
        f"member {member_id!r} of consumer group {group_id!r} sent member epoch {received} with its "
        f"transactional offsets, its epoch is {current}: abort the transaction, and send the offsets in the "
        f"next one with the consumer's current group metadata",
    )


def _fenced(group_id: str, member_id: str, received: int, current: int) -> BrokerError:
    """A heartbeat's epoch that is not the member's (it rejoins)."""
    return _epoch_refused(ErrorCode.FENCED_MEMBER_EPOCH, group_id, member_id, received, current)


def _inconsistent(group_id: str, detail: str) -> BrokerError:
    return BrokerError(
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
        f"group {group_id!r} {detail}: a group takes the kind of its first member (only a classic group of Kafka "
        f"consumers converts to a consumer group, and back); use another group id, or wait until they left",
    )


def new_member(rebalance_timeout_ms: int) -> dict:
    """A member joining the group: epoch 0, owning nothing."""
    return {
        "member_epoch": 0,
        "previous_member_epoch": -1,
        "state": MEMBER_STABLE,
        "assigned": {},
        "revoking": {},
        "subscribed": [],  # the topics it subscribes to: its names and its regex's matches
        "names": [],
        "regex": None,
        "server_assignor": None,
        "rebalance_timeout_ms": rebalance_timeout_ms,
        "revocation_due_ms": None,
    }


def is_classic(member: dict) -> bool:
    """Whether the member speaks Kafka's classic protocol (JoinGroup, SyncGroup, Heartbeat)."""
    return "classic" in member


def _upgraded(classic: dict, generation_id: int) -> dict | None:
    """The consumer group state of a classic group of Kafka consumers (Kafka's
    ConsumerGroup.fromClassicGroup): every member at the group's generation, Stable, its current
    assignment (its assignment bytes, empty while the group awaited its leader's) its target too; its
    subscription from its metadata of the group's protocol (its first, before one was chosen); its
    protocols and session timeout kept (`classic`) for JoinGroup, SyncGroup and a downgrade. None
    when a member's metadata or assignment is no ConsumerProtocol message this server reads (Kafka
    does not convert a group whose embedded protocol is malformed)."""
    state = _fresh()
    state["assignment_epoch"] = generation_id
    claimed: set[tuple[str, int]] = set()

    # The members with assignment bytes first: what a leader gave is theirs; then the claims
    # (below) of those that rejoined in this rebalance (their metadata is of now), then of a static
    # member that has not (its metadata is of its previous join); each takes only what nobody holds.
    def precedence(item: tuple[str, dict]) -> tuple[bool, bool]:
        return not item[1]["assignment"], not item[1]["joined"]

    for member_id, kept in sorted(classic["members"].items(), key=precedence):
        protocols = decoded_protocols(kept["protocols"])
        chosen = [(name, data) for name, data in protocols if name == classic["protocol"]]
        subscription = decoded_subscription(chosen + protocols)
        assignment = base64.b64decode(kept["assignment"])
        assigned = assigned_partitions(CONSUMER_PROTOCOL, assignment)
        if subscription is None or (assignment and not assigned and not readable_assignment(assignment)):
            return None
        if not assignment:
            # Rejoined in a rebalance not synced yet (its JoinGroup or the generation's completion
            # cleared its assignment bytes): a cooperative member keeps processing the partitions
            # its JoinGroup says it owns until its SyncGroup, so they stay its own (Kafka keeps the
            # assignment of its generation), or another member would be given them meanwhile.
            assigned = partitions_by_topic(owned_partitions(subscription) - claimed)
        claimed |= partition_set(assigned)
        names = sorted(set(subscription.topics))
        member = state["members"][member_id] = new_member(kept["rebalance_timeout_ms"])
        member.update(
            member_epoch=generation_id,
            previous_member_epoch=generation_id,
            assigned=assigned,
            names=names,
            subscribed=names,
            instance_id=kept["group_instance_id"],
            rack_id=getattr(subscription, "rack_id", None),
            client_id=kept["client_id"],
            client_host=kept["client_host"],
            classic={"session_timeout_ms": kept["session_timeout_ms"], "protocols": kept["protocols"]},
        )
        state["target"][member_id] = assigned
    return state


def refuse_other_kinds(group: Group, members: list[Member]) -> None:
    """INCONSISTENT_GROUP_PROTOCOL for a classic (JoinGroup) or HTTP member joining a consumer
    group that has members."""
    state = consumer_state(group)
    if state is not None and state["members"] and members:
        raise _inconsistent(
            group.group_id,
            "has members of Kafka's consumer group protocol (ConsumerGroupHeartbeat, group.protocol=consumer)",
        )


def _check_request(request: ConsumerHeartbeat) -> None:
    """Kafka's checks of a ConsumerGroupHeartbeat v1, before the group is looked at."""
    check_member_group_id(request.group_id)
    if not request.member_id:
        raise _invalid("ConsumerGroupHeartbeat v1 needs the member id the consumer generated: received an empty one")
    check_identifier("the member id", request.member_id)
    if request.member_id in RESERVED_MEMBER_IDS:
        raise _invalid(f"member id {request.member_id!r} is reserved by this server: generate another (a UUID)")
    if request.rack_id is not None and not request.rack_id:
        raise _invalid("the rack id is empty: send null, or the consumer's rack")
    if request.instance_id is not None and not request.instance_id:
        raise _invalid("the instance id is empty: send null (a dynamic member), or the group.instance.id")
    if request.member_epoch == JOIN_EPOCH:
        if request.rebalance_timeout_ms == -1:
            raise _invalid("a join (member epoch 0) needs RebalanceTimeoutMs: received -1")
        if request.owned is None or request.owned:
            raise _invalid(
                "a join (member epoch 0) must send TopicPartitions, empty (it owns nothing yet): received "
                + ("null" if request.owned is None else "partitions")
            )
        if not request.subscribed_topic_names and not request.subscribed_topic_regex:
            raise _invalid(
                "a join (member epoch 0) needs SubscribedTopicNames (not empty) or SubscribedTopicRegex: "
                "received neither"
            )
    elif request.member_epoch == STATIC_LEAVE_EPOCH and request.instance_id is None:
        raise _invalid("member epoch -2 (a static member's leave) needs its instance id: received null")
    elif request.member_epoch < STATIC_LEAVE_EPOCH:
        raise _invalid(f"member epoch {request.member_epoch} is invalid: expected 0 (join), -1 (leave) or the epoch")
    if request.server_assignor is not None and request.server_assignor not in SERVER_ASSIGNORS:
        raise BrokerError(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"server assignor {request.server_assignor!r} is not supported: expected one of "
            f"{', '.join(SERVER_ASSIGNORS)} (group.remote.assignor)",
        )


def _fresh() -> dict:
    return {
        "state": EMPTY,
        "assignor": None,
        "assignment_epoch": 0,
        "target": {},
        "topics": {},  # subscribed topic -> [topic id, partition count], what the target was computed with
        "members": {},
    }


def partition_set(partitions: Partitions) -> set[tuple[str, int]]:
    return {(topic, p) for topic, ps in partitions.items() for p in ps}


def partitions_by_topic(pairs: set[tuple[str, int]]) -> Partitions:
    found: Partitions = {}
    for topic, p in sorted(pairs):
        found.setdefault(topic, []).append(p)
    return found


def credit_revocations(members: Iterable[dict], credit_ms: int, now: int) -> None:
    """Each member's revocation underway (`revocation_due_ms`) gets `credit_ms` back, at most its
    whole `rebalance_timeout_ms` from `now`: a member is not held to the time no server could hear
    it. KIP-848's members and HTTP groups' (http_revocations) alike."""
    for member in members:
        if member.get("revocation_due_ms") is not None:
            member["revocation_due_ms"] = min(
                member["revocation_due_ms"] + credit_ms, now + member["rebalance_timeout_ms"]
            )


def _group_state(state: dict, group_epoch: int) -> str:
    members = state["members"].values()
    if not state["members"]:
        return EMPTY
    if state["assignment_epoch"] != group_epoch:
        return ASSIGNING
    if any(m["state"] != MEMBER_STABLE or m["member_epoch"] != state["assignment_epoch"] for m in members):
        return RECONCILING
    return STABLE


def owned_elsewhere(state: dict, member_id: str) -> set[tuple[str, int]]:
    """The partitions the other members own: assigned, or pending revocation (still theirs)."""
    owned: set[tuple[str, int]] = set()
    for other_id, other in state["members"].items():
        if other_id != member_id:
            owned |= partition_set(other["assigned"]) | partition_set(other["revoking"])
    return owned


def reconcile(state: dict, member_id: str, owned: set[tuple[str, int]] | None, now: int) -> None:
    """One step of the member towards its target (Kafka's CurrentAssignmentBuilder). `owned`: the
    partitions its heartbeat says it owns (None: it did not say, so it still owns what it had)."""
    member = state["members"][member_id]
    target_epoch = state["assignment_epoch"]

    def still_owns(revoking: set[tuple[str, int]]) -> bool:
        return owned is None or bool(owned & revoking)

    if member["state"] == UNREVOKED and still_owns(partition_set(member["revoking"])):
        return
    if member["state"] == MEMBER_STABLE and member["member_epoch"] == target_epoch:
        return
    target = partition_set(state["target"].get(member_id, {}))
    subscribed = set(member["subscribed"])
    target = {tp for tp in target if tp[0] in subscribed}
    assigned = partition_set(member["assigned"])
    kept = assigned & target
    revoking = assigned - kept
    taken = owned_elsewhere(state, member_id)
    wanted = target - kept
    free = {tp for tp in wanted if tp not in taken}
    unreleased = bool(wanted - free)
    if revoking and still_owns(revoking):
        # It keeps its epoch until it has given them up.
        member.update(state=UNREVOKED, assigned=partitions_by_topic(kept), revoking=partitions_by_topic(revoking))
        if member.get("revocation_due_ms") is None:
            member["revocation_due_ms"] = now + member["rebalance_timeout_ms"]
        return
    member["previous_member_epoch"] = member["member_epoch"]
    member.update(
        member_epoch=target_epoch,
        state=UNRELEASED if unreleased else MEMBER_STABLE,
        assigned=partitions_by_topic(kept | free),
        revoking={},
        revocation_due_ms=None,
    )


def _regex_matches(state: dict, member: dict) -> list[str]:
    """The topics the group resolved the member's regular expression to (none while unresolved)."""
    return state.get("regexes", {}).get(member["regex"], []) if member["regex"] else []


def resolve_subscription(state: dict, member: dict) -> bool:
    """Sets the member's topics: the names it subscribes to and its regular expression's topics as
    the group resolved them, less those its principal may not Describe (as of its last heartbeat);
    True when they changed (the target depends on them)."""
    hidden = set(member.get("undescribable", []))
    subscribed = sorted(set(member["names"]) | {t for t in _regex_matches(state, member) if t not in hidden})
    changed = subscribed != member["subscribed"]
    member["subscribed"] = subscribed
    return changed


def _check_describable(state: dict, member: dict, may_describe: Callable[[str], bool]) -> None:
    """Records which of its regular expression's topics the member's principal may not Describe
    (its ACLs are known only at its own heartbeats): those are left out of its subscription."""
    member["undescribable"] = [t for t in _regex_matches(state, member) if not may_describe(t)]


async def _check_new_regex(conn: asyncpg.Connection, regex: str) -> None:
    """INVALID_REGULAR_EXPRESSION for a regex PostgreSQL cannot compile, at the heartbeat that brings
    it (as Kafka's coordinator checks a regex new to the group before resolving it)."""
    try:
        await check_topic_regex(conn, regex)
    except asyncpg.InvalidRegularExpressionError as error:
        raise BrokerError(
            ErrorCode.INVALID_REGULAR_EXPRESSION,
            f"subscribed topic regex {regex[:300]!r} does not compile ({error}): subscribe with a "
            f"valid regular expression (PostgreSQL's syntax, RE2's common expressions)",
        ) from None


async def _refresh_regexes(
    conn: asyncpg.Connection, state: dict, heartbeating: tuple[str, Callable[[str], bool]] | None
) -> bool:
    """Resolves the group's regular expressions, as Kafka's coordinator does in the background once
    per group (not per member): when one is not resolved yet, or topics were created or deleted
    since (`topics_fingerprint`); a regex no member subscribes to any more is forgotten. Each
    member's topics are then its names and its regex's topics (`resolve_subscription`): the heartbeating
    member's principal is asked about the new ones (`heartbeating`: its id and `may_describe`), the
    others' are taken as describable until their own heartbeats. True when any member's topics
    changed (the group epoch is bumped, so every member of a regex sees the new target at once)."""
    in_use = sorted({m["regex"] for m in state["members"].values() if m["regex"]})
    resolved = state.setdefault("regexes", {})
    for regex in [r for r in resolved if r not in in_use]:
        del resolved[regex]
    if not in_use:
        state.pop("topics_fingerprint", None)
        return False
    fingerprint = await topics_fingerprint(conn)
    if all(r in resolved for r in in_use) and fingerprint == state.get("topics_fingerprint"):
        return False
    resolved.update(await topics_matching(conn, in_use))
    state["topics_fingerprint"] = fingerprint
    if heartbeating is not None and heartbeating[0] in state["members"]:
        _check_describable(state, state["members"][heartbeating[0]], heartbeating[1])
    changed = False
    for member in state["members"].values():
        changed |= resolve_subscription(state, member)
    return changed


def _member_of_instance(state: dict, instance_id: str) -> str | None:
    """The id of the member with this instance id (a static member's), None when none has it."""
    return next((mid for mid, m in state["members"].items() if m.get("instance_id") == instance_id), None)


def check_instance(group_id: str, state: dict, member_id: str, instance_id: str) -> None:
    """A heartbeat or leave (epoch other than 0) naming an instance id is its static member's, as
    Kafka's coordinator finds it (getOrMaybeSubscribeStaticConsumerGroupMember, consumerGroupLeave):
    UNKNOWN_MEMBER_ID when no member has it, FENCED_INSTANCE_ID when another member than the sender
    does (its instance joined again under a new member id and replaced it)."""
    holder = _member_of_instance(state, instance_id)
    if holder is None:
        raise BrokerError(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"instance id {instance_id!r} is no member's in consumer group {group_id!r} (member {member_id!r} "
            f"sent it): a static member heartbeats and leaves with its own instance id, a dynamic one with none; "
            f"rejoin with member epoch 0",
        )
    if holder != member_id:
        raise BrokerError(
            ErrorCode.FENCED_INSTANCE_ID,
            f"instance id {instance_id!r} of consumer group {group_id!r} is member {holder!r}'s, not {member_id!r}'s: "
            f"another consumer with this group.instance.id replaced it; stop this one",
        )


def _overdue(state: dict, now: int) -> set[str]:
    """The members that have not revoked their partitions within their rebalance timeout: Kafka's
    coordinator removes them (their partitions go to the members waiting for them)."""
    return {
        member_id
        for member_id, m in state["members"].items()
        if m.get("revocation_due_ms") is not None and m["revocation_due_ms"] <= now
    }


class ConsumerGroups:
    def __init__(
        self, pool: asyncpg.Pool, changing, session_timeout_ms: int, heartbeat_interval_ms: int, announce=None
    ) -> None:
        """`changing`: ClassicGroups.changing (a transaction that changes a group, its waiters woken);
        `session_timeout_ms`, `heartbeat_interval_ms`: the server's, for a group without its own
        (group_configs.py); `announce`: ClassicGroups.announce (a classic group converted here may
        have JoinGroups and SyncGroups waiting in other processes)."""
        self.pool = pool
        self.changing = changing
        self.announce = announce
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms

    async def heartbeat(self, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        _check_request(request)
        group_id, member_id, epoch = request.group_id, request.member_id, request.member_epoch
        now = now_ms()
        # No JoinGroup or SyncGroup waits on a consumer group (one joining it is refused at once):
        # nobody in another process to announce its change to.
        async with self.changing(group_id, announce=False) as conn:
            group = await (
                groups.lock(conn, group_id, now) if epoch == JOIN_EPOCH else groups.lock_existing(conn, group_id)
            )
            if group is None:
                raise BrokerError(
                    ErrorCode.GROUP_ID_NOT_FOUND,
                    f"consumer group {group_id!r} does not exist (deleted, or never joined): "
                    f"rejoin with member epoch 0",
                )
            # The group's own configs (group_configs.py), else the server's: read under the group's
            # lock, so the member row written below carries the session timeout its eviction counts.
            session_timeout_ms, interval_ms = await group_configs.consumer_timeouts(
                conn, group_id, self.session_timeout_ms, self.heartbeat_interval_ms
            )
            current = await groups.members(conn, group_id)
            state = self._state_for(group, current, epoch == JOIN_EPOCH)
            if CLASSIC_STATE_KEY in group.assignment and self.announce is not None:
                # Converted from a classic group: its waiting JoinGroups and SyncGroups rejoin.
                await self.announce(conn, group_id)
            loaded = (group.generation_id, copy.deepcopy(state))  # what the row holds: unchanged, not written
            bumped = await self.remove_lapsed(conn, group, state, current, now)
            if "regexes" not in state:
                # Written before the group resolved its members' regexes (an upgrade): resolved
                # now, before a member's topics are taken from the resolutions (`resolve_subscription`),
                # or each member of a regex would be told to revoke all of its regex's topics.
                bumped |= await _refresh_regexes(conn, state, None)
            member = state["members"].get(member_id)
            joining = epoch == JOIN_EPOCH
            if request.instance_id is not None and not joining:
                check_instance(group_id, state, member_id, request.instance_id)
            if epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                if member is None:
                    raise unknown_member(group_id, member_id)
                if epoch == STATIC_LEAVE_EPOCH:
                    # A static member stopping (KIP-345's, as Kafka keeps it): it stays, with its
                    # partitions, for its instance to come back under a new member id, until its
                    # session lapses; no rebalance. What it was revoking it gave up as it stopped
                    # (Kafka's consumerGroupStaticMemberGroupLeave clears it): the members waiting
                    # for those get them, and no revocation deadline removes it meanwhile.
                    member.update(
                        member_epoch=STATIC_LEAVE_EPOCH, state=MEMBER_STABLE, revoking={}, revocation_due_ms=None
                    )
                    await self._save(conn, group, state, now)
                    return ConsumerHeartbeatResult(member_id, epoch, interval_ms, None)
                await groups.remove_members(conn, group_id, [member_id])
                del state["members"][member_id]
                await self.update(conn, group, state, now, bumped=True)
                return ConsumerHeartbeatResult(member_id, epoch, interval_ms, None)
            if member is None and not joining:
                raise unknown_member(group_id, member_id)
            owned = await self._owned(conn, request.owned)
            if member is not None and not joining:
                self._check_epoch(group_id, member_id, member, epoch, owned)
            returned = None
            if member is None and joining and request.instance_id is not None:
                returned = await self.static_member_returns(
                    conn, group_id, state, member_id, request.instance_id, now, session_timeout_ms
                )
                member = returned
            if member is None:
                member = state["members"][member_id] = new_member(request.rebalance_timeout_ms)
                await groups.add_member(conn, group_id, Member(member_id, [], session_timeout_ms, now, now))
                bumped = True
            elif joining and returned is None:
                # A member rejoining (fenced, or its join's answer lost) owns nothing (a join's
                # TopicPartitions is empty): it starts over from no partitions.
                member.update(member_epoch=0, state=MEMBER_STABLE, assigned={}, revoking={}, revocation_due_ms=None)
            before = (member["assigned"], member["member_epoch"])
            previous_regex = member["regex"]
            bumped |= self._take_subscription(member, request)
            if member["regex"] not in (None, previous_regex) and member["regex"] not in state.get("regexes", {}):
                # New to the group: checked now, resolved after this heartbeat is answered (`update`).
                await _check_new_regex(conn, member["regex"])
            _check_describable(state, member, request.may_describe)
            bumped |= resolve_subscription(state, member)
            member.update(
                instance_id=request.instance_id or member.get("instance_id"),
                rack_id=request.rack_id or member.get("rack_id"),
                client_id=request.client_id,
                client_host=request.client_host,
            )
            # A member heartbeating with this protocol is no classic member any more (as Kafka's
            # coordinator clears its classic metadata): it counts against a downgrade.
            member.pop("classic", None)
            await self.update(
                conn, group, state, now, bumped, reconciling=(member_id, owned, request.may_describe), loaded=loaded
            )
            await groups.touch_member(conn, group_id, member_id, member["subscribed"], session_timeout_ms, now)
            changed = joining or (member["assigned"], member["member_epoch"]) != before
            if owned is not None and owned != partition_set(member["assigned"]):
                changed = True
        ids = state["topics"]
        assignment = None
        if changed:
            assignment = [
                (uuid.UUID(ids[topic][0]), partitions)
                for topic, partitions in sorted(member["assigned"].items())
                if topic in ids
            ]
        return ConsumerHeartbeatResult(member_id, member["member_epoch"], interval_ms, assignment)

    @staticmethod
    def _state_for(group: Group, current: list[Member], joining: bool) -> dict:
        """The group's consumer state, if a ConsumerGroupHeartbeat may act on it: a member joining a
        classic group of Kafka consumers with members converts it (`_upgraded`, as Kafka's
        validateOnlineUpgrade allows it); a group whose members are HTTP ones, or classic ones of
        another protocol type, refuses it; an empty group of another kind becomes a consumer group."""
        state = consumer_state(group)
        consumer_members = set(state["members"]) if state else set()
        classic = group.assignment.get(CLASSIC_STATE_KEY)
        if (
            joining
            and state is None
            and classic is not None
            and classic["members"]
            and classic["protocol_type"] == CONSUMER_PROTOCOL
            and all(m.member_id in classic["members"] for m in current)
        ):
            upgraded = _upgraded(classic, group.generation_id)
            if upgraded is not None:
                return upgraded
        if any(m.member_id not in consumer_members for m in current):
            if classic and classic["members"] and classic["protocol_type"] != CONSUMER_PROTOCOL:
                detail = (
                    "has members of Kafka's classic protocol (JoinGroup) of protocol type "
                    f"{classic['protocol_type']!r}, not Kafka consumers' ({CONSUMER_PROTOCOL!r}), so it cannot "
                    "become a consumer group"
                )
            elif classic and classic["members"] and joining:
                detail = (
                    "has members of Kafka's classic protocol (JoinGroup) whose metadata or assignment is no "
                    "ConsumerProtocol message this server reads, so it cannot become a consumer group"
                )
            elif classic and classic["members"]:
                detail = (
                    "has members of Kafka's classic protocol (JoinGroup), and only a joining member (epoch 0) "
                    "converts it to a consumer group"
                )
            else:
                detail = "has members that joined over HTTP, and HTTP groups are never converted"
            raise _inconsistent(group.group_id, detail)
        if state is None:
            state = _fresh()
            state["assignment_epoch"] = group.generation_id
        return state

    async def static_member_returns(
        self,
        conn: asyncpg.Connection,
        group_id: str,
        state: dict,
        member_id: str,
        instance_id: str,
        now: int,
        session_timeout_ms: int,
        require_released: bool = True,
    ) -> dict | None:
        """A static member joining under a new member id: it takes the place, partitions and target of
        its instance's previous member once that one left (epoch -2), as Kafka's coordinator replaces
        it, without a rebalance; UNRELEASED_INSTANCE_ID while that one is still active (unless
        `require_released` is False: a classic member joining with an unknown member id replaces it
        at once, as Kafka's; a classic previous member is replaced at once too). None when no member
        has this instance id (a new static member)."""
        previous_id = _member_of_instance(state, instance_id)
        if previous_id is None:
            return None
        previous = state["members"][previous_id]
        # A classic member never leaves with epoch -2 (a static classic consumer stops without a
        # LeaveGroup): one of its instance joining with this protocol (a rolling upgrade) replaces it
        # at once, as Kafka's coordinator requires the release of a consumer-protocol member only.
        if require_released and not is_classic(previous) and previous["member_epoch"] != STATIC_LEAVE_EPOCH:
            raise BrokerError(
                ErrorCode.UNRELEASED_INSTANCE_ID,
                f"instance id {instance_id!r} of consumer group {group_id!r} is still member {previous_id!r}'s, which "
                f"has not left: two consumers have one group.instance.id; stop the other one (member {member_id!r} "
                f"was refused)",
            )
        del state["members"][previous_id]
        member = state["members"][member_id] = {
            **previous,
            "member_epoch": 0,
            "previous_member_epoch": -1,
            "state": MEMBER_STABLE,
            "revoking": {},
            "revocation_due_ms": None,
        }
        if previous_id in state["target"]:
            state["target"][member_id] = state["target"].pop(previous_id)
        await groups.remove_members(conn, group_id, [previous_id])
        await groups.add_member(conn, group_id, Member(member_id, member["subscribed"], session_timeout_ms, now, now))
        return member

    @staticmethod
    def _check_epoch(group_id: str, member_id: str, member: dict, epoch: int, owned: set | None) -> None:
        """Kafka's rule: an epoch above the member's is fenced; one below it too, unless it is the
        member's previous epoch and it owns nothing outside its assignment (the answer that moved
        it on was lost)."""
        current = member["member_epoch"]
        if epoch > current:
            raise _fenced(group_id, member_id, epoch, current)
        if epoch < current and (
            epoch != member["previous_member_epoch"] or owned is None or not owned <= partition_set(member["assigned"])
        ):
            raise _fenced(group_id, member_id, epoch, current)

    async def _owned(self, conn: asyncpg.Connection, owned) -> set[tuple[str, int]] | None:
        if owned is None:
            return None
        topics = await find_topics_by_uuid(conn, sorted({topic_id for topic_id, _ in owned}))
        return {(topics[topic_id].name, p) for topic_id, ps in owned if topic_id in topics for p in ps}

    @staticmethod
    def _take_subscription(member: dict, request: ConsumerHeartbeat) -> bool:
        """The member's subscription and preferences as the heartbeat updates them; True when one
        that the target depends on changed (the group epoch is bumped)."""
        changed = False
        if request.subscribed_topic_names is not None:
            names = sorted(set(request.subscribed_topic_names))
            changed |= names != member["names"]
            member["names"] = names
        if request.subscribed_topic_regex is not None:  # "": no regular expression any more
            # Its topics, not the expression, are what the target depends on (`resolve_subscription`).
            member["regex"] = request.subscribed_topic_regex or None
        if request.server_assignor is not None:
            changed |= request.server_assignor != member["server_assignor"]
            member["server_assignor"] = request.server_assignor
        if request.rebalance_timeout_ms != -1:
            member["rebalance_timeout_ms"] = request.rebalance_timeout_ms
        return changed

    async def remove_lapsed(
        self, conn: asyncpg.Connection, group: Group, state: dict, current: list[Member], now: int
    ) -> bool:
        """Removes the members whose session lapsed or whose revocation is overdue (as Kafka's timers
        would have by now); True when any was."""
        lapsed = {m.member_id for m in current if m.last_heartbeat_ms + m.session_timeout_ms < now}
        lapsed = (lapsed | _overdue(state, now)) & set(state["members"])
        if not lapsed:
            return False
        await groups.remove_members(conn, group.group_id, sorted(lapsed))
        for member_id in lapsed:
            del state["members"][member_id]
        return True

    async def update(
        self,
        conn: asyncpg.Connection,
        group: Group,
        state: dict,
        now: int,
        bumped: bool,
        reconciling: tuple[str, set[tuple[str, int]] | None, Callable[[str], bool]] | None = None,
        loaded: tuple[int, dict] | None = None,
    ) -> None:
        """Bumps the group epoch when asked or when the subscribed topics changed, recomputes the
        target when its epoch is behind, reconciles the heartbeating member (`reconciling`: its id,
        the partitions it says it owns, and whether its principal may Describe a topic), then
        resolves the group's regular expressions (`_refresh_regexes`) and saves (`_save`; `loaded`:
        the group epoch and state as read, when they need no writing if unchanged). A group whose
        members are now all classic ones becomes a classic group again (`_downgrade`)."""
        if state["members"] and all(is_classic(m) for m in state["members"].values()):
            await self._downgrade(conn, group, state, now)
            return
        await self._retarget(conn, group, state, bumped)
        if reconciling is not None:
            reconcile(state, reconciling[0], reconciling[1], now)
        # After the heartbeat's answer is settled, as Kafka's coordinator resolves them in the
        # background: the heartbeat that brings a new regex is answered without its topics (the
        # literal ones first), and a resolution that changes the members' topics bumps the group
        # epoch, so every member subscribing to the regex gets its share at its next heartbeat.
        heartbeating = None if reconciling is None else (reconciling[0], reconciling[2])
        if await _refresh_regexes(conn, state, heartbeating):
            await self._retarget(conn, group, state, bumped=True)
        await self._save(conn, group, state, now, loaded)

    @staticmethod
    async def _downgrade(conn: asyncpg.Connection, group: Group, state: dict, now: int) -> None:
        """The group's last member of this protocol left or was removed, classic ones remain: as
        Kafka's convertToClassicGroup (group.consumer.migration.policy's downgrade), it becomes a
        classic group at its group epoch, every member's target its assignment, and rebalances
        (classic_groups.downgraded); no revocation deadline of this group's holds any more."""
        await groups.set_revocation_deadlines(conn, group.group_id, dict.fromkeys(state["members"]))
        await save_classic_state(conn, group, downgraded(state, now), now)

    @staticmethod
    async def _retarget(conn: asyncpg.Connection, group: Group, state: dict, bumped: bool) -> None:
        """Bumps the group epoch when asked or when the subscribed topics changed (appeared,
        disappeared, grew), and recomputes the target when its epoch is behind."""
        subscribed = sorted({t for m in state["members"].values() for t in m["subscribed"]})
        found = await find_topics(conn, subscribed)
        topics = {name: [str(t.topic_uuid), t.partition_count] for name, t in sorted(found.items())}
        if bumped or topics != state["topics"]:
            group.generation_id += 1
        state["topics"] = topics
        if state["assignment_epoch"] != group.generation_id:
            state["assignor"] = preferred_assignor([m["server_assignor"] for m in state["members"].values()])
            state["target"] = target_assignment(
                state["assignor"],
                {mid: m["subscribed"] for mid, m in state["members"].items()},
                {name: count for name, (_, count) in topics.items()},
                state["target"],
            )
            state["assignment_epoch"] = group.generation_id

    @staticmethod
    async def _save(
        conn: asyncpg.Connection, group: Group, state: dict, now: int, loaded: tuple[int, dict] | None = None
    ) -> None:
        """Writes the group's state, its epoch and its members' revocation deadlines, unless they are
        what was `loaded` (a stable member's heartbeat changes nothing): rewritten at every heartbeat,
        the group's whole state (every member's) cost each of N members' heartbeats a write of O(N),
        and the group's last update (its last rebalance, the console's) moved with every heartbeat."""
        state["state"] = _group_state(state, group.generation_id)
        if loaded == (group.generation_id, state):
            return
        # Mirrored on the members' rows, where the eviction worker finds the overdue ones by index.
        await groups.set_revocation_deadlines(
            conn, group.group_id, {mid: m.get("revocation_due_ms") for mid, m in state["members"].items()}
        )
        # And their topics (what describe, OffsetDelete and the console read), which a regex's
        # resolution changes for members that are not heartbeating.
        await groups.set_member_topics(
            conn, group.group_id, {mid: m["subscribed"] for mid, m in state["members"].items()}
        )
        assignment: dict = {mid: m["assigned"] for mid, m in state["members"].items() if m["assigned"]}
        assignment[CONSUMER_STATE_KEY] = state
        group.assignment = assignment
        group.last_update_ms = now
        await groups.save_generation(conn, group)

    async def members_removed(self, conn: asyncpg.Connection, group: Group, now: int) -> None:
        """After members were evicted (their group_members rows are gone; the caller holds the row):
        their partitions are free, and the group epoch is bumped."""
        state = consumer_state(group)
        remaining = {m.member_id for m in await groups.members(conn, group.group_id)}
        for member_id in [m for m in state["members"] if m not in remaining]:
            del state["members"][member_id]
        await self.update(conn, group, state, now, bumped=True)

    async def credit_timers(self, conn: asyncpg.Connection, group: Group, credit_ms: int, now: int) -> None:
        """After `credit_ms` in which no server could hear the members (GroupCoordinator.expire_sessions),
        each revocation underway gets that time back (at most its whole rebalance timeout from `now`):
        a member is not removed for the time it could not reach the group. The caller holds the row."""
        state = consumer_state(group)
        if state is None or not state["members"]:
            return
        credit_revocations(state["members"].values(), credit_ms, now)
        await self._save(conn, group, state, now)

    async def settle_overdue(self, conn: asyncpg.Connection, group: Group, now: int) -> bool:
        """Removes the members overdue to revoke (the caller holds the row); True when any was."""
        state = consumer_state(group)
        if state is None:
            return False
        overdue = _overdue(state, now)
        if not overdue:
            return False
        await groups.remove_members(conn, group.group_id, sorted(overdue))
        await self.members_removed(conn, group, now)
        return True


@dataclass(frozen=True, slots=True)
class DescribedConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: Partitions
    target_assignment: Partitions
    classic: bool  # a member of Kafka's classic protocol (JoinGroup), not of ConsumerGroupHeartbeat's


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    """A consumer group as Kafka's ConsumerGroupDescribe answers it."""

    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: list[DescribedConsumerMember]
    topic_ids: dict[str, uuid.UUID]  # of the topics the members' assignments and targets name


def not_a_consumer_group(group_id: str, exists: bool) -> BrokerError:
    detail = "is not a consumer group" if exists else "not found"
    return BrokerError(
        ErrorCode.GROUP_ID_NOT_FOUND,
        f"Group {group_id} {detail}.",  # Kafka's words, which its admin clients show
    )


def describe_consumer_group(group: Group | None, group_id: str) -> ConsumerGroupDescription:
    """The description of a group row read by the caller: GROUP_ID_NOT_FOUND when there is no such
    group or it is of another kind (classic, HTTP), as Kafka's coordinator answers."""
    state = None if group is None else consumer_state(group)
    if state is None:
        raise not_a_consumer_group(group_id, group is not None)

    def existing(partitions: Partitions) -> Partitions:
        # A member that has not heartbeat since a topic it holds was deleted still has it (its next
        # heartbeat revokes it); as Kafka's description, only the topics that exist are shown.
        return {topic: ps for topic, ps in partitions.items() if topic in state["topics"]}

    return ConsumerGroupDescription(
        group_id,
        state["state"],
        group.generation_id,
        state["assignment_epoch"],
        state["assignor"] or preferred_assignor([]),
        [
            DescribedConsumerMember(
                member_id,
                m.get("instance_id"),
                m.get("rack_id"),
                m["member_epoch"],
                m.get("client_id", ""),
                m.get("client_host", ""),
                m["names"],
                m["regex"],
                existing(m["assigned"]),
                existing(state["target"].get(member_id, {})),
                is_classic(m),
            )
            for member_id, m in sorted(state["members"].items())
        ],
        {name: uuid.UUID(topic_id) for name, (topic_id, _) in state["topics"].items()},
    )
