"""Topics and cluster metadata: CreateTopics, DeleteTopics, Metadata, health."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api import schemas
from app.api.auth import PrincipalDep
from app.api.deps import READY, PoolDep, SettingsDep
from app.api.json_route import OrjsonRoute
from app.api.request_limits import check_partition_count
from app.api.responses import json_response
from app.clock import now_ms
from app.coordinator.authorizer import CLUSTER_RESOURCE, Operation, ResourceType, authorize, is_allowed
from app.errors import BrokerError
from app.storage import log_cleaner, partition_log, principals, topics
from app.storage.database import is_reachable
from app.storage.topics import TopicInfo

router = APIRouter(prefix="/v1", tags=["topics and cluster"], route_class=OrjsonRoute)


ERRORS = {400: {"model": schemas.ErrorBody}, 404: {"model": schemas.ErrorBody}, 409: {"model": schemas.ErrorBody}}


def _topic_body(topic: TopicInfo, states: list[partition_log.PartitionState]) -> dict:
    return {
        "name": topic.name,
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
    and with `serve --workers N` once every worker is."""
    state = request.app.state
    database = "ok" if await is_reachable(state.pool) else "unreachable"
    ready = state.ready and state.node_ready and database == "ok"
    return json_response(
        {"status": "ok" if ready else "starting" if database == "ok" else "unavailable", "database": database},
        200 if ready else 503,
    )


@router.get("/cluster", response_model=schemas.Cluster, dependencies=READY)
async def cluster(pool: PoolDep, settings: SettingsDep, principal: PrincipalDep):
    """[Metadata] This node, the nodes of the cluster and the topic names (those the caller may
    Describe)."""
    async with pool.acquire() as conn:
        names = [
            topic.name
            for topic in await topics.list_topics(conn)
            if is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic.name)
        ]
    node = {"node_id": settings.node_id, "url": settings.public_url()}
    return json_response({"node_id": settings.node_id, "nodes": [node], "topics": names})


@router.post("/topics", status_code=201, response_model=schemas.TopicOut, responses=ERRORS, dependencies=READY)
async def create_topic(body: schemas.CreateTopicRequest, pool: PoolDep, settings: SettingsDep, principal: PrincipalDep):
    """[CreateTopics] Names match [a-zA-Z0-9._-]{1,249}, not '.', '..' or starting with '__'.
    Needs Create on the Cluster or on the topic."""
    if not is_allowed(principal, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
        authorize(principal, Operation.CREATE, ResourceType.TOPIC, body.name)
    async with pool.acquire() as conn:
        async with conn.transaction():  # the audit entry is part of the change: both or neither
            topic = await topics.create_topic(
                conn, body.name, body.partitions, body.config, defaults=settings.topic_defaults()
            )
            await principals.audit(
                conn, now_ms(), principal.name, "create topic", body.name, f"partitions={body.partitions}"
            )
        states = await partition_log.partition_states(conn, [topic])
    return json_response(_topic_body(topic, states[topic.topic_id]), 201)


@router.get("/topics", response_model=schemas.TopicList, dependencies=READY)
async def list_topics(pool: PoolDep, principal: PrincipalDep):
    """The topics the caller may Describe."""
    async with pool.acquire() as conn:
        found = [
            topic
            for topic in await topics.list_topics(conn)
            if is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic.name)
        ]
        states = await partition_log.partition_states(conn, found)
    return json_response({"topics": [_topic_body(topic, states[topic.topic_id]) for topic in found]})


@router.get("/topics/{topic}", response_model=schemas.TopicOut, responses=ERRORS, dependencies=READY)
async def describe_topic(topic: str, pool: PoolDep, principal: PrincipalDep):
    authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic)
    async with pool.acquire() as conn:
        info = await topics.get_topic(conn, topic)
        states = await partition_log.partition_states(conn, [info])
    return json_response(_topic_body(info, states[info.topic_id]))


@router.delete("/topics/{topic}", status_code=204, responses=ERRORS, dependencies=READY)
async def delete_topic(topic: str, pool: PoolDep, principal: PrincipalDep):
    """[DeleteTopics] Deletes the topic and all its records. Needs Delete on the topic."""
    authorize(principal, Operation.DELETE, ResourceType.TOPIC, topic)
    async with pool.acquire() as conn, conn.transaction():  # the audit entry is part of the change
        await topics.delete_topic(conn, topic)
        await principals.audit(conn, now_ms(), principal.name, "delete topic", topic)
    return Response(status_code=204)


@router.post(
    "/topics/{topic}/delete-records", response_model=schemas.DeleteRecordsResponse, responses=ERRORS, dependencies=READY
)
async def delete_records(
    topic: str, body: schemas.DeleteRecordsRequest, pool: PoolDep, settings: SettingsDep, principal: PrincipalDep
):
    """[DeleteRecords] (KIP-107) Moves each partition's log start up to the offset given: fetches below
    it answer OFFSET_OUT_OF_RANGE at once, and the log cleaner removes the batches in the background.
    Per-partition errors: UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE (past the high watermark, or
    the last stable offset). Retrying is safe: the log start never moves back. Needs Delete on the topic."""
    check_partition_count(settings, len(body.partitions))
    authorize(principal, Operation.DELETE, ResourceType.TOPIC, topic)
    entries = []
    async with pool.acquire() as conn:
        info = await topics.get_topic(conn, topic)
        log_cleaner.check_records_deletable(info)
        for request in body.partitions:
            entry = {"partition": request.partition, "low_watermark": partition_log.NO_OFFSET, "error": None}
            try:
                entry["low_watermark"] = await log_cleaner.delete_records(conn, info, request.partition, request.offset)
            except BrokerError as error:
                entry["error"] = error.as_dict()
            entries.append(entry)
        await principals.audit(
            conn,
            now_ms(),
            principal.name,
            "delete records",
            topic,
            ", ".join(f"{e['partition']}:{e['low_watermark']}" for e in entries),
        )
    return json_response({"partitions": entries})
