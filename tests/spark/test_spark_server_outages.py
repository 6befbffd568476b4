"""The txbroker data source through failures of the server side, not of Spark: the txbroker node
SIGKILLed and restarted, or its PostgreSQL restarted under a node that stays up, while a Spark job
runs -- at the instants of the sink's two-phase commit that matter, where the job waits
(`_test_faults`' pauses, spark_client/faults.py) while the test stops the server or its database.

Real Spark (local[2]: a failed task fails its job, so nothing here is saved by a task retry), real
`txbroker serve` processes stopped by pid, real PostgreSQL. The source topic holds committed and
aborted transactions; every test checks that the output holds each committed record exactly once,
in order, nothing aborted, and that no transaction of the sink is left open."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("Spark needs a JVM (java on PATH)", allow_module_level=True)

from spark_client import job_outcome, recover  # noqa: E402
from spark_client.local import local_session  # noqa: E402
from tests.crash.conftest import own_postgres  # noqa: E402, F401 - a fixture
from tests.sdk.test_sdk_faults import OddAnswers  # noqa: E402
from tests.spark.test_spark_streaming import create_topic, open_transactions, produce, read_topic  # noqa: E402

WAIT_S = 120
# Bounds that make a server that stays down fail the job within seconds: every request attempt
# waits for its answer at most request_timeout_ms (a killed node's socket stays bound by the test,
# so a connection waits instead of being refused), and the driver gives up after commit_timeout_ms.
SHORT_BOUNDS = {"commit_timeout_ms": "2000", "request_timeout_ms": "1000"}


@pytest.fixture(scope="module")
def spark():
    # The JVM's stack trace in a failed query's error: it holds the sink's Python errors.
    session = local_session(
        "txbroker-tests-server-outages", master="local[2]", spark__sql__pyspark__jvmStacktrace__enabled="true"
    )
    yield session
    session.stop()


class NodeKilled:
    """The node SIGKILLed, then started again on the same socket (and database)."""

    def __init__(self, server_process, database_url: str) -> None:
        self.node = server_process("--database-url", database_url)

    def begin(self) -> None:
        self.node.kill()

    def end(self) -> None:
        self.node.start()


class PostgresRestarted:
    """The node's PostgreSQL stopped and, a moment later, started again; the node stays up."""

    def __init__(self, server_process, postgres) -> None:
        self.postgres = postgres
        self.node = server_process("--database-url", postgres.database_url)

    def begin(self) -> None:
        self.postgres.stop()

    def end(self) -> None:
        time.sleep(1)  # requests meet PostgreSQL away, not only its restart
        self.postgres.start()


@pytest.fixture
def node_killed(server_process, database_url) -> NodeKilled:
    return NodeKilled(server_process, database_url)


@pytest.fixture(params=["node-killed", "postgresql-restarted"])
def outage(request, server_process):
    if request.param == "node-killed":
        return NodeKilled(server_process, request.getfixturevalue("database_url"))
    return PostgresRestarted(server_process, request.getfixturevalue("own_postgres"))


def load_source(url: str, topic: str) -> dict[int, list[str]]:
    """Two partitions of committed, aborted, committed transactions; returns what was committed."""
    committed = {}
    for p in range(2):
        produce(url, topic, p, [f"{p}-a{i}" for i in range(3)], transactional_id=f"{topic}-loader")
        produce(url, topic, p, [f"{p}-x{i}" for i in range(2)], transactional_id=f"{topic}-loader", abort=True)
        produce(url, topic, p, [f"{p}-b{i}" for i in range(3)], transactional_id=f"{topic}-loader")
        committed[p] = [f"{p}-a{i}" for i in range(3)] + [f"{p}-b{i}" for i in range(3)]
    return committed


def topics(url: str) -> tuple[str, str, dict[int, list[str]]]:
    source, sink = create_topic(url, "in", 2), create_topic(url, "out", 2)
    return source, sink, load_source(url, source)


def scene(node, tmp_path: Path) -> tuple[str, str, str, dict[int, list[str]], Path]:
    """(url, source, sink, what the source committed, the pauses' directory)."""
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    return node.url, *topics(node.url), pauses


def wait_for(path: Path, query=None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed before {path.name}: {query.exception()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def pause(point: str, directory: Path, batch: int | None = None) -> dict:
    return {"pause": {"at": point, "dir": str(directory), **({} if batch is None else {"batch": batch})}}


def start_stream(
    spark,
    url,
    source,
    sink,
    sink_id,
    checkpoint,
    faults: dict | None = None,
    trigger: dict | None = None,
    **sink_options,
):
    """A query, with Trigger.AvailableNow unless told: three micro-batches of the source (batch 1 is
    the one paused)."""
    writer = (
        spark.readStream.format("txbroker")
        .option("url", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "8")
        .option("max_records_per_fetch", "2")  # a task's rows arrive in several Arrow batches: mid_write
        .load()
        .select("key", "value", "partition")
        .writeStream.format("txbroker")
        .option("url", url)
        .option("topic", sink)
        .option("sink_id", sink_id)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"availableNow": True}))
    )
    if faults:
        writer = writer.option("_test_faults", json.dumps(faults))
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    return writer.start()


def write_batch(spark, url, source, sink, faults: dict, **sink_options: str) -> None:
    writer = (
        spark.read.format("txbroker")
        .option("url", url)
        .option("topic", source)
        .option("max_records_per_fetch", "2")
        .load()
        .select("key", "value", "partition")
        .write.format("txbroker")
        .option("url", url)
        .option("topic", sink)
        .option("_test_faults", json.dumps(faults))
    )
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    writer.mode("append").save()


class OutageAtThePause(threading.Thread):
    """Waits for the job to reach its pause, begins the outage, lets the job go on, and (unless
    `end` is False) ends the outage. A batch write blocks the test's thread (Spark finds the data
    source in the thread that registered it), so this runs beside it -- and lives until the test
    is done: a PostgreSQL dies with the thread that started it (its parent-death signal)."""

    def __init__(self, outage, pauses: Path, point: str, end: bool = True) -> None:
        super().__init__(daemon=True)
        self.outage, self.pauses, self.point, self.end = outage, pauses, point, end
        self.problems: list[BaseException] = []
        self.finished = threading.Event()
        self.outage_over = threading.Event()

    def run(self) -> None:
        try:
            wait_for(self.pauses / f"{self.point}.reached")
            self.outage.begin()
            (self.pauses / f"{self.point}.go").touch()
            if self.end:
                self.outage.end()
        except BaseException as error:  # noqa: BLE001 - reported by close()
            self.problems.append(error)
        self.outage_over.set()
        self.finished.wait(WAIT_S)

    def close(self) -> None:
        """Ends the thread: call it once the test is done with the server."""
        self.finished.set()
        self.join(WAIT_S)
        assert not self.problems, self.problems


# The pauses: a task's rows partly sent (mid_write) or all sent, the transaction Ongoing
# (before_prepare); a task's transaction Prepared, the driver not decided (after_prepare,
# before_decision); the decision recorded, nothing committed (after_decision).


@pytest.mark.parametrize("point", ["mid_write", "after_prepare", "after_decision"])
def test_a_stream_is_exactly_once_through_an_outage_mid_batch(spark, outage, tmp_path, point):
    url, source, sink, committed, pauses = scene(outage.node, tmp_path)
    query = start_stream(spark, url, source, sink, "outage", tmp_path / "cp", pause(point, pauses, batch=1))
    try:
        wait_for(pauses / f"{point}.reached", query)
        outage.begin()
        (pauses / f"{point}.go").touch()
        outage.end()
        query.awaitTermination(WAIT_S)  # the sink's calls are retried: the query goes on
    finally:
        query.stop()
    assert query.exception() is None
    assert read_topic(url, sink) == committed
    assert open_transactions(url, "outage/") == []


@pytest.mark.parametrize("point", ["before_prepare", "before_decision"])
def test_a_batch_write_is_exactly_once_through_an_outage_mid_job(spark, outage, tmp_path, point):
    url, source, sink, committed, pauses = scene(outage.node, tmp_path)
    helper = OutageAtThePause(outage, pauses, point)
    helper.start()
    try:
        write_batch(spark, url, source, sink, pause(point, pauses))
        assert read_topic(url, sink) == committed
        assert open_transactions(url, "batch/") == []
    finally:
        helper.close()


def batch_write_failed_by_the_node_down(spark, node_killed, tmp_path, point, **bounds: str):
    """A batch write whose node is killed at `point` and stays down: (url, source, sink, what the
    source committed, the job's error as text)."""
    url, source, sink, committed, pauses = scene(node_killed.node, tmp_path)
    helper = OutageAtThePause(node_killed, pauses, point, end=False)
    helper.start()
    try:
        with pytest.raises(Exception) as failed:
            write_batch(spark, url, source, sink, pause(point, pauses), **SHORT_BOUNDS, **bounds)
    finally:
        helper.close()
    return url, source, sink, committed, str(failed.value)


def test_a_batch_write_whose_commit_cannot_finish_says_it_is_committed_and_recover_finishes_it(
    spark, node_killed, tmp_path
):
    # The node dies once the decision is recorded, and stays down past the driver's commit and abort.
    url, source, sink, committed, failed = batch_write_failed_by_the_node_down(
        spark, node_killed, tmp_path, "after_decision"
    )
    # It used to fail with the EndTxn's timeout alone, as any failed job: run again, its rows
    # were written twice once the first run's were committed.
    assert "IS COMMITTED" in failed and "Do not run the write again" in failed
    assert f"spark_client.recover('{url}', 'batch', '{sink}')" in failed
    node_killed.end()
    assert sum(map(len, read_topic(url, sink).values())) == 0  # Prepared: not visible yet
    assert len(recover(url, "batch", sink)["committed"]) == 2
    assert read_topic(url, sink) == committed
    assert open_transactions(url, "batch/") == []


def test_a_stream_whose_commit_cannot_finish_fails_saying_so_and_resumes_from_its_checkpoint_exactly_once(
    spark, node_killed, tmp_path
):
    url, source, sink, committed, pauses = scene(node_killed.node, tmp_path)
    checkpoint = tmp_path / "cp"
    faults = pause("after_decision", pauses, batch=1)
    query = start_stream(spark, url, source, sink, "stuck", checkpoint, faults, **SHORT_BOUNDS)
    try:
        wait_for(pauses / "after_decision.reached", query)
        node_killed.begin()
        (pauses / "after_decision.go").touch()
        with pytest.raises(Exception) as failed:
            query.awaitTermination(WAIT_S)
    finally:
        query.stop()
    assert "IS COMMITTED" in str(failed.value) and "Restart the query from its checkpoint" in str(failed.value)
    node_killed.end()
    query = start_stream(spark, url, source, sink, "stuck", checkpoint)
    query.awaitTermination(WAIT_S)
    assert query.recentProgress[0]["batchId"] == 1  # batch 1 again: rolled forward, not written again
    assert read_topic(url, sink) == committed
    assert open_transactions(url, "stuck/") == []


def test_a_stream_plans_its_offsets_through_an_outage_and_reads_each_range_once(spark, outage, tmp_path):
    url = outage.node.url
    source, sink, committed = topics(url)
    # Spark plans (latestOffset) every 200 ms: its planning meets the outage.
    query = start_stream(
        spark, url, source, sink, "planner", tmp_path / "cp", trigger={"processingTime": "200 milliseconds"}
    )

    def wait_for_sink(expected: dict[int, list[str]]) -> None:
        deadline = time.monotonic() + WAIT_S
        while (found := read_topic(url, sink)) != expected:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, found
            time.sleep(0.2)

    try:
        wait_for_sink(committed)
        outage.begin()
        outage.end()
        for p in range(2):
            more = [f"{p}-c{i}" for i in range(3)]
            produce(url, source, p, more, transactional_id="more")
            committed[p] += more
        wait_for_sink(committed)
    finally:
        query.stop()
    assert open_transactions(url, "planner/") == []


def test_a_batch_write_whose_abort_cannot_reach_the_server_says_what_it_left_and_recover_clears_it(
    spark, node_killed, tmp_path
):
    # The node dies while the tasks' transactions are open, and stays down past their bounds and the abort's.
    url, source, sink, committed, failed = batch_write_failed_by_the_node_down(
        spark, node_killed, tmp_path, "before_prepare", delivery_timeout_ms="2000", max_block_ms="1000"
    )
    assert "aborting batch write job-" in failed
    assert f"spark_client.recover('{url}', 'batch', '{sink}', abort_undecided=True)" in failed
    node_killed.end()
    assert {t["state"] for t in open_transactions(url, "batch/")} <= {"Ongoing", "Prepared"}
    recover(url, "batch", sink, abort_undecided=True)
    assert open_transactions(url, "batch/") == []
    write_batch(spark, url, source, sink, {})  # the job again: once
    assert read_topic(url, sink) == committed


class DecisionsLost(OddAnswers):
    """A real HTTP proxy in front of the server that forwards every request but the driver's
    decision records (offset commits of a group `txbroker-spark.*`), which are lost:

    - `lost="answers"`: each is forwarded -- the server writes the decision -- and the connection
      closed without its answer, as when the node dies right after the write; with
      `down_after_the_first`, nothing at all is forwarded after the first one: the server seems
      never to come back;
    - `lost="requests"`: each is dropped before the server sees it, until the decision is read
      back (a decision read after a lost record): the server was away, then is back."""

    def __init__(self, upstream: str, lost: str = "answers", down_after_the_first: bool = False) -> None:
        self.lost, self.down_after_the_first = lost, down_after_the_first
        self.down, self.decisions_written, self.records_dropped = False, 0, 0
        super().__init__(upstream)

    def _answer(self, handler) -> None:
        path = handler.path
        decisions = path.startswith("/v1/groups/txbroker-spark.")
        if self.down:
            handler.close_connection = True
            return
        if decisions and path.endswith("/offsets/fetch") and self.records_dropped:
            self.lost = "nothing"  # read back: the server is back
        if not (decisions and path.endswith("/offsets/commit")) or self.lost == "nothing":
            super()._answer(handler)
            return
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        if self.lost == "answers":
            written = self._upstream.post(path, content=body, headers={"Content-Type": "application/json"})
            assert written.status_code == 200, written.text
            self.decisions_written += 1
            self.down = self.down_after_the_first
        else:
            self.records_dropped += 1
        handler.close_connection = True  # no answer


@pytest.fixture
def decisions_lost(server):
    proxies: list[DecisionsLost] = []

    def proxy(**how) -> DecisionsLost:
        proxies.append(DecisionsLost(server.url, **how))
        return proxies[-1]

    yield proxy
    for each in proxies:
        each.close()


@pytest.mark.parametrize(
    "lost",
    [
        # Every answer to recording the decision is lost: the driver's retries write it again and
        # again (the same record) without hearing so, until commit_timeout_ms; then it reads it back.
        # The job failed with "recording the decision ... did not succeed" while its decision was
        # recorded: Spark's abort rolled it forward, and a user running the job again wrote it twice.
        "answers",
        # The records never reach the server for commit_timeout_ms; read back, the decision is not
        # there, and the server answers again: the driver records it again. The job failed, and its
        # abort aborted it: a job lost to an outage that its read back outlived.
        "requests",
    ],
)
def test_a_batch_write_whose_decision_record_went_unanswered_reads_it_back_and_commits_once(
    spark, server, decisions_lost, lost
):
    proxy = decisions_lost(lost=lost)
    source, sink, committed = topics(server.url)
    write_batch(spark, proxy.url, source, sink, {}, **SHORT_BOUNDS)
    assert (proxy.decisions_written if lost == "answers" else proxy.records_dropped) >= 1
    assert read_topic(server.url, sink) == committed
    assert open_transactions(server.url, "batch/") == []


def test_a_batch_write_whose_decision_outcome_cannot_be_known_says_so_and_how_to_finish_it(
    spark, server, decisions_lost
):
    proxy = decisions_lost(lost="answers", down_after_the_first=True)
    source, sink, committed = topics(server.url)
    with pytest.raises(Exception) as failed:
        write_batch(spark, proxy.url, source, sink, {}, **SHORT_BOUNDS)
    message = str(failed.value)
    assert "is UNKNOWN" in message and "Do not run the write again before you know" in message
    assert f"spark_client.recover('{proxy.url}', 'batch', '{sink}', abort_undecided=True)" in message
    job = re.search(r"spark_client.job_outcome\([^)]*'(job-[0-9a-f]+)'\)", message).group(1)
    assert job_outcome(server.url, "batch", sink, job) == "committed"  # recorded: its answer was lost
    assert len(recover(server.url, "batch", sink, abort_undecided=True)["committed"]) == 2
    assert read_topic(server.url, sink) == committed
    assert open_transactions(server.url, "batch/") == []
