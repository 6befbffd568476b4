"""`txbroker transactions list|describe|abort|find-hanging`, and the partition-level views of
transactions: `txbroker producers` (DescribeProducers) and `txbroker markers`."""

from __future__ import annotations

from txbroker.admin import DEFAULT_HANGING_MS
from txbroker.cli.command import EXIT_OK, add_command, admin_command, partition_index, resource_name
from txbroker.cli.output import emit_json, format_time, open_for_ms, print_found, print_table
from txbroker.sync import Admin


def _transaction_row(t: dict) -> tuple:
    return (
        t["transactional_id"],
        t["producer_id"],
        t["producer_epoch"],
        t["state"],
        t["timeout_ms"],
        open_for_ms(t["start_time_ms"]),
        len(t["partitions"]),
        ",".join(t["groups"]) or None,
    )


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
    print_found(args.json, found, _transaction_row, TRANSACTION_HEADERS, "no transactions")
    return EXIT_OK


def transactions_describe(args, admin: Admin) -> int:
    txn = admin.describe_transaction(args.transactional_id)
    if args.json:
        emit_json(txn)
        return EXIT_OK
    # Servers before transaction versions did not answer it; null: no EndTxn has ended one of its
    # transactions yet.
    version = txn.get("transaction_version", "-")
    for label, value in (
        ("transactional id", txn["transactional_id"]),
        ("producer id", txn["producer_id"]),
        ("producer epoch", txn["producer_epoch"]),
        ("state", txn["state"]),
        ("timeout ms", txn["timeout_ms"]),
        ("started", format_time(txn["start_time_ms"]) or "-"),
        ("open for ms", open_for_ms(txn["start_time_ms"]) if txn["start_time_ms"] >= 0 else "-"),
        ("last update", format_time(txn["last_update_ms"])),
        ("groups", ", ".join(txn["groups"]) or "-"),
        ("txn version", "none yet" if version is None else version),
    ):
        print(f"{label:17} {value}")
    print_table(
        [(p["topic"], p["partition"]) for p in txn["partitions"]],
        ("TOPIC", "PARTITION"),
        "no partitions in the transaction",
    )
    return EXIT_OK


def transactions_abort(args, admin: Admin) -> int:
    result = admin.abort_transaction(args.transactional_id)
    if args.json:
        emit_json(result)
    else:
        print(
            f"aborted the transaction of {args.transactional_id} ({result['state']}); its producer is fenced: "
            f"producer id {result['producer_id']} now has epoch {result['producer_epoch']}"
        )
    return EXIT_OK


def transactions_find_hanging(args, admin: Admin) -> int:
    found = admin.find_hanging_transactions(args.min_duration_ms)
    print_found(
        args.json,
        found,
        _transaction_row,
        TRANSACTION_HEADERS,
        f"no transaction open for longer than {args.min_duration_ms} ms",
    )
    return EXIT_OK


def producers(args, admin: Admin) -> int:
    found = admin.describe_producers(args.topic, args.partition)
    print_found(
        args.json,
        found,
        lambda p: (
            p["producer_id"],
            p["producer_epoch"],
            p["last_sequence"],
            format_time(p["last_timestamp_ms"]),
            None if p["current_txn_start_offset"] < 0 else p["current_txn_start_offset"],
        ),
        ("PRODUCER ID", "EPOCH", "LAST SEQUENCE", "LAST TIMESTAMP", "OPEN TXN START OFFSET"),
        f"no producer state on {args.topic}-{args.partition}",
    )
    return EXIT_OK


def markers(args, admin: Admin) -> int:
    found = admin.list_markers(args.topic, args.partition, args.offset, args.limit)
    print_found(
        args.json,
        found,
        lambda m: (m["offset"], m["type"], m["producer_id"], m["producer_epoch"], format_time(m["timestamp_ms"])),
        ("OFFSET", "TYPE", "PRODUCER ID", "EPOCH", "TIMESTAMP"),
        f"no markers on {args.topic}-{args.partition} from offset {args.offset}",
    )
    return EXIT_OK


def add_commands(commands) -> None:
    """The `transactions` command group and the `producers` and `markers` commands."""
    txns = commands.add_parser("transactions", help="list, describe, abort transactions; find hanging ones")
    txn_commands = txns.add_subparsers(dest="transactions_command", required=True, metavar="ACTION")
    sub = add_command(txn_commands, "list", "list transactional ids and their state", admin_command(transactions_list))
    sub.add_argument(
        "--state",
        action="append",
        help="only these states, repeatable (Empty, Ongoing, Prepared, PrepareCommit, PrepareAbort, "
        "CompleteCommit, CompleteAbort, ...)",
    )
    sub.add_argument("--min-duration-ms", type=int, help="only transactions open at least this long")
    sub.add_argument("--producer-id", type=int)
    sub.add_argument("--prefix", help="only transactional ids starting with this")
    add_command(
        txn_commands, "describe", "one transactional id's state and partitions", admin_command(transactions_describe)
    ).add_argument("transactional_id", type=resource_name)
    add_command(
        txn_commands,
        "abort",
        "fence the producer of an id and abort its open transaction",
        admin_command(transactions_abort),
    ).add_argument("transactional_id", type=resource_name)
    sub = add_command(
        txn_commands,
        "find-hanging",
        "transactions open for too long (they hold back read_committed)",
        admin_command(transactions_find_hanging),
    )
    sub.add_argument(
        "--min-duration-ms",
        type=int,
        default=DEFAULT_HANGING_MS,
        help=f"open for at least this long (default {DEFAULT_HANGING_MS}, the max transaction timeout)",
    )

    sub = add_command(
        commands, "producers", "producer state on a partition (DescribeProducers)", admin_command(producers)
    )
    sub.add_argument("topic", type=resource_name)
    sub.add_argument("partition", type=partition_index)

    sub = add_command(commands, "markers", "transaction markers of a partition", admin_command(markers))
    sub.add_argument("topic", type=resource_name)
    sub.add_argument("partition", type=partition_index)
    sub.add_argument("--offset", type=int, default=0, help="from this offset (default 0)")
    sub.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
