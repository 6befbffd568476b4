"""Principals, API keys, ACLs and the audit log. Every change needs Alter on the Cluster (super
users have it) and is written to the audit log with the principal who made it. Every listing is
answered once the synchronous standby has what it read (docs/operations-high-availability.md): a
revocation it lacks is brought back by a failover, which an operator who saw it gone would miss."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from app.api import schemas
from app.api.auth import ActorDep, PrincipalDep
from app.api.deps import READY, PoolDep, ReplicationBarrierDep
from app.api.json_route import OrjsonRoute
from app.api.responses import json_response
from app.coordinator import scram_credentials, security_admin
from app.coordinator.authorizer import CLUSTER_RESOURCE, Operation, ResourceType, authorize
from app.coordinator.confirmed_reads import reads_confirmed_by_the_standby
from app.coordinator.security_admin import AclRow

router = APIRouter(prefix="/v1", tags=["security"], dependencies=READY, route_class=OrjsonRoute)
ERRORS = {status: {"model": schemas.ErrorBody} for status in (400, 401, 403, 404, 409, 503)}


def _require(principal, operation: Operation) -> None:
    authorize(principal, operation, ResourceType.CLUSTER, CLUSTER_RESOURCE)


@router.get("/whoami")
async def whoami(principal: PrincipalDep):
    """The principal this request is authenticated as."""
    return json_response({"principal": principal.name, "super_user": principal.is_super_user})


@router.post("/principals", status_code=201, response_model=schemas.PrincipalOut, responses=ERRORS)
async def create_principal(body: schemas.PrincipalIn, pool: PoolDep, principal: PrincipalDep, actor: ActorDep):
    _require(principal, Operation.ALTER)
    now = await security_admin.create_principal(pool, actor, body.name, body.super_user)
    return json_response({"name": body.name, "super_user": body.super_user, "created_ms": now}, 201)


@router.get("/principals", response_model=schemas.PrincipalList, responses=ERRORS)
async def list_principals(pool: PoolDep, barrier: ReplicationBarrierDep, principal: PrincipalDep):
    _require(principal, Operation.DESCRIBE)
    async with reads_confirmed_by_the_standby(barrier, "the principals"):
        found = await security_admin.list_principals(pool)
    return json_response(
        {"principals": [{"name": p.name, "super_user": p.is_super_user, "created_ms": p.created_ms} for p in found]}
    )


@router.delete("/principals/{name}", status_code=204, responses=ERRORS)
async def delete_principal(name: schemas.IdentifierInPath, pool: PoolDep, principal: PrincipalDep, actor: ActorDep):
    """Deletes the principal with its keys and ACL rules."""
    _require(principal, Operation.ALTER)
    await security_admin.delete_principal(pool, actor, name)
    return Response(status_code=204)


@router.post("/principals/{name}/keys", status_code=201, response_model=schemas.ApiKeyCreated, responses=ERRORS)
async def add_key(name: schemas.IdentifierInPath, pool: PoolDep, principal: PrincipalDep, actor: ActorDep):
    """A new API key for the principal; the token is in this response only."""
    _require(principal, Operation.ALTER)
    key_id, token = await security_admin.add_key(pool, actor, name)
    return json_response({"key_id": key_id, "token": token}, 201)


@router.get("/principals/{name}/keys", response_model=schemas.ApiKeyList, responses=ERRORS)
async def list_keys(
    name: schemas.IdentifierInPath, pool: PoolDep, barrier: ReplicationBarrierDep, principal: PrincipalDep
):
    _require(principal, Operation.DESCRIBE)
    async with reads_confirmed_by_the_standby(barrier, f"the API keys of principal {name!r}"):
        found = await security_admin.list_keys(pool, name)
    return json_response(
        {"keys": [{"key_id": k.key_id, "created_ms": k.created_ms, "revoked_ms": k.revoked_ms} for k in found]}
    )


@router.delete("/principals/{name}/keys/{key_id}", status_code=204, responses=ERRORS)
async def revoke_key(
    name: schemas.IdentifierInPath,
    key_id: schemas.IdentifierInPath,
    pool: PoolDep,
    principal: PrincipalDep,
    actor: ActorDep,
):
    """Revokes the key: the next request with it is refused (no cache anywhere)."""
    _require(principal, Operation.ALTER)
    await security_admin.revoke_key(pool, actor, name, key_id)
    return Response(status_code=204)


@router.put("/principals/{name}/scram-credentials/{mechanism}", status_code=204, responses=ERRORS)
async def set_scram_credential(
    name: schemas.IdentifierInPath,
    mechanism: str,
    body: schemas.ScramCredentialIn,
    pool: PoolDep,
    principal: PrincipalDep,
    actor: ActorDep,
):
    """Sets (or replaces) the principal's SASL/SCRAM credential for the mechanism (SCRAM-SHA-256 or
    SCRAM-SHA-512) from a password, with a new random salt; the password is not stored. Kafka
    connections authenticated with the credential it replaces are closed at their next request."""
    _require(principal, Operation.ALTER)
    await scram_credentials.set_password(pool, actor, name, mechanism, body.password, body.iterations)
    return Response(status_code=204)


@router.delete("/principals/{name}/scram-credentials/{mechanism}", status_code=204, responses=ERRORS)
async def delete_scram_credential(
    name: schemas.IdentifierInPath, mechanism: str, pool: PoolDep, principal: PrincipalDep, actor: ActorDep
):
    """Deletes the credential: Kafka connections authenticated with it are closed at their next request."""
    _require(principal, Operation.ALTER)
    await scram_credentials.delete_credential(pool, actor, name, mechanism)
    return Response(status_code=204)


@router.get("/principals/{name}/scram-credentials", response_model=schemas.ScramCredentialList, responses=ERRORS)
async def list_scram_credentials(
    name: schemas.IdentifierInPath, pool: PoolDep, barrier: ReplicationBarrierDep, principal: PrincipalDep
):
    """The principal's SCRAM credentials: mechanism and iterations (no salt, no key)."""
    _require(principal, Operation.DESCRIBE)
    async with reads_confirmed_by_the_standby(barrier, f"the SCRAM credentials of principal {name!r}"):
        found = await scram_credentials.list_credentials(pool, name)
    return json_response(
        {
            "credentials": [
                {"mechanism": c.mechanism, "iterations": c.iterations, "updated_ms": c.updated_ms} for c in found
            ]
        }
    )


def _acl_body(acl: AclRow) -> dict:
    return {
        "acl_id": acl.acl_id,
        "principal": acl.principal,
        "resource_type": acl.resource_type,
        "pattern_type": acl.pattern_type,
        "resource_name": acl.resource_name,
        "operation": acl.operation,
        "permission": acl.permission,
    }


@router.post("/acls", status_code=201, response_model=schemas.AclOut, responses=ERRORS)
async def add_acl(body: schemas.AclIn, pool: PoolDep, principal: PrincipalDep, actor: ActorDep):
    """Adds a rule (idempotent: the same rule twice is one rule)."""
    _require(principal, Operation.ALTER)
    acl = await security_admin.add_acl(
        pool,
        actor,
        AclRow(
            0,
            body.principal,
            body.resource_type,
            body.pattern_type,
            body.resource_name,
            body.operation,
            body.permission,
        ),
    )
    return json_response(_acl_body(acl), 201)


@router.get("/acls", response_model=schemas.AclList, responses=ERRORS)
async def list_acls(
    pool: PoolDep,
    barrier: ReplicationBarrierDep,
    principal: PrincipalDep,
    principal_name: Annotated[str | None, Query(alias="principal")] = None,
    resource_type: str | None = None,
):
    _require(principal, Operation.DESCRIBE)
    async with reads_confirmed_by_the_standby(barrier, "the ACL rules"):
        found = await security_admin.list_acls(pool, principal_name, resource_type)
    return json_response({"acls": [_acl_body(acl) for acl in found]})


@router.delete("/acls/{acl_id}", status_code=204, responses=ERRORS)
async def remove_acl(
    acl_id: Annotated[int, Path(ge=0, le=schemas.INT64_MAX)], pool: PoolDep, principal: PrincipalDep, actor: ActorDep
):
    _require(principal, Operation.ALTER)
    await security_admin.remove_acl(pool, actor, acl_id)
    return Response(status_code=204)


@router.get("/audit", responses=ERRORS)
async def audit_log(
    pool: PoolDep,
    barrier: ReplicationBarrierDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=0, le=schemas.INT64_MAX, description="entries older than this id")] = None,
):
    """Administrative actions, newest first."""
    _require(principal, Operation.DESCRIBE)
    async with reads_confirmed_by_the_standby(barrier, "the audit log"):
        entries = await security_admin.audit_entries(pool, limit, before)
    return json_response(
        {
            "entries": [
                {
                    "entry_id": e.entry_id,
                    "timestamp_ms": e.timestamp_ms,
                    "principal": e.principal,
                    "action": e.action,
                    "resource": e.resource,
                    "details": e.details,
                    "source": e.source,
                    "client_address": e.client_address,
                }
                for e in entries
            ]
        }
    )
