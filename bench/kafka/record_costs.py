"""Where a Kafka produce's and fetch's CPU goes per record, step by step, in this process (no server,
no PostgreSQL). A Kafka client's batch is stored as the RecordBatch it sent (storage's record_codec,
the RecordBatch form), so a produce checks and reads it once and a fetch sends it as stored; a batch
written over HTTP is stored as JSON, which a Kafka fetch renders, and an HTTP fetch of a
Kafka-produced batch reads the RecordBatch into the JSON form's records.

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

from app.kafka.record_batches import MAGIC_V2, data_batch, read_produced, stored_batch_at
from app.storage.log.record_codec import byte_record, decode_payload, render_records
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
    stored_batch = read_produced(sent, len(sent) * 2).stored
    as_json = orjson.dumps(decode_payload(stored_batch))  # the same records, as HTTP would store them
    stored = decode_payload(as_json)
    read_back = [byte_record(record) for record in stored]
    steps = [
        (
            "produce",
            "check the client's batch, read its records once (read_produced)",
            lambda: read_produced(sent, 2**40),
        ),
        (
            "fetch",
            "a stored RecordBatch: base offset patched, joined (stored_batch_at)",
            lambda: b"".join(stored_batch_at(5, stored_batch)),
        ),
        ("fetch JSON", "stored JSON -> records: orjson.loads", lambda: decode_payload(as_json)),
        ("fetch JSON", "stored JSON -> records: each to bytes (byte_record)", lambda: [byte_record(r) for r in stored]),
        (
            "fetch JSON",
            "records -> RecordBatch (rendered, CRC)",
            lambda: data_batch(0, args.records - 1, 1000, 0, 0, False, read_back),
        ),
        (
            "HTTP read",
            "a stored RecordBatch -> the JSON form's records (decode_payload)",
            lambda: decode_payload(stored_batch),
        ),
        (
            "HTTP read",
            "then rendered for a utf8 fetch (render_records)",
            partial(render_records, stored, 0, 0, args.records, "utf8"),
        ),
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
