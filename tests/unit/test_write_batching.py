"""The write batching scheduler (app/coordinator/write_batching.py) on its own, with a writer that
records the batches it is given: who waits for whom, and what a failure of a whole batch does."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.coordinator.write_batching import WriteBatcher
from app.storage.database import CommitNotReplicated


class _Writer:
    """Writes a batch by answering each request with its double; a batch that holds `poison` fails as a
    whole (as a deadlock PostgreSQL broke would: rolled back), and `poison` alone answers with its
    own error."""

    def __init__(self, poison: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.poison = poison
        self.gate = asyncio.Event()
        self.gate.set()

    async def write(self, requests: list[int]) -> list[int | BaseException]:
        self.batches.append(list(requests))
        await self.gate.wait()
        if self.poison in requests:
            if len(requests) > 1:
                raise asyncpg.exceptions.DeadlockDetectedError("the whole batch failed")
            return [ValueError(f"request {requests[0]} is refused")]
        return [request * 2 for request in requests]


async def _one_then_queued(writer: _Writer, queued: tuple[int, ...]) -> list:
    """Request 1 is written alone while `queued` arrive; all answers (or errors), in that order."""
    batches = WriteBatcher(writer.write, max_in_flight=1)
    writer.gate.clear()
    first = asyncio.create_task(batches.submit(1))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(batches.submit(n)) for n in queued]
    await asyncio.sleep(0)
    writer.gate.set()
    return await asyncio.gather(first, *tasks, return_exceptions=True)


def test_a_lone_request_is_written_at_once_and_queued_ones_form_the_next_group():
    async def run() -> tuple[list[int], list[list[int]]]:
        writer = _Writer()
        return await _one_then_queued(writer, (2, 3, 4)), writer.batches

    answers, batches = asyncio.run(run())
    assert answers == [2, 4, 6, 8]
    assert batches == [[1], [2, 3, 4]]


def test_a_failed_group_writes_each_request_alone_so_one_failure_is_its_own():
    async def run():
        writer = _Writer(poison=3)
        return await _one_then_queued(writer, (2, 3, 4)), writer.batches

    answers, batches = asyncio.run(run())
    assert answers[:2] == [2, 4] and answers[3] == 8
    assert isinstance(answers[2], ValueError)
    assert batches == [[1], [2, 3, 4], [2], [3], [4]]


def test_a_caller_that_goes_away_leaves_the_others_answered():
    async def run():
        writer = _Writer()
        batches = WriteBatcher(writer.write, max_in_flight=1)
        writer.gate.clear()
        first = asyncio.create_task(batches.submit(1))
        await asyncio.sleep(0)
        gone, stays = asyncio.create_task(batches.submit(2)), asyncio.create_task(batches.submit(3))
        await asyncio.sleep(0)
        gone.cancel()
        writer.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await first, await stays

    assert asyncio.run(run()) == (2, 6)


class _Overlapping(_Writer):
    """A _Writer whose writes take a turn of the event loop, counting how many run at once."""

    def __init__(self, poison: int | None = None) -> None:
        super().__init__(poison)
        self.writing = 0
        self.most_at_once = 0

    async def write(self, requests: list[int]) -> list[int | BaseException]:
        self.writing += 1
        self.most_at_once = max(self.most_at_once, self.writing)
        try:
            await asyncio.sleep(0)
            return await super().write(requests)
        finally:
            self.writing -= 1


def test_a_failed_groups_requests_are_written_again_one_after_the_other_in_arrival_order():
    # A producer's pipelined batches (a Kafka connection's Produce requests, in one group) must be
    # appended in sequence order: written again concurrently, a later one could be checked first.
    async def run():
        writer = _Overlapping(poison=3)
        return await _one_then_queued(writer, (2, 3, 4)), writer

    answers, writer = asyncio.run(run())
    assert answers[:2] == [2, 4] and answers[3] == 8
    assert isinstance(answers[2], ValueError)
    assert writer.batches == [[1], [2, 3, 4], [2], [3], [4]]
    assert writer.most_at_once == 1


@pytest.mark.parametrize(
    "lost",
    [
        ConnectionResetError("the connection to PostgreSQL was reset during COMMIT"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        CommitNotReplicated("its wait for the synchronous standby was cancelled"),
    ],
)
def test_a_batch_whose_connection_was_lost_answers_every_request_and_writes_none_again(lost):
    # Regression: a batch whose connection was lost was written again request by request, like one
    # PostgreSQL refused. Lost while its COMMIT was under way, the batch may be written: a plain
    # produce was then appended twice under one acknowledgement. Likewise a COMMIT that returned
    # without the synchronous standby's confirmation: every request of it is written on the primary,
    # and none acknowledged.
    class _LostAtCommit(_Writer):
        async def write(self, requests: list[int]) -> list[int | BaseException]:
            answers = await super().write(requests)
            if len(requests) > 1:
                raise lost
            return answers

    async def run():
        writer = _LostAtCommit()
        return await _one_then_queued(writer, (2, 3, 4)), writer.batches

    answers, batches = asyncio.run(run())
    assert answers[0] == 2
    assert all(answer is lost for answer in answers[1:]), answers
    assert batches == [[1], [2, 3, 4]]


def test_requests_enqueued_in_one_turn_of_the_event_loop_share_a_batch_in_their_order():
    # A Kafka connection's pipelined Produce requests read from one segment are enqueued with no
    # turn between them: one batch commits them all, in the order they came.
    async def run():
        writer = _Writer()
        batches = WriteBatcher(writer.write, max_in_flight=1)
        writer.gate.clear()
        answers = [batches.enqueue(n) for n in (1, 2, 3)]  # no turn of the event loop between them
        writer.gate.set()
        return await asyncio.gather(*answers), writer.batches

    assert asyncio.run(run()) == ([2, 4, 6], [[1, 2, 3]])


def test_a_writer_s_sharing_rule_ends_a_batch_before_a_request_it_cannot_write_with_the_others():
    # BatchedWrites writes a transactional id's request queued behind its EndTxn in the next batch.
    async def run():
        writer = _Writer()

        def before_3(queued: list[int]) -> int:  # request 3 cannot be written with those before it
            return queued.index(3) if 3 in queued[1:] else len(queued)

        batches = WriteBatcher(writer.write, max_in_flight=1, sharing=before_3)
        answers = [batches.enqueue(n) for n in (1, 2, 3, 4)]
        return await asyncio.gather(*answers), writer.batches

    assert asyncio.run(run()) == ([2, 4, 6, 8], [[1, 2], [3, 4]])
