"""Consumer groups: heartbeat (join/sync/heartbeat with server-side assignment), leave, offset
commit, fetch and delete; list, describe and delete; and TxnOffsetCommit."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.convertors import Convertor, register_url_convertor

from app.api import schemas
from app.api.auth import ActorDep, PrincipalDep
from app.api.deps import READY, GroupCoordinatorDep, SettingsDep
from app.api.json_route import OrjsonRoute
from app.api.request_limits import check_partition_count
from app.api.responses import error_or_none, json_response
from app.coordinator import http_revocations
from app.coordinator.authorizer import Operation, ResourceType, authorize, is_allowed
from app.coordinator.classic_groups import described_assignment, group_kind, group_type
from app.coordinator.consumer_groups import consumer_state
from app.coordinator.group_coordinator import OffsetEntry

GroupIdInPath = schemas.IdentifierInPath


class GroupIdConvertor(Convertor[str]):
    """A group id in a path: any text but empty, "/" included (Kafka's group ids may hold it, and the
    server decodes %2F before routing), as transactional ids' routes take theirs (`:path`). Not empty,
    so `/v1/groups/` still redirects to the list rather than naming a group ""."""

    regex = ".+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("group_id", GroupIdConvertor())

router = APIRouter(prefix="/v1", tags=["consumer groups"], dependencies=READY, route_class=OrjsonRoute)
ERRORS = {status: {"model": schemas.ErrorBody} for status in (400, 404, 409, 503)}


def _entries(offsets: list[schemas.OffsetIn]) -> list[OffsetEntry]:
    return [OffsetEntry(o.topic, o.partition, o.offset, o.metadata, o.leader_epoch) for o in offsets]


def _offset_errors(entries: list[OffsetEntry], errors) -> dict:
    return {
        "offsets": [
            {"topic": e.topic, "partition": e.partition, "error": error_or_none(error)}
            for e, error in zip(entries, errors)
        ]
    }


@router.post("/groups/{group_id:group_id}/heartbeat", response_model=schemas.HeartbeatResponse, responses=ERRORS)
async def heartbeat(
    group_id: GroupIdInPath, body: schemas.HeartbeatRequest, groups: GroupCoordinatorDep, principal: PrincipalDep
):
    """[Join/Sync/Heartbeat] Joins (member_id ""), keeps alive, and answers the group's current
    generation and this member's assignment in it (range assignment, computed by the server).
    Needs Read on the group and Describe on the topics."""
    authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
    for topic in set(body.topics):
        authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic)
    result = await groups.heartbeat(
        group_id,
        body.member_id,
        body.topics,
        body.session_timeout_ms,
        body.join_id,
        body.generation_id,
        body.rebalance_timeout_ms,
    )
    return json_response(
        {
            "member_id": result.member_id,
            "generation_id": result.generation_id,
            "heartbeat_interval_ms": result.heartbeat_interval_ms,
            "assignment": [
                {"topic": topic, "topic_id": result.topic_ids[topic], "partitions": partitions}
                for topic, partitions in sorted(result.assignment.items())
            ],
        }
    )


@router.post("/groups/{group_id:group_id}/leave", responses=ERRORS)
async def leave(
    group_id: GroupIdInPath, body: schemas.LeaveRequest, groups: GroupCoordinatorDep, principal: PrincipalDep
):
    """[LeaveGroup] The group rebalances at once instead of after the session timeout."""
    authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
    await groups.leave(group_id, body.member_id)
    return json_response({})


@router.post("/groups/{group_id:group_id}/offsets/commit", response_model=schemas.OffsetsResult, responses=ERRORS)
async def commit_offsets(
    group_id: GroupIdInPath,
    body: schemas.OffsetCommitRequest,
    groups: GroupCoordinatorDep,
    settings: SettingsDep,
    principal: PrincipalDep,
):
    """[OffsetCommit] With generation_id >= 0 the member and generation are checked; with
    require_advance, an offset not past the partition's committed one is refused. Needs Read on the
    group and on the topics."""
    check_partition_count(settings, len(body.offsets))
    authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
    for topic in {o.topic for o in body.offsets}:
        authorize(principal, Operation.READ, ResourceType.TOPIC, topic)
    entries = _entries(body.offsets)
    errors = await groups.commit_offsets(
        group_id, body.member_id, body.generation_id, entries, require_advance=body.require_advance
    )
    return json_response(_offset_errors(entries, errors))


@router.post("/groups/{group_id:group_id}/offsets/fetch", response_model=schemas.OffsetFetchResponse, responses=ERRORS)
async def fetch_offsets(
    group_id: GroupIdInPath,
    body: schemas.OffsetFetchRequest,
    groups: GroupCoordinatorDep,
    settings: SettingsDep,
    principal: PrincipalDep,
):
    """[OffsetFetch] Committed offsets (-1: none); transactional ones only once committed. Needs
    Describe on the group and on the topics named; without partitions, the offsets of the topics the
    caller may Describe (Kafka shows no offset of a topic to a principal that may not Describe it)."""
    if body.partitions is not None:
        check_partition_count(settings, len(body.partitions))
    authorize(principal, Operation.DESCRIBE, ResourceType.GROUP, group_id)
    wanted = None if body.partitions is None else [(p.topic, p.partition) for p in body.partitions]
    for topic in {topic for topic, _ in wanted or ()}:
        authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic)
    found = await groups.fetch_offsets(group_id, wanted, body.require_stable)
    return json_response(
        {
            "offsets": [
                {
                    "topic": c.topic,
                    "partition": c.partition,
                    "offset": c.offset,
                    "metadata": c.metadata,
                    "leader_epoch": c.leader_epoch,
                    "error": error_or_none(error),
                }
                for c, error in found
                if is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, c.topic)
            ]
        }
    )


def _partitions(by_topic: dict) -> list[dict]:
    return [{"topic": t, "partitions": p} for t, p in sorted(by_topic.items())]


def _member_body(member, assignment: dict, consumer: dict | None = None) -> dict:
    """`consumer`: a KIP-848 consumer group's state, whose members also show their epoch, the
    partitions they are revoking and their target assignment (null for other kinds). An HTTP
    group's members show their target assignment (their `assignment`), the partitions they have
    still to revoke, and those of their target another member has still to revoke (`awaiting`,
    null for other kinds): their revocation barrier (http_revocations)."""
    barrier = http_revocations.member_barrier(assignment, member.member_id)
    body = {
        "member_id": member.member_id,
        "topics": member.topics,
        "session_timeout_ms": member.session_timeout_ms,
        "last_heartbeat_ms": member.last_heartbeat_ms,
        "assignment": _partitions(assignment.get(member.member_id, {})),
        "member_epoch": None,
        "revoking": None,
        "target_assignment": None,
        "awaiting": None,
    }
    if barrier is not None:
        revoking, awaiting = barrier
        body.update(
            revoking=_partitions(revoking),
            target_assignment=body["assignment"],
            awaiting=_partitions(awaiting),
        )
    own = None if consumer is None else consumer["members"].get(member.member_id)
    if own is not None:
        body.update(
            member_epoch=own["member_epoch"],
            revoking=_partitions(own["revoking"]),
            target_assignment=_partitions(consumer["target"].get(member.member_id, {})),
        )
    return body


def _kind(group, member_count: int) -> dict:
    """A group's state, protocol type and protocol by the rule Kafka's ListGroups and DescribeGroups
    and the console apply (classic_groups.group_kind): a Kafka group's own rebalance state
    (PreparingRebalance, CompletingRebalance, Stable, Empty) and the assignor its members chose; an
    HTTP group (no rebalance phase: the server assigns at each heartbeat) Stable or Empty."""
    protocol_type, state, protocol = group_kind(group, member_count)
    return {"state": state, "protocol_type": protocol_type, "protocol": protocol, "group_type": group_type(group)}


@router.get("/groups", responses=ERRORS)
async def list_groups(groups: GroupCoordinatorDep, principal: PrincipalDep):
    """[ListGroups] The groups the caller may Describe."""
    return json_response(
        {
            "groups": [
                {
                    "group_id": group.group_id,
                    "generation_id": group.generation_id,
                    "members": count,
                    **_kind(group, count),
                }
                for group, count in await groups.list()
                if is_allowed(principal, Operation.DESCRIBE, ResourceType.GROUP, group.group_id)
            ]
        }
    )


@router.get("/groups/{group_id:group_id}", responses=ERRORS)
async def describe_group(group_id: GroupIdInPath, groups: GroupCoordinatorDep, principal: PrincipalDep):
    """[DescribeGroups] Members, generation, state, assignment (a Kafka group's only while it is
    Stable, as Kafka's DescribeGroups), committed offsets and lag (records,
    not markers: a consumer past the last COMMIT marker has lag 0; at most 1000 markers are counted
    per partition, past them the lag is an upper bound and `lag_exact` false).
    Needs Describe on the group; the offsets are those of the topics the caller may Describe."""
    authorize(principal, Operation.DESCRIBE, ResourceType.GROUP, group_id)
    described = await groups.describe(group_id)
    group = described.group
    kind = _kind(group, len(described.members))
    # As Kafka's DescribeGroups: a rebalancing Kafka group's members are shown without assignments.
    assignment = described_assignment(group, kind["state"])
    consumer = consumer_state(group)
    return json_response(
        {
            "group_id": group.group_id,
            "generation_id": group.generation_id,
            **kind,
            "assignment_epoch": None if consumer is None else consumer["assignment_epoch"],
            "members": [_member_body(member, assignment, consumer) for member in described.members],
            "offsets": [
                {
                    "topic": o.topic,
                    "partition": o.partition,
                    "offset": o.committed_offset,
                    "metadata": o.metadata,
                    "high_watermark": o.high_watermark,
                    "lag": o.lag,
                    "lag_exact": not o.lag_bounded,
                    "pending_transactional_offset": o.pending,
                    "leader_epoch": o.leader_epoch,
                }
                for o in described.offsets
                if is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, o.topic)
            ],
        }
    )


@router.delete("/groups/{group_id:group_id}", status_code=204, responses=ERRORS)
async def delete_group(group_id: GroupIdInPath, groups: GroupCoordinatorDep, principal: PrincipalDep, actor: ActorDep):
    """[DeleteGroups] Deletes a group without members, with all its committed offsets and the
    pending transactional ones (their transaction's COMMIT then writes none); a member or commit of
    the id afterwards starts a fresh group. 409 NON_EMPTY_GROUP while it has members, 404
    GROUP_ID_NOT_FOUND. Needs Delete on the group."""
    authorize(principal, Operation.DELETE, ResourceType.GROUP, group_id)
    await groups.delete(actor, group_id)
    return Response(status_code=204)


@router.post("/groups/{group_id:group_id}/offsets/delete", response_model=schemas.OffsetsResult, responses=ERRORS)
async def delete_offsets(
    group_id: GroupIdInPath,
    body: schemas.OffsetDeleteRequest,
    groups: GroupCoordinatorDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    actor: ActorDep,
):
    """[OffsetDelete] Deletes the group's offsets of these partitions, committed and pending
    transactional. Per partition: GROUP_SUBSCRIBED_TO_TOPIC when a member subscribes to the topic,
    UNKNOWN_TOPIC_OR_PARTITION. 404 GROUP_ID_NOT_FOUND; a group left without members and offsets is
    deleted. Needs Delete on the group and Read on the topics."""
    check_partition_count(settings, len(body.partitions))
    authorize(principal, Operation.DELETE, ResourceType.GROUP, group_id)
    for topic in {p.topic for p in body.partitions}:
        authorize(principal, Operation.READ, ResourceType.TOPIC, topic)
    partitions = [(p.topic, p.partition) for p in body.partitions]
    errors = await groups.delete_offsets(actor, group_id, partitions)
    return json_response(
        {
            "offsets": [
                {"topic": topic, "partition": partition, "error": error_or_none(error)}
                for (topic, partition), error in zip(partitions, errors)
            ]
        }
    )


@router.post("/txn/offset-commit", response_model=schemas.OffsetsResult, responses=ERRORS, tags=["transactions"])
async def txn_offset_commit(
    body: schemas.TxnOffsetCommitRequest, groups: GroupCoordinatorDep, settings: SettingsDep, principal: PrincipalDep
):
    """[TxnOffsetCommit] Offsets invisible to OffsetFetch until the transaction's COMMIT marker;
    discarded on abort. With generation_id >= 0, a zombie member's commit is refused (KIP-447).
    Needs Write on the TransactionalId and Read on the group and topics."""
    check_partition_count(settings, len(body.offsets))
    authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
    authorize(principal, Operation.READ, ResourceType.GROUP, body.group_id)
    for topic in {o.topic for o in body.offsets}:
        authorize(principal, Operation.READ, ResourceType.TOPIC, topic)
    entries = _entries(body.offsets)
    errors = await groups.txn_offset_commit(
        body.transactional_id,
        body.group_id,
        body.producer_id,
        body.producer_epoch,
        body.generation_id,
        body.member_id,
        entries,
    )
    return json_response(_offset_errors(entries, errors))
