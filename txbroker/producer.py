"""The producer: idempotent by default, transactional with a `transactional_id` (KIP-98).

`AsyncProducer` is the one implementation; `txbroker.Producer` runs it on a private event loop
thread (txbroker.sync). Its parts: TransactionManager (states, ids, sequences), RecordAccumulator
(batches per partition), Sender (the produce requests), TopicMetadata (partition counts).

Using a transactional producer (the seeds' KafkaTransactionsExample):

    producer = AsyncProducer(url, transactional_id="orders-app")
    await producer.init_transactions()
    producer.begin_transaction()
    await producer.send("orders-out", value=b"...", key=b"...")
    await producer.send_offsets_to_transaction({TopicPartition("orders", 0): 42}, consumer.group_metadata())
    await producer.commit_transaction()

Two-phase commit with an external coordinator (KIP-939): `prepare_transaction()` instead of
`commit_transaction()` makes the transaction durable but undecided, and returns the
`PreparedTransaction` another process completes (txbroker.two_phase):

    producer.begin_transaction()
    await producer.send("orders-out", value=b"...")
    prepared = await producer.prepare_transaction()   # ship it to the coordinator, which commits or aborts

Error handling follows KIP-1050: retriable errors are retried here; on an error with `abortable`
call abort_transaction() and redo the work; on one with `fatal` close the producer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from txbroker import errors
from txbroker.accumulator import RecordAccumulator, RecordFuture
from txbroker.connection import DEFAULT_URL, Connection
from txbroker.errors import IllegalStateError, TxbrokerError
from txbroker.metadata import TopicMetadata
from txbroker.options import check_at_least
from txbroker.records import (
    Bytes,
    ConsumerGroupMetadata,
    Headers,
    OffsetAndMetadata,
    PreparedTransaction,
    RecordMetadata,
    TopicPartition,
    header_list,
    offset_errors,
    producer_ids,
    record_size,
    to_bytes,
    wire_record,
)
from txbroker.retry import Backoff, retrying
from txbroker.sender import Sender
from txbroker.transaction_manager import TransactionManager, TransactionState
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID

log = logging.getLogger("txbroker.producer")


class WouldBlock(Exception):
    """send_nowait() cannot append without waiting (for topic metadata, or for buffer space):
    await `wait()`, then try again. How both flavours share one send()."""

    def __init__(self, wait: Callable[[], Awaitable[Any]]) -> None:
        super().__init__("send would block")
        self.wait = wait


# The least value of each numeric option (txbroker.options): 0 where Kafka's client takes 0 (no
# linger, batch_size 0 for a record per batch, no backoff, no wait), else 1 (with no request in
# flight, a record was never sent and never failed).
_OPTION_MINIMUMS = {
    "transaction_timeout_ms": 1,
    "linger_ms": 0,
    "batch_size": 0,
    "max_batch_records": 1,
    "max_buffered_records": 1,
    "max_request_records": 1,
    "max_in_flight_requests": 1,
    "request_timeout_ms": 1,
    "max_block_ms": 0,
    "retry_backoff_ms": 0,
    "retry_backoff_max_ms": 0,
    "metadata_max_age_ms": 0,
}
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000  # Kafka's delivery.timeout.ms default
DEFAULT_LINGER_MS = 5


def delivery_timeout(delivery_timeout_ms: int | None, linger_ms: float, request_timeout_ms: int) -> float:
    """The delivery timeout, as Kafka's KafkaProducer.configureDeliveryTimeout: a batch must have
    the time to linger and wait for one request's answer, so a delivery_timeout_ms given below
    linger_ms + request_timeout_ms is refused (ValueError, Kafka's ConfigException); not given, it
    is the default, or linger_ms + request_timeout_ms if that is larger."""
    linger_and_request_ms = linger_ms + request_timeout_ms
    if delivery_timeout_ms is None:
        if linger_and_request_ms > DEFAULT_DELIVERY_TIMEOUT_MS:
            log.warning(
                "delivery_timeout_ms not given: %s ms (linger_ms + request_timeout_ms) instead of its default %d ms, "
                "which is shorter",
                linger_and_request_ms,
                DEFAULT_DELIVERY_TIMEOUT_MS,
            )
        return max(DEFAULT_DELIVERY_TIMEOUT_MS, linger_and_request_ms)
    check_at_least({"delivery_timeout_ms": 1}, {"delivery_timeout_ms": delivery_timeout_ms})
    if delivery_timeout_ms < linger_and_request_ms:
        raise ValueError(
            f"delivery_timeout_ms is {delivery_timeout_ms}: expected at least linger_ms + request_timeout_ms "
            f"({linger_ms} + {request_timeout_ms} = {linger_and_request_ms}), the time a batch may linger and "
            f"then wait for one request's answer, as Kafka's producer requires of delivery.timeout.ms: raise "
            f"delivery_timeout_ms, or lower linger_ms or request_timeout_ms (or leave delivery_timeout_ms out: "
            f"it is then {DEFAULT_DELIVERY_TIMEOUT_MS}, or linger_ms + request_timeout_ms if larger)"
        )
    return delivery_timeout_ms


class AsyncProducer:
    """An asyncio producer. Every coroutine must run on one event loop; `send_nowait` may be
    called from any thread (the synchronous Producer does).

    Options (Kafka's names, in snake_case, where Kafka has them):
    - transactional_id: enables transactions (init_transactions first); None: idempotent only.
    - enable_idempotence (True): producer id and sequence numbers, so retries never duplicate;
      False sends plain writes (at-least-once).
    - transaction_timeout_ms (60000): the server aborts a transaction open longer than this.
    - linger_ms (5), batch_size (1 MiB of keys+values), max_batch_records (10000): a partition's
      batch is sent when full or when it has waited linger_ms. Larger than Kafka's 16 KiB default,
      because an HTTP request costs the server far more than a Kafka produce request.
    - max_request_records (50000): at most this many records (of several partitions) per request.
    - max_in_flight_requests (5): concurrent produce requests (one batch per partition in flight).
    - max_buffered_records (200000): send() blocks (up to max_block_ms) when this many wait.
    - delivery_timeout_ms (120000, or linger_ms + request_timeout_ms if larger): how long a batch
      may take from its first send() before its records fail, buffered or in flight (then their
      outcome is unknown: see txbroker.sender); given, at least linger_ms + request_timeout_ms
      (else ValueError), as Kafka requires.
    - max_block_ms (60000): how long a call blocks (retrying retriable errors; prepare_transaction(),
      commit_transaction() and abort_transaction() waiting for the transaction's records and for a
      slow answer too) before TxbrokerTimeoutError.
    - request_timeout_ms (30000), retry_backoff_ms (100), retry_backoff_max_ms (1000),
      metadata_max_age_ms (300000): partition counts are cached this long (a topic's is asked again
      at once after UNKNOWN_TOPIC_OR_PARTITION).
    - token, headers, transport: see txbroker.connection.Connection.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        transactional_id: str | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | httpx.BaseTransport | None = None,
        enable_idempotence: bool = True,
        transaction_timeout_ms: int = 60_000,
        linger_ms: float = DEFAULT_LINGER_MS,
        batch_size: int = 1024 * 1024,
        max_batch_records: int = 10_000,
        max_buffered_records: int = 200_000,
        max_request_records: int = 50_000,
        max_in_flight_requests: int = 5,
        delivery_timeout_ms: int | None = None,
        request_timeout_ms: int = 30_000,
        max_block_ms: int = 60_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        metadata_max_age_ms: int = 300_000,
        _future_factory: Callable[[], Any] | None = None,
    ) -> None:
        check_at_least(_OPTION_MINIMUMS, locals())  # the arguments, by name, as given
        delivery_timeout_ms = delivery_timeout(delivery_timeout_ms, linger_ms, request_timeout_ms)
        if transactional_id is not None and not enable_idempotence:
            raise ValueError(
                "a transactional producer is idempotent: enable_idempotence=False needs transactional_id=None"
            )
        if transactional_id == "":
            raise ValueError("transactional_id must not be empty (None for a non-transactional producer)")
        self.url = url
        self._connection = Connection(
            url, token=token, headers=headers, transport=transport, request_timeout_ms=request_timeout_ms
        )
        self._backoff = Backoff(retry_backoff_ms, retry_backoff_max_ms)
        self._max_block_s = max_block_ms / 1000
        self._tm = TransactionManager(transactional_id, transaction_timeout_ms)
        self._idempotent = enable_idempotence
        self._accumulator = RecordAccumulator(
            batch_size=batch_size,
            linger_ms=linger_ms,
            max_batch_records=max_batch_records,
            max_buffered_records=max_buffered_records,
            future_factory=_future_factory or self._asyncio_future,
        )
        self._metadata = TopicMetadata(
            self._connection, max_age_ms=metadata_max_age_ms, backoff=self._backoff, max_block_ms=max_block_ms
        )
        self._sender = Sender(
            self._connection,
            self._tm,
            self._accumulator,
            idempotent=enable_idempotence,
            max_in_flight_requests=max_in_flight_requests,
            max_request_records=max_request_records,
            delivery_timeout_ms=delivery_timeout_ms,
            backoff=self._backoff,
            new_producer_id=self._idempotent_producer_id,
            forget_topic=self._metadata.forget,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # The open transaction after prepare_transaction(): it takes no more records or offsets,
        # and ends with commit_transaction()/abort_transaction() here or with EndTxn elsewhere.
        self._prepared: PreparedTransaction | None = None

    def _asyncio_future(self) -> asyncio.Future:
        if self._loop is None:
            raise IllegalStateError("send_nowait() before the producer started: await start() or send() first")
        return self._loop.create_future()

    # ---- lifecycle

    async def start(self) -> None:
        """Starts the sender task on the running loop (send() does it too)."""
        self._ensure_started()

    def _ensure_started(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._sender.start()

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self, timeout: float | None = None) -> None:
        """Sends what is buffered (unless the producer failed fatally), waiting up to `timeout`
        seconds, then stops: a record still unsent or unanswered then fails (IllegalStateError,
        saying which), as Kafka's close(timeout) fails the incomplete batches. An open transaction
        is neither committed nor aborted: the server aborts it after its timeout, or the next
        instance's init_transactions() does at once."""
        if self._closed:
            return
        self._closed = True
        if self._sender.started and self._tm.state is not TransactionState.FATAL_ERROR:
            try:
                await asyncio.wait_for(self._sender.flush(), timeout)
            except (asyncio.TimeoutError, TxbrokerError):
                pass
        await self._sender.stop(
            IllegalStateError("the producer was closed before the record was sent"),
            IllegalStateError(
                "the producer was closed before the server answered for the record (its close timeout "
                "passed): it may or may not have been written"
            ),
        )
        await self._connection.close()

    # ---- state

    @property
    def transactional_id(self) -> str | None:
        return self._tm.transactional_id

    @property
    def transaction_state(self) -> TransactionState:
        return self._tm.state

    @property
    def producer_id(self) -> int:
        return self._tm.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._tm.producer_epoch

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the producer is closed")

    async def _call(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        deadline: float | None = None,
        read: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The request (`read(answer)` when given: see Connection.request), its retriable errors
        retried for max_block_ms, an answer without the fields `read` reads too; one attempt at
        least. With `deadline` (a time.monotonic() value: max_block_ms from a call that blocks at
        most that long), retried until it, and an attempt waits for its answer no longer than it
        either: a slow answer is given up (its outcome unknown, a retriable TxbrokerTimeoutError)."""
        if deadline is None:
            return await retrying(
                lambda: self._connection.request(method, path, body, read=read),
                what=what,
                timeout_s=self._max_block_s,
                backoff=self._backoff,
            )

        async def attempt() -> Any:
            try:
                return await asyncio.wait_for(
                    self._connection.request(method, path, body, read=read), max(0.0, deadline - time.monotonic())
                )
            except asyncio.TimeoutError:
                raise errors.TxbrokerTimeoutError(
                    f"{what}: no answer within max_block_ms ({self._max_block_s * 1000:.0f})"
                ) from None

        return await retrying(
            attempt, what=what, timeout_s=max(0.0, deadline - time.monotonic()), backoff=self._backoff
        )

    async def _until_answered(self, wait: Awaitable[None], call: str, deadline: float) -> None:
        """Waits (`wait`: a flush, or the requests in flight) until the transaction's records are
        answered, or until `deadline`: max_block_ms from the call, as Kafka's commitTransaction()
        and abortTransaction() block. Past it TxbrokerTimeoutError: the records are still being
        sent (each until delivery_timeout_ms), and calling `call` again resumes."""
        try:
            await asyncio.wait_for(wait, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise errors.TxbrokerTimeoutError(
                f"{call}: the transaction's records were not all answered within max_block_ms "
                f"({self._max_block_s * 1000:.0f}); they are still being sent (each for up to delivery_timeout_ms): "
                f"call {call} again to resume",
                retriable=True,
                abortable=False,
            ) from None

    def _raise_fatal(self, error: TxbrokerError) -> None:
        raise self._tm.fail_fatal(error) from error

    # ---- producer ids

    async def _init_producer_id(self, body: dict) -> tuple[int, int]:
        return await self._call(
            f"InitProducerId({self._tm.transactional_id or ''})",
            "POST",
            "/v1/producers/init",
            body,
            read=producer_ids,
        )

    async def _idempotent_producer_id(self, bump: bool) -> None:
        """For the sender: a fresh producer id, or (KIP-360) the current one with a bumped epoch."""
        tm = self._tm
        body: dict = {"producer_id": NO_PRODUCER_ID, "producer_epoch": NO_PRODUCER_EPOCH}
        if bump and tm.has_producer_id:
            body = {"producer_id": tm.producer_id, "producer_epoch": tm.producer_epoch}
        try:
            ids = await self._init_producer_id(body)
        except errors.ProducerFencedError:
            ids = await self._init_producer_id({"producer_id": NO_PRODUCER_ID, "producer_epoch": NO_PRODUCER_EPOCH})
        tm.initialized(*ids)

    async def init_transactions(self) -> None:
        """InitProducerId for the transactional id: fences every older instance, and completes or
        aborts what the previous instance left open. Call once, before any other transactional
        method. Retries CONCURRENT_TRANSACTIONS and unavailability for max_block_ms."""
        self._check_open()
        self._ensure_started()
        tm = self._tm
        tm.require_transactional("init_transactions")
        if tm.state is not TransactionState.UNINITIALIZED:
            raise IllegalStateError(f"init_transactions() was already called (state {tm.state.value})")
        try:
            ids = await self._init_producer_id(
                {
                    "transactional_id": tm.transactional_id,
                    "transaction_timeout_ms": tm.transaction_timeout_ms,
                    "producer_id": NO_PRODUCER_ID,
                    "producer_epoch": NO_PRODUCER_EPOCH,
                }
            )
        except TxbrokerError as error:
            if error.fatal:
                self._raise_fatal(error)
            raise
        tm.initialized(*ids)

    # ---- sending

    def send_nowait(
        self,
        topic: str,
        value: Bytes | None = None,
        key: Bytes | None = None,
        partition: int | None = None,
        headers: Headers = None,
        timestamp_ms: int | None = None,
    ) -> Any:
        """Appends a record and returns its future (of RecordMetadata) without waiting; raises
        WouldBlock when it must first wait for topic metadata or buffer space."""
        self._check_open()
        self._tm.check_can_send()
        self._check_not_prepared("send")
        key_bytes = to_bytes(key, "key")
        value_bytes = to_bytes(value, "value")
        header_items = header_list(headers)
        if partition is None:
            count = self._metadata.partition_count(topic)
            if count is None:
                raise WouldBlock(lambda: self._metadata.refresh(topic))
            partition = self._accumulator.choose_partition(topic, key_bytes, count)
        elif not isinstance(partition, int) or partition < 0:
            raise ValueError(f"partition must be an int >= 0 or None, not {partition!r}")
        if not self._accumulator.has_room():
            raise WouldBlock(self._wait_for_room)
        future, wake = self._accumulator.append(
            TopicPartition(topic, partition),
            wire_record(key_bytes, value_bytes, header_items, timestamp_ms),
            record_size(key_bytes, value_bytes, header_items),
        )
        if wake:
            self._sender.wake()
        return future

    async def _wait_for_room(self) -> None:
        try:
            await asyncio.wait_for(self._sender.wait_for_room(), self._max_block_s)
        except asyncio.TimeoutError:
            raise errors.TxbrokerTimeoutError(
                f"the producer's buffer stayed full (max_buffered_records) for max_block_ms "
                f"({self._max_block_s * 1000:.0f}): the server is slower than the sends, or unreachable"
            ) from None

    async def send(
        self,
        topic: str,
        value: Bytes | None = None,
        key: Bytes | None = None,
        partition: int | None = None,
        headers: Headers = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Appends a record to its partition's batch; returns a future of its RecordMetadata
        (`await (await producer.send(...))`, or `send_and_wait`). Partition: given, or murmur2 of
        the key, or sticky for records without a key."""
        self._ensure_started()
        while True:
            try:
                return self.send_nowait(topic, value, key, partition, headers, timestamp_ms)
            except WouldBlock as blocked:
                await blocked.wait()

    async def send_and_wait(
        self,
        topic: str,
        value: Bytes | None = None,
        key: Bytes | None = None,
        partition: int | None = None,
        headers: Headers = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        return await (await self.send(topic, value, key, partition, headers, timestamp_ms))

    async def flush(self) -> None:
        """Sends every buffered record now and waits until each is acknowledged or failed."""
        self._ensure_started()
        await self._sender.flush()

    async def partitions_for(self, topic: str) -> list[int]:
        count = self._metadata.partition_count(topic) or await self._metadata.refresh(topic)
        return list(range(count))

    # ---- transactions

    def begin_transaction(self) -> None:
        """Opens a transaction locally; the server learns of it with the first send or offsets."""
        self._check_open()
        self._tm.begin_transaction()

    async def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata], group_metadata: ConsumerGroupMetadata | str
    ) -> None:
        """Commits the consumer's offsets as part of the transaction (AddOffsetsToTxn, then
        TxnOffsetCommit): they become visible with the commit and vanish with an abort. With the
        consumer's group_metadata() the server checks its generation and member id (KIP-447), so a
        consumer that lost its partitions in a rebalance cannot commit for them: that error is
        abortable (abort, and poll again from the committed offsets)."""
        self._check_open()
        tm = self._tm
        tm.require_transactional("send_offsets_to_transaction")
        self._check_in_transaction("send_offsets_to_transaction")
        self._check_not_prepared("send_offsets_to_transaction")
        if isinstance(group_metadata, str):
            group_metadata = ConsumerGroupMetadata(group_metadata)
        entries = []
        for tp, offset in offsets.items():
            offset, metadata = (
                (offset.offset, offset.metadata) if isinstance(offset, OffsetAndMetadata) else (offset, None)
            )
            entries.append({"topic": tp[0], "partition": tp[1], "offset": int(offset), "metadata": metadata})
        if not entries:
            return
        group_id = group_metadata.group_id
        try:
            if group_id not in tm.txn_groups:
                tm.added_group(group_id)  # even an unanswered request may have opened the transaction
                await self._call(
                    f"AddOffsetsToTxn({group_id})", "POST", "/v1/txn/add-offsets", {**tm.ids, "group_id": group_id}
                )
            entry_errors = await self._call(
                f"TxnOffsetCommit({group_id})",
                "POST",
                "/v1/txn/offset-commit",
                {
                    **tm.ids,
                    "group_id": group_id,
                    "generation_id": group_metadata.generation_id,
                    "member_id": group_metadata.member_id,
                    "offsets": entries,
                },
                read=offset_errors,
            )
        except TxbrokerError as error:
            raise self._transaction_error(error) from error
        for entry_error in entry_errors:
            if entry_error is not None:
                error = errors.from_body(entry_error)
                raise self._transaction_error(error) from None

    def _transaction_error(self, error: TxbrokerError) -> TxbrokerError:
        if error.fatal:
            return self._tm.fail_fatal(error)
        return self._tm.fail_abortable(error)

    def _check_in_transaction(self, operation: str) -> None:
        tm = self._tm
        if tm.state is TransactionState.ABORTABLE_ERROR and tm.last_error is not None:
            raise tm.last_error
        tm.check_not_completing(operation)
        if tm.state is not TransactionState.IN_TRANSACTION:
            raise IllegalStateError(
                f"{operation}() needs an open transaction (state {tm.state.value}): call begin_transaction() first"
            )

    def _check_not_prepared(self, operation: str) -> None:
        if self._prepared is not None:
            raise IllegalStateError(
                f"{operation}(): the transaction of {self._prepared.transactional_id!r} is "
                f"prepared and takes nothing more: commit or abort it first"
            )

    @property
    def prepared_transaction(self) -> PreparedTransaction | None:
        """The open transaction's identity once prepare_transaction() succeeded, else None."""
        return self._prepared

    async def prepare_transaction(self) -> PreparedTransaction | None:
        """KIP-939's first phase: flushes, then moves the open transaction to Prepared durably
        (POST /v1/txn/prepare). It then takes no more records, is never aborted by the server's
        timeout, and waits for an EndTxn with the returned producer id and epoch -- from this
        producer (commit_transaction() / abort_transaction()) or from another process
        (txbroker.two_phase) -- or for an operator's abort. Calling it again returns the same
        PreparedTransaction. An empty transaction has nothing to prepare: it ends here and None
        is returned. A record that failed makes the transaction abortable: its error is raised.
        Blocks at most max_block_ms, for the records and the PrepareTxn together, as
        commit_transaction(): then TxbrokerTimeoutError (retriable) is raised, and calling
        prepare_transaction() again resumes (or abort_transaction() gives up)."""
        self._check_open()
        tm = self._tm
        tm.require_transactional("prepare_transaction")
        if self._prepared is not None:
            return self._prepared
        deadline = time.monotonic() + self._max_block_s
        self._check_in_transaction("prepare_transaction")
        await self._until_answered(self._sender.flush(), "prepare_transaction()", deadline)
        if tm.state is not TransactionState.IN_TRANSACTION:
            tm.check_not_fatal()
            raise tm.last_error or IllegalStateError(f"prepare_transaction(): state {tm.state.value}")
        if not tm.transaction_has_content:
            tm.transition_to(TransactionState.COMMITTING)
            tm.completed(tm.producer_id, tm.producer_epoch)
            return None
        what = f"PrepareTxn({tm.transactional_id!r})"
        try:
            ids = await self._call(what, "POST", "/v1/txn/prepare", tm.ids, deadline=deadline, read=producer_ids)
        except TxbrokerError as error:
            if error.retriable:  # the outcome is unknown: preparing again answers it
                raise self._not_known_yet(what, "prepare_transaction()", error) from error
            raise self._transaction_error(error) from error
        self._prepared = PreparedTransaction(tm.transactional_id, *ids)
        return self._prepared

    async def commit_transaction(self) -> None:
        """Flushes, then EndTxn(commit). An unanswered EndTxn (timeout, connection reset) is retried
        with the same body until the outcome is known -- never turned into an abort. Blocks at most
        max_block_ms, for the records and the EndTxn together, as Kafka's: then
        TxbrokerTimeoutError is raised, and calling commit_transaction() again resumes. A record
        that failed makes the transaction abortable: its error is raised."""
        self._check_open()
        deadline = time.monotonic() + self._max_block_s
        tm = self._tm
        tm.require_transactional("commit_transaction")
        if tm.state is TransactionState.IN_TRANSACTION:
            tm.transition_to(TransactionState.COMMITTING)
        elif tm.state is not TransactionState.COMMITTING:  # COMMITTING: resuming after a timeout
            self._check_in_transaction("commit_transaction")
        await self._until_answered(self._sender.flush(), "commit_transaction()", deadline)
        if tm.state is not TransactionState.COMMITTING:
            tm.check_not_fatal()
            raise tm.last_error or IllegalStateError(f"commit_transaction(): state {tm.state.value}")
        if not tm.transaction_has_content:
            tm.completed(tm.producer_id, tm.producer_epoch)
            return
        ids = await self._end_transaction(tm.end_body(True), deadline)
        tm.completed(*ids)
        self._prepared = None

    async def abort_transaction(self) -> None:
        """Drops the unsent records (their futures fail with TransactionAbortedError), waits for the
        requests in flight, then EndTxn(abort). The next transaction starts with a new epoch.
        Blocks at most max_block_ms, as commit_transaction(); calling it again resumes."""
        self._check_open()
        deadline = time.monotonic() + self._max_block_s
        tm = self._tm
        tm.require_transactional("abort_transaction")
        if tm.state in (TransactionState.IN_TRANSACTION, TransactionState.ABORTABLE_ERROR):
            tm.transition_to(TransactionState.ABORTING)
        elif tm.state is not TransactionState.ABORTING:
            tm.check_not_completing("abort_transaction")
            raise IllegalStateError(f"abort_transaction() needs an open transaction (state {tm.state.value})")
        self._accumulator.fail_all(
            errors.TransactionAbortedError(
                f"the transaction of {tm.transactional_id!r} was aborted before this record was sent"
            )
        )
        await self._until_answered(self._sender.wait_in_flight(), "abort_transaction()", deadline)
        tm.check_not_fatal()
        if not tm.transaction_has_content:
            tm.completed(tm.producer_id, tm.producer_epoch)
            return
        try:
            ids = await self._end_transaction(tm.end_body(False), deadline)
        except errors.InvalidTxnStateError:
            # Nothing is open on the server: whatever was sent never arrived. A request still on
            # its way could open a transaction later: bumping the epoch (KIP-360) fences it.
            ids = await self._bump_epoch()
        tm.completed(*ids)
        self._prepared = None

    async def _bump_epoch(self) -> tuple[int, int]:
        tm = self._tm
        try:
            return await self._init_producer_id(
                {
                    "transactional_id": tm.transactional_id,
                    "transaction_timeout_ms": tm.transaction_timeout_ms,
                    "producer_id": tm.producer_id,
                    "producer_epoch": tm.producer_epoch,
                }
            )
        except TxbrokerError as error:
            if error.retriable:
                raise
            self._raise_fatal(error)

    async def _end_transaction(self, body: dict, deadline: float) -> tuple[int, int]:
        """The producer id and epoch of the transactional id's next transaction."""
        what = f"EndTxn({'commit' if body['committed'] else 'abort'} {body['transactional_id']!r})"
        try:
            return await self._call(what, "POST", "/v1/txn/end", body, deadline=deadline, read=producer_ids)
        except TxbrokerError as error:
            # Retriable (TxbrokerTimeoutError after max_block_ms): the state stays COMMITTING or
            # ABORTING and the pending body is kept for the next call. INVALID_TXN_STATE on an abort:
            # abort_transaction() decides. Anything else: fenced, or the transaction is not ours.
            if isinstance(error, errors.InvalidTxnStateError) and not body["committed"]:
                raise
            if error.retriable:
                verb = "commit" if body["committed"] else "abort"
                raise self._not_known_yet(what, f"{verb}_transaction()", error) from error
            self._raise_fatal(error)

    @staticmethod
    def _not_known_yet(what: str, call: str, error: TxbrokerError) -> TxbrokerError:
        """A request of the transaction's end unanswered after max_block_ms: `call` again resumes."""
        return errors.TxbrokerTimeoutError(
            f"{what}: the outcome is not known yet ({error}); call {call} again: it resumes with the same request",
            retriable=True,
            abortable=False,
        )
