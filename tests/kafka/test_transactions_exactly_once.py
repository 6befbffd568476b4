"""Exactly once with confluent-kafka: the consume-transform-produce loop (read_committed input,
transactional output, send_offsets_to_transaction), some of its transactions aborted and read again;
then the same loop and transactional writers while the node is SIGKILLed and restarted: afterwards
every input record is transformed exactly once, every acknowledged transaction is there once,
nothing aborted or partial is read, over Kafka and over HTTP."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from types import SimpleNamespace

import httpx

from app.runtime.listening_sockets import bound_accepting_socket
from tests.kafka.clients import WAIT_S, ConfluentKafka, create_topic
from tests.kafka.exactly_once import (
    POLL_S,
    TransactionalWriter,
    TransformLoop,
    committed_offsets,
    committed_values,
    transformed,
)

CONFLUENT = ConfluentKafka()
PARTITIONS = 2


def _fill_source(server, topic: str, count: int) -> dict[int, list[bytes]]:
    create_topic(server, topic, PARTITIONS)
    delivered = CONFLUENT.produce(
        server, topic, [{"value": f"in-{n}".encode()} for n in range(count)], partitioner="murmur2_random"
    )
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for d in sorted(delivered, key=lambda d: (d.partition, d.offset)):
        by_partition[d.partition].append(d.value)
    return by_partition


def _assert_exactly_once(server, source: dict[int, list[bytes]], sink: str, group: str, source_topic: str) -> None:
    for partition, values in source.items():
        expected = [transformed(v) for v in values]
        assert committed_values(server, sink, partition) == expected
        received = CONFLUENT.consume(server, sink, partition, len(expected), isolation="read_committed")
        assert [r.value for r in received] == expected
    ends = {p: len(v) for p, v in source.items()}
    assert committed_offsets(server, group, source_topic, PARTITIONS) == ends


def test_consume_transform_produce_exactly_once_with_aborts(module_kafka_server):
    server = module_kafka_server
    source = _fill_source(server, "eos-in", 300)
    create_topic(server, "eos-out", PARTITIONS)
    loop = TransformLoop(server, "eos-in", "eos-out", PARTITIONS, "eos-group", "eos-loop")
    loop.run(total=300, abort_every=3)
    assert loop.aborted_transactions > 0 and loop.recoveries == 0
    _assert_exactly_once(server, source, "eos-out", "eos-group", "eos-in")
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
            source = _fill_source(server, "crash-in", 400)
            create_topic(server, "crash-out", PARTITIONS)
            create_topic(server, "crash-direct", PARTITIONS)
            errors: list[BaseException] = []

            def guarded(target, **kwargs):
                def run():
                    try:
                        target(**kwargs)
                    except BaseException as error:  # surfaced by the assertion below
                        errors.append(error)

                return threading.Thread(target=run, daemon=True)

            threads = [guarded(loop.run, total=400)] + [guarded(w.run) for w in writers]
            for thread in threads:
                thread.start()
            # Kill while every one of them is mid-way: some transactions done, more to come. Each
            # holds after its first transaction until all have written one (the loop's start takes
            # longer than the writers' 40 transactions on a fast machine, and the loop's 20 take less
            # than a poll), then the kill falls once each has written one more, most still to come.
            deadline = time.monotonic() + WAIT_S
            while not (loop.committed_transactions >= 1 and all(len(w.acknowledged) >= 1 for w in writers)):
                assert time.monotonic() < deadline and not errors, errors
                time.sleep(POLL_S)
            for worker in (loop, *writers):
                worker.go.set()
            while not (loop.committed_transactions >= 2 and all(len(w.acknowledged) >= 2 for w in writers)):
                assert time.monotonic() < deadline and not errors, errors
                time.sleep(0.001)
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
            stuck = [
                "".join(traceback.format_stack(sys._current_frames()[thread.ident]))
                for thread in threads
                if thread.is_alive()
            ]
            assert not stuck, (state, seen, stuck)
            assert errors == [], (state, seen)

            _assert_exactly_once(server, source, "crash-out", "crash-group", "crash-in")
            for partition in range(PARTITIONS):
                values = committed_values(server, "crash-direct", partition)
                assert len(values) == len(set(values)), "a transaction was committed twice"
                expected = [v for w in writers for n in range(w.count) for p, v in w.values(n) if p == partition]
                assert sorted(values) == sorted(expected)  # every transaction once, none partial
                received = CONFLUENT.consume(server, "crash-direct", partition, len(values), isolation="read_committed")
                assert sorted(r.value for r in received) == sorted(values)
        finally:
            for worker in (loop, *writers):
                worker.stop.set()  # a failed test leaves no thread running
            for client in clients:
                client.close()
