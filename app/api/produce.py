"""Produce, and the curl-friendly records endpoint."""

from __future__ import annotations

import itertools

from fastapi import APIRouter, Request

from app.api import schemas
from app.api.auth import PrincipalDep, current_principal
from app.api.deps import READY, PoolDep, SettingsDep, require_ready
from app.api.json_route import OrjsonRoute, with_fast_path
from app.api.produce_fast_path import ParsedProduce, parse_produce_body
from app.api.request_limits import check_partition_count
from app.api.responses import error_response, json_response
from app.coordinator import topic_admin
from app.coordinator.authorizer import Operation, ResourceType, authorize
from app.coordinator.produce import (
    BASE64,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    PartitionRecords,
    ProduceCommand,
    decode_base64,
)
from app.errors import BrokerError, invalid_request
from txbroker.wire import partition_for_key

router = APIRouter(prefix="/v1", tags=["producing"], dependencies=READY, route_class=OrjsonRoute)
ERRORS = {status: {"model": schemas.ErrorBody} for status in (400, 404, 409, 413, 503)}

# Null keys are spread round-robin, per topic, by each server process.
_round_robin: dict[str, itertools.count] = {}


def _entry(topic: str, partition: int, result) -> dict:
    if isinstance(result, BrokerError):
        return {
            "topic": topic,
            "partition": partition,
            "base_offset": None,
            "last_offset": None,
            "duplicate": False,
            "error": result.as_dict(),
        }
    return {
        "topic": topic,
        "partition": partition,
        "base_offset": result.base_offset,
        "last_offset": result.last_offset,
        "duplicate": result.duplicate,
        "error": None,
    }


def _count_produced(request: Request, body_partitions, results) -> None:
    request.app.state.metrics.records_produced.inc(
        sum(len(p.records) for p, result in zip(body_partitions, results) if not isinstance(result, BrokerError))
    )


async def _produce(request: Request, settings, principal, parsed: ParsedProduce):
    check_partition_count(settings, len(parsed.partitions))
    for topic in {p.topic for p in parsed.partitions}:
        authorize(principal, Operation.WRITE, ResourceType.TOPIC, topic)
    if parsed.transactional_id is not None:
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, parsed.transactional_id)
    command = ProduceCommand(
        parsed.transactional_id, parsed.producer_id, parsed.producer_epoch, parsed.encoding, parsed.partitions
    )
    results = await request.app.state.batched_writes.produce(command)
    _count_produced(request, parsed.partitions, results)
    return json_response(
        {"partitions": [_entry(p.topic, p.partition, result) for p, result in zip(parsed.partitions, results)]}
    )


async def _produce_fast(request: Request, body: bytes):
    """POST /v1/produce's fast path (produce_fast_path.py): a body plainly valid, its records encoded
    while checked, served with the route's dependencies called here."""
    state = request.app.state
    parsed = parse_produce_body(body, state.settings)
    if parsed is None:
        return None
    await require_ready(request)
    return await _produce(request, state.settings, await current_principal(request), parsed)


# A router of its own, with the full prefix, included first (app/api/main.py) so that the hottest
# route is matched first. (A route's path is what /metrics labels requests with.)
produce_router = APIRouter(prefix="/v1", tags=["producing"], dependencies=READY, route_class=OrjsonRoute)


@produce_router.post("/produce", response_model=schemas.ProduceResponse, responses=ERRORS)
@with_fast_path(_produce_fast)
async def produce_records(
    body: schemas.ProduceRequest,
    settings: SettingsDep,
    request: Request,
    principal: PrincipalDep,
):
    """[Produce] Appends each partition's records; one result per request partition, same order.
    Needs Write on every topic, and on the TransactionalId for a transactional write."""
    parsed = ParsedProduce(
        body.transactional_id,
        body.producer_id,
        body.producer_epoch,
        body.encoding,
        [PartitionRecords(p.topic, p.partition, p.base_sequence, p.records) for p in body.partitions],
    )
    return await _produce(request, settings, principal, parsed)


def _key_bytes(key: str, encoding: str) -> bytes:
    if encoding == BASE64:
        return decode_base64("key", key, "records[0]")
    return key.encode("utf-8", "surrogatepass")


@router.post("/topics/{topic}/records", response_model=schemas.ProducePartitionResult, responses=ERRORS)
async def write_records(
    topic: str,
    body: schemas.TopicRecordsRequest,
    pool: PoolDep,
    settings: SettingsDep,
    request: Request,
    principal: PrincipalDep,
):
    """Plain writes for curl. With partition null, the key picks the partition (murmur2, Kafka's
    default partitioner), so all records of the request must share one key; null keys go round-robin."""
    authorize(principal, Operation.WRITE, ResourceType.TOPIC, topic)
    partition = body.partition
    if partition is None:
        key = body.records[0].key
        if any(record.key != key for record in body.records):
            raise invalid_request(
                'with "partition": null the key chooses the partition, but these records have '
                "different keys: send one request per key, or name the partition"
            )
        info = await topic_admin.get_topic(pool, topic)
        if key is None:
            partition = next(_round_robin.setdefault(topic, itertools.count())) % info.partition_count
        else:
            partition = partition_for_key(_key_bytes(key, body.encoding), info.partition_count)
    command = ProduceCommand(
        None,
        NO_PRODUCER_ID,
        NO_PRODUCER_EPOCH,
        body.encoding,
        [PartitionRecords(topic, partition, NO_SEQUENCE, body.records)],
    )
    [result] = await request.app.state.batched_writes.produce(command)
    _count_produced(request, [body], [result])
    if isinstance(result, BrokerError):
        return error_response(result)
    return json_response(_entry(topic, partition, result))
