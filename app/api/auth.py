"""Who is calling: the principal behind `Authorization: Bearer <token>`, resolved on every request.

With `auth` off (the local default, on loopback only) every caller is ANONYMOUS, a super user. With
`auth` required, a missing, malformed, unknown or revoked token is 401 UNAUTHORIZED.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.coordinator import security_admin
from app.coordinator.audit import Actor, AuditSource, client_address
from app.coordinator.authorizer import ANONYMOUS, Principal
from app.errors import BrokerError, ErrorCode
from app.settings import Settings

AUTH_REQUIRED = "required"


def _unauthorized(what: str) -> BrokerError:
    return BrokerError(
        ErrorCode.UNAUTHORIZED,
        f"{what}: this server requires credentials; send 'Authorization: Bearer <API key>' "
        f"(an administrator creates keys with `txbroker principals add-key NAME` or POST /v1/principals/NAME/keys)",
    )


def proxy_header_options(settings: Settings) -> dict:
    """uvicorn's options for proxy headers: X-Forwarded-For (the client's address) and
    X-Forwarded-Proto (the scheme) are believed from the peers of `trusted_proxies` only. Without
    the setting, from none: uvicorn's default believes them from 127.0.0.1 (or its
    FORWARDED_ALLOW_IPS variable), so any program on the node's machine could put any address in an
    audit entry. app/cli.py serves with these."""
    if settings.trusted_proxies is None:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": settings.trusted_proxies}


def request_client_address(request: Request) -> str | None:
    """The HTTP request's TCP peer as the audit log shows it (None: the server gave none, as an
    ASGI server over a Unix socket)."""
    return None if request.client is None else client_address(request.client.host, request.client.port)


def door_actor(principal: Principal, source: AuditSource, request: Request) -> Actor:
    """Who makes a change through a door served over HTTP (the API, the console): what its audit
    entry names."""
    return Actor(principal.name, source, request_client_address(request))


async def token_principal(request: Request, token: str, wait_for_connection_s: float | None = None) -> Principal | None:
    return await security_admin.authenticate(request.app.state.pool, token, wait_for_connection_s)


def presented_token(request: Request) -> str:
    """The request's bearer token; 401 UNAUTHORIZED when it sends none, or not as a bearer token."""
    header = request.headers.get("authorization")
    if header is None:
        raise _unauthorized("no Authorization header was sent")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized(f"the Authorization header is not 'Bearer <token>' (received scheme {scheme[:20]!r})")
    return token.strip()


def unknown_token() -> BrokerError:
    return _unauthorized("the bearer token is unknown or revoked")


async def current_principal(request: Request) -> Principal:
    if request.app.state.settings.auth != AUTH_REQUIRED:
        return ANONYMOUS
    principal = await token_principal(request, presented_token(request))
    if principal is None:
        raise unknown_token()
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]


async def current_actor(request: Request, principal: PrincipalDep) -> Actor:
    """Who makes a change over HTTP (the principal resolved once per request, as FastAPI caches it)."""
    return door_actor(principal, AuditSource.HTTP, request)


ActorDep = Annotated[Actor, Depends(current_actor)]
