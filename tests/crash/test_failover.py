"""Losing the database's primary loses nothing acknowledged (docs/operations-high-availability.md).

The test builds the supported set-up on loopback: a PostgreSQL primary and its synchronous
standby (streaming replication, `synchronous_standby_names`, synchronous_commit on), both from
the PostgreSQL that the embedded launcher runs, and a `txbroker serve` given libpq's multi-host URL
of the two. Plain, idempotent and transactional producers and a consume-transform-produce loop (the
SDK, which retries what the server answers retriable) run while the primary is SIGKILLed and the
standby promoted, as Patroni or pg_auto_failover would. Then:
- every acknowledged write, transaction commit and offset commit is there;
- transactions decided before the failover stay decided (commits visible, aborts never);
- idempotent and transactional producers wrote nothing twice; the loop copied each input once;
- no read_committed consumer ever read an aborted record;
- during the switch the server answered 503 COORDINATOR_NOT_AVAILABLE with `retriable: true`,
  never a 500, and it found the new primary by itself, its LISTEN connections included.
The same failover under unmodified Kafka clients (confluent-kafka) on the Kafka door checks the
same, and that no client call fails: each retries by itself and goes on soon after the promotion.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import asyncpg
import httpx
import pytest
from kio.schema.errors import ErrorCode as KafkaError

from app.coordinator import security_admin
from app.coordinator.acl_filters import AclFilter
from app.coordinator.audit import Actor, AuditSource
from app.coordinator.fetch import (
    LATEST_TIMESTAMP,
    AppendNotifier,
    BatchFetchPosition,
    ReplicationBarrier,
    fetch_batches,
    find_offsets,
)
from app.kafka import api_table
from app.runtime.embedded_postgres import EmbeddedPostgres
from app.runtime.listening_sockets import bound_accepting_socket
from app.storage import node_presence
from app.storage.database import CommitNotReplicated, connect_to_primary, create_pool
from app.storage.node_presence import HEARTBEAT_INTERVAL_S, LiveNode
from tests.conftest import free_ports_outside_the_ephemeral_range
from tests.kafka import exactly_once, raw_transactions
from tests.kafka.clients import create_topic
from tests.kafka.raw import RawConnection, nested, request_of
from tests.sdk.test_sdk_integration import read_all
from txbroker import Admin, Consumer, OffsetAndMetadata, Producer, TopicPartition, TxbrokerError

FAST = {"retry_backoff_ms": 20, "retry_backoff_max_ms": 300}
WORKERS = 2
STANDBY_NAME = "standby"
PROGRESS = 10  # acknowledgements each writer makes before the kill, and again after the promotion
DEADLINE_S = 60


async def _on(postgres: EmbeddedPostgres, query: str):
    connection = await asyncpg.connect(postgres.database_url.replace("/txbroker?", "/postgres?"))
    try:
        return await connection.fetch(query)
    finally:
        await connection.close()


def _sql(postgres: EmbeddedPostgres, query: str):
    return asyncio.run(_on(postgres, query))


def _until(condition, what: str, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


@pytest.fixture
def cluster():
    """A primary with a synchronous standby, TCP on loopback (the standby streams from it)."""
    root = Path(tempfile.mkdtemp(prefix="txb-ha-"))
    primary_port, standby_port = free_ports_outside_the_ephemeral_range(2)
    primary = EmbeddedPostgres(root / "primary", port=primary_port, server_settings={"listen_addresses": "127.0.0.1"})
    standby = EmbeddedPostgres(
        root / "standby",
        port=standby_port,
        server_settings={"listen_addresses": "127.0.0.1", "cluster_name": STANDBY_NAME},
        standby_of=("127.0.0.1", primary_port),
    )
    try:
        primary.start()
        standby.start()
        # Synchronous only once the standby streams: a commit waits for the standby's flush.
        _sql(primary, f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        _sql(primary, "SELECT pg_reload_conf()")
        _until(
            lambda: _sql(primary, "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"),
            "the standby to be synchronous",
        )
        yield primary, standby
    finally:
        standby.stop(immediate=True)
        primary.stop(immediate=True)
        shutil.rmtree(root, ignore_errors=True)


def _both_hosts(cluster) -> str:
    """The database URL of a node on `cluster`: libpq's multi-host form, the primary first."""
    primary, standby = cluster
    return (
        f"postgresql://txbroker@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/txbroker"
        "?target_session_attrs=read-write"
    )


class Writers:
    """The workload, each part on its own thread, recording what was acknowledged."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()  # the producers stop
        self.copier_stop = threading.Event()  # the loop stops (once it has copied everything)
        self.plain_acked: list[str] = []
        self.idempotent_acked: list[str] = []
        self.committed: list[list[str]] = []  # transactions whose commit_transaction returned
        self.aborted: list[list[str]] = []  # transactions whose abort_transaction returned
        self.unknown: list[list[str]] = []  # a commit that raised: committed or not
        self.copied = 0
        self.offsets_acked: dict[int, int] = {}  # partition -> offset of the last committed copy
        self.consumed: list[bytes] = []
        self.failures: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._guarded, args=(run,), name=run.__name__)
            for run in (self.plain, self.idempotent, self.transactional, self.copier)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join_producers(self) -> None:
        self.stop.set()
        for thread in self.threads[:3]:
            thread.join(timeout=DEADLINE_S)
        assert not any(thread.is_alive() for thread in self.threads[:3]), "a producer did not stop"
        assert not self.failures, self.failures

    def join_copier(self) -> None:
        self.stop.set()
        self.copier_stop.set()
        for thread in self.threads:
            thread.join(timeout=DEADLINE_S)
        assert not any(thread.is_alive() for thread in self.threads), "a writer did not stop"
        assert not self.failures, self.failures

    def progress(self) -> tuple[int, ...]:
        return len(self.plain_acked), len(self.idempotent_acked), len(self.committed), self.copied

    def _guarded(self, run) -> None:
        try:
            run()
        except BaseException as error:  # reported by join()
            self.failures.append(error)

    def _send_until_stopped(self, producer: Producer, topic: str, prefix: str, acked: list[str]) -> None:
        number = 0
        while not self.stop.is_set():
            value = f"{prefix}-{number}"
            number += 1
            try:
                producer.send(topic, value=value, key=value).result(DEADLINE_S)
            except TxbrokerError:
                continue  # not acknowledged: may or may not be there
            acked.append(value)

    def plain(self) -> None:
        with Producer(self.url, enable_idempotence=False, **FAST) as producer:
            self._send_until_stopped(producer, "plain", "plain", self.plain_acked)

    def idempotent(self) -> None:
        with Producer(self.url, **FAST) as producer:
            self._send_until_stopped(producer, "idempotent", "idem", self.idempotent_acked)

    def transactional(self) -> None:
        """Transactions of 3 records into the loop's input; every fourth aborted on purpose."""
        producer = Producer(self.url, transactional_id="writer", **FAST)
        producer.init_transactions()
        number = 0
        try:
            while not self.stop.is_set():
                values = [f"txn-{number}-{i}" for i in range(3)]
                abort = number % 4 == 3
                number += 1
                try:
                    producer.begin_transaction()
                    for value in values:
                        producer.send("loop-in", value=value, key=value)
                    if abort:
                        producer.abort_transaction()
                        self.aborted.append(values)
                        continue
                    producer.commit_transaction()
                    self.committed.append(values)
                except TxbrokerError:
                    # A failed abort ends aborted all the same (the next instance's init aborts
                    # what its predecessor left open); a failed commit may have committed.
                    (self.aborted if abort else self.unknown).append(values)
                    producer.close()
                    producer = Producer(self.url, transactional_id="writer", **FAST)
                    producer.init_transactions()  # fences the old instance and ends its transaction
        finally:
            producer.close()

    def copier(self) -> None:
        """Consume-transform-produce: the output and the input offsets in one transaction. After
        an error, a new producer and consumer start again from the committed offsets."""
        while not self.copier_stop.is_set():
            consumer = Consumer(
                self.url,
                group_id="copier",
                isolation_level="read_committed",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                **FAST,
            )
            producer = Producer(self.url, transactional_id="copier-0", **FAST)
            try:
                producer.init_transactions()
                consumer.subscribe(["loop-in"])
                self._copy(consumer, producer)
            except TxbrokerError:
                continue  # its transaction, if any, is aborted by the next instance's init
            finally:
                producer.close()
                consumer.close()

    def _copy(self, consumer: Consumer, producer: Producer) -> None:
        while not self.copier_stop.is_set():
            records = consumer.poll(timeout_ms=200)
            if not records:
                continue
            self.consumed += [record.value for record in records]
            producer.begin_transaction()
            for record in records:
                producer.send("loop-out", key=record.key, value=record.value.upper())
            offsets = {r.topic_partition: OffsetAndMetadata(r.offset + 1, "") for r in records}
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
            self.copied += len(records)
            for partition, offset in offsets.items():
                self.offsets_acked[partition.partition] = max(
                    self.offsets_acked.get(partition.partition, 0), offset.offset
                )


def _values(url: str, topic: str, isolation_level: str = "read_committed") -> list[str]:
    return [record.value.decode() for record in read_all(url, topic, 2, isolation_level)]


def test_the_standby_listed_first_is_passed_over_for_the_primary(cluster):
    """txbroker looks for the read-write host even when the URL does not say so (libpq's default
    `target_session_attrs` is "any", which would keep the first host: here the standby, where
    every write fails)."""
    primary, standby = cluster

    async def reached() -> tuple[bool, int]:
        connection = await connect_to_primary(
            f"postgresql://txbroker@127.0.0.1:{standby.port},127.0.0.1:{primary.port}/txbroker"
        )
        try:
            return tuple(await connection.fetchrow("SELECT pg_is_in_recovery(), inet_server_port()"))
        finally:
            await connection.close()

    assert asyncio.run(reached()) == (False, primary.port)


def test_failover_to_a_synchronous_standby_loses_nothing_acknowledged(cluster, server_process):
    primary, standby = cluster
    server = server_process("--database-url", _both_hosts(cluster), "--workers", str(WORKERS))
    with Admin(server.url) as admin:
        for topic in ("plain", "idempotent", "loop-in", "loop-out"):
            admin.create_topic(topic, partitions=2)
    writers = Writers(server.url)
    writers.start()
    try:
        _until(lambda: min(writers.progress()) >= PROGRESS, "progress before the failover", DEADLINE_S)
        before = {
            "plain": list(writers.plain_acked),
            "idempotent": list(writers.idempotent_acked),
            "committed": list(writers.committed),
            "aborted": list(writers.aborted),
            "offsets": dict(writers.offsets_acked),
        }

        # The primary dies (no shutdown code runs); until the standby is promoted there is no
        # primary: the server answers 503, retriable.
        postmaster = primary.pid
        assert postmaster is not None
        os.kill(postmaster, signal.SIGKILL)
        primary.stop()  # reaps it and releases its data dir (no shutdown runs: it is dead)
        answers = collections.Counter()

        def unavailable() -> bool:
            response = httpx.get(f"{server.url}/v1/cluster", timeout=30)
            answers[response.status_code] += 1
            if response.status_code != 503:
                return False
            assert response.json()["error"] == {
                "code": "COORDINATOR_NOT_AVAILABLE",
                "message": response.json()["error"]["message"],
                "retriable": True,
            }
            return True

        _until(unavailable, "a 503 while there is no primary")
        health = httpx.get(f"{server.url}/v1/health", timeout=30)
        assert (health.status_code, health.json()["database"]) == (503, "unreachable")
        _sql(standby, "SELECT pg_promote(wait => true)")
        assert answers.keys() <= {200, 503}, answers

        at_promotion = writers.progress()
        _until(
            lambda: all(now >= then + PROGRESS for now, then in zip(writers.progress(), at_promotion)),
            "progress after the failover",
            DEADLINE_S,
        )
        # The server's LISTEN connections (one per worker process) found the new primary too.
        _until(
            lambda: (
                _sql(standby, "SELECT count(*) AS n FROM pg_stat_activity WHERE query LIKE 'LISTEN %'")[0]["n"]
                >= WORKERS
            ),
            "the append notifiers to listen on the new primary",
        )
        writers.join_producers()
        # The loop copies what remains (every committed input, once), then stops.
        inputs = len(_values(server.url, "loop-in"))
        _until(lambda: len(_values(server.url, "loop-out")) >= inputs, "the loop to copy every input", DEADLINE_S)
    finally:
        writers.join_copier()
    assert server.process.poll() is None, "the node exited during the failover"
    # The SDK retries a 500 as it does a 503, so the clients above would not notice one: the
    # server's log would (every 500 is logged as a bug, app/api/error_handlers.py).
    server_log = server.log_path.read_text()
    assert "failed with a bug" not in server_log, server_log[-5000:]

    # Acknowledged before the failover: still there; and everything acknowledged since.
    plain = collections.Counter(_values(server.url, "plain"))
    assert set(before["plain"]) <= set(writers.plain_acked) <= set(plain)
    idempotent = collections.Counter(_values(server.url, "idempotent"))
    assert set(before["idempotent"]) <= set(writers.idempotent_acked) <= set(idempotent)
    assert max(idempotent.values()) == 1, "an idempotent producer wrote a record twice"

    # Transactions: committed ones whole and once; aborted ones never visible; unknown ones all or nothing.
    loop_in = collections.Counter(_values(server.url, "loop-in"))
    assert max(loop_in.values()) == 1, "a transactional producer wrote a record twice"
    assert all(value in loop_in for values in writers.committed for value in values)
    assert all(value in loop_in for values in before["committed"] for value in values)
    aborted = {value for values in writers.aborted for value in values}
    assert {value for values in before["aborted"] for value in values} <= aborted
    assert not aborted & loop_in.keys(), "an aborted record is visible under read_committed"
    assert not aborted & {value.decode() for value in writers.consumed}, "the loop read an aborted record"
    for values in writers.unknown:
        assert len({value in loop_in for value in values}) == 1, f"a transaction half visible: {values}"

    # The loop copied each committed input exactly once, and its offsets say so.
    loop_out = collections.Counter(_values(server.url, "loop-out"))
    assert loop_out == collections.Counter(value.upper() for value in loop_in)
    # Its offset commits: none acknowledged is lost, and they cover every input it copied.
    last_inputs = collections.defaultdict(lambda: -1)
    for record in read_all(server.url, "loop-in", 2):
        last_inputs[record.partition] = max(last_inputs[record.partition], record.offset)
    with Consumer(server.url, group_id="copier", enable_auto_commit=False) as consumer:
        committed = consumer.committed([TopicPartition("loop-in", p) for p in range(2)])
    for partition in range(2):
        offset = committed[TopicPartition("loop-in", partition)] or 0
        assert offset >= max(writers.offsets_acked.get(partition, 0), last_inputs[partition] + 1)
        assert offset >= before["offsets"].get(partition, 0)


# The Kafka clients' test: its loop's input, and how soon after the promotion each client must
# have gone on by itself (measured: within about 1 s; the bound leaves room for a loaded machine).
KAFKA_SOURCE_RECORDS = 400
KAFKA_RECOVERY_S = 30


def test_kafka_clients_carry_on_across_a_failover_exactly_once(cluster, server_process):
    """Unmodified Kafka clients (confluent-kafka: librdkafka) on the Kafka door of a node given both
    hosts: a transactional producer, a consume-transform-produce loop (read_committed input,
    send_offsets_to_transaction, every fourth transaction aborted) and an idempotent acks=all
    producer, while the primary is SIGKILLed and the standby promoted. No client call raises: each
    retries what the door answers meanwhile (COORDINATOR_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KAFKA_STORAGE_ERROR) and goes on by itself soon after the promotion, no producer instance
    replaced. Then every input is transformed once (nothing aborted read) and the group's offsets
    committed to the input's end, every acknowledged transaction is there once and whole, every
    message reported delivered once and in order, and no transaction is left open."""
    primary, standby = cluster
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        bootstrap = f"127.0.0.1:{holder.getsockname()[1]}"
        env = {"TXBROKER_KAFKA_LISTENER": bootstrap}
        node = server_process("--database-url", _both_hosts(cluster), "--workers", str(WORKERS), env=env)
        with httpx.Client(base_url=node.url, timeout=30) as client:
            server = SimpleNamespace(client=client, extra={"kafka_bootstrap": bootstrap})
            source = exactly_once.fill_source(server, "k-in", KAFKA_SOURCE_RECORDS, 2)
            for topic, partitions in (("k-out", 2), ("k-direct", 2), ("k-acked", 1)):
                create_topic(server, topic, partitions)
            loop = exactly_once.TransformLoop(server, "k-in", "k-out", 2, "k-group", "k-loop", hold_after=1)
            writer = exactly_once.TransactionalWriter(server, "0", "k-direct", 2, count=40, hold_after=1)
            acknowledged = exactly_once.AcknowledgedWriter(bootstrap, "k-acked")
            errors: list[BaseException] = []
            threads = [
                exactly_once.guarded_thread(loop.run, errors, total=KAFKA_SOURCE_RECORDS, abort_every=4),
                exactly_once.guarded_thread(writer.run, errors),
                exactly_once.guarded_thread(acknowledged.run, errors),
            ]
            try:
                for thread in threads:
                    thread.start()
                # The kill falls while each is mid-way: held after its first transaction, then let
                # go, and killed once each has committed one more.
                exactly_once.wait_for_transactions([loop, writer], 1, errors, time.monotonic() + DEADLINE_S)
                loop.go.set()
                writer.go.set()
                held = [loop.committed_transactions, writer.committed_transactions]
                exactly_once.wait_for_transactions(
                    [loop, writer], [n + 1 for n in held], errors, time.monotonic() + DEADLINE_S
                )
                at_kill = [loop.committed_transactions, writer.committed_transactions]
                delivered = len(acknowledged.delivered)
                assert not loop.done.is_set() and not writer.done.is_set(), "the failover fell after the work"
                os.kill(primary.pid, signal.SIGKILL)
                primary.stop()
                _until(lambda: httpx.get(f"{node.url}/v1/health", timeout=30).status_code == 503, "no primary")
                _sql(standby, "SELECT pg_promote(wait => true)")
                deadline = time.monotonic() + KAFKA_RECOVERY_S
                exactly_once.wait_for_transactions([loop, writer], [n + 1 for n in at_kill], errors, deadline)
                acknowledged.wait_for_deliveries(delivered + 1, errors, deadline)
                acknowledged.stop.set()
                for thread in threads:
                    thread.join(DEADLINE_S)
                assert not (stuck := exactly_once.stacks_of_the_living(threads)), stuck
                assert errors == []
            finally:
                for worker in (loop, writer, acknowledged):
                    worker.stop.set()  # a failed test leaves no thread running
            assert [loop.recoveries, writer.recoveries] == [0, 0], [loop.seen, writer.seen]
            exactly_once.assert_transformed_once(server, source, "k-out", "k-group", "k-in")
            exactly_once.assert_each_transaction_once(server, [writer], "k-direct", 2)
            acknowledged.assert_each_sent_delivered_once(server)
            states = {t["transactional_id"]: t["state"] for t in client.get("/v1/transactions").json()["transactions"]}
            assert states == {"k-loop": "CompleteCommit", "writer-0": "CompleteCommit"}, states
    assert node.process.poll() is None, "the node exited during the failover"
    server_log = node.log_path.read_text()
    assert "failed with a bug" not in server_log and "unexpected error" not in server_log, server_log[-5000:]


def _one_worker_with_a_topic(cluster, server_process, topic: str, partitions: int, env: dict | None = None):
    """A one-worker `txbroker serve` given both hosts of `cluster`, with `topic` created."""
    server = server_process("--database-url", _both_hosts(cluster), "--workers", "1", env=env)
    with Admin(server.url) as admin:
        admin.create_topic(topic, partitions=partitions)
    return server


def _wal_receiver_pid(standby: EmbeddedPostgres) -> int:
    return _sql(standby, "SELECT pid FROM pg_stat_wal_receiver")[0]["pid"]


@contextlib.contextmanager
def _confirming_nothing(standby: EmbeddedPostgres, afterwards: signal.Signals = signal.SIGCONT):
    """The standby's WAL receiver stopped within the block: the primary's commits wait for a
    confirmation that does not come. Then (also after a failure, as stopped it would keep the
    standby up) `afterwards`: SIGCONT, it catches up; SIGKILL, for a failover (the WAL it received
    but did not write goes with it)."""
    wal_receiver = _wal_receiver_pid(standby)
    os.kill(wal_receiver, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(wal_receiver, afterwards)


def _unconfirmed_twice(primary: EmbeddedPostgres, send) -> list:
    """The answers of `send()` and of its retry, each one's COMMIT's wait for the standby cancelled
    (within `_confirming_nothing`)."""
    return [_answer_of_a_cancelled_wait(primary, send) for _attempt in ("first", "retry")]


def test_readers_see_only_what_the_synchronous_standby_has(cluster, server_process):
    """A commit the standby never confirmed becomes visible on the primary when its wait for the
    standby ends otherwise (here its session is terminated, as by an operator, a pooler, a fast
    shutdown; a statement_timeout cancels it alike). No reader is answered it: not a fetch, not a
    long poll woken by its notification, not ListOffsets, not the Kafka door's fetch. The failover
    then loses it, and its offset goes to another record, which nobody confuses with it."""
    primary, standby = cluster
    topic = "unconfirmed"
    server = _one_worker_with_a_topic(cluster, server_process, topic, 1)
    records_url = f"{server.url}/v1/topics/{topic}/records"
    httpx.post(records_url, json={"partition": 0, "records": [{"value": "kept"}]}, timeout=30).raise_for_status()
    answered: list[str] = []  # every record value any reader was answered

    def fetched(offset: int, isolation_level: str, max_wait_ms: int = 0) -> dict:
        body = {
            "partitions": [{"topic": topic, "partition": 0, "offset": offset}],
            "isolation_level": isolation_level,
            "max_wait_ms": max_wait_ms,
        }
        response = httpx.post(f"{server.url}/v1/fetch", json=body, timeout=60)
        response.raise_for_status()
        [entry] = response.json()["partitions"]
        answered.extend(record["value"] for record in entry["records"])
        return entry

    assert [r["value"] for r in fetched(0, "read_committed")["records"]] == ["kept"]

    # The standby stops confirming: a produce's COMMIT waits for it, visible to no other session.
    with _confirming_nothing(standby, afterwards=signal.SIGKILL):
        _read_nothing_unconfirmed(server.url, primary, topic, fetched)
        # The failover: the primary dies; the standby, which never wrote the record (its WAL,
        # received but unread, goes with the stopped WAL receiver), is promoted.
        os.kill(primary.pid, signal.SIGKILL)
        primary.stop()
    _until(lambda: _promoted(standby), "the standby's promotion", DEADLINE_S)

    def produced_again() -> list[int] | None:
        response = httpx.post(records_url, json={"partition": 0, "records": [{"value": "after"}]}, timeout=30)
        return [response.json()["base_offset"]] if response.status_code == 200 else None

    assert _until(produced_again, "a produce on the new primary", DEADLINE_S) == [1]  # the lost record's offset
    values = [r["value"] for r in fetched(0, "read_uncommitted")["records"]]
    assert values == ["kept", "after"], values  # "lost" is gone, its offset 1 taken by "after"
    assert "lost" not in answered, answered


def _read_nothing_unconfirmed(server_url: str, primary: EmbeddedPostgres, topic: str, fetched) -> None:
    """While the standby confirms nothing: a produce whose wait ends otherwise is visible on the
    primary, and no reader is answered it (`fetched` records what it answers)."""
    records_url = f"{server_url}/v1/topics/{topic}/records"
    long_poll = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    try:
        waiting_reader = long_poll.submit(fetched, 1, "read_uncommitted", 4000)
        producer = long_poll.submit(
            httpx.post, records_url, json={"partition": 0, "records": [{"value": "lost"}]}, timeout=60
        )
        [waiting] = _until(
            lambda: _sql(primary, "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'"),
            "the produce's commit to wait for the standby",
        )
        assert not producer.done()
        # Its wait ends without the standby: committed on the primary, the producer not answered.
        _sql(primary, f"SELECT pg_terminate_backend({waiting['pid']})")
        assert producer.result().status_code == 503
        _until(lambda: asyncio.run(_high_watermark(primary, topic)) == 2, "the record to be visible on the primary")

        for isolation_level in ("read_uncommitted", "read_committed"):
            entry = fetched(1, isolation_level)
            assert (entry["records"], entry["high_watermark"], entry["next_offset"]) == ([], 1, 1), entry
        one = httpx.get(f"{records_url.replace('/records', '')}/partitions/0/records?offset=1", timeout=60).json()
        assert (one["records"], one["high_watermark"]) == ([], 1), one
        listed = httpx.post(
            f"{server_url}/v1/offsets/list",
            json={"partitions": [{"topic": topic, "partition": 0, "timestamp": -1}]},
            timeout=60,
        ).json()["partitions"]
        assert listed[0]["error"]["code"] == "OFFSET_NOT_AVAILABLE", listed
        assert listed[0]["error"]["retriable"] is True
        assert asyncio.run(_kafka_doors_reads(primary, topic)) == ([], 1, "OFFSET_NOT_AVAILABLE")
        woken = waiting_reader.result()
        assert (woken["records"], woken["high_watermark"]) == ([], 1), woken
    finally:
        long_poll.shutdown(wait=True)


async def _high_watermark(postgres: EmbeddedPostgres, topic: str) -> int:
    connection = await asyncpg.connect(postgres.database_url)
    try:
        return await connection.fetchval(
            "SELECT p.high_watermark FROM partitions p JOIN topics t USING (topic_id) WHERE t.name = $1", topic
        )
    finally:
        await connection.close()


async def _kafka_doors_reads(postgres: EmbeddedPostgres, topic: str) -> tuple[list, int, str]:
    """What the Kafka door's Fetch (fetch_batches, which its read ahead feeds) and ListOffsets
    (find_offsets) answer from offset 1, against the primary, with a barrier of their own."""
    pool = await create_pool(postgres.database_url, 2)
    notifier = AppendNotifier(postgres.database_url, 1.0)
    barrier = ReplicationBarrier(pool)
    try:
        position = BatchFetchPosition(topic, 0, 1, 1 << 20)
        [fetched] = await fetch_batches(pool, notifier, barrier, [position], {topic: None}, False, 0, 1, 1 << 20)
        [latest] = await find_offsets(pool, barrier, [(topic, 0, LATEST_TIMESTAMP)], "read_uncommitted")
    finally:
        await barrier.stop()  # its COMMIT waits for the standby, which does not confirm
        await pool.close()
    return fetched.batches, fetched.state.high_watermark, latest.error.code.name


def _promoted(standby: EmbeddedPostgres) -> bool:
    """Promotes the standby once it accepts connections again (its WAL receiver's death restarted
    its processes); True once it is the primary."""
    try:
        if _sql(standby, "SELECT pg_is_in_recovery() AS standby")[0]["standby"]:
            _sql(standby, "SELECT pg_promote(wait => true)")
        return not _sql(standby, "SELECT pg_is_in_recovery() AS standby")[0]["standby"]
    except (OSError, asyncpg.PostgresError):
        return False


def test_the_sdk_retries_offsets_the_standby_has_not_confirmed(cluster, server_process):
    """While the synchronous standby confirms nothing, ListOffsets answers the partition
    OFFSET_NOT_AVAILABLE, retriable: the SDK's consumer and admin retry it (within
    default_api_timeout_ms) until the standby is back, as they retry the contract's other
    retriable errors and Kafka's consumer retries it. Before, the partition's error was raised at
    once (OffsetNotAvailableError) from end_offsets(), seek_to_end(), Admin.list_offsets()..."""
    primary, standby = cluster
    tp = TopicPartition("standby-away", 0)
    server = _one_worker_with_a_topic(cluster, server_process, tp.topic, 1)
    with Producer(server.url, **FAST) as producer:
        producer.send(tp.topic, value="confirmed").result(30)
    with (
        Consumer(server.url, **FAST) as consumer,
        Admin(server.url, **FAST) as admin,
        concurrent.futures.ThreadPoolExecutor(max_workers=2) as calls,
    ):
        with _confirming_nothing(standby):
            end_offsets = calls.submit(consumer.end_offsets, [tp])
            listed = calls.submit(admin.list_offsets, [tp])
            time.sleep(3)  # the server waits 1 s for a confirmation: each was answered OFFSET_NOT_AVAILABLE
            assert not end_offsets.done() and not listed.done(), (end_offsets, listed)
        assert end_offsets.result(30) == {tp: 1} and listed.result(30) == {tp: 1}


def test_a_barrier_whose_wait_was_cancelled_confirms_nothing(cluster):
    """A COMMIT whose wait for the standby is cancelled returns as if it had been confirmed (with a
    WARNING): the barrier then commits another, and confirms only once the standby has it."""
    primary, standby = cluster

    async def waiting_for_the_standby(condition, what: str) -> list:
        deadline = time.monotonic() + 10
        while not condition(
            rows := await _on(primary, "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
        ):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)
        return rows

    async def run() -> None:
        pool = await create_pool(primary.database_url, 2)
        barrier = ReplicationBarrier(pool)
        [receiver] = await _on(standby, "SELECT pid FROM pg_stat_wal_receiver")
        wal_receiver = receiver["pid"]
        try:
            assert await barrier.confirm(10) and barrier.committed == 1
            os.kill(wal_receiver, signal.SIGSTOP)
            try:
                confirmed = asyncio.create_task(barrier.confirm(60))
                [first] = await waiting_for_the_standby(bool, "a barrier to wait")
                await _on(primary, f"SELECT pg_cancel_backend({first['pid']})")
                await asyncio.sleep(0.5)  # its COMMIT returned, with the WARNING; the next one began
                await waiting_for_the_standby(lambda rows: rows == [first], "the next barrier, on its connection")
                assert not confirmed.done() and barrier.committed == 1
                assert await barrier.confirm(0.5) is False
            finally:
                os.kill(wal_receiver, signal.SIGCONT)
            assert await confirmed and barrier.committed == 2
        finally:
            await barrier.stop()
            await pool.close()

    asyncio.run(run())


def test_without_a_synchronous_standby_no_barrier_is_committed(database_url):
    """The embedded PostgreSQL (no standby): reads are confirmed at once, at no cost."""

    async def run() -> int:
        pool = await create_pool(database_url, 2)
        barrier = ReplicationBarrier(pool)
        try:
            assert all([await barrier.confirm(1) for _ in range(20)])
            return barrier.committed
        finally:
            await barrier.stop()
            await pool.close()

    assert asyncio.run(run()) == 0


def test_a_write_whose_wait_for_the_standby_was_cancelled_is_not_acknowledged(cluster, server_process):
    """A COMMIT whose wait for the synchronous standby is cancelled (pg_cancel_backend here; asyncpg
    cancelling a cancelled task's query, a timeout during the wait alike) returns success with a
    WARNING, its transaction committed on the primary alone. The write is not acknowledged: its request answers
    503 COORDINATOR_NOT_AVAILABLE, retriable, whatever the path (an idempotent produce in its
    PostgreSQL transaction, a plain produce in one statement, a topic's creation). The failover then
    loses it, and the idempotent producer's retry writes it exactly once."""
    primary, standby = cluster
    topic = "unreplicated"
    server = _one_worker_with_a_topic(cluster, server_process, topic, 2)  # two, as _values reads
    issued = httpx.post(f"{server.url}/v1/producers/init", json={"transactional_id": None}, timeout=30).json()

    def produce_idempotent(value: str, sequence: int) -> httpx.Response:
        body = {
            "producer_id": issued["producer_id"],
            "producer_epoch": issued["producer_epoch"],
            "partitions": [{"topic": topic, "partition": 0, "base_sequence": sequence, "records": [{"value": value}]}],
        }
        return httpx.post(f"{server.url}/v1/produce", json=body, timeout=60)

    def produce_plain(value: str) -> httpx.Response:
        body = {"partition": 0, "records": [{"value": value}]}
        return httpx.post(f"{server.url}/v1/topics/{topic}/records", json=body, timeout=60)

    def create_topic(name: str) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/topics", json={"name": name, "partitions": 1}, timeout=60)

    assert produce_idempotent("confirmed", 0).status_code == 200

    with _confirming_nothing(standby, afterwards=signal.SIGKILL):
        for send in (
            lambda: produce_idempotent("unconfirmed", 1),
            lambda: produce_plain("unconfirmed plain"),
            lambda: create_topic("unconfirmed-topic"),
        ):
            response = _answer_of_a_cancelled_wait(primary, send)
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", response.text
            assert response.json()["error"]["retriable"] is True
        # All three committed on the primary, the standby confirming none of them.
        assert asyncio.run(_high_watermark(primary, topic)) == 3
        assert asyncio.run(_high_watermark(primary, "unconfirmed-topic")) == 0
        os.kill(primary.pid, signal.SIGKILL)
        primary.stop()
    _until(lambda: _promoted(standby), "the standby's promotion", DEADLINE_S)

    def retried() -> dict | None:
        response = produce_idempotent("unconfirmed", 1)
        return response.json()["partitions"][0] if response.status_code == 200 else None

    written = _until(retried, "the idempotent produce's retry on the new primary", DEADLINE_S)
    assert (written["error"], written["base_offset"], written["duplicate"]) == (None, 1, False), written
    again = produce_idempotent("unconfirmed", 1).json()["partitions"][0]
    assert (again["base_offset"], again["duplicate"]) == (1, True), again
    assert _values(server.url, topic, "read_uncommitted") == ["confirmed", "unconfirmed"]
    assert create_topic("unconfirmed-topic").status_code == 201  # it was lost with the primary


def _answer_of_a_cancelled_wait(primary: EmbeddedPostgres, send):
    """`send()`'s answer (or what it raised), its COMMIT's wait for the (stopped) standby cancelled as
    an operator would. Fails at once when `send()` is answered before any commit of its waits."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as sender:
        answer = sender.submit(send)

        def waiting() -> list:
            if answer.done():
                pytest.fail(f"answered without waiting for the standby: {_described(answer)}")
            return _sql(primary, "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")

        [waiting] = _until(waiting, "the write's commit to wait for the standby")
        _sql(primary, f"SELECT pg_cancel_backend({waiting['pid']})")
        return answer.result()


def _described(answer: concurrent.futures.Future) -> str:
    if answer.exception() is not None:
        return repr(answer.exception())
    result = answer.result()
    return f"{result.status_code} {result.text}" if isinstance(result, httpx.Response) else repr(result)


def test_a_retry_that_finds_its_write_done_is_answered_once_the_standby_has_it(cluster, server_process):
    """A write whose COMMIT's wait for the standby was cancelled is answered 503 (above), and its
    client retries it. The retry finds it done on the primary and answers from what it reads there:
    an idempotent or transactional producer's batch its duplicate's offsets, an AddPartitionsToTxn the
    partition already in, an EndTxn the transaction's outcome, a transactional producer's epoch bump
    (KIP-360) the epoch it issued; nothing new to write (an OffsetCommit writes its offsets again). Yet it is not
    answered before the standby has what it read: its write batch or unit takes row locks (the
    partitions', the transactional id's), which give its PostgreSQL transaction an id and a WAL record, so its
    COMMIT waits for the standby past the earlier commit; here that wait is cancelled in turn, and the
    retry answers 503 again. Once the standby has it all, the next retry is answered, and each write
    is there once."""
    primary, standby = cluster
    topic = "retried"
    server = _one_worker_with_a_topic(cluster, server_process, topic, 2)  # two, as _values reads
    idempotent = httpx.post(f"{server.url}/v1/producers/init", json={"transactional_id": None}, timeout=30).json()
    transactional = httpx.post(f"{server.url}/v1/producers/init", json={"transactional_id": "t"}, timeout=30).json()
    txn = {"transactional_id": "t", **transactional}

    def produce(producer: dict, value: str, sequence: int) -> httpx.Response:
        body = {
            **producer,
            "partitions": [{"topic": topic, "partition": 0, "base_sequence": sequence, "records": [{"value": value}]}],
        }
        return httpx.post(f"{server.url}/v1/produce", json=body, timeout=60)

    def add_partition() -> httpx.Response:
        body = {**txn, "partitions": [{"topic": topic, "partition": 0}]}
        return httpx.post(f"{server.url}/v1/txn/add-partitions", json=body, timeout=60)

    def commit() -> httpx.Response:
        return httpx.post(f"{server.url}/v1/txn/end", json={**txn, "committed": True}, timeout=60)

    def bump_after_the_commit() -> httpx.Response:
        ended = answers["an EndTxn"].json()  # the ids the next transaction uses (KIP-360 bumps from them)
        body = {"transactional_id": "t", "producer_id": ended["producer_id"], "producer_epoch": ended["producer_epoch"]}
        return httpx.post(f"{server.url}/v1/producers/init", json=body, timeout=60)

    def commit_offset() -> httpx.Response:
        body = {"offsets": [{"topic": topic, "partition": 0, "offset": 2}]}
        return httpx.post(f"{server.url}/v1/groups/retried-group/offsets/commit", json=body, timeout=60)

    writes = {
        "an idempotent produce": lambda: produce(idempotent, "idempotent", 0),
        "an AddPartitionsToTxn": add_partition,
        "a transactional produce": lambda: produce(txn, "transactional", 0),
        "an EndTxn": commit,
        "a transactional producer's epoch bump": bump_after_the_commit,
        "an OffsetCommit": commit_offset,
    }
    answers = {}
    for what, send in writes.items():
        with _confirming_nothing(standby):
            for response in _unconfirmed_twice(primary, send):
                assert response.status_code == 503, f"{what}: {response.text}"
                assert response.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", response.text
        answers[what] = send()
        assert answers[what].status_code == 200, f"{what}: {answers[what].text}"
    [duplicate] = answers["an idempotent produce"].json()["partitions"]
    assert (duplicate["base_offset"], duplicate["duplicate"]) == (0, True), duplicate
    assert answers["an AddPartitionsToTxn"].json()["partitions"][0]["error"] is None
    [duplicate] = answers["a transactional produce"].json()["partitions"]
    assert (duplicate["base_offset"], duplicate["duplicate"]) == (1, True), duplicate
    assert answers["an EndTxn"].json()["state"] == "CompleteCommit"
    ended = answers["an EndTxn"].json()
    assert answers["a transactional producer's epoch bump"].json()["producer_epoch"] == ended["producer_epoch"] + 1
    assert answers["an OffsetCommit"].json()["offsets"][0]["error"] is None
    assert sorted(_values(server.url, topic)) == ["idempotent", "transactional"]


def test_the_kafka_doors_retries_that_find_their_write_done_wait_for_the_standby_too(cluster, server_process):
    """The Kafka door's transactional producer, as the test above: each request whose COMMIT's wait for
    the standby was cancelled answers its API's retriable code, and so does its retry, which finds the
    request done on the primary and writes nothing new (its write batch's or unit's row locks make
    its COMMIT wait for the standby all the same, and that wait is cancelled too); once the standby
    has it all, the retry is answered, and the transaction commits its record and offset once."""
    primary, standby = cluster
    topic = "kafka-retried"
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        bootstrap = f"127.0.0.1:{holder.getsockname()[1]}"
        server = _one_worker_with_a_topic(
            cluster,
            server_process,
            topic,
            2,
            env={"TXBROKER_KAFKA_LISTENER": bootstrap},  # two, as _values reads
        )
        with RawConnection(bootstrap) as connection:
            producer = raw_transactions.init_producer(connection, "kafka-retried")
            retriable, appended = KafkaError.coordinator_not_available, KafkaError.not_enough_replicas_after_append
            writes = {  # each request: what it answers unconfirmed, and once confirmed
                "AddPartitionsToTxn": (
                    lambda: raw_transactions.add_partitions(connection, producer, topic, [0]),
                    [retriable],
                    [KafkaError.none],
                ),
                "Produce": (
                    lambda: raw_transactions.produce(connection, producer, topic, 0, [b"once"], 0),
                    appended,
                    KafkaError.none,
                ),
                "AddOffsetsToTxn": (
                    lambda: raw_transactions.add_offsets(connection, producer, "kafka-retried-group"),
                    retriable,
                    KafkaError.none,
                ),
                "TxnOffsetCommit": (
                    lambda: raw_transactions.txn_offset_commit(connection, producer, "kafka-retried-group", topic, 1),
                    [retriable],
                    [KafkaError.none],
                ),
                "EndTxn": (
                    lambda: raw_transactions.end_txn(connection, producer, True, 3).error_code,
                    retriable,
                    KafkaError.none,
                ),
            }
            for what, (send, unconfirmed, confirmed) in writes.items():
                with _confirming_nothing(standby):
                    assert _unconfirmed_twice(primary, send) == [unconfirmed] * 2, what
                assert send() == confirmed, what
    assert _values(server.url, topic) == ["once"]
    with Consumer(server.url, group_id="kafka-retried-group", enable_auto_commit=False) as consumer:
        assert consumer.committed([TopicPartition(topic, 0)])[TopicPartition(topic, 0)] == 1


def test_an_acl_removal_retried_after_an_unconfirmed_one_is_answered_once_the_standby_has_it(cluster, server_process):
    """Kafka's DeleteAcls answers each filter with the rules it removed (security_admin.remove_acls,
    in one transaction for all its filters). Its retry after a removal whose COMMIT's wait for the standby
    was cancelled (not acknowledged) finds nothing left to remove: a PostgreSQL transaction that only
    read has nothing for its COMMIT to wait for, so its answer (no rule matches, which a client takes
    for "gone") would come while the standby still has the rule, which a failover brings back. A
    removal that finds nothing waits for the standby as a write does: while the standby confirms
    nothing it is not answered, and after the failover the rule is there and is removed, once."""
    primary, standby = cluster
    server = _one_worker_with_a_topic(cluster, server_process, "guarded", 1)
    rule = {"principal": "reader", "resource_type": "Topic", "resource_name": "guarded", "operation": "Read"}
    httpx.post(f"{server.url}/v1/acls", json=rule, timeout=30).raise_for_status()
    url = _both_hosts(cluster)
    of_the_rule = AclFilter("Topic", "literal", "guarded", "reader")

    def remove() -> list:
        async def removed() -> list:
            pool = await create_pool(url, 1)
            try:
                [removed] = await security_admin.remove_acls(pool, Actor("admin", AuditSource.KAFKA), [of_the_rule])
                return removed
            finally:
                pool.terminate()  # a pool whose commit waits for the stopped standby does not close

        return asyncio.run(removed())

    with _confirming_nothing(standby, afterwards=signal.SIGKILL):
        with pytest.raises(CommitNotReplicated):
            _answer_of_a_cancelled_wait(primary, remove)  # removed on the primary alone
        with pytest.raises(CommitNotReplicated):
            _answer_of_a_cancelled_wait(primary, remove)  # the retry: nothing matches, and it waited
        os.kill(primary.pid, signal.SIGKILL)
        primary.stop()
    _until(lambda: _promoted(standby), "the standby's promotion", DEADLINE_S)
    [back] = remove()  # on the new primary: the failover lost the removal, and the rule is back
    assert (back.principal, back.resource_name, back.operation) == ("reader", "guarded", "Read")
    assert remove() == []


def test_an_epoch_bump_retried_after_an_unconfirmed_one_is_answered_once_the_standby_has_it(cluster, server_process):
    """An idempotent producer bumps its own epoch (KIP-360: InitProducerId with its id and epoch, no
    transactional id). The retry of a bump whose answer was lost is answered the epoch that bump
    issued, bumping nothing (a read): after a bump whose COMMIT's wait for the standby was cancelled
    (answered 503), that answer would come while the standby still has the old epoch, which a
    failover brings back. It waits for the standby as a write does; after the failover the retry
    bumps the epoch there, once."""
    primary, standby = cluster
    server = _one_worker_with_a_topic(cluster, server_process, "bumped", 1)
    issued = httpx.post(f"{server.url}/v1/producers/init", json={"transactional_id": None}, timeout=30).json()

    def bump() -> httpx.Response:
        body = {"transactional_id": None, "producer_id": issued["producer_id"], "producer_epoch": 0}
        return httpx.post(f"{server.url}/v1/producers/init", json=body, timeout=60)

    with _confirming_nothing(standby, afterwards=signal.SIGKILL):
        for response in _unconfirmed_twice(primary, bump):
            assert response.status_code == 503, response.text
        os.kill(primary.pid, signal.SIGKILL)
        primary.stop()
    _until(lambda: _promoted(standby), "the standby's promotion", DEADLINE_S)
    bumped = _until(lambda: (r := bump()).status_code == 200 and r.json(), "the bump on the new primary", DEADLINE_S)
    assert bumped == {"producer_id": issued["producer_id"], "producer_epoch": 1}
    assert bump().json() == bumped  # its retry, answered what it issued


def test_committed_offsets_are_answered_once_the_standby_has_them(cluster, server_process):
    """Regression: OffsetFetch read a group's committed offsets on the primary and answered them at
    once. An offset whose commit the standby never confirmed (its wait cancelled: the committer was
    answered 503) was then handed to a consumer, which a failover could leave positioned past inputs
    whose transaction's output it lost, skipped for good. An OffsetFetch now answers once the standby
    has what it read: while the standby confirms nothing, 503 COORDINATOR_NOT_AVAILABLE (retriable)
    after its wait; once it has caught up, the offset. Regression too: HTTP's describe of the group
    (`GET /v1/groups/{group_id}`, the CLI's and the SDK's describe_group) answered the same offset,
    and its lag, at once; it waits as OffsetFetch does."""
    primary, standby = cluster
    topic = "offsets-confirmed"
    server = _one_worker_with_a_topic(cluster, server_process, topic, 1)
    commits = f"{server.url}/v1/groups/confirmed-group/offsets/commit"
    fetches = f"{server.url}/v1/groups/confirmed-group/offsets/fetch"
    described = f"{server.url}/v1/groups/confirmed-group"
    wanted = {"partitions": [{"topic": topic, "partition": 0}]}

    def commit(offset: int) -> httpx.Response:
        return httpx.post(commits, json={"offsets": [{"topic": topic, "partition": 0, "offset": offset}]}, timeout=60)

    def describe() -> httpx.Response:
        return httpx.get(described, timeout=60)

    assert commit(1).status_code == 200
    with _confirming_nothing(standby):
        assert _answer_of_a_cancelled_wait(primary, lambda: commit(2)).status_code == 503
        for read in (lambda: httpx.post(fetches, json=wanted, timeout=60), describe):
            answer = read()
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", answer.text
    confirmed = _until(
        lambda: (answer := httpx.post(fetches, json=wanted, timeout=60)).status_code == 200 and answer,
        "the offsets once the standby caught up",
    )
    assert [entry["offset"] for entry in confirmed.json()["offsets"]] == [2]
    assert [entry["offset"] for entry in describe().json()["offsets"]] == [2]


def test_a_first_commit_wins_answer_waits_for_the_standby_to_have_the_first_commit(cluster, server_process):
    """An OffsetCommit with require_advance (the Spark data source's decision records) answers from
    the committed offset it finds: the very commit already there, repeated, "written" (nothing
    written again); another at or below it OFFSET_NOT_ADVANCED ("another was first"). Both read a
    commit that may be on the primary alone (its wait for the standby cancelled: its writer was
    answered 503): answered at once, a failover could lose it, and Spark's driver would take a
    decision the new primary lacks for recorded, or another's for the outcome. Neither is answered
    before the standby has what it read (the commit locks the group's __consumer_offsets partition,
    so its COMMIT waits for the standby past the first); here those waits are cancelled too, and
    each answers 503. The failover loses the first commit, and the refused one is then written."""
    primary, standby = cluster
    topic = "first-wins"
    server = _one_worker_with_a_topic(cluster, server_process, topic, 1)
    commits = f"{server.url}/v1/groups/first-wins-group/offsets/commit"
    fetches = f"{server.url}/v1/groups/first-wins-group/offsets/fetch"

    def commit(offset: int, metadata: str) -> httpx.Response:
        entry = {"topic": topic, "partition": 0, "offset": offset, "metadata": metadata}
        return httpx.post(commits, json={"offsets": [entry], "require_advance": True}, timeout=60)

    assert commit(1, "confirmed").json()["offsets"][0]["error"] is None
    with _confirming_nothing(standby, afterwards=signal.SIGKILL):
        for what, send in {
            "the first commit": lambda: commit(5, "first"),
            "its repeat": lambda: commit(5, "first"),
            "another commit of its offset": lambda: commit(5, "second"),
            "a commit below it": lambda: commit(4, "second"),
        }.items():
            response = _answer_of_a_cancelled_wait(primary, send)
            assert response.status_code == 503, f"{what}: {response.text}"
            assert response.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", f"{what}: {response.text}"
        os.kill(primary.pid, signal.SIGKILL)
        primary.stop()
    _until(lambda: _promoted(standby), "the standby's promotion", DEADLINE_S)
    written = _until(lambda: (r := commit(5, "second")).status_code == 200 and r, "the commit on the new primary")
    assert written.json()["offsets"][0]["error"] is None, written.text  # the first was lost: this one is first
    assert commit(5, "first").json()["offsets"][0]["error"]["code"] == "OFFSET_NOT_ADVANCED"
    wanted = {"partitions": [{"topic": topic, "partition": 0}]}
    [committed] = httpx.post(fetches, json=wanted, timeout=60).json()["offsets"]
    assert (committed["offset"], committed["metadata"]) == (5, "second"), committed


def test_an_abort_retried_after_an_unconfirmed_one_is_refused_once_the_standby_has_it(cluster, server_process):
    """An operator's abort (`POST /v1/transactions/{id}/abort`, kafka-transactions.sh abort) naming
    the producer it saw, retried after an abort whose COMMIT's wait for the standby was cancelled
    (answered 503), finds the producer fenced and nothing open: INVALID_TXN_STATE, which the
    two-phase client's abort_open (the Spark data source's sweep) takes for "not open, done". It was
    answered at once, the refusal rolled back (a rollback waits for no standby), while the standby
    still had the transaction open: a failover brought it back, Prepared for good (a Prepared
    transaction never times out) and holding back its partitions' last stable offset, with the
    sweep believing it aborted. The refusal now waits for the standby as a write does; after the
    failover the transaction is open again, and the abort aborts it. (The producer's own EndTxn
    abort, refused PRODUCER_FENCED, which two_phase's abort() also takes for done, waited already:
    its write batch locks the id and commits.)"""
    primary, standby = cluster
    topic = "swept"
    server = _one_worker_with_a_topic(cluster, server_process, topic, 1)
    issued = httpx.post(f"{server.url}/v1/producers/init", json={"transactional_id": "swept"}, timeout=30).json()
    txn = {"transactional_id": "swept", **issued}
    added = {**txn, "partitions": [{"topic": topic, "partition": 0}]}
    httpx.post(f"{server.url}/v1/txn/add-partitions", json=added, timeout=30).raise_for_status()
    body = {**txn, "partitions": [{"topic": topic, "partition": 0, "base_sequence": 0, "records": [{"value": "x"}]}]}
    httpx.post(f"{server.url}/v1/produce", json=body, timeout=30).raise_for_status()
    as_listed = {"producer_id": issued["producer_id"], "producer_epoch": issued["producer_epoch"]}

    def abort() -> httpx.Response:
        return httpx.post(f"{server.url}/v1/transactions/swept/abort", params=as_listed, timeout=60)

    def abort_as_its_producer() -> httpx.Response:  # two_phase's abort(): PRODUCER_FENCED is "done" to it
        return httpx.post(f"{server.url}/v1/txn/end", json={**txn, "committed": False}, timeout=60)

    with _confirming_nothing(standby, afterwards=signal.SIGKILL):
        for response in [
            *_unconfirmed_twice(primary, abort),
            _answer_of_a_cancelled_wait(primary, abort_as_its_producer),
        ]:
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", response.text
        os.kill(primary.pid, signal.SIGKILL)
        primary.stop()
    _until(lambda: _promoted(standby), "the standby's promotion", DEADLINE_S)
    described = _until(
        lambda: (r := httpx.get(f"{server.url}/v1/transactions/swept", timeout=60)).status_code == 200 and r.json(),
        "the transaction on the new primary",
        DEADLINE_S,
    )
    assert described["state"] == "Ongoing", described  # the failover lost the abort
    aborted = abort()
    assert aborted.status_code == 200 and aborted.json()["state"] == "CompleteAbort", aborted.text
    assert abort().json()["error"]["code"] == "INVALID_TXN_STATE"


def _announced_on(postgres: EmbeddedPostgres) -> list[LiveNode]:
    """The nodes live on that server's database, as a node reading it lists them."""

    async def run() -> list[LiveNode]:
        connection = await asyncpg.connect(postgres.database_url)
        try:
            return await node_presence.live_nodes(connection)
        finally:
            await connection.close()

    return asyncio.run(run())


def test_a_node_announces_itself_on_the_new_primary_when_the_old_one_keeps_running(cluster, server_process):
    """Regression: a node's presence (its announcing connection, coordinator/cluster_nodes.py) stayed
    on the old primary when a failover left that one running (set read-only here; a demoted primary
    alike), its heartbeats succeeding there, while the other nodes, whose pools had moved to the new
    primary, no longer listed it (never again: its clients' Metadata lost it). Each heartbeat now
    asks whether its server takes writes, and the node announces itself again on the read-write
    server of its URL within a heartbeat or two, leaving the old one."""
    primary, standby = cluster
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        env = {"TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}", "TXBROKER_NODE_ID": "7"}
        _one_worker_with_a_topic(cluster, server_process, "announced", 1, env=env)
        node = LiveNode(7, "127.0.0.1", port, (("PLAINTEXT", "127.0.0.1", port),))  # its one listener
        _until(lambda: _announced_on(primary) == [node], "node 7 announced on the primary")
        assert _announced_on(standby) == []  # a standby's pg_stat_activity has the sessions on it alone

        # A switch-over that leaves the old primary running: set read-only (its open sessions too,
        # by the reload), then the standby promoted.
        _sql(primary, "ALTER SYSTEM SET default_transaction_read_only = on")
        _sql(primary, "SELECT pg_reload_conf()")
        _sql(standby, "SELECT pg_promote()")
        _until(
            lambda: _announced_on(standby) == [node],
            "node 7 announced on the new primary",
            timeout_s=3 * HEARTBEAT_INTERVAL_S + 5,
        )
        # Its presence left the old primary: nothing announces it where no node looks any more.
        _until(lambda: _announced_on(primary) == [], "node 7's presence to leave the old primary", timeout_s=5)


def test_transaction_topic_and_console_reads_are_answered_once_the_standby_has_them(cluster, server_process):
    """Regression: the reads an operator or a tool acts on were answered from the primary at once.
    After a commit whose wait for the standby was cancelled (its producer answered 503), they showed
    what a failover takes back: the transaction CompleteCommit (it comes back Ongoing, its records
    uncommitted), the topic's high watermark past the commit marker (it goes back), the producer's
    transaction over, the marker; HTTP's transaction description and listing, its topic description
    and listing, its producers and markers, the console's pages, and Kafka's DescribeTransactions, ListTransactions and
    DescribeProducers. Each now waits for the standby as OffsetFetch does: while it confirms nothing,
    a retriable error after 1 s (HTTP 503 COORDINATOR_NOT_AVAILABLE, the console's 503 page that
    loads itself again, the Kafka code that Kafka's admin client retries for each API); once it has
    caught up, the committed state."""
    primary, standby = cluster
    topic = "described"
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        bootstrap = f"127.0.0.1:{holder.getsockname()[1]}"
        server = _one_worker_with_a_topic(cluster, server_process, topic, 1, env={"TXBROKER_KAFKA_LISTENER": bootstrap})
    issued = httpx.post(f"{server.url}/v1/producers/init", json={"transactional_id": "shown"}, timeout=30).json()
    txn = {"transactional_id": "shown", **issued}
    body = {**txn, "partitions": [{"topic": topic, "partition": 0, "base_sequence": 0, "records": [{"value": "x"}]}]}
    httpx.post(f"{server.url}/v1/produce", json=body, timeout=30).raise_for_status()  # adds its partition
    http_reads = {
        "a transaction's description": "/v1/transactions/shown",
        "the transactions' list": "/v1/transactions",
        "a topic's description": f"/v1/topics/{topic}",
        "the topics' list": "/v1/topics",
        "a partition's producers": f"/v1/topics/{topic}/partitions/0/producers",
        "a partition's markers": f"/v1/topics/{topic}/partitions/0/markers",
        "the console's transaction page": "/console/transactions/shown",
        "the console's overview": "/console",
        "the console's partition page": f"/console/topics/{topic}/partitions/0",
    }

    def read(path: str) -> httpx.Response:
        return httpx.get(f"{server.url}{path}", timeout=60)

    def committed() -> httpx.Response:
        return httpx.post(f"{server.url}/v1/txn/end", json={**txn, "committed": True}, timeout=60)

    key = api_table.DESCRIBE_PRODUCERS
    kafka_reads = {
        "DescribeTransactions": (
            request_of(api_table.DESCRIBE_TRANSACTIONS, 0, transactional_ids=("shown",)),
            lambda response: response.transaction_states[0].error_code,
        ),
        "ListTransactions": (
            request_of(api_table.LIST_TRANSACTIONS, 0, state_filters=(), producer_id_filters=()),
            lambda response: response.error_code,
        ),
        "DescribeProducers": (
            request_of(key, 0, topics=(nested(key, 0, "TopicRequest", name=topic, partition_indexes=(0,)),)),
            lambda response: response.topics[0].partitions[0].error_code,
        ),
    }
    retried_by_kafkas_admin = {
        "DescribeTransactions": KafkaError.coordinator_not_available,
        "ListTransactions": KafkaError.coordinator_load_in_progress,
        "DescribeProducers": KafkaError.not_leader_or_follower,
    }
    with _confirming_nothing(standby), concurrent.futures.ThreadPoolExecutor(len(http_reads)) as readers:
        assert _answer_of_a_cancelled_wait(primary, committed).status_code == 503
        # Committed on the primary alone: the marker is there, the transaction complete.
        assert asyncio.run(_high_watermark(primary, topic)) == 2
        started = time.monotonic()
        for what, answer in zip(http_reads, readers.map(read, http_reads.values())):
            assert answer.status_code == 503, f"{what}: {answer.status_code} {answer.text[:500]}"
            if not what.startswith("the console"):
                assert answer.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", f"{what}: {answer.text}"
        assert time.monotonic() - started >= 1  # each waited for the standby's confirmation first
        with RawConnection(bootstrap) as connection:
            for what, (request, error_of) in kafka_reads.items():
                assert error_of(connection.call(request)) == retried_by_kafkas_admin[what], what
    # The standby caught up: every read answers, the commit confirmed.
    assert _until(lambda: read("/v1/transactions/shown").status_code == 200, "the standby to catch up")
    assert read("/v1/transactions/shown").json()["state"] == "CompleteCommit"
    for what, path in http_reads.items():
        assert read(path).status_code == 200, what
    [partition] = read(f"/v1/topics/{topic}").json()["partitions"]
    assert partition["high_watermark"] == 2, partition
    # The next transaction open (kio reads no complete one's start time of -1, as Kafka answers it).
    described = read("/v1/transactions/shown").json()
    bumped = described["producer_epoch"] != issued["producer_epoch"]  # the commit bumped it (KIP-890)
    body.update(producer_id=described["producer_id"], producer_epoch=described["producer_epoch"])
    body["partitions"][0]["base_sequence"] = 0 if bumped else 1
    produced = httpx.post(f"{server.url}/v1/produce", json=body, timeout=30)
    assert produced.status_code == 200, produced.text
    with RawConnection(bootstrap) as connection:
        for what, (request, error_of) in kafka_reads.items():
            assert error_of(connection.call(request)) == KafkaError.none, what


def test_a_topic_not_found_is_answered_once_the_standby_has_its_deletion(cluster, server_process):
    """Regression: a read that found no topic answered UNKNOWN_TOPIC_OR_PARTITION at once, the
    barrier skipped with the error. After a DeleteTopics whose commit's wait for the standby was
    cancelled (answered 503), HTTP's topic description, producers and markers, the console's topic
    and partition pages (404) and Kafka's DescribeProducers (UNKNOWN_TOPIC_OR_PARTITION) said the
    topic was gone, which a failover brings back with its records. Each now waits for the standby,
    as the reads that find rows do (and as DescribeTransactions does for an id not found): a
    retriable error while it confirms nothing, not found once it has caught up."""
    primary, standby = cluster
    topic = "deleted-unconfirmed"
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        bootstrap = f"127.0.0.1:{holder.getsockname()[1]}"
        server = _one_worker_with_a_topic(cluster, server_process, topic, 1, env={"TXBROKER_KAFKA_LISTENER": bootstrap})
    http_reads = {
        "a topic's description": f"/v1/topics/{topic}",
        "a partition's producers": f"/v1/topics/{topic}/partitions/0/producers",
        "a partition's markers": f"/v1/topics/{topic}/partitions/0/markers",
        "the console's topic page": f"/console/topics/{topic}",
        "the console's partition page": f"/console/topics/{topic}/partitions/0",
    }
    key = api_table.DESCRIBE_PRODUCERS
    describe_producers = request_of(
        key, 0, topics=(nested(key, 0, "TopicRequest", name=topic, partition_indexes=(0,)),)
    )

    def read(path: str) -> httpx.Response:
        return httpx.get(f"{server.url}{path}", timeout=60)

    def deleted() -> httpx.Response:
        return httpx.delete(f"{server.url}/v1/topics/{topic}", timeout=60)

    with _confirming_nothing(standby), concurrent.futures.ThreadPoolExecutor(len(http_reads)) as readers:
        assert _answer_of_a_cancelled_wait(primary, deleted).status_code == 503  # deleted on the primary alone
        for what, answer in zip(http_reads, readers.map(read, http_reads.values())):
            assert answer.status_code == 503, f"{what}: {answer.status_code} {answer.text[:500]}"
            if not what.startswith("the console"):
                assert answer.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", f"{what}: {answer.text}"
        with RawConnection(bootstrap) as connection:
            [answered] = connection.call(describe_producers).topics[0].partitions
            assert answered.error_code == KafkaError.not_leader_or_follower, answered
    # The standby caught up: the deletion is confirmed, and every read says so.
    assert _until(lambda: read(f"/v1/topics/{topic}").status_code == 404, "the standby to catch up")
    for what, path in http_reads.items():
        assert read(path).status_code == 404, what
    with RawConnection(bootstrap) as connection:
        [answered] = connection.call(describe_producers).topics[0].partitions
        assert answered.error_code == KafkaError.unknown_topic_or_partition, answered


def test_a_group_not_found_is_answered_once_the_standby_has_its_deletion(cluster, server_process):
    """Regression: HTTP's describe of a group found none and answered 404 GROUP_ID_NOT_FOUND at
    once, the barrier skipped with the error. After a group deletion whose commit's wait for the
    standby was cancelled (answered 503), it said the group was gone, which a failover brings back
    with its committed offsets. It now waits for the standby, as the describe of a group found
    does: a retriable error while it confirms nothing, not found once it has caught up."""
    primary, standby = cluster
    topic, group = "group-deleted-unconfirmed", "deleted-unconfirmed"
    server = _one_worker_with_a_topic(cluster, server_process, topic, 1)
    committed = httpx.post(
        f"{server.url}/v1/groups/{group}/offsets/commit",
        json={"offsets": [{"topic": topic, "partition": 0, "offset": 0}]},
        timeout=60,
    )
    assert committed.json()["offsets"][0]["error"] is None, committed.text

    def described() -> httpx.Response:
        return httpx.get(f"{server.url}/v1/groups/{group}", timeout=60)

    assert described().status_code == 200
    with _confirming_nothing(standby):
        deleted = _answer_of_a_cancelled_wait(
            primary, lambda: httpx.delete(f"{server.url}/v1/groups/{group}", timeout=60)
        )
        assert deleted.status_code == 503, deleted.text  # deleted on the primary alone
        answer = described()
        assert answer.status_code == 503, f"{answer.status_code} {answer.text[:500]}"
        assert answer.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", answer.text
    assert _until(lambda: described().status_code == 404, "the standby to catch up")


def _answer_or_closed(bootstrap: str, request):
    """The Kafka door's answer to `request` on a connection of its own, or "closed" when it closes
    the connection instead (a read the standby has not confirmed, for an API whose clients retry no
    error code of its answer)."""
    with RawConnection(bootstrap) as connection:
        try:
            return connection.call(request)
        except ConnectionError:
            return "closed"


def test_metadata_group_config_and_security_reads_are_answered_once_the_standby_has_them(cluster, server_process):
    """Regression: the reads of topics (Metadata, HTTP's topic names), groups (ListGroups,
    DescribeGroups, HTTP's groups list), configs (DescribeConfigs) and security (HTTP's principals,
    API keys, SCRAM credentials, ACL rules and audit log; DescribeAcls, DescribeUserScramCredentials)
    were answered from the primary at once. After writes whose commits' waits for the standby were
    cancelled (each answered 503), they showed what a failover takes back: a topic with its config
    and partitions, a group, a principal with its credential and an ACL rule. Each now waits for the
    standby: while it confirms nothing, a retriable error after 1 s (HTTP 503
    COORDINATOR_NOT_AVAILABLE; Metadata LEADER_NOT_AVAILABLE for the topic asked, ListGroups
    COORDINATOR_LOAD_IN_PROGRESS, DescribeGroups COORDINATOR_NOT_AVAILABLE; the connection closed, as
    while PostgreSQL is away, for Metadata of every topic and for the admin APIs whose error codes
    Kafka's admin client does not retry); once it has caught up, what was written."""
    primary, standby = cluster
    topic, group, principal = "appeared", "appeared-group", "appeared-principal"
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        bootstrap = f"127.0.0.1:{holder.getsockname()[1]}"
        server = _one_worker_with_a_topic(
            cluster, server_process, "present", 1, env={"TXBROKER_KAFKA_LISTENER": bootstrap}
        )
    rule = {"principal": principal, "resource_type": "Topic", "resource_name": topic, "operation": "Read"}
    writes = {
        "a topic's creation": lambda: httpx.post(
            f"{server.url}/v1/topics",
            json={"name": topic, "partitions": 3, "config": {"retention_ms": 4321}},
            timeout=60,
        ),
        "a group's first commit": lambda: httpx.post(
            f"{server.url}/v1/groups/{group}/offsets/commit",
            json={"offsets": [{"topic": "present", "partition": 0, "offset": 0}]},
            timeout=60,
        ),
        "a principal's creation": lambda: httpx.post(
            f"{server.url}/v1/principals", json={"name": principal, "super_user": False}, timeout=60
        ),
        "a SCRAM credential": lambda: httpx.put(
            f"{server.url}/v1/principals/{principal}/scram-credentials/SCRAM-SHA-256",
            json={"password": "not-yet-replicated"},
            timeout=60,
        ),
        "an ACL rule": lambda: httpx.post(f"{server.url}/v1/acls", json=rule, timeout=60),
    }
    http_reads = {
        "the cluster's topic names": "/v1/cluster",
        "the groups' list": "/v1/groups",
        "the principals": "/v1/principals",
        "a principal's API keys": f"/v1/principals/{principal}/keys",
        "a principal's SCRAM credentials": f"/v1/principals/{principal}/scram-credentials",
        "the ACL rules": "/v1/acls",
        "the audit log": "/v1/audit",
    }
    metadata, describe_configs = api_table.METADATA, api_table.DESCRIBE_CONFIGS
    any_ = 1  # DescribeAcls' ANY (resource type, pattern type, operation, permission)
    kafka_reads = {
        "Metadata of the topic": request_of(
            metadata,
            12,
            topics=(nested(metadata, 12, "MetadataRequestTopic", name=topic, topic_id=None),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
        "Metadata of every topic": request_of(
            metadata, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        ),
        "DescribeConfigs": request_of(
            describe_configs,
            4,
            resources=(
                nested(
                    describe_configs,
                    4,
                    "DescribeConfigsResource",
                    resource_type=2,  # a topic
                    resource_name=topic,
                    configuration_keys=("retention.ms",),
                ),
            ),
            include_synonyms=False,
            include_documentation=False,
        ),
        "ListGroups": request_of(api_table.LIST_GROUPS, 4, states_filter=()),
        "DescribeGroups": request_of(
            api_table.DESCRIBE_GROUPS, 5, groups=(group,), include_authorized_operations=False
        ),
        "DescribeAcls": request_of(
            api_table.DESCRIBE_ACLS,
            1,
            resource_type_filter=any_,
            resource_name_filter=None,
            pattern_type_filter=any_,
            principal_filter=None,
            host_filter=None,
            operation=any_,
            permission_type=any_,
        ),
        "DescribeUserScramCredentials": request_of(api_table.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=None),
    }

    def read(path: str) -> httpx.Response:
        return httpx.get(f"{server.url}{path}", timeout=60)

    def unconfirmed_answer(what: str, answer) -> object:
        """What the Kafka read `what` answers about what the unconfirmed writes wrote."""
        if answer == "closed":
            return answer
        if what == "Metadata of the topic":
            [described] = answer.topics
            return described.error_code, len(described.partitions)
        if what == "ListGroups":
            return answer.error_code, group in [g.group_id for g in answer.groups]
        if what == "DescribeGroups":
            [described] = answer.groups
            return described.error_code
        return answer  # answered at all: each of the others closes its connection

    with _confirming_nothing(standby), concurrent.futures.ThreadPoolExecutor(len(http_reads)) as readers:
        for what, write in writes.items():
            answer = _answer_of_a_cancelled_wait(primary, write)  # written on the primary alone
            assert answer.status_code == 503, f"{what}: {answer.status_code} {answer.text}"
        started = time.monotonic()
        for what, answer in zip(http_reads, readers.map(read, http_reads.values())):
            assert answer.status_code == 503, f"{what}: {answer.status_code} {answer.text[:500]}"
            assert answer.json()["error"]["code"] == "COORDINATOR_NOT_AVAILABLE", f"{what}: {answer.text}"
        assert time.monotonic() - started >= 1  # each waited for the standby's confirmation first
        answered = {what: unconfirmed_answer(what, _answer_or_closed(bootstrap, r)) for what, r in kafka_reads.items()}
        assert answered == {
            "Metadata of the topic": (KafkaError.leader_not_available, 0),
            "Metadata of every topic": "closed",
            "DescribeConfigs": "closed",
            "ListGroups": (KafkaError.coordinator_load_in_progress, False),
            "DescribeGroups": KafkaError.coordinator_not_available,
            "DescribeAcls": "closed",
            "DescribeUserScramCredentials": "closed",
        }
    # The standby caught up: every read answers what was written.
    assert _until(lambda: read("/v1/cluster").status_code == 200, "the standby to catch up")
    assert topic in read("/v1/cluster").json()["topics"]
    assert group in [g["group_id"] for g in read("/v1/groups").json()["groups"]]
    assert principal in [p["name"] for p in read("/v1/principals").json()["principals"]]
    assert read(f"/v1/principals/{principal}/keys").json()["keys"] == []
    assert [c["mechanism"] for c in read(f"/v1/principals/{principal}/scram-credentials").json()["credentials"]] == [
        "SCRAM-SHA-256"
    ]
    assert [a["principal"] for a in read("/v1/acls").json()["acls"]] == [principal]
    assert read("/v1/audit").status_code == 200
    confirmed = {what: _answer_or_closed(bootstrap, request) for what, request in kafka_reads.items()}
    [described] = confirmed["Metadata of the topic"].topics
    assert (described.error_code, len(described.partitions)) == (KafkaError.none, 3)
    assert topic in [t.name for t in confirmed["Metadata of every topic"].topics]
    [configs] = confirmed["DescribeConfigs"].results
    assert [(c.name, c.value) for c in configs.configs] == [("retention.ms", "4321")]
    assert group in [g.group_id for g in confirmed["ListGroups"].groups]
    [described] = confirmed["DescribeGroups"].groups
    assert (described.error_code, described.group_state) == (KafkaError.none, "Empty")
    assert [r.resource_name for r in confirmed["DescribeAcls"].resources] == [topic]
    assert [r.user for r in confirmed["DescribeUserScramCredentials"].results] == [principal]


def test_a_removal_retried_is_refused_not_found_once_the_standby_has_the_removal(cluster, server_process):
    """Regression: the retry of a removal whose commit's wait for the standby was cancelled (the
    first attempt answered 503) found nothing to remove and answered 404 at once: a key revoked, an
    ACL rule removed, a SCRAM credential or a principal deleted, said gone, which a failover brings
    back. The retry's 404 now comes once the standby has the removal: while it confirms nothing the
    retry waits (as a write's commit does), and answers 404 when it has caught up."""
    primary, standby = cluster
    server = _one_worker_with_a_topic(cluster, server_process, "present", 1)
    url = server.url
    name = "removed-principal"
    httpx.post(f"{url}/v1/principals", json={"name": name, "super_user": False}, timeout=60).raise_for_status()
    key_id = httpx.post(f"{url}/v1/principals/{name}/keys", timeout=60).json()["key_id"]
    rule = {"principal": name, "resource_type": "Topic", "resource_name": "present", "operation": "Read"}
    acl_id = httpx.post(f"{url}/v1/acls", json=rule, timeout=60).json()["acl_id"]
    scram = f"{url}/v1/principals/{name}/scram-credentials/SCRAM-SHA-256"
    httpx.put(scram, json={"password": "to-be-deleted"}, timeout=60).raise_for_status()
    removals = {  # in an order that leaves each one's target in place until its turn
        "a key's revocation": lambda: httpx.delete(f"{url}/v1/principals/{name}/keys/{key_id}", timeout=60),
        "an ACL rule's removal": lambda: httpx.delete(f"{url}/v1/acls/{acl_id}", timeout=60),
        "a SCRAM credential's deletion": lambda: httpx.delete(scram, timeout=60),
        "a principal's deletion": lambda: httpx.delete(f"{url}/v1/principals/{name}", timeout=60),
    }
    for what, remove in removals.items():
        with _confirming_nothing(standby):
            first = _answer_of_a_cancelled_wait(primary, remove)
            assert first.status_code == 503, f"{what}: {first.status_code} {first.text}"
            # The retry finds nothing to remove; its refusal waits for the standby like a commit.
            retried = _answer_of_a_cancelled_wait(primary, remove)
            assert retried.status_code == 503, f"{what}'s retry: {retried.status_code} {retried.text}"
        assert _until(lambda remove=remove: remove().status_code == 404, f"{what}: the standby to catch up")
