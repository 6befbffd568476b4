"""Produce: each partition's one RecordBatch, checked and decompressed (record_batches.py), written
through the produce path HTTP uses. acks=0 gets no answer at all; acks=1 is answered as acks=all
(an append is durable in PostgreSQL when answered: there are no followers to wait for); an
acks=0 Produce is written before the connection's next request is read, and one with an error
closes the connection (CloseConnection) with nothing sent after it written, as Kafka's broker does. A
duplicate of one of a producer's last five batches is answered with its original offsets and no
error, as Kafka does. From v13 topics are named by id (KIP-516): an id no topic has is answered
UNKNOWN_TOPIC_ID. v12 is Kafka's first for transaction version 2 (KIP-890), whose transactional
produce adds its partitions to the transaction itself: the core always does (as HTTP's produce), so
v10-v12 are v9 with tagged fields this broker leaves empty."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError, InvalidRecords, InvalidTimestamps
from app.kafka import api_table
from app.kafka.broker_calls import ProducedPartition, unknown_topic_id
from app.kafka.context import RequestContext
from app.kafka.error_codes import PRODUCE_WHILE_DATABASE_UNAVAILABLE, kafka_error, versioned_error
from app.kafka.frames import CloseConnection, build, response_module
from app.kafka.record_batches import CHECKED_ON_LOOP_BYTES, BatchRefused, read_produced, read_produced_on_loop

ACKS_NONE = 0
VALID_ACKS = (ACKS_NONE, 1, -1)
NO_OFFSET = -1
# From this version topics are named by id (KIP-516), in requests and responses.
TOPIC_IDS_SINCE = 13


def _partition(
    module,
    index: int,
    error: KafkaError,
    message: str | None = None,
    base_offset: int = NO_OFFSET,
    record_indexes: tuple[int, ...] = (),
    log_append_time_ms: int | None = None,
    record_messages: tuple[str, ...] | None = None,
    log_start_offset: int = NO_OFFSET,
):
    """`record_indexes`: the records of the batch at fault (v8+'s record_errors, each with the
    partition's message left out, as Kafka leaves it for records refused for one reason, or with
    its own of `record_messages`);
    `log_append_time_ms`: the time the batch's records took, in a topic with LogAppendTime (else -1);
    `log_start_offset`: the partition's at the append, as Kafka's leader answers a batch appended or
    a duplicate (v5+; an error's is -1 here, where Kafka answers most with the log start too)."""
    record_messages = record_messages or (None,) * len(record_indexes)
    return build(
        module,
        "PartitionProduceResponse",
        index=index,
        error_code=error,
        base_offset=base_offset,
        log_append_time=None
        if log_append_time_ms is None
        else datetime.datetime.fromtimestamp(log_append_time_ms / 1000, datetime.UTC),
        log_start_offset=log_start_offset,
        record_errors=tuple(
            build(module, "BatchIndexAndErrorMessage", batch_index=i, batch_index_error_message=m)
            for i, m in (zip(record_indexes, record_messages) if hasattr(module, "BatchIndexAndErrorMessage") else ())
        ),
        error_message=message,
    )


def _out_of_timestamp_bounds(module, index: int, refused: InvalidTimestamps):
    """INVALID_TIMESTAMP as Kafka's broker answers it (its LogValidator's RecordValidationException):
    its message, then the core's (which record, how far from the clock, which config; or the
    LogAppendTime mark), and each refused record in record_errors with Kafka's reason (its offset in
    the batch is its index)."""
    window = f"[{refused.earliest_ms}, {refused.latest_ms}]"
    if refused.marked_log_append_time:
        reasons = tuple(
            f"Invalid timestamp type in message at offset {offset}. "
            f"Producer should not set timestamp type to LogAppendTime."
            for offset, _ in refused.timestamps
        )
    else:
        reasons = tuple(
            f"Timestamp {timestamp} of message with offset {offset} is out of range. "
            f"The timestamp should be within {window}"
            for offset, timestamp in refused.timestamps
        )
    return _partition(
        module,
        index,
        kafka_error(refused),
        f"One or more records have been rejected due to invalid timestamp: {refused.message}",
        record_indexes=refused.record_indexes,
        record_messages=reasons,
    )


def _topic_key(topic) -> object:
    """How the request names a topic: by id from v13 (its TopicProduceData has no name), else by name."""
    return topic.topic_id if hasattr(topic, "topic_id") else topic.name


async def submit(context: RequestContext, request) -> Awaitable[object | None]:
    """Produce, submitted now and answered later: what is returned waits for the commits and is the
    response (None for acks=0). Before this returns every partition is checked, its batch read (a
    large one in a thread: record_batches.CHECKED_ON_LOOP_BYTES) and
    queued for a write batch behind those of the connection's earlier Produce requests (listener.py
    pipelines them on this: it awaits this before reading the connection's next request). With
    acks=0 this returns only once the batches are written, and raises CloseConnection if any failed.

    A partition named more than once is answered once, as Kafka's broker answers it (its
    handleProduceRequest keys the request by partition): a later mention's batch replaces an
    earlier one's, so only the last is written; but a mention that is refused (a batch that does not
    read, ...) refuses the partition, answered with that error, and none of its batches is written
    (Kafka answers that error too, though it still writes the partition's last good batch)."""
    module = response_module(api_table.PRODUCE, context.api_version)
    by_id = context.api_version >= TOPIC_IDS_SINCE
    names = await context.calls.topic_names({topic.topic_id for topic in request.topic_data}) if by_id else {}
    # By (the topic as the request names it: its id from v13, else its name, partition), in the
    # order of their first mention: the batch to write, or the answer refusing the partition.
    checked: dict[tuple, ProducedPartition | object] = {}
    budget = context.calls.settings.kafka_max_request_bytes
    loop_share = CHECKED_ON_LOOP_BYTES  # what the request's batches may still take to check on the event loop
    for topic in request.topic_data:
        name = names.get(topic.topic_id) if by_id else topic.name
        for data in topic.partition_data:
            if request.acks not in VALID_ACKS:
                outcome = _partition(
                    module, data.index, KafkaError.invalid_required_acks, f"acks {request.acks}: expected 0, 1 or -1"
                )
            elif name is None:
                outcome = _partition(
                    module, data.index, KafkaError.unknown_topic_id, unknown_topic_id(topic.topic_id).message
                )
            elif data.records is None:
                outcome = _partition(module, data.index, KafkaError.invalid_record, "the records are null")
            else:
                records = bytes(data.records)
                try:
                    batch = read_produced_on_loop(records, budget, loop_share)
                    if batch is None:  # a large batch: the worker's other requests go on meanwhile
                        batch = await asyncio.to_thread(read_produced, records, budget)
                    else:
                        loop_share -= batch.uncompressed_bytes
                except BatchRefused as refused:
                    outcome = _partition(module, data.index, refused.error, refused.message)
                else:
                    budget -= batch.uncompressed_bytes
                    outcome = _kind_mismatch(module, request, data.index, batch) or ProducedPartition(
                        name, data.index, batch, topic.topic_id if by_id else None
                    )
            key = (_topic_key(topic), data.index)
            refused_before = key in checked and not isinstance(checked[key], ProducedPartition)
            if not (refused_before and isinstance(outcome, ProducedPartition)):  # a refused mention refuses it
                checked[key] = outcome
    produced_keys = [key for key, outcome in checked.items() if isinstance(outcome, ProducedPartition)]
    produced = [checked[key] for key in produced_keys]
    written = context.calls.submit_produce(context.principal, request.transactional_id, produced) if produced else None
    response = _response(context, request, module, checked, produced, produced_keys, written)
    if request.acks == ACKS_NONE:
        # Waited for here, before the connection reads its next request (Kafka's broker reads it
        # only once this one is appended): a failure closes the connection (CloseConnection) and
        # nothing sent after it is written. Only acks=0 gives up the pipelining: its client waits
        # for no answer, so without this wait a failure would come after the next requests are queued.
        await response
        return _no_answer()
    return response


async def _no_answer() -> None:
    return None


def _kind_mismatch(module, request, index: int, batch) -> object | None:
    """The write path takes the request's transactional id as the batch's kind: a mismatch would
    store a transactional batch as idempotent, or the reverse."""
    if batch.is_transactional == (request.transactional_id is not None):
        return None
    return _partition(
        module,
        index,
        KafkaError.invalid_record,
        f"the batch is {'' if batch.is_transactional else 'not '}transactional but the request "
        f"{'has no' if request.transactional_id is None else 'has a'} transactional id: send "
        f"transactional batches with their transactional id, and only those",
    )


async def _response(
    context: RequestContext,
    request,
    module,
    checked: dict[tuple, ProducedPartition | object],
    produced: list[ProducedPartition],
    produced_keys: list[tuple],
    written: Awaitable[list] | None,
) -> object | None:
    answers = dict(checked)
    if written is not None:
        results = await written
        for entry, key, result in zip(produced, produced_keys, results):
            if isinstance(result, InvalidTimestamps):
                answer = _out_of_timestamp_bounds(module, entry.partition, result)
            elif isinstance(result, BrokerError):
                # Produce never answers PRODUCER_FENCED: a fenced epoch is INVALID_PRODUCER_EPOCH, as Kafka's.
                answer = _partition(
                    module,
                    entry.partition,
                    versioned_error(result, context.api_version, None, PRODUCE_WHILE_DATABASE_UNAVAILABLE),
                    result.message,
                    record_indexes=result.record_indexes if isinstance(result, InvalidRecords) else (),
                )
            else:
                answer = _partition(
                    module,
                    entry.partition,
                    KafkaError.none,
                    base_offset=result.base_offset,
                    log_append_time_ms=result.log_append_time_ms,
                    log_start_offset=result.log_start_offset,
                )
            answers[key] = answer
    if request.acks == ACKS_NONE:
        failed = [
            f"{topic_key}-{index}: {answer.error_code.name}"
            for (topic_key, index), answer in answers.items()
            if answer.error_code != KafkaError.none
        ]
        if failed:  # no answer to carry the errors: Kafka's broker closes the connection
            raise CloseConnection(f"a Produce with acks=0 failed ({', '.join(failed)})")
        return None
    # One entry per topic, each partition once, as Kafka's ProduceResponse (built from its map).
    by_topic: dict[object, list] = {}
    for (topic_key, _), answer in answers.items():
        by_topic.setdefault(topic_key, []).append(answer)
    by_id = context.api_version >= TOPIC_IDS_SINCE
    return build(
        module,
        "ProduceResponse",
        responses=tuple(
            build(
                module,
                "TopicProduceResponse",
                name=None if by_id else topic_key,
                topic_id=topic_key if by_id else None,
                partition_responses=tuple(partitions),
            )
            for topic_key, partitions in by_topic.items()
        ),
        throttle_time=datetime.timedelta(0),
    )
