"""The sockets a node accepts connections on, for every port it listens on (HTTP, and the Kafka
listener): bound so that a node restarted at once after a crash binds its ports at the first try,
whatever connections the dead node left on them, and so that a node started on a port a live node
serves is refused (PortInUse).

Linux lets a socket bind an address that another socket (bound, listening, connected, or TIME_WAIT:
accepted sockets, and what they leave, carry their listening socket's options) already has if both
allow address reuse (SO_REUSEADDR) and the other does not listen, or if both allow port reuse
(SO_REUSEPORT) and belong to the same user (any user, if the other is in TIME_WAIT). Every socket
that accepts on a node's port allows both (accepting_socket): port reuse, so the workers of
`serve --workers N` bind beside each other and the kernel spreads connections over them; address
reuse, so that what they leave behind never blocks the next start's claim (claim_port).
"""

from __future__ import annotations

import errno
import os
import socket

LISTEN_BACKLOG = 2048


class PortInUse(Exception):
    """The port is served by a live process: a node never shares a port with another one."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(
            f"port {port} on {host} is already served by a live process (another txbroker node, or another "
            f"server listening on it), and a node never shares its port"
        )
        self.host = host
        self.port = port


def accepting_socket(family: int, ipv6_only: bool = True) -> socket.socket:
    """An unbound socket with the options of every socket that accepts connections on a node's port,
    the node's own and each worker's: port reuse, so the workers bind beside the node; address reuse,
    which the connections it accepts inherit, and so do the sockets they leave behind when the node
    dies (orphaned, then TIME_WAIT for 60 s): the claim of the node's next start passes only those
    (bind_listening_socket); TCP_NODELAY, inherited by accepted sockets too (see cli._disable_nagle)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:  # as socket.create_server: "::" means IPv6 only, not IPv4 too
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(ipv6_only))
    except BaseException:
        sock.close()
        raise
    return sock


def claim_port(host: str, port: int) -> int:
    """Raises PortInUse if a live process listens on (host, port); returns the port (the kernel's
    choice for port 0). Port reuse alone would let a second txbroker started on a port by mistake
    bind beside a live node and silently take a share of its connections, so a socket without it
    claims the port first: with address reuse only, it conflicts with every listening socket, a live
    node's, and with nothing a dead node left, because every socket that accepted on the port allowed
    address reuse (accepting_socket). Two nodes started at the same instant could both pass their
    claims before either listens: the claim guards against a mistake, one start at a time, not
    against a race."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as claim:
        claim.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            claim.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUse(host, port) from error
            raise
        return claim.getsockname()[1]


def bound_accepting_socket(host: str, port: int) -> socket.socket:
    """An accepting_socket bound to (host, port), not listening yet."""
    sock = accepting_socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """A node's listening socket on (host, port): worker 0 accepts on it, and the other workers bind
    theirs beside it (worker_listening_socket). Raises PortInUse if a live process serves the port
    (claim_port); succeeds at once after a crash, however many connections the dead node left. (The
    claim used to fail for 60 s after a crash with several workers: the workers' sockets lacked
    address reuse, and the TIME_WAIT connections they had accepted blocked it.)"""
    sock = bound_accepting_socket(host, claim_port(host, port))
    try:
        sock.listen(LISTEN_BACKLOG)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def worker_listening_socket(node_fd: int) -> int:
    """The fd a worker other than worker 0 accepts on: a socket of its own, bound to the node's
    address beside the node's socket, if that one allows port reuse; else the node's socket
    itself. The socket of its own is not listening yet: uvicorn listens once the worker is ready,
    and only then does the kernel send it connections."""
    with socket.socket(fileno=os.dup(node_fd)) as node:
        if node.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0:
            return node_fd
        ipv6_only = node.family == socket.AF_INET6 and node.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
        own = accepting_socket(node.family, bool(ipv6_only))
        try:
            own.bind(node.getsockname())
        except BaseException:
            own.close()
            raise
    return own.detach()
