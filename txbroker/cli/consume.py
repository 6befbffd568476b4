"""`txbroker consume TOPIC`: records of a topic, one per line (or JSON), alone or as a group member."""

from __future__ import annotations

import base64
import json
import sys
import time

from txbroker.cli.command import EXIT_OK, UsageError, add_command, partition_index, resource_name
from txbroker.records import ConsumerRecord, TopicPartition
from txbroker.sync import Admin, Consumer


def _record_json(record: ConsumerRecord) -> dict:
    fields = [record.key, record.value, *(v for _, v in record.headers)]
    try:
        for field in fields:
            if field is not None:
                field.decode("utf-8")
        encode, encoding = (lambda b: None if b is None else b.decode("utf-8")), None
    except UnicodeDecodeError:
        encode, encoding = (lambda b: None if b is None else base64.b64encode(b).decode("ascii")), "base64"
    out = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": encode(record.key),
        "value": encode(record.value),
        "headers": [{"key": k, "value": encode(v)} for k, v in record.headers],
    }
    if encoding:
        out["encoding"] = encoding
    return out


def consume(args) -> int:
    if args.max_records is not None and args.max_records < 1:
        raise UsageError("--max-records must be at least 1")
    out = sys.stdout.buffer
    separator = args.key_separator.encode()
    consumer = Consumer(
        args.url,
        group_id=args.group,
        token=args.token,
        isolation_level=args.isolation_level,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        enable_auto_commit=False,
        default_api_timeout_ms=args.retry_timeout_ms,
    )
    seen = 0
    try:
        if args.group is not None and args.partition is None:
            consumer.subscribe([args.topic])
        else:
            with Admin(args.url, token=args.token, default_api_timeout_ms=args.retry_timeout_ms) as admin:
                count = len(admin.describe_topic(args.topic)["partitions"])
            partitions = [args.partition] if args.partition is not None else range(count)
            consumer.assign([TopicPartition(args.topic, p) for p in partitions])
        idle_since = time.monotonic()
        while args.max_records is None or seen < args.max_records:
            wait_ms = (
                1000
                if args.timeout_ms is None
                else max(0, min(1000, args.timeout_ms - int((time.monotonic() - idle_since) * 1000)))
            )
            records = consumer.poll(timeout_ms=wait_ms)
            if args.max_records is not None:
                records = records[: args.max_records - seen]
            for record in records:
                if args.json:
                    out.write(json.dumps(_record_json(record)).encode() + b"\n")
                else:
                    if args.print_key:
                        out.write((record.key or b"") + separator)
                    out.write((record.value or b"") + b"\n")
            out.flush()
            if records:
                seen += len(records)
                idle_since = time.monotonic()
                if args.group is not None:
                    last = {}
                    for record in records:
                        last[record.topic_partition] = record.offset + 1
                    consumer.commit(last)
            elif args.timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= args.timeout_ms:
                break
    finally:
        consumer.close()
    print(f"consumed {seen} record(s)", file=sys.stderr)
    return EXIT_OK


def add_commands(commands) -> None:
    """The `consume` command."""
    sub = add_command(commands, "consume", "print records of a topic, one per line", consume)
    sub.add_argument("topic", type=resource_name)
    sub.add_argument("--group", type=resource_name, help="consume as a member of this group, committing offsets")
    sub.add_argument("--partition", type=partition_index, help="only this partition")
    sub.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the earliest offset when there is no committed offset (default: the end)",
    )
    sub.add_argument("--isolation-level", choices=("read_committed", "read_uncommitted"), default="read_committed")
    sub.add_argument("--max-records", type=int, metavar="N", help="exit after N records")
    sub.add_argument("--timeout-ms", type=int, metavar="MS", help="exit when no record arrives for MS ms")
    sub.add_argument("--print-key", action="store_true", help="print KEY<SEP>VALUE")
    sub.add_argument("--key-separator", default="\t", metavar="SEP", help="with --print-key (default: tab)")
