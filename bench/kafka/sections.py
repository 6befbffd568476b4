"""The five measurements of the Kafka benchmark, each beside its baseline measured in the same run
(bench/kafka/__init__.py describes them). Each returns rows of bench.transactions' table."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import dataclass
from functools import partial
from multiprocessing.managers import SyncManager

import asyncpg

from bench.kafka import clients
from bench.kafka.client_runs import measure_clients
from bench.processes import CpuMeter
from bench.timed_run import ClientProcesses, Measurement, measure, measurement_of
from bench.transactions.alternating_runs import Tally
from bench.transactions.commit_to_visible import percentile
from bench.transactions.http_calls import create_topic, http_client
from bench.transactions.report import Row
from bench.transactions.workloads import SMALL_TXN_RECORDS, ProducerWorkload
from bench.workloads import OffsetSource, ProduceAcrossPartitions, RawCopy, RawSelect, record_value

VALUE_BYTES = 100
COPY_ROWS = 1000  # per COPY, as bench.produce_ceiling
COPY_CONNECTIONS = 4
HTTP_BATCH = 100  # records per POST /v1/produce, as bench.produce_ceiling
HTTP_PARTITIONS = 64
LARGE_TXN_RECORDS = 1000
IDEMPOTENT_TOPIC = "kafka-idempotent"


@dataclass(frozen=True)
class Run:
    """What every section needs: the server, PostgreSQL, the client processes and the timing."""

    http_url: str
    bootstrap: str
    raw_url: str
    meter: CpuMeter
    copy_meter: CpuMeter  # PostgreSQL alone: the raw baselines have no server
    pool: ClientProcesses
    producer_pool: ClientProcesses  # section 1's producers, at the lowest CPU priority (clients.py)
    manager: SyncManager  # the clients' barriers (bench/kafka/client_runs.py)
    producers: int
    rounds: int
    warmup_s: float
    seconds: float


def ratio(contender: Tally, baseline: Tally, target: str, per: str = "records") -> str:
    """The rate's ratio, and beside it the CPU ratio: the baseline's server + PostgreSQL CPU per
    record (or per transaction) over the contender's, what a machine whose cores those two keep
    busy would show (the steadier figure when other programs compete for the cores)."""
    if per == "records":
        rate, base_rate = contender.records_per_s, baseline.records_per_s
        cpu, base_cpu = _cpu_per_record(contender), _cpu_per_record(baseline)
    else:
        rate, base_rate = contender.requests_per_s, baseline.requests_per_s
        cpu, base_cpu = (t.server_and_postgres_cpu_s_per_request for t in (contender, baseline))
    if not base_rate or math.isnan(rate):
        return f"- (target {target})"
    return f"{rate / base_rate:.2f} (target {target}); CPU {base_cpu / cpu:.2f}"


def _cpu_per_record(tally: Tally) -> float:
    return (tally.server_cpu_s + tally.postgres_cpu_s) / tally.records if tally.records else math.nan


def per_record_cells(tally: Tally) -> str:
    """The server's and PostgreSQL's CPU per record, in microseconds."""
    return f"{1e6 * tally.server_cpu_s / tally.records:.1f}/{1e6 * tally.postgres_cpu_s / tally.records:.1f} us/rec"


_STARTED = time.monotonic()


def _progress(text: str) -> None:
    print(f"  [{time.monotonic() - _STARTED:.0f} s] {text}", flush=True)


async def measure_produce_throughput(run: Run, http_clients: int) -> tuple[list[Row], int]:
    """Sections 1 and 3, in alternating rounds: raw COPY, the HTTP produce path, confluent-kafka's
    idempotent producers and its 1000-record transactions. Returns the rows and how many records
    the idempotent producers wrote (section 2 reads them)."""
    value = record_value(VALUE_BYTES)
    txn_topic = "kafka-txn-1000"
    async with http_client(run.http_url, 1) as http:
        await create_topic(http, IDEMPOTENT_TOPIC, run.producers)
        await create_topic(http, txn_topic, run.producers)
        await create_topic(http, "http-produce", HTTP_PARTITIONS)
    copy, http_produce, kafka, kafka_txn = Tally(), Tally(), Tally(), Tally()
    offsets = OffsetSource()
    for round_number in range(1, run.rounds + 1):
        copy.add(
            await measure(
                partial(RawCopy, run.raw_url, value, COPY_ROWS, offsets),
                COPY_CONNECTIONS,
                run.warmup_s,
                run.seconds,
                run.copy_meter,
            )
        )
        http_produce.add(
            await measure(
                partial(
                    ProduceAcrossPartitions,
                    run.http_url,
                    "http-produce",
                    value,
                    HTTP_BATCH,
                    HTTP_PARTITIONS,
                    http_clients,
                ),
                http_clients,
                run.warmup_s,
                run.seconds,
                run.meter,
            )
        )
        kafka.add(await _each_producer(run, run.producer_pool, clients.produce_records, IDEMPOTENT_TOPIC, VALUE_BYTES))
        kafka_txn.add(
            await _each_producer(run, run.pool, clients.transact_records, txn_topic, VALUE_BYTES, LARGE_TXN_RECORDS)
        )
        _progress(
            f"round {round_number}: raw COPY {copy.records_per_s:,.0f}, "
            f"HTTP produce {http_produce.records_per_s:,.0f}, Kafka idempotent {kafka.records_per_s:,.0f}, "
            f"Kafka 1000-record txns {kafka_txn.records_per_s:,.0f} records/s (so far)"
        )
    percent, per_op = kafka.cpu_cells()[0], per_record_cells(kafka)
    kafka_result = f"{kafka.records_per_s:,.0f} records/s"
    shape = f"{run.producers} producers, 1 partition each, {VALUE_BYTES} B records, acks=all, idempotent, linger.ms 5"
    copy_cells, http_cells = copy.cpu_cells(), http_produce.cpu_cells()
    rows = [
        Row(
            "1",
            f"confluent-kafka producers ({shape})",
            kafka_result,
            f"raw COPY ({COPY_ROWS} rows/COPY, {COPY_CONNECTIONS} conn): {copy.records_per_s:,.0f} records/s "
            f"(CPU% {copy_cells[0]}, {per_record_cells(copy)})",
            ratio(kafka, copy, ">= 0.6"),
            percent,
            per_op,
        ),
        Row(
            "1",
            "the same",
            kafka_result,
            f"POST /v1/produce ({HTTP_BATCH} records/request, {http_clients} clients, {HTTP_PARTITIONS} partitions): "
            f"{http_produce.records_per_s:,.0f} records/s (CPU% {http_cells[0]}, {per_record_cells(http_produce)})",
            ratio(kafka, http_produce, ">= 2"),
            percent,
            per_op,
        ),
    ]
    percent, per_op = kafka_txn.cpu_cells()[0], per_record_cells(kafka_txn)
    rows.append(
        Row(
            "3",
            f"transactions of {LARGE_TXN_RECORDS} records + commit ({run.producers} transactional producers, "
            f"same settings)",
            f"{kafka_txn.records_per_s:,.0f} records/s, p50 {kafka_txn.latency_ms:.1f} ms/txn",
            f"the idempotent producers of #1: {kafka.records_per_s:,.0f} records/s",
            ratio(kafka_txn, kafka, ">= 0.9"),
            percent,
            per_op,
        )
    )
    return rows, kafka.records


async def _each_producer(run: Run, pool: ClientProcesses, client, topic: str, *arguments) -> Measurement:
    """`client` run by `run.producers` processes of `pool`, producer i writing partition i of `topic`."""
    measured, _ = await measure_clients(
        [partial(client, run.bootstrap, topic, partition, *arguments) for partition in range(run.producers)],
        pool,
        run.manager,
        run.meter,
        run.warmup_s,
        run.seconds,
    )
    return measured


async def measure_consumer(run: Run, records: int, select_rows: int) -> list[Row]:
    """Section 2: one read_committed consumer reading `records` records of the idempotent
    producers' topic from offset 0, against one connection SELECTing as many rows of raw COPY's
    table, `select_rows` per query; alternating, `rounds` times each, added up."""
    kafka, select = Tally(), Tally()
    firsts_ms = []  # assign -> the consumer's first records, each round
    loop = asyncio.get_running_loop()
    for _ in range(run.rounds):
        start, cpu_start = run.copy_meter.snapshot(), time.process_time()
        reader = RawSelect(run.raw_url, select_rows)
        await reader.open([0])
        try:
            read = queries = 0
            while read < records:
                read += await reader.run_once(0)
                queries += 1
        finally:
            await reader.close()
        end = run.copy_meter.snapshot()
        select.add(measurement_of(end.at - start.at, queries, read, [], time.process_time() - cpu_start, start, end))
        start = run.meter.snapshot()
        seconds, read, cpu_s, first_s = await loop.run_in_executor(
            run.pool.pool, clients.consume_records, run.bootstrap, IDEMPOTENT_TOPIC, run.producers, records
        )
        end = run.meter.snapshot()
        firsts_ms.append(first_s * 1000)
        kafka.add(measurement_of(seconds, 1, read, [], cpu_s, start, end))
    _progress(
        f"read_committed consumer {kafka.records_per_s:,.0f} records/s; raw SELECT {select.records_per_s:,.0f} rows/s"
    )
    percent = kafka.cpu_cells()[0]
    return [
        Row(
            "2",
            f"read_committed consumer reading {records:,} records of #1 ({run.producers} partitions, assign from 0)",
            f"{kafka.records_per_s:,.0f} records/s (first after {', '.join(f'{ms:.0f}' for ms in firsts_ms)} ms)",
            f"raw SELECT of {records:,} rows of raw COPY's table, {select_rows} per query, 1 conn: "
            f"{select.records_per_s:,.0f} rows/s (CPU% {select.cpu_cells()[0]}, {per_record_cells(select)})",
            ratio(kafka, select, ">= 0.8"),
            percent,
            per_record_cells(kafka),
        )
    ]


async def measure_small_transactions(run: Run, producer_counts: list[int]) -> list[Row]:
    """Section 4: transactions of 3 records to 2 partitions (2 + 1), confluent-kafka's transactional
    producers (threads spread over the client processes) against the HTTP path's (bench.transactions'
    ProducerWorkload: one produce of the 3 records, then EndTxn), alternating."""
    rows = []
    value = record_value(VALUE_BYTES)
    processes = run.pool.count
    for producers in producer_counts:
        partitions = producers * len(SMALL_TXN_RECORDS)
        kafka_topic, http_topic = f"kafka-small-p{producers}", f"http-small-p{producers}"
        async with http_client(run.http_url, 1) as http:
            await create_topic(http, kafka_topic, partitions)
            await create_topic(http, http_topic, partitions)
        kafka, over_http = Tally(), Tally()
        latencies: list[float] = []
        for _ in range(run.rounds):
            over_http.add(
                await measure(
                    partial(ProducerWorkload, run.http_url, http_topic, SMALL_TXN_RECORDS, value, True),
                    producers,
                    run.warmup_s,
                    run.seconds,
                    run.meter,
                )
            )
            measured, round_latencies = await measure_clients(
                [
                    partial(
                        clients.transact_small,
                        run.bootstrap,
                        kafka_topic,
                        list(range(first, producers, processes)),
                        SMALL_TXN_RECORDS,
                    )
                    for first in range(min(processes, producers))
                ],
                run.pool,
                run.manager,
                run.meter,
                run.warmup_s,
                run.seconds,
                fixed_window=True,
            )
            kafka.add(measured)
            latencies += round_latencies
        _progress(
            f"small transactions, {producers} producers: Kafka {kafka.requests_per_s:,.0f} txn/s, "
            f"HTTP {over_http.requests_per_s:,.0f} txn/s"
        )
        percent, per_op = kafka.cpu_cells()
        http_percent, http_per_op = over_http.cpu_cells()
        p99 = 1000 * percentile(latencies, 0.99) if latencies else math.nan
        rows.append(
            Row(
                "4",
                f"txn of 3 records to 2 partitions + commit, {producers} confluent-kafka producers "
                f"(threads over {min(processes, producers)} processes)",
                f"{kafka.requests_per_s:,.0f} txn/s, p50 {kafka.latency_ms:.1f} ms, p99 {p99:.1f} ms",
                f"HTTP: produce + /v1/txn/end, {producers} clients: {over_http.requests_per_s:,.0f} txn/s, "
                f"p50 {over_http.latency_ms:.1f} ms (CPU% {http_percent}, ms/txn {http_per_op})",
                ratio(kafka, over_http, ">= 1", per="transactions"),
                percent,
                per_op,
            )
        )
    return rows


async def measure_commit_to_visible(run: Run, writes: int) -> list[Row]:
    """Section 5: EndTxn answered (commit_transaction returned) -> the record handed over by a
    read_committed consumer's poll(), one transaction at a time, against an idempotent producer's
    produce + flush -> the same."""
    txn_topic, plain_topic = "kafka-visible-txn", "kafka-visible-plain"
    async with http_client(run.http_url, 1) as http:
        await create_topic(http, txn_topic, 1)
        await create_topic(http, plain_topic, 1)
    loop = asyncio.get_running_loop()
    txn, plain = await loop.run_in_executor(
        run.pool.pool, clients.commit_to_visible, run.bootstrap, txn_topic, plain_topic, writes
    )
    txn_ms, plain_ms = [1000 * d for d in txn], [1000 * d for d in plain]

    def p50_p99(values: list[float]) -> str:
        return f"p50 {statistics.median(values):.2f} ms, p99 {percentile(values, 0.99):.2f} ms"

    p99 = percentile(txn_ms, 0.99)
    _progress(f"EndTxn answered -> seen: {p50_p99(txn_ms)}")
    return [
        Row(
            "5",
            f"EndTxn answered -> record at a read_committed consumer, {writes} txns of 1 record",
            p50_p99(txn_ms),
            f"idempotent produce acknowledged (flush) -> seen: {p50_p99(plain_ms)}",
            f"p99 {'<=' if p99 <= 10 else '>'} 10 ms (target <= 10 ms)",
        )
    ]


async def create_raw_tables(raw_url: str, sql: str) -> None:
    connection = await asyncpg.connect(raw_url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()
