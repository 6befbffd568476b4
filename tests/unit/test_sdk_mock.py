"""The producer's and consumer's reactions to the server's answers, with no server: an
`httpx.MockTransport` plays the contract, with scripted errors and lost responses. Each test names
the behaviour Kafka's clients learned (KIP-98, KIP-360, KIP-447, KIP-890, KIP-1050)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections import defaultdict, deque

import httpx
import pytest

from txbroker import AsyncConsumer, AsyncProducer, Consumer, Producer, TopicPartition, TransactionState, errors
from txbroker.records import ConsumerGroupMetadata
from txbroker.wire import partition_for_key

FAST = {"retry_backoff_ms": 1, "retry_backoff_max_ms": 5}


def error_response(status: int, code: str, message: str = "scripted", retriable: bool = False) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message, "retriable": retriable}})


class FakeBroker:
    """Answers like a txbroker server, unless a scripted answer for the path is queued: an
    httpx.Response, an exception to raise (a lost response), or a function of the body."""

    def __init__(self, partitions: int = 3) -> None:
        self.partitions = partitions
        self.calls: list[tuple[str, dict | None, httpx.Headers]] = []
        self.script: dict[str, deque] = defaultdict(deque)
        self.offsets: dict[tuple[str, int], int] = defaultdict(int)
        self.producer_id, self.epoch = 7, 0
        self.transport = httpx.MockTransport(self.handle)

    def bodies(self, path: str) -> list[dict]:
        return [body for called, body, _ in self.calls if called == path]

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        self.calls.append((path, body, request.headers))
        if self.script[path]:
            item = self.script[path].popleft()
            if isinstance(item, BaseException):
                raise item
            if callable(item):
                item = item(body)
            if item is not None:
                return item
        return httpx.Response(200, json=self.answer(request.method, path, body))

    def answer(self, method: str, path: str, body: dict | None) -> dict:
        if path == "/v1/producers/init":
            if body.get("producer_epoch", -1) >= 0:
                self.epoch += 1
            return {"producer_id": self.producer_id, "producer_epoch": self.epoch}
        if path.startswith("/v1/topics/"):
            return {
                "name": path.rsplit("/", 1)[1],
                "config": {},
                "partitions": [
                    {"partition": p, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0}
                    for p in range(self.partitions)
                ],
            }
        if path == "/v1/produce":
            results = []
            for entry in body["partitions"]:
                key = (entry["topic"], entry["partition"])
                base = self.offsets[key]
                self.offsets[key] += len(entry["records"])
                results.append(
                    {
                        "topic": key[0],
                        "partition": key[1],
                        "base_offset": base,
                        "last_offset": self.offsets[key] - 1,
                        "duplicate": False,
                        "error": None,
                    }
                )
            return {"partitions": results}
        if path == "/v1/txn/end":
            self.epoch += 1
            return {
                "producer_id": self.producer_id,
                "producer_epoch": self.epoch,
                "state": "CompleteCommit" if body["committed"] else "CompleteAbort",
            }
        if path == "/v1/txn/offset-commit":
            return {
                "offsets": [{"topic": o["topic"], "partition": o["partition"], "error": None} for o in body["offsets"]]
            }
        return {}


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


def transactional(broker: FakeBroker, **config) -> Producer:
    producer = Producer(
        "http://fake", transactional_id="app", transport=broker.transport, linger_ms=0, **{**FAST, **config}
    )
    producer.init_transactions()
    return producer


# ---- retriable, fatal, abortable


def test_retriable_error_is_retried_with_backoff_then_succeeds(broker):
    broker.script["/v1/producers/init"].extend(
        [
            error_response(409, "CONCURRENT_TRANSACTIONS", retriable=True),
            error_response(503, "COORDINATOR_LOAD_IN_PROGRESS", retriable=True),
            httpx.ConnectError("refused"),
        ]
    )
    producer = transactional(broker)
    assert len(broker.bodies("/v1/producers/init")) == 4
    assert producer.transaction_state is TransactionState.READY and producer.producer_id == 7
    producer.close()


def test_retriable_error_past_max_block_is_a_timeout(broker):
    broker.script["/v1/producers/init"].extend([error_response(409, "CONCURRENT_TRANSACTIONS", retriable=True)] * 500)
    producer = Producer("http://fake", transactional_id="app", transport=broker.transport, max_block_ms=50, **FAST)
    with pytest.raises(errors.TxbrokerTimeoutError) as raised:
        producer.init_transactions()
    assert isinstance(raised.value.__cause__, errors.ConcurrentTransactionsError)
    assert producer.transaction_state is TransactionState.UNINITIALIZED, "init may be called again"
    producer.close()


def test_producer_fenced_moves_to_fatal_error_and_stays_there(broker):
    producer = transactional(broker)
    producer.begin_transaction()
    broker.script["/v1/produce"].append(error_response(409, "PRODUCER_FENCED", "epoch 0 is older than 1"))
    future = producer.send("t", b"v", partition=0)
    with pytest.raises(errors.ProducerFencedError) as raised:
        future.result(5)
    assert raised.value.fatal and raised.value.message == "epoch 0 is older than 1"
    assert producer.transaction_state is TransactionState.FATAL_ERROR
    for call in (
        producer.commit_transaction,
        producer.abort_transaction,
        producer.begin_transaction,
        lambda: producer.send("t", b"again", partition=0),
    ):
        with pytest.raises(errors.ProducerFencedError):
            call()
    assert broker.bodies("/v1/txn/end") == [], "a fenced producer ends nothing"
    producer.close()


def test_partition_error_makes_the_transaction_abortable_and_abort_recovers(broker):
    producer = transactional(broker)
    producer.begin_transaction()
    broker.script["/v1/produce"].append(
        lambda body: httpx.Response(
            200,
            json={
                "partitions": [
                    {
                        "topic": "t",
                        "partition": 0,
                        "base_offset": None,
                        "last_offset": None,
                        "duplicate": False,
                        "error": {"code": "RECORD_TOO_LARGE", "message": "too big", "retriable": False},
                    }
                ]
            },
        )
    )
    future = producer.send("t", b"x" * 10, partition=0)
    with pytest.raises(errors.RecordTooLargeError) as raised:
        producer.commit_transaction()
    assert raised.value.abortable and not raised.value.fatal
    assert isinstance(future.exception(5), errors.RecordTooLargeError)
    assert producer.transaction_state is TransactionState.ABORTABLE_ERROR
    with pytest.raises(errors.IllegalStateError, match="abort_transaction"):
        producer.send("t", b"more", partition=0)
    producer.abort_transaction()
    assert broker.bodies("/v1/txn/end")[-1]["committed"] is False
    assert producer.transaction_state is TransactionState.READY and producer.producer_epoch == 1
    producer.begin_transaction()
    producer.send("t", b"ok", partition=0)
    producer.commit_transaction()
    last = broker.bodies("/v1/produce")[-1]
    assert (last["producer_epoch"], last["partitions"][0]["base_sequence"]) == (1, 0)
    producer.close()


def test_out_of_order_sequence_is_fatal_for_idempotent_and_abortable_in_a_transaction(broker):
    def refuse(body):
        error = {"code": "OUT_OF_ORDER_SEQUENCE_NUMBER", "message": "expected 0", "retriable": False}
        entry = {"topic": "t", "partition": 0, "base_offset": None, "last_offset": None, "duplicate": False}
        return httpx.Response(200, json={"partitions": [{**entry, "error": error}]})

    idempotent = Producer("http://fake", transport=broker.transport, linger_ms=0, **FAST)
    broker.script["/v1/produce"].append(refuse)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        idempotent.send("t", b"v", partition=0).result(5)
    assert idempotent.transaction_state is TransactionState.FATAL_ERROR
    idempotent.close()
    other = FakeBroker()
    producer = transactional(other)
    producer.begin_transaction()
    other.script["/v1/produce"].append(refuse)
    producer.send("t", b"v", partition=0)
    with pytest.raises(errors.OutOfOrderSequenceNumberError) as raised:
        producer.commit_transaction()
    assert raised.value.abortable and not raised.value.fatal
    producer.abort_transaction()
    producer.close()


def test_unknown_producer_id_of_an_idempotent_producer_gets_a_new_id_and_resends(broker):
    producer = Producer("http://fake", transport=broker.transport, linger_ms=0, **FAST)
    assert producer.send("t", b"a", partition=0).result(5).offset == 0
    broker.producer_id = 8
    broker.script["/v1/produce"].append(error_response(409, "UNKNOWN_PRODUCER_ID", "expired"))
    assert producer.send("t", b"b", partition=0).result(5).offset == 1
    sent = broker.bodies("/v1/produce")
    assert [(b["producer_id"], b["partitions"][0]["base_sequence"]) for b in sent] == [(7, 0), (7, 1), (8, 0)]
    producer.close()


def test_idempotent_produce_retried_after_a_lost_response_keeps_its_sequence(broker):
    producer = Producer("http://fake", transport=broker.transport, linger_ms=0, **FAST)
    broker.script["/v1/produce"].append(httpx.ReadError("connection reset"))
    assert producer.send("t", b"a", partition=1).result(5).partition == 1
    first, retry = broker.bodies("/v1/produce")
    assert first == retry, "the same batch, same sequence: the server answers a duplicate"
    producer.close()


# ---- the commit whose outcome is unknown


def test_commit_with_a_lost_response_is_retried_with_the_same_body_and_adopts_the_new_epoch(broker):
    producer = transactional(broker)
    producer.begin_transaction()
    producer.send("t", b"v", partition=0)
    broker.script["/v1/txn/end"].append(httpx.ReadError("connection reset by peer"))
    producer.commit_transaction()
    first, retry = broker.bodies("/v1/txn/end")
    assert first == retry == {"transactional_id": "app", "producer_id": 7, "producer_epoch": 0, "committed": True}
    assert producer.transaction_state is TransactionState.READY
    assert (producer.producer_id, producer.producer_epoch) == (7, 1)
    producer.begin_transaction()
    producer.send("t", b"w", partition=0)
    producer.commit_transaction()
    produce = broker.bodies("/v1/produce")[-1]
    assert (produce["producer_epoch"], produce["partitions"][0]["base_sequence"]) == (1, 0)
    producer.close()


def end_in_doubt(broker: FakeBroker, verb: str) -> tuple[Producer, errors.TxbrokerTimeoutError]:
    """A producer whose commit or abort (`verb`) got no answer within max_block_ms."""
    producer = transactional(broker, max_block_ms=100)
    producer.begin_transaction()
    producer.send("t", b"v", partition=0)
    producer.flush()
    broker.script["/v1/txn/end"].extend([httpx.ReadTimeout("no answer")] * 1000)
    with pytest.raises(errors.TxbrokerTimeoutError) as raised:
        getattr(producer, f"{verb}_transaction")()
    return producer, raised.value


def assert_refused_until_ended_again(producer: Producer, verb: str, calls: dict) -> None:
    unfinished = rf"while the transaction's {verb} is unfinished .*: call {verb}_transaction\(\) again"
    for name, call in calls.items():
        with pytest.raises(errors.IllegalStateError, match=rf"{name}\(\) {unfinished}"):
            call()


def test_commit_in_doubt_past_max_block_stays_committing_and_resumes_never_aborts(broker):
    producer, raised = end_in_doubt(broker, "commit")
    assert raised.retriable and not raised.abortable, "in doubt: ask again, do not abort"
    assert producer.transaction_state is TransactionState.COMMITTING
    assert_refused_until_ended_again(
        producer,
        "commit",
        {
            "abort_transaction": producer.abort_transaction,
            "send": lambda: producer.send("t", b"more", partition=0),
            "begin_transaction": producer.begin_transaction,
        },
    )
    broker.script["/v1/txn/end"].clear()
    producer.commit_transaction()
    bodies = broker.bodies("/v1/txn/end")
    assert all(body == bodies[0] for body in bodies) and bodies[0]["committed"] is True
    assert producer.transaction_state is TransactionState.READY and producer.producer_epoch == 1
    producer.close()


def test_an_abort_in_doubt_past_max_block_admits_only_abort_again(broker):
    producer, _ = end_in_doubt(broker, "abort")
    assert producer.transaction_state is TransactionState.ABORTING
    assert_refused_until_ended_again(
        producer,
        "abort",
        {"commit_transaction": producer.commit_transaction, "send": lambda: producer.send("t", b"more", partition=0)},
    )
    broker.script["/v1/txn/end"].clear()
    producer.abort_transaction()
    assert producer.transaction_state is TransactionState.READY
    assert [body["committed"] for body in broker.bodies("/v1/txn/end")][-1] is False
    producer.close()


def test_abort_when_nothing_reached_the_server_bumps_the_epoch_to_fence_stragglers(broker):
    producer = transactional(broker, delivery_timeout_ms=50, request_timeout_ms=50)
    producer.begin_transaction()
    broker.script["/v1/produce"].extend([httpx.ConnectError("down")] * 1000)
    with pytest.raises(errors.TxbrokerTimeoutError):
        producer.send("t", b"v", partition=0).result(5)
    assert producer.transaction_state is TransactionState.ABORTABLE_ERROR
    broker.script["/v1/txn/end"].append(error_response(409, "INVALID_TXN_STATE", "no transaction is open"))
    producer.abort_transaction()
    bump = broker.bodies("/v1/producers/init")[-1]
    assert (bump["producer_id"], bump["producer_epoch"]) == (7, 0), "KIP-360: bump our own epoch"
    assert producer.transaction_state is TransactionState.READY and producer.producer_epoch == 1
    producer.close()


def test_a_transaction_with_nothing_sent_commits_without_end_txn(broker):
    producer = transactional(broker)
    producer.begin_transaction()
    producer.commit_transaction()
    producer.begin_transaction()
    producer.abort_transaction()
    assert broker.bodies("/v1/txn/end") == [] and producer.transaction_state is TransactionState.READY
    producer.close()


# ---- offsets in the transaction (KIP-447)


def test_send_offsets_carries_the_group_generation_and_a_stale_one_is_abortable(broker):
    producer = transactional(broker)
    producer.begin_transaction()
    metadata = ConsumerGroupMetadata("orders", 4, "member-1")
    producer.send_offsets_to_transaction({TopicPartition("in", 0): 42}, metadata)
    [add] = broker.bodies("/v1/txn/add-offsets")
    [commit] = broker.bodies("/v1/txn/offset-commit")
    assert add["group_id"] == "orders"
    assert (commit["generation_id"], commit["member_id"], commit["offsets"]) == (
        4,
        "member-1",
        [{"topic": "in", "partition": 0, "offset": 42, "metadata": None}],
    )
    broker.script["/v1/txn/offset-commit"].append(
        lambda body: httpx.Response(
            200,
            json={
                "offsets": [
                    {
                        "topic": "in",
                        "partition": 0,
                        "error": {"code": "ILLEGAL_GENERATION", "message": "generation 4 is not 5", "retriable": False},
                    }
                ]
            },
        )
    )
    with pytest.raises(errors.IllegalGenerationError) as raised:
        producer.send_offsets_to_transaction({TopicPartition("in", 0): 43}, metadata)
    assert raised.value.abortable
    assert len(broker.bodies("/v1/txn/add-offsets")) == 1, "the group is added once per transaction"
    assert producer.transaction_state is TransactionState.ABORTABLE_ERROR
    producer.abort_transaction()
    producer.close()


# ---- what goes on the wire


def test_token_and_headers_go_on_every_request(broker):
    producer = Producer(
        "http://fake",
        transactional_id="app",
        transport=broker.transport,
        token="s3cret",
        headers={"X-Trace": "abc"},
        linger_ms=0,
        **FAST,
    )
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", b"v")
    producer.commit_transaction()
    producer.close()
    assert {path for path, _, _ in broker.calls} >= {"/v1/producers/init", "/v1/topics/t", "/v1/produce", "/v1/txn/end"}
    for _, _, headers in broker.calls:
        assert headers["authorization"] == "Bearer s3cret" and headers["x-trace"] == "abc"


def test_records_travel_base64_and_keys_choose_partitions_by_murmur2(broker):
    producer = Producer("http://fake", transport=broker.transport, linger_ms=0, **FAST)
    key, value = b"\xff\x00key", bytes(range(256))
    metadata = producer.send("t", value, key=key, headers=[("h", b"\x80")], timestamp_ms=1234).result(5)
    assert metadata.partition == partition_for_key(key, 3)
    [body] = broker.bodies("/v1/produce")
    assert body["encoding"] == "base64"
    [record] = body["partitions"][0]["records"]
    assert base64.b64decode(record["key"]) == key and base64.b64decode(record["value"]) == value
    assert record["headers"] == [{"key": "h", "value": base64.b64encode(b"\x80").decode()}]
    assert record["timestamp_ms"] == 1234
    assert producer.send("t", "text", key="k").result(5).partition == partition_for_key(b"k", 3), "str is UTF-8"
    producer.close()


def test_records_are_batched_per_partition_up_to_batch_size(broker):
    producer = Producer("http://fake", transport=broker.transport, linger_ms=10_000, max_batch_records=100, **FAST)
    futures = [producer.send("t", b"%d" % i, partition=i % 2) for i in range(300)]
    producer.flush()
    assert [f.result(0).offset for f in futures[:4]] == [0, 0, 1, 1]
    sizes = sorted(len(p["records"]) for body in broker.bodies("/v1/produce") for p in body["partitions"])
    assert sizes == [50, 50, 100, 100], "150 records per partition: a full batch, then the rest"
    sequences = [
        (p["partition"], p["base_sequence"]) for body in broker.bodies("/v1/produce") for p in body["partitions"]
    ]
    assert sorted(sequences) == [(0, 0), (0, 100), (1, 0), (1, 100)]
    producer.close()


def test_a_full_set_of_in_flight_requests_does_not_stall_the_sender(broker):
    """Regression: the sender woke when a request ended but before its slot was freed, saw every
    slot busy, and slept for good."""
    producer = Producer(
        "http://fake",
        transport=broker.transport,
        linger_ms=60_000,
        max_in_flight_requests=1,
        max_request_records=5,
        **FAST,
    )
    futures = [producer.send("t", b"x", partition=p) for p in range(3) for _ in range(5)]
    flushing = threading.Thread(target=producer.flush, daemon=True)
    flushing.start()
    flushing.join(10)
    assert not flushing.is_alive(), "flush() never returned"
    assert len(broker.bodies("/v1/produce")) == 3 and all(f.done() for f in futures)
    producer.close()


# ---- consumer


def test_consumer_decodes_base64_records_and_follows_next_offset():
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/offsets/list":
            return httpx.Response(
                200,
                json={"partitions": [{"topic": "t", "partition": 0, "offset": 3, "timestamp_ms": -1, "error": None}]},
            )
        assert body["encoding"] == "base64" and body["partitions"][0]["offset"] in (3, 9)
        records = (
            []
            if body["partitions"][0]["offset"] == 9
            else [
                {
                    "offset": 5,
                    "key": None,
                    "value": base64.b64encode(b"\xfe\xff").decode(),
                    "headers": [{"key": "h", "value": None}],
                    "timestamp_ms": 10,
                }
            ]
        )
        return httpx.Response(
            200,
            json={
                "partitions": [
                    {
                        "topic": "t",
                        "partition": 0,
                        "error": None,
                        "high_watermark": 9,
                        "last_stable_offset": 9,
                        "log_start_offset": 0,
                        "next_offset": 9,
                        "records": records,
                    }
                ]
            },
        )

    consumer = Consumer("http://fake", transport=httpx.MockTransport(handle), auto_offset_reset="earliest")
    with pytest.raises(errors.IllegalStateError, match="subscribe\\(\\) or assign\\(\\)"):
        consumer.poll(timeout_ms=0)
    consumer.assign([TopicPartition("t", 0)])
    [record] = consumer.poll(timeout_ms=0)
    assert (record.offset, record.key, record.value, record.headers) == (5, None, b"\xfe\xff", [("h", None)])
    assert consumer.position(TopicPartition("t", 0)) == 9, "past the markers and aborted records"
    assert consumer.poll(timeout_ms=0) == []
    consumer.close()


def test_async_flavour_shares_the_core(broker):
    async def scenario():
        async with AsyncProducer(
            "http://fake", transactional_id="app", transport=broker.transport, linger_ms=0, **FAST
        ) as producer:
            await producer.init_transactions()
            producer.begin_transaction()
            future = await producer.send("t", b"v", partition=2)
            broker.script["/v1/txn/end"].append(httpx.ReadError("reset"))
            await producer.commit_transaction()
            return (await future), producer.producer_epoch

    metadata, epoch = asyncio.run(scenario())
    assert (metadata.partition, metadata.offset, epoch) == (2, 0, 1)
    assert len(broker.bodies("/v1/txn/end")) == 2

    async def consumer_needs_a_group():
        consumer = AsyncConsumer("http://fake", transport=broker.transport)
        with pytest.raises(errors.IllegalStateError):
            consumer.subscribe(["t"])
        await consumer.close()

    asyncio.run(consumer_needs_a_group())


class SyncOnlyTransport(httpx.BaseTransport):
    """A transport with no async side, as httpx.HTTPTransport: the SDK runs it in a worker thread."""

    def __init__(self, handler) -> None:
        self.mock = httpx.MockTransport(handler)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.mock.handle_request(request)


def test_a_synchronous_transport_is_accepted(broker):
    producer = Producer("http://fake", transport=SyncOnlyTransport(broker.handle), linger_ms=0, **FAST)
    assert producer.send("t", b"v", partition=0).result(5).offset == 0
    producer.close()
