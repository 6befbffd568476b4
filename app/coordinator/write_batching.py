"""Write batching (what databases call group commit): concurrent requests of one server process
written together, in one PostgreSQL transaction whose statements they share, committed once (one
WAL flush for all). Called a batch here so that, in this package, a group is a consumer group.

A request that finds fewer than `max_in_flight` batches being written starts one on the event loop's
next turn, so a lone request waits for nothing but that turn, and the requests enqueued in the same
turn share the batch: a Kafka connection's pipelined Produce requests that arrived together
(librdkafka sends one per partition, so a transaction to two partitions sends two at once), the
requests of several connections that one poll of the sockets woke. Requests that arrive while
batches are written queue, and the next batch takes them (up to `max_per_batch`). Every request is
answered after its batch's commit, so an acknowledgement still means durable. A batch is atomic,
and the writer applies its requests in arrival order, as if one after the other.

A failure that is not a request's own answer (a deadlock PostgreSQL broke, an argument PostgreSQL
refused) must not decide the other requests of the batch: PostgreSQL rolled the batch back, and each
request is written again in a batch of its own, in arrival order, where the failure, if it comes
again, is its own. So is a batch of one request that PostgreSQL rolled back to break a deadlock
(or for a serialization failure): nothing of it was written, and the other PostgreSQL transaction of
the cycle (a DeleteTopics, a background job) is as much its cause; a request is written at most
twice. But a batch that met PostgreSQL away (CONNECTION_ERRORS, app/storage/database.py) may be
written: a connection lost while its COMMIT was under way leaves the outcome unknown, and a
COMMIT that returned without the synchronous standby's confirmation (CommitNotReplicated) wrote it.
Every request of it is answered that retriable error, and none is written again (a plain produce
would be appended twice, under one acknowledgement); a client's retry settles it (an idempotent or
transactional one is answered as the duplicate it is; a plain write is at-least-once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.storage.database import CONNECTION_ERRORS, ROLLED_BACK_BY_POSTGRESQL

Request = TypeVar("Request")
Answer = TypeVar("Answer")

# One batch in flight per process: the requests that arrive while it is written all wait for the
# next one, so batches grow with the load. More in flight split them into smaller batches, each paying
# the batch's round trips for fewer requests, and so did letting the next batch start while one
# commits: neither was faster in `python -m bench.transactions --sections 1` (small transactions),
# which measures this choice (docs/performance.md).
MAX_BATCHES_IN_FLIGHT = 1
MAX_REQUESTS_PER_BATCH = 64


@dataclass(slots=True)
class _Waiting(Generic[Request, Answer]):
    request: Request
    answer: asyncio.Future


class WriteBatcher(Generic[Request, Answer]):
    """`write_batch(requests)` writes a batch in one PostgreSQL transaction and returns, for each
    request in order, its answer or the exception instance that is its answer (raised to it)."""

    def __init__(
        self,
        write_batch: Callable[[list[Request]], Awaitable[list[Answer | BaseException]]],
        max_in_flight: int = MAX_BATCHES_IN_FLIGHT,
        max_per_batch: int = MAX_REQUESTS_PER_BATCH,
        sharing: Callable[[list[Request]], int] | None = None,
    ) -> None:
        """`sharing(requests)`: how many of the queued requests, from the first (at least one), one
        batch may take, for a writer that cannot write some requests together; all by default."""
        self._write_batch = write_batch
        self._max_in_flight = max_in_flight
        self._max_per_batch = max_per_batch
        self._sharing = sharing
        self._queue: list[_Waiting] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self._start_scheduled = False

    @property
    def waiting(self) -> int:
        """Requests queued for the next batch."""
        return len(self._queue)

    async def submit(self, request: Request) -> Answer:
        return await self.enqueue(request)

    def enqueue(self, request: Request) -> asyncio.Future[Answer]:
        """Queues the request at once, behind every request enqueued before it (requests are written in
        the order enqueued, also when a failed batch is written again one by one): its answer is the
        future's. Cancelling the future drops the answer, not the write."""
        waiting = _Waiting(request, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        if not self._start_scheduled:
            self._start_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_scheduled_batches)
        return waiting.answer

    def _start_scheduled_batches(self) -> None:
        self._start_scheduled = False
        self._start_batches()

    def _start_batches(self) -> None:
        while self._queue and self._in_flight < self._max_in_flight:
            batch = self._queue[: self._max_per_batch]
            if self._sharing is not None:
                batch = batch[: max(1, self._sharing([waiting.request for waiting in batch]))]
            del self._queue[: len(batch)]
            self._in_flight += 1
            task = asyncio.create_task(self._commit_batch(batch), name="write-batch")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit_batch(self, batch: list[_Waiting]) -> None:
        try:
            await self._commit(batch)
        finally:
            self._in_flight -= 1
            self._start_batches()

    async def _commit(self, batch: list[_Waiting], once_more: bool = False) -> None:
        """`once_more`: the batch's request was written before, in a batch PostgreSQL rolled back."""
        try:
            answers = await self._write_batch([waiting.request for waiting in batch])
        except asyncio.CancelledError:
            for waiting in batch:
                waiting.answer.cancel()
            raise
        except CONNECTION_ERRORS as error:  # perhaps written: answered, never written again
            for waiting in batch:
                _answer(waiting, error)
            return
        except Exception as error:
            if len(batch) > 1:
                # One after the other, in arrival order: a producer's pipelined batches (a Kafka
                # connection's Produce requests, listener.py) must be appended in sequence order; run
                # concurrently, a later one could be checked first and refused as out of order.
                try:
                    for waiting in batch:
                        await self._commit([waiting], once_more=True)
                except asyncio.CancelledError:
                    for waiting in batch:
                        waiting.answer.cancel()  # those not answered yet (done futures stay as they are)
                    raise
            elif isinstance(error, ROLLED_BACK_BY_POSTGRESQL) and not once_more:
                # A deadlock is as much the other PostgreSQL transaction's doing (a DeleteTopics, a
                # background job) as this request's, and nothing of it was written: once more.
                await self._commit(batch, once_more=True)
            else:
                _answer(batch[0], error)
            return
        for waiting, answer in zip(batch, answers):
            _answer(waiting, answer)


def _answer(waiting: _Waiting, answer) -> None:
    if waiting.answer.done():  # its caller went away (the client disconnected) and was cancelled
        return
    if isinstance(answer, BaseException):
        waiting.answer.set_exception(answer)
    else:
        waiting.answer.set_result(answer)
