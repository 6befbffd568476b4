"""An exactly-once Spark pipeline on txbroker: a structured streaming query reads a topic (read_committed),
transforms each record, and writes another topic through the txbroker sink; then the output is
checked against the input.

    .venv/bin/python examples/spark_pipeline.py URL [--records-per-partition 1000] [--partitions 2]
        [--max-records-per-trigger 500] [--name spark-pipeline-<random>] [--checkpoint DIR]

What it does:
1. creates the topics `<name>-in` and `<name>-out`, and produces the input with the SDK: records in
   transactions of 100, every fourth transaction aborted (a read_committed reader never sees those);
2. runs the query with Trigger.AvailableNow -- micro-batches of at most --max-records-per-trigger
   offsets until the input is consumed -- upper-casing values, keeping keys and partitions, and
   adding a header with the input offset;
3. checks the output: every committed input record exactly once, in the same order within each
   partition, and no aborted one. Exit status 0 when that holds, 1 otherwise.

The query is restartable: run it again with the same --name and --checkpoint after killing it at
any instant, and the output still holds every input record exactly once (the sink's micro-batches
are two-phase commits, idempotent per batch id; see spark_client).
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import sys
import tempfile
import time

from pyspark.sql import functions as F

from spark_client.local import local_session
from txbroker import Admin, Consumer, Producer, TopicPartition
from txbroker.errors import TopicAlreadyExistsError

TRANSACTION_RECORDS = 100


def produce_input(url: str, topic: str, partitions: int, records_per_partition: int) -> dict[int, list[str]]:
    """Writes the input; returns the committed values per partition, in order."""
    committed: dict[int, list[str]] = {p: [] for p in range(partitions)}
    with Producer(url, transactional_id=f"{topic}-loader") as producer:
        producer.init_transactions()
        for partition in range(partitions):
            for number, start in enumerate(range(0, records_per_partition, TRANSACTION_RECORDS)):
                values = [
                    f"p{partition}-{i:06d}"
                    for i in range(start, min(start + TRANSACTION_RECORDS, records_per_partition))
                ]
                aborted = number % 4 == 3
                producer.begin_transaction()
                futures = [
                    producer.send(topic, value + ("-aborted" if aborted else ""), key=value, partition=partition)
                    for value in values
                ]
                if aborted:
                    for future in futures:
                        future.result(60)  # written, then aborted
                    producer.abort_transaction()
                else:
                    producer.commit_transaction()
                    committed[partition] += values
    return committed


def run_pipeline(spark, url: str, source: str, sink: str, checkpoint: str, max_records_per_trigger: int) -> int:
    """The query; returns the number of micro-batches that read records."""
    transformed = (
        spark.readStream.format("txbroker")
        .option("url", url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", max_records_per_trigger)
        .load()
        .select(
            "key",
            F.upper("value").alias("value"),
            "partition",
            F.array(F.struct(F.lit("source-offset").alias("key"), F.col("offset").cast("string").alias("value"))).alias(
                "headers"
            ),
        )
    )
    query = (
        transformed.writeStream.format("txbroker")
        .option("url", url)
        .option("topic", sink)
        .option("sink_id", sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sum(1 for progress in query.recentProgress if progress["numInputRows"] > 0)


def read_output(url: str, topic: str, partitions: int) -> dict[int, list[str]]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for record in consumer.poll(timeout_ms=500):
                found[record.partition].append(record.value.decode())
    return found


class NotExactlyOnce(AssertionError):
    """The output is not the input, exactly once and in order (the message says how)."""


def pipeline(
    spark,
    url: str,
    *,
    name: str,
    checkpoint: str,
    partitions: int = 2,
    records_per_partition: int = 1000,
    max_records_per_trigger: int = 500,
) -> str:
    """Steps 1 to 3 of the module docstring; returns a summary, or raises NotExactlyOnce."""
    source, sink = f"{name}-in", f"{name}-out"
    with Admin(url) as admin:
        try:
            admin.create_topic(source, partitions=partitions)
            admin.create_topic(sink, partitions=partitions)
            expected = produce_input(url, source, partitions, records_per_partition)
        except TopicAlreadyExistsError:  # a restart: the input is there already
            expected = read_output(url, source, partitions)
    total = sum(len(values) for values in expected.values())
    print(f"input: {total} committed records in {source} ({partitions} partitions)", flush=True)

    started = time.monotonic()
    batches = run_pipeline(spark, url, source, sink, checkpoint, max_records_per_trigger)
    elapsed = time.monotonic() - started

    output = read_output(url, sink, partitions)
    wanted = {p: [v.upper() for v in values] for p, values in expected.items()}
    if output != wanted:
        problems = []
        for partition in sorted(wanted):
            got, want = output.get(partition, []), wanted[partition]
            if got != want:
                problems.append(
                    f"partition {partition}: {len(got)} records, expected {len(want)} "
                    f"({len(got) - len(set(got))} duplicates, {len(set(want) - set(got))} missing, "
                    f"{'same' if sorted(got) == sorted(want) else 'different'} records)"
                )
        raise NotExactlyOnce("NOT exactly once: " + "; ".join(problems))
    return (
        f"exactly once: {total} records from {source} to {sink} in {batches} micro-batches ({elapsed:.1f}s), "
        f"in order within each partition, none of the aborted transactions"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:8080")
    parser.add_argument("--records-per-partition", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--max-records-per-trigger", type=int, default=500)
    parser.add_argument("--name", default=f"spark-pipeline-{secrets.token_hex(4)}")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory (default: a temporary one)")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="txb-spark-pipeline-")
    spark = local_session("spark-pipeline")
    try:
        print(
            pipeline(
                spark,
                args.url,
                name=args.name,
                checkpoint=checkpoint,
                partitions=args.partitions,
                records_per_partition=args.records_per_partition,
                max_records_per_trigger=args.max_records_per_trigger,
            )
        )
        return 0
    except NotExactlyOnce as error:
        print(error, file=sys.stderr)
        return 1
    finally:
        spark.stop()
        if args.checkpoint is None:
            shutil.rmtree(checkpoint, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
