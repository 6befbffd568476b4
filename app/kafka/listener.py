"""The Kafka listener: an asyncio server of length-prefixed frames beside uvicorn's HTTP, in every
server process.

Each connection is served one request at a time, in the order sent: clients pipeline several
requests, and Kafka answers them in order, processing the next only once the previous one is
answered (an idempotent producer's pipelined batches must be appended in sequence order). A frame
whose declared length exceeds kafka_max_request_bytes is refused before a byte of it is read: the
connection is closed, as Kafka's socket server does (socket.request.max.bytes); so is one that is
not a request this broker serves (dispatch.py). Nothing a connection sends can stop the listener.

With `auth` required the listener is a SASL listener (sasl.py); with the server's certificate
(`ssl_certfile`, `ssl_keyfile`, as HTTPS) it speaks TLS: Kafka's SASL_SSL, or SSL with `auth` off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

from app.kafka import dispatch
from app.kafka.broker_calls import BrokerCalls
from app.kafka.frames import FRAME_LENGTH, MalformedRequest
from app.kafka.sasl import FAILED_AUTHENTICATION_CLOSE_DELAY_S, SaslSession
from app.runtime.listening_sockets import LISTEN_BACKLOG, bound_accepting_socket

log = logging.getLogger("txbroker.kafka")

OFF = "off"


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT ([v6]:PORT for IPv6) as (host, port); ValueError saying what was expected."""
    host, separator, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9092), nor 'off'")
    return host, int(port)


def format_address(host: str, port: int) -> str:
    """The HOST:PORT text parse_address reads back ([v6]:PORT for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tls_context(certfile, keyfile) -> ssl.SSLContext | None:
    """The server side of TLS with the server's certificate (None without one): the same files
    uvicorn serves HTTPS with, so one certificate names the node for both doors."""
    if certfile is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    return context


class KafkaListener:
    """Invariant: serves only once `start` is called (the server is ready: migrations applied,
    transactions recovered); binds in `bind`, early, so that a port in use fails the start."""

    def __init__(self, calls: BrokerCalls, address: tuple[str, int], advertised: str | None):
        self._calls = calls
        self._address = address
        self._advertised = advertised
        self._socket: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._tls: ssl.SSLContext | None = None

    def bind(self) -> None:
        """Binds beside the socket `serve` holds the port with (and beside the other workers'), as
        every accepting socket of a node does (app/runtime/listening_sockets.py): the kernel spreads the
        connections over the workers, and what they leave at a crash never blocks the restart."""
        self._tls = tls_context(self._calls.settings.ssl_certfile, self._calls.settings.ssl_keyfile)
        self._socket = bound_accepting_socket(*self._address)

    @property
    def bound_address(self) -> tuple[str, int]:
        assert self._socket is not None, "bind() first"
        return self._socket.getsockname()[:2]

    @property
    def advertised(self) -> tuple[str, int]:
        """What Metadata tells clients: the advertised listener, else the bound address."""
        return parse_address(self._advertised) if self._advertised else self.bound_address

    async def start(self) -> None:
        if self._socket is None:
            self.bind()
        self._server = await asyncio.start_server(
            self._accepted, sock=self._socket, backlog=LISTEN_BACKLOG, ssl=self._tls
        )
        await self._calls.announce(*self.advertised)
        log.info(
            "Kafka listener (%s) on %s:%d (advertised as %s:%d)",
            self.security_protocol,
            *self.bound_address,
            *self.advertised,
        )

    @property
    def security_protocol(self) -> str:
        """Kafka's name for what a client must speak here (its security.protocol)."""
        sasl = self._calls.requires_authentication
        if self._tls is None:
            return "SASL_PLAINTEXT" if sasl else "PLAINTEXT"
        return "SASL_SSL" if sasl else "SSL"

    async def stop(self) -> None:
        await self._calls.withdraw()
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
        except MalformedRequest as error:
            log.info("closing a Kafka connection from %s: %s", writer.get_extra_info("peername"), error)
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
        calls = self._calls
        advertised = self.advertised
        peer = writer.get_extra_info("peername")
        client_host = f"/{peer[0]}" if peer else ""  # as Kafka shows a member's host
        session = SaslSession(calls, format_address(*peer[:2]) if peer else "?")
        while True:
            try:
                header = await reader.readexactly(FRAME_LENGTH.size)
            except asyncio.IncompleteReadError as eof:
                if not eof.partial:
                    return  # closed between requests
                raise
            (length,) = FRAME_LENGTH.unpack(header)
            limit = session.max_request_bytes(calls.settings.kafka_max_request_bytes)
            if not 0 <= length <= limit:
                raise MalformedRequest(
                    f"a request frame of {length} bytes was announced: expected at most {limit} "
                    f"({session.limit_name}); refused unread"
                )
            frame = await reader.readexactly(length)
            response = await dispatch.answer(frame, calls, session, advertised, client_host)
            if response is not None:
                writer.write(response)
                await writer.drain()
            if session.closing:
                await asyncio.sleep(FAILED_AUTHENTICATION_CLOSE_DELAY_S)
                return
