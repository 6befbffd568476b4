"""Exactly-once consume-transform-produce with txbroker's SDK (the seeds' consumeTransferProduce):
read records from an input topic, transform them, write the results to an output topic, and commit
the consumed offsets in the same transaction as the output. A crash anywhere -- of this process or of
the server -- neither loses nor duplicates an output record.

    .venv/bin/python examples/consume_transform_produce.py URL \\
        [--input orders] [--output orders-upper] [--group orders-upper] [--transactional-id orders-upper-0]
        [--max-records N] [--idle-exit-ms MS]

The transform upper-cases each value. Kafka's recipe, step by step:
- the consumer reads read_committed (never an aborted or open transaction's records) and does not
  commit by itself: offsets are committed by the producer's transaction;
- send_offsets_to_transaction carries the consumer's group metadata, so a consumer that lost its
  partitions in a rebalance cannot commit for them (KIP-447): that error is abortable;
- on an abortable error: abort, rewind the consumer to the committed offsets, redo the work;
- on a fatal error (another instance took over the transactional id): stop;
- on an error that redoing the work cannot cure (the output topic missing, an ACL missing, a
  record over the topic's limit): abort, and stop saying what to fix, rather than redo it for ever.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from txbroker import Consumer, Producer, TopicPartition, TransactionState
from txbroker.errors import TxbrokerError

# Codes that aborting and redoing the transaction cannot cure: they need someone to change the
# cluster (create the topic, grant the ACL, raise max_message_bytes) or the transform.
NEEDS_A_FIX = frozenset(
    {
        "UNKNOWN_TOPIC_OR_PARTITION",
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "RECORD_TOO_LARGE",
        "INVALID_RECORD",
    }
)


def transform(value: bytes | None) -> bytes | None:
    return None if value is None else value.upper()


def commit(producer: Producer) -> None:
    """commit_transaction(), asked again while its outcome is unknown (the server unreachable for
    longer than max_block_ms): a commit in doubt is never turned into an abort."""
    while True:
        try:
            producer.commit_transaction()
            return
        except TxbrokerError as error:
            if producer.transaction_state is not TransactionState.COMMITTING:
                raise
            print(f"commit outcome unknown, asking again: {error}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:8080")
    parser.add_argument("--input", default="orders")
    parser.add_argument("--output", default="orders-upper")
    parser.add_argument("--group", default="orders-upper")
    parser.add_argument("--transactional-id", default="orders-upper-0")
    parser.add_argument("--max-records", type=int, help="exit once this many input records are committed")
    parser.add_argument("--idle-exit-ms", type=int, help="exit after this long without input")
    parser.add_argument("--max-poll-records", type=int, default=500, help="records per poll, so per transaction")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    consumer = Consumer(
        args.url,
        group_id=args.group,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=args.max_poll_records,
    )
    producer = Producer(args.url, transactional_id=args.transactional_id)
    try:
        producer.init_transactions()
        consumer.subscribe([args.input])
        committed_records = 0
        idle_since = time.monotonic()
        said_waiting = False
        while args.max_records is None or committed_records < args.max_records:
            records = consumer.poll(timeout_ms=1000)
            if not records:
                if not said_waiting:  # once per idle spell: an empty input topic is not a hang
                    print(
                        f"waiting for records in {args.input!r} (group {args.group!r}, committed so far: "
                        f"{committed_records}); produce some, or stop with Ctrl-C",
                        flush=True,
                    )
                    said_waiting = True
                if args.idle_exit_ms is not None and (time.monotonic() - idle_since) * 1000 >= args.idle_exit_ms:
                    break
                continue
            idle_since = time.monotonic()
            said_waiting = False
            producer.begin_transaction()
            try:
                for record in records:
                    producer.send(args.output, key=record.key, value=transform(record.value), headers=record.headers)
                next_offsets: dict[TopicPartition, int] = {}
                for record in records:
                    next_offsets[record.topic_partition] = record.offset + 1
                producer.send_offsets_to_transaction(next_offsets, consumer.group_metadata())
                commit(producer)
            except TxbrokerError as error:
                if error.fatal:
                    raise
                print(f"aborting: {error}", file=sys.stderr, flush=True)
                producer.abort_transaction()
                if error.code in NEEDS_A_FIX:
                    print(
                        f"stopping: redoing the work would meet {error.code} again; fix it (create "
                        f"{args.output!r}, grant the ACL, or allow the record) and start again: the "
                        f"input not committed yet is processed then",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
                consumer.seek_to_committed()  # the aborted transaction's input is processed again
                continue
            committed_records += len(records)
            print(f"committed {len(records)} records (total {committed_records})", flush=True)
    finally:
        producer.close()
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
