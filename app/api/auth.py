"""Who is calling: the principal behind `Authorization: Bearer <token>`, resolved on every request.

With `auth` off (the local default, on loopback only) every caller is ANONYMOUS, a super user. With
`auth` required, a missing, malformed, unknown or revoked token is 401 UNAUTHORIZED.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.coordinator import security_admin
from app.coordinator.audit import Actor, AuditSource
from app.coordinator.authorizer import ANONYMOUS, Principal
from app.errors import BrokerError, ErrorCode

AUTH_REQUIRED = "required"


def _unauthorized(what: str) -> BrokerError:
    return BrokerError(
        ErrorCode.UNAUTHORIZED,
        f"{what}: this server requires credentials; send 'Authorization: Bearer <API key>' "
        f"(an administrator creates keys with `txbroker principals add-key NAME` or POST /v1/principals/NAME/keys)",
    )


def http_actor(principal: Principal) -> Actor:
    """Who makes a change over HTTP: what its audit entry names."""
    return Actor(principal.name, AuditSource.HTTP)


async def token_principal(request: Request, token: str) -> Principal | None:
    return await security_admin.authenticate(request.app.state.pool, token)


async def current_principal(request: Request) -> Principal:
    if request.app.state.settings.auth != AUTH_REQUIRED:
        return ANONYMOUS
    header = request.headers.get("authorization")
    if header is None:
        raise _unauthorized("no Authorization header was sent")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized(f"the Authorization header is not 'Bearer <token>' (received scheme {scheme[:20]!r})")
    principal = await token_principal(request, token.strip())
    if principal is None:
        raise _unauthorized("the bearer token is unknown or revoked")
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]
