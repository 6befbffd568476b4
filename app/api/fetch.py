"""Fetch, the curl-friendly records GET, and ListOffsets."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api import schemas
from app.api.auth import PrincipalDep
from app.api.deps import READY, NotifierDep, PoolDep, SettingsDep
from app.api.json_route import OrjsonRoute
from app.api.request_limits import LongPollSlots, check_partition_count
from app.api.responses import error_or_none, error_response, json_response, watermarks
from app.coordinator.authorizer import Operation, ResourceType, authorize
from app.coordinator.fetch import FetchPosition, PartitionFetch, fetch, find_offsets

router = APIRouter(prefix="/v1", tags=["consuming"], dependencies=READY, route_class=OrjsonRoute)
ERRORS = {status: {"model": schemas.ErrorBody} for status in (400, 404, 416, 503)}


def _entry(result: PartitionFetch) -> dict:
    position = result.position
    return {
        "topic": position.topic,
        "partition": position.partition,
        "error": error_or_none(result.error),
        **watermarks(result.state),
        "next_offset": position.offset if result.error else result.next_offset,
        "records": result.records or [],
    }


@router.post("/fetch", response_model=schemas.FetchResponse, responses=ERRORS)
async def fetch_records(
    body: schemas.FetchRequest,
    pool: PoolDep,
    notifier: NotifierDep,
    request: Request,
    settings: SettingsDep,
    principal: PrincipalDep,
):
    """[Fetch] read_committed (the default) stops at the last stable offset and never returns aborted
    records; control records are never returned. max_wait_ms > 0 long-polls for a record. Needs
    Read on every topic."""
    check_partition_count(settings, len(body.partitions))
    for topic in {p.topic for p in body.partitions}:
        authorize(principal, Operation.READ, ResourceType.TOPIC, topic)
    positions = [FetchPosition(p.topic, p.partition, p.offset) for p in body.partitions]
    with LongPollSlots.of(request).wait_budget(body.max_wait_ms) as max_wait_ms:
        results = await fetch(
            pool,
            notifier,
            request.app.state.replication_barrier,
            positions,
            body.isolation_level,
            body.max_records,
            max_wait_ms,
            body.encoding,
            settings.max_fetch_bytes,
        )
    request.app.state.metrics.records_fetched.inc(sum(len(result.records or ()) for result in results))
    return json_response({"partitions": [_entry(result) for result in results]})


@router.get(
    "/topics/{topic}/partitions/{partition}/records", response_model=schemas.FetchPartitionResult, responses=ERRORS
)
async def read_records(
    topic: str,
    pool: PoolDep,
    notifier: NotifierDep,
    request: Request,
    settings: SettingsDep,
    principal: PrincipalDep,
    partition: Annotated[int, schemas.Field(ge=0, le=schemas.INT32_MAX)],
    offset: Annotated[int, Query(ge=0, le=schemas.INT64_MAX)] = 0,
    isolation_level: schemas.IsolationLevel = "read_committed",
    max_records: Annotated[int, Query(ge=1, le=10_000)] = 100,
    max_wait_ms: Annotated[int, Query(ge=0, le=30_000)] = 0,
    encoding: schemas.Encoding = "utf8",
):
    """One partition's records, for curl; the body is one fetch partition entry."""
    authorize(principal, Operation.READ, ResourceType.TOPIC, topic)
    with LongPollSlots.of(request).wait_budget(max_wait_ms) as granted_wait_ms:
        [result] = await fetch(
            pool,
            notifier,
            request.app.state.replication_barrier,
            [FetchPosition(topic, partition, offset)],
            isolation_level,
            max_records,
            granted_wait_ms,
            encoding,
            settings.max_fetch_bytes,
        )
    if result.error is not None:
        return error_response(result.error)
    return json_response(_entry(result))


@router.post("/offsets/list", response_model=schemas.ListOffsetsResponse, responses=ERRORS)
async def list_offsets(
    body: schemas.ListOffsetsRequest,
    pool: PoolDep,
    request: Request,
    settings: SettingsDep,
    principal: PrincipalDep,
):
    """[ListOffsets] latest (-1: the high watermark, or the LSO under read_committed), earliest (-2),
    the record with the highest timestamp (-3, KIP-734: the first such, below that bound), or the
    first offset whose timestamp is at or after a time (-1 when there is none). Needs Describe on
    every topic."""
    check_partition_count(settings, len(body.partitions))
    for topic in {p.topic for p in body.partitions}:
        authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic)
    found = await find_offsets(
        pool,
        request.app.state.replication_barrier,
        [(p.topic, p.partition, p.timestamp) for p in body.partitions],
        body.isolation_level,
    )
    entries = [
        {
            "topic": answer.topic,
            "partition": answer.partition,
            "offset": answer.offset,
            "timestamp_ms": answer.timestamp_ms,
            "error": error_or_none(answer.error),
        }
        for answer in found
    ]
    return json_response({"partitions": entries})
