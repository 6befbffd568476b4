"""The synchronous flavour: `Producer`, `Consumer`, `Admin` and `TwoPhaseClient` run the asyncio
implementation (`AsyncProducer`, `AsyncConsumer`, `AsyncAdmin`, `AsyncTwoPhaseClient`) on a private
event loop in a daemon thread.

One core, two faces: no protocol logic is written here. Each blocking method submits the async
method to the client's loop and waits for its result; the loop thread is also what a Kafka client
calls its background threads: the producer's sender batches and sends while the caller keeps
calling send(), and the consumer's heartbeats keep its group membership alive between polls.

Two calls avoid the loop round trip, for speed: `Producer.send` appends to the (thread-safe)
accumulator from the caller's thread and returns a `concurrent.futures.Future`; only when it must
wait (topic metadata, a full buffer) does it block on the loop. And rebalance listeners run on
the caller's thread inside poll(), so they may call the consumer (commit, seek) as in Kafka.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from txbroker.accumulator import RecordFuture
from txbroker.admin import AsyncAdmin
from txbroker.connection import DEFAULT_URL
from txbroker.consumer import DEFAULT_CLOSE_TIMEOUT_S, AsyncConsumer, close_deadline
from txbroker.errors import IllegalStateError, TxbrokerTimeoutError
from txbroker.producer import AsyncProducer, WouldBlock
from txbroker.records import Bytes, ConsumerRecord, Headers, OffsetAndMetadata, PreparedTransaction, TopicPartition
from txbroker.subscription_state import RebalanceEvent
from txbroker.transaction_manager import TransactionState
from txbroker.two_phase import AsyncTwoPhaseClient

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread (daemon: a client never closed does not
    keep the interpreter alive; at exit its loop is stopped, see `_stop_unclosed_loops`)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _RUNNING_LOOPS.add(self)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:  # stopped: end what is left (a client closed mid-call, or never closed)
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())

    def _check_usable(self) -> None:
        if threading.current_thread() is self._thread:
            raise IllegalStateError(
                "a synchronous txbroker client was called from its own event loop thread "
                "(from a future's callback?): use the Async* client there"
            )
        if os.getpid() != self._pid:
            raise IllegalStateError(
                "this client was created in another process (before a fork): create a new one in this process"
            )
        if self.loop.is_closed():
            raise IllegalStateError("the client is closed")

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            self._check_usable()
        except IllegalStateError:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TxbrokerTimeoutError(f"no result within {timeout}s") from None
        except BaseException:  # KeyboardInterrupt in the caller: stop the work too
            future.cancel()
            raise

    def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A plain function run on the loop thread (it touches state the loop's tasks use)."""

        async def call() -> T:
            return function(*args, **kwargs)

        return self.run(call())

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join()
            self.loop.close()


# The loops of clients not closed yet. A daemon thread is frozen where it stands when the interpreter
# exits, and the tasks of its loop (the producer's sender, the consumer's heartbeats) would then be
# destroyed pending, which asyncio reports on stderr ("Task was destroyed but it is pending!").
_RUNNING_LOOPS: weakref.WeakSet[LoopThread] = weakref.WeakSet()


@atexit.register
def _stop_unclosed_loops() -> None:
    """At interpreter exit (atexit runs while daemon threads still run), stop the loops of clients
    never closed: their tasks are cancelled and finished on their own loop, quietly. Records not
    yet sent are dropped, as when a Kafka producer is never closed; close() or flush() sends them."""
    for loop_thread in list(_RUNNING_LOOPS):
        if loop_thread._pid == os.getpid():  # a forked child's copy has no thread to stop
            loop_thread.stop()


def _blocking(method: Callable) -> Callable:
    """`Client.x(...)` = run `self._core.x(...)` (a coroutine) on the client's loop and wait."""
    name = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return self._loop.run(getattr(self._core, name)(*args, **kwargs))

    return call


def _on_loop(method: Callable) -> Callable:
    """`Client.x(...)` = call the plain `self._core.x(...)` on the client's loop thread."""
    name = method.__name__

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return self._loop.call(getattr(self._core, name), *args, **kwargs)

    return call


def _on_new_loop(name: str, make: Callable[[], T]) -> tuple[LoopThread, T]:
    """A loop thread and the async client `make` makes for it; the thread is stopped again when
    making the client fails (an option refused), so that no failed construction leaves a thread."""
    loop = LoopThread(name)
    try:
        return loop, make()
    except BaseException:
        loop.stop()
        raise


class Producer:
    """A producer, idempotent by default, transactional with `transactional_id` (see AsyncProducer
    for every option). Thread-safe for send(); the transactional methods belong to one thread.

        producer = Producer(url="http://127.0.0.1:8080", transactional_id="orders-app")
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("orders-out", value=b"...", key=b"...")
        producer.commit_transaction()
    """

    def __init__(
        self, url: str = DEFAULT_URL, *, transactional_id: str | None = None, token: str | None = None, **config: Any
    ) -> None:
        self._loop = LoopThread("txbroker-producer")
        try:
            self._core = AsyncProducer(
                url, transactional_id=transactional_id, token=token, _future_factory=concurrent.futures.Future, **config
            )
            self._loop.run(self._core.start())
        except BaseException:
            self._loop.stop()
            raise

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def transactional_id(self) -> str | None:
        return self._core.transactional_id

    @property
    def transaction_state(self) -> TransactionState:
        return self._core.transaction_state

    @property
    def producer_id(self) -> int:
        return self._core.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._core.producer_epoch

    @property
    def prepared_transaction(self) -> PreparedTransaction | None:
        return self._core.prepared_transaction

    def send(
        self,
        topic: str,
        value: Bytes | None = None,
        key: Bytes | None = None,
        partition: int | None = None,
        headers: Headers = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Appends the record to its batch and returns at once (unless the buffer is full or the
        topic's partition count is not known yet): the future's `.result(timeout)` gives its
        RecordMetadata, or raises the error that failed it."""
        while True:
            try:
                return self._core.send_nowait(topic, value, key, partition, headers, timestamp_ms)
            except WouldBlock as blocked:
                self._loop.run(blocked.wait())

    init_transactions = _blocking(AsyncProducer.init_transactions)
    flush = _blocking(AsyncProducer.flush)
    partitions_for = _blocking(AsyncProducer.partitions_for)
    begin_transaction = _on_loop(AsyncProducer.begin_transaction)
    send_offsets_to_transaction = _blocking(AsyncProducer.send_offsets_to_transaction)
    prepare_transaction = _blocking(AsyncProducer.prepare_transaction)
    commit_transaction = _blocking(AsyncProducer.commit_transaction)
    abort_transaction = _blocking(AsyncProducer.abort_transaction)

    def close(self, timeout: float | None = None) -> None:
        """Sends what is buffered (up to `timeout` seconds), then stops the loop thread."""
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._core.close(timeout))
        finally:
            self._loop.stop()


class Consumer:
    """A consumer (see AsyncConsumer for every option). Like Kafka's, not meant to be shared between
    threads; heartbeats run on its own loop thread.

        consumer = Consumer(url=..., group_id="orders", isolation_level="read_committed",
                            auto_offset_reset="earliest", enable_auto_commit=False)
        consumer.subscribe(["orders"])
        records = consumer.poll(timeout_ms=1000)
    """

    def __init__(
        self, url: str = DEFAULT_URL, *, group_id: str | None = None, token: str | None = None, **config: Any
    ) -> None:
        self._loop, self._core = _on_new_loop(
            "txbroker-consumer", lambda: AsyncConsumer(url, group_id=group_id, token=token, **config)
        )

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def group_id(self) -> str | None:
        return self._core.group_id

    def poll(self, timeout_ms: int = 0) -> list[ConsumerRecord]:
        """As AsyncConsumer.poll; the rebalance listeners run here, on the caller's thread."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            event = self._loop.run(self._core.update_assignment(deadline))
            if event is not None:
                if not self._run_listeners(event):
                    return []  # a listener closed the consumer or unsubscribed: nothing to read
                continue  # what changed while they ran (a membership lost: rejoined) before fetching
            records = self._loop.run(self._core.fetch_records(deadline))
            if records or time.monotonic() >= deadline:
                return records

    subscribe = _on_loop(AsyncConsumer.subscribe)
    assign = _on_loop(AsyncConsumer.assign)
    assignment = _on_loop(AsyncConsumer.assignment)
    subscription = _on_loop(AsyncConsumer.subscription)
    group_metadata = _on_loop(AsyncConsumer.group_metadata)
    seek = _on_loop(AsyncConsumer.seek)
    pause = _on_loop(AsyncConsumer.pause)
    resume = _on_loop(AsyncConsumer.resume)
    paused = _on_loop(AsyncConsumer.paused)

    def unsubscribe(self) -> None:
        """As AsyncConsumer.unsubscribe; on_revoke runs here, on the caller's thread."""
        self._revoking_then(self._loop.call(self._core.revoked_on_leave), self._core.leave_group())

    def _revoking_then(self, event: RebalanceEvent | None, then: Coroutine[Any, Any, None]) -> None:
        """Runs the leave's listener on this thread (it may call the consumer: commit), then `then`
        (leaving) on the loop, even when the listener raised; not when the listener closed the
        consumer (its loop is stopped: it left already)."""
        try:
            if event is not None:
                self._run_listeners(event)
        finally:
            if self._loop.loop.is_closed():
                then.close()
            else:
                self._loop.run(then)

    def _run_listeners(self, event: RebalanceEvent) -> bool:
        """As AsyncConsumer._run_listeners, the listeners on this thread: on_revoke while the
        revoked partitions are still assigned, their release on the loop (whatever the listener
        did), then on_assign, also when on_revoke raised (the first error is raised after both).
        False when on_revoke closed the consumer (its loop is stopped) or unsubscribed: no on_assign."""
        revoke_error = None
        try:
            call = event.revoke_call()
            if call is not None:
                call[0](call[1])
        except Exception as error:
            revoke_error = error
        finally:
            reading = not self._loop.loop.is_closed() and self._loop.call(self._core.released, event)
        try:
            call = event.assign_call()
            if call is not None and reading:
                call[0](call[1])
        finally:
            if revoke_error is not None:
                raise revoke_error
        return reading

    position = _blocking(AsyncConsumer.position)
    seek_to_beginning = _blocking(AsyncConsumer.seek_to_beginning)
    seek_to_end = _blocking(AsyncConsumer.seek_to_end)
    seek_to_committed = _blocking(AsyncConsumer.seek_to_committed)
    beginning_offsets = _blocking(AsyncConsumer.beginning_offsets)
    end_offsets = _blocking(AsyncConsumer.end_offsets)
    offsets_for_times = _blocking(AsyncConsumer.offsets_for_times)
    commit = _blocking(AsyncConsumer.commit)
    committed = _blocking(AsyncConsumer.committed)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        callback: Callable[[dict, BaseException | None], Any] | None = None,
    ) -> concurrent.futures.Future[None]:
        """commit() in the background, in order with the other commits (see AsyncConsumer.commit_async);
        the callback runs on the consumer's loop thread."""
        core = self._core
        # At once, on the loop: the positions and the membership of now; the commit keeps each metadata.
        committed, commit = self._loop.call(lambda: (core.offsets_to_commit(offsets), core.start_commit(offsets)))
        future = self._loop.submit(commit)
        if callback is not None:
            future.add_done_callback(lambda f: callback(committed, None if f.cancelled() else f.exception()))
        return future

    def close(self, timeout: float | None = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """As AsyncConsumer.close (within `timeout` seconds, 30 by default); on_revoke runs here,
        on the caller's thread."""
        if self._loop.loop.is_closed():
            return
        try:
            deadline = close_deadline(timeout)
            self._revoking_then(self._loop.run(self._core.prepare_close(deadline)), self._core.finish_close(deadline))
        finally:
            self._loop.stop()


class Admin:
    """Administration (see AsyncAdmin): topics, transactions, producers, markers, groups."""

    def __init__(self, url: str = DEFAULT_URL, *, token: str | None = None, **config: Any) -> None:
        self._loop, self._core = _on_new_loop("txbroker-admin", lambda: AsyncAdmin(url, token=token, **config))

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    health = _blocking(AsyncAdmin.health)
    cluster = _blocking(AsyncAdmin.cluster)
    create_topic = _blocking(AsyncAdmin.create_topic)
    create_partitions = _blocking(AsyncAdmin.create_partitions)
    list_topics = _blocking(AsyncAdmin.list_topics)
    describe_topic = _blocking(AsyncAdmin.describe_topic)
    delete_topic = _blocking(AsyncAdmin.delete_topic)
    delete_records = _blocking(AsyncAdmin.delete_records)
    list_transactions = _blocking(AsyncAdmin.list_transactions)
    describe_transaction = _blocking(AsyncAdmin.describe_transaction)
    abort_transaction = _blocking(AsyncAdmin.abort_transaction)
    find_hanging_transactions = _blocking(AsyncAdmin.find_hanging_transactions)
    describe_producers = _blocking(AsyncAdmin.describe_producers)
    list_markers = _blocking(AsyncAdmin.list_markers)
    list_groups = _blocking(AsyncAdmin.list_groups)
    describe_group = _blocking(AsyncAdmin.describe_group)
    delete_group = _blocking(AsyncAdmin.delete_group)
    delete_group_offsets = _blocking(AsyncAdmin.delete_group_offsets)
    list_group_offsets = _blocking(AsyncAdmin.list_group_offsets)
    list_offsets = _blocking(AsyncAdmin.list_offsets)
    whoami = _blocking(AsyncAdmin.whoami)
    create_principal = _blocking(AsyncAdmin.create_principal)
    list_principals = _blocking(AsyncAdmin.list_principals)
    delete_principal = _blocking(AsyncAdmin.delete_principal)
    add_key = _blocking(AsyncAdmin.add_key)
    list_keys = _blocking(AsyncAdmin.list_keys)
    revoke_key = _blocking(AsyncAdmin.revoke_key)
    set_scram_credential = _blocking(AsyncAdmin.set_scram_credential)
    list_scram_credentials = _blocking(AsyncAdmin.list_scram_credentials)
    delete_scram_credential = _blocking(AsyncAdmin.delete_scram_credential)
    add_acl = _blocking(AsyncAdmin.add_acl)
    list_acls = _blocking(AsyncAdmin.list_acls)
    remove_acl = _blocking(AsyncAdmin.remove_acl)
    audit_log = _blocking(AsyncAdmin.audit_log)

    def close(self) -> None:
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._core.close())
        finally:
            self._loop.stop()


class TwoPhaseClient(Admin):
    """Completes prepared transactions from any process (see txbroker.two_phase).

    with TwoPhaseClient(url) as coordinator:
        coordinator.commit(prepared)
    """

    def __init__(self, url: str = DEFAULT_URL, *, token: str | None = None, **config: Any) -> None:
        self._loop, self._core = _on_new_loop(
            "txbroker-two-phase", lambda: AsyncTwoPhaseClient(url, token=token, **config)
        )

    commit = _blocking(AsyncTwoPhaseClient.commit)
    abort = _blocking(AsyncTwoPhaseClient.abort)
    commit_all = _blocking(AsyncTwoPhaseClient.commit_all)
    abort_all = _blocking(AsyncTwoPhaseClient.abort_all)
    abort_open = _blocking(AsyncTwoPhaseClient.abort_open)
    describe = _blocking(AsyncTwoPhaseClient.describe)
    list = _blocking(AsyncTwoPhaseClient.list)


__all__ = ["Admin", "Consumer", "LoopThread", "Producer", "TwoPhaseClient"]
