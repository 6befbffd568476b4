"""The producers of the transaction benchmark, as bench.timed_run workloads: run_once is one
transaction (or one produce), of txbroker, of the naive app, or of raw PostgreSQL."""

from __future__ import annotations

import time
from dataclasses import dataclass

import asyncpg
import orjson

from bench.load_client import LoadClient
from bench.naive_app import APPEND_SQL as NAIVE_APPEND_SQL
from bench.naive_app import TABLES_SQL as NAIVE_TABLES_SQL
from bench.transactions.http_calls import check_partitions, http_client, post_json

SMALL_TXN_RECORDS = (2, 1)  # records per partition of one small transaction: 3 over 2 partitions
LARGE_VALUE_BYTES = 100  # the values of section 3's transactions and of section 4's built partitions


@dataclass
class ProducerState:
    """A producer's id, epoch and next sequence per partition, as the server last answered them."""

    producer_id: int
    producer_epoch: int
    next_sequence: list[int]  # per partition of the client


class _ClientPartitions:
    """What the workloads over HTTP share: client c writes `records_per_partition[i]` records to
    partition c * len(records_per_partition) + i of `topic`, `produces` produce requests per
    run_once, then (`transactional`) ends the transaction, over one keep-alive connection per client."""

    def __init__(
        self,
        base_url: str,
        topic: str,
        records_per_partition: tuple[int, ...],
        value: str,
        transactional: bool,
        produces: int = 1,
    ) -> None:
        self.base_url = base_url
        self.topic = topic
        self.records_per_partition = records_per_partition
        self.transactional = transactional
        self.produces = produces
        self.records = [[{"key": None, "value": value}] * count for count in records_per_partition]
        self.http: LoadClient | None = None

    async def open(self, clients: list[int]) -> None:
        self.http = http_client(self.base_url, len(clients))

    async def close(self) -> None:
        await self.http.aclose()

    def partitions(self, client: int, records: list[list[dict]], sequences: list[int] | None = None) -> list[dict]:
        """A produce request's `partitions`: records[i] to the client's partition i (at sequences[i])."""
        first_partition = client * len(self.records)
        entries = [
            {"topic": self.topic, "partition": first_partition + i, "records": partition_records}
            for i, partition_records in enumerate(records)
        ]
        if sequences is not None:
            for entry, sequence in zip(entries, sequences):
                entry["base_sequence"] = sequence
        return entries


class ProducerWorkload(_ClientPartitions):
    """txbroker's producers, one request of all the client's partitions per produce.

    transactional: InitProducerId once per client with its own transactional id; each run_once is
    produce (partitions added implicitly) + EndTxn commit; the next transaction uses the epoch EndTxn
    returned, with sequences back at 0 (a new epoch starts at sequence 0).
    Otherwise: an idempotent producer (InitProducerId without a transactional id), whose run_once is
    the same produce with sequences that keep growing."""

    producers: dict[int, ProducerState]

    def transactional_id(self, client: int) -> str:
        return f"{self.topic}-{client}"

    async def open(self, clients: list[int]) -> None:
        await super().open(clients)
        self.producers = {}
        for client in clients:
            body = {
                "transactional_id": self.transactional_id(client) if self.transactional else None,
                "transaction_timeout_ms": 60_000,
                "producer_id": -1,
                "producer_epoch": -1,
            }
            answer = await post_json(self.http, "/v1/producers/init", body)
            self.producers[client] = ProducerState(
                answer["producer_id"], answer["producer_epoch"], [0] * len(self.records_per_partition)
            )

    async def run_once(self, client: int) -> int:
        producer = self.producers[client]
        for _ in range(self.produces):
            body = {
                "transactional_id": self.transactional_id(client) if self.transactional else None,
                "producer_id": producer.producer_id,
                "producer_epoch": producer.producer_epoch,
                "partitions": self.partitions(client, self.records, producer.next_sequence),
            }
            check_partitions(await post_json(self.http, "/v1/produce", body), "produce")
            producer.next_sequence = [seq + len(records) for seq, records in zip(producer.next_sequence, self.records)]
        if self.transactional:
            ended = await post_json(
                self.http,
                "/v1/txn/end",
                {
                    "transactional_id": self.transactional_id(client),
                    "producer_id": producer.producer_id,
                    "producer_epoch": producer.producer_epoch,
                    "committed": True,
                },
            )
            producer.producer_id, producer.producer_epoch = ended["producer_id"], ended["producer_epoch"]
            producer.next_sequence = [0] * len(self.records)  # a new epoch starts at sequence 0
        return self.produces * sum(self.records_per_partition)


class NaiveTransactionWorkload(_ClientPartitions):
    """The naive app (bench/naive_app.py) driven in the shape of a transaction over txbroker's HTTP
    contract: `produces` requests of the records, then, if `transactional`, one more request standing for
    EndTxn: a 1-record batch (a marker) to each of the client's partitions, written atomically. The
    app checks and remembers nothing: what is left is HTTP and the least durable write per request,
    so this is the ceiling of any service on this stack that answers a produce and an EndTxn as the
    two requests the contract makes them, each acknowledged once durable. Otherwise the same
    produces alone (the idempotent baseline's shape)."""

    MARKER = [{"key": None, "value": None}]

    async def run_once(self, client: int) -> int:
        for _ in range(self.produces):
            body = {"partitions": self.partitions(client, self.records)}
            check_partitions(await post_json(self.http, "/v1/produce", body), "produce")
        if self.transactional:
            body = {"partitions": self.partitions(client, [self.MARKER] * len(self.records))}
            check_partitions(await post_json(self.http, "/v1/produce", body), "end")
        return self.produces * sum(self.records_per_partition)


class RawSmallTransaction:
    """The raw PostgreSQL equivalent of a small transaction, on the naive produce app's tables
    (bench/naive_app.py): in one PostgreSQL transaction, a batch appended to each of the client's
    two partitions (the watermark bumped and the batch row inserted, one CTE each) and the
    transaction's state row upserted, then COMMIT (an fsync): the 3 statements a broker without
    HTTP, Python and KIP-98's bookkeeping (sequences, markers, the transaction log) would run.
    One asyncpg connection per client; client c writes partitions 2c and 2c + 1, as above."""

    STATE_SQL = (
        "INSERT INTO raw_txn_state (transactional_id, state, updated_ms) VALUES ($1, 'CompleteCommit', $2) "
        "ON CONFLICT (transactional_id) DO UPDATE SET state = EXCLUDED.state, "
        "updated_ms = EXCLUDED.updated_ms"
    )

    def __init__(self, database_url: str, topic: str, value: str) -> None:
        self.database_url = database_url
        self.topic = topic
        self.payloads = [orjson.dumps([[0, None, value, [], 0]] * count) for count in SMALL_TXN_RECORDS]
        self.connections: dict[int, asyncpg.Connection] = {}

    async def open(self, clients: list[int]) -> None:
        for client in clients:
            conn = self.connections[client] = await asyncpg.connect(self.database_url)
            await conn.executemany(
                "INSERT INTO naive_partitions (topic, partition) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                [(self.topic, client * len(SMALL_TXN_RECORDS) + i) for i in range(len(SMALL_TXN_RECORDS))],
            )

    async def close(self) -> None:
        for conn in self.connections.values():
            await conn.close()

    async def run_once(self, client: int) -> int:
        conn = self.connections[client]
        async with conn.transaction():
            for i, (count, payload) in enumerate(zip(SMALL_TXN_RECORDS, self.payloads)):
                await conn.fetchrow(NAIVE_APPEND_SQL, self.topic, client * len(SMALL_TXN_RECORDS) + i, count, payload)
            await conn.execute(self.STATE_SQL, f"{self.topic}-{client}", int(time.time() * 1000))
        return sum(SMALL_TXN_RECORDS)


RAW_TXN_TABLES_SQL = (
    NAIVE_TABLES_SQL
    + """
CREATE TABLE IF NOT EXISTS raw_txn_state (transactional_id text PRIMARY KEY, state text NOT NULL,
                                          updated_ms bigint NOT NULL);
"""
)
