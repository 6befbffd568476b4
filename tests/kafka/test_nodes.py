"""Several `txbroker serve` nodes on one PostgreSQL appear in Metadata as brokers, each with the id
it was started with (TXBROKER_NODE_ID), listed while alive: a node stopped (or killed) is still
listed by a node that listed it, kafka_lapsed_node_listed_ms after that node finds it gone, then
leaves the list; restarted with its id it is listed again; each answers as the coordinator and the
leader. DescribeCluster answers the same brokers."""

from __future__ import annotations

import socket
import time

from confluent_kafka.admin import AdminClient

from app.kafka import api_table
from app.runtime.listening_sockets import bound_accepting_socket
from tests.kafka.clients import WAIT_S
from tests.kafka.raw import RawConnection, request_of

# How long the first node lists the second once it finds it gone (kafka_lapsed_node_listed_ms):
# short, for the test to see it leave soon; what is asserted holds for any length.
LAPSED_NODE_LISTED_MS = 1000


def held_port() -> socket.socket:
    """A port held as `serve` holds its Kafka port (app/runtime/listening_sockets.py): bound with address and
    port reuse and never listening (the kernel hands it no connection), so the node's claim passes it,
    the node binds its Kafka listener beside it, and the port stays ours across the node's restarts."""
    return bound_accepting_socket("127.0.0.1", 0)


def brokers(port: int) -> dict[int, int]:
    with RawConnection(f"127.0.0.1:{port}") as connection:
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
    return {b.node_id: b.port for b in response.brokers}


def brokers_become(port: int, expected: dict[int, int]) -> None:
    deadline = time.monotonic() + WAIT_S
    while (found := brokers(port)) != expected:
        assert time.monotonic() < deadline, f"brokers {found}, expected {expected}"


def test_nodes_on_one_database_are_brokers_while_alive(server_process, database_url):
    with held_port() as first_port_holder, held_port() as second_port_holder:
        first_port, second_port = first_port_holder.getsockname()[1], second_port_holder.getsockname()[1]

        def node(node_id: int, port: int):
            env = {
                "TXBROKER_KAFKA_LISTENER": f"127.0.0.1:{port}",
                "TXBROKER_NODE_ID": str(node_id),
                "TXBROKER_KAFKA_LAPSED_NODE_LISTED_MS": str(LAPSED_NODE_LISTED_MS),
            }
            return server_process("--database-url", database_url, env=env)

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
