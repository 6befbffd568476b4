"""The `txbroker` command's client commands (the server's `serve` and `db` live in app/cli.py, which
hands every other command to `main` here). They speak HTTP only, through the SDK.

    txbroker topics create|list|describe|delete
    txbroker produce TOPIC              lines from stdin; --key-separator; --transactional-id
    txbroker consume TOPIC              --group, --from-beginning, --max-records, --timeout-ms, --json
    txbroker transactions list|describe|abort|find-hanging
    txbroker producers TOPIC PARTITION
    txbroker markers TOPIC PARTITION
    txbroker groups list|describe

Human-readable tables by default, `--json` for scripts. Exit codes: 0 ok; 1 an error (the server's
code and message, or why it could not be reached, on stderr); 2 a usage error.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib.metadata import entry_points
from typing import Any

from txbroker.admin import DEFAULT_HANGING_MS
from txbroker.connection import DEFAULT_URL
from txbroker.errors import TxbrokerConnectionError, TxbrokerError
from txbroker.records import ConsumerRecord, TopicPartition
from txbroker.sync import Admin, Consumer, Producer

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Arguments that parse but make no sense together: exit code 2."""


# ---- output


def _emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=None, sort_keys=False) + "\n")


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)


def _print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], empty: str) -> None:
    print(_table(rows, headers) if rows else empty)


def _time(ms: int | None) -> str | None:
    if ms is None or ms < 0:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _duration(start_ms: int) -> int | None:
    return None if start_ms < 0 else max(0, int(time.time() * 1000) - start_ms)


def _config_value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


# ---- topics


def topics_create(args, admin: Admin) -> int:
    config = {}
    for item in args.config or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--config takes key=value, not {item!r}")
        config[key] = _config_value(value)
    topic = admin.create_topic(args.name, args.partitions, config)
    if args.json:
        _emit_json(topic)
    else:
        print(f"created topic {topic['name']} with {len(topic['partitions'])} partition(s)")
    return EXIT_OK


def topics_list(args, admin: Admin) -> int:
    topics = admin.list_topics()
    if args.json:
        _emit_json(topics)
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
    _print_table(rows, ("TOPIC", "PARTITIONS", "OFFSETS", "CONFIG"), "no topics")
    return EXIT_OK


def topics_describe(args, admin: Admin) -> int:
    topic = admin.describe_topic(args.name)
    if args.json:
        _emit_json(topic)
        return EXIT_OK
    print(
        f"topic {topic['name']}: {len(topic['partitions'])} partition(s); config "
        + (" ".join(f"{k}={v}" for k, v in sorted(topic.get("config", {}).items())) or "-")
    )
    _print_table(
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
    if args.json:
        _emit_json({"deleted": args.name})
    else:
        print(f"deleted topic {args.name}")
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
        _emit_json(
            [
                {"topic": tp.topic, "partition": tp.partition, "low_watermark": low}
                for tp, low in sorted(low_watermarks.items())
            ]
        )
    else:
        _print_table(
            [(tp.partition, low) for tp, low in sorted(low_watermarks.items())], ("PARTITION", "LOG START"), ""
        )
    return EXIT_OK


# ---- produce


def _lines(stream) -> Any:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        yield line


def produce(args) -> int:
    if args.commit_every is not None and args.transactional_id is None:
        raise UsageError("--commit-every needs --transactional-id")
    if args.commit_every is not None and args.commit_every < 1:
        raise UsageError("--commit-every must be at least 1")
    separator = args.key_separator.encode() if args.key_separator is not None else None
    count = transactions = 0
    futures = []
    with Producer(
        args.url, transactional_id=args.transactional_id, token=args.token, max_block_ms=args.retry_timeout_ms
    ) as producer:
        transactional = args.transactional_id is not None
        try:
            if transactional:
                producer.init_transactions()
            in_transaction = False
            for line in _lines(sys.stdin.buffer):
                key, value = None, line
                if separator is not None:
                    key, sep, rest = line.partition(separator)
                    if not sep:
                        raise UsageError(f"line {count + 1} has no key separator {args.key_separator!r}")
                    value = rest
                if transactional and not in_transaction:
                    producer.begin_transaction()
                    in_transaction = True
                futures.append(producer.send(args.topic, value=value, key=key, partition=args.partition))
                count += 1
                if transactional and args.commit_every and count % args.commit_every == 0:
                    producer.commit_transaction()
                    in_transaction = False
                    transactions += 1
                if len(futures) >= 10_000:
                    _check(futures)
            if in_transaction:
                producer.commit_transaction()
                transactions += 1
            producer.flush()
            _check(futures)
        except TxbrokerError as error:
            if (
                transactional
                and not error.fatal
                and producer.transaction_state.value in ("IN_TRANSACTION", "ABORTABLE_ERROR")
            ):
                producer.abort_transaction()
            raise
    summary = {"topic": args.topic, "records": count}
    if transactional:
        summary["transactions"] = transactions
    if args.json:
        _emit_json(summary)
    else:
        print(
            f"produced {count} record(s) to {args.topic}"
            + (f" in {transactions} transaction(s)" if transactional else ""),
            file=sys.stderr,
        )
    return EXIT_OK


def _check(futures: list) -> None:
    for future in futures:
        future.result()
    futures.clear()


# ---- consume


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


# ---- transactions, producers, markers


def _transaction_rows(transactions: list[dict]) -> list[tuple]:
    return [
        (
            t["transactional_id"],
            t["producer_id"],
            t["producer_epoch"],
            t["state"],
            t["timeout_ms"],
            _duration(t["start_time_ms"]),
            len(t["partitions"]),
            ",".join(t["groups"]) or None,
        )
        for t in transactions
    ]


TRANSACTION_HEADERS = (
    "TRANSACTIONAL ID",
    "PRODUCER ID",
    "EPOCH",
    "STATE",
    "TIMEOUT MS",
    "OPEN FOR MS",
    "PARTITIONS",
    "GROUPS",
)


def transactions_list(args, admin: Admin) -> int:
    found = admin.list_transactions(
        states=args.state,
        min_duration_ms=args.min_duration_ms,
        producer_id=args.producer_id,
        transactional_id_prefix=args.prefix,
    )
    if args.json:
        _emit_json(found)
    else:
        _print_table(_transaction_rows(found), TRANSACTION_HEADERS, "no transactions")
    return EXIT_OK


def transactions_describe(args, admin: Admin) -> int:
    txn = admin.describe_transaction(args.transactional_id)
    if args.json:
        _emit_json(txn)
        return EXIT_OK
    for label, value in (
        ("transactional id", txn["transactional_id"]),
        ("producer id", txn["producer_id"]),
        ("producer epoch", txn["producer_epoch"]),
        ("state", txn["state"]),
        ("timeout ms", txn["timeout_ms"]),
        ("started", _time(txn["start_time_ms"]) or "-"),
        ("open for ms", _duration(txn["start_time_ms"]) if txn["start_time_ms"] >= 0 else "-"),
        ("last update", _time(txn["last_update_ms"])),
        ("groups", ", ".join(txn["groups"]) or "-"),
    ):
        print(f"{label:17} {value}")
    _print_table(
        [(p["topic"], p["partition"]) for p in txn["partitions"]],
        ("TOPIC", "PARTITION"),
        "no partitions in the transaction",
    )
    return EXIT_OK


def transactions_abort(args, admin: Admin) -> int:
    result = admin.abort_transaction(args.transactional_id)
    if args.json:
        _emit_json(result)
    else:
        print(
            f"aborted the transaction of {args.transactional_id} ({result['state']}); its producer is fenced: "
            f"producer id {result['producer_id']} now has epoch {result['producer_epoch']}"
        )
    return EXIT_OK


def transactions_find_hanging(args, admin: Admin) -> int:
    found = admin.find_hanging_transactions(args.min_duration_ms)
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            _transaction_rows(found),
            TRANSACTION_HEADERS,
            f"no transaction open for longer than {args.min_duration_ms} ms",
        )
    return EXIT_OK


def producers(args, admin: Admin) -> int:
    found = admin.describe_producers(args.topic, args.partition)
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            [
                (
                    p["producer_id"],
                    p["producer_epoch"],
                    p["last_sequence"],
                    _time(p["last_timestamp_ms"]),
                    None if p["current_txn_start_offset"] < 0 else p["current_txn_start_offset"],
                )
                for p in found
            ],
            ("PRODUCER ID", "EPOCH", "LAST SEQUENCE", "LAST TIMESTAMP", "OPEN TXN START OFFSET"),
            f"no producer state on {args.topic}-{args.partition}",
        )
    return EXIT_OK


def markers(args, admin: Admin) -> int:
    found = admin.list_markers(args.topic, args.partition, args.offset, args.limit)
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            [(m["offset"], m["type"], m["producer_id"], m["producer_epoch"], _time(m["timestamp_ms"])) for m in found],
            ("OFFSET", "TYPE", "PRODUCER ID", "EPOCH", "TIMESTAMP"),
            f"no markers on {args.topic}-{args.partition} from offset {args.offset}",
        )
    return EXIT_OK


# ---- groups


def groups_list(args, admin: Admin) -> int:
    found = admin.list_groups()
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            [(g["group_id"], g["state"], g["generation_id"], g["members"]) for g in found],
            ("GROUP", "STATE", "GENERATION", "MEMBERS"),
            "no groups",
        )
    return EXIT_OK


def groups_describe(args, admin: Admin) -> int:
    group = admin.describe_group(args.group)
    if args.json:
        _emit_json(group)
        return EXIT_OK
    print(
        f"group {group['group_id']}: {group['state']}, generation {group['generation_id']}, "
        f"{len(group['members'])} member(s)"
    )
    if group["members"]:
        print()
        _print_table(
            [
                (
                    m["member_id"],
                    ",".join(m["topics"]),
                    " ".join(f"{a['topic']}:{','.join(map(str, a['partitions']))}" for a in m["assignment"]) or None,
                )
                for m in group["members"]
            ],
            ("MEMBER", "TOPICS", "ASSIGNMENT"),
            "",
        )
    print()
    _print_table(
        [
            (
                o["topic"],
                o["partition"],
                o["offset"],
                o["high_watermark"],
                o["lag"],
                "yes" if o.get("pending_transactional_offset") else "no",
            )
            for o in group["offsets"]
        ],
        ("TOPIC", "PARTITION", "COMMITTED", "HIGH WATERMARK", "LAG", "PENDING TXN"),
        "no committed offsets",
    )
    return EXIT_OK


# ---- the parser


def _admin_command(run: Callable[[argparse.Namespace, Admin], int]) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        with Admin(args.url, token=args.token, default_api_timeout_ms=args.retry_timeout_ms) as admin:
            return run(args, admin)

    return command


def _common(parser: argparse.ArgumentParser, top: bool) -> None:
    """--url, --token, --json: accepted before and after the command (after wins)."""
    default = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    parser.add_argument(
        "--url",
        default=default(os.environ.get("TXBROKER_URL", DEFAULT_URL)),
        help="server URL (default: $TXBROKER_URL or %s)" % DEFAULT_URL,
    )
    parser.add_argument(
        "--token", default=default(os.environ.get("TXBROKER_TOKEN")), help="bearer token (default: $TXBROKER_TOKEN)"
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="JSON output, for scripts")
    parser.add_argument(
        "--retry-timeout-ms",
        type=int,
        default=default(5_000),
        metavar="MS",
        help="how long to retry when the server is unreachable or busy (default 5000)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="txbroker",
        description="Kafka's transactional messaging over HTTP",
        epilog="server commands, when txbroker-server is installed: txbroker serve, txbroker db upgrade "
        "(see txbroker serve --help)",
    )
    _common(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(subparsers, name: str, help: str, run, **kwargs) -> argparse.ArgumentParser:
        sub = subparsers.add_parser(name, help=help, description=help, **kwargs)
        _common(sub, top=False)
        sub.set_defaults(run=run)
        return sub

    topics = commands.add_parser("topics", help="create, list, describe, delete topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    sub = command(topic_commands, "create", "create a topic", _admin_command(topics_create))
    sub.add_argument("name")
    sub.add_argument("--partitions", type=int, default=1, help="partition count (default 1)")
    sub.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="topic config, repeatable: retention_ms, retention_bytes, max_message_bytes, "
        "cleanup_policy, delete_retention_ms",
    )
    command(topic_commands, "list", "list topics", _admin_command(topics_list))
    command(
        topic_commands, "describe", "partitions and watermarks of a topic", _admin_command(topics_describe)
    ).add_argument("name")
    command(topic_commands, "delete", "delete a topic", _admin_command(topics_delete)).add_argument("name")
    sub = command(
        topic_commands,
        "delete-records",
        "delete the records before an offset (DeleteRecords)",
        _admin_command(topics_delete_records),
    )
    sub.add_argument("name")
    sub.add_argument(
        "--offset",
        action="append",
        required=True,
        metavar="PARTITION=OFFSET",
        help="repeatable: delete the partition's records before OFFSET (-1: up to the high watermark)",
    )

    sub = command(commands, "produce", "produce the lines of stdin, one record each", produce)
    sub.add_argument("topic")
    sub.add_argument("--key-separator", metavar="SEP", help="each line is KEY<SEP>VALUE")
    sub.add_argument("--partition", type=int, help="write to this partition (default: by key, or sticky)")
    sub.add_argument("--transactional-id", metavar="ID", help="produce in transactions with this id")
    sub.add_argument(
        "--commit-every",
        type=int,
        metavar="N",
        help="with --transactional-id: commit every N lines (default: once, at the end)",
    )

    sub = command(commands, "consume", "print records of a topic, one per line", consume)
    sub.add_argument("topic")
    sub.add_argument("--group", help="consume as a member of this group, committing offsets")
    sub.add_argument("--partition", type=int, help="only this partition")
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

    txns = commands.add_parser("transactions", help="list, describe, abort transactions; find hanging ones")
    txn_commands = txns.add_subparsers(dest="transactions_command", required=True, metavar="ACTION")
    sub = command(txn_commands, "list", "list transactional ids and their state", _admin_command(transactions_list))
    sub.add_argument(
        "--state",
        action="append",
        help="only these states, repeatable (Empty, Ongoing, Prepared, PrepareCommit, PrepareAbort, "
        "CompleteCommit, CompleteAbort, ...)",
    )
    sub.add_argument("--min-duration-ms", type=int, help="only transactions open at least this long")
    sub.add_argument("--producer-id", type=int)
    sub.add_argument("--prefix", help="only transactional ids starting with this")
    command(
        txn_commands, "describe", "one transactional id's state and partitions", _admin_command(transactions_describe)
    ).add_argument("transactional_id")
    command(
        txn_commands,
        "abort",
        "fence the producer of an id and abort its open transaction",
        _admin_command(transactions_abort),
    ).add_argument("transactional_id")
    sub = command(
        txn_commands,
        "find-hanging",
        "transactions open for too long (they hold back read_committed)",
        _admin_command(transactions_find_hanging),
    )
    sub.add_argument(
        "--min-duration-ms",
        type=int,
        default=DEFAULT_HANGING_MS,
        help=f"open for at least this long (default {DEFAULT_HANGING_MS}, the max transaction timeout)",
    )

    sub = command(commands, "producers", "producer state on a partition (DescribeProducers)", _admin_command(producers))
    sub.add_argument("topic")
    sub.add_argument("partition", type=int)

    sub = command(commands, "markers", "transaction markers of a partition", _admin_command(markers))
    sub.add_argument("topic")
    sub.add_argument("partition", type=int)
    sub.add_argument("--offset", type=int, default=0, help="from this offset (default 0)")
    sub.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")

    groups = commands.add_parser("groups", help="list and describe consumer groups")
    group_commands = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")
    command(group_commands, "list", "list groups", _admin_command(groups_list))
    command(
        group_commands, "describe", "members, assignment, committed offsets and lag", _admin_command(groups_describe)
    ).add_argument("group")
    _add_security_commands(commands, command)
    _add_installed_commands(commands)
    return parser


# ---- security: principals, API keys, ACLs, audit log


def principals_create(args, admin: Admin) -> int:
    created = admin.create_principal(args.name, super_user=args.super_user)
    _emit_json(created) if args.json else print(
        f"created principal {args.name}{' (super user)' if args.super_user else ''}"
    )
    return EXIT_OK


def principals_list(args, admin: Admin) -> int:
    found = admin.list_principals()
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            [(p["name"], "yes" if p["super_user"] else "no", _time(p["created_ms"])) for p in found],
            ("PRINCIPAL", "SUPER USER", "CREATED"),
            "no principals",
        )
    return EXIT_OK


def principals_delete(args, admin: Admin) -> int:
    admin.delete_principal(args.name)
    print(f"deleted principal {args.name}, its keys and ACL rules")
    return EXIT_OK


def principals_add_key(args, admin: Admin) -> int:
    key = admin.add_key(args.name)
    if args.json:
        _emit_json(key)
    else:
        print(f"key {key['key_id']} for {args.name}; its token (shown this once):\n{key['token']}")
    return EXIT_OK


def principals_keys(args, admin: Admin) -> int:
    found = admin.list_keys(args.name)
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            [(k["key_id"], _time(k["created_ms"]), _time(k["revoked_ms"]) or "-") for k in found],
            ("KEY ID", "CREATED", "REVOKED"),
            f"{args.name} has no keys",
        )
    return EXIT_OK


def principals_revoke_key(args, admin: Admin) -> int:
    admin.revoke_key(args.name, args.key_id)
    print(f"revoked key {args.key_id} of {args.name}: requests with it are refused from now on")
    return EXIT_OK


ACL_HEADERS = ("ID", "PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE TYPE", "PATTERN", "RESOURCE")


def acls_add(args, admin: Admin) -> int:
    acl = admin.add_acl(
        args.principal,
        args.resource_type,
        args.resource_name,
        args.operation,
        pattern_type=args.pattern_type,
        permission=args.permission,
    )
    _emit_json(acl) if args.json else print(
        f"added ACL {acl['acl_id']}: {acl['permission']} {acl['operation']} on "
        f"{acl['resource_type']} {acl['resource_name']!r} ({acl['pattern_type']}) "
        f"for {acl['principal']}"
    )
    return EXIT_OK


def acls_list(args, admin: Admin) -> int:
    found = admin.list_acls(args.principal, args.resource_type)
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            [
                (
                    a["acl_id"],
                    a["principal"],
                    a["permission"],
                    a["operation"],
                    a["resource_type"],
                    a["pattern_type"],
                    a["resource_name"],
                )
                for a in found
            ],
            ACL_HEADERS,
            "no ACL rules",
        )
    return EXIT_OK


def acls_remove(args, admin: Admin) -> int:
    admin.remove_acl(args.acl_id)
    print(f"removed ACL {args.acl_id}")
    return EXIT_OK


def audit(args, admin: Admin) -> int:
    found = admin.audit_log(args.limit)
    if args.json:
        _emit_json(found)
    else:
        _print_table(
            [
                (_time(e["timestamp_ms"]), e["principal"], e["action"], e["resource"], e["details"] or None)
                for e in found
            ],
            ("TIME", "PRINCIPAL", "ACTION", "RESOURCE", "DETAILS"),
            "no audit entries",
        )
    return EXIT_OK


def _add_security_commands(commands, command) -> None:
    principals = commands.add_parser("principals", help="create, list, delete principals; manage their API keys")
    actions = principals.add_subparsers(dest="principals_command", required=True, metavar="ACTION")
    sub = command(actions, "create", "create a principal", _admin_command(principals_create))
    sub.add_argument("name")
    sub.add_argument("--super-user", action="store_true", help="allowed everything")
    command(actions, "list", "list principals", _admin_command(principals_list))
    command(
        actions, "delete", "delete a principal with its keys and ACL rules", _admin_command(principals_delete)
    ).add_argument("name")
    command(
        actions, "add-key", "create an API key (prints its token once)", _admin_command(principals_add_key)
    ).add_argument("name")
    command(actions, "keys", "list a principal's keys", _admin_command(principals_keys)).add_argument("name")
    sub = command(actions, "revoke-key", "revoke an API key at once", _admin_command(principals_revoke_key))
    sub.add_argument("name")
    sub.add_argument("key_id")

    acls = commands.add_parser("acls", help="add, list, remove ACL rules (Kafka's model)")
    actions = acls.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    sub = command(actions, "add", "allow (or deny) a principal an operation on resources", _admin_command(acls_add))
    sub.add_argument("--principal", required=True, help='a principal name, or "*" for every principal')
    sub.add_argument("--resource-type", required=True, choices=("Topic", "Group", "TransactionalId", "Cluster"))
    sub.add_argument("--resource-name", required=True, help='a name, "*" for all, or a prefix with --prefixed')
    sub.add_argument(
        "--operation", required=True, choices=("Read", "Write", "Create", "Delete", "Describe", "Alter", "All")
    )
    sub.add_argument(
        "--prefixed",
        dest="pattern_type",
        action="store_const",
        const="prefixed",
        default="literal",
        help="the resource name is a prefix",
    )
    sub.add_argument(
        "--deny",
        dest="permission",
        action="store_const",
        const="deny",
        default="allow",
        help="a deny rule (deny wins over allow)",
    )
    sub = command(actions, "list", "list ACL rules", _admin_command(acls_list))
    sub.add_argument("--principal")
    sub.add_argument("--resource-type", choices=("Topic", "Group", "TransactionalId", "Cluster"))
    command(actions, "remove", "remove an ACL rule by id", _admin_command(acls_remove)).add_argument("acl_id", type=int)

    sub = command(commands, "audit", "administrative actions, newest first", _admin_command(audit))
    sub.add_argument("--limit", type=int, default=100)


COMMANDS_GROUP = "txbroker.commands"


def _add_installed_commands(commands) -> None:
    """Commands other distributions register in the entry-point group `txbroker.commands` (the
    server's `serve` and `db`): each entry point is a function that adds its subparser, with a `run`
    default, to `commands`. Found by name only, so the SDK never imports the server."""
    for entry_point in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            add_command = entry_point.load()
        except Exception as error:  # a broken server install must not take the client commands down
            print(
                f"warning: txbroker command {entry_point.name!r} ({entry_point.value}) could not be loaded: "
                f"{type(error).__name__}: {error}; reinstall the distribution that provides it "
                f"(scripts/setup in a checkout)",
                file=sys.stderr,
            )
            continue
        add_command(commands)


def _unreachable(error: BaseException) -> str | None:
    """Why the server could not be reached, when that is what `error` (or what it gave up on) is."""
    while error is not None and not isinstance(error, TxbrokerConnectionError):
        error = error.__cause__
    if error is None:
        return None
    cause = error.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else error.message


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as error:
        parser.error(str(error))  # exits with 2
    except TxbrokerError as error:
        unreachable = _unreachable(error)
        if unreachable is not None:
            print(
                f"error: cannot reach txbroker at {args.url}: {unreachable} (is the server running? "
                f"--url or TXBROKER_URL name another)",
                file=sys.stderr,
            )
        else:
            print(f"error: {error.code}: {error.message}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
