"""The txbroker data source in Spark structured streaming: the stream reader (read_committed, resuming
from its checkpoint) and the exactly-once sink through task failures and a driver killed between
its decision and its commits. Real Spark in local mode, a real server over HTTP, real PostgreSQL.

One SparkSession for the module (local[2,3]: failed tasks are retried). The driver-crash test and
the example pipeline run their own driver processes, which they stop by pid."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("Spark needs a JVM (java on PATH)", allow_module_level=True)

from pyspark.sql import functions as F  # noqa: E402

from spark_client.decisions import DecisionLog, SinkBatch  # noqa: E402
from spark_client.faults import DRIVER_PID_VARIABLE  # noqa: E402
from spark_client.local import local_session  # noqa: E402
from spark_client.options import ConnectionOptions  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402
from txbroker import Admin, Consumer, Producer, TopicPartition, TwoPhaseClient  # noqa: E402

DRIVER_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def spark():
    session = local_session("txbroker-tests-streaming", master="local[2,3]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def url(module_server) -> str:
    return module_server.url


def create_topic(url: str, name: str, partitions: int) -> str:
    with Admin(url) as admin:
        admin.create_topic(name, partitions=partitions)
    return name


def produce(
    url: str, topic: str, partition: int, values: list[str], *, transactional_id: str, abort: bool = False
) -> None:
    with Producer(url, transactional_id=transactional_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send(topic, value, key=value, partition=partition) for value in values]
        for future in futures:
            future.result(60)
        if abort:
            producer.abort_transaction()
        else:
            producer.commit_transaction()


def produce_input(url: str, topic: str, partitions: int, per_partition: int) -> dict[int, list[str]]:
    """Transactions of 100 records, every third one aborted; returns what was committed."""
    committed: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for p in range(partitions):
        for number, start in enumerate(range(0, per_partition, 100)):
            values = [f"{topic}-{p}-{i:05d}" for i in range(start, min(start + 100, per_partition))]
            aborted = number % 3 == 2
            produce(url, topic, p, values, transactional_id=f"{topic}-loader", abort=aborted)
            if not aborted:
                committed[p] += values
    return committed


def read_topic(url: str, topic: str, isolation_level: str = "read_committed") -> dict[int, list[str]]:
    with Admin(url) as admin:
        count = len(admin.describe_topic(topic)["partitions"])
    tps = [TopicPartition(topic, p) for p in range(count)]
    found: dict[int, list[str]] = {p: [] for p in range(count)}
    with Consumer(url, isolation_level=isolation_level, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for record in consumer.poll(timeout_ms=500):
                found[record.partition].append(record.value.decode())
    return found


def open_transactions(url: str, prefix: str) -> list[dict]:
    with TwoPhaseClient(url) as client:
        return client.list(prefix)


def run_stream(
    spark,
    url: str,
    source: str,
    sink: str,
    sink_id: str,
    checkpoint: Path,
    transform=None,
    starting_offsets: str = "earliest",
    **sink_options: str,
):
    """One run of a query with Trigger.AvailableNow, to completion; returns the finished query."""
    df = (
        spark.readStream.format("txbroker")
        .option("url", url)
        .option("topic", source)
        .option("startingOffsets", starting_offsets)
        .option("maxRecordsPerTrigger", "250")
        .load()
    )
    df = transform(df) if transform else df.select("key", "value", "partition")
    writer = (
        df.writeStream.format("txbroker")
        .option("url", url)
        .option("topic", sink)
        .option("sink_id", sink_id)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    query = writer.start()
    query.awaitTermination()
    return query


def batches_with_rows(query) -> int:
    return sum(1 for progress in query.recentProgress if progress["numInputRows"] > 0)


def test_a_stream_writes_exactly_once_in_order_through_task_failures(spark, url, tmp_path):
    source, sink = create_topic(url, "stream-in", 2), create_topic(url, "stream-out", 2)
    committed = produce_input(url, source, 2, 700)
    # Batch 2: a task dies after preparing; batch 3: a task dies while writing. Spark retries both.
    faults = (
        '{"fail": [{"partition": 1, "at": "after_prepare", "batch": 2}, '
        '{"partition": 0, "at": "mid_write", "batch": 3}]}'
    )
    query = run_stream(
        spark,
        url,
        source,
        sink,
        "enricher",
        tmp_path / "checkpoint",
        transform=lambda df: df.select("key", F.upper("value").alias("value"), "partition"),
        _test_faults=faults,
    )
    assert batches_with_rows(query) >= 5
    assert read_topic(url, sink) == {p: [v.upper() for v in values] for p, values in committed.items()}
    with TwoPhaseClient(url) as client:  # the dead attempts' transactions, found and aborted
        assert len(client.list("enricher/", states=["CompleteAbort"])) == 2
    assert open_transactions(url, "enricher/") == []


def test_a_stream_read_resumes_from_its_checkpoint_and_skips_open_and_aborted_records(spark, url, tmp_path):
    source, sink = create_topic(url, "resume-in", 1), create_topic(url, "resume-out", 1)
    checkpoint = tmp_path / "checkpoint"
    first = [f"a-{i:03d}" for i in range(120)]
    produce(url, source, 0, first, transactional_id="resume-loader")
    run_stream(spark, url, source, sink, "resumer", checkpoint)
    assert read_topic(url, sink)[0] == first

    second = [f"b-{i:03d}" for i in range(50)]
    produce(url, source, 0, second, transactional_id="resume-loader")
    produce(url, source, 0, ["aborted"] * 30, transactional_id="resume-loader", abort=True)
    holder = Producer(url, transactional_id="resume-holder")
    try:
        holder.init_transactions()
        holder.begin_transaction()
        for value in ("held-0", "held-1"):
            holder.send(source, value, key=value, partition=0).result(30)
        after = [f"c-{i:03d}" for i in range(40)]
        produce(url, source, 0, after, transactional_id="resume-loader")
        run_stream(spark, url, source, sink, "resumer", checkpoint)  # stops at the open transaction
        assert read_topic(url, sink)[0] == first + second
        holder.commit_transaction()
    finally:
        holder.close()
    run_stream(spark, url, source, sink, "resumer", checkpoint)
    assert read_topic(url, sink)[0] == first + second + ["held-0", "held-1"] + after


def test_a_stream_starts_at_the_offset_asked_for_even_past_an_open_transaction(spark, url, tmp_path):
    source, sink = create_topic(url, "start-at-in", 1), create_topic(url, "start-at-out", 1)
    checkpoint = tmp_path / "checkpoint"
    produce(url, source, 0, [f"a-{i}" for i in range(5)], transactional_id="start-at-loader")  # 0-4, marker 5
    holder = Producer(url, transactional_id="start-at-holder")
    try:
        holder.init_transactions()
        holder.begin_transaction()
        holder.send(source, "held", key="held", partition=0).result(30)  # 6: the last stable offset
        produce(url, source, 0, [f"b-{i}" for i in range(5)], transactional_id="start-at-loader")  # 7-11
        # Offset 9 (b-2) is past the last stable offset: the stream waits there. It used to start at
        # the last stable offset instead, and then read the held record, b-0 and b-1.
        asked = f'{{"{source}": {{"0": 9}}}}'
        run_stream(spark, url, source, sink, "start-at", checkpoint, starting_offsets=asked)
        assert read_topic(url, sink)[0] == []
        holder.commit_transaction()
    finally:
        holder.close()
    run_stream(spark, url, source, sink, "start-at", checkpoint, starting_offsets=asked)
    assert read_topic(url, sink)[0] == ["b-2", "b-3", "b-4"]


def test_a_stream_reads_partitions_added_to_its_topic_from_their_first_offset(spark, url, tmp_path):
    source, sink = create_topic(url, "growing-in", 1), create_topic(url, "growing-out", 3)
    checkpoint = tmp_path / "checkpoint"
    produce(url, source, 0, ["p0-a"], transactional_id="growing-loader")
    run_stream(spark, url, source, sink, "grower", checkpoint)
    with Admin(url) as admin:
        admin.create_partitions(source, 3)
    for partition in range(3):
        produce(url, source, partition, [f"p{partition}-b", f"p{partition}-c"], transactional_id="growing-loader")
    # The checkpoint knows partition 0 only: 1 and 2 are read from offset 0, as Kafka's source does.
    run_stream(spark, url, source, sink, "grower", checkpoint)
    assert read_topic(url, sink) == {0: ["p0-a", "p0-b", "p0-c"], 1: ["p1-b", "p1-c"], 2: ["p2-b", "p2-c"]}


def test_a_query_whose_checkpoint_was_reset_is_refused_its_sinks_decision_of_the_same_batch(spark, url, tmp_path):
    source, sink = create_topic(url, "reset-in", 1), create_topic(url, "reset-out", 1)
    produce(url, source, 0, ["a", "b"], transactional_id="reset-loader")
    run_stream(spark, url, source, sink, "resetter", tmp_path / "first")  # its batch 0 is decided
    assert read_topic(url, sink)[0] == ["a", "b"]
    # A new checkpoint (a new query id), the same sink_id: its batch 0 used to be taken for the
    # first query's, already written, so it wrote nothing and succeeded. Now it fails, saying why.
    with pytest.raises(Exception, match=r"already committed batch 0 \(query .*a sink_id belongs to one streaming"):
        run_stream(spark, url, source, sink, "resetter", tmp_path / "second")
    assert read_topic(url, sink)[0] == ["a", "b"]
    assert open_transactions(url, "resetter/") == []


DRIVER_SCRIPT = """
import os, sys
os.environ["DRIVER_PID_VARIABLE"] = str(os.getpid())  # inherited by the JVM and its Python workers
from spark_client.local import local_session
url, source, sink, checkpoint, faults = sys.argv[1:6]
spark = local_session("crash-test-driver")
writer = (spark.readStream.format("txbroker").option("url", url).option("topic", source)
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "250").load()
          .select("key", "value", "partition")
          .writeStream.format("txbroker").option("url", url).option("topic", sink).option("sink_id", "crashy")
          .option("checkpointLocation", checkpoint).trigger(availableNow=True))
if faults:
    writer = writer.option("_test_faults", faults)
writer.start().awaitTermination()
spark.stop()
print("query finished", flush=True)
""".replace("DRIVER_PID_VARIABLE", DRIVER_PID_VARIABLE)


def driver_processes(driver_pid: int) -> list[int]:
    """The pids of a driver's processes (its JVM and Python workers inherit its marker variable)."""
    marker = f"{DRIVER_PID_VARIABLE}={driver_pid}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker in Path(entry.path, "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def run_driver(script: Path, log: Path, *args: str) -> int:
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=REPO_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
    try:
        return process.wait(DRIVER_TIMEOUT_S)
    finally:
        for pid in [process.pid, *driver_processes(process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(30)


def test_a_driver_killed_after_its_decision_is_rolled_forward_on_restart(spark, url, tmp_path):
    source, sink = create_topic(url, "crash-in", 2), create_topic(url, "crash-out", 2)
    committed = produce_input(url, source, 2, 300)
    script, log, checkpoint = tmp_path / "driver.py", tmp_path / "driver.log", tmp_path / "checkpoint"
    script.write_text(DRIVER_SCRIPT)

    # A driver process runs the query until it has recorded the decision for batch 1 and committed
    # one of the batch's two transactions; then its JVM and Python process are SIGKILLed.
    status = run_driver(script, log, url, source, sink, str(checkpoint), '{"crash_driver_after_decision": 1}')
    assert status == -signal.SIGKILL, log.read_text()[-3000:]

    async def read_decision():
        async with DecisionLog(ConnectionOptions(url), SinkBatch("crashy", sink)) as decisions:
            return await decisions.read()

    decision = asyncio.run(read_decision())
    assert decision.batch_id == 1 and len(decision.transactions) == 2
    assert [t["state"] for t in open_transactions(url, "crashy/1/")] == ["Prepared"]
    assert 0 < sum(map(len, read_topic(url, sink).values())) < sum(map(len, committed.values()))

    # The query restarts from its checkpoint (here, in this process's driver): Spark re-runs batch 1,
    # whose tasks find the decision and write nothing; its commit rolls the decision forward.
    query = run_stream(spark, url, source, sink, "crashy", checkpoint)
    assert query.recentProgress[0]["batchId"] == 1
    assert read_topic(url, sink) == committed
    assert open_transactions(url, "crashy/") == []


def test_the_example_pipeline_is_exactly_once(spark, url, tmp_path):
    """examples/spark_pipeline.py's pipeline and check, on this module's session (its command line
    only adds a session of its own)."""
    spec = importlib.util.spec_from_file_location("spark_pipeline", REPO_ROOT / "examples" / "spark_pipeline.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    summary = example.pipeline(
        spark, url, name="example", checkpoint=str(tmp_path / "checkpoint"), records_per_partition=600
    )
    assert summary.startswith("exactly once: 1000 records")
