"""Section 1: small transactions/s against idempotent produces, raw PostgreSQL and the naive app."""

from __future__ import annotations

from functools import partial

import asyncpg

from bench.processes import CpuMeter
from bench.timed_run import measure
from bench.transactions.alternating_runs import Tally, measure_alternating
from bench.transactions.http_calls import NaiveApp, create_topic, http_client
from bench.transactions.report import Row
from bench.transactions.workloads import (
    RAW_TXN_TABLES_SQL,
    SMALL_TXN_RECORDS,
    NaiveTransactionWorkload,
    ProducerWorkload,
    RawSmallTransaction,
)
from bench.workloads import record_value


async def measure_small_transactions(
    base_url: str,
    raw_url: str,
    meter: CpuMeter,
    naive: NaiveApp,
    producer_counts: list[int],
    rounds: int,
    warmup_s: float,
    seconds: float,
) -> list[Row]:
    rows = []
    value = record_value(100)
    conn = await asyncpg.connect(raw_url)
    try:
        await conn.execute(RAW_TXN_TABLES_SQL)
    finally:
        await conn.close()
    async with http_client(base_url, 1) as http:
        for producers in producer_counts:
            partitions = producers * len(SMALL_TXN_RECORDS)
            idempotent_topic, txn_topic = f"small-idem-p{producers}", f"small-txn-p{producers}"
            await create_topic(http, idempotent_topic, partitions)
            await create_topic(http, txn_topic, partitions)
            raw = Tally()
            for _ in range(rounds):
                raw.add(
                    await measure(
                        partial(RawSmallTransaction, raw_url, f"raw-p{producers}", value),
                        producers,
                        warmup_s,
                        seconds,
                        meter,
                    )
                )
            naive_topic = f"small-naive-p{producers}"
            await naive.create_topic(naive_topic, partitions)
            naive_txns = Tally()
            for _ in range(rounds):
                naive_txns.add(
                    await measure(
                        partial(NaiveTransactionWorkload, naive.url, naive_topic, SMALL_TXN_RECORDS, value, True),
                        producers,
                        warmup_s,
                        seconds,
                        naive.meter,
                    )
                )
            idempotent, txns = await measure_alternating(
                partial(ProducerWorkload, base_url, idempotent_topic, SMALL_TXN_RECORDS, value, False),
                partial(ProducerWorkload, base_url, txn_topic, SMALL_TXN_RECORDS, value, True),
                producers,
                rounds,
                warmup_s,
                seconds,
                meter,
            )
            print(
                f"  small transactions, {producers} producers: {txns.requests_per_s:,.0f} txn/s; "
                f"idempotent produce {idempotent.requests_per_s:,.0f} req/s; raw PostgreSQL "
                f"{raw.requests_per_s:,.0f} txn/s; naive app, 2 requests: {naive_txns.requests_per_s:,.0f} txn/s",
                flush=True,
            )
            percent, per_op = txns.cpu_cells()
            naive_of_raw = naive_txns.requests_per_s / raw.requests_per_s
            cpu_factor = txns.server_and_postgres_cpu_s_per_request / idempotent.server_and_postgres_cpu_s_per_request
            rows.append(
                Row(
                    "1",
                    f"txn (produce 3 rec/2 parts + commit), {producers} producers",
                    f"{txns.requests_per_s:,.0f} txn/s, p50 {txns.latency_ms:.1f} ms",
                    f"idempotent produce of the same: {idempotent.requests_per_s:,.0f}/s, p50 "
                    f"{idempotent.latency_ms:.1f} ms (ms/req {idempotent.cpu_cells()[1]}); raw PostgreSQL 3-statement "
                    f"txn: {raw.requests_per_s:,.0f}/s; naive app, produce + end as 2 requests: "
                    f"{naive_txns.requests_per_s:,.0f}/s ({naive_of_raw:.2f} of raw PG)",
                    f"{txns.requests_per_s / idempotent.requests_per_s:.2f} of idempotent (CPU/op x{cpu_factor:.1f}); "
                    f"{txns.requests_per_s / raw.requests_per_s:.2f} of raw PG; "
                    f"{txns.requests_per_s / naive_txns.requests_per_s:.2f} of naive",
                    percent,
                    per_op,
                )
            )
    return rows
