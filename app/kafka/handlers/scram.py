"""Kafka's SCRAM credential APIs (KIP-554): AlterUserScramCredentials (kafka-configs --alter
--add-config 'SCRAM-SHA-256=[password=...]', the admin clients' alter_user_scram_credentials) and
DescribeUserScramCredentials, on the credentials HTTP's /v1/principals/{name}/scram-credentials
manages: one set (app/coordinator/scram_credentials.py).

As Kafka's controller answers them: one result per user named; an unknown mechanism is
UNSUPPORTED_SASL_MECHANISM, an empty user or iterations outside 4096..16384 UNACCEPTABLE_CREDENTIAL,
the deletion of a credential that does not exist RESOURCE_NOT_FOUND; a user named again (whatever
the mechanisms) after a change that passed those checks is refused DUPLICATE_RESOURCE, that change
with it, one named again after a refusal keeps that refusal (the deletions are read first); the
others are altered together.
txbroker's own rule: a SCRAM user is a principal, so an upsertion for a name that is no principal
is RESOURCE_NOT_FOUND, naming it. Describing all users (no names, or none) lists those with a
credential; a named user without one is RESOURCE_NOT_FOUND, one named twice DUPLICATE_RESOURCE.
Alter needs Alter on the Cluster, Describe needs Describe on it (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError
from app.kafka import api_table
from app.kafka.broker_calls import ScramAlteration, ScramCredentialRefusal, ScramCredentialRefused
from app.kafka.context import RequestContext
from app.kafka.error_codes import closed_when_unconfirmed, error_message, kafka_error
from app.kafka.frames import build, response_module

NO_THROTTLE = datetime.timedelta(0)
# Kafka's codes of its SCRAM mechanisms (org.apache.kafka.clients.admin.ScramMechanism); 0 is UNKNOWN.
MECHANISM_NAMES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MECHANISM_CODES = {name: code for code, name in MECHANISM_NAMES.items()}
_REFUSALS = {
    ScramCredentialRefusal.UNACCEPTABLE: KafkaError.unacceptable_credential,
    ScramCredentialRefusal.UNSUPPORTED_MECHANISM: KafkaError.unsupported_sasl_mechanism,
    ScramCredentialRefusal.NOT_FOUND: KafkaError.resource_not_found,
    ScramCredentialRefusal.DUPLICATE: KafkaError.duplicate_resource,
}


def _mechanism_name(code: int) -> str:
    """Kafka's name of a mechanism code; a description of an unknown one, which the core refuses."""
    return MECHANISM_NAMES.get(code, f"of code {code}")


def _error_code(error: BrokerError | None) -> KafkaError:
    if isinstance(error, ScramCredentialRefused):
        return _REFUSALS[error.refusal]
    return kafka_error(error)


async def alter_user_scram_credentials(context: RequestContext, request) -> object:
    module = response_module(api_table.ALTER_USER_SCRAM_CREDENTIALS, context.api_version)
    alterations = [  # in the order Kafka's controller reads them: the deletions first
        *(ScramAlteration(deletion.name, _mechanism_name(deletion.mechanism)) for deletion in request.deletions),
        *(
            ScramAlteration(
                upsertion.name,
                _mechanism_name(upsertion.mechanism),
                upsertion.iterations,
                upsertion.salt,
                upsertion.salted_password,
            )
            for upsertion in request.upsertions
        ),
    ]
    try:
        outcomes = await context.calls.scram.alter(context.principal, context.client_address, alterations)
    except BrokerError as refused:  # not authorized: every user is refused alike
        outcomes = dict.fromkeys((alteration.principal for alteration in alterations), refused)
    results = tuple(
        build(
            module,
            "AlterUserScramCredentialsResult",
            user=name,
            error_code=_error_code(outcome),
            error_message=error_message(outcome),
        )
        for name, outcome in outcomes.items()
    )
    return build(module, "AlterUserScramCredentialsResponse", throttle_time=NO_THROTTLE, results=results)


async def describe_user_scram_credentials(context: RequestContext, request) -> object:
    module = response_module(api_table.DESCRIBE_USER_SCRAM_CREDENTIALS, context.api_version)
    named = [user.name for user in request.users or ()]
    refused, results = None, ()
    try:
        with closed_when_unconfirmed("DescribeUserScramCredentials"):  # its error code is not retried
            found = await context.calls.scram.describe(context.principal, named or None)
    except BrokerError as error:  # not authorized: the whole request is refused, as Kafka's
        refused = error
    else:
        results = _described(module, named, found)
    return build(
        module,
        "DescribeUserScramCredentialsResponse",
        throttle_time=NO_THROTTLE,
        error_code=kafka_error(refused),
        error_message=error_message(refused),
        results=results,
    )


def _described(module, named: list[str], found) -> tuple:
    """One result per user named (none named: per user with a credential)."""
    credentials: dict[str, list] = {}
    for info in found:
        credentials.setdefault(info.principal, []).append(
            build(module, "CredentialInfo", mechanism=MECHANISM_CODES[info.mechanism], iterations=info.iterations)
        )
    results = []
    for name in dict.fromkeys(named) if named else credentials:
        error, message = KafkaError.none, None
        if named.count(name) > 1:
            error = KafkaError.duplicate_resource
            message = f"user {name!r} named more than once in one request: describe each user at most once per request"
        elif name not in credentials:
            error = KafkaError.resource_not_found
            message = (
                f"user {name!r} has no SCRAM credential: set one with AlterUserScramCredentials "
                f"or PUT /v1/principals/{{name}}/scram-credentials/{{mechanism}}"
            )
        results.append(
            build(
                module,
                "DescribeUserScramCredentialsResult",
                user=name,
                error_code=error,
                error_message=message,
                credential_infos=tuple(credentials.get(name, ())) if error == KafkaError.none else (),
            )
        )
    return tuple(results)
