"""Request dependencies, as Annotated aliases, and the readiness gate. All `async def`: FastAPI
would run plain functions in its thread pool, a hand-off per dependency per request."""

from __future__ import annotations

from typing import Annotated

import asyncpg
from fastapi import Depends, Request

from app.coordinator.batched_writes import BatchedWrites
from app.coordinator.confirmed_reads import ReplicationBarrier
from app.coordinator.fetch import AppendNotifier
from app.coordinator.group_coordinator import GroupCoordinator
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.errors import BrokerError, ErrorCode
from app.settings import Settings


async def _pool(request: Request) -> asyncpg.Pool:
    return request.app.state.pool


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _notifier(request: Request) -> AppendNotifier:
    return request.app.state.notifier


async def _coordinator(request: Request) -> TransactionCoordinator:
    return request.app.state.coordinator


async def _batched_writes(request: Request) -> BatchedWrites:
    return request.app.state.batched_writes


async def _group_coordinator(request: Request) -> GroupCoordinator:
    return request.app.state.group_coordinator


async def _replication_barrier(request: Request) -> ReplicationBarrier:
    return request.app.state.replication_barrier


async def require_ready(request: Request) -> None:
    if not request.app.state.ready:
        raise BrokerError(
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            "the server is starting (applying migrations, recovering transactions): retry shortly",
        )


PoolDep = Annotated[asyncpg.Pool, Depends(_pool)]
SettingsDep = Annotated[Settings, Depends(_settings)]
CoordinatorDep = Annotated[TransactionCoordinator, Depends(_coordinator)]
BatchedWritesDep = Annotated[BatchedWrites, Depends(_batched_writes)]
GroupCoordinatorDep = Annotated[GroupCoordinator, Depends(_group_coordinator)]
NotifierDep = Annotated[AppendNotifier, Depends(_notifier)]
ReplicationBarrierDep = Annotated[ReplicationBarrier, Depends(_replication_barrier)]
READY = [Depends(require_ready)]
