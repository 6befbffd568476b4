"""Two-phase commit with an external coordinator (KIP-939): finishing transactions that producers
prepared, from any process.

A producer's `prepare_transaction()` moves its open transaction to Prepared durably and returns a
`PreparedTransaction` (transactional id, producer id, producer epoch). A Prepared transaction takes
no more writes, is never aborted by the server's timeout, and waits for its coordinator -- this
client, in the process that owns the decision (a Spark driver, a database's transaction manager):

    prepared = producer.prepare_transaction()          # in the worker; ship `prepared` to the coordinator
    ...
    with TwoPhaseClient(url) as coordinator:            # in the coordinator, after it recorded its decision
        coordinator.commit(prepared)

`commit` and `abort` are EndTxn with the prepared producer id and epoch: safe to repeat (a retry of
an EndTxn that already completed with the same outcome answers success), so a coordinator that
crashed after recording its decision simply completes the decision again. `list` finds what a
coordinator left behind by transactional-id prefix; `abort_open` fences and aborts an open
(Ongoing or Prepared) transaction whose producer ids are unknown (an orphan of a crashed worker).

`AsyncTwoPhaseClient` is the one implementation, a thin layer over `AsyncAdmin` (whose describe,
list and abort it uses); `txbroker.TwoPhaseClient` (txbroker.sync) runs it on a private event loop
thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from txbroker import errors
from txbroker.admin import ABORTABLE_STATES, AsyncAdmin
from txbroker.connection import DEFAULT_URL
from txbroker.records import PreparedTransaction

COMPLETE_COMMIT = "CompleteCommit"


class AsyncTwoPhaseClient(AsyncAdmin):
    """Completes prepared transactions and finds open ones: an Admin (same connection, retries and
    life cycle) with the operations of an external two-phase coordinator. Every call retries
    retriable errors (the server unreachable, CONCURRENT_TRANSACTIONS) for up to
    `default_api_timeout_ms` (longer than Admin's default: a commit must get through).

    Its own changes (commit, abort, abort_open) are sent again after a lost answer too: they are
    safe to repeat (an EndTxn's retry answers the same outcome; an abort's finds nothing open, which
    abort_open reports as False and abort as done). The changes inherited from Admin (create_topic,
    abort_transaction, ...) are Admin's, sent once after a lost answer: a retry of one that was
    applied would report what did happen (TOPIC_ALREADY_EXISTS)."""

    def __init__(self, url: str = DEFAULT_URL, *, default_api_timeout_ms: int = 120_000, **config: Any) -> None:
        super().__init__(url, default_api_timeout_ms=default_api_timeout_ms, **config)

    # ---- completing

    async def commit(self, prepared: PreparedTransaction) -> None:
        """Commits a Prepared transaction (EndTxn commit with its producer id and epoch); success
        again when it is already committed. Raises InvalidTxnStateError when an EndTxn with these
        ids aborted it, and ProducerFencedError when the transactional id's producer was fenced
        since (an operator's abort, an InitProducerId on the id, or a later transaction): then the
        transaction is not Prepared any more, and was aborted unless this client committed it
        before (the server keeps only the outcome of the id's last transaction)."""
        await self._end(prepared, True)

    async def abort(self, prepared: PreparedTransaction) -> None:
        """Aborts a Prepared (or still Ongoing) transaction; done too when it is already aborted,
        or its transactional id has moved on (fenced: it is no longer open under these ids).
        Raises InvalidTxnStateError when it was committed: an abort never undoes a commit."""
        try:
            await self._end(prepared, False)
        except (errors.ProducerFencedError, errors.InvalidProducerIdMappingError, errors.InvalidProducerEpochError):
            pass
        except errors.InvalidTxnStateError:
            # Its last transaction ended (this abort's retry with the other outcome, or nothing open).
            described = await self.describe(prepared.transactional_id)
            if described is not None and described["state"] == COMPLETE_COMMIT:
                raise

    async def commit_all(self, prepared: Iterable[PreparedTransaction], concurrency: int = 8) -> None:
        """commit() of each, `concurrency` at a time; every one is tried, then the first error is raised."""
        await self._each(self.commit, prepared, concurrency)

    async def abort_all(self, prepared: Iterable[PreparedTransaction], concurrency: int = 8) -> None:
        """abort() of each, `concurrency` at a time; every one is tried, then the first error is raised."""
        await self._each(self.abort, prepared, concurrency)

    @staticmethod
    async def _each(action, prepared: Iterable[PreparedTransaction], concurrency: int) -> None:
        slots = asyncio.Semaphore(concurrency)

        async def one(transaction: PreparedTransaction) -> None:
            async with slots:
                await action(PreparedTransaction(*transaction))

        results = await asyncio.gather(*(one(p) for p in prepared), return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            raise failed[0]

    async def _end(self, prepared: PreparedTransaction, commit: bool) -> str:
        tid, producer_id, epoch = prepared
        return await self._once(
            "POST",
            "/v1/txn/end",
            {"transactional_id": tid, "producer_id": producer_id, "producer_epoch": epoch, "committed": commit},
            what=f"EndTxn({'commit' if commit else 'abort'} {tid!r})",
            read=itemgetter("state"),
            resend_unanswered=True,
        )

    async def abort_open(
        self, transactional_id: str, producer_id: int | None = None, producer_epoch: int | None = None
    ) -> bool:
        """Fences the transactional id's producer and aborts its open (Ongoing or Prepared)
        transaction, for orphans whose producer ids the caller never received. With
        `producer_id`/`producer_epoch` (as listed), only if the producer is still that one. True
        when something was aborted; False when nothing was open, or it had moved on (after a lost
        answer, possibly by this call's first attempt: either way it is not open)."""
        try:
            await self._abort(transactional_id, producer_id, producer_epoch, resend_unanswered=True)
            return True
        except (errors.InvalidTxnStateError, errors.TransactionalIdNotFoundError):
            return False

    # ---- looking

    async def describe(self, transactional_id: str) -> dict | None:
        """describe_transaction(), or None for an unknown transactional id."""
        try:
            return await self.describe_transaction(transactional_id)
        except errors.TransactionalIdNotFoundError:
            return None

    async def list(self, transactional_id_prefix: str, states: Iterable[str] | None = ABORTABLE_STATES) -> list[dict]:
        """Every transaction whose transactional id starts with the prefix (in the given states;
        None: any state), ordered by transactional id, all pages."""
        return await self.list_transactions(
            transactional_id_prefix=transactional_id_prefix, states=None if states is None else list(states)
        )


__all__ = ["AsyncTwoPhaseClient", "PreparedTransaction"]
