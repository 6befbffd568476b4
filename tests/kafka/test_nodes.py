"""Several `txbroker serve` nodes on one PostgreSQL appear in Metadata as brokers, each with the id
it was started with (TXBROKER_NODE_ID), listed while alive: a node stopped (or killed) is still
listed by a node that listed it, kafka_lapsed_node_listed_ms after that node finds it gone, then
leaves the list; restarted with its id it is listed again; each answers itself as the coordinator,
and all of them the same leader of a partition, one of the live nodes (never a lapsed one), the
leaders spread over them. DescribeCluster answers the same brokers but those listed for the lapse, Kafka's fenced
brokers, answered (flagged) only to its v2's include_fenced_brokers. A node that hangs (SIGSTOP)
leaves the list likewise once its heartbeats have stopped for node_presence.SESSION_TIMEOUT_S, and
is back the moment it resumes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
import uuid
from collections import Counter

import asyncpg
import httpx
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode as KafkaError

from app.kafka import api_table
from app.runtime.listening_sockets import bound_accepting_socket
from app.storage import database, node_presence
from app.storage.node_presence import HEARTBEAT_INTERVAL_S, SESSION_TIMEOUT_S, LiveNode
from tests.conftest import ServerProcess, process_alive
from tests.kafka.clients import WAIT_S
from tests.kafka.raw import RawConnection, request_of, topic_metadata
from tests.kafka.test_num_partitions import created_with, grown_with
from tests.kafka.test_replica_admin import reassign

# How long the first node lists the second once it finds it gone (kafka_lapsed_node_listed_ms):
# short, for the test to see it leave soon; what is asserted holds for any length.
LAPSED_NODE_LISTED_MS = 1000
VERSIONS_OF_DESCRIBE_CLUSTER = list(api_table.SUPPORTED_VERSIONS[api_table.DESCRIBE_CLUSTER])


def held_port() -> socket.socket:
    """A port held as `serve` holds its Kafka port (app/runtime/listening_sockets.py): bound with address and
    port reuse and never listening (the kernel hands it no connection), so the node's claim passes it,
    the node binds its Kafka listener beside it, and the port stays ours across the node's restarts."""
    return bound_accepting_socket("127.0.0.1", 0)


def metadata_brokers(connection: RawConnection) -> list:
    """The brokers of a Metadata v12 answer (asking for no topic) on `connection`."""
    response = connection.call(
        request_of(
            api_table.METADATA,
            12,
            topics=(),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    )
    return list(response.brokers)


def brokers(port: int) -> dict[int, int]:
    with RawConnection(f"127.0.0.1:{port}") as connection:
        return {b.node_id: b.port for b in metadata_brokers(connection)}


def brokers_become(port: int, expected: dict[int, int]) -> None:
    deadline = time.monotonic() + WAIT_S
    while (found := brokers(port)) != expected:
        assert time.monotonic() < deadline, f"brokers {found}, expected {expected}"


def described(port: int, version: int, include_fenced: bool) -> list[tuple[int, int, bool]]:
    """DescribeCluster's brokers, as (id, port, is_fenced) (is_fenced False before v2, which has it)."""
    with RawConnection(f"127.0.0.1:{port}") as connection:
        response = connection.call(
            request_of(
                api_table.DESCRIBE_CLUSTER,
                version,
                include_cluster_authorized_operations=False,
                endpoint_type=1,
                include_fenced_brokers=include_fenced,
            )
        )
    return sorted((b.broker_id, b.port, getattr(b, "is_fenced", False)) for b in response.brokers)


def node_process(
    server_process, database_url: str, node_id: int, port: int, lapse_ms: int = LAPSED_NODE_LISTED_MS
) -> ServerProcess:
    env = {
        "TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}",
        "TXBROKER_NODE_ID": str(node_id),
        "TXBROKER_KAFKA_LAPSED_NODE_LISTED_MS": str(lapse_ms),
    }
    return server_process("--database-url", database_url, env=env)


def test_nodes_on_one_database_are_brokers_while_alive(server_process, database_url):
    with held_port() as first_port_holder, held_port() as second_port_holder:
        first_port, second_port = first_port_holder.getsockname()[1], second_port_holder.getsockname()[1]

        def node(node_id: int, port: int):
            return node_process(server_process, database_url, node_id, port)

        node(7, first_port)
        second = node(11, second_port)
        brokers_become(first_port, {7: first_port, 11: second_port})
        assert brokers(second_port) == {7: first_port, 11: second_port}
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{second_port}"})
        assert sorted(admin.list_topics(timeout=WAIT_S).brokers) == [7, 11]
        described = admin.describe_cluster(request_timeout=WAIT_S).result(timeout=WAIT_S)  # DescribeCluster (60)
        assert sorted((n.id, n.port) for n in described.nodes) == [(7, first_port), (11, second_port)]
        assert described.controller.id in (7, 11)  # the node asked: each answers itself as the controller
        del admin
        second.terminate()
        # Its first answer after finding the node gone still lists it (whatever the lapse's length:
        # it counts from that answer), then it leaves the list.
        assert brokers(first_port) == {7: first_port, 11: second_port}
        brokers_become(first_port, {7: first_port})
        second = node(11, second_port)  # restarted with its id
        brokers_become(first_port, {7: first_port, 11: second_port})
        second.kill()  # SIGKILL: PostgreSQL ends its session when the socket closes
        assert brokers(first_port) == {7: first_port, 11: second_port}
        brokers_become(first_port, {7: first_port})


def test_describe_cluster_answers_a_lapsed_node_as_fenced_only_to_whom_asks_for_fenced_brokers(
    server_process, database_url
):
    """Regression: a node that died, listed only for the lapse (as Metadata must list it: "A node
    dies" in docs/kafka.md), was answered by DescribeCluster as a live broker, `is_fenced` false,
    also to a request not asking for fenced brokers. Kafka's broker answers DescribeCluster's
    unfenced brokers, and the fenced ones (flagged) only to v2's include_fenced_brokers (KIP-1073);
    a node whose presence lapsed is what Kafka calls fenced. Metadata lists it all the while, and
    once the lapse ends neither answers it."""
    lapse_ms = 8000  # long enough to look at it during the lapse, short for the test to see it end
    with held_port() as first_port_holder, held_port() as second_port_holder:
        first_port, second_port = first_port_holder.getsockname()[1], second_port_holder.getsockname()[1]
        both = {7: first_port, 11: second_port}
        node_process(server_process, database_url, 7, first_port, lapse_ms)
        second = node_process(server_process, database_url, 11, second_port, lapse_ms)
        brokers_become(first_port, both)
        for version in VERSIONS_OF_DESCRIBE_CLUSTER:
            for include_fenced in (False, True):
                assert described(first_port, version, include_fenced) == [
                    (7, first_port, False),
                    (11, second_port, False),
                ]
        second.kill()
        deadline = time.monotonic() + WAIT_S
        while (found := described(first_port, 2, include_fenced=False)) != [(7, first_port, False)]:
            assert time.monotonic() < deadline, f"node 11 killed {WAIT_S} s ago and described as {found}"
            time.sleep(0.1)
        # Within the lapse: fenced, answered only when asked for; Metadata lists it.
        assert described(first_port, 2, include_fenced=True) == [(7, first_port, False), (11, second_port, True)]
        assert described(first_port, 1, include_fenced=True) == [(7, first_port, False)]  # v0-v1: no such flag
        assert described(first_port, 0, include_fenced=True) == [(7, first_port, False)]
        assert brokers(first_port) == both
        brokers_become(first_port, {7: first_port})  # the lapse ended
        assert described(first_port, 2, include_fenced=True) == [(7, first_port, False)]


def lapsed_in_describe_cluster(port: int, node_id: int, node_port: int) -> None:
    """Waits until DescribeCluster answers the node as fenced (its presence lapsed, listed still)."""
    deadline = time.monotonic() + WAIT_S
    while (node_id, node_port, True) not in (found := described(port, 2, include_fenced=True)):
        assert time.monotonic() < deadline, f"node {node_id} killed {WAIT_S} s ago and described as {found}"
        time.sleep(0.1)


def test_replica_lists_naming_a_lapsed_node_are_answered_as_kafka_answers_a_fenced_broker(server_process, database_url):
    """Regression: the admin APIs that take replica lists took a node listed only for the lapse after
    its death as any live one, so a topic or a partition was made "on" a dead node. Kafka's
    controller tells a fenced broker from a registered one: a new partition (CreateTopics' and
    CreatePartitions' assignments) whose replicas are all fenced is INVALID_REPLICA_ASSIGNMENT
    ("All brokers specified in the manual partition assignment for partition N are fenced or in
    controlled shutdown.", ReplicationControlManager.createTopic and createPartitions), one live
    replica beside it is enough; AlterPartitionReassignments asks only that each replica be
    registered, and takes a fenced broker (NONE). Once the lapse ends the node is not registered."""
    lapse_ms = 8000  # long enough for the requests, short for the test to see the lapse end
    with held_port() as first_port_holder, held_port() as second_port_holder:
        first_port, second_port = first_port_holder.getsockname()[1], second_port_holder.getsockname()[1]
        first = f"127.0.0.1:{first_port}"
        node_process(server_process, database_url, 7, first_port, lapse_ms)
        second = node_process(server_process, database_url, 11, second_port, lapse_ms)
        brokers_become(first_port, {7: first_port, 11: second_port})
        assert created_with(first, "grown-past-a-death", [(0, (11,))]).error_code == KafkaError.none
        os.kill(second.pid, signal.SIGKILL)
        lapsed_in_describe_cluster(first_port, 11, second_port)

        refused = created_with(first, "made-on-a-lapsed-node", [(0, (7,)), (1, (11,))])
        assert refused.error_code == KafkaError.invalid_replica_assignment, refused
        assert "for partition 1 are fenced or in controlled shutdown" in refused.error_message
        beside = created_with(first, "made-beside-a-lapsed-node", [(0, (11, 7))])
        assert beside.error_code == KafkaError.none, beside
        for validate_only in (True, False):
            refused = grown_with(first, "grown-past-a-death", 3, [(7,), (11,)], validate_only)
            assert refused.error_code == KafkaError.invalid_replica_assignment, refused
            assert "for partition 2 are fenced or in controlled shutdown" in refused.error_message
        assert len(topic_metadata(first, "grown-past-a-death", allow_auto_topic_creation=False).partitions) == 1
        (reassigned,) = reassign(first, ("grown-past-a-death", 0, (11,))).responses
        assert [p.error_code for p in reassigned.partitions] == [KafkaError.none]
        # All of it answered within the lapse: node 11 is still a fenced broker.
        assert (11, second_port, True) in described(first_port, 2, include_fenced=True)

        brokers_become(first_port, {7: first_port})  # the lapse ended: no such broker now
        refused = created_with(first, "made-on-a-gone-node", [(0, (11,))])
        assert refused.error_code == KafkaError.invalid_replica_assignment, refused
        assert "includes broker 11, but no such broker is registered" in refused.error_message
        (reassigned,) = reassign(first, ("grown-past-a-death", 0, (11,))).responses
        assert [p.error_code for p in reassigned.partitions] == [KafkaError.invalid_replica_assignment]


def test_a_hung_node_leaves_the_brokers_and_is_back_the_moment_it_resumes(server_process, database_url):
    """Regression: a node that hangs rather than dies (SIGSTOP here; a frozen machine, a blocked
    event loop) kept its socket to PostgreSQL and with it its presence, so the others listed it for
    good and clients picking it waited out their own timeouts. Its heartbeats stop now: the other
    node lists it while its last one is recent (a node late by a few seconds does not flap), then
    for the lapse as any node gone, then no more; resumed, its next heartbeat lists it again at
    once, and it answers itself among the brokers meanwhile."""
    with held_port() as first_port_holder, held_port() as second_port_holder:
        first_port, second_port = first_port_holder.getsockname()[1], second_port_holder.getsockname()[1]
        both = {7: first_port, 11: second_port}
        node_process(server_process, database_url, 7, first_port)
        second = node_process(server_process, database_url, 11, second_port)
        brokers_become(first_port, both)
        os.kill(second.pid, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            while (found := brokers(first_port)) == both:
                assert time.monotonic() - stopped_at < WAIT_S, f"node 11 hung for {WAIT_S} s and is still listed"
                time.sleep(0.2)
            listed_for_s = time.monotonic() - stopped_at
            assert found == {7: first_port}
            # Its last heartbeat was at most one interval before it stopped.
            assert listed_for_s >= SESSION_TIMEOUT_S - HEARTBEAT_INTERVAL_S, f"left the list after {listed_for_s:.1f} s"
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{first_port}"})
            assert sorted(admin.list_topics(timeout=WAIT_S).brokers) == [7]
        finally:
            if process_alive(second.pid):
                os.kill(second.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        while brokers(first_port) != both:
            # The heartbeat due while it was stopped runs as soon as it resumes: seconds would be
            # a heartbeat interval or a session, not "at once" (3 s leave room for a busy machine).
            assert time.monotonic() - resumed_at < 3, "node 11 resumed and is not listed again"
        assert brokers(second_port) == both
        assert sorted(admin.list_topics(timeout=WAIT_S).brokers) == [7, 11]


def test_a_presence_is_live_while_its_session_shows_life(database_url):
    """The listing's rule (storage/node_presence.py), on PostgreSQL's own clock: an announced
    session is live while its last statement ended within the session timeout, and while a
    statement runs on it; a session whose times PostgreSQL hides from the role listing (another
    role's, to a role without pg_read_all_stats) is live as long as it is there, its node judged
    by its session alone."""
    timeout_s = 1.0
    node = LiveNode(7, "127.0.0.1", 9092)
    roles = [f"txb_node_{uuid.uuid4().hex[:8]}", f"txb_lister_{uuid.uuid4().hex[:8]}"]

    async def run() -> None:
        reader = await database.connect(database_url)
        announced = await database.connect(database_url)
        try:
            assert await node_presence.announce(announced, node)
            assert await node_presence.live_nodes(reader, timeout_s) == [node]
            await asyncio.sleep(timeout_s + 0.2)
            assert await node_presence.live_nodes(reader, timeout_s) == []
            await node_presence.beat(announced)
            assert await node_presence.live_nodes(reader, timeout_s) == [node]
            running = asyncio.create_task(announced.execute(f"SELECT pg_sleep({timeout_s * 3})"))
            await asyncio.sleep(timeout_s * 2)
            assert await node_presence.live_nodes(reader, timeout_s) == [node]
            await running
            for role in roles:
                await reader.execute(f"CREATE ROLE {role} LOGIN")
            # The listing reads the nodes' listeners (migration 0019), as a node's role reads every table.
            await reader.execute(f"GRANT SELECT ON kafka_node_listeners TO {roles[1]}")
            other_node = await asyncpg.connect(database_url, user=roles[0])
            lister = await asyncpg.connect(database_url, user=roles[1])
            try:
                assert await node_presence.announce(other_node, LiveNode(8, "127.0.0.1", 9093))
                await asyncio.sleep(timeout_s + 0.2)
                # Both silent for longer than the timeout: the superuser sees it, the other role not.
                assert await node_presence.live_nodes(reader, timeout_s) == []
                assert await node_presence.live_nodes(lister, timeout_s) == [node, LiveNode(8, "127.0.0.1", 9093)]
            finally:
                await other_node.close()
                await lister.close()
        finally:
            await announced.close()
            for role in roles:
                if await reader.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
                    await reader.execute(f"DROP OWNED BY {role}")  # its grant
                await reader.execute(f"DROP ROLE IF EXISTS {role}")
            await reader.close()

    asyncio.run(run())


def leaders(port: int, topic: str) -> dict[int, int]:
    """Metadata's leader of each partition of the topic, by partition, as node `port` answers it;
    each partition's replicas and ISR, the leader alone."""
    answer = topic_metadata(f"127.0.0.1:{port}", topic, allow_auto_topic_creation=False)
    assert answer.error_code == KafkaError.none, answer
    for partition in answer.partitions:
        leader = partition.leader_id
        assert (partition.replica_nodes, partition.isr_nodes) == ((leader,), (leader,)), partition
    return {partition.partition_index: partition.leader_id for partition in answer.partitions}


def agreed_leaders(ports: list[int], topic: str) -> dict[int, int]:
    """The leaders every node answers for the topic, asserted the same on each."""
    answers = {port: leaders(port, topic) for port in ports}
    assert len({tuple(sorted(a.items())) for a in answers.values()}) == 1, answers
    return answers[ports[0]]


def coordinators(port: int, keys: list[str]) -> dict[str, int]:
    """FindCoordinator's (v4) node for each group id, as node `port` answers it."""
    with RawConnection(f"127.0.0.1:{port}") as connection:
        answer = connection.call(request_of(api_table.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=tuple(keys)))
    assert all(c.error_code == KafkaError.none for c in answer.coordinators), answer
    return {c.key: c.node_id for c in answer.coordinators}


def leaders_become(ports: list[int], topic: str, leading: set[int]) -> dict[int, int]:
    """Waits until every node answers the same leaders for the topic, led by exactly the nodes
    `leading` (a node's presence is seen to end, or begin, a moment after its process does)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        answers = {port: leaders(port, topic) for port in ports}
        agreed = len({tuple(sorted(a.items())) for a in answers.values()}) == 1
        if agreed and set(answers[ports[0]].values()) == leading:
            return answers[ports[0]]
        assert time.monotonic() < deadline, f"leaders {answers}, expected the same on each, led by nodes {leading}"
        time.sleep(0.1)


def test_every_node_names_the_same_live_leader_of_a_partition(server_process, database_url):
    """Regression: each node answered itself as the leader of every partition and the coordinator
    of every group, so a client whose metadata came from two nodes saw a partition's leader change
    from answer to answer (KafkaJS, which runs one fetcher per leader, then had two fetchers fetch
    one partition and throw away each other's batches), and two FindCoordinator calls of one client
    named two coordinators. As Kafka's brokers, every node names the same leader and coordinator,
    a live node, a topic's partitions dealt evenly over the nodes; a node that dies is listed a
    while as a broker but leads and coordinates nothing, its partitions and groups now the
    survivors'; restarted, it leads what it led."""
    lapse_ms = 8000  # long enough to see the dead node listed while it leads nothing
    node_ids = [7, 11, 13]
    holders = [held_port() for _ in node_ids]
    with contextlib.ExitStack() as holding:
        ports = [holding.enter_context(holder).getsockname()[1] for holder in holders]
        every = dict(zip(node_ids, ports))
        nodes = [node_process(server_process, database_url, n, port, lapse_ms) for n, port in every.items()]
        for port in ports:
            brokers_become(port, every)
        partitions = 12
        created = created_with(f"127.0.0.1:{ports[0]}", "led-alike", [(p, (7,)) for p in range(partitions)])
        assert created.error_code == KafkaError.none, created
        before = agreed_leaders(ports, "led-alike")
        assert sorted(before) == list(range(partitions))
        assert Counter(before.values()) == dict.fromkeys(node_ids, 4), before  # dealt evenly
        groups = [f"group-{n}" for n in range(12)]
        coordinated = coordinators(ports[0], groups)
        assert all(coordinators(port, groups) == coordinated for port in ports[1:])
        assert set(coordinated.values()) == set(node_ids), coordinated

        dying, survivors = nodes[2], ports[:2]
        dying.kill()  # SIGKILL: its presence session ends with its socket
        after = leaders_become(survivors, "led-alike", {7, 11})
        assert all(brokers(port) == every for port in survivors)  # listed (lapsed), leading nothing
        assert Counter(after.values()) == {7: 6, 11: 6}, after
        for port in survivors:  # the dead node's groups move to the survivors
            assert set(coordinators(port, groups).values()) == {7, 11}
        assert coordinators(ports[0], groups) == coordinators(ports[1], groups)

        node_process(server_process, database_url, 13, ports[2], lapse_ms)  # restarted with its id
        for port in ports:
            brokers_become(port, every)
        assert leaders_become(ports, "led-alike", set(node_ids)) == before


@contextlib.contextmanager
def nodes_listing_each_other(server_process, database_url: str, node_ids: list[int]):
    """(ports, processes) of nodes started with these ids, once each lists them all as brokers."""
    holders = [held_port() for _ in node_ids]
    with contextlib.ExitStack() as holding:
        ports = [holding.enter_context(holder).getsockname()[1] for holder in holders]
        nodes = [node_process(server_process, database_url, n, port) for n, port in zip(node_ids, ports)]
        for port in ports:
            brokers_become(port, dict(zip(node_ids, ports)))
        yield ports, nodes


def hosted_partitions(port: int, topic: str) -> set[int]:
    """The partitions of the topic DescribeLogDirs (v4, every partition asked) says node `port` hosts."""
    with RawConnection(f"127.0.0.1:{port}") as connection:
        response = connection.call(request_of(api_table.DESCRIBE_LOG_DIRS, 4, topics=None))
    (result,) = response.results
    return {p.partition_index for t in result.topics if t.name == topic for p in t.partitions}


def test_describe_log_dirs_names_the_replicas_metadata_puts_on_the_node(server_process, database_url):
    """Regression: with every node naming the same leader of a partition, its one replica and ISR,
    each node's DescribeLogDirs still answered every partition as in its log dir, so a tool adding
    up the brokers' answers (Kafka UI's and AKHQ's topic sizes, kafka-log-dirs) counted each
    partition once per node, and found replicas where Metadata names none. As Kafka's brokers, a
    node describes the partitions whose replica Metadata puts on it: each partition on one node,
    its leader, and on the survivor once the other node is gone."""
    node_ids = [7, 11]
    with nodes_listing_each_other(server_process, database_url, node_ids) as (ports, nodes):
        every = dict(zip(node_ids, ports))
        partitions = 8
        created = created_with(f"127.0.0.1:{ports[0]}", "hosted", [(p, (7,)) for p in range(partitions)])
        assert created.error_code == KafkaError.none, created
        led = leaders_become(ports, "hosted", set(node_ids))
        for node_id, port in every.items():
            assert hosted_partitions(port, "hosted") == {p for p, leader in led.items() if leader == node_id}, node_id

        nodes[1].kill()
        leaders_become(ports[:1], "hosted", {7})
        assert hosted_partitions(ports[0], "hosted") == set(range(partitions))


def coordinators_of(port: int, key_type: int, keys: list[str]) -> dict[str, int]:
    """FindCoordinator's (v4) node for each key of `key_type` (0 a group, 1 a transactional id)."""
    with RawConnection(f"127.0.0.1:{port}") as connection:
        answer = connection.call(
            request_of(api_table.FIND_COORDINATOR, 4, key_type=key_type, coordinator_keys=tuple(keys))
        )
    assert all(c.error_code == KafkaError.none for c in answer.coordinators), answer
    return {c.key: c.node_id for c in answer.coordinators}


def listed_groups_and_transactions(port: int) -> tuple[list[str], list[str]]:
    """The group ids ListGroups (v4) and the transactional ids ListTransactions (v0) of node `port` list."""
    with RawConnection(f"127.0.0.1:{port}") as connection:
        groups = connection.call(request_of(api_table.LIST_GROUPS, 4, states_filter=()))
        transactions = connection.call(
            request_of(api_table.LIST_TRANSACTIONS, 0, state_filters=(), producer_id_filters=())
        )
    return (
        [g.group_id for g in groups.groups],
        [t.transactional_id for t in transactions.transaction_states],
    )


def test_each_group_and_transactional_id_is_listed_by_the_node_that_coordinates_it(server_process, database_url):
    """Regression: with every node naming the same coordinator of a group or a transactional id,
    every node still listed every group (ListGroups) and every transactional id (ListTransactions),
    as when each coordinated all of them. Kafka's admin clients ask every broker and add up the
    answers (KafkaJS's listGroups concatenates them, Kafka's listTransactions().all() too), so each
    group and transaction came back once per node. As Kafka's brokers, a node lists the groups and
    ids FindCoordinator names it for: each once over the nodes; once the other node is gone, the
    survivor lists them all."""
    node_ids = [7, 11]
    with nodes_listing_each_other(server_process, database_url, node_ids) as (ports, nodes):
        every = dict(zip(node_ids, ports))
        created = created_with(f"127.0.0.1:{ports[0]}", "listed", [(0, (7,))])
        assert created.error_code == KafkaError.none, created
        groups = [f"listed-group-{n}" for n in range(12)]
        transactional_ids = [f"listed-txn-{n}" for n in range(12)]
        with httpx.Client(base_url=nodes[0].url, timeout=WAIT_S) as client:
            for group in groups:
                committed = client.post(
                    f"/v1/groups/{group}/offsets/commit",
                    json={"offsets": [{"topic": "listed", "partition": 0, "offset": 1}]},
                )
                assert committed.status_code == 200, committed.text
            for transactional_id in transactional_ids:
                initialized = client.post("/v1/producers/init", json={"transactional_id": transactional_id})
                assert initialized.status_code == 200, initialized.text

        group_coordinators = coordinators_of(ports[0], 0, groups)
        transaction_coordinators = coordinators_of(ports[0], 1, transactional_ids)
        assert set(group_coordinators.values()) == set(transaction_coordinators.values()) == set(node_ids)
        for node_id, port in every.items():
            assert coordinators_of(port, 0, groups) == group_coordinators
            listed_groups, listed_ids = listed_groups_and_transactions(port)
            assert sorted(g for g in listed_groups if g in groups) == sorted(
                g for g, coordinator in group_coordinators.items() if coordinator == node_id
            ), node_id
            assert sorted(t for t in listed_ids if t in transactional_ids) == sorted(
                t for t, coordinator in transaction_coordinators.items() if coordinator == node_id
            ), node_id

        nodes[1].kill()
        deadline = time.monotonic() + WAIT_S
        while set(coordinators_of(ports[0], 0, groups).values()) != {7}:
            assert time.monotonic() < deadline, "the survivor to coordinate every group"
            time.sleep(0.1)
        listed_groups, listed_ids = listed_groups_and_transactions(ports[0])
        assert set(groups) <= set(listed_groups) and set(transactional_ids) <= set(listed_ids)
