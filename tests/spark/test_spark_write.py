"""The txbroker data source in Spark batch queries (`df.write`, `spark.read`): real Spark in local mode,
a real server over HTTP, real PostgreSQL. One SparkSession for the module; each test has topics of
its own on the module's server."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("Spark needs a JVM (java on PATH)", allow_module_level=True)

from py4j.protocol import Py4JJavaError  # noqa: E402
from pyspark.errors import PySparkException  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from spark_client import OptionError  # noqa: E402
from spark_client.local import local_session  # noqa: E402
from txbroker import Admin, Consumer, Producer, TopicPartition, TwoPhaseClient  # noqa: E402

ROWS = 100_000


@pytest.fixture(scope="module")
def spark():
    session = local_session("txbroker-tests-write", master="local[2,3]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def url(module_server) -> str:
    return module_server.url


@pytest.fixture(scope="module")
def http(module_server):
    return module_server.client


def create_topic(url: str, name: str, partitions: int) -> str:
    with Admin(url) as admin:
        admin.create_topic(name, partitions=partitions)
    return name


def read_topic(url: str, topic: str, isolation_level: str = "read_committed") -> dict[int, list]:
    """Every record of every partition, per partition in offset order, with the SDK alone."""
    with Admin(url) as admin:
        count = len(admin.describe_topic(topic)["partitions"])
    tps = [TopicPartition(topic, p) for p in range(count)]
    found: dict[int, list] = {p: [] for p in range(count)}
    with Consumer(
        url,
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
        max_poll_records=10_000,
        fetch_max_records=10_000,
    ) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for record in consumer.poll(timeout_ms=500):
                found[record.partition].append(record)
    return found


def open_transactions(url: str, prefix: str = "") -> list[dict]:
    with TwoPhaseClient(url) as client:
        return client.list(prefix)


def write(df, url: str, topic: str, **options: str) -> None:
    writer = df.write.format("txbroker").option("url", url).option("topic", topic).mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_a_batch_write_with_failed_tasks_is_exactly_once(spark, url, http):
    topic = create_topic(url, "write-100k", 4)
    df = spark.range(ROWS, numPartitions=4).select(
        F.col("id").cast("string").alias("key"),
        F.concat(F.lit("v"), F.col("id")).alias("value"),
        (F.col("id") % 4).cast("int").alias("partition"),
    )
    # Partition 1's first attempt dies after preparing its transaction, partition 2's in the middle
    # of writing: Spark retries both, and tells the Python side nothing about the dead attempts.
    faults = '{"fail": [{"partition": 1, "at": "after_prepare"}, {"partition": 2, "at": "mid_write"}]}'
    write(df, url, topic, sink_id="bulk", _test_faults=faults)

    committed = read_topic(url, topic)
    values = Counter(r.value for records in committed.values() for r in records)
    assert len(values) == ROWS and set(values.values()) == {1}
    assert values.keys() == {b"v%d" % i for i in range(ROWS)}
    assert all(int(r.key) % 4 == p for p, records in committed.items() for r in records)
    # The dead attempts did write: the driver found their transactions and aborted them ...
    with TwoPhaseClient(url) as client:
        assert len(client.list("bulk/", states=["CompleteAbort"])) == 2
    # ... and nothing is left open: no Prepared or Ongoing transaction anywhere.
    assert http.get("/v1/transactions", params={"state": "Prepared,Ongoing"}).json() == {"transactions": []}


def test_a_failing_write_job_leaves_nothing_visible_or_open(spark, url):
    topic = create_topic(url, "write-fails", 2)
    df = spark.range(1000, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    faults = '{"fail": [{"partition": 1, "at": "after_prepare", "attempts": "all"}]}'
    with pytest.raises((Py4JJavaError, PySparkException)):
        write(df, url, topic, sink_id="doomed", _test_faults=faults)
    assert read_topic(url, topic) == {0: [], 1: []}
    assert open_transactions(url, "doomed/") == []


def test_writes_check_their_options_and_schema_at_planning(spark, url):
    topic = create_topic(url, "write-checks", 1)
    df = spark.range(3).select(F.col("id").cast("string").alias("value"))
    with pytest.raises(PySparkException, match="needs the option 'topic'"):
        df.write.format("txbroker").option("url", url).mode("append").save()
    with pytest.raises(PySparkException, match="does not exist"):
        write(df, url, "no-such-topic")
    with pytest.raises(PySparkException, match="needs a 'value' column"):
        write(spark.range(3), url, topic)
    with pytest.raises(PySparkException, match="append-only"):
        df.write.format("txbroker").option("url", url).option("topic", topic).mode("overwrite").save()
    assert issubclass(OptionError, ValueError)


def test_keys_headers_binary_values_and_timestamps_round_trip(spark, url):
    topic = create_topic(url, "write-columns", 2)
    df = spark.sql("""
        SELECT * FROM VALUES
          ('k1', X'00FF10', 0, array(named_struct('key', 'h', 'value', 'x')), TIMESTAMP '2024-01-02 03:04:05.678'),
          (NULL, NULL, 1, array(), TIMESTAMP '2024-01-02 03:04:05.679')
        AS t(key, value, partition, headers, timestamp)""")
    write(df, url, topic)
    records = read_topic(url, topic)
    [first], [second] = records[0], records[1]
    assert (first.key, first.value, first.headers) == (b"k1", b"\x00\xff\x10", [("h", b"x")])
    assert (second.key, second.value, second.headers) == (None, None, [])
    assert second.timestamp_ms - first.timestamp_ms == 1

    back = (
        spark.read.format("txbroker")
        .option("url", url)
        .option("topic", topic)
        .option("binary", "true")
        .load()
        .orderBy("partition")
        .collect()
    )
    assert [(r.key, r.value, r.partition, r.offset) for r in back] == [
        (b"k1", b"\x00\xff\x10", 0, 0),
        (None, None, 1, 0),
    ]
    assert [h.asDict() for h in back[0].headers] == [{"key": "h", "value": b"x"}]


def test_batch_reads_never_show_aborted_or_open_transactions(spark, url):
    topic = create_topic(url, "read-isolation", 1)
    with Producer(url) as plain:
        plain.send(topic, "plain-0", partition=0).result(30)
    committer = Producer(url, transactional_id="reader-test-committer")
    aborter = Producer(url, transactional_id="reader-test-aborter")
    holder = Producer(url, transactional_id="reader-test-holder")
    try:
        for producer in (committer, aborter, holder):
            producer.init_transactions()
            producer.begin_transaction()
        committer.send(topic, "committed-1", key="k", headers={"h": "v"}, partition=0)
        committer.commit_transaction()
        aborter.send(topic, "aborted-1", partition=0).result(30)  # sent, then aborted
        aborter.abort_transaction()
        committer.begin_transaction()
        committer.send(topic, "committed-2", partition=0)
        committer.commit_transaction()
        holder.send(topic, "open-1", partition=0).result(30)  # holds the last stable offset here
        committer.begin_transaction()
        committer.send(topic, "after-open", partition=0)
        committer.commit_transaction()

        def load(**options: str):
            reader = spark.read.format("txbroker").option("url", url).option("topic", topic)
            for key, value in options.items():
                reader = reader.option(key, value)
            return reader.load()

        rows = load().collect()
        assert [r.value for r in rows] == ["plain-0", "committed-1", "committed-2"]
        assert rows[1].key == "k" and [h.asDict() for h in rows[1].headers] == [{"key": "h", "value": "v"}]
        assert [r.offset for r in rows] == sorted(r.offset for r in rows) and {r.partition for r in rows} == {0}
        assert all(r.timestamp is not None for r in rows)
        uncommitted = [r.value for r in load(isolation_level="read_uncommitted").collect()]
        assert uncommitted == ["plain-0", "committed-1", "aborted-1", "committed-2", "open-1", "after-open"]

        holder.commit_transaction()  # the open transaction ends: everything after it shows
        assert [r.value for r in load().collect()] == ["plain-0", "committed-1", "committed-2", "open-1", "after-open"]
        second = rows[1].offset
        assert [
            r.value
            for r in load(
                startingOffsets=f'{{"{topic}": {{"0": {second}}}}}', endingOffsets=f'{{"0": {second + 1}}}'
            ).collect()
        ] == ["committed-1"]
        assert load().select("value").where("value LIKE 'committed%'").count() == 2
    finally:
        for producer in (committer, aborter, holder):
            producer.close()


def load(spark, url: str, topic: str, **options: str):
    reader = spark.read.format("txbroker").option("url", url).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_a_batch_read_ends_where_compaction_emptied_the_log_before_an_open_transaction(spark, url, module_server):
    # The last value of key k and its tombstone go (delete_retention_ms 0): no batch is left between
    # the last record and the last stable offset (an open transaction's first) that the read's range
    # was planned up to. The read used to wait there for records that cannot come, and fail after
    # STALL_TIMEOUT_S. (Compaction keeps the log's last batch, so that such a range ends in a batch
    # when no transaction is open.)
    from tests.api.test_log_lifecycle import clean

    with Admin(url) as admin:
        admin.create_topic("compacted-tail", config={"cleanup_policy": "compact", "delete_retention_ms": 0})
    with Producer(url) as producer:
        for key, value in (("a", "kept"), ("k", "v"), ("k", None)):
            producer.send("compacted-tail", value, key=key, partition=0).result(30)
    holder = Producer(url, transactional_id="compacted-tail-holder")
    try:
        holder.init_transactions()
        holder.begin_transaction()
        holder.send("compacted-tail", "open", key="j", partition=0).result(30)  # offset 3: the LSO
        clean(module_server)
        clean(module_server)

        rows = load(spark, url, "compacted-tail").collect()
        assert [(r.key, r.value, r.offset) for r in rows] == [("a", "kept", 0)]
        holder.abort_transaction()
    finally:
        holder.close()


def test_a_batch_read_from_a_deleted_offset_fails_unless_told_to_skip(spark, url):
    topic = create_topic(url, "deleted-start", 1)
    with Producer(url) as producer:
        for i in range(6):
            producer.send(topic, f"v{i}", partition=0)
    with Admin(url) as admin:
        admin.delete_records({TopicPartition(topic, 0): 3})
    asked = f'{{"{topic}": {{"0": 1}}}}'
    # It used to start at the log start, silently, as if the records 1 and 2 had been read.
    with pytest.raises(PySparkException, match=r"asks for offset 1 of deleted-start-0, but .* log starts at 3"):
        load(spark, url, topic, startingOffsets=asked).collect()
    rows = load(spark, url, topic, startingOffsets=asked, failOnDataLoss="false").collect()
    assert [r.value for r in rows] == ["v3", "v4", "v5"]


def test_a_header_without_a_key_fails_the_write_and_leaves_nothing(spark, url):
    topic = create_topic(url, "null-header-key", 1)
    df = spark.sql("SELECT 'v' AS value, array(named_struct('key', CAST(NULL AS STRING), 'value', 'x')) AS headers")
    # It used to be written with the header key "None".
    with pytest.raises(PySparkException, match="header's key must be a str, not None"):
        write(df, url, topic)
    assert read_topic(url, topic, "read_uncommitted") == {0: []}
    assert open_transactions(url, "batch/") == []
