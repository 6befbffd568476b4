"""What the benchmark measures: each workload is one kind of request, repeated by concurrent clients
for a fixed time by bench/timed_run.py.

Baselines (PostgreSQL directly, through asyncpg, in the bench process):
- `RawCopy`: COPY of records into a table with a row per record, the raw write ceiling.
- `RowPerBatchInsert`: one row per 100-record batch, payload `STORAGE EXTERNAL` — txbroker's layout
  without HTTP, JSON or Python in between.
- `RawSelect`: reading back the row-per-record table by offset ranges.
Over HTTP (bench/load_client.py: aiohttp, keep-alive, one connection per client):
- `EmptyPost`: the plain HTTP ceiling of the server stack.
- `Produce`: POST /v1/produce with producer_id -1, one partition per client.
- `Fetch`: POST /v1/fetch, each client reading its own partition from the start, again and again.
Workloads are built from picklable arguments (functools.partial of the class), so the HTTP ones can
run in client subprocesses (bench/timed_run.py).
"""

from __future__ import annotations

import time
from typing import Protocol

import asyncpg
import orjson

from bench.load_client import LoadClient

RAW_TABLES_SQL = """
CREATE TABLE raw_records (record_offset bigint PRIMARY KEY, key bytea, value bytea,
                          timestamp_ms bigint NOT NULL);
CREATE TABLE raw_batches (base_offset bigint PRIMARY KEY, last_offset bigint NOT NULL,
                          record_count int NOT NULL, payload bytea NOT NULL);
-- As txbroker's record_batches.records (alembic 0001): out of line, uncompressed.
ALTER TABLE raw_batches ALTER COLUMN payload SET STORAGE EXTERNAL;
"""
RAW_RECORD_COLUMNS = ["record_offset", "key", "value", "timestamp_ms"]
PLAIN_WRITE = -1  # producer_id / producer_epoch of a non-idempotent write


class Workload(Protocol):
    """Clients are numbered across every client process of a run, so client i of any process may
    own partition i."""

    async def open(self, clients: list[int]) -> None: ...

    async def run_once(self, client: int) -> int:
        """Sends one request as client number `client`; returns the records it wrote or read."""

    async def close(self) -> None: ...


def record_value(value_bytes: int) -> str:
    """A fixed ASCII value: as many UTF-8 bytes as characters, so a record is exactly this big."""
    return ("0123456789abcdefghijklmnopqrstuvwxyz" * (value_bytes // 36 + 1))[:value_bytes]


def stored_batch_payload(value: str, record_count: int, timestamp_ms: int) -> bytes:
    """A batch as txbroker's record_codec stores it: [timestamp, key, value, headers, form] each."""
    return orjson.dumps([[timestamp_ms, None, value, [], 0]] * record_count)


# ---- PostgreSQL baselines


class OffsetSource:
    """The next free offset of a baseline table (clients of one process take turns, no lock needed)."""

    def __init__(self) -> None:
        self.next_offset = 0

    def take(self, count: int) -> int:
        first, self.next_offset = self.next_offset, self.next_offset + count
        return first


class _Connections:
    """One asyncpg connection per client."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.connections: dict[int, asyncpg.Connection] = {}

    async def open(self, clients: list[int]) -> None:
        self.connections = {client: await asyncpg.connect(self.database_url) for client in clients}

    async def close(self) -> None:
        for connection in self.connections.values():
            await connection.close()


class RawCopy(_Connections):
    """COPY of `records_per_copy` records per statement, each statement its own committed transaction.
    `offsets` hands out the next free offset; shared by every client and run, so none collide."""

    def __init__(self, database_url: str, value: str, records_per_copy: int, offsets: OffsetSource) -> None:
        super().__init__(database_url)
        self.value = value.encode()
        self.records_per_copy = records_per_copy
        self.offsets = offsets

    async def run_once(self, client: int) -> int:
        base = self.offsets.take(self.records_per_copy)
        now_ms = int(time.time() * 1000)
        rows = [(base + i, None, self.value, now_ms) for i in range(self.records_per_copy)]
        await self.connections[client].copy_records_to_table("raw_records", records=rows, columns=RAW_RECORD_COLUMNS)
        return self.records_per_copy


class RowPerBatchInsert(_Connections):
    """INSERT of one row holding a whole batch, each its own committed transaction (as a produce
    request of that batch commits once)."""

    SQL = "INSERT INTO raw_batches (base_offset, last_offset, record_count, payload) VALUES ($1, $2, $3, $4)"

    def __init__(self, database_url: str, value: str, records_per_batch: int, offsets: OffsetSource) -> None:
        super().__init__(database_url)
        self.payload = stored_batch_payload(value, records_per_batch, int(time.time() * 1000))
        self.records_per_batch = records_per_batch
        self.offsets = offsets

    async def run_once(self, client: int) -> int:
        base = self.offsets.take(self.records_per_batch)
        await self.connections[client].execute(
            self.SQL, base, base + self.records_per_batch - 1, self.records_per_batch, self.payload
        )
        return self.records_per_batch


class RawSelect(_Connections):
    """Reads `raw_records` in offset order, `rows_per_query` at a time, from the start again at the end."""

    SQL = (
        "SELECT record_offset, key, value, timestamp_ms FROM raw_records "
        "WHERE record_offset >= $1 ORDER BY record_offset LIMIT $2"
    )

    def __init__(self, database_url: str, rows_per_query: int) -> None:
        super().__init__(database_url)
        self.rows_per_query = rows_per_query
        self.positions: dict[int, int] = {}

    async def open(self, clients: list[int]) -> None:
        await super().open(clients)
        self.positions = dict.fromkeys(clients, 0)

    async def run_once(self, client: int) -> int:
        rows = await self.connections[client].fetch(self.SQL, self.positions[client], self.rows_per_query)
        self.positions[client] = rows[-1]["record_offset"] + 1 if len(rows) == self.rows_per_query else 0
        return len(rows)


# ---- over HTTP


class _HttpClients:
    """One LoadClient (bench/load_client.py) that keeps one keep-alive connection per client."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http: LoadClient | None = None

    async def open(self, clients: list[int]) -> None:
        self.http = LoadClient(self.base_url, len(clients))

    async def close(self) -> None:
        await self.http.aclose()

    async def post(self, path: str, body: bytes) -> bytes:
        status, content = await self.http.post(path, body)
        if status != 200:
            raise RuntimeError(f"POST {path} answered {status}: {content[:500].decode(errors='replace')}")
        return content


class EmptyPost(_HttpClients):
    async def run_once(self, client: int) -> int:
        await self.post("/empty", b"")
        return 0


def _check_partition_entry(entry: dict, request: str) -> dict:
    if entry["error"] is not None:
        raise RuntimeError(f"{request} failed for {entry['topic']}-{entry['partition']}: {entry['error']}")
    return entry


class Produce(_HttpClients):
    """POST /v1/produce of `records_per_batch` records, producer_id -1; client i writes partition i.
    Bodies are serialized once up front so the client spends its CPU on HTTP, not on JSON."""

    def __init__(self, base_url: str, topic: str, value: str, records_per_batch: int) -> None:
        super().__init__(base_url)
        self.topic = topic
        self.value = value
        self.records_per_batch = records_per_batch
        self.bodies: dict[int, bytes] = {}

    async def open(self, clients: list[int]) -> None:
        await super().open(clients)
        records = [{"key": None, "value": self.value}] * self.records_per_batch
        self.bodies = {
            client: orjson.dumps(
                {
                    "producer_id": PLAIN_WRITE,
                    "producer_epoch": PLAIN_WRITE,
                    "partitions": [{"topic": self.topic, "partition": client, "records": records}],
                }
            )
            for client in clients
        }

    async def run_once(self, client: int) -> int:
        [entry] = orjson.loads(await self.post("/v1/produce", self.bodies[client]))["partitions"]
        _check_partition_entry(entry, "produce")
        return self.records_per_batch


class Fetch(_HttpClients):
    """POST /v1/fetch of up to `max_records`; client i reads partition i, from offset 0 again once it
    reaches the high watermark."""

    def __init__(self, base_url: str, topic: str, max_records: int) -> None:
        super().__init__(base_url)
        self.topic = topic
        self.max_records = max_records
        self.positions: dict[int, int] = {}

    async def open(self, clients: list[int]) -> None:
        await super().open(clients)
        self.positions = dict.fromkeys(clients, 0)

    async def run_once(self, client: int) -> int:
        body = orjson.dumps(
            {
                "max_records": self.max_records,
                "partitions": [{"topic": self.topic, "partition": client, "offset": self.positions[client]}],
            }
        )
        [entry] = orjson.loads(await self.post("/v1/fetch", body))["partitions"]
        _check_partition_entry(entry, "fetch")
        next_offset = entry["next_offset"]
        self.positions[client] = 0 if next_offset >= entry["high_watermark"] else next_offset
        return len(entry["records"])


class ProduceAcrossPartitions(_HttpClients):
    """POST /v1/produce of `records_per_batch` records, producer_id -1, one partition per request;
    client i of C writes partitions i, i + C, i + 2C, ... of `partitions` in turn, so every partition
    is written and no two clients share one (as Kafka producers spread over a topic)."""

    def __init__(
        self, base_url: str, topic: str, value: str, records_per_batch: int, partitions: int, total_clients: int
    ) -> None:
        super().__init__(base_url)
        self.topic = topic
        self.value = value
        self.records_per_batch = records_per_batch
        self.partitions = partitions
        self.total_clients = total_clients
        self.bodies: dict[int, list[bytes]] = {}
        self.turns: dict[int, int] = {}

    async def open(self, clients: list[int]) -> None:
        await super().open(clients)
        records = [{"key": None, "value": self.value}] * self.records_per_batch
        self.bodies = {
            client: [
                orjson.dumps(
                    {
                        "producer_id": PLAIN_WRITE,
                        "producer_epoch": PLAIN_WRITE,
                        "partitions": [{"topic": self.topic, "partition": partition, "records": records}],
                    }
                )
                for partition in range(client % self.partitions, self.partitions, self.total_clients)
            ]
            for client in clients
        }
        self.turns = dict.fromkeys(clients, 0)

    async def run_once(self, client: int) -> int:
        bodies = self.bodies[client]
        body = bodies[self.turns[client] % len(bodies)]
        self.turns[client] += 1
        [entry] = orjson.loads(await self.post("/v1/produce", body))["partitions"]
        _check_partition_entry(entry, "produce")
        return self.records_per_batch
