"""Benchmark of the Spark data source (spark_client) against the SDK alone, in one run, against one server:

    .venv/bin/python -m bench.spark [--records 200000] [--value-bytes 100] [--partitions 4] [--rounds 1]

Write, `--records` records of `--value-bytes` bytes with 8-byte keys into `--partitions` partitions,
each scenario into a topic of its own:
- `SDK Producer, transactional`: one process, one transactional producer, transactions of 10 000
  records (bench.sdk's row): the baseline of the write rows;
- `SDK Producer, 2PC per partition`: what the sink does, without Spark: one transactional producer
  per partition, each prepares its transaction, then a TwoPhaseClient commits them all;
- `Spark df.write`: the exactly-once sink, local[2]: a cached DataFrame of the rows in
  `--partitions` Spark partitions, each task one transaction (prepared), then the driver's decision
  and commits.
Read, the topic the SDK wrote, read_committed:
- `SDK Consumer`: one consumer assigned every partition (fetches of 10 000): the read baseline;
- `Spark read`: `spark.read.format("txbroker")`, every column materialized (the noop sink);
- `Spark readStream`: the same as one Trigger.AvailableNow micro-batch;
- `Spark readStream -> writeStream`: a pipeline copying the topic exactly once (read + write).

Spark runs in local[2] on this machine, against a `txbroker serve` subprocess and an embedded
PostgreSQL; a warm-up job starts Spark's Python workers first, so the rows show steady-state rates.
`xSDK` is rows/s over the SDK baseline of the same direction. CPU columns are % of one core over
the scenario (bench.processes.CpuMeter): `server` (txbroker), `postgres`, `client` (everything else
the machine did: the SDK or Spark's JVM and Python workers, and any other program). With --rounds N
every scenario runs N times and each column is the median (bench.timed_run.median_of).
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from pathlib import Path

from bench.processes import BenchProcesses, CpuMeter
from bench.text_table import align
from bench.timed_run import Measurement, median_of
from bench.workloads import record_value
from txbroker import Admin, Consumer, Producer, TopicPartition, TwoPhaseClient

DATABASE = "bench_spark"
SDK_WRITE, SDK_READ = "SDK Producer, transactional", "SDK Consumer"


def measure(name: str, meter: CpuMeter, run: Callable[[], int]) -> Measurement:
    before = meter.snapshot()
    rows = run()
    after = meter.snapshot()
    seconds = after.at - before.at
    server, postgres = after.server_s - before.server_s, after.postgres_s - before.postgres_s
    client = max(0.0, after.machine_s - before.machine_s - server - postgres)
    result = Measurement(
        seconds=seconds,
        requests=0,
        records=rows,
        latency_p50_ms=float("nan"),
        client_cpu_percent=100 * client / seconds,
        server_cpu_percent=100 * server / seconds,
        postgres_cpu_percent=100 * postgres / seconds,
        other_cpu_percent=0.0,
    )
    print(f"  {name}: {result.records_per_s:,.0f} rows/s", flush=True)
    return result


# ---- the SDK alone


def key(i: int) -> bytes:
    return b"%08d" % i


def sdk_write(url: str, topic: str, records: int, partitions: int, value: bytes) -> int:
    with Producer(url, transactional_id=f"bench-{topic}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(records):
            producer.send(topic, value, key=key(i), partition=i % partitions)
            if (i + 1) % 10_000 == 0:
                producer.commit_transaction()
                producer.begin_transaction()
        producer.commit_transaction()
    return records


def sdk_two_phase_write(url: str, topic: str, records: int, partitions: int, value: bytes) -> int:
    prepared = []
    for partition in range(partitions):
        with Producer(url, transactional_id=f"bench-{topic}/{partition}") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(partition, records, partitions):
                producer.send(topic, value, key=key(i), partition=partition)
            prepared.append(producer.prepare_transaction())
    with TwoPhaseClient(url) as coordinator:
        coordinator.commit_all(prepared)
    return records


def sdk_read(url: str, topic: str, partitions: int) -> int:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    read = 0
    with Consumer(
        url,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_poll_records=10_000,
        fetch_max_records=10_000,
    ) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            read += len(consumer.poll(timeout_ms=1000))
    return read


# ---- Spark


def spark_rows(spark, records: int, partitions: int, value: str):
    from pyspark.sql import functions as F

    df = (
        spark.range(records, numPartitions=partitions)
        .select(
            F.format_string("%08d", F.col("id")).alias("key"),
            F.lit(value).alias("value"),
            (F.col("id") % partitions).cast("int").alias("partition"),
        )
        .cache()
    )
    df.count()  # materialized before the clock starts: the rows are not what is measured
    return df


def spark_write(df, url: str, topic: str, records: int) -> int:
    df.write.format("txbroker").option("url", url).option("topic", topic).mode("append").save()
    return records


def spark_read(spark, url: str, topic: str, records: int) -> int:
    spark.read.format("txbroker").option("url", url).option("topic", topic).load().write.format("noop").mode(
        "overwrite"
    ).save()
    return records


def spark_stream(spark, url: str, topic: str, records: int, checkpoint: Path, sink_topic: str | None = None) -> int:
    df = (
        spark.readStream.format("txbroker")
        .option("url", url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    if sink_topic is None:
        writer = df.writeStream.format("noop")
    else:
        writer = (
            df.select("key", "value", "partition")
            .writeStream.format("txbroker")
            .option("url", url)
            .option("topic", sink_topic)
            .option("sink_id", sink_topic)
        )
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    read = sum(progress["numInputRows"] for progress in query.recentProgress)
    if read != records:
        raise RuntimeError(f"the stream read {read} rows, not {records}")
    return records


# ---- the run


def format_table(rows: list[tuple[str, str, Measurement]]) -> str:
    baseline = {group: m.records_per_s for name, group, m in rows if name in (SDK_WRITE, SDK_READ)}
    table = [
        ("scenario", "rows", "seconds", "rows/s", "xSDK", "server CPU%", "postgres CPU%", "client CPU%", "CPU us/row")
    ]
    for name, group, m in rows:
        table.append(
            (
                name,
                f"{m.records:,}",
                f"{m.seconds:.2f}",
                f"{m.records_per_s:,.0f}",
                f"{m.records_per_s / baseline[group]:.2f}",
                f"{m.server_cpu_percent:.0f}",
                f"{m.postgres_cpu_percent:.0f}",
                f"{m.client_cpu_percent:.0f}",
                f"{m.cpu_us_per_record:.0f}",
            )
        )
    return align(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.spark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000, help="rows per scenario (default 200000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="topic and Spark partitions (default 4)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every scenario; medians reported")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    value = record_value(args.value_bytes)
    with BenchProcesses("txb-bench-spark-") as processes:
        server = processes.txbroker(processes.database(DATABASE))
        url, n, parts = server.url, args.records, args.partitions
        meter = CpuMeter(processes.postgres.pid, server.pid)
        from spark_client.local import local_session

        spark = local_session("bench-spark")
        processes.stop_on_exit(spark.stop)
        print(
            f"txbroker pid {server.pid}, PostgreSQL pid {processes.postgres.pid}; {os.cpu_count()} CPUs; Python "
            f"{platform.python_version()}; Spark {spark.version} local[2]; {n:,} rows of {args.value_bytes} bytes "
            f"in {parts} partitions",
            flush=True,
        )
        admin = Admin(url)
        topics = iter(range(1_000_000))

        def topic(kind: str) -> str:
            name = f"{kind}-{next(topics)}"
            admin.create_topic(name, partitions=parts)
            return name

        df = spark_rows(spark, n, parts, value)
        warm = topic("warmup")  # starts Spark's Python workers: not measured
        spark_write(spark_rows(spark, 1000, parts, value), url, warm, 1000)
        spark_read(spark, url, warm, 1000)

        results: dict[tuple[str, str], list[Measurement]] = {}
        for _ in range(args.rounds):
            source = topic("sdk")
            runs = [
                (SDK_WRITE, "write", lambda source=source: sdk_write(url, source, n, parts, value.encode())),
                (
                    "SDK Producer, 2PC per partition",
                    "write",
                    lambda: sdk_two_phase_write(url, topic("sdk-2pc"), n, parts, value.encode()),
                ),
                ("Spark df.write (exactly-once sink)", "write", lambda: spark_write(df, url, topic("spark"), n)),
                (SDK_READ, "read", lambda source=source: sdk_read(url, source, parts)),
                ("Spark read (-> noop)", "read", lambda source=source: spark_read(spark, url, source, n)),
                (
                    "Spark readStream (-> noop, 1 batch)",
                    "read",
                    lambda source=source: spark_stream(
                        spark, url, source, n, processes.work_dir / f"cp-{next(topics)}"
                    ),
                ),
                (
                    "Spark readStream -> writeStream (exactly once)",
                    "read",
                    lambda source=source: spark_stream(
                        spark, url, source, n, processes.work_dir / f"cp-{next(topics)}", topic("copy")
                    ),
                ),
            ]
            for name, group, run in runs:
                results.setdefault((name, group), []).append(measure(name, meter, run))
        admin.close()
        print()
        print(format_table([(name, group, median_of(ms)) for (name, group), ms in results.items()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
