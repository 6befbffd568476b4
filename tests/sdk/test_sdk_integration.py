"""The SDK against a real server (real HTTP, real PostgreSQL, a fresh database per test): every public
method of Producer, Consumer and Admin, both flavours, fencing, rebalances, and the commit whose
response is lost."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from app.storage.database import connect
from txbroker import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    Producer,
    RecordMetadata,
    TopicPartition,
    TransactionState,
    errors,
)
from txbroker.wire import partition_for_key

FAST = {"retry_backoff_ms": 10, "retry_backoff_max_ms": 100}


@pytest.fixture
def admin(server):
    with Admin(server.url) as admin:
        yield admin


def read_all(url: str, topic: str, partitions: int, isolation_level: str = "read_committed") -> list:
    """Every record of a topic, from the beginning."""
    with Consumer(url, isolation_level=isolation_level) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        records = []
        while batch := consumer.poll(timeout_ms=300):
            records += batch
        return records


def test_idempotent_producer_round_trips_arbitrary_bytes(server, admin):
    admin.create_topic("t", partitions=3)
    with Producer(server.url, **FAST) as producer:
        assert producer.partitions_for("t") == [0, 1, 2]
        keyed = [producer.send("t", value=f"v{i}", key=f"k{i}") for i in range(200)]
        binary = producer.send(
            "t",
            value=bytes(range(256)),
            key=b"\xff\xfe",
            headers=[("h1", b"\x00\x80"), ("h2", None)],
            timestamp_ms=1_700_000_000_000,
        )
        empty = producer.send("t", value=None, key=None, partition=2)
        producer.flush()
        for i, future in enumerate(keyed):
            metadata = future.result(0)
            assert isinstance(metadata, RecordMetadata)
            assert metadata.partition == partition_for_key(f"k{i}".encode(), 3), "Kafka's default partitioner"
        assert empty.result(0).partition == 2
        producer_id = producer.producer_id
    records = read_all(server.url, "t", 3)
    assert len(records) == 202
    [record] = [r for r in records if r.key == b"\xff\xfe"]
    assert (record.value, record.headers, record.timestamp_ms) == (
        bytes(range(256)),
        [("h1", b"\x00\x80"), ("h2", None)],
        1_700_000_000_000,
    )
    assert binary.result(0) == RecordMetadata("t", record.partition, record.offset)
    assert [r.value for r in records if r.partition == 2 and r.key is None] == [None]
    by_partition = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r.offset)
    assert all(offsets == list(range(len(offsets))) for offsets in by_partition.values()), "no duplicates, no gaps"
    described = admin.describe_producers("t", 0)
    assert [p["producer_id"] for p in described] == [producer_id]


def test_transactions_commit_and_abort(server, admin):
    admin.create_topic("out", partitions=2)
    with Producer(server.url, transactional_id="tx-visibility", **FAST) as producer:
        producer.init_transactions()
        epoch = producer.producer_epoch
        producer.begin_transaction()
        for i in range(3):
            producer.send("out", value=f"committed-{i}", partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        doomed = [producer.send("out", value=f"aborted-{i}", partition=0) for i in range(2)]
        producer.flush()
        assert all(f.result(0).offset >= 0 for f in doomed), "written, and then aborted"
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("out", value="committed-3", partition=0)
        producer.commit_transaction()
        assert producer.producer_epoch == epoch + 3, "every EndTxn bumps the epoch (KIP-890)"
        assert producer.transaction_state is TransactionState.READY
    committed = sorted(r.value for r in read_all(server.url, "out", 2))
    assert committed == [b"committed-0", b"committed-1", b"committed-2", b"committed-3"]
    everything = read_all(server.url, "out", 2, "read_uncommitted")
    assert sorted(r.value for r in everything if r.value.startswith(b"aborted")) == [b"aborted-0", b"aborted-1"]
    assert [m["type"] for m in admin.list_markers("out", 0)] == ["COMMIT", "ABORT", "COMMIT"]


def test_a_fenced_producer_raises_the_fatal_producer_fenced_error(server, admin):
    admin.create_topic("out")
    zombie = Producer(server.url, transactional_id="fenced", **FAST)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("out", value="from the zombie")
    zombie.flush()
    with Producer(server.url, transactional_id="fenced", **FAST) as successor:
        successor.init_transactions()  # fences the zombie and aborts its transaction
        with pytest.raises(errors.ProducerFencedError) as raised:
            zombie.send("out", value="again").result(10)
        assert raised.value.fatal
        assert zombie.transaction_state is TransactionState.FATAL_ERROR
        with pytest.raises(errors.ProducerFencedError):
            zombie.commit_transaction()
        successor.begin_transaction()
        successor.send("out", value="from the successor")
        successor.commit_transaction()
    zombie.close()
    assert [r.value for r in read_all(server.url, "out", 1)] == [b"from the successor"]


class LoseFirstEndTxnResponse(httpx.AsyncHTTPTransport):
    """Lets the first EndTxn reach the server and be answered, then reports a connection reset
    instead of the answer: the client cannot know whether its commit happened."""

    def __init__(self) -> None:
        super().__init__()
        self.end_txn_calls = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path == "/v1/txn/end":
            self.end_txn_calls += 1
            if self.end_txn_calls == 1:
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("connection reset after the server answered", request=request)
        return response


def test_a_commit_whose_answer_is_lost_is_retried_and_reports_success(server, admin):
    admin.create_topic("out")
    transport = LoseFirstEndTxnResponse()
    with Producer(server.url, transactional_id="in-doubt", transport=transport, **FAST) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(5):
            producer.send("out", value=f"r{i}")
        producer.commit_transaction()
        assert transport.end_txn_calls == 2
        described = admin.describe_transaction("in-doubt")
        assert described["state"] == "CompleteCommit"
        assert (producer.producer_id, producer.producer_epoch) == (
            described["producer_id"],
            described["producer_epoch"],
        )
        producer.begin_transaction()
        producer.send("out", value="next")
        producer.commit_transaction()
    assert [r.value for r in read_all(server.url, "out", 1)] == [b"r0", b"r1", b"r2", b"r3", b"r4", b"next"]


class AgeTheFirstProduce(httpx.AsyncHTTPTransport):
    """Lets the first produce reach the server and be written, then reports a connection reset
    instead of its answer, and meanwhile its records age past the topic's bound (here: the bound is
    lowered below their age), so that its retry is refused though the first attempt was written."""

    def __init__(self, database_url: str, topic: str) -> None:
        super().__init__()
        self.database_url, self.topic = database_url, topic
        self.lost = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if request.url.path == "/v1/produce" and not self.lost:
            self.lost = True
            await response.aread()
            await response.aclose()
            conn = await connect(self.database_url)
            try:
                await conn.execute(
                    "UPDATE topics SET config = config || '{\"message_timestamp_before_max_ms\": 1000}'::jsonb "
                    "WHERE name = $1",
                    self.topic,
                )
            finally:
                await conn.close()
            raise httpx.ReadError("connection reset after the server answered", request=request)
        return response


def test_a_retry_refused_after_its_first_attempt_was_written_loses_nothing_after_it(server, admin):
    """A retry refused for a timestamp that aged out of the topic's bound since (the server checks
    timestamps before duplicates, as Kafka's broker) does not say that nothing was appended: the
    next batch must not reuse its sequence, which the server would answer as a duplicate of the
    first attempt's, dropping its records. The producer starts a new epoch instead, as Kafka's
    idempotent producer does after a failed batch."""
    admin.create_topic("aged")
    transport = AgeTheFirstProduce(server.database_url, "aged")
    with Producer(server.url, transport=transport, linger_ms=0, **FAST) as producer:
        first = producer.send("aged", value="first", partition=0, timestamp_ms=int(time.time() * 1000) - 60_000)
        with pytest.raises(errors.InvalidRecordError):
            first.result(10)
        second = producer.send("aged", value="second", partition=0).result(10)
    assert [(r.offset, r.value) for r in read_all(server.url, "aged", 1)] == [(0, b"first"), (1, b"second")]
    assert second.offset == 1


def test_consume_transform_produce_commits_offsets_in_the_transaction(server, admin):
    admin.create_topic("in", partitions=2)
    admin.create_topic("out", partitions=2)
    with Producer(server.url, **FAST) as plain:
        for i in range(40):
            plain.send("in", value=f"order-{i}", key=f"customer-{i % 7}")
    consumer = Consumer(
        server.url,
        group_id="ctp",
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **FAST,
    )
    producer = Producer(server.url, transactional_id="ctp-0", **FAST)
    producer.init_transactions()
    consumer.subscribe(["in"])
    processed = 0
    deadline = time.monotonic() + 20
    while processed < 40 and time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=500)
        if not records:
            continue
        producer.begin_transaction()
        for record in records:
            producer.send("out", key=record.key, value=record.value.upper())
        producer.send_offsets_to_transaction(
            {r.topic_partition: OffsetAndMetadata(r.offset + 1, "ctp") for r in records}, consumer.group_metadata()
        )
        producer.commit_transaction()
        processed += len(records)
    assert processed == 40
    ends = consumer.end_offsets([TopicPartition("in", 0), TopicPartition("in", 1)])
    assert consumer.committed(list(ends)) == ends
    group = admin.describe_group("ctp")
    assert {o["lag"] for o in group["offsets"]} == {0} and len(group["members"]) == 1
    assert sorted(r.value for r in read_all(server.url, "out", 2)) == sorted(f"ORDER-{i}".encode() for i in range(40))
    producer.close()
    consumer.close()
    assert admin.describe_group("ctp")["members"] == [], "close() leaves the group"


def test_rebalance_listeners_and_kip447_fencing_of_a_zombie_consumer(server, admin):
    admin.create_topic("in", partitions=2)
    events: list[tuple[str, str, set]] = []

    def consumer(name: str) -> Consumer:
        member = Consumer(
            server.url,
            group_id="g",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            heartbeat_interval_ms=100,
            session_timeout_ms=6000,
            **FAST,
        )
        member.subscribe(
            ["in"],
            on_assign=lambda parts: events.append((name, "assign", parts)),
            on_revoke=lambda parts: events.append((name, "revoke", parts)),
        )
        return member

    first = consumer("first")
    first.poll(timeout_ms=200)
    both = {TopicPartition("in", 0), TopicPartition("in", 1)}
    assert first.assignment() == both and events == [("first", "assign", both)]
    stale = first.group_metadata()
    second = consumer("second")
    second.poll(timeout_ms=200)
    deadline = time.monotonic() + 10
    # The second's partition reaches it once the first's poll() revoked it (the revocation barrier).
    while (len(first.assignment()) != 1 or not second.assignment()) and time.monotonic() < deadline:
        first.poll(timeout_ms=100)
        second.poll(timeout_ms=100)
    assert first.assignment() | second.assignment() == both and not first.assignment() & second.assignment()
    assert ("first", "revoke", second.assignment()) in events
    assert first.group_metadata().generation_id > stale.generation_id

    with Producer(server.url, transactional_id="zombie-check", **FAST) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(errors.IllegalGenerationError) as raised:
            producer.send_offsets_to_transaction({TopicPartition("in", 0): 0}, stale)
        assert raised.value.abortable, "KIP-447: the zombie's commit is refused; abort and move on"
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 0 for tp in first.assignment()}, first.group_metadata())
        producer.commit_transaction()
    second.close()  # leaves: the first gets both partitions back
    deadline = time.monotonic() + 10
    while first.assignment() != both and time.monotonic() < deadline:
        first.poll(timeout_ms=100)
    assert first.assignment() == both
    first.unsubscribe()
    assert first.assignment() == set() and first.subscription() == set()
    first.close()


def test_consumer_positions_seeks_and_commits(server, admin):
    admin.create_topic("t", partitions=2)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    with Producer(server.url, **FAST) as producer:
        for i in range(10):
            producer.send("t", value=f"r{i}", partition=0, timestamp_ms=1_000 + i)
    consumer = Consumer(server.url, group_id="manual", auto_offset_reset="latest", enable_auto_commit=False, **FAST)
    consumer.assign([tp0, tp1])
    assert consumer.assignment() == {tp0, tp1}
    assert consumer.position(tp0) == 10, "latest"
    assert consumer.beginning_offsets([tp0]) == {tp0: 0} and consumer.end_offsets([tp0, tp1]) == {tp0: 10, tp1: 0}
    assert consumer.offsets_for_times({tp0: 1_004}) == {tp0: 4}
    consumer.seek_to_beginning(tp0)
    assert [r.value for r in consumer.poll(timeout_ms=1000)][:2] == [b"r0", b"r1"]
    consumer.seek(tp0, 7)
    assert [r.offset for r in consumer.poll(timeout_ms=1000)] == [7, 8, 9]
    consumer.commit()
    assert consumer.committed([tp0, tp1]) == {tp0: 10, tp1: 0}
    done = threading.Event()
    outcome = {}
    consumer.commit_async(
        {tp0: OffsetAndMetadata(5, "half")},
        callback=lambda offsets, error: (outcome.update(offsets=offsets, error=error), done.set()),
    )
    assert done.wait(10) and outcome == {"offsets": {tp0: 5}, "error": None}
    assert consumer.committed([tp0]) == {tp0: 5}
    fetched = httpx.post(f"{server.url}/v1/groups/manual/offsets/fetch", json={"partitions": None})
    [committed] = [o for o in fetched.json()["offsets"] if o["partition"] == 0]
    assert committed["metadata"] == "half", "commit_async() kept the offset and dropped its metadata"
    consumer.seek_to_committed(tp0)
    assert consumer.position(tp0) == 5
    consumer.pause(tp0)
    assert consumer.paused() == {tp0} and consumer.poll(timeout_ms=100) == []
    consumer.resume(tp0)
    assert [r.offset for r in consumer.poll(timeout_ms=1000)] == [5, 6, 7, 8, 9]
    consumer.seek(tp0, 10_000)
    assert consumer.poll(timeout_ms=200) == [] and consumer.position(tp0) == 10, "out of range: auto_offset_reset"
    consumer.seek(tp0, 0)
    consumer.seek_to_end()
    assert (consumer.position(tp0), consumer.position(tp1)) == (10, 0)
    with pytest.raises(errors.IllegalStateError):
        consumer.seek(TopicPartition("t", 5), 0)
    # As Kafka's: a partition not assigned cannot be paused. Accepted, its pause outlived the call
    # and silently stopped the partition's reads once it was assigned.
    with pytest.raises(errors.IllegalStateError):
        consumer.pause(TopicPartition("t", 5))
    assert consumer.paused() == set()
    consumer.close()
    with Consumer(server.url, group_id="strict", auto_offset_reset="none") as strict:
        strict.assign([tp0])
        with pytest.raises(errors.NoOffsetForPartitionError):
            strict.poll(timeout_ms=0)


def test_long_poll_returns_as_soon_as_a_record_is_committed(server, admin):
    admin.create_topic("t")
    with Consumer(server.url, auto_offset_reset="latest") as consumer, Producer(server.url, **FAST) as producer:
        consumer.assign([TopicPartition("t", 0)])
        consumer.position(TopicPartition("t", 0))
        threading.Timer(0.3, lambda: producer.send("t", value="wake up")).start()
        started = time.monotonic()
        records = consumer.poll(timeout_ms=10_000)
        assert [r.value for r in records] == [b"wake up"] and time.monotonic() - started < 5


def test_admin_every_method(server, admin):
    assert admin.health()["status"] == "ok"
    assert admin.cluster()["nodes"]
    created = admin.create_topic("orders", partitions=2, config={"retention_ms": 3_600_000})
    assert created["name"] == "orders" and created["config"]["retention_ms"] == 3_600_000
    with pytest.raises(errors.TopicAlreadyExistsError):
        admin.create_topic("orders")
    with pytest.raises(errors.InvalidTopicError):
        admin.create_topic("__internal")
    assert "orders" in [t["name"] for t in admin.list_topics()]
    assert len(admin.describe_topic("orders")["partitions"]) == 2

    open_producer = Producer(server.url, transactional_id="team/open", **FAST)
    open_producer.init_transactions()
    open_producer.begin_transaction()
    open_producer.send("orders", value="pending", partition=1)
    open_producer.flush()
    with Producer(server.url, transactional_id="team/done", **FAST) as done:
        done.init_transactions()
        done.begin_transaction()
        done.send("orders", value="done", partition=0)
        done.commit_transaction()
    assert [t["transactional_id"] for t in admin.list_transactions(transactional_id_prefix="team/")] == [
        "team/done",
        "team/open",
    ]
    assert [t["transactional_id"] for t in admin.list_transactions(states=["Ongoing"])] == ["team/open"]
    assert admin.list_transactions(producer_id=open_producer.producer_id)[0]["transactional_id"] == "team/open"
    time.sleep(0.05)
    assert [t["transactional_id"] for t in admin.find_hanging_transactions(min_duration_ms=1)] == ["team/open"]
    assert admin.find_hanging_transactions() == [], "nothing open for 15 minutes"
    described = admin.describe_transaction("team/open")
    assert described["state"] == "Ongoing" and described["partitions"] == [{"topic": "orders", "partition": 1}]
    assert admin.describe_producers("orders", 1)[0]["current_txn_start_offset"] == 0
    aborted = admin.abort_transaction("team/open")
    assert aborted["producer_epoch"] > open_producer.producer_epoch
    with pytest.raises(errors.InvalidTxnStateError):
        admin.abort_transaction("team/open")
    with pytest.raises(errors.TransactionalIdNotFoundError):
        admin.describe_transaction("nobody")
    with pytest.raises(errors.ProducerFencedError):
        open_producer.commit_transaction()
    open_producer.close()
    assert [m["type"] for m in admin.list_markers("orders", 1)] == ["ABORT"]
    assert admin.list_offsets([TopicPartition("orders", 0)]) == {TopicPartition("orders", 0): 2}
    assert admin.list_offsets([TopicPartition("orders", 0)], timestamp=-2) == {TopicPartition("orders", 0): 0}

    with Consumer(server.url, group_id="readers", auto_offset_reset="earliest", enable_auto_commit=False) as reader:
        reader.subscribe(["orders"])
        while not reader.poll(timeout_ms=500):
            pass
        reader.commit({TopicPartition("orders", 0): 1})
        assert [g["group_id"] for g in admin.list_groups()] == ["readers"]
        group = admin.describe_group("readers")
        assert group["state"] == "Stable" and group["members"][0]["topics"] == ["orders"]
        assert admin.list_group_offsets("readers") == {TopicPartition("orders", 0): 1}
    with pytest.raises(errors.GroupIdNotFoundError):
        admin.describe_group("nobody")
    admin.delete_topic("orders")
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.describe_topic("orders")


def test_async_clients(server):
    async def scenario():
        async with AsyncAdmin(server.url) as admin:
            await admin.create_topic("a", partitions=2)
            assigned = []
            async with (
                AsyncProducer(server.url, transactional_id="async-tx", **FAST) as producer,
                AsyncConsumer(
                    server.url, group_id="async-g", auto_offset_reset="earliest", enable_auto_commit=False, **FAST
                ) as consumer,
            ):
                await producer.init_transactions()
                producer.begin_transaction()
                futures = [await producer.send("a", value=f"v{i}", key=f"k{i}") for i in range(20)]
                await producer.commit_transaction()
                offsets = [(await f).offset for f in futures]
                assert len(offsets) == 20

                async def on_assign(partitions):
                    assigned.append(partitions)

                consumer.subscribe(["a"], on_assign=on_assign)
                records = []
                while len(records) < 20:
                    records += await consumer.poll(timeout_ms=1000)
                await consumer.commit()
                committed = await consumer.committed([TopicPartition("a", 0), TopicPartition("a", 1)])
                assert sum(committed.values()) == 22, "20 records and a COMMIT marker in each partition"
                assert consumer.group_metadata() == ConsumerGroupMetadata(
                    "async-g", consumer.group_metadata().generation_id, consumer.group_metadata().member_id
                )
            assert assigned == [{TopicPartition("a", 0), TopicPartition("a", 1)}]
            return sorted(r.value for r in records)

    assert asyncio.run(scenario()) == sorted(f"v{i}".encode() for i in range(20))


def test_the_asgi_app_as_transport(database_url):
    """The pluggable transport also takes the ASGI app itself (no sockets), inside its lifespan. Its
    base URL names localhost: without authentication the server answers only requests sent to a
    loopback name (docs/api.md, Security)."""
    from app.server import create_app
    from app.settings import Settings

    async def scenario():
        app = create_app(Settings(database_url=database_url), database_url)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with AsyncAdmin("http://localhost", transport=transport) as admin:
                while (await admin.health())["status"] != "ok":  # recovery runs in the background
                    await asyncio.sleep(0.05)
                await admin.create_topic("asgi")
            async with AsyncProducer("http://localhost", transport=transport, **FAST) as producer:
                return await producer.send_and_wait("asgi", value="through ASGI")

    assert asyncio.run(scenario()) == RecordMetadata("asgi", 0, 0)


def test_a_topic_created_after_the_subscription_gets_assigned(server):
    """The server rebalances when a subscribed topic appears; the member learns it from a heartbeat."""
    with Consumer(server.url, group_id="early", auto_offset_reset="earliest", heartbeat_interval_ms=100) as consumer:
        consumer.subscribe(["later"])
        assert consumer.poll(timeout_ms=300) == [] and consumer.assignment() == set()
        with Admin(server.url) as admin:
            admin.create_topic("later")
        with Producer(server.url) as producer:
            producer.send("later", value="first").result(10)
        records, deadline = [], time.monotonic() + 5
        while not records and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=100)
        assert consumer.assignment() == {TopicPartition("later", 0)}
        assert [r.value for r in records] == [b"first"]


def test_committed_under_read_committed_waits_for_an_offset_a_transaction_is_committing(server, admin):
    """A read_committed consumer's committed() asks with require_stable, as Kafka's does (KIP-447):
    while a transaction holds an offset of the group it is not answered, and once the transaction
    commits it is that offset. Before, it answered the offset committed before the transaction, so an
    application seeking to it read again what the transaction had already consumed."""
    admin.create_topic("pending-in")
    tp = TopicPartition("pending-in", 0)
    waiting = {"group_id": "pending-group", "enable_auto_commit": False, "default_api_timeout_ms": 500, **FAST}
    with Consumer(server.url, **waiting) as consumer:
        consumer.commit({tp: OffsetAndMetadata(3, "")})
        with Producer(server.url, transactional_id="pending-committer", **FAST) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send_offsets_to_transaction({tp: OffsetAndMetadata(7, "")}, consumer.group_metadata())
            with pytest.raises(errors.TxbrokerTimeoutError, match="pending-in-0 pending in an open transaction"):
                consumer.committed([tp])
            with Consumer(server.url, isolation_level="read_uncommitted", **waiting) as uncommitted:
                assert uncommitted.committed([tp]) == {tp: 3}, "read_uncommitted: the pending offset is not visible"
            producer.commit_transaction()
        assert consumer.committed([tp]) == {tp: 7}


def test_an_async_consumers_commit_async_keeps_each_offsets_metadata(server, admin):
    """AsyncConsumer.commit_async() commits the metadata given with each offset, as commit() does
    (it kept the offsets and dropped the metadata)."""
    admin.create_topic("meta")
    tp = TopicPartition("meta", 0)

    async def scenario() -> None:
        async with AsyncConsumer(server.url, group_id="meta", enable_auto_commit=False, **FAST) as consumer:
            consumer.assign([tp])
            await consumer.commit_async({tp: OffsetAndMetadata(0, "async")})

    asyncio.run(scenario())
    fetched = httpx.post(f"{server.url}/v1/groups/meta/offsets/fetch", json={"partitions": None})
    assert [o["metadata"] for o in fetched.json()["offsets"]] == ["async"]
