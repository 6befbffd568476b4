"""Benchmark of txbroker's transactions (KIP-98 over HTTP), each result next to a baseline measured in
the same run on the same embedded PostgreSQL and server:

1. small transactions/s (3 records over 2 partitions, then commit) with 1, 8 and 32 producers,
   against the same records written by idempotent producers without a transaction, against raw
   PostgreSQL's 3-statement transaction, and against the naive app (bench/naive_app.py) answering
   the same two requests (the produce, then a stand-in for EndTxn): the ceiling of that HTTP shape;
2. end-to-end latency, commit acknowledged -> visible to a read_committed long-poll fetch, against
   a plain produce acknowledged -> visible;
3. 1000-record transactions against the same records written idempotently: the commit overhead,
   beside the naive app's overhead for the one request more;
4. read_committed fetch latency and cost at the start, middle and end of partitions of 10k, 1M and
   10M records (10% aborted), built directly in PostgreSQL with COPY in the server's format.

    .venv/bin/python -m bench.transactions [--seconds 3] [--sizes 10000,1000000,10000000]

Starts and stops its own embedded PostgreSQL and `txbroker serve` (by pid, in a finally). See
bench/README.md.
"""

# One module per section (small_transactions, commit_to_visible, large_transactions,
# fetch_vs_log_length), over what they share: the HTTP calls (http_calls), the producers as timed-run
# workloads (workloads), runs in alternation (alternating_runs) and the table (report). __main__ parses
# the options, starts the processes (bench.processes.BenchProcesses) and runs the sections asked for.
