"""Administration and observability of transactions (KIP-664): ListTransactions,
DescribeTransactions, admin abort, DescribeProducers, markers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api import schemas
from app.api.auth import ActorDep, PrincipalDep
from app.api.deps import READY, CoordinatorDep
from app.api.json_route import OrjsonRoute
from app.api.responses import json_response
from app.coordinator import transaction_admin
from app.coordinator.authorizer import CLUSTER_RESOURCE, Operation, Principal, ResourceType, authorize, is_allowed
from app.coordinator.transaction_admin import ProducerIdAndEpoch
from app.coordinator.transaction_metadata import TransactionMetadata
from app.coordinator.transaction_states import TransactionState
from app.errors import invalid_request
from txbroker.wire import NO_OFFSET

router = APIRouter(prefix="/v1", tags=["administration"], dependencies=READY, route_class=OrjsonRoute)
ERRORS = {status: {"model": schemas.ErrorBody} for status in (400, 404, 409, 503)}


def transaction_body(meta: TransactionMetadata, principal: Principal) -> dict:
    """A transaction as the caller may see it: its partitions of the topics, and its groups, the
    caller may Describe (as Kafka's DescribeTransactions shows only those topics)."""
    return {
        "transactional_id": meta.transactional_id,
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "state": meta.state,
        "timeout_ms": meta.timeout_ms,
        "start_time_ms": meta.txn_start_ms,
        "last_update_ms": meta.last_update_ms,
        "partitions": [
            {"topic": p.topic, "partition": p.partition}
            for p in meta.partitions
            if is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, p.topic)
        ],
        "groups": [
            group for group in meta.groups if is_allowed(principal, Operation.DESCRIBE, ResourceType.GROUP, group)
        ],
        "transaction_version": meta.transaction_version,
    }


def _parse_states(state: str | None) -> list[str] | None:
    if not state:
        return None
    names = [name.strip() for name in state.split(",") if name.strip()]
    try:
        return [TransactionState.parse(name).value for name in names]
    except ValueError:
        raise invalid_request(
            f"state={state!r} names an unknown state: expected a comma-separated list of "
            f"{[s.value for s in TransactionState]}"
        ) from None


@router.get("/transactions", response_model=schemas.TransactionList, responses=ERRORS)
async def list_transactions(
    coordinator: CoordinatorDep,
    principal: PrincipalDep,
    state: str | None = None,
    min_duration_ms: Annotated[int | None, Query(ge=0, le=schemas.INT64_MAX)] = None,
    producer_id: Annotated[int | None, Query(ge=0, le=schemas.INT64_MAX)] = None,
    transactional_id_prefix: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    after: Annotated[str | None, Query(description="page after this transactional id")] = None,
):
    """[ListTransactions] Filters: state (comma-separated), min_duration_ms (open at least this long),
    producer_id, transactional_id_prefix. Ordered by transactional id; page with `after`. Lists
    the ids the caller may Describe."""
    found = await transaction_admin.list_transactions(
        coordinator,
        transaction_admin.TransactionFilter(
            _parse_states(state),
            transactional_id_prefix,
            None if producer_id is None else frozenset({producer_id}),
            min_duration_ms,
        ),
        lambda transactional_id: is_allowed(
            principal, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id
        ),
        limit,
        after,
    )
    return json_response({"transactions": [transaction_body(meta, principal) for meta in found]})


@router.get("/transactions/{transactional_id:path}", response_model=schemas.TransactionOut, responses=ERRORS)
async def describe_transaction(
    transactional_id: schemas.IdentifierInPath, coordinator: CoordinatorDep, principal: PrincipalDep
):
    """[DescribeTransactions] Needs Describe on the TransactionalId."""
    authorize(principal, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    return json_response(transaction_body(await coordinator.describe(transactional_id), principal))


@router.post("/transactions/{transactional_id:path}/abort", response_model=schemas.EndTxnResponse, responses=ERRORS)
async def abort_transaction(
    transactional_id: schemas.IdentifierInPath,
    coordinator: CoordinatorDep,
    principal: PrincipalDep,
    actor: ActorDep,
    producer_id: Annotated[
        int | None,
        Query(
            ge=0,
            le=schemas.INT64_MAX,
            description=("optional: abort only if the producer is still this one (with producer_epoch)"),
        ),
    ] = None,
    producer_epoch: Annotated[int | None, Query(ge=0, le=schemas.INT16_MAX)] = None,
    start_time_ms: Annotated[
        int | None,
        Query(
            ge=0,
            le=schemas.INT64_MAX,
            description=(
                "optional: abort only if the open transaction is still the one that started then (its "
                "start_time_ms as described; with Kafka's clients the producer id and epoch carry over "
                "from one transaction to the next)"
            ),
        ),
    ] = None,
):
    """[kafka-transactions.sh abort] Fences the current producer (epoch bump) and aborts its open
    (Ongoing or Prepared) transaction. Needs Write on the TransactionalId or Alter on the Cluster."""
    if not is_allowed(principal, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE):
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
    if (producer_id is None) != (producer_epoch is None):
        raise invalid_request("send producer_id and producer_epoch together, or neither")
    expected = None if producer_id is None else ProducerIdAndEpoch(producer_id, producer_epoch)
    result = await coordinator.admin_abort(transactional_id, expected, expected_start_ms=start_time_ms, actor=actor)
    return json_response(
        {"producer_id": result.producer_id, "producer_epoch": result.producer_epoch, "state": result.state}
    )


@router.get("/topics/{topic}/partitions/{partition}/producers", response_model=schemas.ProducerList, responses=ERRORS)
async def describe_producers(topic: str, partition: int, coordinator: CoordinatorDep, principal: PrincipalDep):
    """[DescribeProducers] The producers with state on this partition (-1: none). Needs Read on the
    topic."""
    authorize(principal, Operation.READ, ResourceType.TOPIC, topic)
    found = await transaction_admin.describe_producers(coordinator, topic, partition)
    return json_response(
        {
            "producers": [
                {
                    "producer_id": p.producer_id,
                    "producer_epoch": p.producer_epoch,
                    "last_sequence": p.last_sequence,
                    "last_timestamp_ms": p.last_timestamp_ms,
                    "current_txn_start_offset": NO_OFFSET
                    if p.current_txn_start_offset is None
                    else p.current_txn_start_offset,
                }
                for p in found
            ]
        }
    )


@router.get("/topics/{topic}/partitions/{partition}/markers", response_model=schemas.MarkerList, responses=ERRORS)
async def list_markers(
    topic: str,
    partition: int,
    coordinator: CoordinatorDep,
    principal: PrincipalDep,
    offset: Annotated[int, Query(ge=0, le=schemas.INT64_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
):
    """The transaction markers of a partition from an offset on. Needs Read on the topic."""
    authorize(principal, Operation.READ, ResourceType.TOPIC, topic)
    found = await transaction_admin.list_markers(coordinator, topic, partition, offset, limit)
    return json_response(
        {
            "markers": [
                {
                    "offset": m.offset,
                    "producer_id": m.producer_id,
                    "producer_epoch": m.producer_epoch,
                    "type": m.type_name,
                    "timestamp_ms": m.timestamp_ms,
                }
                for m in found
            ]
        }
    )
