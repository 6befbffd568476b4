"""A producer's record whose request is in flight when its delivery timeout passes, against a real
server process frozen (SIGSTOP) and resumed (SIGCONT) by pid, over real HTTP: the record fails at
delivery_timeout_ms with TxbrokerTimeoutError, its outcome unknown, as Kafka's producer expires an
in-flight batch (KIP-91); the request is not given up, and its end decides the partition's sequence,
so that once the server runs again nothing is written twice and the producer goes on. Before, the
timeout was checked only when an attempt failed: the record waited for its last attempt's
request_timeout_ms past its delivery timeout (here 3 s more, up to 30 s by default)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import httpx

from tests.sdk.test_sdk_integration import FAST, read_all
from txbroker import Admin, Producer, TransactionState, errors

# Each attempt of the frozen request times out after 4 s: the first one within the delivery
# timeout (retried), the second one 3 s after it.
IN_FLIGHT_OPTIONS = {"linger_ms": 0, "request_timeout_ms": 4000, "delivery_timeout_ms": 5000, **FAST}
# How long past delivery_timeout_ms the test waits for the record's error: less than the second
# attempt's request timeout, which the old code waited for.
MARGIN_S = 1.5
UNKNOWN = "may or may not be written"


def delivery_error(future) -> BaseException | None:
    """The record's error, waited for until delivery_timeout_ms and MARGIN_S."""
    return future.exception(IN_FLIGHT_OPTIONS["delivery_timeout_ms"] / 1000 + MARGIN_S)


@contextlib.contextmanager
def producer_past_its_first_record(server_process, database_url, topic: str):
    """A server process of its own, and an idempotent producer that wrote "before" to `topic`
    (so it has its producer id and the topic's partition count before the server freezes); after
    the block, `topic` holds "before" and "after" once each, and "frozen" at most once between."""
    server = server_process("--database-url", database_url)
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    with Producer(server.url, **IN_FLIGHT_OPTIONS) as producer:
        producer.send(topic, value="before").result(10)
        yield server, producer
    written_once_at_most(server.url, topic, b"frozen", [b"before", b"after"])


def written_once_at_most(url: str, topic: str, unknown: bytes, others: list[bytes]) -> None:
    """The topic holds `others` once each, in order, and `unknown` (a record whose future failed
    with its outcome unknown) at most once, where it was sent."""
    values = [record.value for record in read_all(url, topic, 1)]
    assert values in (others, [others[0], unknown, *others[1:]]), f"read {values}"


def test_an_idempotent_record_in_flight_fails_at_its_delivery_timeout_and_a_late_answer_keeps_its_sequence(
    server_process, database_url
):
    """The server is frozen with the record's request in flight: its future fails at the delivery
    timeout, saying that it may or may not be written. Resumed, the server answers the request
    (the record is written, after its future failed), and the producer goes on: the next record is
    written once, after it, no sequence reused (a duplicate or an out-of-order refusal)."""
    topic = "in-flight-expired"
    with producer_past_its_first_record(server_process, database_url, topic) as (server, producer):
        os.kill(server.pid, signal.SIGSTOP)
        try:
            frozen = producer.send(topic, value="frozen")
            error = delivery_error(frozen)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert isinstance(error, errors.TxbrokerTimeoutError), f"expected the delivery timeout, got {error!r}"
        assert UNKNOWN in str(error) and "in flight" in str(error)
        producer.send(topic, value="after").result(20)


def test_an_idempotent_record_in_flight_whose_request_ends_unanswered_starts_a_new_epoch(server_process, database_url):
    """The server stays frozen until the expired record's request has ended unanswered too: its
    partition's sequence is unknown, so the producer bumps its epoch (KIP-360) before its next
    record, as after any unanswered batch. Resumed, the server may still write the old request
    (which a retry never repeats); the next record is written once, in the new epoch."""
    topic = "in-flight-unanswered"
    with producer_past_its_first_record(server_process, database_url, topic) as (server, producer):
        epoch = producer.producer_epoch
        sender = producer._core._sender
        os.kill(server.pid, signal.SIGSTOP)
        try:
            frozen = producer.send(topic, value="frozen")
            error = delivery_error(frozen)
            deadline = time.monotonic() + 20
            while sender._in_flight and time.monotonic() < deadline:
                time.sleep(0.05)  # the request's last attempt times out
            assert not sender._in_flight, "the expired record's request never ended"
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert isinstance(error, errors.TxbrokerTimeoutError), f"expected the delivery timeout, got {error!r}"
        assert UNKNOWN in str(error)
        producer.send(topic, value="after").result(30)
        assert producer.producer_epoch == epoch + 1, "the sequence was unknown: a new epoch"


class RequestsRecorded(httpx.AsyncHTTPTransport):
    """Records when each request is sent and when it ends (answered or not), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.events.append(("sent", request.url.path))
        try:
            return await super().handle_async_request(request)
        finally:
            self.events.append(("ended", request.url.path))


def test_a_transactions_record_in_flight_at_its_delivery_timeout_makes_it_abortable_and_the_abort_waits(
    server_process, database_url
):
    """In a transaction, the expired record makes the transaction abortable; abort_transaction()
    sends its EndTxn only once the record's request has ended (answered here, after the server was
    resumed), so the record, if written, is aborted with the transaction: a read_committed reader
    never sees it. The next transaction commits."""
    server = server_process("--database-url", database_url)
    topic = "in-flight-expired-txn"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    transport = RequestsRecorded()
    with Producer(server.url, transactional_id=topic, transport=transport, **IN_FLIGHT_OPTIONS) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        assert producer.partitions_for(topic) == [0]  # known before the server freezes
        os.kill(server.pid, signal.SIGSTOP)
        aborting = threading.Thread(target=producer.abort_transaction)
        try:
            error = delivery_error(producer.send(topic, value="frozen"))
            assert isinstance(error, errors.TxbrokerTimeoutError), f"expected the delivery timeout, got {error!r}"
            assert error.abortable and UNKNOWN in str(error)
            assert producer.transaction_state is TransactionState.ABORTABLE_ERROR
            aborting.start()  # waits for the request in flight
            time.sleep(0.3)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        aborting.join(30)
        assert not aborting.is_alive()
        assert producer.transaction_state is TransactionState.READY
        produce_ended = max(i for i, event in enumerate(transport.events) if event == ("ended", "/v1/produce"))
        abort_sent = transport.events.index(("sent", "/v1/txn/end"))
        assert produce_ended < abort_sent, f"EndTxn sent before the produce request ended: {transport.events}"
        producer.begin_transaction()
        producer.send(topic, value="after")
        producer.commit_transaction()
    assert [record.value for record in read_all(server.url, topic, 1)] == [b"after"]
