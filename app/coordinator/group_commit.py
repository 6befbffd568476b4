"""Group commit: concurrent requests of one server process written together, in one PostgreSQL
transaction whose statements they share, committed once (one WAL flush for all).

A request that finds fewer than `max_in_flight` groups being written starts one at once, so a lone
request waits for nothing; requests that arrive meanwhile queue, and the next group takes them (up
to `max_per_group`). Every request is answered after its group's commit, so an acknowledgement
still means durable. A group is atomic, and the writer applies its requests in arrival order, as
if one after the other.

A failure that is not a request's own answer (a lost connection, a deadlock PostgreSQL broke, an
argument PostgreSQL refused) must not decide the other requests of the group: each is then written
again in a group of its own, where the failure, if it comes again, is its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

Request = TypeVar("Request")
Answer = TypeVar("Answer")

# One group in flight per process: the requests that arrive while it is written all wait for the
# next one, so groups grow with the load. More in flight split them into smaller groups, each paying
# the group's round trips for fewer requests, and so did letting the next group start while one
# commits: neither was faster in `python -m bench.transactions --sections 1` (small transactions),
# which measures this choice (docs/performance.md).
MAX_GROUPS_IN_FLIGHT = 1
MAX_REQUESTS_PER_GROUP = 64


@dataclass(slots=True)
class _Waiting(Generic[Request, Answer]):
    request: Request
    answer: asyncio.Future


class GroupCommit(Generic[Request, Answer]):
    """`write_group(requests)` writes a group in one PostgreSQL transaction and returns, for each
    request in order, its answer or the exception instance that is its answer (raised to it)."""

    def __init__(
        self,
        write_group: Callable[[list[Request]], Awaitable[list[Answer | BaseException]]],
        max_in_flight: int = MAX_GROUPS_IN_FLIGHT,
        max_per_group: int = MAX_REQUESTS_PER_GROUP,
    ) -> None:
        self._write_group = write_group
        self._max_in_flight = max_in_flight
        self._max_per_group = max_per_group
        self._queue: list[_Waiting] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()

    @property
    def waiting(self) -> int:
        """Requests queued for the next group."""
        return len(self._queue)

    async def submit(self, request: Request) -> Answer:
        waiting = _Waiting(request, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self._start_groups()
        return await waiting.answer

    def _start_groups(self) -> None:
        while self._queue and self._in_flight < self._max_in_flight:
            group = self._queue[: self._max_per_group]
            del self._queue[: self._max_per_group]
            self._in_flight += 1
            task = asyncio.create_task(self._commit_group(group), name="group-commit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit_group(self, group: list[_Waiting]) -> None:
        try:
            await self._commit(group)
        finally:
            self._in_flight -= 1
            self._start_groups()

    async def _commit(self, group: list[_Waiting]) -> None:
        try:
            answers = await self._write_group([waiting.request for waiting in group])
        except asyncio.CancelledError:
            for waiting in group:
                waiting.answer.cancel()
            raise
        except Exception as error:
            if len(group) == 1:
                _answer(group[0], error)
            else:
                await asyncio.gather(*(self._commit([waiting]) for waiting in group))
            return
        for waiting, answer in zip(group, answers):
            _answer(waiting, answer)


def _answer(waiting: _Waiting, answer) -> None:
    if waiting.answer.done():  # its caller went away (the client disconnected) and was cancelled
        return
    if isinstance(answer, BaseException):
        waiting.answer.set_exception(answer)
    else:
        waiting.answer.set_result(answer)
