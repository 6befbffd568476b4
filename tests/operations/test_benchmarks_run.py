"""`bench.transactions`, the benchmark of issue 13's transactional goals, `bench.kafka`, issue 23's
Kafka proof, and `bench.startup` still run against the server as it is: a change to the contract or to the server's
start-up that breaks them is caught here, not in the next performance round. Nothing here is timed:
a tiny run must finish and print a row for each scenario, with its baseline beside it (for
bench.transactions, the naive app answering the same two requests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

# The bench starts its own PostgreSQL, txbroker and naive app, and stops them in a finally; both
# finish well inside this on the 2-core machine (about 15 s).
RUN_TIMEOUT_S = 240


def run_bench(*arguments: str) -> str:
    """Runs a bench module to its end and returns what it printed. On a timeout it is interrupted
    (SIGINT: its finally stops what it started, by pid), then killed with its process group."""
    process = subprocess.Popen(
        [sys.executable, "-m", *arguments],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        pytest.fail(f"{' '.join(arguments)} did not finish in {RUN_TIMEOUT_S} s; it printed:\n{output}")
    assert process.returncode == 0, f"{' '.join(arguments)} exited {process.returncode}:\n{output}"
    return output


def rows_of_section(output: str, section: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"{section}  ")]


def test_transactions_bench_measures_each_transaction_scenario_against_the_naive_ceiling():
    output = run_bench(
        "bench.transactions",
        "--sections", "1,3",
        "--producers", "2",
        "--large-producers", "1",
        "--large-shapes", "1x20,2x10",
        "--rounds", "1",
        "--seconds", "0.5",
        "--warmup", "0.2",
        "--workers", "2",
    )  # fmt: skip
    [small] = rows_of_section(output, "1")
    assert "txn (produce 3 rec/2 parts + commit), 2 producers" in small
    # Every ratio is of something measured: txbroker and the naive app both served transactions.
    ratio_of_naive = re.search(r"(\d+\.\d+) of naive", small)
    naive_of_raw = re.search(r"naive app, produce \+ end as 2 requests: [\d,]+/s \((\d+\.\d+) of raw PG\)", small)
    assert ratio_of_naive and float(ratio_of_naive.group(1)) > 0, small
    assert naive_of_raw and float(naive_of_raw.group(1)) > 0, small

    large = rows_of_section(output, "3")
    assert [row.split("  ")[1] for row in large] == [
        "txn of 1 produce of 20 x 100 B + commit, 1 producers",
        "txn of 2 produces of 10 x 100 B + commit, 1 producers",
    ]
    for row in large:
        assert re.search(r"overhead -?\d+\.\d% \(CPU [+-]?-?\d+%\); naive app's -?\d+\.\d%", row), row
        assert re.search(r"naive app: [1-9][\d,]* records/s, with an end request [1-9][\d,]*", row), row


def test_kafka_bench_measures_each_section_against_its_baseline():
    """`bench.kafka --quick`: every section of issue 23's proof runs with real confluent-kafka clients
    against the server's Kafka listener and prints its row, with a baseline measured in the run."""
    output = run_bench("bench.kafka", "--quick", "--workers", "1")
    rows = {section: rows_of_section(output, section) for section in "12345"}
    assert [len(rows[section]) for section in "12345"] == [2, 1, 1, 1, 1], output
    copy, over_http = rows["1"]
    assert re.search(r"raw COPY .*: [1-9][\d,]* records/s", copy), copy
    assert re.search(r"POST /v1/produce .*: [1-9][\d,]* records/s", over_http), over_http
    for row in [copy, over_http, *rows["2"], *rows["3"], *rows["4"]]:
        # Kafka's clients moved records, and the ratio to the baseline has the CPU ratio beside it.
        assert re.search(r"  [1-9][\d,]* (records|txn)/s", row), row
        assert re.search(r"  \d+\.\d\d \(target >= [\d.]+\); CPU \d+\.\d\d", row), row
    assert re.search(r"p50 \d+\.\d\d ms, p99 \d+\.\d\d ms", rows["5"][0]), rows["5"]


def test_startup_bench_measures_the_import_and_a_restart():
    """`bench.startup`, one round of one worker: the import's figure and a restart's, with its CPU."""
    output = run_bench("bench.startup", "--rounds", "1", "--workers", "1")
    row = next(line for line in output.splitlines() if line.startswith("this checkout  "))
    assert re.fullmatch(r"this checkout +\d+\.\d\d +\d+\.\d\d / \d+\.\d\d", row), output
