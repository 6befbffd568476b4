"""The Kafka listener: an asyncio server of length-prefixed frames beside uvicorn's HTTP, in every
server process.

A connection's requests are answered in the order sent (Kafka's rule), and served as Kafka serves
them, one after the other, with one exception: Produce requests with acks=1 or all are pipelined.
Clients send up to five Produce requests without waiting (librdkafka's and Java's
max.in.flight.requests.per.connection); each is read, checked and queued for a write batch in the
connection's loop, in arrival order, so that an idempotent producer's batches are appended in
sequence order (write_batching.py writes queued requests in that order, also when it writes a failed
batch's requests again one by one), and only the wait for its commit overlaps the next requests: the
write batch after a connection's first Produce can take its next ones, where serving them one at a
time left each producer one request per commit. Their answers are written in order
(AnswersInOrder), at most MAX_PENDING_ANSWERS pending; any other request is served only once every
earlier answer is written (an EndTxn, an AddPartitionsToTxn, a Fetch never overtakes a Produce). An
acks=0 Produce, whose client waits for no answer, is written before the next request is read, as
Kafka's broker serves it: if it fails, the connection is closed once the answers before it are
written, and nothing sent after it is written (handlers/produce.py). A
connection that closes with answers pending drops them (their writes go on, as a Produce whose
client went away). A frame
whose declared length exceeds kafka_max_request_bytes is refused before a byte of it is read: the
connection is closed, as Kafka's socket server does (socket.request.max.bytes); so is one that is
not a request this broker serves (dispatch.py). Nothing a connection sends can stop the listener.
A connection that sends nothing for kafka_connections_max_idle_ms while none of its answers is
pending is closed (Kafka's connections.max.idle.ms), authenticated or not, between requests or in
the middle of one's frame. A request that meets PostgreSQL away is answered with its API's
retriable code (broker_calls.py, error_codes.py); one of an API that has none for it (Metadata for
every topic, the admin APIs) closes its connection, logged as a warning, not as a bug: the client
reconnects and retries.

A node has one listener per security protocol it is given (listener_addresses.py: PLAINTEXT, SSL,
SASL_PLAINTEXT, SASL_SSL), every one served by every server process (KafkaListeners). A SASL one
authenticates its connections (sasl.py); an SSL one speaks TLS with the server's certificate
(`ssl_certfile`, `ssl_keyfile`, as HTTPS); a PLAINTEXT or SSL one authenticates nobody: its
connections are the anonymous super user with `auth` off, the principal ANONYMOUS judged by the
ACLs with `auth` required. Metadata, FindCoordinator and DescribeCluster answer each node's address
of the protocol the request came in on (AdvertisedListener).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable
from typing import NamedTuple

from app.kafka import dispatch
from app.kafka.broker_calls import DATABASE_UNAVAILABLE, BrokerCalls
from app.kafka.frames import FRAME_LENGTH, CloseConnection, MalformedRequest
from app.kafka.listener_addresses import ListenerSetting, format_address
from app.kafka.sasl import FAILED_AUTHENTICATION_CLOSE_DELAY_S, SaslSession
from app.runtime.listening_sockets import LISTEN_BACKLOG, bound_accepting_socket

log = logging.getLogger("txbroker.kafka")

# Pipelined Produce requests of a connection whose answers may be pending at once: librdkafka and
# Kafka's Java client send at most 5 (max.in.flight.requests.per.connection, idempotent); beyond
# this many the connection reads its next request only once the oldest is answered.
MAX_PENDING_ANSWERS = 8


class KafkaListeners:
    """Every Kafka listener of this server process (one per security protocol, in the order given),
    and the node's presence among the others, announced once they all serve, with each one's
    advertised address (BrokerCalls.announce)."""

    def __init__(self, calls: BrokerCalls, settings: list[ListenerSetting]):
        self._calls = calls
        self.listeners = [KafkaListener(calls, setting) for setting in settings]

    def bind(self) -> None:
        for listener in self.listeners:
            listener.bind()

    @property
    def advertised(self) -> AdvertisedListener:
        """The first listener's advertised address (the one a node of one listener has)."""
        return self.listeners[0].advertised

    async def start(self) -> None:
        for listener in self.listeners:
            await listener.start()
        await self._calls.announce([listener.advertised for listener in self.listeners])

    async def stop(self) -> None:
        await self._calls.withdraw()
        for listener in self.listeners:
            await listener.stop()


def tls_context(certfile, keyfile) -> ssl.SSLContext | None:
    """The server side of TLS with the server's certificate (None without one): the same files
    uvicorn serves HTTPS with, so one certificate names the node for both doors."""
    if certfile is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


class AdvertisedListener(NamedTuple):
    """Where clients reach a listener of this node, and its security protocol (also its name): what a
    request's Metadata, FindCoordinator and DescribeCluster answers are given (dispatch.py)."""

    host: str
    port: int
    protocol: str


class KafkaListener:
    """One listener (one security protocol) of this server process. Invariant: serves only once
    `start` is called (the server is ready: migrations applied, transactions recovered); binds in
    `bind`, early, so that a port in use fails the start."""

    def __init__(self, calls: BrokerCalls, setting: ListenerSetting):
        self._calls = calls
        self._setting = setting
        self._socket: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._tls: ssl.SSLContext | None = None

    def bind(self) -> None:
        """Binds beside the socket `serve` holds the port with (and beside the other workers'), as
        every accepting socket of a node does (app/runtime/listening_sockets.py): the kernel spreads the
        connections over the workers, and what they leave at a crash never blocks the restart."""
        if self._setting.tls:
            self._tls = tls_context(self._calls.settings.ssl_certfile, self._calls.settings.ssl_keyfile)
        self._socket = bound_accepting_socket(self._setting.host, self._setting.port)

    @property
    def bound_address(self) -> tuple[str, int]:
        assert self._socket is not None, "bind() first"
        return self._socket.getsockname()[:2]

    @property
    def advertised(self) -> AdvertisedListener:
        """What Metadata tells clients: the advertised listener, else the bound address."""
        return AdvertisedListener(*(self._setting.advertised or self.bound_address), self.security_protocol)

    async def start(self) -> None:
        if self._socket is None:
            self.bind()
        self._server = await asyncio.start_server(
            self._accepted, sock=self._socket, backlog=LISTEN_BACKLOG, ssl=self._tls
        )
        log.info(
            "Kafka listener (%s) on %s:%d (advertised as %s:%d)",
            self.security_protocol,
            *self.bound_address,
            *self.advertised[:2],
        )

    @property
    def security_protocol(self) -> str:
        """Kafka's name for what a client must speak here (its security.protocol), also the listener's name."""
        return self._setting.protocol

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()
        elif self._socket is not None:
            self._socket.close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except (MalformedRequest, CloseConnection) as error:
            log.info("closing a Kafka connection from %s: %s", writer.get_extra_info("peername"), error)
        except DATABASE_UNAVAILABLE as error:  # not a bug: the client retries once reconnected
            log.warning(
                "closing a Kafka connection from %s: PostgreSQL unavailable (%s: %s)",
                writer.get_extra_info("peername"),
                type(error).__name__,
                error,
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("closing a Kafka connection after an unexpected error")
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answers = AnswersInOrder(writer)
        try:
            await self._serve_requests(reader, writer, answers)
        finally:
            failure = await answers.close()
        if failure is not None:
            raise failure  # an answer's, which ended the requests' loop by closing the connection

    async def _serve_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: AnswersInOrder
    ) -> None:
        peer = writer.get_extra_info("peername")
        client_host = f"/{peer[0]}" if peer else ""  # as Kafka shows a member's host
        session = SaslSession(self._calls, format_address(*peer[:2]) if peer else None, self._setting.sasl)
        # The connection's Fetch requests' read ahead (app/coordinator/fetch.py), cancelled at its end.
        read_ahead = self._calls.new_read_ahead()
        try:
            await self._serve_each_request(reader, writer, answers, session, read_ahead, client_host)
        finally:
            read_ahead.close()

    async def _serve_each_request(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        answers: AnswersInOrder,
        session: SaslSession,
        read_ahead: object,
        client_host: str,
    ) -> None:
        calls = self._calls
        advertised = self.advertised
        peer = writer.get_extra_info("peername")
        idle_s = calls.settings.kafka_connections_max_idle_ms / 1000
        while True:
            try:
                header = await self._next_header(reader, answers, idle_s)
            except asyncio.IncompleteReadError as eof:
                if not eof.partial:
                    return  # closed between requests
                raise
            if header is None:
                log.info(
                    "closing a Kafka connection from %s idle for %g s (kafka_connections_max_idle_ms)", peer, idle_s
                )
                return
            try:
                (length,) = FRAME_LENGTH.unpack(header)
                limit = session.max_request_bytes(calls.settings.kafka_max_request_bytes)
                if not 0 <= length <= limit:
                    raise MalformedRequest(
                        f"a request frame of {length} bytes was announced: expected at most {limit} "
                        f"({session.limit_name}); refused unread"
                    )
                frame = await self._rest_of_frame(reader, length, answers, idle_s)
                if frame is None:
                    log.info(
                        "closing a Kafka connection from %s: it sent part of a %d-byte request frame, then nothing "
                        "for %g s (kafka_connections_max_idle_ms)",
                        peer,
                        length,
                        idle_s,
                    )
                    return
                if dispatch.pipelined(frame, session):
                    # Submitted here, in the loop, before the next frame is read: the write batches
                    # get a connection's Produce requests in the order they came, so an idempotent
                    # producer's pipelined batches are appended in sequence order. Only the wait for
                    # the commit overlaps the next requests.
                    await answers.make_room()
                    answers.add(await dispatch.submit(frame, calls, session, advertised, client_host))
                    continue
            except (MalformedRequest, CloseConnection):
                # As Kafka, which reads a request only once the earlier are answered: their answers
                # are written, then the connection closed, and nothing sent after this is read.
                await answers.all_written()
                raise
            # Any other request only once every earlier one is answered, as Kafka serves them: one
            # after the other (an EndTxn, a Fetch never overtakes the connection's Produce requests).
            await answers.all_written()
            response = await dispatch.answer(frame, calls, session, advertised, client_host, read_ahead)
            if response is not None:
                await write_answer(writer, response)
            if session.closing:
                await asyncio.sleep(FAILED_AUTHENTICATION_CLOSE_DELAY_S)
                return

    @staticmethod
    async def _rest_of_frame(
        reader: asyncio.StreamReader, length: int, answers: AnswersInOrder, idle_s: float
    ) -> bytes | None:
        """The request frame whose length prefix was just read; None once the connection has sent none
        of it for idle_s while none of its answers was pending. Kafka's connections.max.idle.ms counts
        from a connection's last bytes, not from its last whole request: a client that announces a
        frame and goes quiet (before authentication too) must not hold a socket and a buffer for
        good. A frame nearly always comes whole within idle_s, read at once; one that does not is
        read on in parts for as long as each comes within idle_s of the one before, so its silence
        is noticed within twice idle_s. A read that times out consumes nothing (as _next_header's)."""
        try:
            async with asyncio.timeout(idle_s):
                return await reader.readexactly(length)
        except TimeoutError:
            pass
        parts: list[bytes] = []
        missing = length
        while missing:
            try:
                async with asyncio.timeout(idle_s):
                    part = await reader.read(missing)
            except TimeoutError:
                if answers.pending:
                    continue
                return None
            if not part:
                raise asyncio.IncompleteReadError(b"".join(parts), length)
            parts.append(part)
            missing -= len(part)
        return b"".join(parts)

    @staticmethod
    async def _next_header(reader: asyncio.StreamReader, answers: AnswersInOrder, idle_s: float) -> bytes | None:
        """The next request's length prefix; None once the connection has sent nothing for idle_s
        while none of its answers was pending (Kafka's connections.max.idle.ms: a connection
        waiting for its pipelined Produce requests' commits is not idle). A timed-out read consumes
        nothing (StreamReader keeps what it has until the whole prefix is there). asyncio.timeout, not
        wait_for, which runs the read as a task of its own: a turn of the event loop even when the
        prefix is already read, and in that turn the write batch of the Produce request just submitted
        would start without the one that follows it in the same segment (write_batching.py)."""
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    return await reader.readexactly(FRAME_LENGTH.size)
            except TimeoutError:
                if not answers.pending:
                    return None


async def write_answer(writer: asyncio.StreamWriter, frame: bytes) -> None:
    """Writes an answer, or raises ConnectionResetError when the client has gone (its connection
    closed or reset while the request was answered): the disconnect every client may make at any
    time, not an error of the node. uvloop, the loop `txbroker serve` runs, raises RuntimeError
    ("the handler is closed") on a write to a connection the peer reset, which read as an
    unexpected error with its traceback."""
    if writer.is_closing():
        raise ConnectionResetError(f"the client closed the connection before its answer ({len(frame)} bytes)")
    writer.write(frame)
    await writer.drain()


class AnswersInOrder:
    """A connection's pipelined answers (its Produce requests', each waiting for its write batch's
    commit), written in request order, Kafka's rule, however their commits end. Invariants: each
    answer is a task that waits for its response, then for the task of the answer before it, and
    only then writes, so one task writes at a time and in order; at most MAX_PENDING_ANSWERS are
    pending (`add` waits for the oldest); a failed answer (a lost connection, an unexpected error)
    aborts the connection, so that the loop reading its requests ends, and is raised by `close`.
    (An acks=0 Produce has no answer here: it is written before the next request is read, and its
    failure, CloseConnection, ends the loop itself.)"""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._pending: collections.deque[asyncio.Task] = collections.deque()
        self._failure: BaseException | None = None

    async def make_room(self) -> None:
        """Returns once another answer may be added: fewer than MAX_PENDING_ANSWERS pending. Raises
        the failure of one that failed (the connection is closing: no more requests are submitted)."""
        if self._failure is not None:
            raise self._failure
        while self._pending and self._pending[0].done():
            await self._pending.popleft()  # raises its failure, if any
        if len(self._pending) >= MAX_PENDING_ANSWERS:
            await self._pending.popleft()

    def add(self, response: Awaitable[bytes | None]) -> None:
        """`response` is written once it is ready and every answer added before it is written."""
        previous = self._pending[-1] if self._pending else None
        task = asyncio.create_task(self._write_in_turn(response, previous), name="kafka-answer")
        task.add_done_callback(self._answered)
        self._pending.append(task)

    @property
    def pending(self) -> bool:
        """Whether an answer is still to be written."""
        return any(not task.done() for task in self._pending)

    async def all_written(self) -> None:
        """Returns once every answer added is written (raises the failure of one that failed)."""
        if self._pending:
            await self._pending[-1]  # written after every earlier one (the class's invariant)
            self._pending.clear()

    async def _write_in_turn(self, response: Awaitable[bytes | None], previous: asyncio.Task | None) -> None:
        frame = await response
        if previous is not None:
            await previous
        if frame is not None:  # none for acks=0
            await write_answer(self._writer, frame)

    def _answered(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        if self._failure is None:
            self._failure = task.exception()
            self._writer.transport.abort()  # the requests' loop sees the end of the stream and ends

    async def close(self) -> BaseException | None:
        """Cancels the answers not written (the connection is closing: nobody would read them; their
        requests are written all the same, as a Produce whose client went away) and waits for their
        tasks to end. Returns the failure that aborted the connection, if any."""
        if not self._pending:
            return self._failure
        # Every task takes its first step first, so that its coroutine is started and a cancel
        # reaches what it waits for (a write batch's answer, which is then dropped).
        await asyncio.sleep(0)
        for task in self._pending:
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        self._pending.clear()
        return self._failure
