"""KIP-664's transaction observability: ListTransactions (the ids this node coordinates, as a Kafka
broker lists them; state, producer id, duration and v2's transactional id pattern filters),
DescribeTransactions, DescribeProducers."""

from __future__ import annotations

import datetime
import logging

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError
from app.kafka import api_table
from app.kafka.broker_calls import InvalidIdPattern
from app.kafka.context import RequestContext
from app.kafka.error_codes import kafka_error
from app.kafka.frames import build, response_module
from app.kafka.handlers.groups import LIST_UNCONFIRMED, TRANSACTION_KEY, coordinated_here

log = logging.getLogger(__name__)

NO_THROTTLE = datetime.timedelta(0)
NO_DURATION_FILTER = -1
# DescribeProducers: txbroker has no coordinator epochs (any node coordinates any transactional
# id, the row lock is what serializes them); Kafka's "unknown".
NO_COORDINATOR_EPOCH = -1
NO_OFFSET = -1
# What a read the database's synchronous standby has not confirmed (DatabaseUnavailable: the core
# answers once it has, docs/operations-high-availability.md) is answered, as codes Kafka's admin
# client retries. ListTransactions: COORDINATOR_LOAD_IN_PROGRESS (LIST_UNCONFIRMED, as ListGroups'),
# retried after a backoff (its COORDINATOR_NOT_AVAILABLE, "shutting down", fails the call).
# DescribeProducers: NOT_LEADER_OR_FOLLOWER, retried once the leader is looked up again (any other
# code but UNKNOWN_TOPIC_OR_PARTITION fails it). DescribeTransactions: COORDINATOR_NOT_AVAILABLE, the
# default, retried once the coordinator is found.
PRODUCERS_UNCONFIRMED = KafkaError.not_leader_or_follower


async def list_transactions(context: RequestContext, request) -> object:
    module = response_module(api_table.LIST_TRANSACTIONS, context.api_version)
    duration = getattr(request, "duration_filter", NO_DURATION_FILTER)
    try:
        listed = await context.calls.transaction_admin.list_transactions(
            context.principal,
            list(request.state_filters),
            list(request.producer_id_filters),
            None if duration < 0 else duration,
            # v2's pattern, whole-id (Java's Pattern.matches); empty or absent is no filter
            getattr(request, "transactional_id_pattern", None) or None,
        )
    except (InvalidIdPattern, BrokerError) as error:
        log.info("ListTransactions refused: %s", error)
        return build(
            module,
            "ListTransactionsResponse",
            throttle_time=NO_THROTTLE,
            error_code=KafkaError.invalid_regular_expression
            if isinstance(error, InvalidIdPattern)
            else kafka_error(error, LIST_UNCONFIRMED),
            unknown_state_filters=(),
            transaction_states=(),
        )
    # As a Kafka broker, the ids this node coordinates: Kafka's admin client asks every broker and
    # adds up the answers (listTransactions().all() keeps each one's).
    coordinated = await coordinated_here(context, TRANSACTION_KEY)
    return build(
        module,
        "ListTransactionsResponse",
        throttle_time=NO_THROTTLE,
        error_code=KafkaError.none,
        unknown_state_filters=tuple(listed.unknown_state_filters),
        transaction_states=tuple(
            build(
                module,
                "TransactionState",
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in listed.transactions
            if coordinated(t.transactional_id)
        ),
    )


def _time_ms(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


async def describe_transactions(context: RequestContext, request) -> object:
    module = response_module(api_table.DESCRIBE_TRANSACTIONS, context.api_version)
    described = [
        await context.calls.transaction_admin.describe_transaction(context.principal, transactional_id)
        for transactional_id in request.transactional_ids
    ]
    return build(
        module,
        "DescribeTransactionsResponse",
        throttle_time=NO_THROTTLE,
        transaction_states=tuple(
            build(
                module,
                "TransactionState",
                error_code=kafka_error(d.error),
                transactional_id=d.transactional_id,
                transaction_state=d.state,
                transaction_timeout=datetime.timedelta(milliseconds=d.timeout_ms),
                transaction_start_time=_time_ms(d.start_time_ms),
                producer_id=d.producer_id,
                producer_epoch=d.producer_epoch,
                topics=tuple(
                    build(module, "TopicData", topic=topic, partitions=tuple(partitions))
                    for topic, partitions in d.partitions.items()
                ),
            )
            for d in described
        ),
    )


async def describe_producers(context: RequestContext, request) -> object:
    module = response_module(api_table.DESCRIBE_PRODUCERS, context.api_version)
    topics = []
    for topic in request.topics:
        partitions = list(topic.partition_indexes)
        found = await context.calls.transaction_admin.describe_producers(context.principal, topic.name, partitions)
        topics.append(
            build(
                module,
                "TopicResponse",
                name=topic.name,
                partitions=tuple(_partition(module, index, result) for index, result in zip(partitions, found)),
            )
        )
    return build(module, "DescribeProducersResponse", throttle_time=NO_THROTTLE, topics=tuple(topics))


def _partition(module, index: int, result) -> object:
    if isinstance(result, BrokerError):
        return build(
            module,
            "PartitionResponse",
            partition_index=index,
            error_code=kafka_error(result, PRODUCERS_UNCONFIRMED),
            error_message=result.message,
            active_producers=(),
        )
    return build(
        module,
        "PartitionResponse",
        partition_index=index,
        error_code=KafkaError.none,
        error_message=None,
        active_producers=tuple(
            build(
                module,
                "ProducerState",
                producer_id=p.producer_id,
                producer_epoch=p.producer_epoch,
                last_sequence=p.last_sequence,
                last_timestamp=p.last_timestamp_ms,
                coordinator_epoch=NO_COORDINATOR_EPOCH,
                current_txn_start_offset=NO_OFFSET
                if p.current_txn_start_offset is None
                else p.current_txn_start_offset,
            )
            for p in result
        ),
    )
