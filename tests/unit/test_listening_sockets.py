"""A node's listening sockets (app/runtime/worker_processes.py): the workers of `serve --workers N` after the
first bind theirs beside the node's with port reuse; a second node on the same port still fails to
start, as it did before port reuse; and a node restarted after a crash binds its port at once,
whatever connections the dead node left, whichever worker had accepted them."""

from __future__ import annotations

import os
import socket
import time

import pytest

from app.runtime.listening_sockets import PortInUse, bind_listening_socket, worker_listening_socket
from tests.crash.test_worker_processes import sockets_in_state

# /proc/net/tcp: FIN_WAIT2 (what a TIME_WAIT socket shows while the peer has not closed), TIME_WAIT.
LEFT_AFTER_A_CRASH = ("05", "06")


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


HOSTS = ["127.0.0.1", pytest.param("::1", marks=pytest.mark.skipif(not _has_ipv6_loopback(), reason="no ::1"))]


def test_a_worker_binds_its_own_socket_beside_the_nodes():
    with bind_listening_socket("127.0.0.1", 0) as node:
        own_fd = worker_listening_socket(node.fileno())
        assert own_fd != node.fileno()
        with socket.socket(fileno=own_fd) as own:
            assert own.getsockname() == node.getsockname()
            for accepting in (node, own):  # inherited by what they accept, and what that leaves
                assert accepting.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
                assert accepting.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1


def test_a_socket_given_without_port_reuse_is_shared():
    with socket.create_server(("127.0.0.1", 0)) as given:
        assert worker_listening_socket(given.fileno()) == given.fileno()


@pytest.mark.parametrize("host", HOSTS)
def test_a_second_node_on_the_same_port_is_refused_with_port_in_use(host):
    """Any (host, port) a node listens on: the rules are the same for every listener."""
    with bind_listening_socket(host, 0) as node:
        port = node.getsockname()[1]
        worker_fd = worker_listening_socket(node.fileno())
        try:
            with pytest.raises(PortInUse) as refused:
                bind_listening_socket(host, port)
            assert (refused.value.host, refused.value.port) == (host, port)
            assert f"port {port} on {host} is already served by a live process" in str(refused.value)
        finally:
            os.close(worker_fd)


@pytest.mark.parametrize("peer_closed", [True, False], ids=["time-wait", "fin-wait-2"])
@pytest.mark.parametrize("host", HOSTS)
def test_the_port_binds_at_once_over_the_connections_a_dead_workers_socket_left(host, peer_closed):
    """A worker other than worker 0 accepted a connection, then died (its sockets closed by the
    kernel, first): the connection stays on the port for 60 s. The node's next start must bind the
    port at once: it used to fail with EADDRINUSE, the worker's socket lacking SO_REUSEADDR."""
    node = bind_listening_socket(host, 0)
    port = node.getsockname()[1]
    worker = socket.socket(fileno=worker_listening_socket(node.fileno()))
    node.close()  # so the connection is the worker's: the node's dies too, as in a crash
    worker.listen()
    client = socket.create_connection((host, port))
    accepted, _ = worker.accept()
    try:
        client.sendall(b"request")
        assert accepted.recv(7) == b"request"
        worker.close()
        accepted.close()  # the crash: the server's side closes first
        assert client.recv(1) == b""  # its FIN reached the client
        if peer_closed:
            client.close()
        deadline = time.monotonic() + 10  # a bound, not a timing assertion
        while host == "127.0.0.1" and not any(sockets_in_state(port, state) for state in LEFT_AFTER_A_CRASH):
            assert time.monotonic() < deadline, "the dead connection should still hold the port"
            time.sleep(0.01)
        with bind_listening_socket(host, port) as restarted:
            assert restarted.getsockname()[1] == port
    finally:
        client.close()
        accepted.close()
        worker.close()
