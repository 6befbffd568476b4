"""Benchmark of txbroker's partition log: produce and fetch over HTTP, against the ceilings of what
lies underneath — PostgreSQL written and read directly, and the HTTP server stack doing nothing.

    .venv/bin/python -m bench.partition_log [--seconds 5] [--clients 1,4,8] [--client-processes 1]

Everything is measured in one run, on one machine, against one embedded PostgreSQL started for the
run, so the ratios are meaningful even where the absolute numbers are noisy. See bench/README.md.
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
import httpx

from bench.processes import BenchProcesses, CpuMeter, ServerSubprocess, print_profile
from bench.timed_run import ClientProcesses, Measurement, WorkloadFactory, measure, median_of
from bench.workloads import (
    RAW_TABLES_SQL,
    EmptyPost,
    Fetch,
    OffsetSource,
    Produce,
    RawCopy,
    RawSelect,
    RowPerBatchInsert,
    record_value,
)

RAW_DATABASE = "bench_raw"
TXBROKER_DATABASE = "bench_txbroker"
RAW_SELECT_ROWS = 1000
MB = 1_000_000


@dataclass(frozen=True)
class Scenario:
    name: str
    clients: int
    make_workload: WorkloadFactory
    server_pid: int | None = None  # the HTTP server whose CPU is metered; None: PostgreSQL directly
    is_copy_baseline: bool = False
    is_plain_http: bool = False
    topic_to_create: tuple[str, int] | None = None  # (name, partitions), created before it runs

    @property
    def over_http(self) -> bool:
        return self.server_pid is not None


@dataclass(frozen=True)
class Result:
    scenario: Scenario
    measurement: Measurement


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def int_list(text: str) -> list[int]:
        return [int(part) for part in text.split(",") if part]

    parser = argparse.ArgumentParser(
        prog="python -m bench.partition_log", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5, help="measured time of each scenario (default 5)")
    parser.add_argument(
        "--warmup", type=float, default=0.5, help="time each scenario runs before it is measured (default 0.5)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every scenario this many times, in turn, and report the medians: steadier "
        "ratios on a busy machine (default 1)",
    )
    parser.add_argument(
        "--clients", type=int_list, default=[1, 4, 8], help="concurrent HTTP clients, comma-separated (default 1,4,8)"
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="1: HTTP clients run in the bench process (default); N > 1: spread over N client processes",
    )
    parser.add_argument(
        "--batch-sizes",
        type=int_list,
        default=[1, 100, 1000],
        help="records per produce request, comma-separated (default 1,100,1000)",
    )
    parser.add_argument(
        "--fetch-max-records",
        type=int_list,
        default=[1000, 100],
        help="max_records of the fetch scenarios (default 1000,100)",
    )
    parser.add_argument(
        "--db-connections", type=int_list, default=[1, 4], help="connections of the PostgreSQL baselines (default 1,4)"
    )
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes of each record's value (default 100)")
    parser.add_argument(
        "--copy-records", type=int, default=1000, help="records per COPY statement of the raw baseline (default 1000)"
    )
    parser.add_argument(
        "--row-batch-records", type=int, default=100, help="records per row of the row-per-batch baseline (default 100)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes of txbroker (`serve --workers N`, default 1; profiling needs 1)",
    )
    parser.add_argument(
        "--profile-server",
        metavar="FILE",
        type=Path,
        help="run txbroker under cProfile (about 2x slower), save the stats to FILE and print where its CPU went",
    )
    parser.add_argument(
        "--compare-with",
        metavar="DIR",
        type=Path,
        help="also serve the txbroker code of this checkout (e.g. `git archive COMMIT | tar -x -C DIR`), one "
        "worker, on the same database, and run the fetch scenarios against it too, right after this code's",
    )
    args = parser.parse_args(argv)
    # Fetch reads what the produce scenario with this batch size and the most clients wrote.
    args.fetch_from_batch = 100 if 100 in args.batch_sizes else args.batch_sizes[-1]
    return args


def produce_topic(batch: int, clients: int) -> str:
    return f"produce-b{batch}-c{clients}"


def build_scenarios(
    args: argparse.Namespace,
    raw_url: str,
    txbroker: ServerSubprocess,
    empty_post: ServerSubprocess,
    compared: ServerSubprocess | None = None,
) -> list[Scenario]:
    value = record_value(args.value_bytes)
    raw_record_offsets, raw_batch_offsets = OffsetSource(), OffsetSource()
    scenarios = [
        *(
            Scenario(
                f"raw COPY, {args.copy_records} rows/COPY, {n} conn",
                n,
                partial(RawCopy, raw_url, value, args.copy_records, raw_record_offsets),
                is_copy_baseline=True,
            )
            for n in args.db_connections
        ),
        *(
            Scenario(
                f"raw INSERT row/batch of {args.row_batch_records}, {n} conn",
                n,
                partial(RowPerBatchInsert, raw_url, value, args.row_batch_records, raw_batch_offsets),
            )
            for n in args.db_connections
        ),
        Scenario(f"raw SELECT {RAW_SELECT_ROWS} rows, 1 conn", 1, partial(RawSelect, raw_url, RAW_SELECT_ROWS)),
        *(
            Scenario(
                f"empty POST, {n} clients", n, partial(EmptyPost, empty_post.url), empty_post.pid, is_plain_http=True
            )
            for n in args.clients
        ),
    ]
    for batch in args.batch_sizes:
        for clients in args.clients:
            topic = produce_topic(batch, clients)
            scenarios.append(
                Scenario(
                    f"produce batch {batch}, {clients} clients",
                    clients,
                    partial(Produce, txbroker.url, topic, value, batch),
                    txbroker.pid,
                    topic_to_create=(topic, clients),
                )
            )
    fetch_topic = produce_topic(args.fetch_from_batch, max(args.clients))
    for max_records in args.fetch_max_records:
        for clients in args.clients:
            scenarios.append(
                Scenario(
                    f"fetch max_records {max_records}, {clients} clients",
                    clients,
                    partial(Fetch, txbroker.url, fetch_topic, max_records),
                    txbroker.pid,
                )
            )
            if compared is not None:  # the same reads of the same partitions, by the other checkout's code
                scenarios.append(
                    Scenario(
                        f"fetch max_records {max_records}, {clients} clients, {args.compare_with.name}",
                        clients,
                        partial(Fetch, compared.url, fetch_topic, max_records),
                        compared.pid,
                    )
                )
    return scenarios


async def create_topic(base_url: str, name: str, partitions: int) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        response = await http.post("/v1/topics", json={"name": name, "partitions": partitions})
        if response.status_code != 201:
            raise RuntimeError(f"creating topic {name} answered {response.status_code}: {response.text}")


async def run_scenarios(
    args: argparse.Namespace,
    scenarios: list[Scenario],
    raw_url: str,
    txbroker_url: str,
    postmaster_pid: int,
    client_processes: ClientProcesses | None,
) -> list[Result]:
    connection = await asyncpg.connect(raw_url)
    try:
        await connection.execute(RAW_TABLES_SQL)
    finally:
        await connection.close()
    measurements: list[list[Measurement]] = [[] for _ in scenarios]
    for round_number in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"round {round_number} of {args.rounds}", flush=True)
        for scenario, measured in zip(scenarios, measurements):
            if scenario.topic_to_create is not None and round_number == 1:
                await create_topic(txbroker_url, *scenario.topic_to_create)
            measurement = await measure(
                scenario.make_workload,
                scenario.clients,
                args.warmup,
                args.seconds,
                CpuMeter(postmaster_pid, scenario.server_pid),
                client_processes if scenario.over_http else None,
            )  # baselines share offsets: in-process
            print(
                f"  {scenario.name}: {measurement.records_per_s:,.0f} records/s, "
                f"{measurement.requests_per_s:,.0f} req/s",
                flush=True,
            )
            measured.append(measurement)
    results = [Result(scenario, median_of(measured)) for scenario, measured in zip(scenarios, measurements)]
    return results


def _ratio(value: float, baseline: float | None) -> str:
    if not baseline or math.isnan(value):
        return "-"
    return f"{value / baseline:.2f}"


def format_table(results: list[Result], value_bytes: int) -> str:
    copy_ceiling = max(r.measurement.records_per_s for r in results if r.scenario.is_copy_baseline)
    plain_http = {r.scenario.clients: r.measurement.requests_per_s for r in results if r.scenario.is_plain_http}
    header = (
        f"{'scenario':<40} {'records/s':>10} {'MB/s':>6} {'req/s':>7} {'p50 ms':>7} {'xCOPY':>6} "
        f"{'xHTTP':>6} | {'CPU% client':>11} {'server':>6} {'postgres':>8} {'other':>5} | "
        f"{'CPU us/rec':>10} {'server ms/req':>13}"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        scenario, m = result.scenario, result.measurement
        moves_records = m.records > 0
        http_baseline = plain_http.get(scenario.clients) if scenario.over_http and not scenario.is_plain_http else None
        lines.append(
            f"{scenario.name:<40} "
            f"{(f'{m.records_per_s:,.0f}' if moves_records else '-'):>10} "
            f"{(f'{m.records_per_s * value_bytes / MB:.1f}' if moves_records else '-'):>6} "
            f"{m.requests_per_s:>7,.0f} {m.latency_p50_ms:>7.2f} "
            f"{(_ratio(m.records_per_s, copy_ceiling) if moves_records else '-'):>6} "
            f"{_ratio(m.requests_per_s, http_baseline):>6} | "
            f"{m.client_cpu_percent:>11.0f} "
            f"{(f'{m.server_cpu_percent:.0f}' if scenario.over_http else '-'):>6} "
            f"{m.postgres_cpu_percent:>8.0f} {m.other_cpu_percent:>5.0f} | "
            f"{(f'{m.cpu_us_per_record:.1f}' if moves_records else '-'):>10} "
            f"{(f'{m.server_cpu_ms_per_request:.2f}' if scenario.over_http else '-'):>13}"
        )
    return "\n".join(lines)


def print_report(args: argparse.Namespace, results: list[Result]) -> None:
    cores = os.cpu_count()
    rounds = f", median of {args.rounds} rounds" if args.rounds > 1 else ""
    where = "the bench process" if args.client_processes <= 1 else f"{args.client_processes} client processes"
    print(f"""
{args.value_bytes}-byte values, {args.seconds:g} s measured per scenario{rounds};
MB/s counts record values (10^6 bytes).
xCOPY = records/s / the best raw COPY records/s; xHTTP = req/s / empty POST req/s with as many clients.
CPU% = % of one core in the measured window ({cores} cores in all): HTTP clients ({where}), the HTTP
server (one uvicorn process), PostgreSQL (postmaster and backends), and other = everything else the
machine ran meanwhile (high means the row was disturbed). CPU us/rec = client + server + PostgreSQL
CPU per record, what a record costs whatever else runs. server ms/req = the server's CPU per
request: 1000 / it is the req/s the server could reach with a core to itself.
Fetch reads the partitions written by "produce batch {args.fetch_from_batch}, {max(args.clients)} clients".
""")
    print(format_table(results, args.value_bytes))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with BenchProcesses() as processes:
        raw_url = processes.database(RAW_DATABASE)
        txbroker_url = processes.database(TXBROKER_DATABASE)
        txbroker = processes.txbroker(txbroker_url, profile_to=args.profile_server, workers=args.workers)
        compared = None
        if args.compare_with is not None:
            compared = processes.txbroker(txbroker_url, checkout=args.compare_with.resolve())
        empty_post = processes.empty_post_server()
        client_processes = None
        if args.client_processes > 1:
            client_processes = ClientProcesses(args.client_processes)
            processes.stop_on_exit(client_processes.close)
        print(
            f"PostgreSQL pid {processes.postgres.pid} in {processes.work_dir}; txbroker pid {txbroker.pid}; "
            f"empty POST server pid {empty_post.pid}; {os.cpu_count()} CPUs; Python {platform.python_version()}",
            flush=True,
        )
        scenarios = build_scenarios(args, raw_url, txbroker, empty_post, compared)
        results = asyncio.run(
            run_scenarios(args, scenarios, raw_url, txbroker.url, processes.postgres.pid, client_processes)
        )
    print_report(args, results)
    if args.profile_server is not None:
        print_profile(args.profile_server)
    print(f"\ntotal run time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
