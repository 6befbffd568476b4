"""The seeds' transactional producer (KIP-98's KafkaTransactionsExample) with txbroker's SDK: a few
transactions of records, each committed atomically -- and one aborted, whose records no
read_committed consumer ever sees.

    .venv/bin/python examples/transactional_producer.py [URL] [--topic T] [--transactions N]

Error handling is Kafka's (KIP-1050): an abortable error aborts the transaction and the work is
redone; a fatal one (another instance with the same transactional id took over: PRODUCER_FENCED)
ends the producer.
"""

from __future__ import annotations

import argparse
import sys

from txbroker import Admin, Consumer, Producer, TopicPartition
from txbroker.errors import TopicAlreadyExistsError, TxbrokerError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:8080")
    parser.add_argument("--topic", default="transactional-example")
    parser.add_argument("--transactional-id", default="transactional-example-producer")
    parser.add_argument("--transactions", type=int, default=3)
    parser.add_argument("--records-per-transaction", type=int, default=5)
    args = parser.parse_args(argv)

    with Admin(args.url) as admin:
        try:
            admin.create_topic(args.topic, partitions=2)
        except TopicAlreadyExistsError:
            pass

    # The transactional id is what makes this producer "the same application" across restarts:
    # init_transactions() fences any older instance and finishes what it left open.
    with Producer(args.url, transactional_id=args.transactional_id) as producer:
        producer.init_transactions()
        for number in range(args.transactions):
            committed = run_transaction(producer, args.topic, number, args.records_per_transaction)
            print(f"transaction {number}: {'committed' if committed else 'aborted'}")

        # A transaction that is aborted on purpose: its records were written, and stay invisible.
        producer.begin_transaction()
        producer.send(args.topic, key=b"doomed", value=b"never visible to read_committed")
        producer.flush()
        producer.abort_transaction()
        print("one more transaction: aborted on purpose")

    with Consumer(args.url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(args.topic, 0), TopicPartition(args.topic, 1)])
        consumer.seek_to_beginning()
        seen = []
        while batch := consumer.poll(timeout_ms=500):
            seen += batch
    print(
        f"a read_committed consumer sees {len(seen)} records in {args.topic}; "
        f"aborted ones: {sum(r.key == b'doomed' for r in seen)}"
    )
    return 0


def run_transaction(producer: Producer, topic: str, number: int, records: int) -> bool:
    producer.begin_transaction()
    try:
        for i in range(records):
            producer.send(topic, key=f"order-{number}-{i}", value=f"transaction {number}, record {i}")
        producer.commit_transaction()  # flushes first; the records become visible atomically
        return True
    except TxbrokerError as error:
        if error.fatal:  # fenced by a newer instance: this one must stop
            raise
        producer.abort_transaction()
        return False


if __name__ == "__main__":
    sys.exit(main())
