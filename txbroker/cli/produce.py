"""`txbroker produce TOPIC`: the lines of stdin, one record each, optionally in transactions."""

from __future__ import annotations

import sys
from typing import Any

from txbroker.cli.command import EXIT_OK, UsageError, add_command, partition_index, resource_name
from txbroker.cli.output import emit_json
from txbroker.errors import TxbrokerError
from txbroker.sync import Producer


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
    if args.key_separator == "":
        raise UsageError("--key-separator must not be empty (each line is KEY<SEP>VALUE)")
    separator = args.key_separator.encode() if args.key_separator is not None else None
    count = transactions = committed = 0
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
                        raise UsageError(
                            f"line {count + 1} has no key separator {args.key_separator!r} (expected "
                            f"KEY{args.key_separator}VALUE); "
                            + (
                                f"{committed} line(s) before it were committed, the others of its transaction aborted"
                                if transactional
                                else f"the {count} line(s) before it were produced"
                            )
                        )
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
                    committed = count
                if len(futures) >= 10_000:
                    _check(futures)
            if in_transaction:
                producer.commit_transaction()
                transactions += 1
            producer.flush()
            _check(futures)
        except BaseException as error:
            # Whatever stops the command (a server error, a line without the separator, Ctrl-C)
            # aborts the open transaction now: left open, it would hold back every read_committed
            # reader of its partitions until the server's transaction timeout aborted it.
            if transactional and not (isinstance(error, TxbrokerError) and error.fatal):
                _abort_open_transaction(producer)
            raise
    summary = {"topic": args.topic, "records": count}
    if transactional:
        summary["transactions"] = transactions
    if args.json:
        emit_json(summary)
    else:
        print(
            f"produced {count} record(s) to {args.topic}"
            + (f" in {transactions} transaction(s)" if transactional else ""),
            file=sys.stderr,
        )
    return EXIT_OK


def _abort_open_transaction(producer: Producer) -> None:
    if producer.transaction_state.value not in ("IN_TRANSACTION", "ABORTABLE_ERROR"):
        return
    try:
        producer.abort_transaction()
    except TxbrokerError as error:  # the error that stopped the command is the one to report
        print(
            f"warning: the open transaction of {producer.transactional_id!r} could not be aborted ({error}); "
            f"the server aborts it after its timeout, or `txbroker transactions abort` does now",
            file=sys.stderr,
        )


def _check(futures: list) -> None:
    for future in futures:
        future.result()
    futures.clear()


def add_commands(commands) -> None:
    """The `produce` command."""
    sub = add_command(commands, "produce", "produce the lines of stdin, one record each", produce)
    sub.add_argument("topic", type=resource_name)
    sub.add_argument("--key-separator", metavar="SEP", help="each line is KEY<SEP>VALUE")
    sub.add_argument("--partition", type=partition_index, help="write to this partition (default: by key, or sticky)")
    sub.add_argument(
        "--transactional-id", type=resource_name, metavar="ID", help="produce in transactions with this id"
    )
    sub.add_argument(
        "--commit-every",
        type=int,
        metavar="N",
        help="with --transactional-id: commit every N lines (default: once, at the end)",
    )
