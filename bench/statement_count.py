"""How many SQL statements (each a PostgreSQL round trip) txbroker runs for a small transaction.

    .venv/bin/python -m bench.statement_count [--partitions 2] [--transactions 5] [--checkout DIR] [--kafka]

Starts an embedded PostgreSQL with `log_statement = all` and a txbroker against it, initializes one
transactional producer, then runs `--transactions` small transactions (one produce of one record to
each of `--partitions` partitions, then EndTxn commit) and counts, per transaction, the statements
PostgreSQL logged for the produce and for EndTxn (BEGIN and COMMIT included; asyncpg's statement
preparations are not statements run and are not counted); then as many read_committed fetches of
the first partition from offset 0. `--checkout DIR` counts the code of
another checkout (e.g. `git archive` of an older commit), as bench.transactions does.

`--kafka` counts a confluent-kafka transactional producer's small transactions instead (bench.kafka's
section 4: one record to each partition, then commit_transaction), through the server's Kafka
listener: the statements of each transaction and how they group in PostgreSQL transactions (BEGIN
to COMMIT; `--show` prints the last transaction's). Before statement logging is turned on, it times
`--timed` such transactions (default 500) and reports the server's and PostgreSQL's CPU per
transaction, a figure that does not depend on how busy the machine's other cores are.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from pathlib import Path

import asyncpg
import httpx

from app.runtime.embedded_postgres import EmbeddedPostgres
from bench.processes import BenchProcesses, CpuMeter, print_profile

# One line per statement run: simple-protocol statements ("statement: BEGIN;") and prepared ones
# ("execute <name>: ..." or "execute <unnamed>: ..."), never "parse"/"bind" lines.
_STATEMENT_LINE = re.compile(r"LOG:\s+(statement|execute [^:]*):")


def _statements_since(postgres: EmbeddedPostgres, offset: int) -> tuple[int, list[str]]:
    with open(postgres.log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    lines = [line for line in text.splitlines() if _STATEMENT_LINE.search(line)]
    return len(lines), lines


def _log_end(postgres: EmbeddedPostgres) -> int:
    time.sleep(0.2)  # let the server's logger write what it has
    return postgres.log_path.stat().st_size


async def _enable_statement_logging(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.statement_count",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--partitions", type=int, default=2, help="partitions per transaction (default 2)")
    parser.add_argument("--transactions", type=int, default=5, help="transactions counted (default 5)")
    parser.add_argument(
        "--checkout", type=Path, default=None, metavar="DIR", help="count the txbroker code of another checkout"
    )
    parser.add_argument("--show", action="store_true", help="print the statements of the last transaction")
    parser.add_argument("--kafka", action="store_true", help="count a Kafka client's transactions instead")
    parser.add_argument("--profile-server", type=Path, default=None, metavar="FILE", help="--kafka: under cProfile")
    parser.add_argument("--timed", type=int, default=500, help="--kafka: transactions timed for CPU (default 500)")
    args = parser.parse_args(argv)
    if args.kafka:
        return _count_kafka(args)
    with BenchProcesses("txb-bench-stmts-") as processes:
        server = processes.txbroker(
            processes.postgres.database_url, checkout=None if args.checkout is None else args.checkout.resolve()
        )
        asyncio.run(_enable_statement_logging(processes.postgres.database_url))
        with httpx.Client(base_url=server.url, timeout=30) as http:
            http.post("/v1/topics", json={"name": "counted", "partitions": args.partitions}).raise_for_status()
            ids = http.post(
                "/v1/producers/init",
                json={
                    "transactional_id": "counted",
                    "transaction_timeout_ms": 60000,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
            ).json()
            producer_id, epoch = ids["producer_id"], ids["producer_epoch"]
            produce_counts, end_counts = [], []
            for _ in range(args.transactions):
                start = _log_end(processes.postgres)
                http.post(
                    "/v1/produce",
                    json={
                        "transactional_id": "counted",
                        "producer_id": producer_id,
                        "producer_epoch": epoch,
                        "partitions": [
                            {"topic": "counted", "partition": p, "base_sequence": 0, "records": [{"value": "x"}]}
                            for p in range(args.partitions)
                        ],
                    },
                ).raise_for_status()
                middle = _log_end(processes.postgres)
                ended = http.post(
                    "/v1/txn/end",
                    json={
                        "transactional_id": "counted",
                        "producer_id": producer_id,
                        "producer_epoch": epoch,
                        "committed": True,
                    },
                )
                ended.raise_for_status()
                producer_id, epoch = ended.json()["producer_id"], ended.json()["producer_epoch"]
                end = _log_end(processes.postgres)
                produce_counts.append(
                    _statements_since(processes.postgres, start)[0] - _statements_since(processes.postgres, middle)[0]
                )
                end_counts.append(
                    _statements_since(processes.postgres, middle)[0] - _statements_since(processes.postgres, end)[0]
                )
            if args.show:
                produce_lines = _statements_since(processes.postgres, start)[1]
                print("\n".join(line[:200] for line in produce_lines))
            fetch_counts = []
            for _ in range(args.transactions):  # read_committed fetches of what the transactions wrote
                start = _log_end(processes.postgres)
                http.post(
                    "/v1/fetch", json={"partitions": [{"topic": "counted", "partition": 0, "offset": 0}]}
                ).raise_for_status()
                fetch_counts.append(_statements_since(processes.postgres, start)[0])
        print(
            f"{args.partitions} partitions, {args.transactions} transactions"
            f"{'' if args.checkout is None else ' (code of ' + str(args.checkout) + ')'}: statements per "
            f"produce {produce_counts}, per EndTxn {end_counts}, per fetch of one partition {fetch_counts}"
        )
    return 0


def _count_kafka(args: argparse.Namespace) -> int:
    with BenchProcesses("txb-bench-stmts-") as processes:
        bootstrap = processes.kafka_address()
        server = processes.txbroker(
            processes.postgres.database_url,
            checkout=None if args.checkout is None else args.checkout.resolve(),
            kafka_listener=bootstrap,
            profile_to=args.profile_server,
        )
        with httpx.Client(base_url=server.url, timeout=30) as http:
            http.post("/v1/topics", json={"name": "counted", "partitions": args.partitions}).raise_for_status()
        counts, transactions, cpu = _kafka_transactions(args, bootstrap, processes.postgres, server.pid)
        if args.show:
            print("\n\n".join("\n".join(entry[:300] for entry in group) for group in transactions[-1]))
        server_ms, postgres_ms, rate = cpu
        print(
            f"Kafka, {args.partitions} partitions, {args.transactions} transactions"
            f"{'' if args.checkout is None else ' (code of ' + str(args.checkout) + ')'}: statements per "
            f"transaction {counts}, in PostgreSQL transactions of "
            f"{[len(group) for group in transactions[-1]]} statements (the last transaction); "
            f"CPU per transaction over {args.timed}: server {server_ms:.2f} ms, PostgreSQL {postgres_ms:.2f} ms, "
            f"{rate:.0f} txn/s"
        )
    if args.profile_server is not None:
        print_profile(args.profile_server)
    return 0


def _kafka_transactions(
    args: argparse.Namespace, bootstrap: str, postgres: EmbeddedPostgres, server_pid: int
) -> tuple[list[int], list[list[list[str]]], tuple[float, float, float]]:
    """One transactional producer's small transactions: `args.timed` timed (server's and PostgreSQL's
    CPU ms per transaction, transactions/s), then `args.transactions` counted (statements of each, and
    of the last grouped by PostgreSQL transaction). The producer is closed on return."""
    from confluent_kafka import Producer  # the bench's Kafka client, only for this mode

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "transactional.id": "counted"})
    producer.init_transactions(30)

    def transact() -> None:
        producer.begin_transaction()
        for partition in range(args.partitions):
            producer.produce("counted", b"x" * 100, partition=partition)
        producer.commit_transaction(30)

    for _ in range(20):  # warm-up: metadata, connections, prepared statements
        transact()
    meter = CpuMeter(postgres.pid, server_pid)
    before = meter.snapshot()
    for _ in range(args.timed):
        transact()
    after = meter.snapshot()
    asyncio.run(_enable_statement_logging(postgres.database_url))
    counts, transactions = [], []
    for _ in range(args.transactions + 1):  # the first after logging began: not counted
        start = _log_end(postgres)
        transact()
        entries = _statement_entries_since(postgres, start)
        counts.append(len(entries))
        transactions.append(_postgres_transactions(entries))
    producer.flush(30)
    timed = max(args.timed, 1)
    cpu = (
        1000 * (after.server_s - before.server_s) / timed,
        1000 * (after.postgres_s - before.postgres_s) / timed,
        args.timed / (after.at - before.at),
    )
    return counts[1:], transactions[1:], cpu


_LOG_ENTRY_START = re.compile(r"^\d{4}-\d\d-\d\d ", re.MULTILINE)


def _statement_entries_since(postgres: EmbeddedPostgres, offset: int) -> list[str]:
    """The statements logged since `offset`, each as its text on one line (a statement's text spans
    lines in the log)."""
    with open(postgres.log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    entries = [entry for entry in _LOG_ENTRY_START.split(text) if _STATEMENT_LINE.search(entry)]
    return [" ".join(_STATEMENT_LINE.split(entry, 1)[-1].split()) for entry in entries]


def _postgres_transactions(entries: list[str]) -> list[list[str]]:
    """The statements grouped by PostgreSQL transaction: BEGIN to COMMIT or ROLLBACK, or one alone."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for line in entries:
        statement = line.split(":", 1)[-1].strip().upper()
        if current is None:
            current = [line]
            groups.append(current)
            if not statement.startswith("BEGIN"):
                current = None
            continue
        current.append(line)
        if statement.startswith(("COMMIT", "ROLLBACK")):
            current = None
    return groups


if __name__ == "__main__":
    raise SystemExit(main())
