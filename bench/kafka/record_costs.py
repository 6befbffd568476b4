"""Where a Kafka produce's and fetch's CPU goes per record, step by step, in this process (no server,
no PostgreSQL): the facts for the storage format's decision (records are stored as a JSON array per
batch; keeping the client's RecordBatch bytes would drop the JSON steps and the re-rendering).

    .venv/bin/python -m bench.kafka.record_costs [--records 1000] [--value-bytes 100]

Each step runs on one batch of `--records` records of `--value-bytes` bytes (null keys, no
headers, as bench.kafka's producers send), repeatedly; the figure is the best of `--repeats` runs,
in microseconds per record, so that another program's burst does not decide it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import orjson
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonReader
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from app.kafka.record_batches import MAGIC_V2, data_batch, read_produced
from app.storage.log.record_codec import byte_record, decode_payload, encode_byte_records
from bench.text_table import align

NO_COMPRESSION = 0


def client_batch(records: int, value_bytes: int) -> bytes:
    """A batch as an idempotent producer sends it."""
    builder = DefaultRecordBatchBuilder(MAGIC_V2, NO_COMPRESSION, False, 1000, 0, 0, 2**62)
    now_ms = int(time.time() * 1000)
    for index in range(records):
        builder.append(index, now_ms, None, b"v" * value_bytes, [])
    return bytes(builder.build())


def _kafka_python_render(records: list) -> bytes:
    builder = KafkaPythonBuilder(MAGIC_V2, NO_COMPRESSION, False, 1000, 0, 0, 2**62)
    for index, record in enumerate(records):
        builder.append(index, record.timestamp_ms, record.key, record.value, list(record.headers))
    return bytes(builder.build())


def best_us_per_record(step: Callable[[], object], records: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka.record_costs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--records", type=int, default=1000, help="records per batch (default 1000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value (default 100)")
    parser.add_argument("--repeats", type=int, default=50, help="runs of each step; the best counts (default 50)")
    args = parser.parse_args(argv)
    sent = client_batch(args.records, args.value_bytes)
    produced = read_produced(sent, len(sent) * 2)
    encoded = encode_byte_records(produced.records)
    stored = decode_payload(encoded.payload)
    read_back = [byte_record(record) for record in stored]
    steps = [
        ("produce", "check and read the client's batch (CRC, record by record)", lambda: read_produced(sent, 2**40)),
        (
            "produce",
            "records -> stored JSON form (per record, then orjson.dumps)",
            lambda: encode_byte_records(produced.records),
        ),
        ("produce", "  of which orjson.dumps", partial(orjson.dumps, stored)),
        ("fetch", "stored JSON -> records: orjson.loads", lambda: decode_payload(encoded.payload)),
        ("fetch", "stored JSON -> records: each to bytes (byte_record)", lambda: [byte_record(r) for r in stored]),
        (
            "fetch",
            "records -> RecordBatch (rendered, CRC)",
            lambda: data_batch(0, args.records - 1, 1000, 0, 0, False, read_back),
        ),
        ("fetch", "what the stored client batch would cost: base offset patched", lambda: bytearray(sent)),
        ("before", "kafka-python's reader (the listener's until aiokafka's)", lambda: list(KafkaPythonReader(sent))),
        ("before", "kafka-python's builder (the same)", partial(_kafka_python_render, read_back)),
    ]
    rows = [["path", "step", "us/record"]]
    for path, name, step in steps:
        rows.append([path, name, f"{best_us_per_record(step, args.records, args.repeats):.2f}"])
    print(f"One batch of {args.records} records of {args.value_bytes} bytes; best of {args.repeats} runs.\n")
    print(align(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
