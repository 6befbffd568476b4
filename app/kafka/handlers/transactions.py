"""The transactional producer's APIs: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn,
through the transaction coordinator HTTP's /v1/transactions endpoints use (InitProducerId is
producers.py). EndTxn below v5 ends a transaction as Kafka's transaction version 1 (the epoch
carries over to the next one, what these clients expect); v5+ as version 2 (KIP-890's epoch bump,
as HTTP), answering the producer id and epoch of the next transaction. PRODUCER_FENCED is answered
from the version of each API that knows it (error_codes.versioned_error).

AddOffsetsToTxn v4 and TxnOffsetCommit v4 (as InitProducerId v5) are the versions whose clients know
KIP-890's TRANSACTION_ABORTABLE, which Kafka answers only when a partition leader's verification
finds a partition missing from the transaction: produce and TxnOffsetCommit add theirs here, so it
is never answered and these versions are served as the one before. TxnOffsetCommit v5 (transaction
version 2) adds the group's offsets partition itself, as every version does here. AddPartitionsToTxn
v4+ is the brokers' batched verification (verify_only, ClusterAction), which no client sends and
txbroker's nodes do not need (PostgreSQL is where each verifies): not served."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError
from app.kafka import api_table
from app.kafka.broker_calls import TxnOffset
from app.kafka.context import RequestContext
from app.kafka.error_codes import versioned_error
from app.kafka.frames import build, response_module
from txbroker.wire import NO_LEADER_EPOCH

# The first version of each API whose clients know PRODUCER_FENCED (KIP-588).
PRODUCER_FENCED_SINCE = 2
# EndTxn v5: KIP-890's transaction version 2 (an epoch bump per transaction).
END_TXN_EPOCH_BUMP_SINCE = 5
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# TxnOffsetCommit below v3 names no generation: the KIP-447 check is skipped, as Kafka does.
NO_GENERATION = -1
NO_MEMBER = ""
NO_THROTTLE = datetime.timedelta(0)


def _error(context: RequestContext, error: BrokerError | None) -> KafkaError:
    return versioned_error(error, context.api_version, PRODUCER_FENCED_SINCE)


async def add_partitions(context: RequestContext, request) -> object:
    module = response_module(api_table.ADD_PARTITIONS_TO_TXN, context.api_version)
    requested = [(topic.name, partition) for topic in request.v3_and_below_topics for partition in topic.partitions]
    try:
        added = await context.calls.add_partitions_to_txn(
            context.principal,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            requested,
        )
        codes = [
            _error(context, error) if error is not None or added.attempted else KafkaError.operation_not_attempted
            for error in added.errors
        ]
        # As Kafka's broker: a request it refuses for its topics is answered from a map by partition
        # (a partition named more than once, once); one it hands to the coordinator, per mention.
        answered = list(zip(requested, codes)) if added.attempted else list(dict(zip(requested, codes)).items())
    except BrokerError as refused:  # the whole request: every partition gets its error
        answered = [(key, _error(context, refused)) for key in requested]
    by_topic: dict[str, list] = {}
    for (topic, partition), code in answered:
        by_topic.setdefault(topic, []).append(
            build(module, "AddPartitionsToTxnPartitionResult", partition_index=partition, partition_error_code=code)
        )
    return build(
        module,
        "AddPartitionsToTxnResponse",
        throttle_time=NO_THROTTLE,
        results_by_topic_v3_and_below=tuple(
            build(module, "AddPartitionsToTxnTopicResult", name=topic, results_by_partition=tuple(results))
            for topic, results in by_topic.items()
        ),
    )


async def add_offsets(context: RequestContext, request) -> object:
    module = response_module(api_table.ADD_OFFSETS_TO_TXN, context.api_version)
    error = None
    try:
        await context.calls.add_offsets_to_txn(
            context.principal, request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
    except BrokerError as refused:
        error = refused
    return build(module, "AddOffsetsToTxnResponse", throttle_time=NO_THROTTLE, error_code=_error(context, error))


async def txn_offset_commit(context: RequestContext, request) -> object:
    module = response_module(api_table.TXN_OFFSET_COMMIT, context.api_version)
    offsets = [
        TxnOffset(
            topic.name,
            partition.partition_index,
            partition.committed_offset,
            partition.committed_metadata,
            getattr(partition, "committed_leader_epoch", NO_LEADER_EPOCH),  # v2+
        )
        for topic in request.topics
        for partition in topic.partitions
    ]
    try:
        errors = await context.calls.txn_offset_commit(
            context.principal,
            request.transactional_id,
            request.group_id,
            request.producer_id,
            request.producer_epoch,
            getattr(request, "generation_id", NO_GENERATION),
            getattr(request, "member_id", NO_MEMBER),
            offsets,
            getattr(request, "group_instance_id", None),
        )
    except BrokerError as refused:
        errors = [refused] * len(offsets)
    by_topic: dict[str, list] = {}
    for offset, error in zip(offsets, errors):
        by_topic.setdefault(offset.topic, []).append(
            build(
                module,
                "TxnOffsetCommitResponsePartition",
                partition_index=offset.partition,
                error_code=_error(context, error),
            )
        )
    return build(
        module,
        "TxnOffsetCommitResponse",
        throttle_time=NO_THROTTLE,
        topics=tuple(
            build(module, "TxnOffsetCommitResponseTopic", name=topic, partitions=tuple(partitions))
            for topic, partitions in by_topic.items()
        ),
    )


async def end_txn(context: RequestContext, request) -> object:
    module = response_module(api_table.END_TXN, context.api_version)
    error, producer_id, producer_epoch = None, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
    try:
        ended = await context.calls.end_txn(
            context.principal,
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.committed,
            epoch_bump=context.api_version >= END_TXN_EPOCH_BUMP_SINCE,
        )
        producer_id, producer_epoch = ended.producer_id, ended.producer_epoch
    except BrokerError as refused:
        error = refused
    return build(
        module,
        "EndTxnResponse",
        throttle_time=NO_THROTTLE,
        error_code=_error(context, error),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )
