"""The produce ceiling: the naive FastAPI + asyncpg app one would write in an afternoon, on the same
server stack as txbroker (uvicorn + uvloop + httptools, FastAPI) and the same storage layout (a row
per batch, payload `STORAGE EXTERNAL`, dense offsets from a per-partition high watermark), doing
one CTE statement (bump the watermark, insert the batch) per request, autocommitted.

It accepts txbroker's `POST /v1/produce` body and answers in its format, so the same client drives
both. What it leaves out is what txbroker's guarantees cost: no validation beyond what a KeyError
catches, no producer ids, sequences or transactions, no notification of long polls, no auth.
Its bodies are parsed with orjson and its payloads stored in txbroker's record format, so the
comparison is of the work, not of the JSON library.

    python -m bench.naive_app DATABASE_URL WORKERS FD     serves on the already-bound socket FD

With WORKERS > 1 it forks that many processes before starting, all accepting on FD (as
`txbroker serve --workers N` does); each dies with the parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from contextlib import asynccontextmanager

import asyncpg
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

POOL_SIZE = 16  # as txbroker's database_pool_size
PR_SET_PDEATHSIG = 1

TABLES_SQL = """
CREATE TABLE IF NOT EXISTS naive_partitions (topic text, partition int, high_watermark bigint NOT NULL DEFAULT 0,
                                             PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS naive_batches (topic text, partition int, base_offset bigint, last_offset bigint NOT NULL,
                                          record_count int NOT NULL, records bytea NOT NULL,
                                          PRIMARY KEY (topic, partition, base_offset));
ALTER TABLE naive_batches ALTER COLUMN records SET STORAGE EXTERNAL;
"""

# One statement, one transaction: the watermark's row lock orders appends to a partition.
APPEND_SQL = """
WITH head AS (
    UPDATE naive_partitions SET high_watermark = high_watermark + $3 WHERE topic = $1 AND partition = $2
    RETURNING high_watermark - $3 AS base_offset
)
INSERT INTO naive_batches (topic, partition, base_offset, last_offset, record_count, records)
SELECT $1, $2, base_offset, base_offset + $3 - 1, $3, $4 FROM head
RETURNING base_offset, last_offset
"""

# A request to several partitions: one statement for all (atomic, one round trip and one commit), the
# least a naive app could do for a write that must be all or nothing, such as a transaction's batches
# or its markers. Single-partition requests keep APPEND_SQL, bench.produce_ceiling's baseline. A
# request names each partition once (as the benches send them): UPDATE ... FROM
# moves a row once however many of `wanted` match it.
APPEND_MANY_SQL = """
WITH wanted AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::bytea[]) AS w(topic, partition, record_count, records)
), head AS (
    UPDATE naive_partitions p SET high_watermark = p.high_watermark + w.record_count
    FROM wanted w WHERE p.topic = w.topic AND p.partition = w.partition
    RETURNING p.topic, p.partition, p.high_watermark - w.record_count AS base_offset, w.record_count, w.records
)
INSERT INTO naive_batches (topic, partition, base_offset, last_offset, record_count, records)
SELECT topic, partition, base_offset, base_offset + record_count - 1, record_count, records FROM head
RETURNING topic, partition, base_offset, last_offset
"""


def create_app(database_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.pool = await asyncpg.create_pool(database_url, min_size=POOL_SIZE, max_size=POOL_SIZE)
        try:
            yield
        finally:
            await app.state.pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/topics", status_code=201)
    async def create_topic(request: Request) -> Response:
        body = orjson.loads(await request.body())
        async with app.state.pool.acquire() as conn:
            await conn.executemany(
                "INSERT INTO naive_partitions (topic, partition) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                [(body["name"], p) for p in range(body["partitions"])],
            )
        return Response(b"{}", status_code=201, media_type="application/json")

    @app.post("/v1/produce")
    async def produce(request: Request) -> Response:
        body = orjson.loads(await request.body())
        now_ms = int(time.time() * 1000)
        entries = body["partitions"]
        payloads = [
            orjson.dumps(
                [
                    [
                        record.get("timestamp_ms") or now_ms,
                        record.get("key"),
                        record.get("value"),
                        [[h["key"], h.get("value")] for h in record.get("headers", ())],
                        0,
                    ]
                    for record in entry["records"]
                ]
            )
            for entry in entries
        ]
        async with app.state.pool.acquire() as conn:
            if len(entries) == 1:
                [entry], [payload] = entries, payloads
                row = await conn.fetchrow(
                    APPEND_SQL, entry["topic"], entry["partition"], len(entry["records"]), payload
                )
                rows = [{"topic": entry["topic"], "partition": entry["partition"], **dict(row)}]
            else:
                rows = await conn.fetch(
                    APPEND_MANY_SQL,
                    [entry["topic"] for entry in entries],
                    [entry["partition"] for entry in entries],
                    [len(entry["records"]) for entry in entries],
                    payloads,
                )
        results = [
            {
                "topic": row["topic"],
                "partition": row["partition"],
                "base_offset": row["base_offset"],
                "last_offset": row["last_offset"],
                "duplicate": False,
                "error": None,
            }
            for row in rows
        ]
        return Response(orjson.dumps({"partitions": results}), media_type="application/json")

    @app.get("/v1/health")
    async def health() -> Response:
        return Response(b'{"status": "ok"}', media_type="application/json")

    return app


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _create_tables(database_url: str) -> None:
    import asyncio

    async def create() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(TABLES_SQL)
        finally:
            await conn.close()

    asyncio.run(create())


def main(database_url: str, workers: int, fd: int) -> None:
    _create_tables(database_url)
    parent = os.getpid()
    children = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:
            _die_with_parent(parent)
            children = []
            break
        children.append(pid)
    try:
        uvicorn.run(
            create_app(database_url), fd=fd, loop="uvloop", http="httptools", log_level="warning", access_log=False
        )
    finally:
        for pid in children:
            os.kill(pid, signal.SIGTERM)
        for pid in children:
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
