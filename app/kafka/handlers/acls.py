"""Kafka's ACL admin APIs, CreateAcls, DescribeAcls and DeleteAcls (kafka-acls, the admin
clients' create_acls / describe_acls / delete_acls), on the rules HTTP's /v1/acls manages: one set.

Kafka's bindings as txbroker's rules: the principal "User:NAME" is the principal NAME ("User:*"
every principal); rules apply from every host, so a creation's host must be "*" and rules are
described with it; Kafka's Cluster resource "kafka-cluster" is txbroker's one Cluster resource; the
resource types, pattern types, operations and permissions txbroker has are mapped by name, and a
creation with any other is refused (INVALID_REQUEST, saying what txbroker has). In a filter, ANY
(or a null name, principal or host) matches every value, MATCH selects the rules that apply to the
named resource, and a value no rule can have (another host or principal type, an operation
txbroker lacks) matches nothing, as in Kafka.
"""

from __future__ import annotations

import datetime
import itertools

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError, ErrorCode
from app.kafka import api_table
from app.kafka.broker_calls import (
    ACL_FILTER_MATCH,
    CLUSTER_RESOURCE,
    AclFilter,
    AclOperation,
    AclPatternType,
    AclPermission,
    AclResourceType,
    AclRule,
)
from app.kafka.context import RequestContext
from app.kafka.error_codes import closed_when_unconfirmed, error_message, kafka_error
from app.kafka.frames import build, response_module

NO_THROTTLE = datetime.timedelta(0)
USER_PRINCIPAL_TYPE = "User:"
EVERY_HOST = "*"
KAFKA_CLUSTER_NAME = "kafka-cluster"
# Kafka's ANY in every enum of an ACL filter, and UNKNOWN (what Kafka reads an unknown code as).
ANY = 1
UNKNOWN = 0

# Kafka's codes (org.apache.kafka.common.resource.ResourceType, PatternType, acl.AclOperation,
# AclPermissionType) of what txbroker's rules have, and Kafka's names of the rest.
RESOURCE_TYPES = {
    2: AclResourceType.TOPIC,
    3: AclResourceType.GROUP,
    4: AclResourceType.CLUSTER,
    5: AclResourceType.TRANSACTIONAL_ID,
}
OTHER_RESOURCE_TYPES = {6: "DELEGATION_TOKEN", 7: "USER"}
PATTERN_TYPES = {3: AclPatternType.LITERAL, 4: AclPatternType.PREFIXED}
FILTER_PATTERN_TYPES = {2: ACL_FILTER_MATCH}
OPERATIONS = {
    2: AclOperation.ALL,
    3: AclOperation.READ,
    4: AclOperation.WRITE,
    5: AclOperation.CREATE,
    6: AclOperation.DELETE,
    7: AclOperation.ALTER,
    8: AclOperation.DESCRIBE,
}
OTHER_OPERATIONS = {
    9: "CLUSTER_ACTION",
    10: "DESCRIBE_CONFIGS",
    11: "ALTER_CONFIGS",
    12: "IDEMPOTENT_WRITE",
    13: "CREATE_TOKENS",
    14: "DESCRIBE_TOKENS",
    15: "TWO_PHASE_COMMIT",
}
PERMISSIONS = {2: AclPermission.DENY, 3: AclPermission.ALLOW}
# In every enum: a filter's values, never a rule's.
FILTERS_ONLY = {ANY: "ANY (a filter's)", 2: "MATCH (a filter's)"}


def _code_of(table: dict, name: str) -> int:
    return next(code for code, value in table.items() if value == name)


class _MatchesNothing(Exception):
    """A filter value no rule can have."""


def _invalid(message: str) -> BrokerError:
    return BrokerError(ErrorCode.INVALID_REQUEST, message)


def _kafka_names(table: dict) -> str:
    return ", ".join(getattr(value, "name", value.upper()) for value in table.values())


def _one_of(table: dict, code: int, others: dict, what: str):
    """txbroker's value for a creation's Kafka code; raises INVALID_REQUEST naming the code and what
    txbroker's rules have."""
    value = table.get(code)
    if value is None:
        raise _invalid(f"{what} {others.get(code, f'code {code}')}: txbroker's rules have {_kafka_names(table)}")
    return value


def _rule_of(creation) -> AclRule:
    """A CreateAcls creation as txbroker's rule; raises INVALID_REQUEST for what txbroker's rules
    cannot hold."""
    resource_type = _one_of(RESOURCE_TYPES, creation.resource_type, OTHER_RESOURCE_TYPES, "resource type")
    pattern_type = _one_of(PATTERN_TYPES, creation.resource_pattern_type, FILTERS_ONLY, "pattern type")
    operation = _one_of(OPERATIONS, creation.operation, OTHER_OPERATIONS, "operation")
    permission = _one_of(PERMISSIONS, creation.permission_type, FILTERS_ONLY, "permission type")
    if not creation.principal.startswith(USER_PRINCIPAL_TYPE):
        raise _invalid(
            f"principal {creation.principal!r}: txbroker's principals are users, expected User:NAME (User:* for all)"
        )
    if creation.host != EVERY_HOST:
        raise _invalid(
            f"host {creation.host!r}: txbroker's rules apply from every host, expected {EVERY_HOST!r}; "
            "leave the host out (kafka-acls' default)"
        )
    name = _resource_name(resource_type, creation.resource_name)
    principal = creation.principal.removeprefix(USER_PRINCIPAL_TYPE)
    return AclRule(0, principal, resource_type, pattern_type, name, operation, permission)


def _resource_name(resource_type: str | None, kafka_name: str | None) -> str | None:
    """A resource name of Kafka's as txbroker's: Kafka's Cluster resource is txbroker's one Cluster resource."""
    if resource_type == AclResourceType.CLUSTER and kafka_name == KAFKA_CLUSTER_NAME:
        return CLUSTER_RESOURCE
    return kafka_name


def _filtered(code: int, table: dict, known: dict, what: str):
    """A filter's enum value as txbroker's name, None for ANY; raises _MatchesNothing for one
    Kafka has and txbroker's rules never do, INVALID_REQUEST for UNKNOWN or a code Kafka lacks."""
    if code == ANY:
        return None
    if code in table:
        return table[code]
    if code in known:
        raise _MatchesNothing
    raise _invalid(f"{what} code {code} in an ACL filter: expected ANY or one of {_kafka_names(table)}")


def _filter_of(request) -> AclFilter | None:
    """A DescribeAcls request or DeleteAcls filter as txbroker's; None when no rule can match it.
    Raises INVALID_REQUEST for an unknown code."""
    try:
        resource_type = _filtered(request.resource_type_filter, RESOURCE_TYPES, OTHER_RESOURCE_TYPES, "resource type")
        pattern_type = _filtered(
            request.pattern_type_filter, {**PATTERN_TYPES, **FILTER_PATTERN_TYPES}, {}, "pattern type"
        )
        operation = _filtered(request.operation, OPERATIONS, OTHER_OPERATIONS, "operation")
        permission = _filtered(request.permission_type, PERMISSIONS, {}, "permission type")
    except _MatchesNothing:
        return None
    principal = request.principal_filter
    if principal is not None and not principal.startswith(USER_PRINCIPAL_TYPE):
        return None
    if request.host_filter not in (None, EVERY_HOST):
        return None
    return AclFilter(
        resource_type,
        pattern_type,
        _resource_name(resource_type, request.resource_name_filter),
        None if principal is None else principal.removeprefix(USER_PRINCIPAL_TYPE),
        operation,
        permission,
    )


def _binding(rule: AclRule) -> dict:
    """A rule's fields as Kafka's responses name them."""
    resource_type = AclResourceType(rule.resource_type)
    cluster = resource_type == AclResourceType.CLUSTER and rule.resource_name == CLUSTER_RESOURCE
    return dict(
        resource_type=_code_of(RESOURCE_TYPES, resource_type),
        resource_name=KAFKA_CLUSTER_NAME if cluster else rule.resource_name,
        pattern_type=_code_of(PATTERN_TYPES, rule.pattern_type),
        principal=USER_PRINCIPAL_TYPE + rule.principal,
        host=EVERY_HOST,
        operation=_code_of(OPERATIONS, rule.operation),
        permission_type=_code_of(PERMISSIONS, rule.permission),
    )


def _parsed(parse, item):
    """`parse(item)`, or the BrokerError it raised (the item's refusal)."""
    try:
        return parse(item)
    except BrokerError as refused:
        return refused


async def _answers(parsed: list, call) -> list:
    """For each item parsed, in order: its refusal, or what `call` (given the accepted items at
    once: one PostgreSQL transaction) answered it; a refusal of the whole call (authorization)
    answers every accepted item."""
    accepted = [item for item in parsed if not isinstance(item, BrokerError)]
    try:
        answered = iter(await call(accepted))
    except BrokerError as refused:
        answered = itertools.repeat(refused)
    return [item if isinstance(item, BrokerError) else next(answered) for item in parsed]


async def create_acls(context: RequestContext, request) -> object:
    module = response_module(api_table.CREATE_ACLS, context.api_version)
    errors = await _answers(
        [_parsed(_rule_of, creation) for creation in request.creations],
        lambda rules: context.calls.acls.create(context.principal, context.client_address, rules),
    )
    results = tuple(
        build(module, "AclCreationResult", error_code=kafka_error(error), error_message=error_message(error))
        for error in errors
    )
    return build(module, "CreateAclsResponse", throttle_time=NO_THROTTLE, results=results)


async def describe_acls(context: RequestContext, request) -> object:
    module = response_module(api_table.DESCRIBE_ACLS, context.api_version)
    try:
        with closed_when_unconfirmed("DescribeAcls"):  # its error code is handed to the caller, not retried
            rules = await context.calls.acls.describe(context.principal, _filter_of(request))
    except BrokerError as error:
        return build(
            module,
            "DescribeAclsResponse",
            throttle_time=NO_THROTTLE,
            error_code=kafka_error(error),
            error_message=error.message,
            resources=(),
        )
    resources: dict[tuple, list] = {}
    for rule in rules:
        binding = _binding(rule)
        resource = (binding.pop("resource_type"), binding.pop("resource_name"), binding.pop("pattern_type"))
        resources.setdefault(resource, []).append(build(module, "AclDescription", **binding))
    return build(
        module,
        "DescribeAclsResponse",
        throttle_time=NO_THROTTLE,
        error_code=KafkaError.none,
        error_message=None,
        resources=tuple(
            build(
                module,
                "DescribeAclsResource",
                resource_type=resource_type,
                resource_name=resource_name,
                pattern_type=pattern_type,
                acls=tuple(acls),
            )
            for (resource_type, resource_name, pattern_type), acls in resources.items()
        ),
    )


async def delete_acls(context: RequestContext, request) -> object:
    module = response_module(api_table.DELETE_ACLS, context.api_version)
    answers = await _answers(
        [_parsed(_filter_of, acl_filter) for acl_filter in request.filters],
        lambda acl_filters: context.calls.acls.delete(context.principal, context.client_address, acl_filters),
    )
    results = []
    for answer in answers:
        error, deleted = (answer, []) if isinstance(answer, BrokerError) else (None, answer)
        matching = tuple(
            build(module, "DeleteAclsMatchingAcl", error_code=KafkaError.none, error_message=None, **_binding(rule))
            for rule in deleted
        )
        results.append(
            build(
                module,
                "DeleteAclsFilterResult",
                error_code=kafka_error(error),
                error_message=error_message(error),
                matching_acls=matching,
            )
        )
    return build(module, "DeleteAclsResponse", throttle_time=NO_THROTTLE, filter_results=tuple(results))
