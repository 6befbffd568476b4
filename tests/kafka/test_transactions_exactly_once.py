"""Exactly once with confluent-kafka: the consume-transform-produce loop (read_committed input,
transactional output, send_offsets_to_transaction), some of its transactions aborted and read again;
then the same loop and transactional writers while the node is SIGKILLed and restarted: afterwards
every input record is transformed exactly once, every acknowledged transaction is there once,
nothing aborted or partial is read, over Kafka and over HTTP."""

from __future__ import annotations

import time
from types import SimpleNamespace

import httpx

from app.runtime.listening_sockets import bound_accepting_socket
from tests.kafka.clients import WAIT_S, ConfluentKafka, create_topic
from tests.kafka.exactly_once import (
    TransactionalWriter,
    TransformLoop,
    assert_each_transaction_once,
    assert_transformed_once,
    fill_source,
    guarded_thread,
    stacks_of_the_living,
    wait_for_transactions,
)

CONFLUENT = ConfluentKafka()
PARTITIONS = 2


def test_consume_transform_produce_exactly_once_with_aborts(module_kafka_server):
    server = module_kafka_server
    source = fill_source(server, "eos-in", 300, PARTITIONS)
    create_topic(server, "eos-out", PARTITIONS)
    loop = TransformLoop(server, "eos-in", "eos-out", PARTITIONS, "eos-group", "eos-loop")
    loop.run(total=300, abort_every=3)
    assert loop.aborted_transactions > 0 and loop.recoveries == 0
    assert_transformed_once(server, source, "eos-out", "eos-group", "eos-in")
    # The aborted transactions' records are in the log, hidden from read_committed only.
    everything = sum(len(CONFLUENT.consume(server, "eos-out", p, len(source[p]))) for p in range(PARTITIONS))
    assert everything > 300


def test_sigkill_during_transactions_then_exactly_once(server_process, database_url):
    # The Kafka port, held as `serve` holds it and kept across the restart (see test_serve.py).
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        env = {"TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}"}
        process = server_process("--database-url", database_url, env=env)
        clients = [httpx.Client(base_url=process.url, timeout=10)]
        server = SimpleNamespace(client=clients[0], extra={"kafka_bootstrap": f"127.0.0.1:{port}"})
        loop = TransformLoop(server, "crash-in", "crash-out", PARTITIONS, "crash-group", "crash-loop", hold_after=1)
        writers = [
            TransactionalWriter(server, str(k), "crash-direct", PARTITIONS, count=40, hold_after=1) for k in range(2)
        ]
        try:
            source = fill_source(server, "crash-in", 400, PARTITIONS)
            create_topic(server, "crash-out", PARTITIONS)
            create_topic(server, "crash-direct", PARTITIONS)
            errors: list[BaseException] = []
            threads = [guarded_thread(loop.run, errors, total=400)] + [guarded_thread(w.run, errors) for w in writers]
            for thread in threads:
                thread.start()
            # Kill while every one of them is mid-way: some transactions done, more to come. Each
            # holds after its first transaction until all have written one (the loop's start takes
            # longer than the writers' 40 transactions on a fast machine, and the loop's 20 take less
            # than a poll), then the kill falls once each has written one more, most still to come.
            deadline = time.monotonic() + WAIT_S
            wait_for_transactions([loop, *writers], 1, errors, deadline)
            for worker in (loop, *writers):
                worker.go.set()
            wait_for_transactions([loop, *writers], 2, errors, deadline)
            with loop.offsets_gate:  # the loop's transaction may be open, just not in send_offsets (see there)
                process.kill()
                assert all(thread.is_alive() for thread in threads), "the kill fell mid-way: work was left"
                at_kill = (loop.committed_transactions, [len(w.acknowledged) for w in writers])
                restarted = server_process("--database-url", database_url, env=env)
                clients.append(httpx.Client(base_url=restarted.url, timeout=10))
                server.client = clients[-1]  # the old one stays open: a thread may be using it
            for thread in threads:
                thread.join(2 * WAIT_S)
            state = (at_kill, loop.committed_transactions, loop.idle_at, [len(w.acknowledged) for w in writers])
            seen = [loop.seen, *(w.seen for w in writers)]
            assert not (stuck := stacks_of_the_living(threads)), (state, seen, stuck)
            assert errors == [], (state, seen)

            assert_transformed_once(server, source, "crash-out", "crash-group", "crash-in")
            assert_each_transaction_once(server, writers, "crash-direct", PARTITIONS)
        finally:
            for worker in (loop, *writers):
                worker.stop.set()  # a failed test leaves no thread running
            for client in clients:
                client.close()
