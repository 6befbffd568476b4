"""Section 3: 1000-record transactions against the same records written idempotently."""

from __future__ import annotations

from functools import partial

from bench.processes import CpuMeter
from bench.transactions.alternating_runs import measure_alternating
from bench.transactions.http_calls import NaiveApp, create_topic, http_client
from bench.transactions.report import Row
from bench.transactions.workloads import LARGE_VALUE_BYTES, NaiveTransactionWorkload, ProducerWorkload
from bench.workloads import record_value

LARGE_TXN_RECORDS = 1000


async def measure_large_transaction_overhead(
    base_url: str,
    meter: CpuMeter,
    naive: NaiveApp,
    producer_counts: list[int],
    rounds: int,
    warmup_s: float,
    seconds: float,
    shapes: list[tuple[int, int]] = ((1, LARGE_TXN_RECORDS),),
) -> list[Row]:
    """Each shape is (produce requests per transaction, records per request); the idempotent
    baseline writes the same requests with no transaction, so each run_once moves as many records."""
    rows = []
    value = record_value(LARGE_VALUE_BYTES)
    async with http_client(base_url, 1) as http:
        for produces, records in shapes:
            for producers in producer_counts:
                idempotent_topic = f"large-idem-{produces}x{records}-p{producers}"
                txn_topic = f"large-txn-{produces}x{records}-p{producers}"
                await create_topic(http, idempotent_topic, producers)
                await create_topic(http, txn_topic, producers)
                idempotent, txns = await measure_alternating(
                    partial(ProducerWorkload, base_url, idempotent_topic, (records,), value, False, produces),
                    partial(ProducerWorkload, base_url, txn_topic, (records,), value, True, produces),
                    producers,
                    rounds,
                    warmup_s,
                    seconds,
                    meter,
                )
                naive_topic = f"large-naive-{produces}x{records}-p{producers}"
                await naive.create_topic(naive_topic, producers)
                naive_produces, naive_txns = await measure_alternating(
                    partial(NaiveTransactionWorkload, naive.url, naive_topic, (records,), value, False, produces),
                    partial(NaiveTransactionWorkload, naive.url, naive_topic, (records,), value, True, produces),
                    producers,
                    rounds,
                    warmup_s,
                    seconds,
                    naive.meter,
                )
                naive_overhead = 100 * (1 - naive_txns.records_per_s / naive_produces.records_per_s)
                overhead = 100 * (1 - txns.records_per_s / idempotent.records_per_s)
                # Each transaction moves as many records as an idempotent run: CPU per run compares.
                cpu_overhead = 100 * (
                    txns.server_and_postgres_cpu_s_per_request / idempotent.server_and_postgres_cpu_s_per_request - 1
                )
                shape = f"{produces} produce{'s' if produces > 1 else ''} of {records}"
                print(
                    f"  {produces * records}-record transactions ({shape}), {producers} producers: "
                    f"{txns.records_per_s:,.0f} records/s; idempotent {idempotent.records_per_s:,.0f} records/s; "
                    f"overhead {overhead:.1f}%; the naive app's for one more request: {naive_overhead:.1f}%",
                    flush=True,
                )
                percent, per_op = txns.cpu_cells()
                idem_percent, idem_per_op = idempotent.cpu_cells()
                rows.append(
                    Row(
                        "3",
                        f"txn of {shape} x {LARGE_VALUE_BYTES} B + commit, {producers} producers",
                        f"{txns.records_per_s:,.0f} records/s, p50 {txns.latency_ms:.1f} ms/txn",
                        f"idempotent, no txn: {idempotent.records_per_s:,.0f} records/s, p50 "
                        f"{idempotent.latency_ms:.1f} ms/{produces} req (ms {idem_per_op}, CPU% {idem_percent}); "
                        f"naive app: {naive_produces.records_per_s:,.0f} records/s, with an end request "
                        f"{naive_txns.records_per_s:,.0f}",
                        f"overhead {overhead:.1f}% (CPU +{cpu_overhead:.0f}%); naive app's {naive_overhead:.1f}%",
                        percent,
                        per_op,
                    )
                )
    return rows
