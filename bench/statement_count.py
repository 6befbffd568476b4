"""How many SQL statements (each a PostgreSQL round trip) txbroker runs for a small transaction.

    .venv/bin/python -m bench.statement_count [--partitions 2] [--transactions 5] [--checkout DIR]

Starts an embedded PostgreSQL with `log_statement = all` and a txbroker against it, initializes one
transactional producer, then runs `--transactions` small transactions (one produce of one record to
each of `--partitions` partitions, then EndTxn commit) and counts, per transaction, the statements
PostgreSQL logged for the produce and for EndTxn (BEGIN and COMMIT included; asyncpg's statement
preparations are not statements run and are not counted); then as many read_committed fetches of
the first partition from offset 0. `--checkout DIR` counts the code of
another checkout (e.g. `git archive` of an older commit), as bench.transactions does.
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
from bench.processes import BenchProcesses

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
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    raise SystemExit(main())
