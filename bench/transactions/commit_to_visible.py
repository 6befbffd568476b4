"""Section 2: commit acknowledged -> visible to a read_committed long poll, against a plain produce."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from bench.load_client import LoadClient
from bench.transactions.http_calls import check_partitions, create_topic, http_client, post_json
from bench.transactions.report import Row
from bench.transactions.workloads import ProducerState
from txbroker.wire import NO_PRODUCER_EPOCH, NO_PRODUCER_ID


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
    topic: str, transactional_id: str, producer: ProducerState, http: LoadClient, index: int
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
    producer = ProducerState(answer["producer_id"], answer["producer_epoch"], [0])
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
