"""Benchmark of txbroker's transactions (KIP-98 over HTTP), each result next to a baseline measured in
the same run on the same embedded PostgreSQL and server:

1. small transactions/s (3 records over 2 partitions, then commit) with 1, 8 and 32 producers,
   against the same records written by idempotent producers without a transaction, against raw
   PostgreSQL's 3-statement transaction, and against the naive app (bench/naive_app.py) answering
   the same two requests (the produce, then a stand-in for EndTxn): the ceiling of that HTTP shape;
2. end-to-end latency, commit acknowledged -> visible to a read_committed long-poll fetch, against
   a plain produce acknowledged -> visible;
3. 1000-record transactions against the same records written idempotently: the commit overhead,
   beside the naive app's overhead for the one request more;
4. read_committed fetch latency and cost at the start, middle and end of partitions of 10k, 1M and
   10M records (10% aborted), built directly in PostgreSQL with COPY in the server's format.

    .venv/bin/python -m bench.transactions [--seconds 3] [--sizes 10000,1000000,10000000]

Starts and stops its own embedded PostgreSQL and `txbroker serve` (by pid, in a finally). See
bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import asyncpg
import orjson

from app.storage import record_codec
from app.storage.embedded_postgres import EmbeddedPostgres
from app.storage.partition_log import CONTROL_ABORT, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE
from bench.load_client import LoadClient
from bench.naive_app import APPEND_SQL as NAIVE_APPEND_SQL
from bench.naive_app import TABLES_SQL as NAIVE_TABLES_SQL
from bench.partition_log import print_profile
from bench.processes import CpuMeter, ServerSubprocess, database_url_for, start_naive_app, start_txbroker
from bench.timed_run import Measurement, WorkloadFactory, measure
from bench.workloads import record_value

SMALL_TXN_RECORDS = (2, 1)  # records per partition of one small transaction: 3 over 2 partitions
RAW_DATABASE = "bench_raw_txn"  # the raw PostgreSQL baseline of section 1, beside txbroker's database
LARGE_TXN_RECORDS = 1000
LARGE_VALUE_BYTES = 100
BATCH_RECORDS = 100  # records per batch of the directly built partitions
ABORTED_EVERY = 10  # every 10th batch is a transactional batch that is aborted
FETCH_RECORDS = 500
EPOCHS_PER_PRODUCER = 1000  # aborted transactions per producer id in the built partitions


# ---- HTTP


async def post_json(http: LoadClient, path: str, body: dict) -> dict:
    status, content = await http.post(path, orjson.dumps(body))
    if status not in (200, 201):
        raise RuntimeError(f"POST {path} answered {status}: {content[:500].decode(errors='replace')}")
    return orjson.loads(content)


def check_partitions(answer: dict, request: str) -> list[dict]:
    for entry in answer["partitions"]:
        if entry["error"] is not None:
            raise RuntimeError(f"{request} failed on {entry['topic']}-{entry['partition']}: {entry['error']}")
    return answer["partitions"]


async def create_topic(http: LoadClient, name: str, partitions: int) -> None:
    await post_json(http, "/v1/topics", {"name": name, "partitions": partitions})


def http_client(base_url: str, connections: int) -> LoadClient:
    """Keep-alive connections, one per concurrent client."""
    return LoadClient(base_url, connections)


@dataclass(frozen=True)
class NaiveApp:
    """The naive produce app (bench/naive_app.py) serving beside txbroker, on the raw baseline's
    database: the ceiling of sections 1 and 3's HTTP shape. `meter` counts its processes as the server."""

    url: str
    meter: CpuMeter

    async def create_topic(self, name: str, partitions: int) -> None:
        async with http_client(self.url, 1) as http:
            await create_topic(http, name, partitions)


# ---- producers, as bench.timed_run workloads: run_once is one transaction (or one produce)


@dataclass
class _Producer:
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

    producers: dict[int, _Producer]

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
            self.producers[client] = _Producer(
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


# ---- the table


@dataclass(frozen=True)
class Row:
    section: str
    scenario: str
    result: str
    baseline: str = "-"
    ratio: str = "-"
    cpu_percent: str = "-"  # server / postgres / client / everything else, % of one core
    cpu_ms_per_op: str = "-"  # server / postgres


def format_table(rows: list[Row]) -> str:
    headers = ("#", "scenario", "result", "baseline (same run)", "ratio", "CPU% srv/pg/cli/other", "CPU ms/op srv/pg")
    cells = [(r.section, r.scenario, r.result, r.baseline, r.ratio, r.cpu_percent, r.cpu_ms_per_op) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    out = [line(headers), "  ".join("-" * w for w in widths)]
    previous = None
    for c in cells:
        if previous is not None and c[0] != previous:
            out.append("")
        out.append(line(c))
        previous = c[0]
    return "\n".join(out)


# ---- timed runs of a baseline and of transactions, in alternation


@dataclass
class Tally:
    """Measurements of one scenario added up over rounds."""

    seconds: float = 0.0
    records: int = 0
    requests: int = 0
    server_cpu_s: float = 0.0
    postgres_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    other_cpu_s: float = 0.0
    latency_p50_ms: list[float] = field(default_factory=list)  # one per run

    def add(self, m: Measurement) -> None:
        self.seconds += m.seconds
        self.records += m.records
        self.requests += m.requests
        self.server_cpu_s += m.server_cpu_percent * m.seconds / 100
        self.postgres_cpu_s += m.postgres_cpu_percent * m.seconds / 100
        self.client_cpu_s += m.client_cpu_percent * m.seconds / 100
        self.other_cpu_s += m.other_cpu_percent * m.seconds / 100
        self.latency_p50_ms.append(m.latency_p50_ms)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def latency_ms(self) -> float:
        return statistics.median(self.latency_p50_ms)

    @property
    def server_and_postgres_cpu_s_per_request(self) -> float:
        """What one request (or transaction) costs the machine, which decides throughput once it is busy."""
        return (self.server_cpu_s + self.postgres_cpu_s) / self.requests

    def cpu_cells(self) -> tuple[str, str]:
        percent = (
            f"{100 * self.server_cpu_s / self.seconds:.0f}/{100 * self.postgres_cpu_s / self.seconds:.0f}/"
            f"{100 * self.client_cpu_s / self.seconds:.0f}/{100 * self.other_cpu_s / self.seconds:.0f}"
        )
        return (
            percent,
            f"{1000 * self.server_cpu_s / self.requests:.2f}/{1000 * self.postgres_cpu_s / self.requests:.2f}",
        )


async def measure_alternating(
    baseline: WorkloadFactory,
    contender: WorkloadFactory,
    clients: int,
    rounds: int,
    warmup_s: float,
    seconds: float,
    meter: CpuMeter,
) -> tuple[Tally, Tally]:
    """Runs baseline, contender, baseline, contender... (`rounds` of each), so that the drifts of a
    noisy machine hit both alike."""
    baseline_tally, contender_tally = Tally(), Tally()
    for _ in range(rounds):
        baseline_tally.add(await measure(baseline, clients, warmup_s, seconds, meter))
        contender_tally.add(await measure(contender, clients, warmup_s, seconds, meter))
    return baseline_tally, contender_tally


# ---- 1. small transactions/s


async def measure_small_transactions(
    base_url: str,
    raw_url: str,
    meter: CpuMeter,
    naive: NaiveApp,
    producer_counts: list[int],
    rounds: int,
    warmup_s: float,
    seconds: float,
) -> list[Row]:
    rows = []
    value = record_value(100)
    conn = await asyncpg.connect(raw_url)
    try:
        await conn.execute(RAW_TXN_TABLES_SQL)
    finally:
        await conn.close()
    async with http_client(base_url, 1) as http:
        for producers in producer_counts:
            partitions = producers * len(SMALL_TXN_RECORDS)
            idempotent_topic, txn_topic = f"small-idem-p{producers}", f"small-txn-p{producers}"
            await create_topic(http, idempotent_topic, partitions)
            await create_topic(http, txn_topic, partitions)
            raw = Tally()
            for _ in range(rounds):
                raw.add(
                    await measure(
                        partial(RawSmallTransaction, raw_url, f"raw-p{producers}", value),
                        producers,
                        warmup_s,
                        seconds,
                        meter,
                    )
                )
            naive_topic = f"small-naive-p{producers}"
            await naive.create_topic(naive_topic, partitions)
            naive_txns = Tally()
            for _ in range(rounds):
                naive_txns.add(
                    await measure(
                        partial(NaiveTransactionWorkload, naive.url, naive_topic, SMALL_TXN_RECORDS, value, True),
                        producers,
                        warmup_s,
                        seconds,
                        naive.meter,
                    )
                )
            idempotent, txns = await measure_alternating(
                partial(ProducerWorkload, base_url, idempotent_topic, SMALL_TXN_RECORDS, value, False),
                partial(ProducerWorkload, base_url, txn_topic, SMALL_TXN_RECORDS, value, True),
                producers,
                rounds,
                warmup_s,
                seconds,
                meter,
            )
            print(
                f"  small transactions, {producers} producers: {txns.requests_per_s:,.0f} txn/s; "
                f"idempotent produce {idempotent.requests_per_s:,.0f} req/s; raw PostgreSQL "
                f"{raw.requests_per_s:,.0f} txn/s; naive app, 2 requests: {naive_txns.requests_per_s:,.0f} txn/s",
                flush=True,
            )
            percent, per_op = txns.cpu_cells()
            naive_of_raw = naive_txns.requests_per_s / raw.requests_per_s
            cpu_factor = txns.server_and_postgres_cpu_s_per_request / idempotent.server_and_postgres_cpu_s_per_request
            rows.append(
                Row(
                    "1",
                    f"txn (produce 3 rec/2 parts + commit), {producers} producers",
                    f"{txns.requests_per_s:,.0f} txn/s, p50 {txns.latency_ms:.1f} ms",
                    f"idempotent produce of the same: {idempotent.requests_per_s:,.0f}/s, p50 "
                    f"{idempotent.latency_ms:.1f} ms (ms/req {idempotent.cpu_cells()[1]}); raw PostgreSQL 3-statement "
                    f"txn: {raw.requests_per_s:,.0f}/s; naive app, produce + end as 2 requests: "
                    f"{naive_txns.requests_per_s:,.0f}/s ({naive_of_raw:.2f} of raw PG)",
                    f"{txns.requests_per_s / idempotent.requests_per_s:.2f} of idempotent (CPU/op x{cpu_factor:.1f}); "
                    f"{txns.requests_per_s / raw.requests_per_s:.2f} of raw PG; "
                    f"{txns.requests_per_s / naive_txns.requests_per_s:.2f} of naive",
                    percent,
                    per_op,
                )
            )
    return rows


# ---- 2. commit acknowledged -> visible to a read_committed long poll


class LongPollConsumer:
    """Long-polls one partition read_committed from offset 0 and notes, for each record value (an
    index), the perf_counter instant its fetch response arrived."""

    def __init__(self, base_url: str, topic: str, max_wait_ms: int = 5000) -> None:
        self.http = http_client(base_url, 1)
        self.topic = topic
        self.max_wait_ms = max_wait_ms
        self.seen_at: dict[int, float] = {}
        self.arrived = asyncio.Event()
        self.failure: Exception | None = None

    async def run(self) -> None:
        offset = 0
        try:
            while True:
                answer = await post_json(
                    self.http,
                    "/v1/fetch",
                    {
                        "isolation_level": "read_committed",
                        "max_wait_ms": self.max_wait_ms,
                        "max_records": 500,
                        "partitions": [{"topic": self.topic, "partition": 0, "offset": offset}],
                    },
                )
                now = time.perf_counter()
                [entry] = check_partitions(answer, "fetch")
                for record in entry["records"]:
                    self.seen_at.setdefault(int(record["value"]), now)
                if entry["records"]:
                    self.arrived.set()
                offset = entry["next_offset"]
        except Exception as error:  # handed to the waiting producer
            self.failure = error
            self.arrived.set()

    async def wait_for(self, index: int, timeout_s: float = 10) -> float:
        """The instant the record with value `index` arrived; raises if it does not within timeout_s."""
        deadline = time.perf_counter() + timeout_s
        while index not in self.seen_at:
            if self.failure is not None:
                raise RuntimeError(f"the long-polling consumer failed: {self.failure!r}") from self.failure
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), max(deadline - time.perf_counter(), 0.001))
        return self.seen_at[index]


@dataclass
class Visibility:
    """Per write: from the last request sent (commit, or the plain produce) and from its
    acknowledgement to the record's arrival at the consumer, in ms."""

    from_sent_ms: list[float] = field(default_factory=list)
    from_ack_ms: list[float] = field(default_factory=list)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


async def measure_write_to_visible(
    base_url: str,
    topic: str,
    writes: int,
    write_one: Callable[[LoadClient, int], Awaitable[tuple[float, float]]],
) -> Visibility:
    """Writes one record at a time (value = its index) with `write_one`, which returns the instants
    its last request was sent and acknowledged; waits until the consumer saw it before the next, then
    pauses a little so the consumer's next long poll is parked in the server."""
    consumer = LongPollConsumer(base_url, topic)
    consuming = asyncio.create_task(consumer.run())
    visibility = Visibility()
    try:
        async with http_client(base_url, 1) as http:
            for index in range(writes):
                await asyncio.sleep(0.003)
                sent, acknowledged = await write_one(http, index)
                seen = await consumer.wait_for(index)
                visibility.from_sent_ms.append(1000 * (seen - sent))
                visibility.from_ack_ms.append(1000 * (seen - acknowledged))
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        await consumer.http.aclose()
    return visibility


async def commit_one_record(
    topic: str, transactional_id: str, producer: _Producer, http: LoadClient, index: int
) -> tuple[float, float]:
    check_partitions(
        await post_json(
            http,
            "/v1/produce",
            {
                "transactional_id": transactional_id,
                "producer_id": producer.producer_id,
                "producer_epoch": producer.producer_epoch,
                "partitions": [
                    {
                        "topic": topic,
                        "partition": 0,
                        "base_sequence": 0,
                        "records": [{"key": None, "value": str(index)}],
                    }
                ],
            },
        ),
        "produce",
    )
    sent = time.perf_counter()
    ended = await post_json(
        http,
        "/v1/txn/end",
        {
            "transactional_id": transactional_id,
            "producer_id": producer.producer_id,
            "producer_epoch": producer.producer_epoch,
            "committed": True,
        },
    )
    acknowledged = time.perf_counter()
    producer.producer_id, producer.producer_epoch = ended["producer_id"], ended["producer_epoch"]
    return sent, acknowledged


async def produce_one_plain_record(topic: str, http: LoadClient, index: int) -> tuple[float, float]:
    sent = time.perf_counter()
    check_partitions(
        await post_json(
            http,
            "/v1/produce",
            {
                "producer_id": NO_PRODUCER_ID,
                "producer_epoch": NO_PRODUCER_EPOCH,
                "partitions": [{"topic": topic, "partition": 0, "records": [{"key": None, "value": str(index)}]}],
            },
        ),
        "produce",
    )
    return sent, time.perf_counter()


async def measure_commit_to_visible(base_url: str, writes: int) -> list[Row]:
    txn_topic, plain_topic, transactional_id = "visible-txn", "visible-plain", "visible-txn-producer"
    async with http_client(base_url, 1) as http:
        await create_topic(http, txn_topic, 1)
        await create_topic(http, plain_topic, 1)
        answer = await post_json(
            http, "/v1/producers/init", {"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
        )
    producer = _Producer(answer["producer_id"], answer["producer_epoch"], [0])
    plain = await measure_write_to_visible(
        base_url, plain_topic, writes, partial(produce_one_plain_record, plain_topic)
    )
    txn = await measure_write_to_visible(
        base_url, txn_topic, writes, partial(commit_one_record, txn_topic, transactional_id, producer)
    )
    print(
        f"  commit ack -> visible p50 {statistics.median(txn.from_ack_ms):.2f} ms; plain produce ack -> "
        f"visible p50 {statistics.median(plain.from_ack_ms):.2f} ms",
        flush=True,
    )

    def p50_p99(values: list[float]) -> str:
        return f"p50 {statistics.median(values):.2f} ms, p99 {percentile(values, 0.99):.2f} ms"

    def p50_difference(values: list[float], baseline: list[float]) -> str:
        # A difference, not a ratio: a plain write can become visible before its ack arrives (< 0).
        return f"p50 {statistics.median(values) - statistics.median(baseline):+.2f} ms"

    return [
        Row(
            "2",
            f"commit acknowledged -> visible (read_committed long poll), {writes} txns",
            p50_p99(txn.from_ack_ms),
            f"plain produce ack -> visible: {p50_p99(plain.from_ack_ms)}",
            p50_difference(txn.from_ack_ms, plain.from_ack_ms),
        ),
        Row(
            "2",
            f"EndTxn sent -> visible, {writes} txns",
            p50_p99(txn.from_sent_ms),
            f"plain produce sent -> visible: {p50_p99(plain.from_sent_ms)}",
            p50_difference(txn.from_sent_ms, plain.from_sent_ms),
        ),
    ]


# ---- 3. 1000-record transactions vs the same records written idempotently


async def measure_large_transaction_overhead(
    base_url: str,
    meter: CpuMeter,
    naive: NaiveApp,
    producer_counts: list[int],
    rounds: int,
    warmup_s: float,
    seconds: float,
    shapes: list[tuple[int, int]] = ((1, LARGE_TXN_RECORDS),),
) -> list[Row]:
    """Each shape is (produce requests per transaction, records per request); the idempotent
    baseline writes the same requests with no transaction, so each run_once moves as many records."""
    rows = []
    value = record_value(LARGE_VALUE_BYTES)
    async with http_client(base_url, 1) as http:
        for produces, records in shapes:
            for producers in producer_counts:
                idempotent_topic = f"large-idem-{produces}x{records}-p{producers}"
                txn_topic = f"large-txn-{produces}x{records}-p{producers}"
                await create_topic(http, idempotent_topic, producers)
                await create_topic(http, txn_topic, producers)
                idempotent, txns = await measure_alternating(
                    partial(ProducerWorkload, base_url, idempotent_topic, (records,), value, False, produces),
                    partial(ProducerWorkload, base_url, txn_topic, (records,), value, True, produces),
                    producers,
                    rounds,
                    warmup_s,
                    seconds,
                    meter,
                )
                naive_topic = f"large-naive-{produces}x{records}-p{producers}"
                await naive.create_topic(naive_topic, producers)
                naive_produces, naive_txns = await measure_alternating(
                    partial(NaiveTransactionWorkload, naive.url, naive_topic, (records,), value, False, produces),
                    partial(NaiveTransactionWorkload, naive.url, naive_topic, (records,), value, True, produces),
                    producers,
                    rounds,
                    warmup_s,
                    seconds,
                    naive.meter,
                )
                naive_overhead = 100 * (1 - naive_txns.records_per_s / naive_produces.records_per_s)
                overhead = 100 * (1 - txns.records_per_s / idempotent.records_per_s)
                # Each transaction moves as many records as an idempotent run: CPU per run compares.
                cpu_overhead = 100 * (
                    txns.server_and_postgres_cpu_s_per_request / idempotent.server_and_postgres_cpu_s_per_request - 1
                )
                shape = f"{produces} produce{'s' if produces > 1 else ''} of {records}"
                print(
                    f"  {produces * records}-record transactions ({shape}), {producers} producers: "
                    f"{txns.records_per_s:,.0f} records/s; idempotent {idempotent.records_per_s:,.0f} records/s; "
                    f"overhead {overhead:.1f}%; the naive app's for one more request: {naive_overhead:.1f}%",
                    flush=True,
                )
                percent, per_op = txns.cpu_cells()
                idem_percent, idem_per_op = idempotent.cpu_cells()
                rows.append(
                    Row(
                        "3",
                        f"txn of {shape} x {LARGE_VALUE_BYTES} B + commit, {producers} producers",
                        f"{txns.records_per_s:,.0f} records/s, p50 {txns.latency_ms:.1f} ms/txn",
                        f"idempotent, no txn: {idempotent.records_per_s:,.0f} records/s, p50 "
                        f"{idempotent.latency_ms:.1f} ms/{produces} req (ms {idem_per_op}, CPU% {idem_percent}); "
                        f"naive app: {naive_produces.records_per_s:,.0f} records/s, with an end request "
                        f"{naive_txns.records_per_s:,.0f}",
                        f"overhead {overhead:.1f}% (CPU +{cpu_overhead:.0f}%); naive app's {naive_overhead:.1f}%",
                        percent,
                        per_op,
                    )
                )
    return rows


# ---- 4. read_committed fetch as a partition grows: partitions built directly with COPY


@dataclass(frozen=True)
class _Record:
    """A record as record_codec.encode_batch takes it (the wire shape)."""

    key: str | None
    value: str | None
    headers: tuple = ()
    timestamp_ms: int | None = None


BATCH_COLUMNS = [
    "topic_id",
    "partition",
    "last_offset",
    "base_offset",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "is_transactional",
    "control_type",
    "first_timestamp_ms",
    "max_timestamp_ms",
    "record_count",
    "size_bytes",
    "records",
]
MARKER_COLUMNS = [
    "topic_id",
    "partition",
    "producer_id",
    "producer_epoch",
    "control_type",
    "marker_offset",
    "first_offset",
    "timestamp_ms",
]
CONTROL_PAYLOAD = b"[]"  # what markers.plan_markers stores in a control batch


@dataclass
class BuiltPartition:
    records: int
    high_watermark: int
    aborted_transactions: int
    build_s: float


def batch_rows(
    topic_id: int,
    partition: int,
    records: int,
    payload: record_codec.EncodedBatch,
    now_ms: int,
    producer_ids: list[int],
) -> tuple[list[tuple], list[tuple], int]:
    """The record_batches and txn_markers rows of a partition of `records` records in batches of
    BATCH_RECORDS, exactly as the server writes them: every ABORTED_EVERY-th batch is the only batch of
    a transaction (producer id, epoch of its own; sequence 0), followed by its ABORT control batch
    (one offset) and marker row; the other batches are plain (producer -1). Returns the rows and the
    high watermark."""
    batches, markers = [], []
    offset = 0
    for index in range(records // BATCH_RECORDS):
        last = offset + BATCH_RECORDS - 1
        common = (
            payload.first_timestamp_ms,
            payload.max_timestamp_ms,
            BATCH_RECORDS,
            payload.size_bytes,
            payload.payload,
        )
        if index % ABORTED_EVERY != ABORTED_EVERY - 1:
            batches.append(
                (
                    topic_id,
                    partition,
                    last,
                    offset,
                    NO_PRODUCER_ID,
                    NO_PRODUCER_EPOCH,
                    NO_SEQUENCE,
                    False,
                    None,
                    *common,
                )
            )
            offset = last + 1
            continue
        transaction = index // ABORTED_EVERY
        producer_id = producer_ids[transaction // EPOCHS_PER_PRODUCER]
        epoch = transaction % EPOCHS_PER_PRODUCER
        batches.append((topic_id, partition, last, offset, producer_id, epoch, 0, True, None, *common))
        marker_offset = last + 1
        batches.append(
            (
                topic_id,
                partition,
                marker_offset,
                marker_offset,
                producer_id,
                epoch,
                NO_SEQUENCE,
                True,
                CONTROL_ABORT,
                now_ms,
                now_ms,
                1,
                0,
                CONTROL_PAYLOAD,
            )
        )
        markers.append((topic_id, partition, producer_id, epoch, CONTROL_ABORT, marker_offset, offset, now_ms))
        offset = marker_offset + 1
    return batches, markers, offset


async def build_partition(
    database_url: str, topic_id: int, partition: int, records: int, copy_connections: int = 2
) -> BuiltPartition:
    """Writes the partition straight into PostgreSQL (COPY, over `copy_connections` connections at
    once), registers its producers as the server would (producer_ids, producer_states with no open
    transaction), moves the high watermark, and ANALYZEs, as autovacuum would after such growth."""
    started = time.monotonic()
    now_ms = int(time.time() * 1000)
    payload = record_codec.encode_batch(
        [_Record(None, record_value(LARGE_VALUE_BYTES), (), now_ms)] * BATCH_RECORDS, record_codec.UTF8, now_ms, "bench"
    )
    transactions = records // BATCH_RECORDS // ABORTED_EVERY
    conn = await asyncpg.connect(database_url)
    try:
        producer_ids = [
            row[0]
            for row in await conn.fetch(
                "SELECT nextval('producer_id_seq') FROM generate_series(1, $1)",
                max(1, -(-transactions // EPOCHS_PER_PRODUCER)),
            )
        ]
        batches, markers, high_watermark = batch_rows(topic_id, partition, records, payload, now_ms, producer_ids)
        chunk = -(-len(batches) // copy_connections)

        async def copy_chunk(rows: list[tuple]) -> None:
            connection = await asyncpg.connect(database_url)
            try:
                await connection.copy_records_to_table("record_batches", records=rows, columns=BATCH_COLUMNS)
            finally:
                await connection.close()

        await asyncio.gather(*(copy_chunk(batches[i : i + chunk]) for i in range(0, len(batches), chunk)))
        await conn.copy_records_to_table("txn_markers", records=markers, columns=MARKER_COLUMNS)
        last_epoch = {}
        for _, _, producer_id, epoch, *_ in markers:
            last_epoch[producer_id] = epoch
        await conn.executemany(
            "INSERT INTO producer_ids (producer_id, producer_epoch, transactional_id, issued_ms) "
            "VALUES ($1, $2, $3, $4)",
            [
                (pid, epoch + 1, f"bench-built-{topic_id}-{partition}-{pid}", now_ms)
                for pid, epoch in last_epoch.items()
            ],
        )
        await conn.executemany(
            "INSERT INTO producer_states (topic_id, partition, producer_id, producer_epoch, last_sequence, "
            "last_timestamp_ms, last_append_ms, recent_batches, current_txn_first_offset) "
            "VALUES ($1, $2, $3, $4, $5, $6, $6, '[]', NULL)",
            [(topic_id, partition, pid, epoch, BATCH_RECORDS - 1, now_ms) for pid, epoch in last_epoch.items()],
        )
        await conn.execute(
            "UPDATE partitions SET high_watermark = $3 WHERE topic_id = $1 AND partition = $2",
            topic_id,
            partition,
            high_watermark,
        )
        await conn.execute("ANALYZE record_batches")
        await conn.execute("ANALYZE txn_markers")
    finally:
        await conn.close()
    return BuiltPartition(records, high_watermark, len(markers), time.monotonic() - started)


@dataclass(frozen=True)
class FetchPoint:
    """Where a timed fetch reads: the partition of `size` records, at `position`."""

    size: int
    position: str
    partition: int
    offset: int


@dataclass
class FetchTiming:
    """The samples of one FetchPoint, and the CPU used while they ran (summed over their windows)."""

    seconds: list[float] = field(default_factory=list)
    window_s: float = 0.0
    server_s: float = 0.0
    postgres_s: float = 0.0
    client_s: float = 0.0
    machine_s: float = 0.0

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.seconds)

    def cpu_cells(self) -> tuple[str, str]:
        other_s = max(self.machine_s - self.server_s - self.postgres_s - self.client_s, 0.0)
        percent = "/".join(
            f"{100 * cpu / self.window_s:.0f}" for cpu in (self.server_s, self.postgres_s, self.client_s, other_s)
        )
        count = len(self.seconds)
        return percent, f"{1000 * self.server_s / count:.2f}/{1000 * self.postgres_s / count:.2f}"


async def time_read_committed_fetches(
    http: LoadClient, meter: CpuMeter, topic: str, points: list[FetchPoint], samples: int
) -> dict[FetchPoint, FetchTiming]:
    """`samples` read_committed fetches of FETCH_RECORDS records at each point, taking the points in
    turn (a burst of noise on the machine then hits every point alike), after two unmeasured ones
    each (connection, prepared statements, pages warm)."""

    async def fetch_once(point: FetchPoint) -> float:
        started = time.perf_counter()
        answer = await post_json(
            http,
            "/v1/fetch",
            {
                "isolation_level": "read_committed",
                "max_records": FETCH_RECORDS,
                "partitions": [{"topic": topic, "partition": point.partition, "offset": point.offset}],
            },
        )
        elapsed = time.perf_counter() - started
        [entry] = check_partitions(answer, "fetch")
        if len(entry["records"]) != FETCH_RECORDS:
            raise RuntimeError(f"fetch at {point} returned {len(entry['records'])} records, expected {FETCH_RECORDS}")
        return elapsed

    for point in points:
        for _ in range(2):
            await fetch_once(point)
    timings = {point: FetchTiming() for point in points}
    for _ in range(samples):
        for point in points:
            before, client_before = meter.snapshot(), time.process_time()
            elapsed = await fetch_once(point)
            client_after = time.process_time()
            after = meter.snapshot()
            timing = timings[point]
            timing.seconds.append(elapsed)
            timing.window_s += after.at - before.at
            timing.server_s += after.server_s - before.server_s
            timing.postgres_s += after.postgres_s - before.postgres_s
            timing.client_s += client_after - client_before
            timing.machine_s += after.machine_s - before.machine_s
    return timings


async def measure_fetch_vs_log_length(
    base_url: str, database_url: str, meter: CpuMeter, sizes: list[int], samples: int
) -> list[Row]:
    topic = "log-length"
    async with http_client(base_url, 1) as http:
        await create_topic(http, topic, len(sizes))
        conn = await asyncpg.connect(database_url)
        try:
            topic_id = await conn.fetchval("SELECT topic_id FROM topics WHERE name = $1", topic)
        finally:
            await conn.close()
        built = []
        for partition, size in enumerate(sizes):
            built.append(await build_partition(database_url, topic_id, partition, size))
            print(
                f"  built {size:,} records ({built[-1].aborted_transactions:,} aborted transactions, "
                f"{size // BATCH_RECORDS:,} batches) in {built[-1].build_s:.1f} s",
                flush=True,
            )
        rows = [
            Row(
                "4",
                f"build partition of {b.records:,} records by COPY",
                f"{b.build_s:.1f} s ({b.records / b.build_s:,.0f} records/s), high watermark {b.high_watermark:,}",
            )
            for b in built
        ]
        points = [
            FetchPoint(b.records, position, partition, offset)
            for partition, b in enumerate(built)
            for position, offset in (
                ("start", 0),
                ("middle", b.high_watermark // 2),
                ("end", b.high_watermark - 2 * FETCH_RECORDS),
            )
        ]
        timings = {
            (point.position, point.size): timing
            for point, timing in (await time_read_committed_fetches(http, meter, topic, points, samples)).items()
        }
    smallest = sizes[0]
    for position in ("start", "middle", "end"):
        base = timings[position, smallest]
        for previous, size in zip([None, *sizes], sizes):
            t = timings[position, size]
            versus_previous = (
                ""
                if previous in (None, smallest)
                else f" (vs {previous:,}: {t.median_ms / timings[position, previous].median_ms:.2f})"
            )
            rows.append(
                Row(
                    "4",
                    f"read_committed fetch {FETCH_RECORDS} at {position} of {size:,}",
                    f"median {t.median_ms:.2f} ms ({samples} fetches)",
                    "-" if size == smallest else f"{smallest:,}: {base.median_ms:.2f} ms",
                    "-" if size == smallest else f"{t.median_ms / base.median_ms:.2f}{versus_previous}",
                    *t.cpu_cells(),
                )
            )
            print(f"  fetch at {position} of {size:,}: {t.median_ms:.2f} ms", flush=True)
    return rows


# ---- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def int_list(text: str) -> list[int]:
        return [int(part) for part in text.split(",") if part]

    parser = argparse.ArgumentParser(
        prog="python -m bench.transactions", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    args: argparse.Namespace, server: ServerSubprocess, naive_server: ServerSubprocess, postgres: EmbeddedPostgres
) -> list[Row]:
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
    # Under /tmp: the unix socket path of PostgreSQL is limited to 107 bytes.
    work_dir = Path(tempfile.mkdtemp(prefix="txb-bench-txn-", dir="/tmp"))
    postgres = EmbeddedPostgres(work_dir / "pg")
    server = naive_server = None
    try:
        postgres.start()
        postgres.create_database(RAW_DATABASE)
        naive_server = start_naive_app(database_url_for(postgres.database_url, RAW_DATABASE), args.workers)
        server = start_txbroker(
            postgres.database_url,
            args.profile_server,
            workers=args.workers,
            checkout=None if args.checkout is None else args.checkout.resolve(),
        )
        print(
            f"PostgreSQL pid {postgres.pid} in {work_dir}; txbroker pid {server.pid} ({args.workers} worker(s)"
            f"{'' if args.checkout is None else ', code of ' + str(args.checkout)}); "
            f"{os.cpu_count()} CPUs; "
            f"Python {platform.python_version()}",
            flush=True,
        )
        rows = asyncio.run(run_sections(args, server, naive_server, postgres))
    finally:
        for started_server in (server, naive_server):
            if started_server is not None:
                started_server.stop()
        postgres.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
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
