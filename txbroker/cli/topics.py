"""`txbroker topics create|create-partitions|list|describe|delete|delete-records`."""

from __future__ import annotations

import json
from typing import Any

from txbroker.cli.command import EXIT_OK, UsageError, add_command, admin_command, resource_name
from txbroker.cli.output import emit_json, print_done, print_table
from txbroker.records import TopicPartition
from txbroker.sync import Admin


def _config_value(text: str) -> Any:
    """The value as its JSON type: an integer, a number (min_cleanable_dirty_ratio), true or false
    (preallocate, ...); anything else is text (cleanup_policy=compact,delete, compression_type=gzip)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, bool | int | float) else text


def topics_create(args, admin: Admin) -> int:
    config = {}
    for item in args.config or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--config takes key=value, not {item!r}")
        config[key] = _config_value(value)
    topic = admin.create_topic(args.name, args.partitions, config)
    if args.json:
        emit_json(topic)
    else:
        print(f"created topic {topic['name']} with {len(topic['partitions'])} partition(s)")
    return EXIT_OK


def topics_create_partitions(args, admin: Admin) -> int:
    topic = admin.create_partitions(args.name, args.partitions)
    if args.json:
        emit_json(topic)
    else:
        print(f"topic {topic['name']} now has {len(topic['partitions'])} partition(s)")
    return EXIT_OK


def topics_list(args, admin: Admin) -> int:
    topics = admin.list_topics()
    if args.json:
        emit_json(topics)
        return EXIT_OK
    rows = [
        (
            t["name"],
            len(t["partitions"]),
            sum(p["high_watermark"] for p in t["partitions"]),
            " ".join(f"{k}={v}" for k, v in sorted(t.get("config", {}).items())) or None,
        )
        for t in topics
    ]
    print_table(rows, ("TOPIC", "PARTITIONS", "OFFSETS", "CONFIG"), "no topics")
    return EXIT_OK


def topics_describe(args, admin: Admin) -> int:
    topic = admin.describe_topic(args.name)
    if args.json:
        emit_json(topic)
        return EXIT_OK
    print(
        f"topic {topic['name']}: {len(topic['partitions'])} partition(s); config "
        + (" ".join(f"{k}={v}" for k, v in sorted(topic.get("config", {}).items())) or "-")
    )
    print_table(
        [
            (p["partition"], p["log_start_offset"], p["high_watermark"], p["last_stable_offset"])
            for p in topic["partitions"]
        ],
        ("PARTITION", "LOG START", "HIGH WATERMARK", "LAST STABLE"),
        "",
    )
    return EXIT_OK


def topics_delete(args, admin: Admin) -> int:
    admin.delete_topic(args.name)
    print_done(args.json, {"deleted": args.name}, f"deleted topic {args.name}")
    return EXIT_OK


def topics_delete_records(args, admin: Admin) -> int:
    offsets = {}
    for spec in args.offset:
        partition, separator, offset = spec.partition("=")
        try:
            offsets[TopicPartition(args.name, int(partition))] = int(offset)
        except ValueError:
            raise UsageError(
                f"--offset {spec!r}: expected PARTITION=OFFSET, e.g. 0=1000 (OFFSET -1: up to the high watermark)"
            ) from None
        if not separator:
            raise UsageError(f"--offset {spec!r}: expected PARTITION=OFFSET, e.g. 0=1000")
    low_watermarks = admin.delete_records(offsets)
    if args.json:
        emit_json(
            [
                {"topic": tp.topic, "partition": tp.partition, "low_watermark": low}
                for tp, low in sorted(low_watermarks.items())
            ]
        )
    else:
        print_table([(tp.partition, low) for tp, low in sorted(low_watermarks.items())], ("PARTITION", "LOG START"), "")
    return EXIT_OK


def add_commands(commands) -> None:
    """The `topics` command group."""
    topics = commands.add_parser("topics", help="create, list, describe, delete topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    sub = add_command(topic_commands, "create", "create a topic", admin_command(topics_create))
    sub.add_argument("name", type=resource_name)
    sub.add_argument("--partitions", type=int, default=1, help="partition count (default 1)")
    sub.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="topic config, repeatable: retention_ms, retention_bytes, max_message_bytes, cleanup_policy, "
        "delete_retention_ms, compression_type, or any other of Kafka's topic configs with underscores "
        "(segment_bytes=1048576, preallocate=true, min_cleanable_dirty_ratio=0.1)",
    )
    sub = add_command(
        topic_commands,
        "create-partitions",
        "raise a topic's partition count (CreatePartitions)",
        admin_command(topics_create_partitions),
    )
    sub.add_argument("name", type=resource_name)
    sub.add_argument("--partitions", type=int, required=True, help="the partition count wanted (the total)")
    add_command(topic_commands, "list", "list topics", admin_command(topics_list))
    add_command(
        topic_commands, "describe", "partitions and watermarks of a topic", admin_command(topics_describe)
    ).add_argument("name", type=resource_name)
    add_command(topic_commands, "delete", "delete a topic", admin_command(topics_delete)).add_argument(
        "name", type=resource_name
    )
    sub = add_command(
        topic_commands,
        "delete-records",
        "delete the records before an offset (DeleteRecords)",
        admin_command(topics_delete_records),
    )
    sub.add_argument("name", type=resource_name)
    sub.add_argument(
        "--offset",
        action="append",
        required=True,
        metavar="PARTITION=OFFSET",
        help="repeatable: delete the partition's records before OFFSET (-1: up to the high watermark)",
    )
