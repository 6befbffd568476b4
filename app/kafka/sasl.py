"""Who a Kafka connection is: SASL/PLAIN and SASL/SCRAM-SHA-256 and -512 authentication (KIP-43,
KIP-84, KIP-152) on a listener of a server with `auth` required, as a Kafka SASL listener does it;
the anonymous super user with `auth` off.

PLAIN's username is a txbroker principal and its password one of that principal's API keys, the
same key HTTP takes as a bearer token, or the password one of its SCRAM credentials was set from
(either mechanism, as Redpanda's PLAIN takes it: the core's rule,
scram_credentials.authenticate_password); a connection authenticated by a SCRAM password is then
checked per request as a SCRAM exchange's is. SCRAM's username is a txbroker
principal and its password the one its SCRAM credential for that mechanism was set from (Kafka's
AlterUserScramCredentials or HTTP's PUT /v1/principals/{name}/scram-credentials/{mechanism}); the
exchange is scramp's (RFC 5802), two round trips: the client's first message is answered with the
salt, the iterations and the nonce, the client's final one (its proof) with the server's signature.
Kafka's SCRAM extensions (tokenauth, delegation tokens) are not served: txbroker has no tokens.

A connection's states, as Kafka's SaslServerAuthenticator has them:

    HANDSHAKE        (auth required, at connect) ApiVersions and SaslHandshake are served; any other
                     request closes the connection. A SaslHandshake naming PLAIN or SCRAM leads to
                     AUTHENTICATE; naming another mechanism it is answered UNSUPPORTED_SASL_MECHANISM
                     with the enabled ones, and the connection closes (FAILED).
    AUTHENTICATE     SaslAuthenticate only. The right username and password lead to AUTHENTICATED;
                     a wrong one is answered SASL_AUTHENTICATION_FAILED and the connection closes.
                     SCRAM: the first SaslAuthenticate (the client's first message) is answered with
                     the server's first and stays here; the second (the proof) leads to AUTHENTICATED
                     or, wrong, to SASL_AUTHENTICATION_FAILED. A username without a credential for
                     the mechanism fails at the first message (as Kafka's ScramSaslServer), with
                     PLAIN's message.
    UNFRAMED_TOKEN   after a SaslHandshake v0 (before Kafka 1.0, KIP-152): the next frame is PLAIN's
                     message itself, not a request; the right one is answered with an empty token
                     frame and leads to AUTHENTICATED, a wrong one closes the connection unanswered
                     (v0 has no way to say why); SCRAM's two messages come alike, each answered with
                     its token framed. Served because librdkafka 2.0 (Debian's kcat) uses
                     SASL only when the broker advertises SaslHandshake from v0 (it then sends v1).
    AUTHENTICATED    every request, as the principal. SaslHandshake and SaslAuthenticate get
                     ILLEGAL_SASL_STATE: there is no re-authentication (KIP-368's session lifetime
                     is answered 0: the session does not expire).
    FAILED           the answer is sent, then the connection is closed (after Kafka's delay).

On a listener without SASL (PLAINTEXT or SSL: all of them with `auth` off) a connection is
AUTHENTICATED from the start, as the anonymous super user with `auth` off, and with `auth` required
as the principal ANONYMOUS, allowed only what the ACLs grant it (`User:ANONYMOUS`, `User:*`), as
Kafka's PLAINTEXT listener makes its connections User:ANONYMOUS for its authorizer to judge; a
client configured for SASL gets ILLEGAL_SASL_STATE for its SaslHandshake, as Kafka's brokers answer
it on a listener without SASL.

The principal is read again for every request (as HTTP reads it per request): an ACL changed since
the connection authenticated applies to its next request, and once its key is revoked, its SCRAM
credential deleted or changed (a new password, new iterations), or its principal deleted, the
connection is closed.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import NamedTuple

from kio.schema.errors import ErrorCode as KafkaError
from scramp import ScramException, ScramMechanism
from scramp.core import ClientFinal

from app.kafka import api_table
from app.kafka.broker_calls import AUTH_OFF_PRINCIPAL, SCRAM_MECHANISMS, UNAUTHENTICATED, BrokerCalls
from app.kafka.frames import MalformedRequest

log = logging.getLogger("txbroker.kafka")

PLAIN = "PLAIN"
ENABLED_MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
# Kafka's sasl.server.max.receive.size: the largest frame an unauthenticated client may send, so
# that it cannot make the node buffer kafka_max_request_bytes (100 MiB) before it is known.
UNAUTHENTICATED_MAX_REQUEST_BYTES = 524288
# Kafka's connection.failed.authentication.delay.ms: a failed connection is closed this long after
# its answer, which slows a guesser down and lets a client read the answer before the close (a client
# that sees the end of the stream first reports a lost connection instead of the failure).
FAILED_AUTHENTICATION_CLOSE_DELAY_S = 0.1
# SaslHandshake v0: SASL's tokens follow unframed, each a 4-byte length and the bytes.
UNFRAMED_HANDSHAKE_VERSION = 0
EMPTY_TOKEN = b""  # PLAIN's server token
# KIP-368's session lifetime: 0, the session never has to re-authenticate.
NO_SESSION_EXPIRY_MS = 0
# What may be asked before authentication, per state.
_SERVED_BEFORE_HANDSHAKE = frozenset({api_table.API_VERSIONS, api_table.SASL_HANDSHAKE})
_SERVED_BEFORE_AUTHENTICATE = frozenset({api_table.SASL_AUTHENTICATE})
# As Kafka words it, so that a client shows the same text: a wrong username or key is not told apart.
INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"


class State(Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    UNFRAMED_TOKEN = "unframed token"
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


class NotAuthenticated(MalformedRequest):
    """A request other than ApiVersions, SaslHandshake and SaslAuthenticate before authentication:
    the connection is closed, as a Kafka SASL listener closes it."""


class PlainCredentialsInvalid(Exception):
    """A SASL/PLAIN message that is not authzid NUL username NUL password (RFC 4616) as Kafka takes it."""


def plain_credentials(auth_bytes: bytes) -> tuple[str, str]:
    """(username, password) of a SASL/PLAIN message, checked as Kafka's PlainSaslServer checks it."""
    try:
        tokens = auth_bytes.decode("utf-8").split("\0")
    except UnicodeDecodeError:
        raise PlainCredentialsInvalid("Invalid SASL/PLAIN response: expected UTF-8") from None
    if len(tokens) != 3:
        raise PlainCredentialsInvalid(
            f"Invalid SASL/PLAIN response: expected 3 tokens (authzid NUL username NUL password), got {len(tokens)}"
        )
    authorization_id, username, password = tokens
    if not username:
        raise PlainCredentialsInvalid("Authentication failed: username not specified")
    if not password:
        raise PlainCredentialsInvalid("Authentication failed: password not specified")
    if authorization_id and authorization_id != username:
        raise PlainCredentialsInvalid(
            "Authentication failed: Client requested an authorization id that is different from username"
        )
    return username, password


class _ScramIdentity(NamedTuple):
    """What a SCRAM connection authenticated as: read again per request (SaslSession.principal)."""

    username: str
    mechanism: str
    stored_key: bytes


class _UsernameSeen(Exception):
    """Raised from the auth function of scramp's first pass (_scram_username), with the username."""


def _scram_username(mechanism: ScramMechanism, client_first: str) -> str:
    """The username of a SCRAM client's first message, as scramp parses it: scramp asks for the
    credential synchronously while it parses, and txbroker's is read from PostgreSQL, so a first
    pass learns the name and the exchange's pass (SaslSession._scram_first) gets the credential read
    for it. Raises ScramException for a message scramp refuses."""

    def seen(username: str):
        raise _UsernameSeen(username)

    try:
        mechanism.make_server(seen).set_client_first(client_first)
    except ScramException as refused:
        if isinstance(refused.__cause__, _UsernameSeen):
            return refused.__cause__.args[0]
        raise
    raise ScramException("the client's first message names no user")


def _accept_a_nonce_prefixed_again(server, client_final: str) -> None:
    """librdkafka (confluent-kafka, kcat) echoes the server's nonce with its own prefixed to it once
    more; Kafka's ScramSaslServer accepts a client-final nonce that ends with the server's, where
    scramp wants it equal (RFC 5802). The proof still covers the nonce as the client sent it, and
    the server's fresh part must be in it: scramp's exchange then goes on with the client's."""
    sent = ClientFinal(client_final)["r"]
    if str(sent) != str(server.nonce) and str(sent).endswith(str(server.nonce)):
        server.nonce = sent


def _framed(token: bytes) -> bytes:
    return len(token).to_bytes(4, "big") + token


class SaslSession:
    """One connection's authentication. Invariant: a request is served as a principal only in
    AUTHENTICATED, as the principal its credentials name at that request (module docstring)."""

    def __init__(self, calls: BrokerCalls, peer: str | None, sasl: bool) -> None:
        """`sasl`: whether the connection's listener authenticates (SASL_PLAINTEXT, SASL_SSL)."""
        self._calls = calls
        # The connection's peer, HOST:PORT (None: unknown): what its logs and audit entries name.
        self.peer = peer
        self._mechanism = PLAIN
        self._credentials: tuple[str, str] | None = None  # PLAIN's (username, API key)
        self._scram_identity: _ScramIdentity | None = None
        self._scram_server = None  # scramp's server between SCRAM's two messages
        self._scram_username: str | None = None
        self._scram_stored_key = b""
        self.state = State.HANDSHAKE if sasl else State.AUTHENTICATED

    @property
    def closing(self) -> bool:
        """True once the connection must be closed after the answer just sent."""
        return self.state is State.FAILED

    def max_request_bytes(self, authenticated_limit: int) -> int:
        return authenticated_limit if self.state is State.AUTHENTICATED else UNAUTHENTICATED_MAX_REQUEST_BYTES

    @property
    def limit_name(self) -> str:
        """Where max_request_bytes comes from, for the message refusing a frame over it."""
        if self.state is State.AUTHENTICATED:
            return "kafka_max_request_bytes"
        return "before SASL authentication, as Kafka's sasl.server.max.receive.size"

    def admit(self, api_key: int) -> None:
        """Raises NotAuthenticated for a request this state does not serve."""
        if self.state is State.HANDSHAKE and api_key not in _SERVED_BEFORE_HANDSHAKE:
            raise NotAuthenticated(
                f"api key {api_key} before SASL authentication: with auth required the listener serves only "
                f"ApiVersions and SaslHandshake (mechanism {', '.join(ENABLED_MECHANISMS)}) then SaslAuthenticate "
                f"until a client authenticates"
            )
        if self.state is State.AUTHENTICATE and api_key not in _SERVED_BEFORE_AUTHENTICATE:
            raise NotAuthenticated(f"api key {api_key} after SaslHandshake: expected SaslAuthenticate (key 36)")

    @property
    def awaits_unframed_token(self) -> bool:
        """True when the next frame is SASL's token itself (after SaslHandshake v0), not a request."""
        return self.state is State.UNFRAMED_TOKEN

    def handshake(self, mechanism: str, version: int) -> KafkaError:
        if self.state is not State.HANDSHAKE:
            return KafkaError.illegal_sasl_state
        if mechanism not in ENABLED_MECHANISMS:
            log.info(
                "closing a Kafka connection from %s: SASL mechanism %r is not enabled", self.peer or "?", mechanism
            )
            self.state = State.FAILED
            return KafkaError.unsupported_sasl_mechanism
        self._mechanism = mechanism
        self.state = State.UNFRAMED_TOKEN if version == UNFRAMED_HANDSHAKE_VERSION else State.AUTHENTICATE
        return KafkaError.none

    async def unframed_token(self, auth_bytes: bytes) -> bytes | None:
        """What to answer a SASL token sent unframed (after SaslHandshake v0): the server's token
        framed when the exchange goes on or succeeds; nothing when it fails (the connection is then
        `closing`)."""
        self.state = State.AUTHENTICATE
        error, _, token = await self.authenticate(auth_bytes)
        if error != KafkaError.none:
            return None
        if self.state is State.AUTHENTICATE:  # SCRAM's second message to come, unframed too
            self.state = State.UNFRAMED_TOKEN
        return _framed(token)

    async def authenticate(self, auth_bytes: bytes) -> tuple[KafkaError, str | None, bytes]:
        """The answer's error code, message and token (the server's SASL message)."""
        if self.state is not State.AUTHENTICATE:
            return (
                KafkaError.illegal_sasl_state,
                (
                    "SaslAuthenticate received after successful authentication"
                    if self.state is State.AUTHENTICATED
                    else "SaslAuthenticate received before SaslHandshake"
                ),
                EMPTY_TOKEN,
            )
        if self._mechanism != PLAIN:
            if self._scram_server is None:
                return await self._scram_first(auth_bytes)
            return self._scram_final(auth_bytes)
        try:
            username, password = plain_credentials(auth_bytes)
        except PlainCredentialsInvalid as invalid:
            return self._failed(str(invalid))
        authentication = await self._calls.authenticate_password(username, password)
        if authentication is None:
            return self._failed(INVALID_CREDENTIALS, username)
        credential = authentication.scram_credential
        if credential is None:
            self._credentials = username, password
        else:
            self._scram_identity = _ScramIdentity(username, credential.mechanism, credential.stored_key)
        self.state = State.AUTHENTICATED
        return KafkaError.none, None, EMPTY_TOKEN

    async def _scram_first(self, auth_bytes: bytes) -> tuple[KafkaError, str | None, bytes]:
        """SCRAM's client-first message: answered with the server's first (salt, iterations, nonce)."""
        mechanism = ScramMechanism(self._mechanism)
        try:
            client_first = auth_bytes.decode("utf-8")
            username = _scram_username(mechanism, client_first)
        except (UnicodeDecodeError, ScramException) as invalid:
            return self._failed(f"Invalid {self._mechanism} client first message: {invalid}")
        credential = await self._calls.scram_credential(username, self._mechanism)
        if credential is None:
            return self._failed(INVALID_CREDENTIALS, username)
        server = mechanism.make_server(
            lambda _: (credential.salt, credential.stored_key, credential.server_key, credential.iterations)
        )
        try:
            server.set_client_first(client_first)
            server_first = server.get_server_first()
        except ScramException as invalid:
            return self._failed(f"Invalid {self._mechanism} client first message: {invalid}", username)
        self._scram_server = server
        self._scram_username = username
        self._scram_stored_key = credential.stored_key
        return KafkaError.none, None, server_first.encode("utf-8")

    def _scram_final(self, auth_bytes: bytes) -> tuple[KafkaError, str | None, bytes]:
        """SCRAM's client-final message (the proof): answered with the server's signature."""
        try:
            client_final = auth_bytes.decode("utf-8")
            _accept_a_nonce_prefixed_again(self._scram_server, client_final)
            self._scram_server.set_client_final(client_final)
            server_final = self._scram_server.get_server_final()
        except (UnicodeDecodeError, ScramException):
            # A wrong password is a wrong proof: told as PLAIN tells a wrong key.
            return self._failed(INVALID_CREDENTIALS, self._scram_username)
        self._scram_identity = _ScramIdentity(self._scram_username, self._mechanism, self._scram_stored_key)
        self._scram_server = None
        self.state = State.AUTHENTICATED
        return KafkaError.none, None, server_final.encode("utf-8")

    def _failed(self, message: str, username: str | None = None) -> tuple[KafkaError, str, bytes]:
        log.info(
            "failed SASL/%s authentication from %s (username %r): %s",
            self._mechanism,
            self.peer or "?",
            username,
            message,
        )
        self.state = State.FAILED
        self._scram_server = None
        return KafkaError.sasl_authentication_failed, message, EMPTY_TOKEN

    async def principal(self):
        """Who this request is served as (read again per request, module docstring)."""
        if self.state is not State.AUTHENTICATED:
            return UNAUTHENTICATED  # only ApiVersions and SASL are served: a principal allowed nothing
        if self._scram_identity is not None:
            principal = await self._calls.scram_authenticated(*self._scram_identity)
            if principal is None:
                raise NotAuthenticated(
                    f"the {self._scram_identity.mechanism} credential principal {self._scram_identity.username!r} "
                    f"authenticated with was deleted or changed (or the principal deleted): the client must "
                    f"authenticate again"
                )
            return principal
        if self._credentials is None:  # a listener without SASL
            if self._calls.requires_authentication:
                return await self._calls.anonymous_principal()
            return AUTH_OFF_PRINCIPAL
        principal = await self._calls.authenticate(*self._credentials)
        if principal is None:
            raise NotAuthenticated(
                f"the API key principal {self._credentials[0]!r} authenticated with was revoked (or the principal "
                f"deleted): the client must authenticate again"
            )
        return principal
