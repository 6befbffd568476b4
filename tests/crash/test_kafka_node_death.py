"""One node of two SIGKILLed for good under unmodified Kafka clients (confluent-kafka): two `txbroker
serve` nodes on one PostgreSQL, both the clients' bootstrap servers, and the one the clients use the
most is killed and never restarted.

Every node answers itself as the coordinator of every group and transactional id, and all of them
the same live node as a partition's leader (docs/kafka.md, "Several nodes"), so the survivor never
names the dead node as either once its presence ended (at once: its session ends with its socket),
and leads every partition; it lists it as a broker for kafka_lapsed_node_listed_ms after first finding it gone (its
presence session ends with its socket, at once), as Kafka lists a dead broker until its session
times out. That listing is what lets librdkafka find its group coordinator again: a request
waiting for a coordinator that is gone from the client's metadata waited for good
(confluentinc/librdkafka#5511), which the second test pins down."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
import psutil
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from app.kafka import api_table
from tests.conftest import ServerProcess
from tests.kafka.clients import WAIT_S, create_topic
from tests.kafka.exactly_once import (
    SEND_OFFSETS_WATCHDOG_S,
    AcknowledgedWriter,
    TransactionalWriter,
    TransformLoop,
    assert_each_transaction_once,
    assert_transformed_once,
    committed_offsets,
    committed_values,
    fill_source,
    guarded_thread,
    stacks_of_the_living,
    wait_for_transactions,
)
from tests.kafka.raw import RawConnection, request_of, topic_metadata
from tests.kafka.test_nodes import brokers, brokers_become, held_port

PARTITIONS = 2
SOURCE_RECORDS = 400
TRANSACTION_KEY = 1  # FindCoordinator's key type of a transactional id


def _node(server_process, database_url: str, node_id: int, port: int) -> ServerProcess:
    env = {"TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}", "TXBROKER_NODE_ID": str(node_id)}
    return server_process("--database-url", database_url, env=env)


def _client_connections(port: int) -> int:
    """This process's established TCP connections to `port`: the clients run in it, and librdkafka
    connects to a broker only for what it asks that broker (sparse connections)."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
    )


def _coordinator(bootstrap: str, key: str) -> int:
    """The node id FindCoordinator (v4) answers for a transactional id."""
    with RawConnection(bootstrap) as connection:
        answer = connection.call(
            request_of(api_table.FIND_COORDINATOR, 4, key_type=TRANSACTION_KEY, coordinator_keys=(key,))
        )
    [coordinator] = answer.coordinators
    assert coordinator.error_code == 0, coordinator
    return coordinator.node_id


def _leaders(bootstrap: str, topic: str) -> set[int]:
    return {p.leader_id for p in topic_metadata(bootstrap, topic, False).partitions}


def _leaders_become(bootstrap: str, topic: str, expected: set[int]) -> None:
    """Waits until the node names only `expected` the topic's leaders: PostgreSQL ends a killed
    node's presence session a moment after its socket closes, and until then it leads."""
    deadline = time.monotonic() + WAIT_S
    while (found := _leaders(bootstrap, topic)) != expected:
        assert time.monotonic() < deadline, f"{topic}'s leaders {found}, expected {expected}"
        time.sleep(0.1)


def _metadata_refreshed(client) -> None:
    """A Metadata of `client`'s answered, each try brief (one sent to a dead broker waits out its
    timeout), within WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            client.list_topics(timeout=2)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise


def test_exactly_once_for_kafka_clients_when_one_of_two_nodes_dies_for_good(server_process, database_url):
    """Transactional producers, a consume-transform-produce loop (read_committed input,
    send_offsets_to_transaction) and an idempotent acks=all producer, against both nodes; the node
    they hold the most connections to dies mid-way. Afterwards: the clients carried on against the
    survivor, every input record is transformed exactly once, every acknowledged transaction is
    there once and whole, nothing aborted is read by read_committed, every message whose delivery
    report said success is there once, in order; meanwhile the survivor led every partition and
    coordinated every key, listed the dead node a while, then no more."""
    with held_port() as first_holder, held_port() as second_holder:
        ports = [first_holder.getsockname()[1], second_holder.getsockname()[1]]
        node_ids = [1, 2]
        nodes = [_node(server_process, database_url, node_id, port) for node_id, port in zip(node_ids, ports)]
        both = dict(zip(node_ids, ports))
        brokers_become(ports[0], both)
        assert brokers(ports[1]) == both
        bootstrap = ",".join(f"127.0.0.1:{port}" for port in ports)
        http_clients = [httpx.Client(base_url=node.url, timeout=10) for node in nodes]
        server = SimpleNamespace(client=http_clients[0], extra={"kafka_bootstrap": bootstrap})
        loop = TransformLoop(server, "death-in", "death-out", PARTITIONS, "death-group", "death-loop", hold_after=1)
        writers = [
            TransactionalWriter(server, str(k), "death-direct", PARTITIONS, count=40, hold_after=1) for k in range(2)
        ]
        workers = [loop, *writers]
        acknowledged = AcknowledgedWriter(bootstrap, "death-acked")
        try:
            source = fill_source(server, "death-in", SOURCE_RECORDS, PARTITIONS)
            for topic, partitions in (("death-out", PARTITIONS), ("death-direct", PARTITIONS), ("death-acked", 1)):
                create_topic(server, topic, partitions)
            errors: list[BaseException] = []
            threads = [guarded_thread(loop.run, errors, total=SOURCE_RECORDS)]
            threads += [guarded_thread(w.run, errors) for w in writers]
            threads.append(guarded_thread(acknowledged.run, errors))
            for thread in threads:
                thread.start()
            # The kill falls while every client is mid-way (as in test_transactions_exactly_once.py):
            # each holds after its first transaction until all have written one, then the kill
            # falls once each has written one more, most still to come.
            deadline = time.monotonic() + WAIT_S
            wait_for_transactions(workers, 1, errors, deadline)
            for worker in workers:
                worker.go.set()
            wait_for_transactions(workers, 2, errors, deadline)
            acknowledged.wait_for_deliveries(1, errors, deadline)

            connections = [_client_connections(port) for port in ports]
            victim = 0 if connections[0] >= connections[1] else 1
            survivor = 1 - victim
            assert connections[victim] > 0, connections
            survivor_bootstrap = f"127.0.0.1:{ports[survivor]}"
            server.client = http_clients[survivor]  # the other stays open: a thread may be using it
            at_kill = ([w.committed_transactions for w in workers], len(acknowledged.delivered))
            assert not any(w.done.is_set() for w in workers), f"the kill fell after the work: {at_kill}"
            nodes[victim].kill()

            # The survivor lists the dead node a while (its first answer after the death does),
            # names itself every key's coordinator throughout, and every partition's leader once
            # it finds the dead node's presence gone.
            assert brokers(ports[survivor]) == both
            for topic in ("death-in", "death-out", "death-direct", "death-acked"):
                _leaders_become(survivor_bootstrap, topic, {node_ids[survivor]})
            assert brokers(ports[survivor]) == both  # a lapsed node: listed, leading nothing
            assert _coordinator(survivor_bootstrap, "death-loop") == node_ids[survivor]

            # The clients carry on against the survivor: each commits a transaction more, the
            # idempotent producer's messages are delivered.
            deadline = time.monotonic() + WAIT_S
            wait_for_transactions(workers, [t + 1 for t in at_kill[0]], errors, deadline)
            acknowledged.wait_for_deliveries(at_kill[1] + 2, errors, deadline)
            # The dead node leaves the list (kafka_lapsed_node_listed_ms after the survivor found
            # it gone), and the clients, which have dropped it from their metadata, go on.
            brokers_become(ports[survivor], {node_ids[survivor]: ports[survivor]})
            assert _coordinator(survivor_bootstrap, "writer-0") == node_ids[survivor]
            acknowledged.stop.set()
            for thread in threads:
                thread.join(2 * WAIT_S)
            state = (connections, at_kill, [w.committed_transactions for w in workers])
            seen = [w.seen for w in workers]
            assert not (stuck := stacks_of_the_living(threads)), (state, seen, stuck)
            assert errors == [], (state, seen)
            # None of them failed: each client call was retried against the survivor, no
            # instance replaced (send_offsets_to_transaction did not wait for the dead node).
            assert [w.recoveries for w in workers] == [0, 0, 0], (state, seen)
        finally:
            for worker in (*workers, acknowledged):
                worker.stop.set()  # a failed test leaves no thread running
        assert_transformed_once(server, source, "death-out", "death-group", "death-in")
        assert_each_transaction_once(server, writers, "death-direct", PARTITIONS)
        acknowledged.assert_each_sent_delivered_once(server)  # none failed: its delivery timeout is minutes
        for client in http_clients:
            client.close()
    server_log = nodes[survivor].log_path.read_text()
    assert "failed with a bug" not in server_log and "unexpected error" not in server_log, server_log[-5000:]


def test_send_offsets_to_transaction_finds_its_group_coordinator_again_after_that_node_dies(
    server_process, database_url
):
    """A transactional producer whose group coordinator (and transaction coordinator) is the node
    that dies, mid-transaction: its next send_offsets_to_transaction returns (its TxnOffsetCommit
    sent to the survivor), and the transaction commits, once. Without the dead node listed, the
    client's first Metadata after the death dropped it, and send_offsets_to_transaction, waiting for
    a coordinator it no longer tried to connect to, never returned (confluentinc/librdkafka#5511,
    whose timeout it ignores: #5456)."""
    with held_port() as first_holder, held_port() as second_holder:
        ports = [first_holder.getsockname()[1], second_holder.getsockname()[1]]
        bootstrap = ",".join(f"127.0.0.1:{port}" for port in ports)
        dying = _node(server_process, database_url, 1, ports[0])
        with httpx.Client(base_url=dying.url, timeout=10) as client:
            create_topic(SimpleNamespace(client=client), "lost-coordinator", 1)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "lost-coordinator"})
        group = Consumer({"bootstrap.servers": bootstrap, "group.id": "lost-coordinator-group"})
        try:
            # Its coordinators found while node 1 alone serves: node 1, in the producer's cache.
            producer.init_transactions(WAIT_S)
            producer.begin_transaction()
            producer.produce("lost-coordinator", value=b"first", partition=0)
            offsets = [TopicPartition("lost-coordinator", 0, 1)]
            producer.send_offsets_to_transaction(offsets, group.consumer_group_metadata(), WAIT_S)
            producer.commit_transaction(WAIT_S)
            surviving = _node(server_process, database_url, 2, ports[1])
            # Node 2 lists node 1 (after a death a node lists only a node it listed alive).
            brokers_become(ports[1], {1: ports[0], 2: ports[1]})
            assert sorted(producer.list_topics(timeout=WAIT_S).brokers) == [1, 2]

            producer.begin_transaction()
            producer.produce("lost-coordinator", value=b"second", partition=0)
            assert producer.flush(WAIT_S) == 0
            dying.kill()
            # The producer's metadata, refreshed after the death (node 2 answers): a broker it
            # leaves out is dropped with its connection attempts. A request made before librdkafka
            # has seen its connection to node 1 close may be queued for node 1 (reconnecting) until
            # it times out: asked again, briefly, until node 2 answers.
            _metadata_refreshed(producer)
            finished = threading.Event()
            failure: list[BaseException] = []

            def send_offsets() -> None:
                try:
                    offsets = [TopicPartition("lost-coordinator", 0, 2)]
                    producer.send_offsets_to_transaction(offsets, group.consumer_group_metadata(), WAIT_S)
                except BaseException as error:  # surfaced below
                    failure.append(error)
                finally:
                    finished.set()

            threading.Thread(target=send_offsets, daemon=True).start()
            assert finished.wait(SEND_OFFSETS_WATCHDOG_S), "send_offsets_to_transaction never returned"
            assert failure == []
            producer.commit_transaction(WAIT_S)
        finally:
            group.close()
        with httpx.Client(base_url=surviving.url, timeout=10) as client:
            server = SimpleNamespace(client=client)
            assert committed_values(server, "lost-coordinator", 0) == [b"first", b"second"]
            assert committed_offsets(server, "lost-coordinator-group", "lost-coordinator", 1) == {0: 2}
