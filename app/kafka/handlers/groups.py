"""Consumer groups, Kafka's classic protocol: FindCoordinator (every node could coordinate every
group and transactional id; all name the same live node, as Kafka's brokers do), JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, ListGroups, DescribeGroups, DeleteGroups, through the group
coordinator HTTP's groups use (app/coordinator/classic_groups.py)."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError, DatabaseUnavailable
from app.kafka import api_table
from app.kafka.broker_calls import CLASSIC_GROUP_TYPE, ClassicJoin, ConsumerHeartbeat, ListedNodes, group_operations
from app.kafka.context import RequestContext
from app.kafka.error_codes import error_message, kafka_error
from app.kafka.frames import build, response_module
from app.kafka.handlers.metadata import OPERATIONS_NOT_REQUESTED, operation_bits

NO_THROTTLE = datetime.timedelta(0)
NO_GENERATION = -1
# JoinGroup v4+: a new member first gets MEMBER_ID_REQUIRED with its id, then rejoins with it (KIP-394).
FIRST_VERSION_WITH_MEMBER_ID_REQUIRED = 4
# JoinGroup v9+: a leader may be told to skip the assignment (a static member rejoined a Stable group).
FIRST_VERSION_WITH_SKIP_ASSIGNMENT = 9


def _ms(value: datetime.timedelta) -> int:
    return int(value.total_seconds() * 1000)


# ListGroups' answer while the synchronous standby has not confirmed the groups read
# (docs/operations-high-availability.md): COORDINATOR_LOAD_IN_PROGRESS, which Kafka's admin client
# retries after a backoff, as for ListTransactions (handlers/transaction_admin.py).
LIST_UNCONFIRMED = KafkaError.coordinator_load_in_progress
# FindCoordinator's key types: a group, a transactional id, and (v6+, KIP-932) a share group.
GROUP_KEY = 0
TRANSACTION_KEY = 1
SHARE_KEY = 2
COORDINATED_KEYS = frozenset({GROUP_KEY, TRANSACTION_KEY})
NO_NODE = {"node_id": -1, "host": "", "port": -1}
# The internal topic whose partition's leader coordinates a key in Kafka, by key type: the name
# that keeps a group's and a transactional id's coordinator apart (ListedNodes.coordinator).
COORDINATOR_TOPICS = {GROUP_KEY: "__consumer_offsets", TRANSACTION_KEY: "__transaction_state"}


def _coordinator_of(
    context: RequestContext, listing: ListedNodes, key_type: int, key: str
) -> tuple[KafkaError, str | None, dict]:
    """(error, message, node) for a key of `key_type`: for a group or a transactional id the
    principal may Describe (checked first, as Kafka's broker does: GROUP_AUTHORIZATION_FAILED or
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, no node), the live node every node names its coordinator
    (ListedNodes.coordinator: any node could coordinate it, the state being in PostgreSQL, but
    Kafka's clients expect every broker to name the same one, as Kafka's do). txbroker has no
    share groups, so a share key gets INVALID_REQUEST, Kafka's answer when its share coordinator is
    not enabled (and, below v6, for the type itself), as does a type Kafka lacks."""
    if key_type in COORDINATED_KEYS:
        refused = context.calls.groups.coordinator_refusal(context.principal, key, key_type == TRANSACTION_KEY)
        if refused is not None:
            return kafka_error(refused), error_message(refused), NO_NODE
        coordinator = listing.coordinator(COORDINATOR_TOPICS[key_type], key)
        return (
            KafkaError.none,
            None,
            {"node_id": coordinator.node_id, "host": coordinator.host, "port": coordinator.port},
        )
    kind = "share groups (key type 2, KIP-932)" if key_type == SHARE_KEY else f"key type {key_type}"
    message = (
        f"{kind} are not served by this broker: expected key type {GROUP_KEY} (a group) or "
        f"{TRANSACTION_KEY} (a transactional id)"
    )
    return KafkaError.invalid_request, message, NO_NODE


async def coordinated_here(context: RequestContext, key_type: int) -> Callable[[str], bool]:
    """Whether this node is the coordinator FindCoordinator names for a key of `key_type`: what a
    Kafka broker's ListGroups and ListTransactions list (the groups and transactional ids of the
    internal topic's partitions it leads). Kafka's admin clients ask every broker and add up the
    answers (KafkaJS's listGroups and Kafka's listTransactions keep each one's), so each key is
    listed by one node, as each is coordinated by one; one node alone lists every key."""
    listing = await context.listed_nodes()
    internal_topic = COORDINATOR_TOPICS[key_type]
    return lambda key: listing.coordinator(internal_topic, key).node_id == context.calls.node_id


async def find_coordinator(context: RequestContext, request) -> object:
    """The coordinator every node names (a live node) for any key of either type txbroker has
    (group 0, transaction 1) that the principal may Describe."""
    module = response_module(api_table.FIND_COORDINATOR, context.api_version)
    keys = getattr(request, "coordinator_keys", None)
    key_type = getattr(request, "key_type", GROUP_KEY)
    listing = await context.listed_nodes()
    if keys is None:  # v0-v3: one key
        error, message, node = _coordinator_of(context, listing, key_type, request.key)
        return build(
            module,
            "FindCoordinatorResponse",
            throttle_time=NO_THROTTLE,
            error_code=error,
            error_message=message,
            **node,
        )
    return build(
        module,
        "FindCoordinatorResponse",
        throttle_time=NO_THROTTLE,
        coordinators=tuple(_coordinator(context, listing, module, key_type, key) for key in keys),
    )


def _coordinator(context: RequestContext, listing: ListedNodes, module, key_type: int, key: str) -> object:
    """v4+'s answer for one of the keys."""
    error, message, node = _coordinator_of(context, listing, key_type, key)
    return build(module, "Coordinator", key=key, error_code=error, error_message=message, **node)


async def join_group(context: RequestContext, request) -> object:
    module = response_module(api_table.JOIN_GROUP, context.api_version)
    session_timeout_ms = _ms(request.session_timeout)
    rebalance_timeout_ms = _ms(getattr(request, "rebalance_timeout", request.session_timeout))
    if rebalance_timeout_ms < 0:
        rebalance_timeout_ms = session_timeout_ms
    values = {
        "generation_id": NO_GENERATION,
        "protocol_name": None,
        "leader": "",
        "member_id": request.member_id,
        "skip_assignment": False,
    }
    members = ()
    error = KafkaError.none
    try:
        joining = ClassicJoin(
            group_id=request.group_id,
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            protocol_type=request.protocol_type,
            protocols=[(p.name, p.metadata) for p in request.protocols],
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            client_id=context.client_id,
            client_host=context.client_host,
            member_id_required=context.api_version >= FIRST_VERSION_WITH_MEMBER_ID_REQUIRED,
            skip_assignment_allowed=context.api_version >= FIRST_VERSION_WITH_SKIP_ASSIGNMENT,
        )
        joined = await context.calls.groups.join(context.principal, joining)
    except BrokerError as raised:
        error = kafka_error(raised)
    else:
        if joined.member_id_required:
            error = KafkaError.member_id_required
            values["member_id"] = joined.member_id
        else:
            values.update(
                generation_id=joined.generation_id,
                protocol_name=joined.protocol_name,
                leader=joined.leader,
                member_id=joined.member_id,
                skip_assignment=joined.skip_assignment,
            )
            members = tuple(
                build(
                    module,
                    "JoinGroupResponseMember",
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    metadata=m.metadata,
                )
                for m in joined.members
            )
    if context.api_version < 7 and values["protocol_name"] is None:
        values["protocol_name"] = ""  # not nullable before v7
    return build(
        module,
        "JoinGroupResponse",
        throttle_time=NO_THROTTLE,
        error_code=error,
        protocol_type=request.protocol_type if error == KafkaError.none else None,
        members=members,
        **values,
    )


async def sync_group(context: RequestContext, request) -> object:
    module = response_module(api_table.SYNC_GROUP, context.api_version)
    error, protocol_type, protocol_name, assignment = None, None, None, b""
    try:
        synced = await context.calls.groups.sync(
            context.principal,
            request.group_id,
            request.member_id,
            request.generation_id,
            {a.member_id: a.assignment for a in request.assignments},
            getattr(request, "group_instance_id", None),
            getattr(request, "protocol_type", None),  # v5+
            getattr(request, "protocol_name", None),
        )
        protocol_type, protocol_name, assignment = synced.protocol_type, synced.protocol_name, synced.assignment
    except BrokerError as raised:
        error = raised
    return build(
        module,
        "SyncGroupResponse",
        throttle_time=NO_THROTTLE,
        error_code=kafka_error(error),
        protocol_type=protocol_type,
        protocol_name=protocol_name,
        assignment=assignment,
    )


async def heartbeat(context: RequestContext, request) -> object:
    module = response_module(api_table.HEARTBEAT, context.api_version)
    error = None
    try:
        await context.calls.groups.heartbeat(
            context.principal,
            request.group_id,
            request.member_id,
            request.generation_id,
            getattr(request, "group_instance_id", None),
        )
    except BrokerError as raised:
        error = raised
    return build(module, "HeartbeatResponse", throttle_time=NO_THROTTLE, error_code=kafka_error(error))


async def leave_group(context: RequestContext, request) -> object:
    module = response_module(api_table.LEAVE_GROUP, context.api_version)
    batch = getattr(request, "members", None)
    leaving = [(m.member_id, m.group_instance_id) for m in batch] if batch is not None else [(request.member_id, None)]
    try:
        errors = await context.calls.groups.leave(context.principal, request.group_id, leaving)
    except BrokerError as raised:
        return build(
            module, "LeaveGroupResponse", throttle_time=NO_THROTTLE, error_code=kafka_error(raised), members=()
        )
    if batch is None:  # v0-v2: one member, its error is the request's
        return build(module, "LeaveGroupResponse", throttle_time=NO_THROTTLE, error_code=kafka_error(errors[0]))
    return build(
        module,
        "LeaveGroupResponse",
        throttle_time=NO_THROTTLE,
        error_code=KafkaError.none,
        members=tuple(
            build(
                module,
                "MemberResponse",
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                error_code=kafka_error(error),
            )
            for m, error in zip(batch, errors)
        ),
    )


async def list_groups(context: RequestContext, request) -> object:
    """The groups this node coordinates (`coordinated_here`: as a Kafka broker, those FindCoordinator
    names it for); v4's state filter, by name in any case and trimmed, as Kafka's group coordinator
    compares it; v5's type filter (KIP-848), by name in any case as Kafka's: "classic" (JoinGroup's
    and HTTP's groups) and "consumer" (ConsumerGroupHeartbeat's); share or a name Kafka does not
    know, none."""
    module = response_module(api_table.LIST_GROUPS, context.api_version)
    wanted_states = {name.strip().lower() for name in getattr(request, "states_filter", ()) or ()}
    wanted_types = {name.lower() for name in getattr(request, "types_filter", ()) or ()}
    coordinated = await coordinated_here(context, GROUP_KEY)
    try:
        groups = await context.calls.groups.list_groups(context.principal)
    except DatabaseUnavailable as unconfirmed:  # the synchronous standby lacks what was read: retried
        return build(
            module,
            "ListGroupsResponse",
            throttle_time=NO_THROTTLE,
            error_code=kafka_error(unconfirmed, LIST_UNCONFIRMED),
            groups=(),
        )
    listed = [
        g
        for g in groups
        if (not wanted_states or g.state.lower() in wanted_states)
        and (not wanted_types or g.group_type in wanted_types)
        and coordinated(g.group_id)
    ]
    return build(
        module,
        "ListGroupsResponse",
        throttle_time=NO_THROTTLE,
        error_code=KafkaError.none,
        groups=tuple(
            build(
                module,
                "ListedGroup",
                group_id=g.group_id,
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
            for g in listed
        ),
    )


# DescribeGroups v6+ (KIP-1043): a group that does not exist is GROUP_ID_NOT_FOUND (still Dead),
# each group's error with a message; older versions describe it as Dead without an error.
GROUP_NOT_FOUND_SINCE = 6


def _described_error(context: RequestContext, group) -> tuple[KafkaError, str | None]:
    if not group.found and context.api_version >= GROUP_NOT_FOUND_SINCE:
        if group.group_type != CLASSIC_GROUP_TYPE:
            return KafkaError.group_id_not_found, f"Group {group.group_id} is not a classic group."
        return KafkaError.group_id_not_found, f"Group {group.group_id} not found."
    return kafka_error(group.error), error_message(group.error)


def _group_authorized_operations(context: RequestContext, request, group_id: str, error: KafkaError) -> int:
    """The principal's operations on the group when the request asks for them (DescribeGroups v3+,
    ConsumerGroupDescribe), for a group described without error, as Kafka's KafkaApis sets them;
    else OPERATIONS_NOT_REQUESTED."""
    if not getattr(request, "include_authorized_operations", False) or error != KafkaError.none:
        return OPERATIONS_NOT_REQUESTED
    return operation_bits(group_operations(context.principal, group_id))


async def describe_groups(context: RequestContext, request) -> object:
    module = response_module(api_table.DESCRIBE_GROUPS, context.api_version)
    described = []
    for group_id in request.groups:
        group = await context.calls.groups.describe_group(context.principal, group_id)
        error, message = _described_error(context, group)
        described.append(
            build(
                module,
                "DescribedGroup",
                error_code=error,
                error_message=message,
                group_id=group_id,
                group_state=group.state,
                protocol_type=group.protocol_type,
                protocol_data=group.protocol,
                members=tuple(
                    build(
                        module,
                        "DescribedGroupMember",
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in group.members
                ),
                authorized_operations=_group_authorized_operations(context, request, group_id, error),
            )
        )
    return build(module, "DescribeGroupsResponse", throttle_time=NO_THROTTLE, groups=tuple(described))


async def delete_groups(context: RequestContext, request) -> object:
    """Each group deleted on its own: one group's error (GROUP_AUTHORIZATION_FAILED, NON_EMPTY_GROUP,
    GROUP_ID_NOT_FOUND) fails only that group. A group named twice is answered once, as Kafka's
    answer is keyed by group."""
    module = response_module(api_table.DELETE_GROUPS, context.api_version)
    results = []
    for group_id in dict.fromkeys(request.groups_names):
        error = None
        try:
            await context.calls.groups.delete_group(context.principal, context.client_address, group_id)
        except BrokerError as raised:
            error = raised
        results.append(build(module, "DeletableGroupResult", group_id=group_id, error_code=kafka_error(error)))
    return build(module, "DeleteGroupsResponse", throttle_time=NO_THROTTLE, results=tuple(results))


def _heartbeat_request(context: RequestContext, request) -> ConsumerHeartbeat:
    owned = request.topic_partitions
    return ConsumerHeartbeat(
        group_id=request.group_id,
        # v0: the coordinator names a new member (epoch 0 without an id); v1: the consumer always does.
        member_id=request.member_id
        or (str(uuid.uuid4()) if context.api_version == 0 and not request.member_epoch else ""),
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=_ms(request.rebalance_timeout),
        subscribed_topic_names=None if request.subscribed_topic_names is None else list(request.subscribed_topic_names),
        # librdkafka sends "" for no regular expression, as Kafka's coordinator reads it too.
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None) or None,
        server_assignor=request.server_assignor,
        owned=None if owned is None else [(t.topic_id, [int(p) for p in t.partitions]) for t in owned],
        client_id=context.client_id,
        client_host=context.client_host,
    )


async def consumer_group_heartbeat(context: RequestContext, request) -> object:
    """KIP-848's ConsumerGroupHeartbeat (app/coordinator/consumer_groups.py): join (epoch 0), heartbeat
    with the owned partitions, leave (epoch -1); the answer carries the member's epoch and, when it
    changed, its assigned partitions by topic id."""
    module = response_module(api_table.CONSUMER_GROUP_HEARTBEAT, context.api_version)
    try:
        answered = await context.calls.groups.consumer_heartbeat(
            context.principal, _heartbeat_request(context, request)
        )
    except BrokerError as raised:
        return build(
            module,
            "ConsumerGroupHeartbeatResponse",
            throttle_time=NO_THROTTLE,
            error_code=kafka_error(raised),
            error_message=error_message(raised),
            member_id=None,
            member_epoch=0,
            heartbeat_interval=datetime.timedelta(0),
            assignment=None,
        )
    assignment = None
    if answered.assignment is not None:
        assignment = build(
            module,
            "Assignment",
            topic_partitions=tuple(
                build(module, "TopicPartitions", topic_id=topic_id, partitions=tuple(partitions))
                for topic_id, partitions in answered.assignment
            ),
        )
    return build(
        module,
        "ConsumerGroupHeartbeatResponse",
        throttle_time=NO_THROTTLE,
        error_code=KafkaError.none,
        error_message=None,
        member_id=answered.member_id,
        member_epoch=answered.member_epoch,
        heartbeat_interval=datetime.timedelta(milliseconds=answered.heartbeat_interval_ms),
        assignment=assignment,
    )


# ConsumerGroupDescribe v1's member types (KIP-1099): a member of the classic protocol (Kafka 4's
# online migration: one of a classic group converted, or joined since with JoinGroup), or of the
# consumer protocol.
CLASSIC_MEMBER_TYPE = 0
CONSUMER_MEMBER_TYPE = 1


def _described_assignment(module, partitions: dict, topic_ids: dict) -> object:
    return build(
        module,
        "Assignment",
        topic_partitions=tuple(
            build(module, "TopicPartitions", topic_id=topic_ids.get(topic), topic_name=topic, partitions=tuple(parts))
            for topic, parts in sorted(partitions.items())
        ),
    )


def _described_member(module, member, topic_ids: dict) -> object:
    return build(
        module,
        "Member",
        member_id=member.member_id,
        instance_id=member.instance_id,
        rack_id=member.rack_id,
        member_epoch=member.member_epoch,
        client_id=member.client_id,
        client_host=member.client_host,
        subscribed_topic_names=tuple(member.subscribed_topic_names),
        subscribed_topic_regex=member.subscribed_topic_regex,
        assignment=_described_assignment(module, member.assignment, topic_ids),
        target_assignment=_described_assignment(module, member.target_assignment, topic_ids),
        member_type=CLASSIC_MEMBER_TYPE if member.classic else CONSUMER_MEMBER_TYPE,
    )


async def consumer_group_describe(context: RequestContext, request) -> object:
    """KIP-848's ConsumerGroupDescribe: each group on its own, its error (GROUP_ID_NOT_FOUND for no
    such group or a classic one, with Kafka's message; GROUP_AUTHORIZATION_FAILED;
    TOPIC_AUTHORIZATION_FAILED) in its entry; members with their epochs, current and target
    assignments by topic id and name."""
    module = response_module(api_table.CONSUMER_GROUP_DESCRIBE, context.api_version)
    described = []
    for group_id in request.group_ids:
        error, values = None, {"group_state": "Dead", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": ""}
        members: tuple = ()
        try:
            group = await context.calls.groups.describe_consumer_group(context.principal, group_id)
        except BrokerError as raised:
            error = raised
        else:
            values = {
                "group_state": group.state,
                "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch,
                "assignor_name": group.assignor,
            }
            members = tuple(_described_member(module, m, group.topic_ids) for m in group.members)
        described.append(
            build(
                module,
                "DescribedGroup",
                error_code=kafka_error(error),
                error_message=error_message(error),
                group_id=group_id,
                members=members,
                authorized_operations=_group_authorized_operations(context, request, group_id, kafka_error(error)),
                **values,
            )
        )
    return build(module, "ConsumerGroupDescribeResponse", throttle_time=NO_THROTTLE, groups=tuple(described))
