"""`python -m bench.transactions`: runs the sections asked for and prints their table (the benchmark
is described in bench/transactions/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from pathlib import Path

import bench.transactions
from bench.processes import BenchProcesses, CpuMeter, ServerSubprocess, database_url_for, print_profile
from bench.transactions.commit_to_visible import measure_commit_to_visible
from bench.transactions.fetch_vs_log_length import measure_fetch_vs_log_length
from bench.transactions.http_calls import NaiveApp
from bench.transactions.large_transactions import LARGE_TXN_RECORDS, measure_large_transaction_overhead
from bench.transactions.report import Row, format_table
from bench.transactions.small_transactions import measure_small_transactions

RAW_DATABASE = "bench_raw_txn"  # the raw PostgreSQL baseline of section 1, beside txbroker's database


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def int_list(text: str) -> list[int]:
        return [int(part) for part in text.split(",") if part]

    parser = argparse.ArgumentParser(
        prog="python -m bench.transactions",
        description=bench.transactions.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=3, help="measured time of each timed run (default 3)")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured time before each (default 0.5)")
    parser.add_argument(
        "--producers", type=int_list, default=[1, 8, 32], help="concurrent producers of section 1 (default 1,8,32)"
    )
    parser.add_argument(
        "--visible-writes",
        type=int,
        default=300,
        help="transactions (and plain writes) timed in section 2 (default 300)",
    )
    parser.add_argument(
        "--large-producers", type=int_list, default=[1, 4], help="concurrent producers of section 3 (default 1,4)"
    )
    parser.add_argument(
        "--large-shapes",
        type=lambda text: [tuple(int(n) for n in shape.split("x")) for shape in text.split(",")],
        default=[(1, LARGE_TXN_RECORDS), (10, LARGE_TXN_RECORDS // 10)],
        help="section 3's transactions, as produce requests x records each (default 1x1000,10x100)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="alternating idempotent/transactional runs of sections 1 and 3 (default 2)",
    )
    parser.add_argument(
        "--sizes",
        type=int_list,
        default=[10_000, 1_000_000, 10_000_000],
        help="records of the partitions of section 4, smallest first (default 10000,1000000,10000000)",
    )
    parser.add_argument("--fetch-samples", type=int, default=20, help="fetches timed per position (default 20)")
    parser.add_argument("--sections", type=int_list, default=[1, 2, 3, 4], help="which sections to run")
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes of txbroker (`serve --workers N`, default 1)"
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve the txbroker code of another checkout (e.g. `git archive` of an older "
        "commit) with this environment, to compare versions run after run",
    )
    parser.add_argument(
        "--profile-server",
        metavar="FILE",
        type=Path,
        help="run txbroker under cProfile (1 worker; about 2x slower), save the stats to FILE and "
        "print where its CPU went",
    )
    return parser.parse_args(argv)


async def run_sections(
    args: argparse.Namespace, server: ServerSubprocess, naive_server: ServerSubprocess, processes: BenchProcesses
) -> list[Row]:
    postgres = processes.postgres
    meter = CpuMeter(postgres.pid, server.pid)
    naive = NaiveApp(naive_server.url, CpuMeter(postgres.pid, naive_server.pid))
    rows: list[Row] = []
    if 1 in args.sections:
        rows += await measure_small_transactions(
            server.url,
            database_url_for(postgres.database_url, RAW_DATABASE),
            meter,
            naive,
            args.producers,
            args.rounds,
            args.warmup,
            args.seconds,
        )
    if 2 in args.sections:
        rows += await measure_commit_to_visible(server.url, args.visible_writes)
    if 3 in args.sections:
        rows += await measure_large_transaction_overhead(
            server.url, meter, naive, args.large_producers, args.rounds, args.warmup, args.seconds, args.large_shapes
        )
    if 4 in args.sections:
        rows += await measure_fetch_vs_log_length(
            server.url, postgres.database_url, meter, args.sizes, args.fetch_samples
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with BenchProcesses("txb-bench-txn-") as processes:
        naive_server = processes.naive_app(processes.database(RAW_DATABASE), args.workers)
        server = processes.txbroker(
            processes.postgres.database_url,
            profile_to=args.profile_server,
            workers=args.workers,
            checkout=None if args.checkout is None else args.checkout.resolve(),
        )
        print(
            f"PostgreSQL pid {processes.postgres.pid} in {processes.work_dir}; txbroker pid {server.pid} "
            f"({args.workers} worker(s){'' if args.checkout is None else ', code of ' + str(args.checkout)}); "
            f"{os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}",
            flush=True,
        )
        rows = asyncio.run(run_sections(args, server, naive_server, processes))
    print(f"""
{args.seconds:g} s measured per timed run after {args.warmup:g} s of warm-up; clients are asyncio tasks of
this process (aiohttp, one keep-alive connection each). CPU% = % of one core in the measured window
(server = the txbroker process(es), pg = postmaster and backends, cli = this process); CPU ms/op = CPU
per transaction, request or fetch. Sections 1 and 3: baseline and transactions alternate, {args.rounds}
runs each, added up; producer i writes its own partitions. Section 4: ratio = median / the smallest
partition's median at the same position (and / the previous size's).
""")
    print(format_table(rows))
    if args.profile_server is not None:
        print_profile(args.profile_server)
    print(f"\ntotal run time {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
