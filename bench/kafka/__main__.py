"""`python -m bench.kafka`: runs the sections asked for and prints their table (the benchmark is
described in bench/kafka/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import time
from multiprocessing.managers import SyncManager
from pathlib import Path

import bench.kafka
from bench.kafka import clients, sections
from bench.processes import BenchProcesses, CpuMeter, print_profile
from bench.timed_run import ClientProcesses
from bench.transactions.report import format_table
from bench.workloads import RAW_TABLES_SQL

RAW_DATABASE = "bench_raw_kafka"
# --quick: every section, tiny, in seconds (tests/operations/test_benchmarks_run.py runs it). Its
# windows are long enough that each sees a transaction of 1000 records complete on a loaded machine
# (the test asserts that every row moved records; 0.5 s windows, on a machine loaded by other tests,
# could see none complete).
QUICK = {
    "seconds": 1.5,
    "warmup": 0.5,
    "rounds": 1,
    "producers": 2,
    "small_producers": [2],
    "consume_records": 2000,
    "visible_writes": 20,
    "client_processes": 2,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def int_list(text: str) -> list[int]:
        return [int(part) for part in text.split(",") if part]

    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka",
        description=bench.kafka.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=3, help="measured time of each timed run (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured time before each (default 0.5)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of each comparison (default 2)")
    parser.add_argument(
        "--producers", type=int, default=4, help="producers of sections 1 and 3, one partition each (default 4)"
    )
    parser.add_argument("--http-clients", type=int, default=16, help="HTTP produce clients of section 1 (default 16)")
    # A million, so that the row measures reading rather than the consumer's start (its first Fetch,
    # which the row shows apart and the baseline's open connection does not pay): bench/README.md.
    parser.add_argument(
        "--consume-records",
        type=int,
        default=1_000_000,
        help="records section 2 reads, at most: as many as section 1 produced (default 1000000)",
    )
    parser.add_argument("--select-rows", type=int, default=1000, help="rows per raw SELECT (default 1000)")
    parser.add_argument(
        "--small-producers", type=int_list, default=[8, 32], help="producers of section 4 (default 8,32)"
    )
    parser.add_argument("--visible-writes", type=int, default=300, help="transactions timed in section 5 (default 300)")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=4,
        help="client processes the Kafka clients run in (section 4's producers are threads spread over "
        "them; default 4)",
    )
    parser.add_argument("--sections", type=int_list, default=[1, 2, 3, 4, 5], help="which sections to run")
    parser.add_argument(
        "--workers", type=int, default=2, help="worker processes of txbroker (`serve --workers N`, default 2)"
    )
    parser.add_argument(
        "--profile-server",
        metavar="FILE",
        type=Path,
        help="run txbroker under cProfile (1 worker; about 2x slower), save the stats to FILE and print where "
        "its CPU went",
    )
    parser.add_argument("--quick", action="store_true", help="every section, tiny: checks the bench runs")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if args.profile_server is not None:
        args.workers = 1
    if 2 in args.sections and 1 not in args.sections:
        parser.error("section 2 reads what section 1 wrote: run it with section 1")
    return args


async def run_sections(args: argparse.Namespace, run: sections.Run) -> list[sections.Row]:
    rows = []
    produced = 0
    if 1 in args.sections or 3 in args.sections:
        throughput, produced = await sections.measure_produce_throughput(run, args.http_clients)
        rows += [row for row in throughput if int(row.section) in args.sections]
    if 2 in args.sections:
        rows += await sections.measure_consumer(run, min(args.consume_records, produced), args.select_rows)
    if 4 in args.sections:
        rows += await sections.measure_small_transactions(run, args.small_producers)
    if 5 in args.sections:
        rows += await sections.measure_commit_to_visible(run, args.visible_writes)
    return sorted(rows, key=lambda row: row.section)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with BenchProcesses("txb-bench-kafka-") as processes:
        raw_url = processes.database(RAW_DATABASE)
        asyncio.run(sections.create_raw_tables(raw_url, RAW_TABLES_SQL))
        bootstrap = processes.kafka_address()
        server = processes.txbroker(
            processes.postgres.database_url,
            profile_to=args.profile_server,
            workers=args.workers,
            kafka_listener=bootstrap,
        )
        pool = ClientProcesses(max(args.client_processes, args.producers))
        processes.stop_on_exit(pool.close)
        producer_pool = ClientProcesses(args.producers, niceness=clients.SATURATING_PRODUCER_NICENESS)
        processes.stop_on_exit(producer_pool.close)
        manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
        manager.start()
        processes.stop_on_exit(manager.shutdown)
        print(
            f"[{time.monotonic() - started:.0f} s] PostgreSQL pid {processes.postgres.pid} in {processes.work_dir}; "
            f"txbroker pid {server.pid} "
            f"({args.workers} worker(s), Kafka listener {bootstrap}); {pool.count} client processes "
            f"and {producer_pool.count} for the producers of section 1; "
            f"{os.cpu_count()} CPUs; Python {platform.python_version()}",
            flush=True,
        )
        run = sections.Run(
            http_url=server.url,
            bootstrap=bootstrap,
            raw_url=raw_url,
            meter=CpuMeter(processes.postgres.pid, server.pid),
            copy_meter=CpuMeter(processes.postgres.pid, None),
            pool=pool,
            producer_pool=producer_pool,
            manager=manager,
            producers=args.producers,
            rounds=args.rounds,
            warmup_s=args.warmup,
            seconds=args.seconds,
        )
        rows = asyncio.run(run_sections(args, run))
    print(f"""
{args.seconds:g} s measured per timed run after {args.warmup:g} s of warm-up, {args.rounds} alternating round(s)
added up; txbroker with {args.workers} worker(s). Kafka clients: confluent-kafka {_confluent_version()} in
{pool.count} client processes, the producers of section 1 in {producer_pool.count} more at nice
+{clients.SATURATING_PRODUCER_NICENESS} (librdkafka spins while a connection's requests are all in flight);
the baselines' clients in this process (asyncpg; aiohttp, one keep-alive connection each). CPU% = % of
one core in the measured window: srv = txbroker, pg = postmaster and backends, cli = the clients' processes,
other = everything else the machine ran (high: disturbed).
""")
    print(format_table(rows))
    if args.profile_server is not None:
        print_profile(args.profile_server)
    print(f"\ntotal run time {time.monotonic() - started:.0f} s")
    return 0


def _confluent_version() -> str:
    import confluent_kafka

    return f"{confluent_kafka.version()[0]} (librdkafka {confluent_kafka.libversion()[0]})"


if __name__ == "__main__":
    raise SystemExit(main())
