"""PostgreSQL killed under unmodified Kafka clients, twice, and restarted each time (the same server
on the same socket, as a supervisor would restart it): confluent-kafka transactional producers, a
consume-transform-produce loop (read_committed input, send_offsets_to_transaction) and an idempotent
acks=all producer run throughout against one server process, which is never restarted. Afterwards:
every input record transformed exactly once, every acknowledged transaction there once and whole,
nothing aborted read by read_committed, every message whose delivery report said success there
once, in order; and no client call failed: each retried until the database was back, none
fatally. The first outage kills every process of PostgreSQL at once (the postmaster and its
backends, mid-statement or mid-commit); the second the postmaster alone, whose backends end when
they notice, as after an OOM kill.

While PostgreSQL is away the Kafka door answers each request with its API's retriable code on a
connection that stays open (docs/kafka.md, "PostgreSQL unavailable"), which the raw test below pins
down: closed connections made librdkafka re-bootstrap and forget its group coordinator, and the
loop's send_offsets_to_transaction then blocked past its timeout (confluentinc/librdkafka#5511).

The PostgreSQL is the test's own (`own_postgres`), not the session's, since the test kills it.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from types import SimpleNamespace

import httpx
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.runtime.embedded_postgres import EmbeddedPostgres
from app.runtime.listening_sockets import bound_accepting_socket
from tests.conftest import process_alive
from tests.crash.test_database_outage import _wait_for_health
from tests.kafka import raw_groups, raw_transactions
from tests.kafka.clients import WAIT_S, ConfluentKafka, create_topic
from tests.kafka.exactly_once import (
    AcknowledgedWriter,
    TransactionalWriter,
    TransformLoop,
    assert_each_transaction_once,
    assert_transformed_once,
    fill_source,
    guarded_thread,
    stacks_of_the_living,
    wait_for_transactions,
)
from tests.kafka.raw import RawConnection, nested, request_of

PARTITIONS = 2
SOURCE_RECORDS = 400
# How long PostgreSQL stays down once the node has noticed: long enough for every client to send
# requests into the outage (they retry every few hundred ms), short for the suite. Nothing is
# asserted on time; the checks after are the same whatever the clients did meanwhile.
OUTAGE_S = 2


def _kill_every_process(postgres: EmbeddedPostgres) -> None:
    """SIGKILL to PostgreSQL's process group: the postmaster and every backend at once."""
    pid = postgres.pid
    assert pid is not None and os.getpgid(pid) == pid, "the postmaster leads its process group"
    os.killpg(pid, signal.SIGKILL)


def _kill_the_postmaster(postgres: EmbeddedPostgres) -> None:
    os.kill(postgres.pid, signal.SIGKILL)


def _outage(postgres: EmbeddedPostgres, kill, url: str, to_hold: list) -> None:
    """PostgreSQL killed, noticed by the node, left down a while, started again (its crash recovery
    run) on the same data dir and socket, and found again by the node. While it is down, each worker
    of `to_hold` is told to hold two transactions on (one may have committed at the kill, its
    answer still to come), for the next outage to find it mid-way."""
    kill(postgres)
    deadline = time.monotonic() + WAIT_S
    while postgres.pid is not None:  # reaped by the launcher, whose child it is
        assert time.monotonic() < deadline, "the killed postmaster did not exit"
        time.sleep(0.01)
    _wait_for_health(url, "unreachable")
    for worker in to_hold:
        worker.go.clear()
        worker.hold_after = worker.committed_transactions + 2
    time.sleep(OUTAGE_S)
    postgres.start()  # from the test's thread, as the launcher requires (its docstring)
    _wait_for_health(url, "ok")


def test_exactly_once_for_kafka_clients_across_postgresql_killed_twice(own_postgres, server_process):
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        node = server_process(
            "--database-url", own_postgres.database_url, env={"TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}"}
        )
        with httpx.Client(base_url=node.url, timeout=10) as client:
            server = SimpleNamespace(client=client, extra={"kafka_bootstrap": f"127.0.0.1:{port}"})
            source = fill_source(server, "outage-in", SOURCE_RECORDS, PARTITIONS)
            create_topic(server, "outage-out", PARTITIONS)
            create_topic(server, "outage-direct", PARTITIONS)
            create_topic(server, "outage-acked", 1)
            loop = TransformLoop(server, "outage-in", "outage-out", PARTITIONS, "outage-group", "outage-loop", 1)
            writers = [
                TransactionalWriter(server, str(k), "outage-direct", PARTITIONS, count=40, hold_after=1)
                for k in range(2)
            ]
            acknowledged = AcknowledgedWriter(f"127.0.0.1:{port}", "outage-acked")
            workers = [loop, *writers]
            errors: list[BaseException] = []
            threads = [guarded_thread(loop.run, errors, total=SOURCE_RECORDS)]
            threads += [guarded_thread(w.run, errors) for w in writers]
            threads.append(guarded_thread(acknowledged.run, errors))
            outages = []
            try:
                for thread in threads:
                    thread.start()
                # Each outage falls while every client is mid-way: each holds (after its first
                # transaction, then two after the first outage) until all are there, then the kill
                # falls once each has written one more, most still to come (as in
                # test_transactions_exactly_once.py).
                wait_for_transactions(workers, 1, errors, time.monotonic() + WAIT_S)
                for kill, hold_again in ((_kill_every_process, True), (_kill_the_postmaster, False)):
                    for worker in workers:
                        worker.go.set()
                    deadline = time.monotonic() + WAIT_S
                    wait_for_transactions(workers, [w.committed_transactions + 1 for w in workers], errors, deadline)
                    delivered = len(acknowledged.delivered)
                    at_kill = [w.committed_transactions for w in workers]
                    assert not any(w.done.is_set() for w in workers), f"the outage fell after the work: {at_kill}"
                    outages.append((at_kill, delivered))
                    _outage(own_postgres, kill, node.url, to_hold=workers if hold_again else [])
                    # Each client served again (the idempotent producer's retries delivered).
                    wait_for_transactions(workers, [t + 1 for t in at_kill], errors, deadline)
                    acknowledged.wait_for_deliveries(delivered + 1, errors, deadline)
                for worker in workers:
                    worker.go.set()
                acknowledged.stop.set()
                for thread in threads:
                    thread.join(2 * WAIT_S)
                state = (outages, [w.committed_transactions for w in workers])
                assert not (stuck := stacks_of_the_living(threads)), (state, stuck)
                assert errors == [], state
            finally:
                for worker in (*workers, acknowledged):
                    worker.stop.set()  # a failed test leaves no thread running
            # Every call retried until PostgreSQL was back: none failed, none fatally, no
            # instance replaced.
            assert [w.recoveries for w in workers] == [0, 0, 0], [w.seen for w in workers]
            assert_transformed_once(server, source, "outage-out", "outage-group", "outage-in")
            assert_each_transaction_once(server, writers, "outage-direct", PARTITIONS)
            # None failed: the outages were shorter than its delivery timeout.
            acknowledged.assert_each_sent_delivered_once(server)
        assert process_alive(node.pid), "the node exited while PostgreSQL was away"
    server_log = node.log_path.read_text()
    assert "failed with a bug" not in server_log and "unexpected error" not in server_log, server_log[-5000:]


def _fetch_request(topic: str):
    partition = nested(api_table.FETCH, 12, "FetchPartition", partition=0, fetch_offset=0, partition_max_bytes=1024)
    return request_of(
        api_table.FETCH,
        12,
        max_wait=datetime.timedelta(seconds=5),
        min_bytes=1,
        max_bytes=1024,
        isolation_level=1,
        topics=(nested(api_table.FETCH, 12, "FetchTopic", topic=topic, partitions=(partition,)),),
        forgotten_topics_data=(),
    )


def _list_offsets_request(topic: str):
    partition = nested(
        api_table.LIST_OFFSETS, 7, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-1
    )
    return request_of(
        api_table.LIST_OFFSETS,
        7,
        replica_id=-1,
        isolation_level=1,
        topics=(nested(api_table.LIST_OFFSETS, 7, "ListOffsetsTopic", name=topic, partitions=(partition,)),),
    )


def _metadata_request(topics: list[str] | None):
    named = (
        None
        if topics is None
        else tuple(nested(api_table.METADATA, 12, "MetadataRequestTopic", name=t, topic_id=None) for t in topics)
    )
    return request_of(
        api_table.METADATA,
        12,
        topics=named,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def test_the_kafka_door_answers_retriable_errors_while_postgresql_is_down(own_postgres, server_process):
    """Each request a client makes while PostgreSQL is away is answered with its API's retriable
    code (app/kafka/error_codes.py), on a connection that stays open, and succeeds on it once
    PostgreSQL is back: the coordinators' APIs COORDINATOR_NOT_AVAILABLE, Produce
    NOT_ENOUGH_REPLICAS_AFTER_APPEND, Fetch and ListOffsets KAFKA_STORAGE_ERROR, Metadata
    LEADER_NOT_AVAILABLE for each topic asked, this node as the one broker. Metadata for every
    topic, which cannot be answered without the database, closes its connection."""
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        bootstrap = f"127.0.0.1:{port}"
        node = server_process("--database-url", own_postgres.database_url, env={"TXBROKER_KAFKA_LISTENER": bootstrap})
        with httpx.Client(base_url=node.url, timeout=10) as client:
            server = SimpleNamespace(client=client, extra={"kafka_bootstrap": bootstrap})
            create_topic(server, "down", 1)
        with RawConnection(bootstrap) as connection, RawConnection(bootstrap) as every_topic:
            producer = raw_transactions.init_producer(connection, "down-txn")
            assert raw_transactions.add_partitions(connection, producer, "down", [0]) == [KafkaError.none]
            own_postgres.stop(immediate=True)
            _wait_for_health(node.url, "unreachable")

            not_available = KafkaError.coordinator_not_available
            initiated = connection.call(
                request_of(
                    api_table.INIT_PRODUCER_ID,
                    4,
                    transactional_id="down-other",
                    transaction_timeout=raw_transactions.TIMEOUT,
                    producer_id=-1,
                    producer_epoch=-1,
                )
            )
            assert (initiated.error_code, initiated.producer_id) == (not_available, -1)
            assert raw_transactions.add_partitions(connection, producer, "down", [0]) == [not_available]
            assert raw_transactions.add_offsets(connection, producer, "down-group") == not_available
            assert raw_transactions.txn_offset_commit(connection, producer, "down-group", "down", 1) == [not_available]
            assert raw_transactions.end_txn(connection, producer, True, 3).error_code == not_available
            assert raw_groups.join(connection, "down-group").error_code == not_available
            assert raw_groups.heartbeat(connection, "down-group", "m", 1).error_code == not_available
            assert raw_groups.commit(connection, "down-group", "", -1, None, "down", 1) == not_available
            fetched = connection.call(
                request_of(api_table.OFFSET_FETCH, 7, group_id="down-group", topics=None, require_stable=True)
            )
            assert fetched.error_code == not_available

            produced = raw_transactions.produce(connection, producer, "down", 0, [b"during"], 0)
            assert produced == KafkaError.not_enough_replicas_after_append
            [[read]] = [t.partitions for t in connection.call(_fetch_request("down")).responses]
            assert (read.error_code, read.records) == (KafkaError.kafka_storage_error, b"")
            [[listed]] = [t.partitions for t in connection.call(_list_offsets_request("down")).topics]
            assert listed.error_code == KafkaError.kafka_storage_error
            described = connection.call(_metadata_request(["down"]))
            assert [(b.node_id, b.port) for b in described.brokers] == [(0, port)]
            assert [(t.name, t.error_code, t.partitions) for t in described.topics] == [
                ("down", KafkaError.leader_not_available, ())
            ]
            every_topic.send(_metadata_request(None))
            assert every_topic.closed_by_peer()

            own_postgres.start()
            _wait_for_health(node.url, "ok")
            # The same connection, the same transaction: its write and its commit, retried, succeed.
            assert raw_transactions.produce(connection, producer, "down", 0, [b"during"], 0) == KafkaError.none
            assert raw_transactions.end_txn(connection, producer, True, 3).error_code == KafkaError.none
        committed = ConfluentKafka().consume(server, "down", 0, 1, isolation="read_committed")
        assert [r.value for r in committed] == [b"during"]
    server_log = node.log_path.read_text()
    assert "unexpected error" not in server_log, server_log[-5000:]


# The timeouts of `test_no_member_loses_its_session_nor_its_place_to_the_time_postgresql_was_away`:
# the members' sessions and rebalance timeouts outlasted by the outage, the canary's session much
# shorter (its eviction shows the session check ran after the database came back), with room between
# them for the members' requests on a loaded machine.
OUTLASTED = datetime.timedelta(seconds=2.5)
CANARY_SESSION = datetime.timedelta(milliseconds=700)


def _joined(connection, group: str, instance: str | None = None, session: datetime.timedelta = OUTLASTED):
    """A JoinGroup (v9) of a member, through MEMBER_ID_REQUIRED, with this session and an OUTLASTED
    rebalance timeout; its answer."""
    timeouts = {"session": session, "rebalance": OUTLASTED, "instance": instance}
    joined = raw_groups.join(connection, group, **timeouts)
    if joined.error_code == KafkaError.member_id_required:
        joined = raw_groups.join(connection, group, joined.member_id, **timeouts)
    assert joined.error_code == KafkaError.none, joined
    return joined


def _synced(connection, group: str, joined, assignments: dict[str, bytes], instance: str | None = None) -> None:
    synced = raw_groups.sync(connection, group, joined.member_id, joined.generation_id, assignments, instance)
    assert synced.error_code == KafkaError.none, synced


def test_no_member_loses_its_session_nor_its_place_to_the_time_postgresql_was_away(own_postgres, server_process):
    """Members whose requests were answered COORDINATOR_NOT_AVAILABLE for longer than their session
    and rebalance timeouts, PostgreSQL being away, are still members once it is back: the time it was
    away does not count against any session, rebalance underway or SyncGroup awaited (the server's
    session check puts each off by it when it finds the database again), as Kafka's coordinator
    holds no time before against them when it loads a group (a coordinator failover). Before, the first session
    check after the outage evicted every member of every group (the rest rebalanced, static members
    too, whose point is to avoid that) before their clients could send one heartbeat, and the first
    request to a rebalancing group removed its members as late. Three groups: a static member alone
    and Stable; a member that joined and is yet to sync; two members, the second of which began a
    rebalance (its JoinGroup waiting when PostgreSQL went away) the first is yet to rejoin. The
    canary, a member of a fourth group with a far shorter session, sends nothing after the outage:
    its eviction shows the session check has run since."""
    with bound_accepting_socket("127.0.0.1", 0) as holder:
        bootstrap = f"127.0.0.1:{holder.getsockname()[1]}"
        env = {
            "TXBROKER_KAFKA_LISTENER": bootstrap,
            "TXBROKER_GROUP_MIN_SESSION_TIMEOUT_MS": "100",
            "TXBROKER_GROUP_SESSION_CHECK_INTERVAL_MS": "50",
        }
        node = server_process("--database-url", own_postgres.database_url, env=env)
        with RawConnection(bootstrap) as connection, RawConnection(bootstrap) as newcomer:
            static = _joined(connection, "static", instance="static-0")
            _synced(connection, "static", static, {static.member_id: b"mine"}, "static-0")
            syncing = _joined(connection, "syncing")
            first = _joined(connection, "rebalancing")
            _synced(connection, "rebalancing", first, {first.member_id: b""})
            second = raw_groups.join(newcomer, "rebalancing", session=OUTLASTED, rebalance=OUTLASTED)
            assert second.error_code == KafkaError.member_id_required
            second_join = raw_groups.join_request(
                "rebalancing", second.member_id, session=OUTLASTED, rebalance=OUTLASTED
            )
            waiting = newcomer.send(second_join)
            deadline = time.monotonic() + WAIT_S
            while raw_groups.describe(connection, "rebalancing").group_state != "PreparingRebalance":
                assert time.monotonic() < deadline, "the second member's JoinGroup began no rebalance"
                time.sleep(0.02)
            canary = _joined(connection, "canary", session=CANARY_SESSION)
            _synced(connection, "canary", canary, {canary.member_id: b""})
            started = time.monotonic()
            own_postgres.stop(immediate=True)
            _wait_for_health(node.url, "unreachable")
            answered = newcomer.receive(api_table.JOIN_GROUP, raw_groups.JOIN_VERSION, waiting)
            assert answered.error_code == KafkaError.coordinator_not_available, answered
            while time.monotonic() < started + OUTLASTED.total_seconds() + 0.5:
                time.sleep(0.05)  # the outage outlasts every session and rebalance timeout
            own_postgres.start()
            _wait_for_health(node.url, "ok")
            deadline = time.monotonic() + WAIT_S
            while [m.member_id for m in raw_groups.describe(connection, "canary").members] == [canary.member_id]:
                assert time.monotonic() < deadline, "the canary's session never lapsed after the outage"
                time.sleep(0.02)

            def heartbeat(group: str, joined, instance: str | None = None) -> KafkaError:
                return raw_groups.heartbeat(
                    connection, group, joined.member_id, joined.generation_id, instance
                ).error_code

            assert heartbeat("static", static, "static-0") == KafkaError.none
            assert heartbeat("syncing", syncing) == KafkaError.none
            assert heartbeat("rebalancing", first) == KafkaError.rebalance_in_progress
            [described] = raw_groups.describe(connection, "static").members
            assert (described.member_id, described.group_instance_id) == (static.member_id, "static-0")
            assert raw_groups.describe(connection, "syncing").group_state == "CompletingRebalance"
            described = raw_groups.describe(connection, "rebalancing")
            assert described.group_state == "PreparingRebalance"
            assert sorted(m.member_id for m in described.members) == sorted([first.member_id, second.member_id])
