"""Benchmark of the Python SDK against raw HTTP, in one run, against one server:

    .venv/bin/python -m bench.sdk [--records 100000] [--value-bytes 100] [--batch 1000]

Produce: the same records written to one partition, idempotently (producer id, sequences):
- `raw HTTP produce`: one httpx.Client sending POST /v1/produce bodies of `--batch` base64 records
  (the baseline), then of 10 000 (the SDK's largest batch), serialized before the clock starts
  (the ceiling: the client does nothing but HTTP);
- `SDK Producer` / `SDK AsyncProducer`: send() per record then flush(); the SDK batches (linger_ms,
  batch_size, up to 5 requests in flight) and encodes each record itself;
- `SDK Producer, transactional`: the same in transactions of 10 000 records;
- `SDK Producer, 4 partitions`: keyed records spread by murmur2 over 4 partitions.
Consume: the records read back from offset 0, read_committed:
- `raw HTTP fetch`: POST /v1/fetch with max_records `--batch`, base64, following next_offset;
- `SDK Consumer` / `SDK AsyncConsumer`: poll() with max_poll_records `--batch`, records decoded; the
  SDK fetches up to fetch_max_records (5000) at a time and prefetches while the caller works;
- the same of the topic the SDK producer wrote (its batches are up to 10 000 records, and the
  server decodes a whole stored batch to return any part of it).

`xRAW` is records/s over the raw HTTP row above it (same direction, same topic). `client CPU %`
is the bench process's CPU over the wall time (100 = one core: the SDK's Python work), `server
CPU %` the txbroker process's. Everything runs on this machine: compare the ratios, not the absolute numbers.
Starts an embedded PostgreSQL and a `txbroker serve` in /tmp, stops both by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import orjson

from bench.processes import BenchProcesses, process_cpu_s
from bench.text_table import align
from bench.workloads import record_value
from txbroker import Admin, AsyncConsumer, AsyncProducer, Consumer, Producer, TopicPartition

DATABASE = "bench_sdk"
MB = 1_000_000
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Result:
    name: str
    group: str  # rows of a group compare with the group's raw HTTP row
    records: int
    seconds: float
    client_cpu_s: float
    server_cpu_s: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def measure(name: str, group: str, server_pid: int, run: Callable[[], int]) -> Result:
    cpu0, server0, wall0 = time.process_time(), process_cpu_s(server_pid), time.perf_counter()
    records = run()
    wall = time.perf_counter() - wall0
    result = Result(name, group, records, wall, time.process_time() - cpu0, process_cpu_s(server_pid) - server0)
    print(f"  {name}: {result.rate:,.0f} records/s", flush=True)
    return result


# ---- produce


def raw_produce(url: str, topic: str, records: int, batch: int, value: bytes) -> tuple[int, float]:
    encoded = base64.b64encode(value).decode()
    with httpx.Client(base_url=url, timeout=60) as http:
        ids = http.post("/v1/producers/init", json={}).json()
        bodies = [
            orjson.dumps(
                {
                    "producer_id": ids["producer_id"],
                    "producer_epoch": ids["producer_epoch"],
                    "encoding": "base64",
                    "partitions": [
                        {
                            "topic": topic,
                            "partition": 0,
                            "base_sequence": start,
                            "records": [{"key": None, "value": encoded}] * min(batch, records - start),
                        }
                    ],
                }
            )
            for start in range(0, records, batch)
        ]
        started = time.perf_counter()
        for body in bodies:
            [entry] = http.post("/v1/produce", content=body, headers=JSON).json()["partitions"]
            if entry["error"] is not None:
                raise RuntimeError(f"raw produce failed: {entry['error']}")
        return records, time.perf_counter() - started


def measure_raw_produce(url: str, topic: str, records: int, per_request: int, value: bytes, server_pid: int) -> Result:
    """Only the requests are timed: serializing the bodies up front is not the server's work."""
    timing: dict[str, float] = {}

    def run() -> int:
        count, timing["seconds"] = raw_produce(url, topic, records, per_request, value)
        return count

    result = measure(f"raw HTTP produce ({per_request}/request, pre-serialized)", "produce", server_pid, run)
    return Result(
        result.name, result.group, result.records, timing["seconds"], result.client_cpu_s, result.server_cpu_s
    )


def sdk_produce(
    url: str, topic: str, records: int, value: bytes, transactional: bool = False, keyed: bool = False
) -> int:
    with Producer(url, transactional_id="bench-sdk" if transactional else None) as producer:
        producer.partitions_for(topic)
        if transactional:
            producer.init_transactions()
            producer.begin_transaction()
        for i in range(records):
            if keyed:
                producer.send(topic, value, key=b"%d" % i)
            else:
                producer.send(topic, value, partition=0)
            if transactional and (i + 1) % 10_000 == 0:
                producer.commit_transaction()
                producer.begin_transaction()
        if transactional:
            producer.commit_transaction()
        producer.flush()
    return records


def async_sdk_produce(url: str, topic: str, records: int, value: bytes) -> int:
    async def run() -> int:
        async with AsyncProducer(url) as producer:
            for _ in range(records):
                await producer.send(topic, value, partition=0)
            await producer.flush()
        return records

    return asyncio.run(run())


# ---- consume


def raw_fetch(url: str, topic: str, records: int, batch: int) -> int:
    offset = read = 0
    with httpx.Client(base_url=url, timeout=60) as http:
        while read < records:
            body = orjson.dumps(
                {
                    "max_records": batch,
                    "encoding": "base64",
                    "partitions": [{"topic": topic, "partition": 0, "offset": offset}],
                }
            )
            [entry] = orjson.loads(http.post("/v1/fetch", content=body, headers=JSON).content)["partitions"]
            read += len(entry["records"])
            offset = entry["next_offset"]
    return read


def sdk_consume(url: str, topic: str, records: int, batch: int) -> int:
    with Consumer(url, max_poll_records=batch, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        read = 0
        while read < records:
            read += len(consumer.poll(timeout_ms=1000))
    return read


def async_sdk_consume(url: str, topic: str, records: int, batch: int) -> int:
    async def run() -> int:
        async with AsyncConsumer(url, max_poll_records=batch, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            read = 0
            while read < records:
                read += len(await consumer.poll(timeout_ms=1000))
            return read

    return asyncio.run(run())


# ---- the run


def format_table(results: list[Result], value_bytes: int) -> str:
    raw: dict[str, float] = {}
    for r in results:
        if r.name.startswith("raw"):
            raw.setdefault(r.group, r.rate)  # the first raw row of a group is its baseline
    rows = [("scenario", "records", "seconds", "records/s", "MB/s", "xRAW", "client CPU %", "server CPU %")]
    for r in results:
        rows.append(
            (
                r.name,
                f"{r.records:,}",
                f"{r.seconds:.2f}",
                f"{r.rate:,.0f}",
                f"{r.rate * value_bytes / MB:.1f}",
                f"{r.rate / raw[r.group]:.2f}" if r.group in raw else "-",
                f"{100 * r.client_cpu_s / r.seconds:.0f}",
                f"{100 * r.server_cpu_s / r.seconds:.0f}",
            )
        )
    return align(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sdk", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000, help="records per scenario (default 100000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per record value (default 100)")
    parser.add_argument(
        "--batch",
        type=int,
        default=1000,
        help="records per raw produce request, and max_records of fetches and polls (default 1000)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    value = record_value(args.value_bytes).encode()
    with BenchProcesses("txb-bench-sdk-") as processes:
        server = processes.txbroker(processes.database(DATABASE))
        url = server.url
        print(
            f"txbroker pid {server.pid}, PostgreSQL pid {processes.postgres.pid}; {os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}; {args.records:,} records of {args.value_bytes} bytes",
            flush=True,
        )
        topics = ["raw", "raw-big", "sdk", "sdk-async", "sdk-txn", "sdk-keyed"]
        with Admin(url) as admin:
            for topic in topics:
                admin.create_topic(topic, partitions=4 if topic == "sdk-keyed" else 1)
        n, batch, pid = args.records, args.batch, server.pid
        results = []

        results.append(measure_raw_produce(url, "raw", n, batch, value, pid))
        results.append(measure_raw_produce(url, "raw-big", n, 10_000, value, pid))
        results.append(
            measure("SDK Producer (sync), idempotent", "produce", pid, lambda: sdk_produce(url, "sdk", n, value))
        )
        results.append(
            measure(
                "SDK AsyncProducer, idempotent", "produce", pid, lambda: async_sdk_produce(url, "sdk-async", n, value)
            )
        )
        results.append(
            measure(
                "SDK Producer, transactional (10k/txn)",
                "produce",
                pid,
                lambda: sdk_produce(url, "sdk-txn", n, value, transactional=True),
            )
        )
        results.append(
            measure(
                "SDK Producer, keyed, 4 partitions",
                "produce",
                pid,
                lambda: sdk_produce(url, "sdk-keyed", n, value, keyed=True),
            )
        )
        results.append(
            measure(f"raw HTTP fetch (max_records {batch})", "consume", pid, lambda: raw_fetch(url, "raw", n, batch))
        )
        results.append(
            measure(f"SDK Consumer (sync), {batch}/poll", "consume", pid, lambda: sdk_consume(url, "raw", n, batch))
        )
        results.append(
            measure(f"SDK AsyncConsumer, {batch}/poll", "consume", pid, lambda: async_sdk_consume(url, "raw", n, batch))
        )
        # The server decodes whole stored batches: reading the SDK's large batches 1000 at a time
        # costs it more per record, which the SDK's fetch_max_records (5000) amortizes.
        results.append(
            measure(
                f"raw HTTP fetch (max_records {batch}), SDK-written batches",
                "consume-sdk",
                pid,
                lambda: raw_fetch(url, "sdk", n, batch),
            )
        )
        results.append(
            measure(
                f"SDK Consumer (sync), {batch}/poll, SDK-written batches",
                "consume-sdk",
                pid,
                lambda: sdk_consume(url, "sdk", n, batch),
            )
        )
        print()
        print(format_table(results, args.value_bytes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
