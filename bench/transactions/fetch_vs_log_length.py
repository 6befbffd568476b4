"""Section 4: read_committed fetch latency and cost as a partition grows, on partitions built directly
in PostgreSQL with COPY in the server's format."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import asyncpg

from app.storage.log import record_codec
from bench.load_client import LoadClient
from bench.processes import CpuMeter
from bench.transactions.http_calls import check_partitions, create_topic, http_client, post_json
from bench.transactions.report import Row
from bench.transactions.workloads import LARGE_VALUE_BYTES
from bench.workloads import record_value
from txbroker.wire import CONTROL_ABORT, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE

BATCH_RECORDS = 100  # records per batch of the directly built partitions
ABORTED_EVERY = 10  # every 10th batch is a transactional batch that is aborted
FETCH_RECORDS = 500
EPOCHS_PER_PRODUCER = 1000  # aborted transactions per producer id in the built partitions


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
