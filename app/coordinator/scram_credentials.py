"""Principals' SASL/SCRAM credentials (SCRAM-SHA-256 and SCRAM-SHA-512, RFC 5802 and 7677, as
Kafka's KIP-84 and KIP-554 have them): set, deleted and described by both doors (Kafka's
AlterUserScramCredentials and DescribeUserScramCredentials; HTTP's
/v1/principals/{name}/scram-credentials), and looked up by the Kafka listener's SASL exchange.

SASL/PLAIN takes a principal's SCRAM password as well as its API keys (authenticate_password, as
Redpanda's PLAIN checks its SCRAM credentials): the password is salted with the stored salt and
iterations and its keys compared with the stored ones, so a user set up once (Kafka's tools, HTTP)
authenticates by either mechanism family.

A SCRAM user is a txbroker principal: ACLs are by principal, so a credential for a name that is
no principal would authenticate someone no rule can name; setting one for a missing principal is
refused (NOT_FOUND, Kafka's RESOURCE_NOT_FOUND) naming it. What is kept is what a SCRAM server
keeps (salt, iterations, stored key, server key), computed by scramp, never the password.

Every change is written with its audit entry in one PostgreSQL transaction, as security_admin's.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass
from enum import StrEnum

import asyncpg
from scramp import ScramMechanism
from scramp.utils import h, hmac

from app.clock import now_ms
from app.coordinator import security_admin
from app.coordinator.audit import Actor, record
from app.coordinator.authorizer import Principal, principal_from
from app.coordinator.security_admin import removed_or_refused
from app.errors import BrokerError, ErrorCode
from app.storage.security import principals
from app.storage.security import scram_credentials as stored
from app.storage.security.scram_credentials import ScramCredentialInfo, ScramCredentialRow

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "MIN_SALT_BYTES",
    "CredentialRefusal",
    "PasswordAuthentication",
    "ScramAlteration",
    "ScramCredentialInfo",
    "ScramCredentialRefused",
    "ScramCredentialRow",
    "alter_credentials",
    "authenticate_password",
    "authenticated",
    "credential",
    "delete_credential",
    "describe_credentials",
    "list_credentials",
    "set_password",
]

SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_512)
# Kafka's bounds (ScramMechanism.minIterations, ScramControlManager.MAX_ITERATIONS): the lower one
# RFC 7677's, the upper one what keeps an authentication's PBKDF2 cheap for the server.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
# scramp's (Salt.MIN_LENGTH): a credential with a shorter salt could never authenticate. Kafka's
# clients send 64 bytes (librdkafka) or more than 12 (Java's ScramFormatter).
MIN_SALT_BYTES = 12
MAX_PASSWORD_CHARS = 1024
# The salt HTTP's set_password draws (Kafka's own tools draw fewer; librdkafka 64 bytes).
SALT_BYTES = 32
_HASH_NAMES = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}


class CredentialRefusal(StrEnum):
    """Why a credential's change is refused, as Kafka's AlterUserScramCredentials tells it apart."""

    UNACCEPTABLE = "unacceptable credential"  # UNACCEPTABLE_CREDENTIAL
    UNSUPPORTED_MECHANISM = "unsupported mechanism"  # UNSUPPORTED_SASL_MECHANISM
    NOT_FOUND = "not found"  # RESOURCE_NOT_FOUND: no such principal, or no such credential to delete
    DUPLICATE = "named twice"  # DUPLICATE_RESOURCE: a principal changed twice in one request


class ScramCredentialRefused(BrokerError):
    """INVALID_REQUEST (NOT_FOUND for what does not exist) over HTTP; Kafka's code by `refusal`."""

    def __init__(self, refusal: CredentialRefusal, message: str) -> None:
        code = ErrorCode.NOT_FOUND if refusal is CredentialRefusal.NOT_FOUND else ErrorCode.INVALID_REQUEST
        super().__init__(code, message)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class ScramAlteration:
    """One change of AlterUserScramCredentials: an upsertion (Kafka's form: the salt and the salted
    password its client computed) or, `salted_password` None, a deletion."""

    principal: str
    mechanism: str
    iterations: int = 0
    salt: bytes = b""
    salted_password: bytes | None = None


@dataclass(frozen=True, slots=True)
class PasswordAuthentication:
    """Who a SASL/PLAIN password authenticated and with what: `scram_credential` None for an API
    key, else the SCRAM credential the password was the one of (what the connection's later
    requests check is unchanged, as a SCRAM exchange's)."""

    principal: Principal
    scram_credential: ScramCredentialRow | None


def _check_mechanism(mechanism: str) -> ScramMechanism:
    if mechanism not in MECHANISMS:
        raise ScramCredentialRefused(
            CredentialRefusal.UNSUPPORTED_MECHANISM,
            f"SCRAM mechanism {mechanism}: expected one of {', '.join(MECHANISMS)}",
        )
    return ScramMechanism(mechanism)


def _check_name(name: str) -> None:
    if not name:
        raise ScramCredentialRefused(
            CredentialRefusal.UNACCEPTABLE, "an empty user name: expected the name of a txbroker principal"
        )


def _check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramCredentialRefused(
            CredentialRefusal.UNACCEPTABLE,
            f"{iterations} iterations: expected {MIN_ITERATIONS} to {MAX_ITERATIONS} (Kafka's bounds)",
        )


def _from_salted_password(alteration: ScramAlteration, now: int) -> ScramCredentialRow:
    """The credential a SCRAM server keeps, from what Kafka's client sends (RFC 5802's ClientKey,
    StoredKey and ServerKey of the salted password, with scramp's primitives)."""
    mechanism = _check_mechanism(alteration.mechanism)
    _check_iterations(alteration.iterations)
    if len(alteration.salt) < MIN_SALT_BYTES:
        raise ScramCredentialRefused(
            CredentialRefusal.UNACCEPTABLE,
            f"a salt of {len(alteration.salt)} bytes: expected at least {MIN_SALT_BYTES} (let the client generate it)",
        )
    digest_size = mechanism.hf().digest_size
    salted_password = alteration.salted_password or b""
    if len(salted_password) != digest_size:
        raise ScramCredentialRefused(
            CredentialRefusal.UNACCEPTABLE,
            f"a salted password of {len(salted_password)} bytes: {mechanism.name}'s is {digest_size} bytes",
        )
    stored_key, server_key = _keys(mechanism, salted_password)
    return ScramCredentialRow(
        alteration.principal, mechanism.name, alteration.salt, alteration.iterations, stored_key, server_key, now
    )


def _keys(mechanism: ScramMechanism, salted_password: bytes) -> tuple[bytes, bytes]:
    """RFC 5802's StoredKey and ServerKey of a salted password, with scramp's primitives."""
    stored_key = h(mechanism.hf, hmac(mechanism.hf, salted_password, b"Client Key"))
    return stored_key, hmac(mechanism.hf, salted_password, b"Server Key")


def _salted(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """SaltedPassword as Kafka's clients compute it: PBKDF2 of the password's UTF-8 bytes, no SASLprep."""
    return hashlib.pbkdf2_hmac(_HASH_NAMES[mechanism], password.encode("utf-8"), salt, iterations)


def _derived_from(password: str, credential: ScramCredentialRow) -> bool:
    """Whether `credential` was set from `password`: its keys compared in constant time."""
    salted_password = _salted(credential.mechanism, password, credential.salt, credential.iterations)
    stored_key, server_key = _keys(ScramMechanism(credential.mechanism), salted_password)
    return secrets.compare_digest(stored_key + server_key, credential.stored_key + credential.server_key)


def _first_derived_from(password: str, credentials: list[ScramCredentialRow]) -> ScramCredentialRow | None:
    return next((credential for credential in credentials if _derived_from(password, credential)), None)


def _missing_principal(name: str) -> ScramCredentialRefused:
    return ScramCredentialRefused(
        CredentialRefusal.NOT_FOUND,
        f"principal {name!r} does not exist: a SCRAM user is a txbroker principal (its ACLs are the "
        f"principal's); create it first (POST /v1/principals, `txbroker principals create`)",
    )


def _missing_credential(name: str, mechanism: str) -> ScramCredentialRefused:
    return ScramCredentialRefused(
        CredentialRefusal.NOT_FOUND, f"principal {name!r} has no {mechanism} credential to delete"
    )


async def _upsert(conn: asyncpg.Connection, actor: Actor, credential: ScramCredentialRow) -> None:
    if await principals.get_principal(conn, credential.principal, hold=True) is None:
        raise _missing_principal(credential.principal)
    await stored.upsert(conn, credential)
    await record(
        conn,
        actor,
        "set scram credential",
        credential.principal,
        f"{credential.mechanism}, {credential.iterations} iterations",
        at_ms=credential.updated_ms,
    )


async def _delete(conn: asyncpg.Connection, actor: Actor, name: str, mechanism: str) -> None:
    _check_mechanism(mechanism)
    if not await stored.delete(conn, name, mechanism):
        raise _missing_credential(name, mechanism)
    await record(conn, actor, "delete scram credential", name, mechanism)


async def _kafka_checked(conn: asyncpg.Connection, alteration: ScramAlteration) -> None:
    """Kafka's checks of a change as its controller reads the request (ScramControlManager's
    validateUpsertion and validateDeletion): the user, the mechanism, an upsertion's iterations, the
    existence of a deleted credential. The others (the salt, the salted password, the principal)
    come when the change is made, as its finishUpsertion's."""
    _check_name(alteration.principal)
    _check_mechanism(alteration.mechanism)
    if alteration.salted_password is not None:
        _check_iterations(alteration.iterations)
    elif await stored.find(conn, alteration.principal, alteration.mechanism) is None:
        raise _missing_credential(alteration.principal, alteration.mechanism)


async def alter_credentials(
    pool: asyncpg.Pool, actor: Actor, alterations: list[ScramAlteration]
) -> dict[str, BrokerError | None]:
    """Kafka's AlterUserScramCredentials: each principal's refusal (None: changed), in the order
    first named, those changed committed together. As Kafka's controller reads the changes (in
    their order, the deletions first): a principal named again after a change that passed
    _kafka_checked is refused DUPLICATE, that change with it; named again after a refusal, it keeps
    that refusal."""
    now = now_ms()
    outcomes: dict[str, BrokerError | None] = {}
    accepted: dict[str, ScramAlteration] = {}
    async with pool.acquire() as conn, conn.transaction():
        for alteration in alterations:
            name = alteration.principal
            if accepted.pop(name, None) is not None:
                outcomes[name] = ScramCredentialRefused(
                    CredentialRefusal.DUPLICATE,
                    f"user {name!r} altered more than once in one request: alter each user at most once per request",
                )
            elif name not in outcomes:
                try:
                    await _kafka_checked(conn, alteration)
                except BrokerError as refused:
                    outcomes[name] = refused
                else:
                    outcomes[name], accepted[name] = None, alteration
        # By name, not as named: two requests naming the same users in other orders lock their rows
        # in one order, and so cannot deadlock.
        for name, alteration in sorted(accepted.items()):
            try:
                if alteration.salted_password is None:
                    await _delete(conn, actor, name, alteration.mechanism)
                else:
                    await _upsert(conn, actor, _from_salted_password(alteration, now))
            except BrokerError as refused:
                outcomes[name] = refused
    return outcomes


async def set_password(
    pool: asyncpg.Pool, actor: Actor, name: str, mechanism: str, password: str, iterations: int
) -> None:
    """HTTP's: sets the principal's credential for `mechanism` from a password, with a new random
    salt, salted as Kafka's clients salt it (its ScramFormatter, librdkafka, kafka-python, aiokafka:
    PBKDF2 of the password's UTF-8 bytes, no SASLprep): a password SASLprep would change (a
    non-ASCII space, a character NFKC rewrites) must authenticate the clients that type it."""
    _check_mechanism(mechanism)
    _check_iterations(iterations)
    if not password or len(password) > MAX_PASSWORD_CHARS:
        raise ScramCredentialRefused(
            CredentialRefusal.UNACCEPTABLE,
            f"a password of {len(password)} characters: expected 1 to {MAX_PASSWORD_CHARS}",
        )
    salt = secrets.token_bytes(SALT_BYTES)
    # PBKDF2 of up to 16384 iterations: off the event loop.
    salted_password = await asyncio.to_thread(_salted, mechanism, password, salt, iterations)
    credential = _from_salted_password(ScramAlteration(name, mechanism, iterations, salt, salted_password), now_ms())
    async with pool.acquire() as conn, conn.transaction():
        await _upsert(conn, actor, credential)


async def delete_credential(pool: asyncpg.Pool, actor: Actor, name: str, mechanism: str) -> None:
    """HTTP's: NOT_FOUND (no such principal or credential) once the standby has it
    (security_admin.removed_or_refused: the retry of a deletion whose answer was a retriable error)."""
    _check_mechanism(mechanism)

    async def remove(conn: asyncpg.Connection) -> BrokerError | None:
        if await principals.get_principal(conn, name) is None:
            return _missing_principal(name)
        try:
            await _delete(conn, actor, name, mechanism)
        except ScramCredentialRefused as refused:
            return refused
        return None

    await removed_or_refused(pool, remove)


async def describe_credentials(pool: asyncpg.Pool, names: list[str] | None) -> list[ScramCredentialInfo]:
    """The credentials (mechanism and iterations, no key) of the named principals, None: of all."""
    async with pool.acquire() as conn:
        return await stored.describe(conn, names)


async def list_credentials(pool: asyncpg.Pool, name: str) -> list[ScramCredentialInfo]:
    """HTTP's: the principal's credentials; NOT_FOUND for a principal that does not exist (an empty
    list would read as a principal without credentials)."""
    async with pool.acquire() as conn, conn.transaction():
        if await principals.get_principal(conn, name) is None:
            raise _missing_principal(name)
        return await stored.describe(conn, [name])


async def credential(pool: asyncpg.Pool, name: str, mechanism: str) -> ScramCredentialRow | None:
    """What the SASL exchange checks a client's proof against; None for a principal without one."""
    async with pool.acquire() as conn:
        return await stored.find(conn, name, mechanism)


async def authenticated(pool: asyncpg.Pool, name: str, mechanism: str, stored_key: bytes) -> Principal | None:
    """The principal a SCRAM exchange authenticated, with its ACL rules, while the credential it
    authenticated with is unchanged; None once deleted or changed, or the principal deleted."""
    async with pool.acquire() as conn:
        found = await stored.authenticated(conn, name, mechanism, stored_key)
    return None if found is None else principal_from(*found)


async def authenticate_password(pool: asyncpg.Pool, name: str, password: str) -> PasswordAuthentication | None:
    """SASL/PLAIN's rule: `password` is one of the principal's API keys or the password one of its
    SCRAM credentials (either mechanism) was set from; None when it is neither, or the principal
    does not exist. The key is tried first (one hash); the credentials cost PBKDF2 at their
    iterations each (up to MAX_ITERATIONS), computed off the event loop."""
    principal = await security_admin.authenticate(pool, password)
    if principal is not None and principal.name == name:
        return PasswordAuthentication(principal, None)
    async with pool.acquire() as conn:
        credentials = await stored.find_all(conn, name)
    if not credentials:
        return None
    matched = await asyncio.to_thread(_first_derived_from, password, credentials)
    if matched is None:
        return None
    # Read again with its ACL rules, as a SCRAM exchange's later requests read it: None if the
    # credential changed or went while PBKDF2 ran.
    principal = await authenticated(pool, name, matched.mechanism, matched.stored_key)
    return None if principal is None else PasswordAuthentication(principal, matched)
