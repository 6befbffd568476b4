"""Authorization in Kafka's ACL model (AclAuthorizer): a principal may perform an operation on a
resource when a matching ALLOW rule exists and no matching DENY rule does (deny wins); super users
may do everything. Pure: the rules are loaded with the principal, once per request.

Rules match a resource by type and by name, LITERAL (equal, or the wildcard "*") or PREFIXED.
The principal "*" matches every principal. As in Kafka, ALLOW on Read, Write, Delete or Alter
implies Describe, and the operation All matches every operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from app.errors import BrokerError, ErrorCode

WILDCARD = "*"
CLUSTER_RESOURCE = "txbroker-cluster"


class ResourceType(StrEnum):
    TOPIC = "Topic"
    GROUP = "Group"
    TRANSACTIONAL_ID = "TransactionalId"
    CLUSTER = "Cluster"


class PatternType(StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Operation(StrEnum):
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    DESCRIBE = "Describe"
    ALTER = "Alter"
    ALL = "All"


class Permission(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


# Kafka: being allowed any of these implies being allowed to Describe the resource.
IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})

DENIED_CODES = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}


@dataclass(frozen=True, slots=True)
class Acl:
    principal: str
    resource_type: ResourceType
    pattern_type: PatternType
    resource_name: str
    operation: Operation
    permission: Permission
    acl_id: int | None = None

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        return self.resource_type == resource_type and pattern_applies(self.pattern_type, self.resource_name, name)


def pattern_applies(pattern_type: str, pattern: str, name: str) -> bool:
    """Whether a rule's resource pattern applies to the resource `name`."""
    if pattern_type == PatternType.PREFIXED:
        return name.startswith(pattern)
    return pattern in (WILDCARD, name)


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    is_super_user: bool = False
    acls: tuple[Acl, ...] = field(default=(), repr=False)


# With auth off (the local default) every caller is this principal, allowed everything.
ANONYMOUS = Principal("ANONYMOUS", is_super_user=True)


def is_allowed(principal: Principal, operation: Operation, resource_type: ResourceType, name: str) -> bool:
    if principal.is_super_user:
        return True
    matching = [acl for acl in principal.acls if acl.matches_resource(resource_type, name)]
    if any(acl.permission == Permission.DENY and acl.operation in (operation, Operation.ALL) for acl in matching):
        return False
    return any(
        acl.permission == Permission.ALLOW
        and (
            acl.operation in (operation, Operation.ALL)
            or (operation == Operation.DESCRIBE and acl.operation in IMPLIES_DESCRIBE)
        )
        for acl in matching
    )


def _denies_all_of(deny: Acl, allow: Acl) -> bool:
    """Whether a rule denying leaves nothing of what a rule allowing allows (Kafka's dominant deny):
    a literal allow is denied by a rule denying its name; a prefixed one only by a rule denying a
    prefix of its prefix, or every name (a literal rule denying the prefix itself, as a name, leaves
    it the longer names)."""
    if not deny.matches_resource(allow.resource_type, allow.resource_name):
        return False
    return (
        allow.pattern_type == PatternType.LITERAL
        or deny.pattern_type == PatternType.PREFIXED
        or deny.resource_name == WILDCARD
    )


def is_allowed_on_some(principal: Principal, operation: Operation, resource_type: ResourceType) -> bool:
    """Whether the principal may do `operation` on at least one resource of the type, Kafka's
    authorizeByResourceType (InitProducerId's Write on any topic): some rule allows it that no rule
    denying it wholly cancels (_denies_all_of)."""
    if principal.is_super_user:
        return True
    rules = [
        acl
        for acl in principal.acls
        if acl.resource_type == resource_type and acl.operation in (operation, Operation.ALL)
    ]
    denying = [acl for acl in rules if acl.permission == Permission.DENY]
    return any(
        not any(_denies_all_of(deny, allow) for deny in denying)
        for allow in rules
        if allow.permission == Permission.ALLOW
    )


def authorize(principal: Principal, operation: Operation, resource_type: ResourceType, name: str) -> None:
    """Raises the resource type's *_AUTHORIZATION_FAILED (403) unless allowed."""
    if not is_allowed(principal, operation, resource_type, name):
        raise BrokerError(
            DENIED_CODES[resource_type],
            f"principal {principal.name!r} may not {operation} {resource_type} {name!r}: ask an administrator for an "
            f"ACL (txbroker acls add --principal {principal.name} --resource-type {resource_type} "
            f"--resource-name {name} --operation {operation})",
        )


def principal_from(row, acl_rows) -> Principal:
    """The principal and its rules as stored (app/storage/security/principals.py)."""
    return Principal(
        row.name,
        row.is_super_user,
        tuple(
            Acl(
                r.principal,
                ResourceType(r.resource_type),
                PatternType(r.pattern_type),
                r.resource_name,
                Operation(r.operation),
                Permission(r.permission),
                r.acl_id,
            )
            for r in acl_rows
        ),
    )
