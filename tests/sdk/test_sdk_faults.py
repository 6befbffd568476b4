"""The SDK's producer and consumer under errors, against real servers (real HTTP, real PostgreSQL):
servers killed, frozen and restarted by pid, answers delayed on their way, odd answers of a real
proxy in between (pages that are not JSON), states no test could reach by sending (two billion
records), and what the clients then hand out, commit and raise."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.api.test_log_lifecycle import sql
from tests.sdk.test_sdk_integration import FAST, read_all
from txbroker import Admin, Consumer, Producer, RecordMetadata, TopicPartition, TransactionState, errors
from txbroker.retry import Backoff
from txbroker.wire import partition_for_key

INT32_MAX = 2**31 - 1


def test_an_idempotent_producer_goes_on_past_sequence_int_max(server):
    """Sequences wrap to 0 past Int.MaxValue, as Kafka's producer and txbroker's server count them:
    a long-lived idempotent producer that wrote 2**31 records to a partition in one epoch (hours at
    a high rate) goes on writing it. Before, the SDK sent the next batch's sequence past
    Int.MaxValue, which the contract refuses (INVALID_REQUEST), and so every later batch of that
    partition failed. Both sides are set just below the wrap, as if those records had been sent."""
    tp = TopicPartition("wrapping", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    with Producer(server.url, linger_ms=50, **FAST) as producer:
        producer.send(tp.topic, value="first", partition=0).result(10)
        sql(
            server.database_url,
            "UPDATE producer_states SET last_sequence = $1 WHERE producer_id = $2",
            INT32_MAX - 2,
            producer.producer_id,
        )
        producer._core._tm.take_sequence(tp, INT32_MAX - 2)  # the next sequence: Int.MaxValue - 1
        across = [producer.send(tp.topic, value=f"across-{i}", partition=0) for i in range(5)]
        producer.flush()
        after = [producer.send(tp.topic, value=f"after-{i}", partition=0) for i in range(3)]
        producer.flush()
        assert [future.result(10).offset for future in across + after] == list(range(1, 9))
        producer_id = producer.producer_id
    with Admin(server.url) as admin:
        [state] = admin.describe_producers(tp.topic, 0)
    assert (state["producer_id"], state["last_sequence"]) == (producer_id, 5), (
        "Int.MaxValue - 1, Int.MaxValue, 0..2, then 3..5"
    )
    values = [record.value for record in read_all(server.url, tp.topic, 1)]
    assert values == [b"first", *(f"across-{i}".encode() for i in range(5)), *(f"after-{i}".encode() for i in range(3))]


class FirstCommitDelayed(httpx.AsyncHTTPTransport):
    """Holds the first offset commit for half a second on its way to the server, as a slow
    connection would: a commit made after it, on another connection, arrives first."""

    def __init__(self) -> None:
        super().__init__()
        self.commits = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/offsets/commit"):
            self.commits += 1
            if self.commits == 1:
                await asyncio.sleep(0.5)
        return await super().handle_async_request(request)


def test_commits_are_applied_in_the_order_they_were_made(server):
    """As Kafka's commitAsync promises, and commitSync waits for the commits before it: the group's
    offset is the last one committed. Before, two commits in flight at once took two connections,
    and the one that arrived last won: the older offset, so a restarted member read again what had
    been processed and committed."""
    tp = TopicPartition("ordered", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    done: list[tuple[dict, BaseException | None]] = []
    transport = FirstCommitDelayed()
    with Consumer(server.url, group_id="ordered", transport=transport, enable_auto_commit=False, **FAST) as consumer:
        consumer.assign([tp])
        first = consumer.commit_async({tp: 5}, callback=lambda offsets, error: done.append((offsets, error)))
        second = consumer.commit_async({tp: 10}, callback=lambda offsets, error: done.append((offsets, error)))
        first.result(10), second.result(10)
        assert consumer.committed([tp]) == {tp: 10}
        consumer.commit_async({tp: 15}, callback=lambda offsets, error: done.append((offsets, error)))
        consumer.commit({tp: 20})
        assert done == [({tp: 5}, None), ({tp: 10}, None), ({tp: 15}, None)], "commit() after the ones before it"
        assert consumer.committed([tp]) == {tp: 20}
    assert transport.commits == 4


def test_position_while_a_transaction_holds_the_committed_offset_is_a_timeout_then_the_offset(server):
    """position() of a partition whose committed offset a transaction still holds (read with
    require_stable, UNSTABLE_OFFSET_COMMIT) waits default_api_timeout_ms, then raises
    TxbrokerTimeoutError, as Kafka's position() times out; once the transaction commits, it is the
    offset it committed. Before, it raised KeyError."""
    tp = TopicPartition("pending-offsets", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    with (
        Producer(server.url, transactional_id="pending-offsets", **FAST) as producer,
        Consumer(server.url, group_id="pending", default_api_timeout_ms=500, **FAST) as consumer,
    ):
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 7}, "pending")
        consumer.assign([tp])
        with pytest.raises(errors.TxbrokerTimeoutError, match="UNSTABLE_OFFSET_COMMIT") as raised:
            consumer.position(tp)
        assert raised.value.retriable
        assert consumer.poll(timeout_ms=200) == [], "poll() waits for it too, without an error"
        producer.commit_transaction()
        assert consumer.position(tp) == 7


def produce_values(url: str, topic: str, values: list[str], partitions: int = 1) -> None:
    with Producer(url, **FAST) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value=value, partition=i % partitions)


def timed_poll(consumer: Consumer, timeout_ms: int) -> tuple[list, float]:
    started = time.monotonic()
    records = consumer.poll(timeout_ms=timeout_ms)
    return records, time.monotonic() - started


def test_poll_keeps_its_timeout_while_the_server_is_down_and_goes_on_after_its_restart(server_process, tmp_path):
    """A server killed (SIGKILL) under a group member that auto-commits: poll(timeout_ms=300)
    returns within about its timeout while the server is down, as Kafka's poll() does; the member
    goes on after the restart, each record handed out once, and its offsets committed. Before,
    poll() retried the due auto-commit for default_api_timeout_ms (here 20 s) inside poll()."""
    server = server_process("--data-dir", str(tmp_path / "data"))
    values = [f"r{i}" for i in range(40)]
    with Admin(server.url) as admin:
        admin.create_topic("restarted", partitions=2)
    produce_values(server.url, "restarted", values, partitions=2)
    consumer = Consumer(
        server.url,
        group_id="restarted",
        auto_offset_reset="earliest",
        auto_commit_interval_ms=100,
        default_api_timeout_ms=20_000,
        max_poll_records=5,
        fetch_max_records=5,
        prefetch=False,
        **FAST,
    )
    try:
        consumer.subscribe(["restarted"])
        received = []
        while len(received) < 10:
            received += consumer.poll(timeout_ms=1000)
        server.kill()
        for _ in range(3):
            records, took = timed_poll(consumer, 300)
            assert records == [] and took < 5, f"poll(timeout_ms=300) took {took:.1f} s with the server down"
        server.start()
        deadline = time.monotonic() + 30
        while len(received) < len(values) and time.monotonic() < deadline:
            received += consumer.poll(timeout_ms=500)
        assert sorted(r.value for r in received) == sorted(v.encode() for v in values), "each once"
    finally:
        consumer.close()  # the final auto-commit
    with Admin(server.url) as admin:
        assert {o["lag"] for o in admin.describe_group("restarted")["offsets"]} == {0}


def test_poll_keeps_its_timeout_while_the_server_is_frozen_and_takes_the_late_answer(server_process, database_url):
    """A server frozen (SIGSTOP) with a fetch in flight: poll(timeout_ms=300) returns about in
    time instead of waiting request_timeout_ms (30 s) for an answer; the fetch stays in flight, and
    once the server runs again its answer is the next poll's: every record once, in order. Before,
    each poll() waited for the fetch's HTTP timeout."""
    server = server_process("--database-url", database_url)
    values = [f"r{i}" for i in range(30)]
    tp = TopicPartition("frozen", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    produce_values(server.url, tp.topic, values)
    with Consumer(server.url, max_poll_records=10, fetch_max_records=10, prefetch=False, **FAST) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        received = consumer.poll(timeout_ms=1000)
        assert len(received) == 10
        os.kill(server.pid, signal.SIGSTOP)
        try:
            for _ in range(3):
                records, took = timed_poll(consumer, 300)
                assert records == [] and took < 5, f"poll(timeout_ms=300) took {took:.1f} s with the server frozen"
        finally:
            os.kill(server.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while len(received) < len(values) and time.monotonic() < deadline:
            received += consumer.poll(timeout_ms=500)
    assert [(r.offset, r.value) for r in received] == [(i, v.encode()) for i, v in enumerate(values)]


def test_close_with_a_record_in_flight_to_a_frozen_server_fails_it_and_says_why(server_process, database_url):
    """close(timeout) while the server is frozen (SIGSTOP) with a record in flight: the record's
    future fails once the timeout is up, saying that it may or may not have been written, as Kafka's
    close(timeout) fails the incomplete batches. Before, a record in flight then stayed pending for
    ever: a caller waiting for it waited for ever, one not waiting never learnt of it."""
    server = server_process("--database-url", database_url)
    with Admin(server.url) as admin:
        admin.create_topic("frozen-close")
    producer = Producer(server.url, linger_ms=0, **FAST)
    producer.send("frozen-close", value="before").result(10)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        in_flight = producer.send("frozen-close", value="in flight")
        time.sleep(0.3)  # sent
        producer.close(timeout=0.5)
        with pytest.raises(errors.IllegalStateError, match="may or may not have been written"):
            in_flight.result(5)
    finally:
        os.kill(server.pid, signal.SIGCONT)


class InitProducerIdDropped(httpx.AsyncHTTPTransport):
    """Drops the connection of every InitProducerId while `dropping`."""

    def __init__(self) -> None:
        super().__init__()
        self.dropping = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.dropping and request.url.path == "/v1/producers/init":
            raise httpx.ConnectError("connection dropped on its way to the server", request=request)
        return await super().handle_async_request(request)


def test_a_producer_id_that_expired_and_cannot_be_replaced_fails_its_records_not_strands_them(make_server):
    """UNKNOWN_PRODUCER_ID (the producer's id expired on the server, producer_id_expiration_ms)
    while the server cannot be reached for a new id within max_block_ms: the batch fails with
    TxbrokerTimeoutError (nothing of it was written), and the producer goes on once the server
    answers again. Before, the sender's request task ended on that error without resolving the
    batch: its future stayed pending for ever, and so would a flush() waiting for it."""
    server = make_server(producer_id_expiration_ms=200, producer_id_expiration_check_interval_ms=50)
    with Admin(server.url) as admin:
        admin.create_topic("expiring")
    transport = InitProducerIdDropped()
    with Producer(server.url, transport=transport, linger_ms=0, max_block_ms=500, **FAST) as producer:
        producer.send("expiring", value="first").result(10)
        first_id = producer.producer_id
        deadline = time.monotonic() + 10
        with Admin(server.url) as admin:
            while admin.describe_producers("expiring", 0) and time.monotonic() < deadline:
                time.sleep(0.05)  # its state expired
        transport.dropping = True
        stranded = producer.send("expiring", value="lost")
        with pytest.raises(errors.TxbrokerTimeoutError, match="InitProducerId"):
            stranded.result(10)
        transport.dropping = False
        assert producer.send("expiring", value="after").result(10).offset == 1
        assert producer.producer_id != first_id
    assert [r.value for r in read_all(server.url, "expiring", 1)] == [b"first", b"after"]


def test_a_commit_to_a_frozen_server_returns_after_max_block_ms_and_resumes(server_process, database_url):
    """commit_transaction() while the server is frozen (SIGSTOP) and the transaction's records are
    unanswered: it raises TxbrokerTimeoutError (retriable) after max_block_ms, as Kafka's
    commitTransaction() does, and once the server runs again, calling it again commits, each record
    once. Before, it waited for the records for up to delivery_timeout_ms (two minutes by default),
    and then made the transaction abortable."""
    server = server_process("--database-url", database_url)
    with Admin(server.url) as admin:
        admin.create_topic("frozen-commit")
    with Producer(
        server.url,
        transactional_id="frozen-commit",
        max_block_ms=1000,
        linger_ms=60_000,  # the records are sent by the commit's flush
        request_timeout_ms=3000,
        delivery_timeout_ms=63_000,  # at least linger_ms + request_timeout_ms, as Kafka requires
        **FAST,
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send("frozen-commit", value=f"r{i}") for i in range(3)]
        os.kill(server.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(errors.TxbrokerTimeoutError, match="max_block_ms") as raised:
                producer.commit_transaction()
            took = time.monotonic() - started
            assert took < 5, f"commit_transaction() took {took:.1f} s with max_block_ms=1000"
            assert raised.value.retriable and not raised.value.abortable
            with pytest.raises(errors.IllegalStateError, match="call commit_transaction"):
                producer.abort_transaction()
        finally:
            os.kill(server.pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while True:
            try:
                producer.commit_transaction()
                break
            except errors.TxbrokerTimeoutError:
                assert time.monotonic() < deadline
        assert [future.result(0).offset for future in futures] == [0, 1, 2]
    assert [r.value for r in read_all(server.url, "frozen-commit", 1)] == [b"r0", b"r1", b"r2"]


def test_a_topic_re_created_with_fewer_partitions_is_produced_to_by_its_new_count(server):
    """A producer's key went to partition 2 of a topic that is then re-created with one
    partition: the batch sent by the stale count fails (UNKNOWN_TOPIC_OR_PARTITION), and the next
    records of that key go to the new topic's partition 0, as Kafka's producer refreshes its
    metadata on that error. Before, every record of the key failed until metadata_max_age_ms (five
    minutes by default) had passed."""
    key = next(f"key-{i}" for i in range(100) if partition_for_key(f"key-{i}".encode(), 3) == 2)
    with Admin(server.url) as admin, Producer(server.url, linger_ms=0, **FAST) as producer:
        admin.create_topic("shrunk", partitions=3)
        assert producer.send("shrunk", value="before", key=key).result(10).partition == 2
        admin.delete_topic("shrunk")
        admin.create_topic("shrunk", partitions=1)
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            producer.send("shrunk", value="by the stale count", key=key).result(10)
        assert producer.send("shrunk", value="after", key=key).result(10) == RecordMetadata("shrunk", 0, 0)


class FirstRequestsHeld(httpx.AsyncHTTPTransport):
    """Holds the first request to each of `paths` for `seconds` on its way to the server, as a
    slow network or a busy server would: given up before, it never arrives."""

    def __init__(self, seconds: float, *paths: str) -> None:
        super().__init__()
        self.seconds = seconds
        self.to_hold = set(paths)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in self.to_hold:
            self.to_hold.discard(request.url.path)
            await asyncio.sleep(self.seconds)
        return await super().handle_async_request(request)


def test_prepare_transaction_blocks_at_most_max_block_ms_and_resumes(server):
    """prepare_transaction() blocks at most max_block_ms, for the records and the PrepareTxn
    together, as commit_transaction() does: slow answers to either make it raise
    TxbrokerTimeoutError (retriable), and calling it again resumes; the transaction then commits,
    each record once. Before, it waited for the records for up to delivery_timeout_ms and for the
    PrepareTxn for up to request_timeout_ms (here 3 s each), whatever max_block_ms said."""
    with Admin(server.url) as admin:
        admin.create_topic("slow-prepare")
    transport = FirstRequestsHeld(3, "/v1/produce", "/v1/txn/prepare")
    with Producer(
        server.url,
        transactional_id="slow-prepare",
        transport=transport,
        max_block_ms=500,
        linger_ms=60_000,  # the records are sent by the prepare's flush
        **FAST,
    ) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send("slow-prepare", value=f"r{i}") for i in range(3)]
        for held in ("records were not all answered", "PrepareTxn"):
            started = time.monotonic()
            with pytest.raises(errors.TxbrokerTimeoutError, match=held) as raised:
                producer.prepare_transaction()
            took = time.monotonic() - started
            assert took < 2.5, f"prepare_transaction() took {took:.1f} s with max_block_ms=500 ({held})"
            assert raised.value.retriable and not raised.value.abortable
            assert [future.result(10).offset for future in futures] == [0, 1, 2]  # the held produce went on
        prepared = producer.prepare_transaction()
        assert prepared.transactional_id == "slow-prepare"
        assert producer.prepare_transaction() == prepared
        producer.commit_transaction()
    assert [r.value for r in read_all(server.url, "slow-prepare", 1)] == [b"r0", b"r1", b"r2"]


def send_one_held_then_one_waiting(producer: Producer, transport: FirstRequestsHeld, topic: str) -> tuple:
    """A record to partition 0 whose request is held (FirstRequestsHeld), taking the producer's one
    request slot, then a record to partition 1 that waits in the buffer behind it."""
    held = producer.send(topic, value="held", partition=0)
    deadline = time.monotonic() + 30
    while "/v1/produce" in transport.to_hold:  # until its request is on its way, held (not sent with the next)
        assert time.monotonic() < deadline, "the first record's request was never sent"
        time.sleep(0.01)
    return held, producer.send(topic, value="waiting", partition=1)


WAITED = "waited in the producer's buffer for delivery_timeout_ms"
# A delivery timeout of 1 s, with a request timeout within it (as Kafka requires delivery_timeout_ms
# >= linger_ms + request_timeout_ms).
SHORT_DELIVERY = {"delivery_timeout_ms": 1000, "request_timeout_ms": 1000}


def test_a_record_waiting_in_the_buffer_past_delivery_timeout_ms_fails_unwritten(server):
    """A record that cannot be sent (max_in_flight_requests taken by a request the server is slow to
    answer) fails after delivery_timeout_ms with TxbrokerTimeoutError, as Kafka's producer expires
    the batches waiting in its accumulator; it was never sent, so the idempotent producer goes on in
    its epoch at the partition's next sequence. Before, the timeout was checked only after a send
    attempt failed: the record waited for the slot (here 3 s, up to request_timeout_ms and more)."""
    with Admin(server.url) as admin:
        admin.create_topic("buffered", partitions=2)
    transport = FirstRequestsHeld(5, "/v1/produce")
    options = {"linger_ms": 0, "max_in_flight_requests": 1, **SHORT_DELIVERY, **FAST}
    with Producer(server.url, transport=transport, **options) as producer:
        held, waiting = send_one_held_then_one_waiting(producer, transport, "buffered")
        sender = producer._core._sender
        with pytest.raises(errors.TxbrokerTimeoutError, match=WAITED):
            waiting.result(10)
        assert sender._in_flight, "the waiting record failed while the request slot was still taken, not after"
        # The held record's request is in flight at its delivery timeout too: it fails, its outcome
        # unknown (test_sdk_delivery_timeout.py), and its request goes on.
        with pytest.raises(errors.TxbrokerTimeoutError, match="may or may not be written"):
            held.result(10)
        epoch = producer.producer_epoch
        deadline = time.monotonic() + 30
        while sender._in_flight and time.monotonic() < deadline:
            time.sleep(0.05)  # until the held request is answered, freeing the slot
        assert producer.send("buffered", value="after", partition=1).result(10) == RecordMetadata("buffered", 1, 0)
        assert producer.producer_epoch == epoch, "nothing of the expired batch was sent, the held one answered"
    assert sorted(r.value for r in read_all(server.url, "buffered", 2)) == [b"after", b"held"], (
        "the held record, answered after its future failed, was written once"
    )


def test_a_transactions_record_waiting_in_the_buffer_past_delivery_timeout_ms_makes_it_abortable(server):
    """In a transaction, a record expired in the buffer is lost to it: the transaction can only
    abort (Kafka's producer enters its abortable error state); after the abort the next one
    commits. Before, the record waited for the request slot and the transaction committed."""
    with Admin(server.url) as admin:
        admin.create_topic("buffered-txn", partitions=2)
    transport = FirstRequestsHeld(5, "/v1/produce")
    options = {"linger_ms": 0, "max_in_flight_requests": 1, **SHORT_DELIVERY, **FAST}
    with Producer(server.url, transactional_id="buffered-txn", transport=transport, **options) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        _, waiting = send_one_held_then_one_waiting(producer, transport, "buffered-txn")
        with pytest.raises(errors.TxbrokerTimeoutError, match=WAITED) as raised:
            waiting.result(10)
        assert raised.value.abortable
        assert producer.transaction_state is TransactionState.ABORTABLE_ERROR
        with pytest.raises(errors.TxbrokerTimeoutError, match=WAITED):
            producer.commit_transaction()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("buffered-txn", value="after", partition=1)
        producer.commit_transaction()
    assert [r.value for r in read_all(server.url, "buffered-txn", 2)] == [b"after"]


class OddAnswers:
    """A real HTTP proxy in the test process in front of a real server: it forwards each request,
    but answers a path of `odd` (path -> (status, headers, body)) itself, as a proxy, a gateway's
    maintenance page or another server would; for its first `times` requests only, when set with
    `answer_first`. `answered_oddly` counts the odd answers of each path."""

    def __init__(self, upstream: str) -> None:
        self.odd: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.answered_oddly: dict[str, int] = {}
        self._odd_times: dict[str, int] = {}
        self._lock = threading.Lock()
        self._upstream = httpx.Client(base_url=upstream, timeout=60)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy._answer(self)

            do_POST = do_DELETE = do_GET

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer_first(self, path: str, answer: tuple[int, dict[str, str], bytes], times: int) -> None:
        """Answers `path`'s next `times` requests with `answer`, then forwards them again."""
        with self._lock:
            self.odd[path], self._odd_times[path] = answer, times

    def _odd_answer(self, path: str) -> tuple[int, dict[str, str], bytes] | None:
        with self._lock:
            odd = self.odd.get(path)
            if odd is None:
                return None
            if path in self._odd_times:
                if self._odd_times[path] == 0:
                    del self.odd[path], self._odd_times[path]
                    return None
                self._odd_times[path] -= 1
            self.answered_oddly[path] = self.answered_oddly.get(path, 0) + 1
            return odd

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        odd = self._odd_answer(handler.path.split("?", 1)[0])
        if odd is None:
            headers = {
                name: handler.headers[name] for name in ("Content-Type", "Authorization") if handler.headers[name]
            }
            forwarded = self._upstream.request(handler.command, handler.path, content=body, headers=headers)
            status, headers = forwarded.status_code, {"Content-Type": forwarded.headers.get("Content-Type", "")}
            content = forwarded.content
        else:
            status, headers, content = odd
        self._reply(handler, status, headers, content)

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], content: bytes) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._upstream.close()


@pytest.fixture
def odd_answers(server):
    proxy = OddAnswers(server.url)
    yield proxy
    proxy.close()


MAINTENANCE_PAGE = (200, {"Content-Type": "text/html"}, b"<html>down for maintenance</html>")


@pytest.mark.parametrize(
    "answer",
    [
        MAINTENANCE_PAGE,
        (200, {"Content-Type": "application/json"}, b'{"partitions": [{"topic": "odd-fetch", "partition": 0}]}'),
        (200, {"Content-Type": "application/json"}, b'{"partitions": "none"}'),
    ],
    ids=["not-json", "a-field-missing", "a-field-wrongly-typed"],
)
def test_a_fetch_answered_200_with_what_is_not_the_contracts_answer_is_retried_not_a_crash(server, odd_answers, answer):
    """A 2xx that is not the contract's answer (a gateway's maintenance page, a JSON object without
    a field of the answer or with a field of another type) answers a consumer's fetches: poll()
    returns nothing within its timeout, as for a server away, and reads on once the server answers
    again. Before, the page decoded to None and poll() raised TypeError; the JSON objects made it
    raise a raw KeyError or TypeError."""
    tp = TopicPartition("odd-fetch", 0)
    with Admin(server.url) as admin:
        admin.create_topic(tp.topic)
    produce_values(server.url, tp.topic, ["a", "b", "c"])
    odd_answers.odd["/v1/fetch"] = answer
    with Consumer(odd_answers.url, prefetch=False, **FAST) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        for _ in range(2):
            records, took = timed_poll(consumer, 300)
            assert records == [] and took < 5
        del odd_answers.odd["/v1/fetch"]
        received: list = []
        deadline = time.monotonic() + 20
        while len(received) < 3 and time.monotonic() < deadline:
            received += consumer.poll(timeout_ms=500)
    assert [r.value for r in received] == [b"a", b"b", b"c"]


@pytest.mark.parametrize(
    "answer, says",
    [
        (MAINTENANCE_PAGE, r"answered HTTP 200 \(text/html\) with '<html>down for maintenance</html>'"),
        ((200, {"Content-Type": "application/json"}, b"[1, 2]"), r"with '\[1, 2\]', where the contract answers a JSON"),
        ((200, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"not gzip"), "does not decode"),
    ],
    ids=["not-json", "not-an-object", "undecodable"],
)
def test_an_answer_that_is_not_the_contracts_is_an_invalid_response_error(odd_answers, answer, says):
    """A 2xx whose body is not a JSON object, or a body that does not decode, is the SDK's
    InvalidResponseError (retriable: a request's outcome is unknown, as after a lost connection),
    saying what came; retried until the call's timeout, it is what the TxbrokerTimeoutError names.
    Before, the first two returned None or the list as the answer (describe_topic() returned them),
    and the third raised httpx's own DecodingError."""
    odd_answers.odd["/v1/topics/odd"] = answer
    with Admin(odd_answers.url, default_api_timeout_ms=300, **FAST) as admin:
        with pytest.raises(errors.TxbrokerTimeoutError) as raised:
            admin.describe_topic("odd")
    error = raised.value.__cause__
    assert isinstance(error, errors.InvalidResponseError) and isinstance(error, errors.TxbrokerConnectionError)
    assert error.retriable and error.code == "INVALID_RESPONSE"
    assert re.search(says, error.message), error.message
    assert "GET " + odd_answers.url + "/v1/topics/odd" in error.message


WITHOUT_FIELDS = (200, {"Content-Type": "application/json"}, b'{"unexpected": true}')


PRODUCER_INIT = "/v1/producers/init"


@pytest.mark.parametrize("transactional_id", [None, "odd-init-for-a-while"], ids=["idempotent", "transactional"])
def test_a_producer_id_answered_without_the_contracts_fields_for_a_while_is_retried(
    server, odd_answers, transactional_id
):
    """InitProducerId answered without the contract's fields (a proxy's, another server's JSON) for
    its first attempts, then rightly: the request is retried with backoff as a lost answer is, and
    the caller sees no error: the idempotent producer's first record is written, init_transactions()
    returns. Before, the answer was checked where it was read, after the retries: the record failed
    with InvalidResponseError, init_transactions() raised it."""
    topic = f"odd-init-{transactional_id is not None}"
    with Admin(server.url) as admin:
        admin.create_topic(topic)
    odd_answers.answer_first(PRODUCER_INIT, WITHOUT_FIELDS, times=3)
    with Producer(odd_answers.url, transactional_id=transactional_id, linger_ms=0, **FAST) as producer:
        if transactional_id is None:
            assert producer.send(topic, value="v").result(10).offset == 0
        else:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, value="v")
            producer.commit_transaction()
    assert odd_answers.answered_oddly[PRODUCER_INIT] == 3
    assert [r.value for r in read_all(server.url, topic, 1)] == [b"v"]


# Retries under max_block_ms give up once the next backoff would end past it (txbroker.retry): as
# early as one longest backoff of FAST, jitter included, before it.
LONGEST_BACKOFF_S = FAST["retry_backoff_max_ms"] / 1000 * (1 + Backoff.jitter)


def test_a_producer_id_never_answered_with_the_contracts_fields_fails_the_records_after_max_block_ms(
    server, odd_answers
):
    """InitProducerId always answered without the contract's fields: the records waiting for the
    id fail once max_block_ms is over (as when the server is unreachable), with a retriable
    TxbrokerTimeoutError caused by the InvalidResponseError naming the request and the field;
    flush() returns, and once the answers are the contract's again the producer goes on. Before,
    the records failed at the first answer, without a retry."""
    with Admin(server.url) as admin:
        admin.create_topic("no-producer-id")
    odd_answers.odd[PRODUCER_INIT] = WITHOUT_FIELDS
    with Producer(odd_answers.url, linger_ms=0, max_block_ms=600, **FAST) as producer:
        started = time.monotonic()
        future = producer.send("no-producer-id", value="failed")
        with pytest.raises(errors.TxbrokerTimeoutError) as raised:
            future.result(10)
        assert 0.6 - LONGEST_BACKOFF_S <= time.monotonic() - started < 5
        assert raised.value.retriable and not raised.value.fatal
        cause = raised.value.__cause__
        assert isinstance(cause, errors.InvalidResponseError) and cause.retriable
        assert re.search(r"POST \S+/v1/producers/init answered .* field 'producer_id' is missing", cause.message)
        assert odd_answers.answered_oddly[PRODUCER_INIT] > 1, "retried"
        producer.flush()
        del odd_answers.odd[PRODUCER_INIT]
        assert producer.send("no-producer-id", value="after").result(10).offset == 0
    assert [r.value for r in read_all(server.url, "no-producer-id", 1)] == [b"after"]


def test_init_transactions_never_answered_with_the_contracts_fields_raises_after_max_block_ms(server, odd_answers):
    """init_transactions() whose InitProducerId is always answered with a field of another type
    retries it for max_block_ms, then raises a retriable TxbrokerTimeoutError caused by the
    InvalidResponseError naming the request and the field (calling again once the answers are
    right initializes). Before, it raised InvalidResponseError at the first answer."""
    with Admin(server.url) as admin:
        admin.create_topic("odd-init")
    odd_answers.odd[PRODUCER_INIT] = (200, {"Content-Type": "application/json"}, b'{"producer_id": "7"}')
    # 2 s: room for several attempts even when one takes a while on a loaded machine (with 0.6 s,
    # a slow first answer left no second attempt to see); the bounds say it waited about that long.
    with Producer(odd_answers.url, transactional_id="odd-init", max_block_ms=2000, **FAST) as producer:
        started = time.monotonic()
        with pytest.raises(errors.TxbrokerTimeoutError) as raised:
            producer.init_transactions()
        assert 2.0 - LONGEST_BACKOFF_S <= time.monotonic() - started < 30
        cause = raised.value.__cause__
        assert raised.value.retriable and isinstance(cause, errors.InvalidResponseError)
        assert "/v1/producers/init" in cause.message and "field 'producer_id' is a string where" in cause.message
        assert odd_answers.answered_oddly[PRODUCER_INIT] > 1, "retried"
        del odd_answers.odd[PRODUCER_INIT]
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("odd-init", value="v")
        producer.commit_transaction()
    assert [r.value for r in read_all(server.url, "odd-init", 1)] == [b"v"]


def test_the_heartbeat_task_outlives_answers_without_the_contracts_fields(server, odd_answers, caplog):
    """Heartbeats answered with JSON objects without the contract's fields: the heartbeat task logs
    InvalidResponseError naming the field and goes on heartbeating, so the membership lives on
    between polls once the answers are right again. Before, the first such answer's KeyError ended
    the task silently, and nothing heartbeated until the next poll() started it again."""
    with Admin(server.url) as admin:
        admin.create_topic("odd-heartbeats")
    heartbeat = "/v1/groups/odd-beaters/heartbeat"
    with Consumer(odd_answers.url, group_id="odd-beaters", heartbeat_interval_ms=100, **FAST) as consumer:
        consumer.subscribe(["odd-heartbeats"])
        deadline = time.monotonic() + 20
        while not consumer.assignment():
            assert time.monotonic() < deadline, "never assigned"
            consumer.poll(timeout_ms=100)
        coordinator = consumer._core._coordinator
        odd_answers.odd[heartbeat] = (200, {"Content-Type": "application/json"}, b'{"assignment": []}')
        with caplog.at_level("WARNING", logger="txbroker"):
            time.sleep(1)
        assert not coordinator._heartbeat_task.done(), coordinator._heartbeat_task
        assert "field 'generation_id' is missing" in caplog.text
        del odd_answers.odd[heartbeat]
        member = coordinator.member_id
        time.sleep(0.5)
        assert coordinator._heartbeat_error is None and coordinator.member_id == member
        assert not coordinator._heartbeat_task.done()


class FirstJoinAnswerLost(httpx.AsyncHTTPTransport):
    """Sends the first group join to the server, which joins, then loses its answer on the way back."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if not self.lost and request.url.path.endswith("/heartbeat") and b'"member_id":""' in request.content:
            self.lost += 1
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("the answer was lost on its way back", request=request)
        return response


def test_a_join_whose_answer_was_lost_leaves_no_member_behind(server):
    """Before, the consumer's next attempt joined as a second member, and the member of the lost
    answer, which nobody heartbeats, held half the partitions, unread, for the session timeout (30 s
    here); now both attempts carry one join_id and are one member, assigned every partition."""
    with Admin(server.url) as admin:
        admin.create_topic("lost-join", partitions=2)
    transport = FirstJoinAnswerLost()
    with Consumer(server.url, group_id="lost-join-group", transport=transport, **FAST) as consumer:
        consumer.subscribe(["lost-join"])
        # A poll waits for the join only until its own timeout (the join goes on past it).
        deadline = time.monotonic() + 20
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
        assert transport.lost == 1
        assert consumer.assignment() == {TopicPartition("lost-join", 0), TopicPartition("lost-join", 1)}
        with Admin(server.url) as admin:
            assert [m["member_id"] for m in admin.describe_group("lost-join-group")["members"]] == [
                consumer.group_metadata().member_id
            ]
