"""The transaction coordinator's RPCs: FindCoordinator, InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, and two-phase prepare (KIP-939)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api import schemas
from app.api.auth import PrincipalDep, current_principal
from app.api.deps import READY, BatchedWritesDep, CoordinatorDep, SettingsDep, require_ready
from app.api.json_route import OrjsonRoute, with_fast_path
from app.api.request_limits import check_partition_count
from app.api.responses import error_or_none, json_response
from app.api.schemas import INT16_MAX, INT64_MAX, plain_identifier, plain_int_in, plain_json_object
from app.coordinator.authorizer import Operation, Principal, ResourceType, authorize
from app.coordinator.batched_writes import BatchedWrites

router = APIRouter(prefix="/v1", tags=["transactions"], dependencies=READY, route_class=OrjsonRoute)
ERRORS = {status: {"model": schemas.ErrorBody} for status in (400, 404, 409, 503)}


@router.post("/coordinators/find", response_model=schemas.FindCoordinatorResponse, responses=ERRORS)
async def find_coordinator(body: schemas.FindCoordinatorRequest, settings: SettingsDep, principal: PrincipalDep):
    """[FindCoordinator] Every node coordinates every key today; the RPC exists so that ownership per
    transaction-log partition can come without a client change."""
    resource = ResourceType.TRANSACTIONAL_ID if body.key_type == "transaction" else ResourceType.GROUP
    authorize(principal, Operation.DESCRIBE, resource, body.key)
    return json_response({"key": body.key, "node_id": settings.node_id, "url": settings.public_url()})


@router.post("/producers/init", response_model=schemas.InitProducerIdResponse, responses=ERRORS)
async def init_producer_id(body: schemas.InitProducerIdRequest, coordinator: CoordinatorDep, principal: PrincipalDep):
    """[InitProducerId] A fresh producer id (no transactional id), or the transactional id's producer
    with an epoch above every epoch used before, fencing older instances and ending what they left.
    Needs Write on the TransactionalId (any authenticated caller may be an idempotent producer)."""
    if body.transactional_id is not None:
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
    result = await coordinator.init_producer_id(
        body.transactional_id,
        body.transaction_timeout_ms,
        body.producer_id,
        body.producer_epoch,
        body.keep_prepared_txn,
        principal=None if principal.is_super_user else principal.name,
    )
    response = {"producer_id": result.producer_id, "producer_epoch": result.producer_epoch}
    if body.keep_prepared_txn:
        response["prepared"] = (
            None
            if result.prepared is None
            else {"producer_id": result.prepared.producer_id, "producer_epoch": result.prepared.producer_epoch}
        )
    return json_response(response)


@router.post("/txn/add-partitions", response_model=schemas.AddPartitionsResponse, responses=ERRORS)
async def add_partitions(
    body: schemas.AddPartitionsRequest, writes: BatchedWritesDep, settings: SettingsDep, principal: PrincipalDep
):
    """[AddPartitionsToTxn] Begins the transaction (Ongoing) if none is open, and starts its timer.
    Needs Write on the TransactionalId and on every topic."""
    check_partition_count(settings, len(body.partitions))
    authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
    for topic in {p.topic for p in body.partitions}:
        authorize(principal, Operation.WRITE, ResourceType.TOPIC, topic)
    requested = [(p.topic, p.partition) for p in body.partitions]
    errors = await writes.add_partitions(body.transactional_id, body.producer_id, body.producer_epoch, requested)
    return json_response(
        {
            "partitions": [
                {"topic": topic, "partition": partition, "error": error_or_none(error)}
                for (topic, partition), error in zip(requested, errors)
            ]
        }
    )


@router.post("/txn/add-offsets", responses=ERRORS)
async def add_offsets(body: schemas.AddOffsetsRequest, writes: BatchedWritesDep, principal: PrincipalDep):
    """[AddOffsetsToTxn] Adds the group's __consumer_offsets partition to the transaction. Needs Write
    on the TransactionalId and Read on the group."""
    authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
    authorize(principal, Operation.READ, ResourceType.GROUP, body.group_id)
    await writes.add_offsets(body.transactional_id, body.producer_id, body.producer_epoch, body.group_id)
    return json_response({})


def _end_body(result) -> dict:
    return {"producer_id": result.producer_id, "producer_epoch": result.producer_epoch, "state": result.state}


def parse_end_txn_body(body: bytes) -> schemas.EndTxnRequest | None:
    """An EndTxn body schemas.EndTxnRequest plainly accepts, built without its validation, or None:
    take the general path. (tests/unit/test_end_txn_fast_path.py holds the two to the same answers.)"""
    parsed = plain_json_object(body)
    if parsed is None:
        return None
    transactional_id, committed = parsed.get("transactional_id"), parsed.get("committed")
    producer_id, producer_epoch = parsed.get("producer_id"), parsed.get("producer_epoch")
    if (
        plain_identifier(transactional_id)
        and plain_int_in(producer_id, 0, INT64_MAX)
        and plain_int_in(producer_epoch, 0, INT16_MAX)
        and committed.__class__ is bool
    ):
        return schemas.EndTxnRequest.model_construct(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            committed=committed,
        )
    return None


async def _end(writes: BatchedWrites, principal: Principal, body: schemas.EndTxnRequest):
    authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
    result = await writes.end_transaction(body.transactional_id, body.producer_id, body.producer_epoch, body.committed)
    return json_response(_end_body(result))


async def _end_fast(request: Request, body: bytes):
    """EndTxn's fast path (json_route.with_fast_path): it skips FastAPI's dependency solving, a
    visible share of the server's CPU in small transactions, where every other request is an EndTxn
    (`python -m bench.transactions --sections 1 --profile-server` shows it)."""
    parsed = parse_end_txn_body(body)
    if parsed is None:
        return None
    await require_ready(request)
    return await _end(request.app.state.batched_writes, await current_principal(request), parsed)


@router.post("/txn/end", response_model=schemas.EndTxnResponse, responses=ERRORS)
@with_fast_path(_end_fast)
async def end_transaction(body: schemas.EndTxnRequest, writes: BatchedWritesDep, principal: PrincipalDep):
    """[EndTxn] Commit or abort; answers once every marker is written (CompleteCommit/CompleteAbort)
    with the producer id and epoch the next transaction must use. Retrying the same body after a
    lost response answers the outcome. Needs Write on the TransactionalId."""
    return await _end(writes, principal, body)


@router.post("/txn/prepare", response_model=schemas.EndTxnResponse, responses=ERRORS)
async def prepare(body: schemas.TxnProducer, coordinator: CoordinatorDep, principal: PrincipalDep):
    """[KIP-939] Ongoing -> Prepared, durably: no more writes, no timeout; an EndTxn with the same
    producer id and epoch (from any process) or an admin abort decides it. Needs Write on the
    TransactionalId."""
    authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id)
    return json_response(
        _end_body(await coordinator.prepare(body.transactional_id, body.producer_id, body.producer_epoch))
    )
