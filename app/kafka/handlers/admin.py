"""Topic admin: CreateTopics (a manual partition assignment gives the partition count; its
replicas are not kept), DeleteTopics, CreatePartitions (an increase only; replica assignments
checked as Kafka's controller checks them, one live node each, and not kept), DescribeConfigs,
AlterConfigs (a topic's or a group's configs replaced) and
IncrementalAlterConfigs (Kafka 4.0's topic configs, the core's table: storage's topic_configs.py; a
group's configs, KIP-848's, app/coordinator/group_configs.py), DeleteRecords,
ElectLeaders (a partition's one replica always leads it: no election is ever needed),
DescribeLogDirs and AlterReplicaLogDirs (one log dir, PostgreSQL, holding every partition), and
AlterPartitionReassignments and ListPartitionReassignments (any one live node may be a partition's
replica: a reassignment is done as it is asked, and not kept: Metadata names the leader its rule
gives, ListedNodes.leader)."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from kio.schema.errors import ErrorCode as KafkaError

from app.errors import BrokerError, ErrorCode
from app.kafka import api_table, config_entries
from app.kafka.broker_calls import DELETE as DELETE_OPERATION
from app.kafka.context import RequestContext
from app.kafka.error_codes import closed_when_unconfirmed, error_message, kafka_error
from app.kafka.frames import build, response_module
from app.kafka.listener_addresses import format_address

NO_THROTTLE = datetime.timedelta(0)
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
GROUP_RESOURCE = 32
# Kafka's config resource types: topic, broker, broker logger, client metrics, group.
KAFKA_CONFIG_RESOURCES = frozenset({TOPIC_RESOURCE, BROKER_RESOURCE, 8, 16, GROUP_RESOURCE})
# The resource types whose configs AlterConfigs and IncrementalAlterConfigs alter.
ALTERABLE_CONFIG_RESOURCES = frozenset({TOPIC_RESOURCE, GROUP_RESOURCE})
# CreateTopics: -1 partitions means the server's default (num_partitions, Kafka's num.partitions).
DEFAULT_PARTITIONS = -1
NO_REPLICATION_FACTOR = -1
# The replicas of each txbroker partition, as Metadata describes them: its leader alone.
PARTITION_REPLICAS = 1
# Kafka's messages for a topic named twice in CreateTopics or DeleteTopics (its controller's).
DUPLICATE_NAME = "Duplicate topic name."
DUPLICATE_ID = "Duplicate topic id."


async def _refused_creation(context: RequestContext, topic, configs: dict) -> tuple[KafkaError, str] | None:
    """Kafka's answer to a creation its controller refuses for its replication factor or its manual
    partition assignment (`_assignment_refusal`): a factor that is neither -1 (the default) nor
    positive (txbroker ignores any other: answered 1). Kafka's controller checks these after the
    name, whether the topic exists and its configs (ReplicationControlManager.createTopics, then
    createTopic): so such a creation is first validated with one partition (validate_only: nothing
    is written), whose error is the answer."""
    if topic.assignments:
        refusal = await _assignment_refusal(context, topic)
    elif topic.replication_factor == NO_REPLICATION_FACTOR or topic.replication_factor > 0:
        refusal = None
    else:
        refusal = (
            KafkaError.invalid_replication_factor,
            f"replication factor {topic.replication_factor} of topic {topic.name!r}: expected -1 (the default) or "
            f"a positive number",
        )
    if refusal is None:
        return None
    try:
        await context.calls.admin.create_topic(
            context.principal, context.client_address, topic.name, 1, configs, validate_only=True
        )
    except BrokerError as raised:
        return kafka_error(raised), raised.message
    return refusal


async def _assignment_refusal(context: RequestContext, topic) -> tuple[KafkaError, str] | None:
    """Kafka's controller's checks of a manual partition assignment (createTopic), in its order: the
    counts left to it (-1), no partition assigned twice, each replica list valid (`_replicas_error`,
    AlterPartitionReassignments' checks; every list as long as the first) and naming at least one node not
    lapsed (`_all_fenced_error`), then the partitions 0..n-1. A valid assignment makes n
    partitions; its replicas are not kept, as a replication factor is not (a txbroker partition has
    one replica, in PostgreSQL, which every node reaches)."""
    if topic.replication_factor != NO_REPLICATION_FACTOR:
        return (
            KafkaError.invalid_request,
            "A manual partition assignment was specified, but replication factor was not set to -1.",
        )
    if topic.num_partitions != DEFAULT_PARTITIONS:
        return (
            KafkaError.invalid_request,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        )
    nodes = await _node_ids(context)
    assigned: set[int] = set()
    replication_factor = None
    for assignment in topic.assignments:
        if assignment.partition_index in assigned:
            return (
                KafkaError.invalid_replica_assignment,
                f"Found multiple manual partition assignments for partition {assignment.partition_index}",
            )
        replicas = tuple(assignment.broker_ids)
        refused = _replicas_error(replicas, nodes.registered)
        if refused is None and replication_factor is not None and len(replicas) != replication_factor:
            refused = (
                f"The manual partition assignment includes a partition with {len(replicas)} replica(s), but this is "
                f"not consistent with previous partitions, which have {replication_factor} replica(s)."
            )
        if refused is None:
            refused = _all_fenced_error(assignment.partition_index, replicas, nodes)
        if refused is not None:
            return KafkaError.invalid_replica_assignment, refused
        replication_factor = len(replicas)
        assigned.add(assignment.partition_index)
    if assigned != set(range(len(assigned))):
        return KafkaError.invalid_replica_assignment, "partitions should be a consecutive 0-based integer sequence"
    return None


async def create_topics(context: RequestContext, request) -> object:
    module = response_module(api_table.CREATE_TOPICS, context.api_version)
    repeated, answered = _given_more_than_once(topic.name for topic in request.topics), set()
    results = []
    for topic in request.topics:
        if topic.name in repeated:
            # As Kafka: a name given twice is created by none of its entries and answered once.
            if topic.name not in answered:
                answered.add(topic.name)
                results.append(_creation_result(module, topic.name, KafkaError.invalid_request, DUPLICATE_NAME))
            continue
        configs = {c.name: c.value for c in topic.configs}
        refused = await _refused_creation(context, topic, configs)
        if refused is not None:
            results.append(_creation_result(module, topic.name, *refused))
            continue
        if topic.assignments:  # checked by _refused_creation: partitions 0..n-1
            count = len(topic.assignments)
        else:
            count = None if topic.num_partitions == DEFAULT_PARTITIONS else topic.num_partitions
        try:
            created = await context.calls.admin.create_topic(
                context.principal, context.client_address, topic.name, count, configs, request.validate_only
            )
        except BrokerError as raised:
            results.append(_creation_result(module, topic.name, kafka_error(raised), raised.message))
            continue
        # v7 (KIP-516): the new topic's id; validate_only created none (Kafka answers the zero id).
        topic_id = None if request.validate_only else created.topic_uuid
        results.append(_created_result(context, module, created, topic_id))
    return build(module, "CreateTopicsResponse", throttle_time=NO_THROTTLE, topics=tuple(results))


def _given_more_than_once(values) -> set:
    return {value for value, count in Counter(values).items() if count > 1}


def _creation_result(module, name: str, error_code: KafkaError, message: str | None):
    """A topic CreateTopics did not create: Kafka's result leaves the counts unknown (-1) and the
    configs an empty list (v5+)."""
    return build(
        module,
        "CreatableTopicResult",
        name=name,
        topic_id=None,
        error_code=error_code,
        error_message=message,
        topic_config_error_code=KafkaError.none,
        num_partitions=-1,
        replication_factor=NO_REPLICATION_FACTOR,
        configs=(),
    )


def _created_result(context: RequestContext, module, topic, topic_id):
    """A topic CreateTopics created (or validated), as Kafka's controller answers it (v5+, KIP-525):
    its partition count, replication factor and every config with its value and source, as
    DescribeConfigs describes them, for a principal that may describe its configs; for another, the
    topic's config error TOPIC_AUTHORIZATION_FAILED, counts unknown and no configs. Never null
    configs: Java's admin client reads them for every topic created."""
    entries = context.calls.admin.created_configs(context.principal, topic)
    if not hasattr(module, "CreatableTopicConfigs"):  # below v5: the name, the error and nothing else
        config_error, partitions, replication_factor, configs = KafkaError.none, -1, NO_REPLICATION_FACTOR, ()
    elif entries is None:
        config_error, partitions, replication_factor, configs = (
            KafkaError.topic_authorization_failed,
            -1,
            NO_REPLICATION_FACTOR,
            (),
        )
    else:
        config_error, partitions, replication_factor = KafkaError.none, topic.partition_count, 1
        configs = tuple(
            _config_entry(module, "CreatableTopicConfigs", config, False, False)
            for config in _topic_configs(context, entries)
        )
    return build(
        module,
        "CreatableTopicResult",
        name=topic.name,
        topic_id=topic_id,
        error_code=KafkaError.none,
        error_message=None,
        topic_config_error_code=config_error,
        num_partitions=partitions,
        replication_factor=replication_factor,
        configs=configs,
    )


def _topic_configs(context: RequestContext, entries) -> list[config_entries.DescribedConfig]:
    """A topic's config entries (the core's values and server defaults) as a Kafka broker describes
    them: each with its source and synonyms (config_entries.topic_config)."""
    settings = context.calls.settings
    return [
        config_entries.topic_config(
            settings, entry.name, entry.value, entry.server_default, entry.kind, entry.documentation
        )
        for entry in entries
    ]


async def _delete_topic(context: RequestContext, name: str | None, topic_id) -> tuple:
    """(name, topic id, error) of one DeleteTopics entry: by name, or (v6, KIP-516) by id."""
    try:
        if name is None and topic_id is None:  # kio reads Kafka's zero id as None
            raise BrokerError(
                ErrorCode.INVALID_REQUEST,
                "Neither topic name nor id were specified: expected a topic's name, or (v6) its id",
            )
        if name is not None and topic_id is not None:
            raise BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"topic {name!r} is named both by name and by the id {topic_id}: expected one of the two",
            )
        if name is not None:
            return name, await context.calls.admin.delete_topic(context.principal, context.client_address, name), None
        return (
            await context.calls.admin.delete_topic_by_id(context.principal, context.client_address, topic_id),
            topic_id,
            None,
        )
    except BrokerError as raised:
        return name, topic_id, raised


async def delete_topics(context: RequestContext, request) -> object:
    module = response_module(api_table.DELETE_TOPICS, context.api_version)
    if hasattr(request, "topics"):  # v6
        asked = [(t.name, t.topic_id) for t in request.topics]
    else:
        asked = [(name, None) for name in request.topic_names]
    # As Kafka: a name (or id) given twice deletes nothing and is answered once, INVALID_REQUEST.
    repeated = _given_more_than_once(name for name, _ in asked if name is not None)
    repeated |= _given_more_than_once(topic_id for name, topic_id in asked if name is None and topic_id is not None)
    answered = set()
    results = []
    for asked_name, asked_id in asked:
        key = asked_id if asked_name is None else asked_name
        if key in repeated:
            if key not in answered:
                answered.add(key)
                message = DUPLICATE_ID if asked_name is None else DUPLICATE_NAME
                results.append(_deletion_result(module, asked_name, asked_id, KafkaError.invalid_request, message))
            continue
        name, topic_id, error = await _delete_topic(context, asked_name, asked_id)
        results.append(_deletion_result(module, name, topic_id, kafka_error(error), error_message(error)))
    return build(module, "DeleteTopicsResponse", throttle_time=NO_THROTTLE, responses=tuple(results))


def _deletion_result(module, name: str | None, topic_id, error_code: KafkaError, message: str | None):
    return build(
        module,
        "DeletableTopicResult",
        name=name,
        topic_id=topic_id,
        error_code=error_code,
        error_message=message,
    )


class _AssignmentRefused(Exception):
    """A CreatePartitions replica assignment Kafka's controller refuses: INVALID_REPLICA_ASSIGNMENT,
    with its message. Raised within the growth, which it rolls back."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _assignment_check(topic, nodes: _NodeIds | None):
    """CreatePartitions' check of a topic's replica assignments (None: none given), as Kafka's
    controller makes it (ReplicationControlManager.createPartitions) once the topic and the count are
    checked: one assignment per partition added, then each replica list valid (`_replicas_error`)
    and as long as the existing partitions' (one replica each: a txbroker partition's one replica is
    in PostgreSQL, and Metadata shows it so), and naming a live node (`_all_fenced_error`).
    The replicas are not kept, as CreateTopics' are not."""
    if topic.assignments is None:
        return None

    def check(added: int) -> None:
        if len(topic.assignments) != added:
            raise _AssignmentRefused(
                f"Attempted to add {added} additional partition(s), but only {len(topic.assignments)} "
                f"assignment(s) were specified."
            )
        assert nodes is not None, "the listed nodes are looked up when assignments are given"
        first_added = topic.count - added
        for partition, assignment in enumerate(topic.assignments, start=first_added):
            replicas = tuple(assignment.broker_ids)
            refused = _replicas_error(replicas, nodes.registered)
            if refused is None and len(replicas) != PARTITION_REPLICAS:
                refused = (
                    f"The manual partition assignment includes a partition with {len(replicas)} replica(s), but "
                    f"this is not consistent with previous partitions, which have {PARTITION_REPLICAS} replica(s)."
                )
            if refused is None:
                refused = _all_fenced_error(partition, replicas, nodes)
            if refused is not None:
                raise _AssignmentRefused(refused)

    return check


async def create_partitions(context: RequestContext, request) -> object:
    module = response_module(api_table.CREATE_PARTITIONS, context.api_version)
    names = [topic.name for topic in request.topics]
    nodes = None
    results = []
    for topic in request.topics:
        code, message = KafkaError.none, None
        if names.count(topic.name) > 1:  # as Kafka: every mention of a repeated topic is refused
            code = KafkaError.invalid_request
            message = f"topic {topic.name!r} is named more than once: name each topic once"
        else:
            if topic.assignments is not None and nodes is None:
                nodes = await _node_ids(context)
            try:
                await context.calls.admin.grow_partitions(
                    context.principal,
                    context.client_address,
                    topic.name,
                    topic.count,
                    request.validate_only,
                    _assignment_check(topic, nodes),
                )
            except BrokerError as raised:
                code, message = kafka_error(raised), raised.message
            except _AssignmentRefused as refused:
                code, message = KafkaError.invalid_replica_assignment, refused.message
        results.append(
            build(module, "CreatePartitionsTopicResult", name=topic.name, error_code=code, error_message=message)
        )
    return build(module, "CreatePartitionsResponse", throttle_time=NO_THROTTLE, results=tuple(results))


def _unexpected_broker(context: RequestContext, resource) -> BrokerError | None:
    """A broker resource names this node's id, or none (""), as a Kafka broker requires."""
    if resource.resource_type != BROKER_RESOURCE or resource.resource_name in ("", str(context.calls.node_id)):
        return None
    return BrokerError(
        ErrorCode.INVALID_REQUEST,
        f"Unexpected broker id, expected {context.calls.node_id} or empty string, but received "
        f"{resource.resource_name}",
    )


async def describe_configs(context: RequestContext, request) -> object:
    module = response_module(api_table.DESCRIBE_CONFIGS, context.api_version)
    unknown = [r for r in request.resources if r.resource_type not in KAFKA_CONFIG_RESOURCES]
    # As a Kafka broker: a resource type it does not know fails the whole request, each resource.
    refused = (
        None
        if not unknown
        else BrokerError(
            ErrorCode.INVALID_REQUEST,
            f"Unexpected resource type {unknown[0].resource_type} for resource {unknown[0].resource_name}",
        )
    )
    with_synonyms = getattr(request, "include_synonyms", False)  # v1+
    with_documentation = getattr(request, "include_documentation", False)  # v3+
    results = []
    # A resource asked again with the same keys is answered as the first time, described once: a
    # topic has 33 configs, and a request may name thousands of resources.
    answered: dict[tuple, object] = {}
    for resource in request.resources:
        # No keys (null, or an empty list, as a Kafka broker reads it: ConfigHelper): every config.
        keys = list(resource.configuration_keys) if resource.configuration_keys else None
        asked = (resource.resource_type, resource.resource_name, None if keys is None else tuple(keys))
        if asked not in answered:
            answered[asked] = await _described_result(
                context, module, resource, keys, refused, with_synonyms, with_documentation
            )
        results.append(answered[asked])
    if refused is None and any(r.resource_type in ALTERABLE_CONFIG_RESOURCES for r in request.resources):
        # What was read from PostgreSQL (the alterable configs, and topics not found), once the
        # synchronous standby has it: one barrier for the request's resources.
        with closed_when_unconfirmed("DescribeConfigs"):
            await context.calls.admin.configs_confirmed()
    return build(module, "DescribeConfigsResponse", throttle_time=NO_THROTTLE, results=tuple(results))


async def _described_result(
    context: RequestContext,
    module,
    resource,
    keys: list[str] | None,
    refused: BrokerError | None,
    with_synonyms: bool,
    with_documentation: bool,
) -> object:
    error, configs = refused or _unexpected_broker(context, resource), []
    if error is None:
        try:
            configs = await _described_configs(context, resource, keys)
        except BrokerError as raised:
            error = raised
    return build(
        module,
        "DescribeConfigsResult",
        error_code=kafka_error(error),
        error_message=error_message(error),
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
        configs=tuple(
            _config_entry(module, "DescribeConfigsResourceResult", config, with_synonyms, with_documentation)
            for config in configs
        ),
    )


def _config_entry(
    module, class_name: str, config: config_entries.DescribedConfig, with_synonyms: bool, with_documentation: bool
) -> object:
    """One config as DescribeConfigs (DescribeConfigsResourceResult) or CreateTopics
    (CreatableTopicConfigs, which takes its name, value, read-only flag, source and sensitivity)
    answer it; none is sensitive."""
    return build(
        module,
        class_name,
        name=config.name,
        value=config.value,
        read_only=config.read_only,
        is_default=config.is_default,
        config_source=config.source,
        is_sensitive=False,
        synonyms=tuple(
            build(module, "DescribeConfigsSynonym", name=s.name, value=s.value, source=s.source)
            for s in config.synonyms
        )
        if with_synonyms
        else (),
        config_type=config.config_type,
        documentation=config.documentation if with_documentation else None,
    )


async def _described_configs(
    context: RequestContext, resource, keys: list[str] | None
) -> list[config_entries.DescribedConfig]:
    """A topic's configs, this node's broker configs, or a group's; none for the other resource types
    Kafka has (broker loggers, client metrics), which txbroker has no configs for."""
    admin = context.calls.admin
    if resource.resource_type == TOPIC_RESOURCE:
        return _topic_configs(context, await admin.describe_config(context.principal, resource.resource_name, keys))
    if resource.resource_type == BROKER_RESOURCE:
        settings = admin.broker_settings(context.principal)
        advertised = ",".join(
            f"{protocol}://{format_address(host, port)}"
            for host, port, protocol in context.calls.advertised_listeners
            or [(context.advertised_host, context.advertised_port, context.listener)]
        )
        return config_entries.broker_configs(settings, advertised, keys)
    if resource.resource_type == GROUP_RESOURCE:
        entries = await admin.describe_group_config(context.principal, resource.resource_name)
        return config_entries.group_configs(context.calls.settings, entries, keys)
    return []


async def alter_configs(context: RequestContext, request) -> object:
    """AlterConfigs (33): each topic's or group's configs replaced by those given, the others back to
    the server's defaults (IncrementalAlterConfigs changes only those named)."""
    admin = context.calls.admin

    async def replace(resource) -> None:
        configs = [(c.name, c.value) for c in resource.configs]
        on_group = resource.resource_type == GROUP_RESOURCE
        await (admin.replace_group_config if on_group else admin.replace_config)(
            context.principal, context.client_address, resource.resource_name, configs, request.validate_only
        )

    return await _alter_each(context, request, api_table.ALTER_CONFIGS, "AlterConfigsResponse", replace)


async def incremental_alter_configs(context: RequestContext, request) -> object:
    admin = context.calls.admin

    async def alter(resource) -> None:
        alterations = [(c.name, c.config_operation, c.value) for c in resource.configs]
        on_group = resource.resource_type == GROUP_RESOURCE
        await (admin.alter_group_config if on_group else admin.alter_config)(
            context.principal, context.client_address, resource.resource_name, alterations, request.validate_only
        )

    return await _alter_each(
        context, request, api_table.INCREMENTAL_ALTER_CONFIGS, "IncrementalAlterConfigsResponse", alter
    )


async def _alter_each(
    context: RequestContext, request, api_key: int, response_name: str, alter: Callable[[object], Awaitable[None]]
) -> object:
    """Both AlterConfigs APIs' answer: each resource altered on its own (one's error leaves the
    others' alterations), only topics' and groups' configs alterable. A resource named more than once is
    altered by none of its mentions, each answered INVALID_REQUEST, and so is a resource that
    names a config more than once, as a Kafka broker answers (ConfigAdminManager.preprocess): which
    of its alterations was meant is not the broker's guess. So is a resource that gives a config a
    null value (AlterConfigs) or sets, appends or subtracts one (IncrementalAlterConfigs), as the
    same preprocessing refuses it before any config changes."""
    module = response_module(api_key, context.api_version)
    named = Counter((resource.resource_type, resource.resource_name) for resource in request.resources)
    results = []
    for resource in request.resources:
        error = None
        if named[resource.resource_type, resource.resource_name] > 1:
            error = BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"resource {resource.resource_name!r} (type {resource.resource_type}) is named "
                f"{named[resource.resource_type, resource.resource_name]} times: expected each resource at most "
                "once; send its alterations in one entry",
            )
        elif repeated := _repeated_configs(resource):
            error = BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"Error due to duplicate config keys: resource {resource.resource_name!r} names {repeated} more "
                "than once; expected each config at most once per resource, so name each once",
            )
        elif nulls := _null_values(resource, api_key):
            error = BrokerError(
                ErrorCode.INVALID_REQUEST,
                f"Null value not supported for : {', '.join(nulls)}: expected a value for each config "
                + (
                    "given; leave a config out to put it back to its default"
                    if api_key == api_table.ALTER_CONFIGS
                    else "set, appended or subtracted; DELETE (1) puts a config back to its default"
                ),
            )
        elif resource.resource_type not in ALTERABLE_CONFIG_RESOURCES:
            error = _unsupported_resource(resource.resource_type)
        else:
            try:
                await alter(resource)
            except BrokerError as raised:
                error = raised
        results.append(
            build(
                module,
                "AlterConfigsResourceResponse",
                error_code=kafka_error(error),
                error_message=error_message(error),
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return build(module, response_name, throttle_time=NO_THROTTLE, responses=tuple(results))


def _repeated_configs(resource) -> list[str]:
    """The config names a resource's alterations name more than once: Kafka's broker alters none of
    such a resource (ConfigAdminManager.preprocess, "Error due to duplicate config keys"), for
    AlterConfigs and IncrementalAlterConfigs alike, before it authorizes or looks at the resource."""
    return sorted(_given_more_than_once(config.name for config in resource.configs))


def _null_values(resource, api_key: int) -> list[str]:
    """The configs a resource gives a null value where a value is needed: any of AlterConfigs', and
    IncrementalAlterConfigs' but for a DELETE, which takes none (Kafka's ConfigAdminManager.preprocess
    and its legacy AlterConfigs validation)."""
    return [
        config.name
        for config in resource.configs
        if config.value is None and (api_key == api_table.ALTER_CONFIGS or config.config_operation != DELETE_OPERATION)
    ]


def _unsupported_resource(resource_type: int) -> BrokerError:
    return BrokerError(
        ErrorCode.INVALID_REQUEST,
        f"resource type {resource_type}: only topics' (type {TOPIC_RESOURCE}) and groups' (type {GROUP_RESOURCE}) "
        "configs can be altered",
    )


async def delete_records(context: RequestContext, request) -> object:
    """DeleteRecords (21). A partition named more than once (in one topic entry or several) is
    deleted up to its last mention's offset only and answered once, and a topic named in several
    entries answered in one, as Kafka's broker (its handleDeleteRecordsRequest keys the offsets by
    partition): an earlier mention moves nothing, also when the last one is refused."""
    module = response_module(api_table.DELETE_RECORDS, context.api_version)
    asked: dict[str, dict[int, int]] = {}  # the offset of each partition of each topic, by first mention
    for topic in request.topics:
        partitions = asked.setdefault(topic.name, {})
        for p in topic.partitions or ():  # a null array: none
            partitions[p.partition_index] = p.offset
    topics = []
    for name, partitions in asked.items():
        offsets = list(partitions.items())
        try:
            results = await context.calls.admin.delete_records(context.principal, context.client_address, name, offsets)
        except BrokerError as raised:
            results = [raised] * len(offsets)
        topics.append(
            build(
                module,
                "DeleteRecordsTopicResult",
                name=name,
                partitions=tuple(
                    build(
                        module,
                        "DeleteRecordsPartitionResult",
                        partition_index=partition,
                        low_watermark=-1 if isinstance(result, BrokerError) else result,
                        error_code=kafka_error(result) if isinstance(result, BrokerError) else KafkaError.none,
                    )
                    for (partition, _), result in zip(offsets, results)
                ),
            )
        )
    return build(module, "DeleteRecordsResponse", throttle_time=NO_THROTTLE, topics=tuple(topics))


# ElectLeaders' election types (KIP-460; v0 elects the preferred replica).
PREFERRED_ELECTION, UNCLEAN_ELECTION = 0, 1


def _election_type_error(election_type: int) -> BrokerError | None:
    if election_type in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
        return None
    return BrokerError(
        ErrorCode.INVALID_REQUEST,
        f"Unknown election type {election_type}: expected {PREFERRED_ELECTION} (preferred) or "
        f"{UNCLEAN_ELECTION} (unclean)",
    )


def _elected(topic: str, partition: int, partition_count: int | None) -> tuple[KafkaError, str]:
    """One partition's answer: ELECTION_NOT_NEEDED for one that exists (its one replica, the
    preferred one, leads it, as Kafka answers when the preferred replica leads already or, for an
    unclean election, when the partition has a leader), UNKNOWN_TOPIC_OR_PARTITION otherwise."""
    if partition_count is None:
        return KafkaError.unknown_topic_or_partition, f"No such topic as {topic}: create it first"
    if not 0 <= partition < partition_count:
        return (
            KafkaError.unknown_topic_or_partition,
            f"No such partition as {topic}-{partition}: the topic has partitions 0 to {partition_count - 1}",
        )
    return (
        KafkaError.election_not_needed,
        f"Leader election not needed for topic partition {topic}-{partition}: its one replica leads it "
        "(Metadata names it, one live node, the same on every node)",
    )


async def elect_leaders(context: RequestContext, request) -> object:
    """ElectLeaders (43), as Kafka's controller answers it: each partition asked answered on its own;
    with no partitions asked (null), every topic with none of its partitions, as Kafka leaves out
    those whose election was not needed. Without Alter on the Cluster, or with an unknown election
    type, the whole request fails: its error (v1+) and each partition asked with it."""
    module = response_module(api_table.ELECT_LEADERS, context.api_version)
    asked = None if request.topic_partitions is None else [(t.topic, t.partitions) for t in request.topic_partitions]
    try:
        counts = await context.calls.admin.replicas_to_alter(
            context.principal, None if asked is None else [topic for topic, _ in asked]
        )
        error = _election_type_error(getattr(request, "election_type", PREFERRED_ELECTION))
    except BrokerError as raised:
        error = raised
    if error is not None:
        failed = (kafka_error(error), error.message)
        results = [(topic, [(partition, *failed) for partition in partitions]) for topic, partitions in asked or ()]
    elif asked is None:
        results = [(topic, []) for topic in counts]
    else:
        results = [
            (topic, [(partition, *_elected(topic, partition, counts.get(topic))) for partition in partitions])
            for topic, partitions in asked
        ]
    return build(
        module,
        "ElectLeadersResponse",
        throttle_time=NO_THROTTLE,
        error_code=kafka_error(error),
        replica_election_results=tuple(
            build(
                module,
                "ReplicaElectionResult",
                topic=topic,
                partition_result=tuple(
                    build(module, "PartitionResult", partition_id=partition, error_code=code, error_message=message)
                    for partition, code, message in partitions
                ),
            )
            for topic, partitions in results
        ),
    )


# DescribeLogDirs: the one "log dir" holding every partition, the PostgreSQL database; its
# volume's size is not the node's to know (Kafka's -1: unknown).
LOG_DIR = "postgresql"
UNKNOWN_VOLUME_BYTES = -1


async def describe_log_dirs(context: RequestContext, request) -> object:
    """DescribeLogDirs (35), as a Kafka broker answers it: the partitions asked (null: every one)
    that exist and whose one replica is this node (the leader Metadata names, ListedNodes.leader:
    a broker describes the replicas it hosts, and tools add up the brokers' answers), each with its
    stored bytes (what retention.bytes counts), no lag and no future replica, in the one log dir;
    topics and partitions that do not exist, or are another node's, are left out. Without Describe
    on the Cluster: no log dir, CLUSTER_AUTHORIZATION_FAILED (v3+)."""
    module = response_module(api_table.DESCRIBE_LOG_DIRS, context.api_version)
    asked = None if request.topics is None else {}
    for topic in request.topics or ():
        asked.setdefault(topic.topic, set()).update(topic.partitions)
    try:
        sizes = await context.calls.admin.stored_bytes(context.principal, None if asked is None else list(asked))
    except BrokerError as error:
        return build(
            module, "DescribeLogDirsResponse", throttle_time=NO_THROTTLE, error_code=kafka_error(error), results=()
        )
    listing = await context.listed_nodes()
    topics = []
    for name, partitions in sizes.items():
        described = tuple(
            build(
                module,
                "DescribeLogDirsPartition",
                partition_index=partition,
                partition_size=size,
                offset_lag=0,
                is_future_key=False,
            )
            for partition, size in sorted(partitions.items())
            if (asked is None or partition in asked[name]) and listing.leader(name, partition) == context.calls.node_id
        )
        if described:
            topics.append(build(module, "DescribeLogDirsTopic", name=name, partitions=described))
    result = build(
        module,
        "DescribeLogDirsResult",
        error_code=KafkaError.none,
        log_dir=LOG_DIR,
        topics=tuple(topics),
        total_bytes=UNKNOWN_VOLUME_BYTES,
        usable_bytes=UNKNOWN_VOLUME_BYTES,
        is_cordoned=False,
    )
    return build(
        module, "DescribeLogDirsResponse", throttle_time=NO_THROTTLE, error_code=KafkaError.none, results=(result,)
    )


async def alter_replica_log_dirs(context: RequestContext, request) -> object:
    """AlterReplicaLogDirs (34), as a Kafka broker answers it: moving a replica to the log dir it is
    in (txbroker's one, `postgresql`) is a no-op, NONE; another dir is LOG_DIR_NOT_FOUND (not in the
    broker's log.dirs); a partition that does not exist REPLICA_NOT_AVAILABLE. Without Alter on the
    Cluster, every partition CLUSTER_AUTHORIZATION_FAILED."""
    module = response_module(api_table.ALTER_REPLICA_LOG_DIRS, context.api_version)
    moves = [(d.path, t.name, p) for d in request.dirs for t in d.topics for p in t.partitions]
    try:
        counts = await context.calls.admin.replicas_to_alter(context.principal, sorted({t for _, t, _ in moves}))
        refused = None
    except BrokerError as error:
        counts, refused = {}, kafka_error(error)
    answered: dict[str, list[tuple[int, KafkaError]]] = {}
    for path, topic, partition in moves:
        if refused is not None:
            code = refused
        elif path != LOG_DIR:
            code = KafkaError.log_dir_not_found
        elif not 0 <= partition < counts.get(topic, 0):
            code = KafkaError.replica_not_available
        else:
            code = KafkaError.none
        answered.setdefault(topic, []).append((partition, code))
    return build(
        module,
        "AlterReplicaLogDirsResponse",
        throttle_time=NO_THROTTLE,
        results=tuple(
            build(
                module,
                "AlterReplicaLogDirTopicResult",
                topic_name=topic,
                partitions=tuple(
                    build(module, "AlterReplicaLogDirPartitionResult", partition_index=partition, error_code=code)
                    for partition, code in partitions
                ),
            )
            for topic, partitions in answered.items()
        ),
    )


class _NodeIds(NamedTuple):
    """The ids of the nodes this process lists, as Kafka's controller tells its brokers apart:
    `registered` every node listed (alive, or lapsed a moment ago: dead, stopped or hung), `live`
    those not lapsed. A lapsed node is what Kafka calls a fenced broker (DescribeCluster answers it
    so): registered, no longer heartbeating."""

    registered: set[int]
    live: set[int]


async def _node_ids(context: RequestContext) -> _NodeIds:
    listing = await context.listed_nodes()
    return _NodeIds({node.node_id for node in listing.every}, {node.node_id for node in listing.live})


def _replicas_error(replicas: tuple[int, ...], registered: set[int]) -> str | None:
    """Kafka's controller's checks of a replica list (validateManualPartitionAssignment): not empty,
    no node twice, every node registered (listed, alive or lapsed); why not, or None."""
    if not replicas:
        return "The manual partition assignment includes an empty replica list."
    twice = [r for r in dict.fromkeys(replicas) if replicas.count(r) > 1]
    if twice:
        return f"The manual partition assignment includes the broker {twice[0]} more than once."
    unknown = [r for r in replicas if r not in registered]
    if unknown:
        return (
            f"The manual partition assignment includes broker {unknown[0]}, but no such broker is registered "
            f"(listed nodes: {sorted(registered)})."
        )
    return None


def _all_fenced_error(partition: int, replicas: tuple[int, ...], nodes: _NodeIds) -> str | None:
    """A new partition's replica list naming only lapsed nodes (Kafka's fenced brokers), which
    Kafka's controller refuses when it creates a topic or partitions (createTopic, createPartitions:
    no replica could be in the partition's ISR); why, or None. A list with one live node passes, as
    Kafka's does. AlterPartitionReassignments does not check this: Kafka's controller takes a
    fenced broker there (registered is enough) and the reassignment waits for it."""
    if any(replica in nodes.live for replica in replicas):
        return None
    return (
        f"All brokers specified in the manual partition assignment for partition {partition} are fenced or in "
        f"controlled shutdown (a node listed for kafka_lapsed_node_listed_ms after its presence lapsed: live "
        f"nodes {sorted(nodes.live)}); name a live node."
    )


def _reassigned(
    topic: str, partition: int, replicas: tuple[int, ...] | None, partition_count: int | None, registered: set[int]
) -> tuple[KafkaError, str | None]:
    """One partition's answer to AlterPartitionReassignments: Kafka's controller's checks, then
    txbroker's rule that a partition has one replica, which any listed node may be. A lapsed node
    is taken too, as Kafka's controller takes a fenced broker there (changePartitionReassignment asks
    only that each replica be registered; the reassignment then waits for the broker to rejoin):
    NONE, with nothing to wait for, as every node reaches the partition in PostgreSQL."""
    if partition_count is None or not 0 <= partition < partition_count:
        return KafkaError.unknown_topic_or_partition, f"No such partition as {topic}-{partition}"
    if replicas is None:  # a cancellation
        return KafkaError.no_reassignment_in_progress, f"No ongoing reassignment for {topic}-{partition}"
    refused = _replicas_error(replicas, registered)
    if refused is not None:
        return KafkaError.invalid_replica_assignment, refused
    if len(replicas) > 1:
        return (
            KafkaError.invalid_replica_assignment,
            f"{len(replicas)} replicas asked for {topic}-{partition}: a txbroker partition has one replica, "
            "in PostgreSQL, which every node reaches (its durability is PostgreSQL's); name one node",
        )
    return KafkaError.none, None


async def alter_partition_reassignments(context: RequestContext, request) -> object:
    """AlterPartitionReassignments (45), as Kafka's controller answers it: a partition's one replica
    reassigned to any one live node is answered NONE at once, with nothing to move (every node
    reaches the data and serves the partition; the assignment is not kept, and Metadata goes on
    naming the leader of ListedNodes.leader, a function of the partition and the live nodes); a
    cancellation NO_REASSIGNMENT_IN_PROGRESS, since none ever is; an empty list, a node twice, an
    unknown node or several replicas INVALID_REPLICA_ASSIGNMENT; an unknown partition
    UNKNOWN_TOPIC_OR_PARTITION. Without Alter on the Cluster the request fails,
    CLUSTER_AUTHORIZATION_FAILED, each partition with it."""
    module = response_module(api_table.ALTER_PARTITION_REASSIGNMENTS, context.api_version)
    try:
        counts = await context.calls.admin.replicas_to_alter(
            context.principal, sorted({t.name for t in request.topics})
        )
        registered = (await _node_ids(context)).registered
        error = None
    except BrokerError as raised:
        error = raised
    responses = []
    for topic in request.topics:
        results = []
        for asked in topic.partitions:
            if error is not None:
                code, message = kafka_error(error), error_message(error)
            else:
                code, message = _reassigned(
                    topic.name, asked.partition_index, asked.replicas, counts.get(topic.name), registered
                )
            results.append(
                build(
                    module,
                    "ReassignablePartitionResponse",
                    partition_index=asked.partition_index,
                    error_code=code,
                    error_message=message,
                )
            )
        responses.append(build(module, "ReassignableTopicResponse", name=topic.name, partitions=tuple(results)))
    return build(
        module,
        "AlterPartitionReassignmentsResponse",
        throttle_time=NO_THROTTLE,
        error_code=kafka_error(error),
        error_message=error_message(error),
        responses=tuple(responses),
        allow_replication_factor_change=True,
    )


async def list_partition_reassignments(context: RequestContext, request) -> object:
    """ListPartitionReassignments (46): no reassignment is ever in progress (one completes as it is
    asked), so none is listed, for any topic asked or every one. Needs Describe on the Cluster."""
    module = response_module(api_table.LIST_PARTITION_REASSIGNMENTS, context.api_version)
    try:
        context.calls.admin.authorize_cluster_describe(context.principal)
        error = None
    except BrokerError as raised:
        error = raised
    return build(
        module,
        "ListPartitionReassignmentsResponse",
        throttle_time=NO_THROTTLE,
        error_code=kafka_error(error),
        error_message=error_message(error),
        topics=(),
    )
