"""The asyncpg connection pool every storage module works through, and how it reaches PostgreSQL.

A database URL may name several hosts, libpq's form for a primary and its standbys
(`postgresql://h1:5432,h2:5432/db?target_session_attrs=read-write`). txbroker writes on every
request, so it always looks for the read-write server among them (`target_session_attrs` defaults
to read-write here, not libpq's "any"), each host tried with a connect timeout of its own so that
a silent host (a machine down, its packets dropped) cannot stall the search. After a failover the
connections to the old primary break, the requests on them answer 503 (retriable), and the next
connection finds the new primary: no restart, no configuration change.

A connection that stops answering (a host gone silent, a network partition) is detected by TCP
keepalives while idle and by TCP_USER_TIMEOUT while a statement waits, so a request fails with a
connection error instead of hanging, and a LISTEN connection notices that it must reconnect.

A COMMIT whose wait for the synchronous standby is cancelled (pg_cancel_backend, asyncpg cancelling
the query of a cancelled task; not statement_timeout, which PostgreSQL switches off before a commit)
returns success, with only a WARNING: the transaction is committed on the primary, and maybe not on
the standby that a failover promotes. Every pooled connection notes that WARNING while it is
acquired (a log listener, added and removed with each acquisition: no round trip; its cost is in
docs/performance.md), and the block that acquired it, when it ends, raises CommitNotReplicated
instead of returning: whatever the block committed is not acknowledged, as after a connection lost
during its COMMIT (docs/operations-high-availability.md). Connections made outside the pool
(`connect`: migrations, the node's announcement, LISTEN; the health probe's, ReachabilityProbe) are
not watched: they acknowledge nothing to a client.

The client's retry finds the work done on the primary (an idempotent producer's duplicate, an
EndTxn's outcome) and answers "done" from what it read, writing nothing new; the answer must still
wait for the standby to have that work. It does, because PostgreSQL makes a COMMIT wait for the
standby whenever its transaction has an id and wrote WAL, and locking a row (SELECT ... FOR UPDATE,
FOR KEY SHARE) gives it both: the retry's COMMIT then returns once the standby has everything up to
it, the earlier commit included. Every write path locks a row or writes before it answers "done"
(the write batches lock their partitions and transactional ids; the groups', the topics' and the
offsets' paths lock their rows); one that may answer "done" having neither locked nor written makes
its COMMIT wait explicitly (replication_barrier.commit_waits_for_the_standby: the retry of an
idempotent producer's epoch bump, a DeleteAcls that finds nothing left). So does a refusal that a
client takes for "done", which would otherwise roll back (a rollback waits for no standby): an
operator's abort that finds nothing open. tests/crash/test_failover.py pins them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg
import asyncpg.pool
import orjson

log = logging.getLogger(__name__)


class CommitNotReplicated(Exception):
    """A block of work on a pooled connection committed on the primary, but PostgreSQL cancelled a
    COMMIT's wait for the synchronous standby (see the module docstring): what it wrote may be lost
    by a failover, so it is not acknowledged. Retriable, as a lost connection: the retry finds what
    was written (an idempotent producer's duplicate, an EndTxn's outcome), and is answered once the
    standby has it (the module docstring)."""


# Raised by asyncpg when PostgreSQL cannot be reached, drops the connection, shuts down, is not
# the primary (yet), or a connection is on a server that has become read-only; the API layer maps
# these to COORDINATOR_NOT_AVAILABLE (503, retriable): the same request succeeds once the
# database (or its new primary) answers. OSError includes TimeoutError (connect timeouts).
CONNECTION_ERRORS = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,  # SQLSTATE class 08
    asyncpg.exceptions.CannotConnectNowError,  # 57P03: starting up, shutting down, in recovery
    asyncpg.exceptions.AdminShutdownError,  # 57P01
    asyncpg.exceptions.CrashShutdownError,  # 57P02
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # 25006: a standby, or a demoted primary
    asyncpg.exceptions.TargetServerAttributeNotMatched,  # no host is the primary (during a failover)
    asyncpg.exceptions.InterfaceError,
    # asyncpg's protocol state left inconsistent by a session the server terminated mid-operation
    # ("cannot switch to state 15; another operation (2) is in progress", MagicStack/asyncpg#784,
    # seen when the primary dies): the connection is unusable, and closes once its socket does.
    asyncpg.exceptions.InternalClientError,
    CommitNotReplicated,
)

# What PostgreSQL answers a statement of a PostgreSQL transaction it rolled back to break a lock
# cycle (40P01) or a serialization failure (40001): nothing of the transaction was written, so a
# request not yet answered may run it again.
ROLLED_BACK_BY_POSTGRESQL = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)

# PostgreSQL's syncrep.c reports a cancelled wait for the standby as a WARNING whose text may be
# translated (lc_messages) and whose SQLSTATE is the generic 01000; the source file it names is
# neither. Other WARNINGs (a database nearing transaction id wraparound warns at every transaction
# id assigned) say nothing about replication.
_SYNCHRONOUS_REPLICATION_SOURCE = "syncrep.c"
_SYNCHRONOUS_REPLICATION_TEXT = "synchronous replication"


def is_cancelled_replication_wait(message: asyncpg.PostgresLogMessage) -> bool:
    """Whether a message PostgreSQL sent a session is a cancelled wait for the synchronous standby:
    the transaction it ended committed on the primary alone."""
    if (getattr(message, "severity_en", None) or message.severity) != "WARNING":
        return False
    return getattr(message, "server_source_filename", None) == _SYNCHRONOUS_REPLICATION_SOURCE or (
        _SYNCHRONOUS_REPLICATION_TEXT in (message.message or "")
    )


# How long one host gets to accept a connection (TCP handshake, TLS, authentication): a refused
# host fails at once; a silent one would otherwise hold the attempt for the kernel's SYN retries.
CONNECT_TIMEOUT_S = 10.0
# An idle connection whose host stopped answering is declared dead after about
# KEEPALIVE_IDLE_S + KEEPALIVE_COUNT * KEEPALIVE_INTERVAL_S (the LISTEN connection is idle most
# of the time); one with unacknowledged data (a statement sent) after TCP_USER_TIMEOUT_MS.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_MS = 30_000

READ_WRITE = "read-write"


def _keep_alive(sock) -> None:
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a unix socket: the server is on this machine, and its death closes the socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)


class KeptAliveConnection(asyncpg.Connection):
    """An asyncpg connection whose TCP socket has keepalives and a user timeout (see the module
    docstring); asyncpg itself only sets TCP_NODELAY."""

    def __init__(self, protocol, transport, *args, **kwargs) -> None:
        super().__init__(protocol, transport, *args, **kwargs)
        _keep_alive(transport.get_extra_info("socket"))
        self._cancelled_replication_wait: asyncpg.PostgresLogMessage | None = None

    def watch_replication_waits(self) -> KeptAliveConnection:
        """Notes a cancelled wait for the synchronous standby from now on, until
        `stop_watching_replication_waits`; returns the connection (not a pool's proxy of it, which
        loses it if the connection closes)."""
        self._cancelled_replication_wait = None
        self.add_log_listener(self._note_replication_wait)
        return self

    def take_cancelled_replication_wait(self) -> asyncpg.PostgresLogMessage | None:
        """The WARNING of a COMMIT whose wait for the synchronous standby was cancelled since the last
        call (or since `watch_replication_waits`), if any; forgotten once taken. asyncpg calls a log
        listener on the event loop's next turn, before the awaiting task resumes (both are scheduled
        as the server's messages are read, the WARNING first), so a COMMIT that returned has been noted."""
        cancelled, self._cancelled_replication_wait = self._cancelled_replication_wait, None
        return cancelled

    def stop_watching_replication_waits(self) -> asyncpg.PostgresLogMessage | None:
        """`take_cancelled_replication_wait`, and no more watching (a pool warns of a connection
        released with a log listener)."""
        self.remove_log_listener(self._note_replication_wait)
        return self.take_cancelled_replication_wait()

    def _note_replication_wait(self, _connection, message: asyncpg.PostgresLogMessage) -> None:
        if is_cancelled_replication_wait(message):
            self._cancelled_replication_wait = message


class _AcquiredWatchingCommits(asyncpg.pool.PoolAcquireContext):
    """`async with pool.acquire() as conn:` whose end raises CommitNotReplicated when a COMMIT of
    the block returned without the synchronous standby's confirmation (the module docstring): the
    block's answer is then not given. A block ended by an exception raises it chained to the
    block's own; a cancelled block stays cancelled (nobody is answered)."""

    __slots__ = ("_watched",)

    async def __aenter__(self) -> asyncpg.Connection:
        # Counted around the wait for a connection (/metrics' waiting requests): two integer updates,
        # all the hot path (produce and fetch acquire at high rates) pays for it; the gauges are
        # copied to the metrics at scrapes and once a second, never per acquire.
        pool: _Pool = self.pool
        pool.requests_waiting += 1
        try:
            proxy = await super().__aenter__()
        finally:
            pool.requests_waiting -= 1
        try:
            self._watched: KeptAliveConnection = proxy.watch_replication_waits()
        except BaseException as error:  # closed since it was acquired: back to the pool, which replaces it
            await super().__aexit__(type(error), error, error.__traceback__)
            raise
        return proxy

    async def __aexit__(self, exc_type=None, exc_val=None, exc_tb=None) -> None:
        # Also when the block's connection was lost (a terminated session warns before it closes).
        cancelled = self._watched.stop_watching_replication_waits()
        await super().__aexit__(exc_type, exc_val, exc_tb)
        if cancelled is not None and (exc_val is None or isinstance(exc_val, Exception)):
            raise CommitNotReplicated(
                f"PostgreSQL committed this work on the primary but cancelled its wait for the synchronous "
                f"standby ({cancelled.message}): a failover could lose it, so it is not acknowledged; retry it "
                f"(the retry finds what was written); cancelling txbroker's sessions while the standby is away "
                f"causes this"
            ) from exc_val


class _Pool(asyncpg.Pool):
    """asyncpg's pool whose `acquire` watches the block's commits (_AcquiredWatchingCommits) and
    counts the requests waiting for a connection (requests_waiting), which asyncpg does not say."""

    __slots__ = ("requests_waiting",)

    def __init__(self, *args, **kwargs) -> None:
        self.requests_waiting = 0
        super().__init__(*args, **kwargs)

    def acquire(self, *, timeout: float | None = None) -> _AcquiredWatchingCommits:
        return _AcquiredWatchingCommits(self, timeout)


@dataclass(frozen=True)
class PoolUsage:
    """How busy a request pool is, now: its connections in use and idle, the most it may open, and
    the requests waiting for one (to be handed one, or for one to be opened)."""

    in_use: int
    idle: int
    max_size: int
    waiting: int


def pool_usage(pool: asyncpg.Pool) -> PoolUsage:
    """`pool`'s usage (a pool of create_pool's; another counts no waiting requests)."""
    idle = pool.get_idle_size()
    return PoolUsage(
        in_use=pool.get_size() - idle,
        idle=idle,
        max_size=pool.get_max_size(),
        waiting=getattr(pool, "requests_waiting", 0),
    )


def host_urls(database_url: str) -> list[str]:
    """The URL once per host of libpq's multi-host form (`postgresql://u@h1:1,h2:2/db?...`), in
    order; a URL with one host (or hosts given as query parameters) as it is."""
    parts = urlsplit(database_url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return [database_url]
    return [urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}")) for host in hosts.split(",")]


def _target_session_attrs(database_url: str) -> str:
    """The URL's target_session_attrs, else read-write (txbroker needs a server that takes writes)."""
    return parse_qs(urlsplit(database_url).query).get("target_session_attrs", [READ_WRITE])[0]


async def connect_to_primary(database_url: str, **options) -> asyncpg.Connection:
    """A plain asyncpg connection to the read-write server (see the module docstring): each host in
    turn, each with CONNECT_TIMEOUT_S (asyncpg's timeout bounds all hosts
    together, so one silent host would use all of it); the first that matches
    target_session_attrs wins, as in libpq."""
    attrs = _target_session_attrs(database_url)
    options.setdefault("connection_class", KeptAliveConnection)
    last_error: Exception | None = None
    for url in host_urls(database_url):
        try:
            return await asyncpg.connect(
                url,
                timeout=CONNECT_TIMEOUT_S,
                target_session_attrs=attrs,
                **options,
            )
        except (*CONNECTION_ERRORS, asyncio.TimeoutError) as error:
            last_error = error
    assert last_error is not None
    raise last_error


async def _init_connection(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        format="text",
        encoder=lambda value: orjson.dumps(value).decode(),
        decoder=orjson.loads,
    )


# How long a question to PostgreSQL about its health waits for the answer (/v1/health).
PROBE_TIMEOUT_S = 2.0
# After a new connection of the probe did not answer (refused, or to a read-only server), the next is
# not tried sooner than this: the questions meanwhile are answered "not reachable" at once, so that a
# flood of /v1/health during an outage cannot become a flood of connection attempts.
PROBE_RECONNECT_INTERVAL_S = 1.0
# The probe's connection in pg_stat_activity (one per server process).
PROBE_APPLICATION_NAME = "txbroker health probe"
# Whether the server answers as the read-write server txbroker needs: a standby (in recovery) or a
# server set read-only answers false, read at the moment of the question (the pool's connections
# learn it from the settings PostgreSQL reports, _is_read_only, after their next statement). The
# health probe asks it, and so does each heartbeat of a node's presence (node_presence.beat).
IS_READ_WRITE_SQL = "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'"


class ReachabilityProbe:
    """Whether PostgreSQL answers (for /v1/health), asked on a connection of the probe's own, never
    one of the pool's: under load every pooled connection can be busy for seconds (requests waiting
    on row locks, long transactions, a queue of writes), which says nothing of PostgreSQL, and a
    readiness check that waited for one would take the busiest nodes out of their load balancer, and
    their load onto the others.

    One connection per server process, opened at the first question and again once lost, as the
    pool's are (the read-write server among the URL's hosts, keepalives and TCP_USER_TIMEOUT). One
    question in flight at a time: the callers who ask meanwhile share its answer, so a flood of
    /v1/health (which needs no credentials) opens no connection and queues no query on PostgreSQL.
    A caller waits at most timeout_s, then hears "not reachable"; a question unanswered then is not
    cancelled (asyncpg cancels a query by opening another connection to send the cancel request): it
    ends when PostgreSQL answers or its connection is declared lost (CONNECT_TIMEOUT_S per host,
    keepalives, TCP_USER_TIMEOUT), and the callers who ask meanwhile share it, each for timeout_s.

    A connection kept from an earlier question may have been lost since (PostgreSQL restarted, or
    failed over to a standby that was promoted): such a question is asked once more on a fresh
    connection before the answer is "not reachable". A read-only server (a standby, a demoted
    primary, one set read-only) is not reachable either, as it is not for the pool, which closes its
    connections to one (_keep_session): the probe closes its connection too, so that the next
    question looks for the read-write server again. A new connection that does not answer is tried
    again PROBE_RECONNECT_INTERVAL_S later at the soonest."""

    def __init__(self, database_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self._database_url = database_url
        self._timeout_s = timeout_s
        self._connection: asyncpg.Connection | None = None
        self._question: asyncio.Task[bool] | None = None
        self._last_answer: bool | None = None
        self._last_reason = ""  # why the last answer was False
        self._next_connect_at = 0.0  # the loop's time
        self._closed = False
        self.questions_asked = 0  # queries sent to PostgreSQL (the tests count them)

    async def is_reachable(self) -> bool:
        """Whether PostgreSQL answered, as the read-write server, within the timeout: the question
        in flight if there is one, else a new one; False once the probe is closed."""
        if self._closed:
            return False
        if self._question is None:
            self._question = asyncio.create_task(self._ask(), name="database-probe")
        question = self._question
        try:
            return await asyncio.wait_for(asyncio.shield(question), self._timeout_s)
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            if question.cancelled():  # closed while it asked (the server stops), not this caller
                return False
            raise

    async def close(self) -> None:
        """Closes the probe's connection (the server stops); a question in flight ends with it."""
        self._closed = True
        connection, self._connection = self._connection, None
        question, self._question = self._question, None
        if question is not None:
            if connection is not None:
                connection.terminate()  # its query fails at once, with no cancel request sent
            question.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await question
        elif connection is not None:
            await connection.close(timeout=self._timeout_s)

    async def _ask(self) -> bool:
        try:
            kept = self._connection is not None and not self._connection.is_closed()
            answer, reason = await self._ask_once()
            if not answer and kept:
                # Lost since the last question, or the server kept has since been demoted.
                answer, reason = await self._ask_once()
            self._note(answer, reason)
            self._last_reason = reason
            return answer
        finally:
            self._question = None

    async def _ask_once(self) -> tuple[bool, str]:
        """The answer on the connection kept (a new one if none is), and why it is False; a
        connection that did not answer True is closed."""
        loop = asyncio.get_running_loop()
        fresh = self._connection is None or self._connection.is_closed()
        if fresh and loop.time() < self._next_connect_at:
            return False, self._last_reason
        try:
            if fresh:
                self._connection = await connect_to_primary(
                    self._database_url, server_settings={"application_name": PROBE_APPLICATION_NAME}
                )
            self.questions_asked += 1
            if await self._connection.fetchval(IS_READ_WRITE_SQL):
                return True, ""
            reason = "the server is read-only: a standby, or set read-only"
        except Exception as error:  # noqa: BLE001 - whatever it is, PostgreSQL did not answer
            reason = f"{type(error).__name__}: {error}"
        if self._connection is not None:
            self._connection.terminate()
            self._connection = None
        if fresh:
            self._next_connect_at = loop.time() + PROBE_RECONNECT_INTERVAL_S
        return False, reason

    def _note(self, answer: bool, reason: str) -> None:
        """Logs each change of the answer (not each question: a flood of /v1/health asks many)."""
        if not answer and self._last_answer is not False:
            log.warning(
                "PostgreSQL does not answer the health probe as the read-write server (%s): /v1/health answers "
                "503 until it does; check that PostgreSQL runs and that the database URL names its primary",
                reason,
            )
        elif answer and self._last_answer is False:
            log.info("PostgreSQL answers the health probe again")
        self._last_answer = answer


def _is_read_only(connection: asyncpg.Connection) -> bool:
    """From the settings PostgreSQL reports to the client on every change (no round trip)."""
    settings = connection.get_settings()
    return "on" in (
        getattr(settings, "in_hot_standby", "off"),
        getattr(settings, "default_transaction_read_only", "off"),
    )


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Pooled connections never change session state (no SET, LISTEN or session-level locks), so
    the default reset query (UNLISTEN, RESET ALL, advisory unlock: one more round trip per request)
    is not needed; asyncpg still rolls back a transaction left open.

    A connection whose server has become read-only (made a standby, or set read-only by its
    operator) is closed here, so the next acquire looks for the read-write server again rather
    than failing with SQLSTATE 25006 forever."""
    if _is_read_only(connection):
        connection.terminate()


# A transaction of the request pool's that does work in Python between two of its statements for
# longer than the pool's idle-in-transaction timeout, and holds no row lock another request could wait
# for meanwhile, runs this first: PostgreSQL would otherwise end it (and its session) while its node
# is busy, not hung, and the same request would fail at every try. Those are the log cleaner's
# compaction pages (log_compaction.py) and the console's read-only snapshots (app/console/pages.py).
NO_IDLE_IN_TRANSACTION_TIMEOUT_SQL = "SET LOCAL idle_in_transaction_session_timeout = 0"


async def create_pool(database_url: str, size: int, idle_in_transaction_timeout_ms: int = 0) -> asyncpg.Pool:
    """The request pool. `idle_in_transaction_timeout_ms` (0: none): PostgreSQL ends a transaction
    of the pool's, and its session, that waits that long for its next statement, so that a server
    process that hangs mid-transaction (stopped, its machine frozen: its socket still open, so
    neither TCP keepalives nor PostgreSQL see it gone) releases the rows it locked (a group's, a
    partition's, a transactional id's), as Kafka fences a broker whose heartbeats stop
    (broker.session.timeout.ms, 9 s) and moves its work to the others. A live process never waits
    that long between two statements of a transaction: its statements follow each other without
    waiting on anything else (the waits of JoinGroup, SyncGroup and Fetch hold no transaction), and its
    work in Python that can take seconds is done outside (a write batch's conversion of large record
    batches into their topics' forms, batched_writes.py) or in a transaction exempt from the timeout
    (NO_IDLE_IN_TRANSACTION_TIMEOUT_SQL)."""

    async def connect(*_args, **options) -> asyncpg.Connection:
        return await connect_to_primary(database_url, **options)

    # asyncpg.create_pool with the pool class of our own (asyncpg's defaults spelled out, as its
    # constructor takes them all by keyword).
    return await _Pool(
        min_size=1,
        max_size=size,
        max_queries=50_000,
        loop=None,
        connect=connect,
        connection_class=KeptAliveConnection,
        record_class=asyncpg.Record,
        init=_init_connection,
        reset=_keep_session,
        # Statements are prepared per connection and reused: the hot paths are a handful of fixed
        # statements, so planning them once matters.
        max_inactive_connection_lifetime=300,
        # Every statement here is a fixed OLTP statement on keys and array parameters (unnest), for
        # which PostgreSQL's automatic choice kept planning a custom plan on every execution (bind
        # then costs the backend about as much CPU as the statement itself). A generic plan is
        # planned once per connection, which shortens every request; `python -m bench.transactions
        # --sections 1 --producers 1` measures it (docs/performance.md).
        server_settings={
            "plan_cache_mode": "force_generic_plan",
            "idle_in_transaction_session_timeout": str(idle_in_transaction_timeout_ms),
        },
    )


async def connect(database_url: str) -> asyncpg.Connection:
    """A single connection set up like the pool's (for workers that need their own, and tests)."""
    connection = await connect_to_primary(database_url)
    await _init_connection(connection)
    return connection
