"""Topics and cluster metadata: CreateTopics, DeleteTopics, CreatePartitions, Metadata, health."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api import schemas
from app.api.auth import ActorDep, PrincipalDep
from app.api.deps import READY, PoolDep, ReplicationBarrierDep, SettingsDep
from app.api.json_route import OrjsonRoute
from app.api.request_limits import check_partition_count
from app.api.responses import json_response
from app.coordinator import topic_admin
from app.coordinator.authorizer import CLUSTER_RESOURCE, Operation, ResourceType, authorize, is_allowed
from app.coordinator.topic_admin import PartitionState, TopicInfo, kafka_topic_id

router = APIRouter(prefix="/v1", tags=["topics and cluster"], route_class=OrjsonRoute)


ERRORS = {400: {"model": schemas.ErrorBody}, 404: {"model": schemas.ErrorBody}, 409: {"model": schemas.ErrorBody}}


def _describable_by(principal):
    """The names of the topics the principal may Describe, as a listing's filter."""
    return lambda name: is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, name)


def _topic_body(topic: TopicInfo, states: list[PartitionState]) -> dict:
    return {
        "name": topic.name,
        "topic_id": kafka_topic_id(topic.topic_uuid),
        "config": topic.config,
        "partitions": [
            {
                "partition": index,
                "log_start_offset": state.log_start_offset,
                "high_watermark": state.high_watermark,
                "last_stable_offset": state.last_stable_offset,
            }
            for index, state in enumerate(states)
        ],
    }


@router.get("/health", response_model=schemas.Health, responses={503: {"model": schemas.Health}})
async def health(request: Request):
    """200 once the server is ready to serve (migrations applied, unfinished transactions recovered),
    and with `serve --workers N` once every worker is; 503 while PostgreSQL does not answer within
    2 s. Asked on a connection of the process's own, not the pool's: a pool whose every connection is
    busy (the node under load) is no reason to take the node out of its load balancer."""
    state = request.app.state
    database = "ok" if await state.reachability_probe.is_reachable() else "unreachable"
    ready = state.ready and state.node_ready and database == "ok"
    return json_response(
        {"status": "ok" if ready else "starting" if database == "ok" else "unavailable", "database": database},
        200 if ready else 503,
    )


@router.get("/cluster", response_model=schemas.Cluster, dependencies=READY)
async def cluster(pool: PoolDep, barrier: ReplicationBarrierDep, settings: SettingsDep, principal: PrincipalDep):
    """[Metadata] This node (as `nodes` too: every node serves every request; the Kafka listener's
    Metadata lists every live node) and the topic names the caller may Describe, once the synchronous
    standby has them (a topic whose creation or deletion it lacks is taken back by a failover)."""
    names = [topic.name for topic in await topic_admin.list_topics(pool, _describable_by(principal), barrier)]
    node = {"node_id": settings.node_id, "url": settings.public_url()}
    return json_response({"node_id": settings.node_id, "nodes": [node], "topics": names})


@router.post("/topics", status_code=201, response_model=schemas.TopicOut, responses=ERRORS, dependencies=READY)
async def create_topic(
    body: schemas.CreateTopicRequest, pool: PoolDep, settings: SettingsDep, principal: PrincipalDep, actor: ActorDep
):
    """[CreateTopics] Names match [a-zA-Z0-9._-]{1,249}, not '.', '..' or starting with '__'.
    Needs Create on the Cluster or on the topic."""
    if not is_allowed(principal, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
        authorize(principal, Operation.CREATE, ResourceType.TOPIC, body.name)
    partitions = settings.num_partitions if body.partitions is None else body.partitions
    topic, states = await topic_admin.create_topic(
        pool, actor, body.name, partitions, body.config, settings.topic_defaults()
    )
    return json_response(_topic_body(topic, states), 201)


@router.get("/topics", response_model=schemas.TopicList, dependencies=READY)
async def list_topics(pool: PoolDep, barrier: ReplicationBarrierDep, principal: PrincipalDep):
    """The topics the caller may Describe, answered once the database's synchronous standby has
    their watermarks (docs/operations-high-availability.md)."""
    found = await topic_admin.describe_topics(pool, _describable_by(principal), confirmed_by=barrier)
    return json_response({"topics": [_topic_body(topic, states) for topic, states in found]})


@router.get("/topics/{topic}", response_model=schemas.TopicOut, responses=ERRORS, dependencies=READY)
async def describe_topic(topic: str, pool: PoolDep, barrier: ReplicationBarrierDep, principal: PrincipalDep):
    """The topic and its partitions' watermarks, answered once the database's synchronous standby
    has them (docs/operations-high-availability.md)."""
    authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic)
    info, states = await topic_admin.describe_topic(pool, topic, barrier)
    return json_response(_topic_body(info, states))


@router.delete("/topics/{topic}", status_code=204, responses=ERRORS, dependencies=READY)
async def delete_topic(topic: str, pool: PoolDep, principal: PrincipalDep, actor: ActorDep):
    """[DeleteTopics] Deletes the topic and all its records. Needs Delete on the topic."""
    authorize(principal, Operation.DELETE, ResourceType.TOPIC, topic)
    await topic_admin.delete_topic(pool, actor, topic)
    return Response(status_code=204)


@router.post("/topics/{topic}/partitions", response_model=schemas.TopicOut, responses=ERRORS, dependencies=READY)
async def create_partitions(
    topic: str, body: schemas.CreatePartitionsRequest, pool: PoolDep, principal: PrincipalDep, actor: ActorDep
):
    """[CreatePartitions] Raises the topic's partition count to `partitions` (an increase only:
    INVALID_PARTITIONS otherwise, and for an internal topic INVALID_TOPIC_EXCEPTION); the new
    partitions start empty at offset 0, and consumer groups' assignments take them at their members'
    next heartbeat. Records keep their partitions: keys produced before map to other partitions
    than the same keys after. Needs Alter on the topic."""
    authorize(principal, Operation.ALTER, ResourceType.TOPIC, topic)
    info, states = await topic_admin.grow_partitions(pool, actor, topic, body.partitions)
    return json_response(_topic_body(info, states))


@router.post(
    "/topics/{topic}/delete-records", response_model=schemas.DeleteRecordsResponse, responses=ERRORS, dependencies=READY
)
async def delete_records(
    topic: str,
    body: schemas.DeleteRecordsRequest,
    pool: PoolDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    actor: ActorDep,
):
    """[DeleteRecords] (KIP-107) Moves each partition's log start up to the offset given: fetches below
    it answer OFFSET_OUT_OF_RANGE at once, and the log cleaner removes the batches in the background.
    Per-partition errors: UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE (past the high watermark, or
    the last stable offset). Retrying is safe: the log start never moves back. Needs Delete on the topic."""
    check_partition_count(settings, len(body.partitions))
    authorize(principal, Operation.DELETE, ResourceType.TOPIC, topic)
    deleted = await topic_admin.delete_records(
        pool, actor, topic, [(request.partition, request.offset) for request in body.partitions]
    )
    entries = [
        {
            "partition": answer.partition,
            "low_watermark": answer.low_watermark,
            "error": None if answer.error is None else answer.error.as_dict(),
        }
        for answer in deleted
    ]
    return json_response({"partitions": entries})
