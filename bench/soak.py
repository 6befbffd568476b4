"""Soak: endless traffic against short retention, and whether storage stays flat.

Starts its own embedded PostgreSQL and one `txbroker serve` (log cleaner every `--cleaner-ms`), then
runs `--rounds` rounds of the same work: `--clients` concurrent clients, each doing per round
`--ops` iterations of one transaction (a 10-record batch and a TxnOffsetCommit, then EndTxn), one
plain 10-record produce and one plain offset commit. Every transactional id, group and key is
reused from round to round, as a long-running service does, so with retention (`--retention-ms` on
the data topics) and compaction (the internal topics) the rows a round adds are the rows the
cleaner removes.

After each round it prints the round's throughput, the live rows of `record_batches` and
`txn_markers`, and `pg_total_relation_size` of each table that grows with traffic (heap, indexes and
TOAST): after a warm-up they must stay flat.

Then (unless `--removal-batches 0`) it measures how fast the cleaner empties a partition: that many
one-record batches are written with SQL, DeleteRecords moves the log start to their end, and the
time until the cleaner has deleted them all (bounded chunks, one PostgreSQL transaction each) gives
batches removed per second.

    .venv/bin/python -m bench.soak                       # 12 rounds, about 3 minutes
    .venv/bin/python -m bench.soak --rounds 30 --ops 200 # longer
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import asyncpg
import httpx

from app.storage.log.partition_log import BATCH_COLUMNS
from bench.processes import BenchProcesses
from bench.text_table import align

DATABASE = "soak"
TABLES = (
    "record_batches",
    "txn_markers",
    "producer_states",
    "producer_ids",
    "transactions",
    "partitions",
    "group_offsets",
    "pending_txn_offsets",
)
PARTITIONS = 4
RECORDS_PER_BATCH = 10
VALUE = "x" * 100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--ops", type=int, default=100, help="iterations per client per round (default 100)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--retention-ms", type=int, default=5000, help="retention_ms of the data topics")
    parser.add_argument("--cleaner-ms", type=int, default=1000, help="the log cleaner's interval")
    parser.add_argument(
        "--removal-batches", type=int, default=200_000, help="batches for the removal-rate measurement (0: skip it)"
    )
    return parser.parse_args(argv)


async def _ok(client: httpx.AsyncClient, path: str, body: dict) -> dict:
    response = await client.post(path, json=body)
    if response.status_code != 200:
        raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:300]}")
    answer = response.json()
    for entry in answer.get("partitions", answer.get("offsets", [])):
        if entry.get("error") is not None:
            raise RuntimeError(f"POST {path}: {entry['error']}")
    return answer


class SoakClient:
    """One client: its transactional id, its partition, its group; the same ones every round."""

    def __init__(self, client: httpx.AsyncClient, number: int) -> None:
        self.client = client
        self.number = number
        self.partition = number % PARTITIONS
        self.transactional_id = f"soak-{number}"
        self.group_id = f"soak-group-{number}"
        self.producer_id = -1
        self.producer_epoch = -1
        self.committed = 0

    def _records(self, kind: str) -> list[dict]:
        return [{"key": f"{kind}-{self.number}-{i}", "value": VALUE} for i in range(RECORDS_PER_BATCH)]

    async def init(self) -> None:
        answer = await _ok(
            self.client,
            "/v1/producers/init",
            {"transactional_id": self.transactional_id, "transaction_timeout_ms": 60_000},
        )
        self.producer_id, self.producer_epoch = answer["producer_id"], answer["producer_epoch"]

    async def iteration(self) -> None:
        ids = {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }
        # Every transaction starts a new epoch (KIP-890), so sequence 0 again.
        await _ok(
            self.client,
            "/v1/produce",
            {
                **ids,
                "partitions": [
                    {
                        "topic": "soak-txn",
                        "partition": self.partition,
                        "base_sequence": 0,
                        "records": self._records("txn"),
                    }
                ],
            },
        )
        self.committed += RECORDS_PER_BATCH
        await _ok(
            self.client,
            "/v1/txn/offset-commit",
            {
                **ids,
                "group_id": self.group_id,
                "offsets": [
                    {"topic": "soak-in", "partition": self.partition, "offset": self.committed, "metadata": None}
                ],
            },
        )
        ended = await _ok(self.client, "/v1/txn/end", {**ids, "committed": True})
        self.producer_id, self.producer_epoch = ended["producer_id"], ended["producer_epoch"]
        await _ok(
            self.client,
            "/v1/produce",
            {
                "producer_id": -1,
                "partitions": [{"topic": "soak-plain", "partition": self.partition, "records": self._records("plain")}],
            },
        )
        await _ok(
            self.client,
            f"/v1/groups/{self.group_id}-plain/offsets/commit",
            {
                "offsets": [
                    {"topic": "soak-in", "partition": self.partition, "offset": self.committed, "metadata": None}
                ]
            },
        )


async def table_sizes(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT t, pg_total_relation_size(t::regclass) AS bytes FROM unnest($1::text[]) AS t", list(TABLES)
    )
    sizes = {row["t"]: row["bytes"] for row in rows}
    sizes["database"] = await conn.fetchval("SELECT pg_database_size(current_database())")
    # Live rows of the two tables the cleaner deletes from: what the sizes should follow.
    sizes["batches"] = await conn.fetchval("SELECT count(*) FROM record_batches")
    sizes["markers"] = await conn.fetchval("SELECT count(*) FROM txn_markers")
    return sizes


async def soak(args: argparse.Namespace, url: str, database_url: str) -> list[tuple[int, float, dict[str, int]]]:
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
        for name, partitions, config in (
            ("soak-txn", PARTITIONS, {"retention_ms": args.retention_ms}),
            ("soak-plain", PARTITIONS, {"retention_ms": args.retention_ms}),
            ("soak-in", PARTITIONS, {}),
        ):
            response = await admin.post("/v1/topics", json={"name": name, "partitions": partitions, "config": config})
            response.raise_for_status()
    conn = await asyncpg.connect(database_url)
    try:
        async with httpx.AsyncClient(
            base_url=url, timeout=60, limits=httpx.Limits(max_connections=args.clients)
        ) as client:
            clients = [SoakClient(client, number) for number in range(args.clients)]
            await asyncio.gather(*(c.init() for c in clients))

            async def run(c: SoakClient) -> None:
                for _ in range(args.ops):
                    await c.iteration()

            for round_number in range(1, args.rounds + 1):
                started = time.monotonic()
                await asyncio.gather(*(run(c) for c in clients))
                elapsed = time.monotonic() - started
                sizes = await table_sizes(conn)
                rows.append((round_number, args.clients * args.ops / elapsed, sizes))
                print(
                    f"round {round_number}: {args.clients * args.ops / elapsed:.0f} iterations/s, "
                    f"database {sizes['database'] / 1e6:.1f} MB",
                    flush=True,
                )
    finally:
        await conn.close()
    return rows


async def removal_rate(url: str, database_url: str, batches: int) -> float:
    """Batches per second the cleaner removes below a log start (see the module's docstring)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        (await client.post("/v1/topics", json={"name": "soak-removal", "partitions": 1})).raise_for_status()
        conn = await asyncpg.connect(database_url)
        try:
            topic_id = await conn.fetchval("SELECT topic_id FROM topics WHERE name = 'soak-removal'")
            await conn.execute(
                f"""
                WITH head AS (UPDATE partitions SET high_watermark = $2 WHERE topic_id = $1 AND partition = 0)
                INSERT INTO record_batches ({BATCH_COLUMNS})
                SELECT $1, 0, o, o, -1, -1, -1, false, NULL, 0, 0, 1, 100, convert_to('[[0,null,"' || repeat('x', 100)
                       || '",[],0]]', 'UTF8')
                FROM generate_series(0, $2 - 1) AS o""",
                topic_id,
                batches,
            )
            started = time.monotonic()
            (
                await client.post(
                    "/v1/topics/soak-removal/delete-records", json={"partitions": [{"partition": 0, "offset": -1}]}
                )
            ).raise_for_status()
            while await conn.fetchval("SELECT count(*) FROM record_batches WHERE topic_id = $1", topic_id):
                await asyncio.sleep(0.05)
            return batches / (time.monotonic() - started)
        finally:
            await conn.close()


def print_report(args: argparse.Namespace, rows: list[tuple[int, float, dict[str, int]]]) -> None:
    columns = ["database", *TABLES]
    table = [["round", "iter/s", "batches", "markers", *(f"{c} kB" for c in columns)]]
    for round_number, rate, sizes in rows:
        table.append(
            [
                str(round_number),
                f"{rate:.0f}",
                f"{sizes['batches']:,}",
                f"{sizes['markers']:,}",
                *(f"{sizes[c] // 1024:,}" for c in columns),
            ]
        )
    print(
        f"\n{args.clients} clients x {args.ops} iterations per round (each: a transaction of "
        f"{RECORDS_PER_BATCH} records with a TxnOffsetCommit, a plain produce of {RECORDS_PER_BATCH} records, "
        f"a plain offset commit); retention_ms {args.retention_ms}, cleaner every {args.cleaner_ms} ms\n"
    )
    print(align(table))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["TXBROKER_LOG_CLEANER_INTERVAL_MS"] = str(args.cleaner_ms)  # inherited by the server
    with BenchProcesses("txb-soak-") as processes:
        database_url = processes.database(DATABASE)
        server = processes.txbroker(database_url)
        print(f"PostgreSQL pid {processes.postgres.pid} in {processes.work_dir}; txbroker pid {server.pid}", flush=True)
        rows = asyncio.run(soak(args, server.url, database_url))
        rate = None
        if args.removal_batches:
            rate = asyncio.run(removal_rate(server.url, database_url, args.removal_batches))
    print_report(args, rows)
    if rate is not None:
        print(
            f"\nremoval: {args.removal_batches:,} batches below the log start removed at {rate:,.0f} batches/s "
            f"(including up to one cleaner interval, {args.cleaner_ms} ms, before the first chunk)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
