"""The node's listening socket (app/worker_processes.py): the workers of `serve --workers N` after the
first bind theirs beside it with port reuse, yet a second node on the same port still fails to
start, as it did before port reuse."""

from __future__ import annotations

import errno
import os
import socket

import pytest

from app.worker_processes import bind_listening_socket, worker_listening_socket


def test_a_worker_binds_its_own_socket_beside_the_nodes():
    with bind_listening_socket("127.0.0.1", 0) as node:
        own_fd = worker_listening_socket(node.fileno())
        assert own_fd != node.fileno()
        with socket.socket(fileno=own_fd) as own:
            assert own.getsockname() == node.getsockname()
            assert own.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_a_socket_given_without_port_reuse_is_shared():
    with socket.create_server(("127.0.0.1", 0)) as given:
        assert worker_listening_socket(given.fileno()) == given.fileno()


def test_a_second_node_on_the_same_port_fails_with_address_in_use():
    with bind_listening_socket("127.0.0.1", 0) as node:
        worker_fd = worker_listening_socket(node.fileno())
        try:
            with pytest.raises(OSError) as refused:
                bind_listening_socket("127.0.0.1", node.getsockname()[1])
            assert refused.value.errno == errno.EADDRINUSE
        finally:
            os.close(worker_fd)
