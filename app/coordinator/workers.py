"""Background workers, started and stopped with the app: timed-out transaction abort, recovery of
decided-but-unfinished transactions, transactional id expiration, producer state expiration,
eviction of consumers whose session timed out, and the log cleaner (retention, the batches below
DeleteRecords' log start, compaction, deleted topics' rows: storage/lifecycle/log_cleaner.py).

Each is safe on several server processes at once: transactions are claimed with
FOR UPDATE SKIP LOCKED, the expirations are idempotent DELETEs (safe against racing appends:
producer_ids.py), and the cleaner takes one partition at a time under an advisory lock.

A worker never ends on an error: PostgreSQL away (stopped, failing over) or a bug, it logs and runs
again at its next interval, so the node needs no restart when the database is back (a process
whose task died would keep serving with that job silently undone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from app.clock import now_ms
from app.coordinator.group_coordinator import GroupCoordinator
from app.coordinator.transaction_coordinator import TransactionCoordinator
from app.settings import Settings
from app.storage.database import CONNECTION_ERRORS
from app.storage.lifecycle import log_cleaner
from app.storage.transactions import producer_ids

log = logging.getLogger(__name__)


class BackgroundWorkers:
    def __init__(self, coordinator: TransactionCoordinator, groups: GroupCoordinator, settings: Settings) -> None:
        self.coordinator = coordinator
        self.groups = groups
        self.settings = settings
        self._tasks: list[asyncio.Task] = []

    async def expire_producers(self) -> int:
        cutoff = now_ms() - self.settings.producer_id_expiration_ms
        async with self.coordinator.pool.acquire() as conn:
            return await producer_ids.expire(conn, cutoff)

    async def clean_logs(self) -> int:
        totals = await log_cleaner.clean(self.coordinator.pool, now_ms(), self.settings.log_cleaner_chunk_batches)
        return totals.total()

    def start(self) -> None:
        s = self.settings
        jobs: list[tuple[str, Callable[[], Awaitable[int]], int]] = [
            (
                "abort timed-out transactions",
                self.coordinator.abort_timed_out,
                s.abort_timed_out_transaction_interval_ms,
            ),
            (
                "finish decided transactions",
                self.coordinator.recover_pending,
                s.abort_timed_out_transaction_interval_ms,
            ),
            (
                "expire transactional ids",
                self.coordinator.expire_transactional_ids,
                s.remove_expired_transaction_interval_ms,
            ),
            ("expire producer state", self.expire_producers, s.producer_id_expiration_check_interval_ms),
            ("evict consumers whose session timed out", self.groups.expire_sessions, s.group_session_check_interval_ms),
            ("clean logs", self.clean_logs, s.log_cleaner_interval_ms),
        ]
        self._tasks = [asyncio.create_task(self._every(name, job, interval), name=name) for name, job, interval in jobs]

    async def _every(self, name: str, job: Callable[[], Awaitable[int]], interval_ms: int) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                done = await job()
                if done:
                    log.info("%s: %d", name, done)
            except asyncio.CancelledError:
                raise
            except CONNECTION_ERRORS as error:  # one line per attempt while the database is away
                log.warning(
                    "background worker %r: PostgreSQL unavailable (%s); retrying in %d ms", name, error, interval_ms
                )
            except Exception:  # a bug: log it whole, and try again next interval
                log.exception("background worker %r failed; retrying in %d ms", name, interval_ms)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
