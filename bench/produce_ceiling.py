"""Batched produce against its ceilings, in one run: the naive FastAPI + asyncpg app (bench/naive_app.py)
and raw PostgreSQL COPY, with txbroker and the naive app each run with 1 and with N worker processes.

    .venv/bin/python -m bench.produce_ceiling [--seconds 5] [--rounds 3] [--workers 1,2]

Every client sends 100 records of 100 bytes per request (`--batch`), 16 clients (`--clients`) over
a topic of 64 partitions (`--partitions`), client i writing partitions i, i + 16, ... in turn.
Scenarios run in turn, round after round (`--rounds`), and each figure is the median of its rounds,
so a burst of noise from other programs hits every scenario alike. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import asyncpg

from bench.partition_log import create_topic
from bench.processes import BenchProcesses, CpuMeter
from bench.text_table import align
from bench.timed_run import ClientProcesses, Measurement, WorkloadFactory, measure, median_of
from bench.workloads import RAW_TABLES_SQL, OffsetSource, ProduceAcrossPartitions, RawCopy, record_value

RAW_DATABASE = "bench_raw"
TOPIC = "ceiling"
COPY_CONNECTIONS = 4
COPY_ROWS = 1000


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "copy", "naive", "txbroker" or "compared" (the --compare-with checkout)
    workers: int
    clients: int
    make_workload: WorkloadFactory
    server_pid: int | None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.produce_ceiling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=5, help="measured time of each scenario (default 5)")
    parser.add_argument("--warmup", type=float, default=1, help="unmeasured time before each (default 1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; figures are medians (default 3)")
    parser.add_argument(
        "--workers",
        default="1,2",
        help="worker processes of txbroker and of the naive app, comma-separated (default 1,2)",
    )
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP clients (default 16)")
    parser.add_argument("--partitions", type=int, default=64, help="partitions of the topic (default 64)")
    parser.add_argument("--batch", type=int, default=100, help="records per request (default 100)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes of each record's value (default 100)")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread the HTTP clients over this many processes (default 1: this one)",
    )
    parser.add_argument("--only", choices=["txbroker"], help="txbroker alone (no baselines): quick checks")
    parser.add_argument(
        "--compare-with",
        metavar="DIR",
        type=Path,
        help="also run the txbroker of this checkout (e.g. `git archive COMMIT | tar -x -C DIR`), "
        "with 1 worker, to measure what a change bought in the same run",
    )
    args = parser.parse_args(argv)
    args.workers = [int(part) for part in args.workers.split(",") if part]
    return args


def _ratio(value: float, baseline: float | None) -> str:
    if not baseline or math.isnan(value):
        return "-"
    return f"{value / baseline:.2f}"


def _server_and_postgres_us_per_record(m: Measurement) -> float:
    """CPU the server and PostgreSQL spend per record: unlike records/s, hardly moved by what else
    the machine runs (or by the clients), so the steadier ratio on a busy machine."""
    return 1e4 * (m.server_cpu_percent + m.postgres_cpu_percent) * m.seconds / m.records if m.records else math.nan


def format_table(scenarios: list[Scenario], results: list[Measurement]) -> str:
    copy_best = max((m.records_per_s for s, m in zip(scenarios, results) if s.kind == "copy"), default=None)
    by_kind: dict[str, dict[int, Measurement]] = {}
    for scenario, m in zip(scenarios, results):
        by_kind.setdefault(scenario.kind, {})[scenario.workers] = m
    naive, compared = by_kind.get("naive", {}), by_kind.get("compared", {}).get(1)
    rows = [
        [
            "scenario",
            "records/s",
            "req/s",
            "p50 ms",
            "x naive",
            "x naive CPU",
            "x COPY",
            "x 1 worker",
            "x compared",
            "CPU% client",
            "server",
            "postgres",
            "other",
            "server ms/req",
            "srv+pg us/rec",
        ]
    ]
    for scenario, m in zip(scenarios, results):
        is_broker = scenario.kind in ("txbroker", "compared")
        baseline = naive.get(scenario.workers)
        one_worker = by_kind.get(scenario.kind, {}).get(1)
        rows.append(
            [
                scenario.name,
                f"{m.records_per_s:,.0f}",
                f"{m.requests_per_s:,.0f}",
                f"{m.latency_p50_ms:.2f}",
                _ratio(m.records_per_s, baseline.records_per_s if baseline else None) if is_broker else "-",
                _ratio(_server_and_postgres_us_per_record(baseline), _server_and_postgres_us_per_record(m))
                if is_broker and baseline
                else "-",
                _ratio(m.records_per_s, copy_best),
                _ratio(m.records_per_s, one_worker.records_per_s) if scenario.workers > 1 and one_worker else "-",
                _ratio(m.records_per_s, compared.records_per_s) if scenario.kind == "txbroker" and compared else "-",
                f"{m.client_cpu_percent:.0f}",
                f"{m.server_cpu_percent:.0f}" if scenario.server_pid else "-",
                f"{m.postgres_cpu_percent:.0f}",
                f"{m.other_cpu_percent:.0f}",
                f"{m.server_cpu_ms_per_request:.2f}" if scenario.server_pid else "-",
                f"{_server_and_postgres_us_per_record(m):.1f}",
            ]
        )
    return align(rows)


async def run(
    args: argparse.Namespace,
    scenarios: list[Scenario],
    raw_url: str,
    postmaster_pid: int,
    client_processes: ClientProcesses | None,
) -> list[Measurement]:
    measured: list[list[Measurement]] = [[] for _ in scenarios]
    for round_number in range(1, args.rounds + 1):
        print(f"round {round_number} of {args.rounds}", flush=True)
        for scenario, measurements in zip(scenarios, measured):
            measurement = await measure(
                scenario.make_workload,
                scenario.clients,
                args.warmup,
                args.seconds,
                CpuMeter(postmaster_pid, scenario.server_pid),
                client_processes if scenario.server_pid else None,
            )
            print(
                f"  {scenario.name}: {measurement.records_per_s:,.0f} records/s "
                f"(other {measurement.other_cpu_percent:.0f}% CPU)",
                flush=True,
            )
            measurements.append(measurement)
    return [median_of(measurements) for measurements in measured]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with BenchProcesses() as processes:
        raw_url = processes.database(RAW_DATABASE)
        value = record_value(args.value_bytes)
        workload = partial(
            ProduceAcrossPartitions,
            topic=TOPIC,
            value=value,
            records_per_batch=args.batch,
            partitions=args.partitions,
            total_clients=args.clients,
        )
        scenarios: list[Scenario] = []
        if args.compare_with is not None:
            server = processes.txbroker(processes.database("bench_compared"), checkout=args.compare_with.resolve())
            asyncio.run(create_topic(server.url, TOPIC, args.partitions))
            scenarios.append(
                Scenario(
                    f"txbroker of {args.compare_with.name}, 1 worker",
                    "compared",
                    1,
                    args.clients,
                    partial(workload, server.url),
                    server.pid,
                )
            )
        if args.only is None:
            scenarios.append(
                Scenario(
                    f"raw COPY, {COPY_ROWS} rows/COPY, {COPY_CONNECTIONS} conn",
                    "copy",
                    0,
                    COPY_CONNECTIONS,
                    partial(RawCopy, raw_url, value, COPY_ROWS, OffsetSource()),
                    None,
                )
            )
        for workers in args.workers:
            kinds = ["txbroker"] if args.only else ["naive", "txbroker"]
            for kind in kinds:
                url = processes.database(f"bench_{kind}_w{workers}")
                server = (
                    processes.naive_app(url, workers) if kind == "naive" else processes.txbroker(url, workers=workers)
                )
                asyncio.run(create_topic(server.url, TOPIC, args.partitions))
                scenarios.append(
                    Scenario(
                        f"{kind}, {workers} worker{'s' if workers > 1 else ''}",
                        kind,
                        workers,
                        args.clients,
                        partial(workload, server.url),
                        server.pid,
                    )
                )
        client_processes = None
        if args.client_processes > 1:
            client_processes = ClientProcesses(args.client_processes)
            processes.stop_on_exit(client_processes.close)
        print(
            f"PostgreSQL pid {processes.postgres.pid} in {processes.work_dir}; {os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}",
            flush=True,
        )
        asyncio.run(_create_raw_tables(raw_url))
        results = asyncio.run(run(args, scenarios, raw_url, processes.postgres.pid, client_processes))
    print(f"""
POST /v1/produce, {args.batch} records of {args.value_bytes} bytes per request, {args.clients} clients, \
{args.partitions} partitions; median of {args.rounds} rounds of {args.seconds:g} s.
x naive = records/s / the naive FastAPI + asyncpg app's with as many workers; x naive CPU = the naive app's
server + PostgreSQL CPU per record / this row's (the steadier ratio when the machine is busy); x COPY = records/s /
raw COPY's ({COPY_ROWS} rows per COPY, {COPY_CONNECTIONS} connections); x 1 worker = records/s / the same server's
with one worker; x compared = records/s / the --compare-with checkout's (1 worker).
CPU% = % of one core ({os.cpu_count()} cores): HTTP clients, the server (all its processes), PostgreSQL, other
(everything else the machine ran meanwhile: high means the row was disturbed).
""")
    print(format_table(scenarios, results))
    print(f"\ntotal run time {time.monotonic() - started:.0f} s")
    return 0


async def _create_raw_tables(raw_url: str) -> None:
    connection = await asyncpg.connect(raw_url)
    try:
        await connection.execute(RAW_TABLES_SQL)
    finally:
        await connection.close()


if __name__ == "__main__":
    raise SystemExit(main())
