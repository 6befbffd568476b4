"""The Spark sink's exactly-once protocol (spark_client.commit_protocol) driven directly, without Spark:
task attempts and driver commits/aborts interleaved at the crash points that matter, against a real
server over HTTP on a real PostgreSQL. (test_spark_write.py and test_spark_streaming.py run the same
protocol under Spark.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from spark_client import commit_protocol, job_outcome, recover  # noqa: E402
from spark_client.commit_protocol import (  # noqa: E402
    IncompleteCommitError,
    TaskAttempt,
    abort_batch,
    commit_batch,
    write_task,
)
from spark_client.decisions import Decision, DecisionLog, SinkBatch, SinkStateError  # noqa: E402
from spark_client.options import ConnectionOptions, WriteOptions  # noqa: E402
from tests.sdk.test_sdk_faults import OddAnswers  # noqa: E402
from txbroker import Admin, Consumer, Producer, TopicPartition, TwoPhaseClient, errors  # noqa: E402

TOPIC = "out"


@pytest.fixture
def options(server) -> WriteOptions:
    with Admin(server.url) as admin:
        admin.create_topic(TOPIC, partitions=2)
    return WriteOptions(ConnectionOptions(server.url), TOPIC, "sink")


def rows(*values: str, partition: int = 0) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"value": list(values), "partition": [partition] * len(values)})]


def committed_values(url: str) -> list[str]:
    values = []
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(TOPIC, p) for p in (0, 1)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            values += [r.value.decode() for r in consumer.poll(timeout_ms=200)]
    return sorted(values)


def open_transactions(url: str) -> list[str]:
    with TwoPhaseClient(url) as client:
        return [t["transactional_id"] for t in client.list("sink/")]


def decide(options: WriteOptions, batch: SinkBatch, messages) -> None:
    """The driver's decision alone: what a driver that crashed right after recording it leaves."""

    async def record():
        async with DecisionLog(options.connection, batch) as decisions:
            await decisions.record(batch.batch_id, [m.transaction for m in messages if m.transaction])

    asyncio.run(record())


def orphan(url: str, batch: SinkBatch, partition: int, attempt: int, *, prepare: bool) -> None:
    """A task attempt that died after writing (Ongoing) or after preparing (Prepared): Spark tells nobody."""
    producer = Producer(url, transactional_id=batch.transactional_id(partition, attempt, 100 + attempt))
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(TOPIC, f"orphan-{partition}-{attempt}", partition=partition)
    if prepare:
        producer.prepare_transaction()
    else:
        producer.flush()
    producer.close()


def test_commit_keeps_the_winners_and_aborts_failed_attempts(server, options):
    batch = SinkBatch("sink", TOPIC, 0)
    orphan(server.url, batch, 0, 0, prepare=False)
    orphan(server.url, batch, 1, 0, prepare=True)
    messages = [
        write_task(options, batch, iter(rows("a", "b", partition=0)), TaskAttempt(0, 1, 7)),
        write_task(options, batch, iter(rows("c", partition=1)), TaskAttempt(1, 1, 8)),
        write_task(options, batch, iter([]), TaskAttempt(2, 0, 9)),
    ]
    assert [m.rows for m in messages] == [2, 1, 0] and messages[2].transaction is None
    assert committed_values(server.url) == []  # prepared, not yet visible
    commit_batch(options, batch, messages)
    assert committed_values(server.url) == ["a", "b", "c"]
    assert open_transactions(server.url) == []
    commit_batch(options, batch, messages)  # Spark re-commits the same batch id: nothing changes
    abort_batch(options, batch, messages)  # and an abort after the commit does not undo it
    assert committed_values(server.url) == ["a", "b", "c"]


def test_a_driver_crash_after_the_decision_is_rolled_forward_by_the_rerun(server, options):
    batch = SinkBatch("sink", TOPIC, 4)
    first_run = [
        write_task(options, batch, iter(rows("a", partition=0)), TaskAttempt(0, 0, 1)),
        write_task(options, batch, iter(rows("b", partition=1)), TaskAttempt(1, 0, 2)),
    ]
    decide(options, batch, first_run)
    with TwoPhaseClient(server.url) as client:
        client.commit(first_run[0].transaction)  # ... the driver died after the first commit
    orphan(server.url, batch, 0, 1, prepare=True)  # a speculative attempt it never heard of
    assert committed_values(server.url) == ["a"]

    # Spark re-runs batch 4 with the same offsets: the tasks find the decision and write nothing.
    rerun = [
        write_task(options, batch, iter(rows("a", partition=0)), TaskAttempt(0, 0, 1)),
        write_task(options, batch, iter(rows("b", partition=1)), TaskAttempt(1, 0, 2)),
    ]
    assert all(m.skipped and m.transaction is None for m in rerun)
    commit_batch(options, batch, rerun)
    assert committed_values(server.url) == ["a", "b"]
    assert open_transactions(server.url) == []


def test_abort_without_a_decision_aborts_every_attempt_of_the_batch(server, options):
    batch = SinkBatch("sink", TOPIC, 2)
    done = write_task(options, batch, iter(rows("x", partition=0)), TaskAttempt(0, 0, 1))
    orphan(server.url, batch, 1, 0, prepare=False)
    abort_batch(options, batch, [done, None])
    assert open_transactions(server.url) == []
    assert committed_values(server.url) == []


def test_abort_after_a_recorded_decision_rolls_it_forward(server, options):
    batch = SinkBatch("sink", TOPIC, 3)
    messages = [write_task(options, batch, iter(rows("kept", partition=1)), TaskAttempt(1, 0, 1))]
    decide(options, batch, messages)
    abort_batch(options, batch, [None])  # Spark's abort after a commit that raised late
    assert committed_values(server.url) == ["kept"]


def test_a_zombie_attempt_that_prepares_after_the_decision_aborts_itself(server, options, monkeypatch):
    batch = SinkBatch("sink", TOPIC, 5)
    winner = write_task(options, batch, iter(rows("w", partition=0)), TaskAttempt(0, 0, 1))
    commit_batch(options, batch, [winner])
    # A speculative attempt that read "undecided" before the decision, and prepares after it:
    real_read, calls = commit_protocol._read_decision, []

    def read_decision(write_options, read_batch):
        calls.append(read_batch)
        return None if len(calls) == 1 else real_read(write_options, read_batch)

    monkeypatch.setattr(commit_protocol, "_read_decision", read_decision)
    zombie = write_task(options, batch, iter(rows("zombie", partition=0)), TaskAttempt(0, 1, 2))
    assert zombie.skipped and zombie.transaction is None
    assert committed_values(server.url) == ["w"]
    assert open_transactions(server.url) == []


def test_an_attempt_that_prepares_after_a_batch_writes_abort_aborts_itself(server, options, monkeypatch):
    batch = SinkBatch("sink", TOPIC, job="job-cccc")
    failed_job = [write_task(options, batch, iter(rows("x", partition=0)), TaskAttempt(0, 0, 1)), None]
    # A speculative attempt of partition 1, killed by Spark when the job failed, whose worker was still
    # running: it read "undecided" before the driver's abort, and prepares after the abort's sweep.
    real_read, calls = commit_protocol._read_decision, []

    def read_decision(write_options, read_batch):
        calls.append(read_batch)
        if len(calls) == 1:
            abort_batch(options, batch, failed_job)
            return None
        return real_read(write_options, read_batch)

    monkeypatch.setattr(commit_protocol, "_read_decision", read_decision)
    straggler = write_task(options, batch, iter(rows("late", partition=1)), TaskAttempt(1, 1, 2))
    assert straggler.skipped and straggler.transaction is None
    # Nobody would ever complete a Prepared one: it would hold back partition 1's last stable offset.
    assert open_transactions(server.url) == []
    assert committed_values(server.url) == []
    assert recover(server.url, "sink", TOPIC) == {"committed": [], "aborted": [], "left": []}


def test_a_batch_older_than_the_sinks_decision_is_refused(server, options):
    later = SinkBatch("sink", TOPIC, 9)
    commit_batch(options, later, [write_task(options, later, iter(rows("9")), TaskAttempt(0, 0, 1))])
    earlier = SinkBatch("sink", TOPIC, 2)  # a reset checkpoint with the same sink_id
    with pytest.raises(SinkStateError, match="already committed batch 9"):
        write_task(options, earlier, iter(rows("2")), TaskAttempt(0, 0, 2))
    assert committed_values(server.url) == ["9"]


def test_recover_finishes_a_batch_write_whose_driver_died(server, options):
    decided = SinkBatch("sink", TOPIC, job="job-aaaa")
    messages = [
        write_task(options, decided, iter(rows("d0", partition=0)), TaskAttempt(0, 0, 1)),
        write_task(options, decided, iter(rows("d1", partition=1)), TaskAttempt(1, 0, 2)),
    ]
    orphan(server.url, decided, 1, 1, prepare=True)
    decide(options, decided, messages)
    undecided = SinkBatch("sink", TOPIC, job="job-bbbb")
    write_task(options, undecided, iter(rows("u", partition=0)), TaskAttempt(0, 0, 3))

    report = recover(server.url, "sink", TOPIC)
    assert sorted(report["committed"]) == sorted(m.transaction.transactional_id for m in messages)
    assert report["aborted"] == [decided.transactional_id(1, 1, 101)]
    assert report["left"] == [undecided.transactional_id(0, 0, 3)]
    assert committed_values(server.url) == ["d0", "d1"]

    report = recover(server.url, "sink", TOPIC, abort_undecided=True)
    assert report["aborted"] == [undecided.transactional_id(0, 0, 3)]
    assert open_transactions(server.url) == []
    assert committed_values(server.url) == ["d0", "d1"]


def test_job_outcome_says_whether_a_batch_write_committed(server, options):
    # What a job whose commit's outcome was UNKNOWN needs to know before it is run again.
    committed, aborted, running = (SinkBatch("sink", TOPIC, job=f"job-{n}") for n in ("c", "a", "r"))
    commit_batch(options, committed, [write_task(options, committed, iter(rows("c")), TaskAttempt(0, 0, 1))])
    abort_batch(options, aborted, [write_task(options, aborted, iter(rows("a")), TaskAttempt(0, 0, 2))])
    write_task(options, running, iter(rows("r")), TaskAttempt(0, 0, 3))
    outcomes = [job_outcome(server.url, "sink", TOPIC, batch.job) for batch in (committed, aborted, running)]
    assert outcomes == ["committed", "not committed", "undecided"]
    with pytest.raises(ValueError, match="job-<hex>"):
        job_outcome(server.url, "sink", TOPIC, "7")


def test_a_decided_transaction_aborted_by_an_operator_fails_the_commit_loudly(server, options):
    batch = SinkBatch("sink", TOPIC, 6)
    messages = [write_task(options, batch, iter(rows("lost", partition=0)), TaskAttempt(0, 0, 1))]
    decide(options, batch, messages)
    with TwoPhaseClient(server.url) as client:
        assert client.abort_open(messages[0].transaction.transactional_id)  # kafka-transactions.sh abort
    with pytest.raises(SinkStateError, match="rows are lost"):
        commit_batch(options, batch, messages)


def recorded_decision(options: WriteOptions, batch: SinkBatch) -> Decision | None:
    async def read():
        async with DecisionLog(options.connection, batch) as decisions:
            return await decisions.read()

    return asyncio.run(read())


class LateDecision(OddAnswers):
    """A real HTTP proxy in front of the server that holds back the driver's decision records that
    name transactions (offset commits of a group `txbroker-spark.*`): none reaches the server, and
    each goes unanswered (the connection closed), as a request stuck on its way is to the driver,
    which gives up on it. The first is kept, and `deliver()` sends it to the server when the test
    says: that request arriving late. Everything else is forwarded, an abort's empty decision too.
    With `deliver_after_next_read`, the next decision read is forwarded and answered by the server,
    then the held record delivered, and only then is the read answered: the late record lands
    between that reader's read and its next call."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.held: tuple[str, bytes] | None = None
        self.late_answer: dict | None = None
        self.deliver_after_next_read = False

    def _answer(self, handler) -> None:
        path = handler.path
        if not path.startswith("/v1/groups/txbroker-spark."):
            super()._answer(handler)
            return
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        if path.endswith("/offsets/commit") and self.late_answer is None:
            if json.loads(json.loads(body)["offsets"][0]["metadata"])["txns"]:
                self.held = self.held or (path, body)
                handler.close_connection = True  # no answer
                return
        answer = self._upstream.post(path, content=body, headers={"Content-Type": "application/json"})
        if path.endswith("/offsets/fetch") and self.deliver_after_next_read:
            self.deliver_after_next_read = False
            self.deliver()
        self._reply(handler, answer.status_code, {"Content-Type": "application/json"}, answer.content)

    def deliver(self) -> dict:
        """The held record reaches the server; its answer (which nobody waits for any more)."""
        path, body = self.held
        answer = self._upstream.post(path, content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 200, answer.text
        self.late_answer = answer.json()["offsets"][0]
        return self.late_answer


@pytest.fixture
def late_decision(server):
    proxy = LateDecision(server.url)
    yield proxy
    proxy.close()


def through(proxy: LateDecision, options: WriteOptions) -> WriteOptions:
    """The driver's calls through the proxy, giving up on an unanswered record within a second."""
    return replace(options, connection=ConnectionOptions(proxy.url, request_timeout_ms=500), commit_timeout_ms=1000)


def commit_given_up(options: WriteOptions, proxy: LateDecision, batch: SinkBatch, messages) -> None:
    """The driver's commit, whose decision records all go unanswered: it fails saying the outcome
    is unknown, the first record held back by the proxy."""
    with pytest.raises(IncompleteCommitError, match="is UNKNOWN"):
        commit_batch(through(proxy, options), batch, messages)
    assert proxy.held is not None


def test_a_jobs_decision_record_arriving_after_its_abort_recorded_the_empty_one_is_refused(
    server, options, late_decision
):
    batch = SinkBatch("sink", TOPIC, job="job-late")
    messages = [
        write_task(options, batch, iter(rows("a", partition=0)), TaskAttempt(0, 0, 1)),
        write_task(options, batch, iter(rows("b", partition=1)), TaskAttempt(1, 0, 2)),
    ]
    commit_given_up(options, late_decision, batch, messages)
    abort_batch(through(late_decision, options), batch, messages)  # Spark's abort: no decision found
    assert job_outcome(server.url, "sink", TOPIC, batch.job) == "not committed"
    # The commit's first record reaches the server now. It was written over the abort's decision
    # (last writer wins): the job read "committed" with transactions its abort had aborted, and
    # rolling it forward failed saying someone else (an operator?) had aborted them.
    late = late_decision.deliver()
    assert late["error"] is not None and late["error"]["code"] == "OFFSET_NOT_ADVANCED", late
    assert job_outcome(server.url, "sink", TOPIC, batch.job) == "not committed"
    assert recover(server.url, "sink", TOPIC) == {"committed": [], "aborted": [], "left": []}
    assert committed_values(server.url) == []
    assert open_transactions(server.url) == []


def test_a_jobs_decision_record_arriving_between_its_aborts_read_and_record_stands(server, options, late_decision):
    batch = SinkBatch("sink", TOPIC, job="job-between")
    messages = [
        write_task(options, batch, iter(rows("a", partition=0)), TaskAttempt(0, 0, 1)),
        write_task(options, batch, iter(rows("b", partition=1)), TaskAttempt(1, 0, 2)),
    ]
    commit_given_up(options, late_decision, batch, messages)
    late_decision.deliver_after_next_read = True
    # The abort finds no decision; the commit's record lands; the abort's empty one is refused, and
    # the abort rolls the commit's forward. It wrote the empty decision over the commit's, whose
    # outcome changed after it was recorded.
    abort_batch(through(late_decision, options), batch, messages)
    assert late_decision.late_answer["error"] is None
    assert job_outcome(server.url, "sink", TOPIC, batch.job) == "committed"
    assert committed_values(server.url) == ["a", "b"]
    assert open_transactions(server.url) == []


def test_recover_decides_an_undecided_job_first_so_that_its_commits_late_record_is_refused(
    server, options, late_decision
):
    batch = SinkBatch("sink", TOPIC, job="job-recovered")
    messages = [write_task(options, batch, iter(rows("a", partition=0)), TaskAttempt(0, 0, 1))]
    commit_given_up(options, late_decision, batch, messages)
    # Spark's abort never ran (the driver died): the job is undecided, and recover aborts it.
    assert job_outcome(server.url, "sink", TOPIC, batch.job) == "undecided"
    report = recover(server.url, "sink", TOPIC, abort_undecided=True)
    assert report["aborted"] == [messages[0].transaction.transactional_id]
    # The commit's first record reaches the server now. It was written: the job read "committed"
    # with the transaction recover had aborted.
    late = late_decision.deliver()
    assert late["error"] is not None and late["error"]["code"] == "OFFSET_NOT_ADVANCED", late
    assert job_outcome(server.url, "sink", TOPIC, batch.job) == "not committed"
    assert committed_values(server.url) == []
    assert open_transactions(server.url) == []


def test_a_jobs_commit_whose_decision_is_refused_after_an_abort_recorded_its_own_says_it_is_not_committed(
    server, options, monkeypatch
):
    batch = SinkBatch("sink", TOPIC, job="job-raced")
    messages = [write_task(options, batch, iter(rows("a", partition=0)), TaskAttempt(0, 0, 1))]
    # An abort of the job records its empty decision between the commit's read and its record.
    real_read, reads = DecisionLog.read, []

    async def read(decisions):
        reads.append(decisions)
        if len(reads) == 1:
            await asyncio.to_thread(abort_batch, options, batch, messages)
            return None
        return await real_read(decisions)

    monkeypatch.setattr(DecisionLog, "read", read)
    # The commit's record was written over the abort's: the job read "committed", and rolling it
    # forward failed saying its rows were lost to someone else's abort (an operator's?).
    with pytest.raises(SinkStateError, match="is NOT committed: an abort of the job recorded its decision first"):
        commit_batch(options, batch, messages)
    monkeypatch.undo()
    assert job_outcome(server.url, "sink", TOPIC, batch.job) == "not committed"
    assert committed_values(server.url) == []
    assert open_transactions(server.url) == []


def test_a_streams_decision_record_arriving_after_later_batches_were_decided_is_refused(server, options, late_decision):
    first = SinkBatch("sink", TOPIC, 1)
    messages = [write_task(options, first, iter(rows("1")), TaskAttempt(0, 0, 1))]
    commit_given_up(options, late_decision, first, messages)
    abort_batch(through(late_decision, options), first, messages)
    # The query restarts from its checkpoint: batch 1 again, then batch 2.
    for batch_id in (1, 2):
        batch = SinkBatch("sink", TOPIC, batch_id)
        task = write_task(options, batch, iter(rows(str(batch_id))), TaskAttempt(0, 0, 10 + batch_id))
        commit_batch(options, batch, [task])
    # The first run's record of batch 1 reaches the server now. It moved the sink's decision back
    # to batch 1: batch 2, re-run after a crash before Spark's commit log, was written again.
    late = late_decision.deliver()
    assert late["error"] is not None and late["error"]["code"] == "OFFSET_NOT_ADVANCED", late
    assert recorded_decision(options, SinkBatch("sink", TOPIC, 2)).batch_id == 2
    second = SinkBatch("sink", TOPIC, 2)
    assert write_task(options, second, iter(rows("2")), TaskAttempt(0, 1, 20)).skipped
    assert committed_values(server.url) == ["1", "2"]
    assert open_transactions(server.url) == []


class FrozenServer:
    """A `txbroker serve` subprocess that a task's rows freeze (SIGSTOP) for a while once the task
    has them all: what the task's prepare meets. Resumed (SIGCONT) at teardown whatever happened."""

    def __init__(self, server) -> None:
        self.url, self.pid = server.url, server.pid
        self._resume: threading.Timer | None = None

    def rows_then_frozen(self, batches: list[pa.RecordBatch], seconds: float) -> Iterator[pa.RecordBatch]:
        yield from batches
        os.kill(self.pid, signal.SIGSTOP)
        self._resume = threading.Timer(seconds, self.resume)
        self._resume.start()

    def resume(self) -> None:
        if self._resume is not None:
            self._resume.cancel()
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
def frozen_server(server_process, database_url):
    frozen = FrozenServer(server_process("--database-url", database_url))
    with Admin(frozen.url) as admin:
        admin.create_topic(TOPIC, partitions=2)
    try:
        yield frozen
    finally:
        frozen.resume()


def test_a_task_waits_out_a_slow_prepare_instead_of_failing(frozen_server):
    """The server frozen for 2 s while a task prepares, with max_block_ms=500: prepare_transaction()
    times out (retriable) and the task calls it again until it is prepared, within
    delivery_timeout_ms; the batch then commits each row once. Before, the task failed on the first
    TxbrokerTimeoutError, and Spark retried it from scratch: a new transaction, the work redone."""
    options = WriteOptions(ConnectionOptions(frozen_server.url), TOPIC, "sink", max_block_ms=500)
    batch = SinkBatch("sink", TOPIC, job="job-slow")
    started = time.monotonic()
    message = write_task(options, batch, frozen_server.rows_then_frozen(rows("a", "b"), 2), TaskAttempt(0, 0, 1))
    assert time.monotonic() - started > 2, "the prepare did not meet the frozen server"
    assert message.transaction is not None and message.rows == 2
    commit_batch(options, batch, [message])
    assert committed_values(frozen_server.url) == ["a", "b"]
    assert open_transactions(frozen_server.url) == []


def test_a_task_fails_once_a_slow_prepare_outlasts_delivery_timeout_ms(frozen_server):
    """Preparing on is bounded: a server frozen for 8 s, past delivery_timeout_ms (here 1.5 s,
    max_block_ms 500), fails the task with the retriable TxbrokerTimeoutError, for Spark to retry it,
    after preparing on for delivery_timeout_ms (the task's cleanup then waits for the frozen server:
    an abort for max_block_ms, the producer's close for up to 5 s)."""
    options = WriteOptions(
        # request_timeout_ms within delivery_timeout_ms, as the SDK's producer (Kafka's) requires
        ConnectionOptions(frozen_server.url, request_timeout_ms=1000),
        TOPIC,
        "sink",
        max_block_ms=500,
        delivery_timeout_ms=1500,
    )
    batch = SinkBatch("sink", TOPIC, job="job-frozen")
    started = time.monotonic()
    # Which bound ends it first is a race (the record's delivery timeout in flight, from its send,
    # or prepare_transaction()'s last max_block_ms, from a little later): both are the timeout.
    with pytest.raises(errors.TxbrokerTimeoutError, match="max_block_ms|delivery_timeout_ms") as raised:
        write_task(options, batch, frozen_server.rows_then_frozen(rows("x"), 8), TaskAttempt(0, 0, 1))
    took = time.monotonic() - started
    assert raised.value.retriable
    assert 1.5 <= took < 8, f"the task failed after {took:.1f} s with delivery_timeout_ms=1500"
