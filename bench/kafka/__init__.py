"""Benchmark of txbroker's Kafka listener (issue 23's proof) with confluent-kafka (librdkafka 2.x),
each result beside a baseline measured in the same run, on the same embedded PostgreSQL and server:

1. confluent-kafka producers (100-byte records, acks=all, idempotent, linger.ms 5), records/s,
   against raw COPY of the same records (bench.workloads.RawCopy, a row per record) and against
   the HTTP produce path (POST /v1/produce of 100-record batches, as bench.produce_ceiling);
2. a read_committed consumer reading N of those records, against a raw SELECT of as many rows;
3. 1000-record transactions of transactional producers, against the idempotent producers of 1;
4. small transactions (3 records to 2 partitions) per second with 8 and 32 transactional
   producers, against the HTTP path's small transactions (bench.transactions' section 1);
5. EndTxn answered -> the record at a read_committed consumer, p50/p99, against an idempotent
   produce acknowledged -> seen.

    .venv/bin/python -m bench.kafka [--seconds 3] [--rounds 2] [--quick]

Sections 1 and 3 run in alternating rounds (raw COPY, HTTP produce, Kafka idempotent, Kafka
transactions, again), 2 and 4 alternate baseline and Kafka; each adds its rounds up. Starts and
stops its own embedded PostgreSQL and `txbroker serve` (by pid). See bench/README.md.
"""

# clients.py: the confluent-kafka clients, run in client subprocesses; client_runs.py: runs them for
# a window and measures it as bench.timed_run does; sections.py: the five measurements; __main__:
# the options, the processes and the table (bench.transactions.report's).
