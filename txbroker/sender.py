"""The producer's sender (aiokafka's `sender.py`, Kafka's `Sender.java`): an asyncio task that drains
ready batches from the accumulator into POST /v1/produce requests and acts on every answer.

Invariants:
- At most one batch per partition is in flight, so sequence numbers reach the server in order; a
  batch keeps its sequence across retries (the server answers a repeat with `duplicate: true`).
- A batch's sequence is assigned when it is first sent, for the producer id and epoch current then.
- Only the latest batch of a partition can be refused without appending, so a refused batch's
  sequence is rolled back for the next one (`TransactionManager.rollback_sequence`), unless an
  earlier attempt of it went unanswered: that one may have been written (a refusal can depend on
  the time, as a topic's timestamp bounds do, which the server checks before duplicates), so the
  sequence is unknown, as after a timeout.
- Every batch sent ends answered or failed, never pending: one the sender cannot go on with
  (a new producer id not to be had, an answer that does not tell of it) fails as one whose
  outcome is unknown; at close, those in flight fail too.
- A batch fails once delivery_timeout_ms has passed since its first record, in flight or not
  (KIP-91): one whose request is unanswered then fails with its outcome unknown, and its request
  goes on (`_expire_in_flight`). Its partition stays busy until that request ends, whose end
  decides the sequence as for any batch: answered, the sequence is known (the records were
  written, after their future failed: logged); unanswered, an idempotent producer starts a new
  epoch, as Kafka's producer resolves an expired in-flight batch's sequence (markSequenceUnresolved)
  before it sends the partition's next one.
- The sender's task runs until stop(): an error getting a producer id fails what waits (an
  unexpected one, not the SDK's, makes the producer fatal), and the task goes on.
- Runs on one event loop; everything it mutates is only touched on that loop, except the
  accumulator (thread-safe) and the records' futures (resolved here).

The answer to each error, as a table (see `_action_for`):

| error                                   | idempotent producer            | transactional producer  |
|-----------------------------------------|--------------------------------|-------------------------|
| retriable (connection, CONCURRENT_...)  | retry until delivery_timeout   | same                    |
| delivery_timeout passed, outcome unknown| fail records, bump epoch       | abortable               |
| delivery_timeout passed in flight       | fail records; the request goes | abortable               |
|                                         | on: unanswered, bump epoch     |                         |
| delivery_timeout passed in the buffer,  | fail records (never sent: no   | abortable               |
| never sent                              | sequence taken, same epoch)    |                         |
| UNKNOWN_PRODUCER_ID                     | new producer id, resend (none  | fatal                   |
|                                         | to be had: fail, bump epoch)   |                         |
| OUT_OF_ORDER_SEQUENCE_NUMBER            | fatal                          | abortable               |
| PRODUCER_FENCED, INVALID_PRODUCER_EPOCH,| fatal                          | fatal                   |
| INVALID_TXN_STATE, INVALID_PRODUCER_ID_ |                                |                         |
| MAPPING, authorization of the id        |                                |                         |
| anything else (unknown topic, too large)| fail the batch's records (and  | abortable               |
|                                         | bump epoch if an earlier       |                         |
|                                         | attempt went unanswered)       |                         |
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from txbroker import errors
from txbroker.accumulator import ProducerBatch, RecordAccumulator
from txbroker.connection import Connection
from txbroker.errors import TxbrokerError
from txbroker.records import BASE64, TopicPartition
from txbroker.retry import Backoff
from txbroker.transaction_manager import TransactionManager, TransactionState
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE

log = logging.getLogger("txbroker.producer")

FATAL_CODES = frozenset(
    {
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_TXN_STATE",
        "INVALID_PRODUCER_ID_MAPPING",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "UNAUTHORIZED",
    }
)

RETRY, FAIL, ABORTABLE, FATAL, NEW_PRODUCER_ID = "retry", "fail", "abortable", "fatal", "new-producer-id"


def _action_for(error: TxbrokerError, transactional: bool, idempotent: bool) -> str:
    if error.retriable:
        return RETRY
    if error.code in FATAL_CODES:
        return FATAL
    if error.code == "UNKNOWN_PRODUCER_ID":
        return FATAL if transactional else NEW_PRODUCER_ID
    if error.code == "OUT_OF_ORDER_SEQUENCE_NUMBER":
        return ABORTABLE if transactional else (FATAL if idempotent else FAIL)
    return ABORTABLE if transactional else FAIL


def _unexpected(exc: Exception) -> TxbrokerError:
    error = errors.TxbrokerError(
        f"getting a producer id (InitProducerId) failed unexpectedly with {type(exc).__name__}: {exc} (a bug of the "
        f"SDK: its traceback is logged; an answer without the contract's fields is an InvalidResponseError, not "
        f"this): the producer cannot go on; close it and create a new one",
        code=errors.UnknownServerError.code,
    )
    error.__cause__ = exc
    return error


class Sender:
    def __init__(
        self,
        connection: Connection,
        tm: TransactionManager,
        accumulator: RecordAccumulator,
        *,
        idempotent: bool,
        max_in_flight_requests: int,
        max_request_records: int,
        delivery_timeout_ms: float,
        backoff: Backoff,
        new_producer_id: Callable[[bool], Awaitable[None]],
        forget_topic: Callable[[str], None],
    ) -> None:
        self._connection = connection
        self._tm = tm
        self._accumulator = accumulator
        self._idempotent = idempotent
        self._max_in_flight = max_in_flight_requests
        self._max_request_records = max_request_records
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._backoff = backoff
        # new_producer_id(bump): InitProducerId for an idempotent producer, bumping the current
        # epoch (KIP-360) when `bump`, else a fresh id.
        self._new_producer_id = new_producer_id
        # forget_topic(topic): its partition count is stale (a partition of it is unknown).
        self._forget_topic = forget_topic
        self._in_flight: dict[TopicPartition, ProducerBatch] = {}
        self._requests: set[asyncio.Task] = set()
        self._wakeup = asyncio.Event()
        self._progress = asyncio.Event()
        self._bump_epoch = False
        self._id_lock = asyncio.Lock()
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle

    def start(self) -> None:
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name="txbroker-sender")

    @property
    def started(self) -> bool:
        return self._task is not None

    def wake(self) -> None:
        """Callable from any thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wakeup.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._wakeup.set)

    async def stop(self, unsent: TxbrokerError, in_flight: TxbrokerError) -> None:
        """Stops sending: what is unsent fails with `unsent`, what is in flight (written or not:
        unknown) with `in_flight`, as Kafka's forced close fails every incomplete batch."""
        self._stopping = True
        sent = list(self._in_flight.values())  # a request's end removes its batches from _in_flight
        for task in list(self._requests):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, *self._requests, return_exceptions=True)
        for batch in sent:
            batch.fail(in_flight)
        self._in_flight.clear()
        self._accumulator.fail_all(unsent)
        self._signal_progress()

    # ---- waiting for records

    def _signal_progress(self) -> None:
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    async def wait_for(self, batches: list[ProducerBatch]) -> None:
        """Until every batch is done (acknowledged or failed)."""
        while not all(batch.done for batch in batches):
            await self._progress.wait()

    async def flush(self) -> None:
        """Sends everything buffered now, at once, and waits for the answers."""
        batches = self._accumulator.unsent() + list(self._in_flight.values())
        self._accumulator.flushing += 1
        self.wake()
        try:
            await self.wait_for(batches)
        finally:
            self._accumulator.flushing -= 1

    async def wait_in_flight(self) -> None:
        """Until the requests in flight now have ended, answered or not: a batch of one may have
        failed already (its delivery timeout) while the request may still write it, and an abort's
        EndTxn must come after it."""
        sent = list(self._in_flight.items())
        while any(self._in_flight.get(tp) is batch for tp, batch in sent):
            await self._progress.wait()

    async def wait_for_room(self) -> None:
        while not self._accumulator.has_room():
            await self._progress.wait()

    # ---- the loop

    async def _run(self) -> None:
        while not self._stopping:
            self._wakeup.clear()
            try:
                await self._prepare_identity()
            except TxbrokerError as error:
                # Unreachable, or answered without the contract's fields (an InvalidResponseError),
                # for max_block_ms: fail what waits, try again with the next records.
                self._fail_everything(error if error.retriable else self._tm.fail_fatal(error))
                continue
            except Exception as exc:
                # Not the SDK's error: the sender must not end on it, or every record, flush() and
                # close() would wait for ever. Fatal, as Kafka's producer is after an unexpected
                # error of InitProducerId: what state it left is not known.
                log.exception("getting a producer id failed unexpectedly")
                self._fail_everything(self._tm.fail_fatal(_unexpected(exc)))
                continue
            if self._tm.state is TransactionState.FATAL_ERROR:
                self._fail_everything(self._tm.last_error)
                await self._wakeup.wait()
                continue
            now = time.monotonic()
            self._expire_unsent(now)
            busy = set(self._in_flight)
            can_send = len(self._requests) < self._max_in_flight and not self._bump_epoch
            if can_send:
                batches = self._accumulator.drain(now, busy, self._max_request_records)
                if batches:
                    self._dispatch(batches)
                    continue
            ready = self._accumulator.next_ready_in(now, busy) if can_send else None
            expiry = self._accumulator.next_expiry_in(now, self._delivery_timeout_s)
            wait = min((w for w in (ready, expiry) if w is not None), default=None)
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass

    def _expire_unsent(self, now: float) -> None:
        """Fails the batches that waited in the buffer for delivery_timeout_ms without being sent,
        as Kafka's producer expires them. They were never sent, so nothing of them was written and
        no sequence was taken: an idempotent producer goes on in its epoch; a transaction lost
        records, so it can only abort."""
        expired = self._accumulator.expire(now, self._delivery_timeout_s)
        if not expired:
            return
        error: TxbrokerError = errors.TxbrokerTimeoutError(
            f"{sum(len(b.records) for b in expired)} records to {sorted({str(b.tp) for b in expired})} waited "
            f"in the producer's buffer for delivery_timeout_ms ({self._delivery_timeout_s * 1000:.0f}) without "
            f"being sent ({len(self._requests)} of max_in_flight_requests ({self._max_in_flight}) requests in "
            f"flight, {len(self._in_flight)} partitions with a batch in flight): they were not written; send "
            f"them again, or raise delivery_timeout_ms or max_in_flight_requests if the server is slow"
        )
        self._fail_at_delivery_timeout(expired, error)

    def _fail_at_delivery_timeout(self, batches: list[ProducerBatch], error: TxbrokerError) -> None:
        """Fails batches out of delivery_timeout_ms: a transaction lost their records, so it can
        only abort; an idempotent producer's sequences are the sender's to resolve."""
        if self._tm.is_transactional:
            error = self._tm.fail_abortable(error)
        for batch in batches:
            batch.fail(error)
        self._signal_progress()

    def _fail_everything(self, error: TxbrokerError | None) -> None:
        if error is not None and self._accumulator.fail_all(error):
            self._signal_progress()

    async def _prepare_identity(self) -> None:
        """An idempotent producer gets its producer id before its first send, and bumps its epoch
        once nothing is in flight after a batch's outcome was lost (its sequences are unknown)."""
        if not self._idempotent or self._tm.is_transactional or self._tm.state is TransactionState.FATAL_ERROR:
            return
        if not self._tm.has_producer_id:
            if self._accumulator.buffered_records:
                async with self._id_lock:
                    if not self._tm.has_producer_id:
                        await self._new_producer_id(False)
        elif self._bump_epoch and not self._in_flight:
            async with self._id_lock:
                await self._new_producer_id(True)
            self._bump_epoch = False

    def _dispatch(self, batches: list[ProducerBatch]) -> None:
        for batch in batches:
            self._in_flight[batch.tp] = batch
            if self._tm.is_transactional:
                self._tm.added_partition(batch.tp)  # the request may open the transaction
        task = asyncio.get_running_loop().create_task(self._send(batches))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    def _assign_sequence(self, batch: ProducerBatch) -> None:
        tm = self._tm
        if not self._idempotent:
            return
        if batch.base_sequence == NO_SEQUENCE or (batch.producer_id, batch.producer_epoch) != (
            tm.producer_id,
            tm.producer_epoch,
        ):
            batch.producer_id, batch.producer_epoch = tm.producer_id, tm.producer_epoch
            batch.base_sequence = tm.take_sequence(batch.tp, len(batch.records))

    def _body(self, batches: list[ProducerBatch]) -> dict:
        for batch in batches:
            self._assign_sequence(batch)
        tm = self._tm
        return {
            "transactional_id": tm.transactional_id,
            "producer_id": tm.producer_id if self._idempotent else NO_PRODUCER_ID,
            "producer_epoch": tm.producer_epoch if self._idempotent else NO_PRODUCER_EPOCH,
            "encoding": BASE64,
            "partitions": [
                {
                    "topic": b.tp.topic,
                    "partition": b.tp.partition,
                    "base_sequence": b.base_sequence,
                    "records": b.records,
                }
                for b in batches
            ],
        }

    async def _send(self, batches: list[ProducerBatch]) -> None:
        # Every batch ends answered or failed, never pending (a flush() waiting for it would wait
        # forever): one that could not be sent again (a new producer id could not be had after
        # UNKNOWN_PRODUCER_ID: the server unreachable for max_block_ms), or that the answer does
        # not tell of, fails with why, its outcome unknown.
        error = None
        loop = asyncio.get_running_loop()
        expiries = [
            loop.call_later(
                max(0.0, batch.created + self._delivery_timeout_s - time.monotonic()), self._expire_in_flight, batch
            )
            for batch in batches
        ]
        try:
            await self._send_until_answered(batches)
        except asyncio.CancelledError:
            for expiry in expiries:  # stop() fails what was in flight, with why
                expiry.cancel()
            raise
        except TxbrokerError as exc:
            error = exc
        except Exception as exc:
            log.exception("the answer to a produce request of %s could not be read", batches[0].tp)
            error = errors.TxbrokerError(
                f"the answer to a produce request could not be read ({type(exc).__name__}: {exc}): whether its "
                f"records were written is not known",
                code=errors.UnknownServerError.code,
            )
        try:
            unfinished = [batch for batch in batches if not batch.settled]
            if unfinished:
                self._outcome_unknown(
                    unfinished,
                    error
                    or errors.TxbrokerError(
                        f"the server's answer to a produce request told nothing of {len(unfinished)} of its "
                        f"partitions: whether their records were written is not known",
                        code=errors.UnknownServerError.code,
                    ),
                )
        finally:
            for expiry in expiries:
                expiry.cancel()
            for batch in batches:
                if self._in_flight.get(batch.tp) is batch:
                    del self._in_flight[batch.tp]
            # Here, not only in a done callback: the woken loop must see this request's slot free
            # (a done callback runs after the loop has already looked).
            self._requests.discard(asyncio.current_task())
            self._signal_progress()
            self._wakeup.set()

    async def _send_until_answered(self, batches: list[ProducerBatch]) -> None:
        """Sends the batches, and again those whose answer allows it, until each is answered,
        refused or out of delivery_timeout_ms."""
        pending = batches
        attempt = 0
        while pending:
            for batch in pending:
                batch.attempts += 1
            try:
                answer = await self._connection.request(
                    "POST", "/v1/produce", self._body(pending), read=_partition_outcomes
                )
            except TxbrokerError as error:
                action = _action_for(error, self._tm.is_transactional, self._idempotent)
                if action == RETRY and not self._expired(pending):
                    await asyncio.sleep(self._backoff.delay_s(attempt, error))
                    attempt += 1
                    continue
                if action == NEW_PRODUCER_ID and not self._expired(pending):
                    await self._replace_producer_id(pending[0].producer_id)
                    continue
                if action == RETRY:
                    self._timed_out(pending, error)
                else:
                    self._refused(pending, error, action)
                return
            retry = []
            unknown_producer_id = None
            for batch, (entry_error, base_offset) in zip(pending, answer):
                if entry_error is None:
                    if batch.expired_in_flight:
                        log.warning(
                            "%d records to %s were written at offsets %d.. after their futures failed with the "
                            "delivery timeout (their request was still in flight): the application was told their "
                            "outcome is unknown",
                            len(batch.records),
                            batch.tp,
                            base_offset,
                        )
                    batch.complete(base_offset)
                    continue
                error = errors.from_body(entry_error)
                action = _action_for(error, self._tm.is_transactional, self._idempotent)
                if action == RETRY and not self._expired([batch]):
                    retry.append(batch)
                elif action == RETRY:
                    self._timed_out([batch], error)
                elif action == NEW_PRODUCER_ID and not self._expired([batch]):
                    # One partition's answer (the server holds no state of the id there that it
                    # may have had: a topic created again under its name): nothing of the batch
                    # was appended, so it is resent with the new id, as a request's answer is.
                    unknown_producer_id = batch.producer_id
                    retry.append(batch)
                else:
                    self._refused([batch], error, action)
            if unknown_producer_id is not None:
                await self._replace_producer_id(unknown_producer_id)
            pending = retry
            if pending:
                await asyncio.sleep(self._backoff.delay_s(attempt))
                attempt += 1

    def _expired(self, batches: list[ProducerBatch]) -> bool:
        """Whether the batches are out of delivery_timeout_ms (one failed by `_expire_in_flight`
        is): not to be sent again."""
        oldest = min(batch.created for batch in batches)
        expired = any(batch.expired_in_flight for batch in batches)
        return expired or time.monotonic() - oldest > self._delivery_timeout_s

    def _expire_in_flight(self, batch: ProducerBatch) -> None:
        """delivery_timeout_ms passed since the batch's first record while its request is in flight
        (Kafka's producer expires in-flight batches alike, KIP-91): the batch fails now, its outcome
        unknown. The request is not given up: the server may be writing it, and only its end tells
        whether the partition's sequence moved (see the module's invariants)."""
        if batch.done:
            return
        batch.expired_in_flight = True
        error = errors.TxbrokerTimeoutError(
            f"{len(batch.records)} records to {batch.tp} got no answer within delivery_timeout_ms "
            f"({self._delivery_timeout_s * 1000:.0f}) of their send(), their request still in flight: they may or "
            f"may not be written (the server may still write them after this error); check before sending them "
            f"again, or raise delivery_timeout_ms if the server is slow"
        )
        self._fail_at_delivery_timeout([batch], error)

    async def _replace_producer_id(self, stale_producer_id: int) -> None:
        async with self._id_lock:
            if self._tm.producer_id == stale_producer_id:
                log.warning(
                    "producer id %s is unknown to the server (expired, or its state went with a topic deleted "
                    "since): getting a new one",
                    stale_producer_id,
                )
                await self._new_producer_id(False)

    def _timed_out(self, batches: list[ProducerBatch], last: TxbrokerError) -> None:
        """Retried for delivery_timeout_ms without an answer."""
        error = errors.TxbrokerTimeoutError(
            f"{sum(len(b.records) for b in batches)} records to {sorted({str(b.tp) for b in batches})} got no "
            f"answer within delivery_timeout_ms ({self._delivery_timeout_s * 1000:.0f}); last error: {last}"
        )
        error.__cause__ = last
        self._outcome_unknown(batches, error)

    def _outcome_unknown(self, batches: list[ProducerBatch], error: TxbrokerError) -> None:
        """The batches fail with `error`; whether their records were appended is unknown, and so is
        their partitions' next sequence: a transaction can only abort, an idempotent producer starts
        a new epoch (at sequence 0) for its next batches."""
        if self._tm.is_transactional:
            error = self._tm.fail_abortable(error)
        elif self._idempotent:
            self._bump_epoch = True
        for batch in batches:
            batch.settle_failed(error)

    def _refused(self, batches: list[ProducerBatch], error: TxbrokerError, action: str) -> None:
        """The server refused the batches and appended none of them."""
        if isinstance(error, errors.UnknownTopicOrPartitionError):
            for topic in {batch.tp.topic for batch in batches}:
                self._forget_topic(topic)
        if action == FATAL:
            error = self._tm.fail_fatal(error)
            for batch in batches:
                batch.settle_failed(error)
            self._fail_everything(error)
            return
        for batch in batches:
            if (batch.producer_id, batch.producer_epoch) != (self._tm.producer_id, self._tm.producer_epoch):
                continue
            if batch.attempts == 1:
                self._tm.rollback_sequence(batch.tp, batch.base_sequence, len(batch.records))
            elif self._idempotent and not self._tm.is_transactional:
                # An earlier attempt may have been written (the module's invariants): reusing the
                # sequence would make the next batch a "duplicate" of it, its records dropped.
                # A transaction's refusal is abortable, and its abort starts a new epoch anyway.
                self._bump_epoch = True
        if action == ABORTABLE:
            if error.fatal:
                error = error.with_category(fatal=False, abortable=True)
            error = self._tm.fail_abortable(error)
        for batch in batches:
            batch.settle_failed(error)


def _partition_outcomes(answer: dict) -> list[tuple[dict | None, int | None]]:
    """(error, base_offset) of each partition of a Produce answer: its error, or none and the
    offset its batch was appended at."""
    return [
        (entry["error"], entry["base_offset"] if entry["error"] is None else None) for entry in answer["partitions"]
    ]
