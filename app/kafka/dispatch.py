"""From a request frame to its response frame: the API's handler by key (api_table.py's versions),
with Kafka's answers to what it cannot serve: an ApiVersions request of a version it does not know
gets v0's layout with UNSUPPORTED_VERSION (so the client can retry with one it knows); any other
API or version it does not serve, or a request that does not parse, closes the connection
(MalformedRequest), as Kafka does; so does any request but ApiVersions and SASL's before a
connection authenticates on a server with auth required (sasl.py)."""

from __future__ import annotations

from collections.abc import Awaitable

from app.kafka import api_table
from app.kafka.context import RequestContext
from app.kafka.frames import MalformedRequest, encode_response, parse_request, peek_header
from app.kafka.handlers import (
    acls,
    admin,
    fetch,
    group_offsets,
    groups,
    metadata,
    offsets,
    produce,
    producers,
    sasl,
    scram,
    transaction_admin,
    transactions,
    versions,
)
from app.kafka.request_metrics import CountedRequest
from app.kafka.sasl import SaslSession

# Every API served but Produce, which is submitted now and answered later (`submit`).
HANDLERS = {
    api_table.FETCH: fetch.handle,
    api_table.LIST_OFFSETS: offsets.handle,
    api_table.METADATA: metadata.handle,
    api_table.DESCRIBE_CLUSTER: metadata.describe_cluster,
    api_table.DESCRIBE_TOPIC_PARTITIONS: metadata.describe_topic_partitions,
    api_table.API_VERSIONS: versions.handle,
    api_table.INIT_PRODUCER_ID: producers.handle,
    api_table.OFFSET_COMMIT: group_offsets.offset_commit,
    api_table.OFFSET_FETCH: group_offsets.offset_fetch,
    api_table.OFFSET_DELETE: group_offsets.offset_delete,
    api_table.FIND_COORDINATOR: groups.find_coordinator,
    api_table.JOIN_GROUP: groups.join_group,
    api_table.HEARTBEAT: groups.heartbeat,
    api_table.LEAVE_GROUP: groups.leave_group,
    api_table.SYNC_GROUP: groups.sync_group,
    api_table.DESCRIBE_GROUPS: groups.describe_groups,
    api_table.LIST_GROUPS: groups.list_groups,
    api_table.DELETE_GROUPS: groups.delete_groups,
    api_table.CONSUMER_GROUP_HEARTBEAT: groups.consumer_group_heartbeat,
    api_table.CONSUMER_GROUP_DESCRIBE: groups.consumer_group_describe,
    api_table.DESCRIBE_ACLS: acls.describe_acls,
    api_table.CREATE_ACLS: acls.create_acls,
    api_table.DELETE_ACLS: acls.delete_acls,
    api_table.CREATE_TOPICS: admin.create_topics,
    api_table.DELETE_TOPICS: admin.delete_topics,
    api_table.DELETE_RECORDS: admin.delete_records,
    api_table.DESCRIBE_CONFIGS: admin.describe_configs,
    api_table.ALTER_CONFIGS: admin.alter_configs,
    api_table.CREATE_PARTITIONS: admin.create_partitions,
    api_table.ELECT_LEADERS: admin.elect_leaders,
    api_table.DESCRIBE_LOG_DIRS: admin.describe_log_dirs,
    api_table.ALTER_REPLICA_LOG_DIRS: admin.alter_replica_log_dirs,
    api_table.ALTER_PARTITION_REASSIGNMENTS: admin.alter_partition_reassignments,
    api_table.LIST_PARTITION_REASSIGNMENTS: admin.list_partition_reassignments,
    api_table.INCREMENTAL_ALTER_CONFIGS: admin.incremental_alter_configs,
    api_table.ADD_PARTITIONS_TO_TXN: transactions.add_partitions,
    api_table.ADD_OFFSETS_TO_TXN: transactions.add_offsets,
    api_table.END_TXN: transactions.end_txn,
    api_table.TXN_OFFSET_COMMIT: transactions.txn_offset_commit,
    api_table.SASL_HANDSHAKE: sasl.handshake,
    api_table.SASL_AUTHENTICATE: sasl.authenticate,
    api_table.DESCRIBE_USER_SCRAM_CREDENTIALS: scram.describe_user_scram_credentials,
    api_table.ALTER_USER_SCRAM_CREDENTIALS: scram.alter_user_scram_credentials,
    api_table.DESCRIBE_PRODUCERS: transaction_admin.describe_producers,
    api_table.DESCRIBE_TRANSACTIONS: transaction_admin.describe_transactions,
    api_table.LIST_TRANSACTIONS: transaction_admin.list_transactions,
}


async def answer(
    frame: bytes,
    calls,
    session: SaslSession,
    advertised: tuple[str, int, str],
    client_host: str = "",
    read_ahead: object = None,
) -> bytes | None:
    """The response frame, or None when none is to be sent (Produce with acks=0). Raises
    MalformedRequest when the connection must be closed (and `session.closing` is True once it must
    be closed after this response). `read_ahead`: the connection's, for Fetch."""
    return await (await submit(frame, calls, session, advertised, client_host, read_ahead))


def pipelined(frame: bytes, session: SaslSession) -> bool:
    """True for a request `submit` queues for a write batch, whose answer the connection may wait for
    while it reads its next requests (listener.py): a Produce."""
    return not session.awaits_unframed_token and peek_header(frame)[0] == api_table.PRODUCE


async def submit(
    frame: bytes,
    calls,
    session: SaslSession,
    advertised: tuple[str, int, str],
    client_host: str = "",
    read_ahead: object = None,
) -> Awaitable[bytes | None]:
    """`answer`, submitted now and answered later: what is returned is the response frame (None: none
    to send). Before this returns, the frame is parsed, the principal read again, and a Produce's
    batches are checked, authorized and queued for a write batch: listener.py relies on it to keep a
    connection's pipelined Produce requests in order. Raises MalformedRequest as `answer` does."""
    if session.awaits_unframed_token:
        return _done(await session.unframed_token(frame))
    api_key, api_version, correlation_id = peek_header(frame)
    supported = api_table.SUPPORTED_VERSIONS.get(api_key)
    if supported is None:
        raise MalformedRequest(f"api key {api_key} is not served by this broker (see ApiVersions)")
    counted = CountedRequest(calls.count_request, api_key)
    if api_version not in supported:
        if api_key == api_table.API_VERSIONS:
            return _framed(api_key, correlation_id, _done(versions.unsupported_version()), counted)
        counted.failed(None)
        raise MalformedRequest(
            f"api key {api_key} version {api_version} is not served: expected {supported.start} to {supported.stop - 1}"
        )
    try:
        response = await _dispatched(frame, calls, session, advertised, client_host, read_ahead, supported)
    except BaseException as error:
        counted.failed(error)
        raise
    return _framed(api_key, correlation_id, response, counted)


async def _dispatched(
    frame: bytes,
    calls,
    session: SaslSession,
    advertised: tuple[str, int, str],
    client_host: str,
    read_ahead: object,
    supported: range,
) -> Awaitable[object | None]:
    """The handler's answer to come, once the frame is parsed and (a Produce) queued (`submit`)."""
    api_key, api_version, _ = peek_header(frame)
    session.admit(api_key)
    if api_key != api_table.PRODUCE and len(frame) > calls.settings.kafka_max_other_request_bytes:
        # Refused before it is parsed: its entries cost the event loop a Python step each, all the
        # other connections of the worker waiting (the setting's description).
        raise MalformedRequest(
            f"a request of api key {api_key} of {len(frame)} bytes: expected at most "
            f"{calls.settings.kafka_max_other_request_bytes} (kafka_max_other_request_bytes; only Produce "
            f"may reach kafka_max_request_bytes)"
        )
    request = parse_request(frame, supported)
    context = RequestContext(
        calls,
        await session.principal(),
        advertised[0],
        advertised[1],
        api_version,
        request.client_id or "",
        client_host,
        session.peer,
        session,
        read_ahead,
        advertised[2],
    )
    if api_key == api_table.PRODUCE:
        return await produce.submit(context, request.body)
    return HANDLERS[api_key](context, request.body)


async def _framed(
    api_key: int, correlation_id: int, response: Awaitable[object | None], counted: CountedRequest
) -> bytes | None:
    """The response's frame; the request counted in the node's metrics with the errors its answer
    carries, or as one that failed (CountedRequest.failed)."""
    try:
        body = await response
    except BaseException as error:
        counted.failed(error)
        raise
    counted.answered(body)
    return None if body is None else encode_response(api_key, correlation_id, body)


async def _done(result: object | None) -> object | None:
    return result
