"""How soon a node serves: the import of the server's code, and `txbroker serve` from its exec to the
first 200 of /v1/health, with 1 and N workers, on a database already at the head migration (a
restart: after a crash, an upgrade, a configuration change).

    .venv/bin/python -m bench.startup                                  # 5 rounds, about a minute
    git archive fd35e42 | tar -x -C /tmp/txb-base                      # the code before a change...
    .venv/bin/python -m bench.startup --compare-with /tmp/txb-base     # ...measured in the same run

Each round measures every checkout in turn, alternating which goes first, so that whatever else the
machine runs weighs on both alike; each figure is the median of the rounds. `import` is the wall
time from the exec of `python -c "import app.server"` to the import's end (the interpreter's own
start included), `CPU` the server's CPU seconds (all its processes) until it answered.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.processes import REPO_ROOT, BenchProcesses, ServerSubprocess, process_tree_cpu_s
from bench.text_table import align

POLL_INTERVAL_S = 0.01


@dataclass
class Checkout:
    name: str
    root: Path
    database_url: str = ""
    imports_s: list[float] = field(default_factory=list)
    ready_s: dict[int, list[float]] = field(default_factory=dict)
    ready_cpu_s: dict[int, list[float]] = field(default_factory=dict)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each figure is their median (5)")
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2],
        help="the worker counts whose starts are measured, comma-separated (1,2)",
    )
    parser.add_argument(
        "--compare-with",
        type=Path,
        help="another checkout (e.g. `git archive COMMIT | tar -x -C DIR`), measured in the same rounds",
    )
    return parser.parse_args(argv)


def _checkout_environment(root: Path) -> dict[str, str]:
    # PYTHONPATH first: the checkout's app/ and txbroker/ before the virtualenv's editable installs.
    return {"PYTHONPATH": str(root)}


def measure_import(root: Path) -> float:
    """Seconds from the exec of `python -c "import app.server"` to the import's end (not to the
    process's: the interpreter's teardown of what it imported is no part of a start)."""
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys, app.server; sys.stdout.write('imported'); sys.stdout.flush(); os._exit(0)",
        ],
        cwd=root,
        env={**os.environ, **_checkout_environment(root)},
        stdout=subprocess.PIPE,
        check=True,
    )
    ended = time.monotonic()
    if run.stdout != b"imported":
        raise RuntimeError(f"python -c 'import app.server' in {root} printed {run.stdout!r}")
    return ended - started


def measure_start(checkout: Checkout, workers: int, kafka_address: str) -> tuple[float, float]:
    """Seconds from the exec of `txbroker serve` to its first 200 on /v1/health, and the CPU seconds
    its processes used meanwhile; the server is stopped afterwards."""
    started = time.monotonic()
    server = ServerSubprocess(
        "txbroker",
        [
            sys.executable,
            "-m",
            "txbroker.cli",
            "serve",
            "--database-url",
            checkout.database_url,
            "--log-level",
            "warning",
            "--fd",
        ],
        cwd=checkout.root,
        env={
            **_checkout_environment(checkout.root),
            "TXBROKER_WORKERS": str(workers),
            "TXBROKER_KAFKA_LISTENER": kafka_address,
        },
    )
    try:
        with httpx.Client(timeout=2) as client:
            while True:
                if server.process.poll() is not None:
                    raise RuntimeError(f"txbroker serve exited with {server.process.returncode}:\n{server.log_text()}")
                try:
                    if client.get(server.url + "/v1/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(POLL_INTERVAL_S)
        return time.monotonic() - started, process_tree_cpu_s(server.pid)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkouts = [Checkout("this checkout", REPO_ROOT)]
    if args.compare_with is not None:
        checkouts.append(Checkout(args.compare_with.name, args.compare_with.resolve()))
    with BenchProcesses(prefix="txb-bench-startup-") as processes:
        kafka_address = processes.kafka_address()
        print(
            f"PostgreSQL pid {processes.postgres.pid} in {processes.work_dir}; {os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}",
            flush=True,
        )
        for number, checkout in enumerate(checkouts):
            checkout.database_url = processes.database(f"bench_startup_{number}")
            measure_start(checkout, 1, kafka_address)  # migrates it: the measured starts are restarts
        for round_number in range(args.rounds):
            order = checkouts if round_number % 2 == 0 else checkouts[::-1]
            for checkout in order:
                checkout.imports_s.append(measure_import(checkout.root))
                for workers in args.workers:
                    ready_s, cpu_s = measure_start(checkout, workers, kafka_address)
                    checkout.ready_s.setdefault(workers, []).append(ready_s)
                    checkout.ready_cpu_s.setdefault(workers, []).append(cpu_s)
                print(
                    f"round {round_number + 1}, {checkout.name}: import {checkout.imports_s[-1]:.2f} s; "
                    + "; ".join(f"{w} worker(s) ready in {checkout.ready_s[w][-1]:.2f} s" for w in args.workers),
                    flush=True,
                )
    rows = [["", "import app.server s"] + [f"ready, {w} worker(s) s / CPU s" for w in args.workers]]
    for checkout in checkouts:
        rows.append(
            [checkout.name, f"{statistics.median(checkout.imports_s):.2f}"]
            + [
                f"{statistics.median(checkout.ready_s[w]):.2f} / {statistics.median(checkout.ready_cpu_s[w]):.2f}"
                for w in args.workers
            ]
        )
    print(f"\nmedians of {args.rounds} rounds (a restart: the database is at the head migration)\n")
    print(align(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
