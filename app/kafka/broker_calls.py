"""Every call the Kafka door makes into the application core (app/coordinator), in one module: the
only one of app/kafka that imports app.coordinator, and none imports app.storage (pyproject's
import contracts).

Each call authorizes (Kafka's ACLs, as HTTP applies them), translates what a handler parsed (plain
values, record_batches' types) into the core's operations, the same ones HTTP's routes call, and
returns results or BrokerErrors (app/errors.py) per partition, which the handlers turn into Kafka's
error codes. A produce is a ProduceCommand through the same BatchedWrites as HTTP's, so the
sequence checks, fencing and transaction rules are the ones HTTP gets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from app.coordinator import (
    cluster_nodes,
    group_configs,
    scram_credentials,
    security_admin,
    topic_admin,
    transaction_admin,
)
from app.coordinator.acl_filters import MATCH, AclFilter
from app.coordinator.audit import Actor, AuditSource
from app.coordinator.authorizer import (
    ANONYMOUS,
    CLUSTER_RESOURCE,
    Operation,
    PatternType,
    Permission,
    Principal,
    ResourceType,
    authorize,
    is_allowed,
    is_allowed_on_some,
)
from app.coordinator.classic_groups import (
    CLASSIC_GROUP_TYPE,
    CONSUMER_GROUP_TYPE,
    STABLE,
    ClassicJoin,
    JoinResult,
    SyncResult,
    group_kind,
    group_type,
)
from app.coordinator.cluster_nodes import ListedNodes, LiveNode, NodeListing, NodePresence
from app.coordinator.confirmed_reads import confirmed_by_the_standby
from app.coordinator.consumer_groups import ConsumerGroupDescription, ConsumerHeartbeat, ConsumerHeartbeatResult
from app.coordinator.fetch import (  # ListOffsets' sentinels: the handlers import no core module
    EARLIEST_TIMESTAMP,  # noqa: F401
    LATEST_TIMESTAMP,  # noqa: F401
    MAX_TIMESTAMP,  # noqa: F401
    BatchFetchPosition,
    FetchedBatches,
    ReadAhead,
    fetch_batches,
    find_offsets,
)
from app.coordinator.group_coordinator import CommittedOffset, GroupCoordinator, OffsetEntry
from app.coordinator.health import CONNECTION_ERRORS, unavailable
from app.coordinator.produce import (
    BASE64,
    AppendResult,
    EncodedBatch,
    PartitionRecords,
    ProduceCommand,
)
from app.coordinator.transaction_admin import InvalidIdPattern  # noqa: F401  (ListTransactions' handler)
from app.coordinator.transaction_metadata import TRANSACTION_VERSION_BUMP, TRANSACTION_VERSION_CLASSIC
from app.coordinator.transaction_states import TransactionState
from app.errors import BrokerError, DatabaseUnavailable, ErrorCode
from app.kafka.record_batches import ProducedBatch
from app.settings import Settings
from txbroker.wire import READ_COMMITTED, READ_UNCOMMITTED

log = logging.getLogger("txbroker.kafka")

# A connection of a server with auth required before it authenticates (sasl.py serves it only
# ApiVersions and SASL): a principal allowed nothing, should anything else ever ask for one.
UNAUTHENTICATED = Principal("ANONYMOUS")
# Who a connection is with auth off: the anonymous super user, as an HTTP caller is.
AUTH_OFF_PRINCIPAL = ANONYMOUS
AUTH_REQUIRED = "required"

# What a call raises when PostgreSQL is away (unreachable, restarting, read-only, a commit its
# synchronous standby did not confirm). The calls a client makes while it is away answer it as a
# DatabaseUnavailable, which each handler answers with its API's retriable code
# (app/kafka/error_codes.py), on a connection that stays open: a broker that lost its storage keeps
# its connections, and a client whose every connection closes re-bootstraps (librdkafka), which
# forgets the coordinators it knew, and send_offsets_to_transaction could then wait past its timeout
# for a broker that no longer exists (confluentinc/librdkafka#5456, #5511). What still meets it
# (Metadata for every topic, the admin APIs) closes its connection, logged (listener.py).
DATABASE_UNAVAILABLE = CONNECTION_ERRORS


def _database_away(call: str, error: BaseException) -> DatabaseUnavailable:
    log.warning("PostgreSQL unavailable (Kafka's %s answers a retriable error): %s", call, error)
    return unavailable(error)


def answers_while_the_database_is_away(call: Callable) -> Callable:
    """`call` (one of BrokerCalls') raises DatabaseUnavailable when PostgreSQL is away, for its
    handler to answer (COORDINATOR_NOT_AVAILABLE for the coordinators' APIs, as Kafka's coordinators
    answer a request whose write to their log failed)."""

    @functools.wraps(call)
    async def answered(*args, **kwargs):
        try:
            return await call(*args, **kwargs)
        except CONNECTION_ERRORS as error:
            raise _database_away(call.__name__, error) from error

    return answered


# The errors of Metadata's topics that say what a read found absent: unconfirmed, they wait as a
# topic found does (a deletion the standby lacks comes back with a failover).
_READ_ABSENT = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID})


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str | None  # None: asked by an id no topic has
    error: BrokerError | None
    partition_count: int = 0
    is_internal: bool = False
    topic_uuid: uuid.UUID | None = None  # Kafka's topic id


def _described(topic) -> TopicMetadata:
    return TopicMetadata(topic.name, None, topic.partition_count, topic.is_internal, topic.topic_uuid)


# Fetch v13+'s topic ids resolved to names, remembered: an id is never reused, and the core's fetch
# checks the id again against the topic it reads (a stale entry answers UNKNOWN_TOPIC_ID), so an
# entry can only be outdated, never wrong. Forgotten wholesale past this many.
MAX_REMEMBERED_TOPIC_IDS = 10_000


@dataclass(frozen=True, slots=True)
class ProducedPartition:
    topic: str
    partition: int
    batch: ProducedBatch
    topic_uuid: uuid.UUID | None = None  # Produce v13+ names the topic by its id


def _encoded(batch: ProducedBatch) -> EncodedBatch:
    """The batch as the core appends it: stored as it was checked (the RecordBatch form)."""
    return EncodedBatch.record_batch(
        batch.stored,
        batch.record_count,
        batch.largest_record_bytes,
        batch.first_timestamp_ms,
        batch.max_timestamp_ms,
        batch.uncompressed_bytes,
        batch.keyless_records,
        batch.producer_timestamps,
        batch.marked_log_append_time,
    )


# A partition of a Fetch and its answer: the core's batch fetch (handlers/fetch.py reads them).
FetchPosition = BatchFetchPosition
FetchedPartition = FetchedBatches
unknown_topic_id = topic_admin.unknown_topic_id


@dataclass(frozen=True, slots=True)
class AddedPartitions:
    """Per requested partition, its error or None; with `attempted` False, None means not attempted."""

    errors: list[BrokerError | None]
    attempted: bool


@dataclass(frozen=True, slots=True)
class TxnOffset:
    topic: str
    partition: int
    offset: int
    metadata: str | None
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class EndedTransaction:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class ListedOffset:
    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str  # "consumer" for Kafka consumers; HTTP's groups are listed as "http"
    state: str
    group_type: str = CLASSIC_GROUP_TYPE  # KIP-848's: "classic" (JoinGroup's and HTTP's) or "consumer"


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: BrokerError | None
    state: str = "Dead"
    protocol_type: str = ""
    protocol: str = ""
    members: list[DescribedMember] = field(default_factory=list)
    # False for a group that does not exist (Dead, no error: DescribeGroups v6+ answers GROUP_ID_NOT_FOUND).
    found: bool = True
    # KIP-848's group type: a "consumer" group is not described by DescribeGroups (Dead; v6+:
    # GROUP_ID_NOT_FOUND, "not a classic group", as Kafka's coordinator answers).
    group_type: str = CLASSIC_GROUP_TYPE


def _denied(principal: Principal, operation: Operation, resource: ResourceType, name: str) -> BrokerError | None:
    try:
        authorize(principal, operation, resource, name)
    except BrokerError as error:
        return error
    return None


def _topic_denied(
    principal: Principal, operation: Operation, name: str, topic_uuid: uuid.UUID | None = None
) -> BrokerError | None:
    """_denied on a topic. One a request named by its id (`topic_uuid`) is refused without its name
    to a principal that may not Describe it: the id is no secret, the name may be (Kafka's rule, as
    Metadata answers such a topic)."""
    denied = _denied(principal, operation, ResourceType.TOPIC, name)
    if denied is None or topic_uuid is None or is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, name):
        return denied
    return BrokerError(
        denied.code,
        f"principal {principal.name!r} may not {operation} the topic of id {topic_uuid}: ask an administrator for "
        f"an ACL on that topic",
    )


def _internal_topic_refused(topic: str) -> BrokerError | None:
    """Kafka's broker authorizes no client to add an internal topic to a transaction (its handler
    leaves internal topics out of those it authorizes): TOPIC_AUTHORIZATION_FAILED, whoever asks."""
    if not topic_admin.is_internal_name(topic):
        return None
    return BrokerError(
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        f"topic {topic!r} is internal: no producer may add it to a transaction (AddOffsetsToTxn and "
        f"TxnOffsetCommit add the group's offsets partition)",
    )


# Kafka's operations on its Cluster resource (AclEntry.supportedOperations(CLUSTER)), each as
# txbroker's rules decide it: DescribeConfigs and AlterConfigs by Describe and Alter (as the topic's
# are, AdminCalls), ClusterAction (brokers' own requests, none of which txbroker serves) by All
# alone, IdempotentWrite as init_producer_id grants an idempotent producer id (None:
# cluster_operations: any authenticated principal, ANONYMOUS with Write on some topic).
KAFKA_CLUSTER_OPERATIONS: dict[str, Operation | None] = {
    "CREATE": Operation.CREATE,
    "ALTER": Operation.ALTER,
    "DESCRIBE": Operation.DESCRIBE,
    "CLUSTER_ACTION": Operation.ALL,
    "DESCRIBE_CONFIGS": Operation.DESCRIBE,
    "ALTER_CONFIGS": Operation.ALTER,
    "IDEMPOTENT_WRITE": None,
}
# Kafka's operations on a Topic (AclEntry.supportedOperations(TOPIC)), each as txbroker's rules on
# the topic decide it: DescribeConfigs and AlterConfigs by Describe and Alter, as AdminCalls
# authorizes them.
KAFKA_TOPIC_OPERATIONS: dict[str, Operation | None] = {
    "READ": Operation.READ,
    "WRITE": Operation.WRITE,
    "CREATE": Operation.CREATE,
    "DESCRIBE": Operation.DESCRIBE,
    "DELETE": Operation.DELETE,
    "ALTER": Operation.ALTER,
    "DESCRIBE_CONFIGS": Operation.DESCRIBE,
    "ALTER_CONFIGS": Operation.ALTER,
}
# Kafka 4's operations on a Group (AclEntry.supportedOperations(GROUP)), each decided by the same
# rule: DescribeConfigs and AlterConfigs (its group configs) by Describe and Alter, as the topic's.
KAFKA_GROUP_OPERATIONS: dict[str, Operation | None] = {
    "READ": Operation.READ,
    "DESCRIBE": Operation.DESCRIBE,
    "DELETE": Operation.DELETE,
    "DESCRIBE_CONFIGS": Operation.DESCRIBE,
    "ALTER_CONFIGS": Operation.ALTER,
}


def _authorized_operations(
    principal: Principal, operations: dict[str, Operation | None], resource_type: ResourceType, name: str
) -> list[str]:
    """Kafka's names of the `operations` `principal` may do on the resource (Kafka's
    AuthHelper.authorizedOperations): every one for a super user, as every caller is with auth off,
    as Kafka answers every supported operation without an authorizer."""
    return [
        kafka_name
        for kafka_name, operation in operations.items()
        if operation is None or is_allowed(principal, operation, resource_type, name)
    ]


def cluster_operations(principal: Principal) -> list[str]:
    """Kafka's names of the operations `principal` may do on the Cluster (Metadata's and
    DescribeCluster's authorized operations): none unless it may Describe the Cluster, as Kafka."""
    if not is_allowed(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
        return []
    operations = _authorized_operations(principal, KAFKA_CLUSTER_OPERATIONS, ResourceType.CLUSTER, CLUSTER_RESOURCE)
    if _anonymous(principal) and not is_allowed_on_some(principal, Operation.WRITE, ResourceType.TOPIC):
        operations.remove("IDEMPOTENT_WRITE")  # init_producer_id refuses it one
    return operations


def topic_operations(principal: Principal, topic: str) -> list[str]:
    """Kafka's names of the operations `principal` may do on the topic (Metadata v8+'s topic
    authorized operations, which Kafka answers for the topics the principal may Describe)."""
    return _authorized_operations(principal, KAFKA_TOPIC_OPERATIONS, ResourceType.TOPIC, topic)


def group_operations(principal: Principal, group_id: str) -> list[str]:
    """Kafka's names of the operations `principal` may do on the group (DescribeGroups v3+'s and
    ConsumerGroupDescribe's authorized operations, answered for the groups described without error)."""
    return _authorized_operations(principal, KAFKA_GROUP_OPERATIONS, ResourceType.GROUP, group_id)


class BrokerCalls:
    """The app's operations as one listener sees them (one per server process; `state` is the
    FastAPI app's state: pool, batched_writes, coordinator, notifier, settings). An operation that
    writes an audit entry takes the connection's peer, `client_address` (RequestContext's), after
    the principal: the entry names both (_actor)."""

    def __init__(self, state) -> None:
        self._state = state
        self._presence = None
        self._node = None
        # (host, port, protocol) of each listener of this node, once announced: DescribeConfigs'
        # advertised.listeners.
        self.advertised_listeners: list[tuple[str, int, str]] = []
        # (node id, protocol) of the nodes found without that listener, each logged once (node_listing).
        self._nodes_without_listener: set[tuple[int, str]] = set()
        self._listing = NodeListing(state.settings.kafka_lapsed_node_listed_ms / 1000)
        self._topic_names: dict[uuid.UUID, str] = {}
        self.groups = GroupCalls(state)
        self.admin = AdminCalls(state)
        self.transaction_admin = TransactionAdminCalls(state)
        self.acls = AclCalls(state)
        self.scram = ScramCalls(state)

    @property
    def settings(self) -> Settings:
        return self._state.settings

    @property
    def requires_authentication(self) -> bool:
        return self.settings.auth == AUTH_REQUIRED

    async def authenticate_password(self, username: str, password: str) -> PasswordAuthentication | None:
        """SASL/PLAIN's check: the principal `username` when `password` is one of its API keys or its
        SCRAM password (app/coordinator/scram_credentials.authenticate_password); None otherwise."""
        return await scram_credentials.authenticate_password(self._state.pool, username, password)

    async def authenticate(self, username: str, api_key: str) -> Principal | None:
        """A PLAIN connection's later requests, authenticated by an API key: the principal `api_key`
        belongs to (the core's authentication of an API key, as of HTTP's bearer token), when it is
        `username`; None otherwise."""
        principal = await security_admin.authenticate(self._state.pool, api_key)
        return principal if principal is not None and principal.name == username else None

    async def anonymous_principal(self) -> Principal:
        """Who a connection of a listener without SASL (PLAINTEXT, SSL) is when auth is required: the
        principal ANONYMOUS, no super user, with the ACL rules of `ANONYMOUS` and of `*` (Kafka's
        User:ANONYMOUS, which its PLAINTEXT listener's connections are), read again per request."""
        return await security_admin.anonymous_principal(self._state.pool)

    async def scram_credential(self, username: str, mechanism: str) -> ScramCredential | None:
        """What SASL/SCRAM checks a client's proof against: the principal's credential for the
        mechanism (app/coordinator/scram_credentials.py); None when it has none."""
        return await scram_credentials.credential(self._state.pool, username, mechanism)

    async def scram_authenticated(self, username: str, mechanism: str, stored_key: bytes) -> Principal | None:
        """The principal a SCRAM exchange authenticated while its credential is the one it
        authenticated with (`stored_key`); None once deleted or changed, or the principal deleted."""
        return await scram_credentials.authenticated(self._state.pool, username, mechanism, stored_key)

    # ---- this node among the others (coordinator/cluster_nodes.py)

    @property
    def node_id(self) -> int:
        return self.settings.node_id

    async def announce(self, listeners: list[tuple[str, int, str]]) -> None:
        """Shows this node as alive while its listeners serve, with the address each advertises
        ((host, port, protocol), the first listener first: its address is the one nodes of the
        version before, which know one listener, list this node at)."""
        self.advertised_listeners = listeners
        host, port, _ = listeners[0]
        self._node = LiveNode(
            self.node_id, host, port, tuple(sorted((protocol, host, port) for host, port, protocol in listeners))
        )
        if self._presence is None:
            self._presence = NodePresence(self._state.database_url)
        if not await self._presence.announce(self._node):
            log.warning(
                "kafka-node %d %s:%d is too long an application_name: other nodes cannot list it",
                self.node_id,
                host,
                port,
            )

    async def withdraw(self) -> None:
        if self._presence is not None:
            await self._presence.withdraw()

    async def node_listing(self, host: str, port: int, protocol: str) -> ListedNodes:
        """The nodes alive on this database, and apart, for kafka_lapsed_node_listed_ms, those this
        process listed that have since died, stopped or hung (NodeListing), each at its address for
        the listener of `protocol` (the one the request came in on), those without such a listener
        left out (logged once per node and protocol, as Kafka logs a broker missing the listener);
        this one (at host:port) always among the live, also while its presence connection is being
        re-opened after PostgreSQL dropped it (its next heartbeat does that: NodePresence)."""
        try:
            live = await cluster_nodes.live_nodes(self._state.pool)
            others = self._listing.listed([n for n in live if n.node_id != self.node_id])
        except CONNECTION_ERRORS as error:  # PostgreSQL away: this node alone, which answers
            _database_away("Metadata", error)
            others = ListedNodes([], [])
        reachable = others.on(protocol)
        if len(reachable.live) < len(others.live):
            self._log_nodes_without(protocol, others.live, reachable.live)
        return ListedNodes(sorted([LiveNode(self.node_id, host, port), *reachable.live]), reachable.lapsed)

    def _log_nodes_without(self, protocol: str, live: list[LiveNode], reachable: list[LiveNode]) -> None:
        kept = {node.node_id for node in reachable}
        for node in live:
            if node.node_id not in kept and (node.node_id, protocol) not in self._nodes_without_listener:
                self._nodes_without_listener.add((node.node_id, protocol))
                log.warning(
                    "kafka-node %d has no %s listener (its listeners: %s): left out of the answers to this node's "
                    "%s clients, which cannot reach it, and no leader or coordinator for them; give every node the "
                    'same listener protocols (docs/kafka.md, "Several listeners")',
                    node.node_id,
                    protocol,
                    ", ".join(p for p, _, _ in node.listeners),
                    protocol,
                )

    @property
    def ready(self) -> bool:
        return self._state.ready

    async def topic_metadata(
        self,
        principal: Principal,
        client_address: str | None,
        names: list[str] | None,
        allow_create: bool,
    ):
        """The named topics (None: every topic the principal may Describe), creating unknown ones
        when allowed (Kafka's auto.create.topics.enable and the request's flag) with Kafka's defaults;
        one not found (nor created) is UNKNOWN_TOPIC_OR_PARTITION, or INVALID_TOPIC_EXCEPTION for a
        name no topic could have, as Kafka's broker tells them apart (topic_admin.missing_topic).
        `client_address`: the connection's peer, which a topic's auto-creation is audited with.
        Answered once the synchronous standby has what was read (`_metadata_confirmed`); every topic
        (None) unconfirmed raises DatabaseUnavailable: no topic to answer it on."""
        pool = self._state.pool
        if names is None:
            listed = await topic_admin.list_topics(
                pool,
                lambda name: is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, name),
                self._state.replication_barrier,
            )
            return [_described(t) for t in listed]
        if not names:  # the brokers alone (librdkafka's frequent request): no topic read
            return []
        try:
            found = await topic_admin.find_topics(pool, names) if names else {}
        except CONNECTION_ERRORS as error:  # each topic asked is retriable, its partitions unknown meanwhile
            away = _database_away("Metadata", error)
            return [
                TopicMetadata(name, _denied(principal, Operation.DESCRIBE, ResourceType.TOPIC, name) or away)
                for name in names
            ]
        results = []
        for name in names:
            denied = _denied(principal, Operation.DESCRIBE, ResourceType.TOPIC, name)
            topic = found.get(name)
            if denied is None and topic is None and allow_create and self.settings.kafka_auto_create_topics:
                topic, denied = await self._auto_create(principal, client_address, name)
            if denied is not None:
                results.append(TopicMetadata(name, denied))
            elif topic is None:
                results.append(TopicMetadata(name, topic_admin.missing_topic(name)))
            else:
                results.append(_described(topic))
        return await self._metadata_confirmed(results)

    async def _metadata_confirmed(self, results: list[TopicMetadata]) -> list[TopicMetadata]:
        """Metadata's topics once the synchronous standby has what they were read from: as a Kafka
        broker answers only metadata its controller quorum committed, a topic whose creation a
        failover takes back (its CreateTopics answered a retriable error) is not listed yet, nor is
        one whose deletion it brings back answered as gone. Unconfirmed, each topic found or not
        found answers LEADER_NOT_AVAILABLE (DatabaseUnavailable, as while PostgreSQL is away), which
        Kafka's clients retry; a refusal stays (the principal's ACLs are read at its authentication,
        which waits for nothing)."""
        try:
            await confirmed_by_the_standby(self._state.replication_barrier, "the topics' metadata")
        except DatabaseUnavailable as unconfirmed:
            return [
                TopicMetadata(t.name, unconfirmed, topic_uuid=t.topic_uuid)
                if t.error is None or t.error.code in _READ_ABSENT
                else t
                for t in results
            ]
        return results

    async def topic_metadata_by_id(self, principal: Principal, topic_uuids: list[uuid.UUID]) -> list[TopicMetadata]:
        """Metadata v10+'s topics asked by id (KIP-516): UNKNOWN_TOPIC_ID for an id no topic has."""
        found = await topic_admin.find_topics_by_uuid(self._state.pool, topic_uuids)
        results = []
        for topic_uuid in topic_uuids:
            topic = found.get(topic_uuid)
            if topic is None:
                results.append(TopicMetadata(None, topic_admin.unknown_topic_id(topic_uuid), topic_uuid=topic_uuid))
                continue
            denied = _denied(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic.name)
            # Refused without its name, as Kafka does: the id is no secret, the name may be.
            results.append(_described(topic) if denied is None else TopicMetadata(None, denied, topic_uuid=topic_uuid))
        return await self._metadata_confirmed(results)

    async def topic_names(self, topic_uuids: set[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The names of the topics of these ids that exist (Fetch v13+)."""
        unknown = [topic_uuid for topic_uuid in topic_uuids if topic_uuid not in self._topic_names]
        if unknown:
            if len(self._topic_names) > MAX_REMEMBERED_TOPIC_IDS:
                self._topic_names.clear()
            found = await topic_admin.find_topics_by_uuid(self._state.pool, unknown)
            self._topic_names.update((topic_uuid, topic.name) for topic_uuid, topic in found.items())
        return {
            topic_uuid: self._topic_names[topic_uuid] for topic_uuid in topic_uuids if topic_uuid in self._topic_names
        }

    async def _auto_create(self, principal: Principal, client_address: str | None, name: str):
        if not is_allowed(principal, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
            denied = _denied(principal, Operation.CREATE, ResourceType.TOPIC, name)
            if denied is not None:
                return None, denied
        try:
            topic, _ = await topic_admin.create_topic(
                self._state.pool,
                _actor(principal, client_address),
                name,
                self.settings.num_partitions,
                {},
                self.settings.topic_defaults(),
                details="auto-created by a Kafka Metadata request",
            )
            return topic, None
        except topic_admin.TopicNameCollision:
            # Not created, as Kafka's controller refuses it; Kafka's broker, which asks its controller
            # to create the topic without waiting, answers it as a topic not there (yet).
            return None, topic_admin.unknown_topic(name)
        except BrokerError as error:
            if error.code == ErrorCode.TOPIC_ALREADY_EXISTS:  # a concurrent request created it first
                return (await topic_admin.find_topics(self._state.pool, [name])).get(name), None
            return None, error

    @answers_while_the_database_is_away
    async def init_producer_id(
        self, principal: Principal, transactional_id: str | None, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[int, int]:
        # As over HTTP, any authenticated caller may be an idempotent producer; an unauthenticated one
        # never gets here (sasl.py), and would be refused.
        if principal is UNAUTHENTICATED:
            raise BrokerError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "this server requires credentials: authenticate with SASL/PLAIN (username a principal, "
                "password one of its API keys) first",
            )
        if transactional_id is not None:
            authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        elif _anonymous(principal) and not is_allowed_on_some(principal, Operation.WRITE, ResourceType.TOPIC):
            # A listener without SASL authenticates nobody: its ANONYMOUS is allowed only what the
            # ACLs grant it, so an idempotent producer id (a row each) takes Kafka's rule, Write on
            # some topic, rather than being any principal's right.
            raise BrokerError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"principal {principal.name!r} (a listener without SASL: unauthenticated) may not be an idempotent "
                f"producer without Write on some topic, as Kafka's InitProducerId: grant it one (txbroker acls add "
                f"--principal {principal.name} --resource-type Topic --resource-name TOPIC --operation Write), or "
                f"connect to a SASL listener",
            )
        result = await self._state.coordinator.init_producer_id(
            transactional_id,
            timeout_ms,
            producer_id,
            epoch,
            principal=_producer_id_owner(principal),
        )
        return result.producer_id, result.producer_epoch

    @answers_while_the_database_is_away
    async def add_partitions_to_txn(
        self,
        principal: Principal,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        requested: list[tuple[str, int]],
    ) -> AddedPartitions:
        """AddPartitionsToTxn, in the order of Kafka's broker's checks: refused as a whole when the
        transactional id may not be written; then, when a topic may not be written
        (TOPIC_AUTHORIZATION_FAILED) or a partition does not exist (UNKNOWN_TOPIC_OR_PARTITION), those
        partitions are refused and the others not attempted (Kafka's OPERATION_NOT_ATTEMPTED): nothing
        is added; only then is the producer checked and are the partitions added."""
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        denied = [
            _internal_topic_refused(topic) or _denied(principal, Operation.WRITE, ResourceType.TOPIC, topic)
            for topic, _ in requested
        ]
        errors = await self._state.batched_writes.add_partitions(
            transactional_id, producer_id, producer_epoch, requested, all_or_nothing=True, refused=denied
        )
        return AddedPartitions(errors, attempted=not any(errors))

    @answers_while_the_database_is_away
    async def add_offsets_to_txn(
        self, principal: Principal, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        await self._state.batched_writes.add_offsets(transactional_id, producer_id, producer_epoch, group_id)

    @answers_while_the_database_is_away
    async def txn_offset_commit(
        self,
        principal: Principal,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        offsets: list[TxnOffset],
        group_instance_id: str | None = None,
    ) -> list[BrokerError | None]:
        """TxnOffsetCommit: one error or None per offset. With a generation (KIP-447, v3+) a zombie
        member's commit is refused, and one of a group that does not exist is ILLEGAL_GENERATION (as
        Kafka's group coordinator answers it); generation -1 (older versions) skips that check, as
        Kafka does."""
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        denied = {
            topic: _denied(principal, Operation.READ, ResourceType.TOPIC, topic) for topic in {o.topic for o in offsets}
        }
        refused = {id(o): denied[o.topic] or _unstorable(o) for o in offsets}
        allowed = [o for o in offsets if refused[id(o)] is None]
        if not allowed:  # as Kafka's broker, which then leaves the group coordinator out
            return [refused[id(o)] for o in offsets]
        errors = await self._state.group_coordinator.txn_offset_commit(
            transactional_id,
            group_id,
            producer_id,
            producer_epoch,
            generation_id,
            member_id,
            [OffsetEntry(o.topic, o.partition, o.offset, o.metadata, o.leader_epoch) for o in allowed],
            group_instance_id,
            unknown_group_error=ErrorCode.ILLEGAL_GENERATION,
        )
        by_offset = dict(zip(map(id, allowed), errors))
        return [refused[id(o)] or by_offset[id(o)] for o in offsets]

    @answers_while_the_database_is_away
    async def end_txn(
        self,
        principal: Principal,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        epoch_bump: bool,
    ) -> EndedTransaction:
        """EndTxn. `epoch_bump`: KIP-890's transaction version 2 (EndTxn v5+, as HTTP), which answers
        the producer id and epoch of the next transaction; else version 1, the ids carrying over."""
        authorize(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
        result = await self._state.batched_writes.end_transaction(
            transactional_id,
            producer_id,
            producer_epoch,
            commit,
            TRANSACTION_VERSION_BUMP if epoch_bump else TRANSACTION_VERSION_CLASSIC,
        )
        return EndedTransaction(result.producer_id, result.producer_epoch)

    def submit_produce(
        self, principal: Principal, transactional_id: str | None, partitions: list[ProducedPartition]
    ) -> Awaitable[list[AppendResult | BrokerError]]:
        """Produce, submitted now and answered later: what is returned waits for the commits and is
        one result per partition, in order. Before this returns the partitions are authorized and
        each command is queued for a write batch (BatchedWrites.enqueue_produce) behind every request
        queued before it, so that a connection's pipelined Produce requests are appended in the order
        they came (listener.py). The partitions' batches are written together when they share a
        producer (as every client sends them), else in one command per producer."""
        results: list[AppendResult | BrokerError | None] = [None] * len(partitions)
        for index, entry in enumerate(partitions):
            results[index] = _topic_denied(principal, Operation.WRITE, entry.topic, entry.topic_uuid)
        if transactional_id is not None:
            denied = _denied(principal, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)
            results = [result or denied for result in results]
        by_producer: dict[tuple[int, int], list[int]] = {}
        commands: list[tuple[list[int], asyncio.Future | BrokerError]] = []
        for index, entry in enumerate(partitions):
            if results[index] is None:
                by_producer.setdefault((entry.batch.producer_id, entry.batch.producer_epoch), []).append(index)
        for (producer_id, producer_epoch), indexes in by_producer.items():
            command = ProduceCommand(
                transactional_id,
                producer_id,
                producer_epoch,
                BASE64,
                [
                    PartitionRecords(
                        partitions[i].topic,
                        partitions[i].partition,
                        partitions[i].batch.base_sequence,
                        (),
                        _encoded(partitions[i].batch),
                        partitions[i].topic_uuid,
                    )
                    for i in indexes
                ],
                takes_expired_producers=True,
                principal=_producer_id_owner(principal),
            )
            try:
                commands.append((indexes, self._state.batched_writes.enqueue_produce(command)))
            except BrokerError as error:  # request-level: nothing of this command was written
                commands.append((indexes, error))
        # Gathered now, so that the commits' answers are taken (and cancelled with it) even if what
        # is returned is never awaited: a connection closed with answers pending (listener.py).
        written = asyncio.gather(
            *(queued for _, queued in commands if not isinstance(queued, BrokerError)), return_exceptions=True
        )
        return self._produced(partitions, results, commands, written)

    async def _produced(self, partitions, results, commands, written) -> list[AppendResult | BrokerError]:
        answers = iter(await written)
        for indexes, queued in commands:
            answer = queued if isinstance(queued, BrokerError) else next(answers)
            if isinstance(answer, CONNECTION_ERRORS):  # its commit unknown: retriable, possibly written
                answer = _database_away("Produce", answer)
            if isinstance(answer, BrokerError):  # request-level: nothing of this command was written
                answer = [answer] * len(indexes)
            elif isinstance(answer, BaseException):
                raise answer
            for index, result in zip(indexes, answer):
                results[index] = result
        self._state.metrics.records_produced.inc(
            sum(
                entry.batch.record_count
                for entry, result in zip(partitions, results)
                if isinstance(result, AppendResult) and not result.duplicate
            )
        )
        return results

    async def fetch(
        self,
        principal: Principal,
        positions: list[FetchPosition],
        read_committed: bool,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        read_ahead: ReadAhead | None = None,
    ) -> list[FetchedPartition]:
        """Kafka's Fetch: returns once the batches read reach min_bytes (or any partition has an
        error), else once max_wait_ms (capped by the server's max_wait_ms) has passed, re-reading
        whenever one of the partitions gets an append (the notifier HTTP's long polls use).
        `read_ahead`: the connection's (new_read_ahead), which reads its next request while the
        client parses this answer, when this one leaves it behind. `max_bytes` and `min_bytes` are
        capped by kafka_fetch_max_bytes, as Kafka's broker caps them by its fetch.max.bytes: a client
        asking 2 GiB (or v0-v2, which cannot ask a limit) must not make the node read and hold that
        much for one answer."""
        fetch_max_bytes = min(max_bytes, self.settings.kafka_fetch_max_bytes)
        denied = {
            topic: _denied(principal, Operation.READ, ResourceType.TOPIC, topic)
            for topic in {p.topic for p in positions}
        }
        try:
            results = await fetch_batches(
                self._state.pool,
                self._state.notifier,
                self._state.replication_barrier,
                positions,
                denied,
                read_committed,
                min(max_wait_ms, self.settings.max_wait_ms),
                min(min_bytes, fetch_max_bytes),
                fetch_max_bytes,
                read_ahead,
            )
        except CONNECTION_ERRORS as error:  # every partition answers at once, retriable
            away = _database_away("Fetch", error)
            return [FetchedPartition(p, error=denied[p.topic] or away) for p in positions]
        return self._counted(results)

    def count_request(self, api: str, seconds: float, errors: Iterable[str]) -> None:
        """A Kafka request served, in the node's metrics (request_metrics.py says what is counted)."""
        self._state.metrics.count_kafka_request(api, seconds, errors)

    def new_read_ahead(self) -> ReadAhead:
        """A connection's read ahead for its Fetch requests, counted in the node's metrics; the
        connection closes it at its end."""
        metrics = self._state.metrics
        return ReadAhead(metrics.fetches_read_ahead.inc, metrics.fetch_reads_ahead_unused.inc)

    def _counted(self, results: list[FetchedPartition]) -> list[FetchedPartition]:
        self._state.metrics.records_fetched.inc(
            sum(batch.record_count for r in results for batch in r.batches if batch.control_type is None)
        )
        return results

    @answers_while_the_database_is_away
    async def list_offset(
        self, principal: Principal, topic_name: str, partition: int, timestamp: int, read_committed: bool
    ) -> ListedOffset:
        """Kafka's ListOffsets for one partition: latest (-1), earliest (-2) or by time."""
        authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic_name)
        [found] = await find_offsets(
            self._state.pool,
            self._state.replication_barrier,
            [(topic_name, partition, timestamp)],
            READ_COMMITTED if read_committed else READ_UNCOMMITTED,
        )
        if found.error is not None:
            raise found.error
        return ListedOffset(found.offset, found.timestamp_ms)


# Kafka's offset.metadata.max.bytes (its default), counted in characters as Kafka counts it.
OFFSET_METADATA_MAX_CHARS = 4096


def _unstorable(entry: OffsetEntry | TxnOffset) -> BrokerError | None:
    """Kafka's OffsetCommit and TxnOffsetCommit answer per partition, so only that offset is refused:
    metadata over Kafka's limit (OFFSET_METADATA_TOO_LARGE, as its group coordinator). NUL characters
    are kept, as Kafka keeps them (storage's offset_metadata writes them in a form text can hold)."""
    if entry.metadata is not None and len(entry.metadata) > OFFSET_METADATA_MAX_CHARS:
        return BrokerError(
            ErrorCode.OFFSET_METADATA_TOO_LARGE,
            f"the metadata of the offset of {entry.topic}-{entry.partition} has {len(entry.metadata)} characters: "
            f"expected at most {OFFSET_METADATA_MAX_CHARS}",
        )
    return None


class GroupCalls:
    """Consumer groups, with the group coordinator HTTP's /v1/groups uses (the classic protocol is
    its `classic` part). Kafka's ACLs as HTTP applies them: Read on the group to be a member or
    commit, Describe to fetch offsets or describe; Read on a topic to commit its offsets."""

    def __init__(self, state) -> None:
        self._state = state

    @property
    def _groups(self) -> GroupCoordinator:
        return self._state.group_coordinator

    @staticmethod
    def coordinator_refusal(principal: Principal, key: str, transactional: bool) -> BrokerError | None:
        """FindCoordinator's check, as Kafka's broker makes it before it answers a coordinator:
        Describe on the group (GROUP_AUTHORIZATION_FAILED), or on the transactional id when
        `transactional` (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); None when allowed."""
        resource = ResourceType.TRANSACTIONAL_ID if transactional else ResourceType.GROUP
        return _denied(principal, Operation.DESCRIBE, resource, key)

    @answers_while_the_database_is_away
    async def join(self, principal: Principal, request: ClassicJoin) -> JoinResult:
        authorize(principal, Operation.READ, ResourceType.GROUP, request.group_id)
        return await self._groups.classic.join(request)

    @answers_while_the_database_is_away
    async def consumer_heartbeat(self, principal: Principal, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        """ConsumerGroupHeartbeat: Read on the group, then Describe on each subscribed topic (as Kafka's
        broker: TOPIC_AUTHORIZATION_FAILED when one is denied); a regular expression subscribes the
        member only to the matching topics it may Describe."""
        authorize(principal, Operation.READ, ResourceType.GROUP, request.group_id)
        for topic in request.subscribed_topic_names or ():
            denied = _denied(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic)
            if denied is not None:
                raise denied
        return await self._groups.consumer.heartbeat(
            dataclasses.replace(
                request, may_describe=lambda topic: is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic)
            )
        )

    @answers_while_the_database_is_away
    async def sync(
        self,
        principal: Principal,
        group_id: str,
        member_id: str,
        generation_id: int,
        assignments: dict[str, bytes],
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncResult:
        """`protocol_type`, `protocol_name`: as SyncGroup v5+ names them (None: not named)."""
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        return await self._groups.classic.sync(
            group_id, member_id, generation_id, assignments, group_instance_id, protocol_type, protocol_name
        )

    @answers_while_the_database_is_away
    async def heartbeat(
        self, principal: Principal, group_id: str, member_id: str, generation_id: int, group_instance_id: str | None
    ) -> None:
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        await self._groups.classic.heartbeat(group_id, member_id, generation_id, group_instance_id)

    @answers_while_the_database_is_away
    async def leave(
        self, principal: Principal, group_id: str, leaving: list[tuple[str, str | None]]
    ) -> list[BrokerError | None]:
        """leaving: (member id, group instance id) each."""
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        return await self._groups.classic.leave(group_id, leaving)

    @answers_while_the_database_is_away
    async def commit_offsets(
        self,
        principal: Principal,
        group_id: str,
        member_id: str,
        generation_id: int,
        offsets: list[tuple[str, int, int, str | None, int]],
        group_instance_id: str | None = None,
        unknown_group_error: ErrorCode = ErrorCode.ILLEGAL_GENERATION,
    ) -> list[BrokerError | None]:
        """offsets: (topic, partition, offset, metadata, leader epoch) each; one error or None per entry.
        `unknown_group_error`: as GroupCoordinator.commit_offsets (the answer of each existing partition
        of a commit naming a generation of a group that does not exist)."""
        authorize(principal, Operation.READ, ResourceType.GROUP, group_id)
        entries = [OffsetEntry(*entry) for entry in offsets]
        errors = [_denied(principal, Operation.READ, ResourceType.TOPIC, e.topic) or _unstorable(e) for e in entries]
        allowed = [e for e, error in zip(entries, errors) if error is None]
        committed = iter(
            await self._groups.commit_offsets(
                group_id, member_id, generation_id, allowed, group_instance_id, unknown_group_error
            )
            if allowed
            else []
        )
        return [error if error is not None else next(committed) for error in errors]

    @answers_while_the_database_is_away
    async def fetch_offsets(
        self,
        principal: Principal,
        group_id: str,
        partitions: list[tuple[str, int]] | None,
        require_stable: bool,
        member_id: str | None = None,
        member_epoch: int = -1,
    ) -> list[tuple[CommittedOffset, BrokerError | None]]:
        """A topic the principal may not Describe answers TOPIC_AUTHORIZATION_FAILED before any error of
        its offset (UNSTABLE_OFFSET_COMMIT would tell it a transaction commits one), as Kafka's broker
        never asks its group coordinator about such topics; asked for every offset, it is left out."""
        authorize(principal, Operation.DESCRIBE, ResourceType.GROUP, group_id)
        found = await self._groups.fetch_offsets(group_id, partitions, require_stable, member_id, member_epoch)
        return [
            (committed, _denied(principal, Operation.DESCRIBE, ResourceType.TOPIC, committed.topic) or error)
            for committed, error in found
            if partitions is not None or is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, committed.topic)
        ]

    @answers_while_the_database_is_away
    async def delete_group(self, principal: Principal, client_address: str | None, group_id: str) -> None:
        """DeleteGroups of one group: Delete on the group (GROUP_AUTHORIZATION_FAILED), then as
        HTTP's DELETE /v1/groups/{group_id} (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND)."""
        authorize(principal, Operation.DELETE, ResourceType.GROUP, group_id)
        await self._groups.delete(_actor(principal, client_address), group_id)

    @answers_while_the_database_is_away
    async def delete_offsets(
        self, principal: Principal, client_address: str | None, group_id: str, partitions: list[tuple[str, int]]
    ) -> list[BrokerError | None]:
        """OffsetDelete: Delete on the group (GROUP_AUTHORIZATION_FAILED for the request), Read on
        each topic (TOPIC_AUTHORIZATION_FAILED for its partitions only), then as HTTP's
        /v1/groups/{group_id}/offsets/delete (its group errors raised); one error or None per
        (topic, partition)."""
        authorize(principal, Operation.DELETE, ResourceType.GROUP, group_id)
        errors = [_denied(principal, Operation.READ, ResourceType.TOPIC, topic) for topic, _ in partitions]
        allowed = [key for key, error in zip(partitions, errors) if error is None]
        # Asked even with no partition left, as Kafka's broker asks its coordinator: the group's own
        # errors (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP) answer the request whatever its partitions.
        deleted = iter(await self._groups.delete_offsets(_actor(principal, client_address), group_id, allowed))
        return [error if error is not None else next(deleted) for error in errors]

    @answers_while_the_database_is_away
    async def describe_consumer_group(self, principal: Principal, group_id: str) -> ConsumerGroupDescription:
        """ConsumerGroupDescribe of one group: Describe on the group (GROUP_AUTHORIZATION_FAILED), then
        on every topic its members subscribe to or are assigned (TOPIC_AUTHORIZATION_FAILED for the
        group, as Kafka's broker answers: the description would name them)."""
        authorize(principal, Operation.DESCRIBE, ResourceType.GROUP, group_id)
        described = await self._groups.describe_consumer_group(group_id)
        named = {
            topic
            for m in described.members
            for topic in [*m.subscribed_topic_names, *m.assignment, *m.target_assignment]
        }
        if any(not is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic) for topic in named):
            raise BrokerError(
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                f"group {group_id!r} has members of topics this principal may not Describe: ask for Describe "
                f"on every topic its members subscribe to",
            )
        return described

    async def list_groups(self, principal: Principal) -> list[ListedGroup]:
        listed = []
        for group, member_count in await self._groups.list():
            if is_allowed(principal, Operation.DESCRIBE, ResourceType.GROUP, group.group_id):
                protocol_type, state, _ = group_kind(group, member_count)
                listed.append(ListedGroup(group.group_id, protocol_type, state, group_type(group)))
        return listed

    async def describe_group(self, principal: Principal, group_id: str) -> DescribedGroup:
        denied = _denied(principal, Operation.DESCRIBE, ResourceType.GROUP, group_id)
        if denied is not None:
            return DescribedGroup(group_id, denied)
        try:
            described = await self._groups.describe(group_id, with_offsets=False)  # it shows none
        except BrokerError as error:
            # Kafka describes an unknown group as Dead; any other error is the group's own
            # (INVALID_GROUP_ID), the other groups of the request still described.
            if error.code == ErrorCode.GROUP_ID_NOT_FOUND:
                return DescribedGroup(group_id, None, found=False)
            return DescribedGroup(group_id, error)
        if group_type(described.group) == CONSUMER_GROUP_TYPE:
            return DescribedGroup(group_id, None, found=False, group_type=CONSUMER_GROUP_TYPE)
        protocol_type, state, protocol = group_kind(described.group, len(described.members))
        classic = self._groups.classic.described_members(described.group)
        # As Kafka's coordinator describes a group: only a Stable one has a protocol and members'
        # metadata and assignments; a rebalancing one (its assignments those of a generation
        # that is ending, or none yet) is described without them.
        stable = state == STABLE
        members = []
        for member in described.members:
            kafka_side = classic.get(member.member_id)
            if kafka_side is None:  # an HTTP member: no client bytes, its range assignment described in JSON
                members.append(DescribedMember(member.member_id, None, "http", "", b"", b""))
            else:
                members.append(
                    DescribedMember(
                        member.member_id,
                        kafka_side["group_instance_id"],
                        kafka_side["client_id"],
                        kafka_side["client_host"],
                        kafka_side["metadata"] if stable else b"",
                        kafka_side["assignment"] if stable else b"",
                    )
                )
        return DescribedGroup(group_id, None, state, protocol_type, protocol if stable else "", members)


# Kafka's topic configs (the core's table: topic_admin.TOPIC_CONFIG_SPECS), by Kafka's name.
KAFKA_CONFIG_NAMES = {spec.name: spec.key for spec in topic_admin.TOPIC_CONFIG_SPECS}
# IncrementalAlterConfigs' operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str  # Kafka's name
    value: str
    server_default: str  # what the server gives topics created without it
    kind: str  # Kafka's type name (LONG, LIST, ...)
    documentation: str


def _config_key(name: str) -> str:
    return topic_admin.topic_config_spec(name, kafka_name=True).key


def _config_value(key: str, text: str | None):
    """A config's value as Kafka's protocol carries it (text), read as Kafka reads it; INVALID_CONFIG if bad."""
    return topic_admin.parsed_config_text(key, text)


def _altered(config: dict, alterations: list[tuple[str, int, str | None]], defaults: dict) -> dict:
    """The config after IncrementalAlterConfigs' operations (SET, DELETE: back to the default,
    APPEND/SUBTRACT: to and from a list config, cleanup.policy or the throttled replicas)."""
    config = dict(config)
    for name, operation, text in alterations:
        spec = topic_admin.topic_config_spec(name, kafka_name=True)
        key = spec.key
        if operation == SET:
            config[key] = _config_value(key, text)
        elif operation == DELETE:  # back to the server's default, or to Kafka's for a config it gives none
            if key in defaults:
                config[key] = defaults[key]
            else:
                config.pop(key, None)
        elif operation in (APPEND, SUBTRACT) and spec.kind == "LIST":
            current = config.get(key, topic_admin.KAFKA_CONFIG_DEFAULTS[key])
            config[key] = ",".join(_list_altered(current, operation, text or ""))
        else:
            raise BrokerError(
                ErrorCode.INVALID_CONFIG,
                f"operation {operation} on {name!r}: expected 0 (set) or 1 (delete), or 2 (append) / 3 (subtract) "
                f"on a list config (cleanup.policy, leader.replication.throttled.replicas, "
                f"follower.replication.throttled.replicas)",
            )
    return config


def _list_altered(current: str, operation: int, given: str) -> list[str]:
    """A list config after APPEND (each value it lacks added at its end, once however often given)
    or SUBTRACT (each value given removed once), its order kept, as Kafka's controller alters one
    (ConfigurationControlManager.incrementalAlterConfigResource)."""
    values = [v for v in current.split(",") if v]
    if operation == APPEND:
        for value in given.split(","):
            if value not in values:
                values.append(value)
        return values
    for value in given.split(","):
        if value in values:
            values.remove(value)
    return values


# How an audit entry writes each of IncrementalAlterConfigs' operations on a config.
_OPERATION_FORMS = {SET: "{}={}", DELETE: "{} back to its default", APPEND: "{}+={}", SUBTRACT: "{}-={}"}


def _described_alterations(alterations: list[tuple[str, int, str | None]]) -> str:
    """What an audit entry says of a topic's config alterations: `retention.ms=1000, segment.ms back to
    its default, cleanup.policy+=compact` (the operation's number when it is none of Kafka's four,
    which _altered refuses)."""
    return ", ".join(
        _OPERATION_FORMS.get(operation, f"{{}} operation {operation} {{}}").format(name, text)
        for name, operation, text in alterations
    )


def _replacement(configs: list[tuple[str, str | None]]) -> list[tuple[str, int, str | None]]:
    """AlterConfigs' replacement of a topic's configs as IncrementalAlterConfigs' operations: SET
    for each config given (handlers/admin.py refuses a config given twice or with a null value, as a
    Kafka broker), DELETE (back to the server's default) for every one not given."""
    given = [(name, SET, value) for name, value in configs]
    named = {name for name, _ in configs}
    return given + [(name, DELETE, None) for name in sorted(KAFKA_CONFIG_NAMES) if name not in named]


class AdminCalls:
    """Kafka's topic admin APIs on the operations HTTP's /v1/topics uses, with its ACLs (Create on
    the cluster or the topic, Delete on the topic, DescribeConfigs / AlterConfigs on the topic) and
    its audit entries."""

    def __init__(self, state) -> None:
        self._state = state

    @property
    def _defaults(self) -> dict:
        return {**topic_admin.DEFAULT_TOPIC_CONFIG, **self._state.settings.topic_defaults()}

    async def create_topic(
        self,
        principal: Principal,
        client_address: str | None,
        name: str,
        partitions: int | None,
        configs: dict[str, str | None],
        validate_only: bool,
    ):
        """`partitions` None: the server's num_partitions (CreateTopics' -1). Refused as Kafka's
        controller refuses it: for its name, then because the topic exists, before its configs and
        its partition count (a creation of a topic that exists is TOPIC_ALREADY_EXISTS whatever
        else it asks: what a client creating its topics when absent takes for "there already")."""
        if partitions is None:
            partitions = self._state.settings.num_partitions
        if not is_allowed(principal, Operation.CREATE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
            authorize(principal, Operation.CREATE, ResourceType.TOPIC, name)
        try:
            config = {}
            for config_name, text in configs.items():
                key = _config_key(config_name)
                config[key] = _config_value(key, text)
            topic, _ = await topic_admin.create_topic(
                self._state.pool,
                _actor(principal, client_address),
                name,
                partitions,
                config,
                self._state.settings.topic_defaults(),
                details=f"partitions={partitions}",
                validate_only=validate_only,
            )
        except BrokerError as refused:
            if refused.code not in (ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_PARTITIONS):
                raise
            # Looked for only once refused: the insert itself tells an existing topic otherwise.
            raise await topic_admin.refused_before_its_settings(self._state.pool, name) or refused from None
        return topic

    async def delete_topic(self, principal: Principal, client_address: str | None, name: str) -> uuid.UUID:
        """Returns the deleted topic's id."""
        authorize(principal, Operation.DELETE, ResourceType.TOPIC, name)
        return await topic_admin.delete_topic(self._state.pool, _actor(principal, client_address), name)

    async def delete_topic_by_id(self, principal: Principal, client_address: str | None, topic_uuid: uuid.UUID) -> str:
        """DeleteTopics v6 by id: the topic of that id, never one re-created under its name since
        (UNKNOWN_TOPIC_ID). Returns its name."""
        topic = (await topic_admin.find_topics_by_uuid(self._state.pool, [topic_uuid])).get(topic_uuid)
        if topic is None:
            raise topic_admin.unknown_topic_id(topic_uuid)
        denied = _topic_denied(principal, Operation.DELETE, topic.name, topic_uuid)
        if denied is not None:
            raise denied
        await topic_admin.delete_topic(self._state.pool, _actor(principal, client_address), topic.name, topic_uuid)
        return topic.name

    async def grow_partitions(
        self,
        principal: Principal,
        client_address: str | None,
        name: str,
        count: int,
        validate_only: bool,
        check_added: Callable[[int], None] | None = None,
    ) -> None:
        """Kafka's CreatePartitions: the topic's partition count raised to `count` (Alter on the topic);
        `check_added` as topic_admin.grow_partitions' (the request's replica assignments)."""
        authorize(principal, Operation.ALTER, ResourceType.TOPIC, name)
        await topic_admin.grow_partitions(
            self._state.pool,
            _actor(principal, client_address),
            name,
            count,
            validate_only=validate_only,
            check_added=check_added,
        )

    async def replicas_to_alter(self, principal: Principal, names: list[str] | None) -> dict[str, int]:
        """Kafka's APIs on replicas, which need Alter on the Cluster (ElectLeaders,
        AlterPartitionReassignments, AlterReplicaLogDirs): the partition count of each named topic
        that exists (None: of every topic). A partition's one replica is in PostgreSQL, which every
        node reaches, and whichever node answers leads it: there is nothing to elect or move."""
        authorize(principal, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        if names is None:
            found = await topic_admin.list_topics(self._state.pool)
        else:
            found = (await topic_admin.find_topics(self._state.pool, names)).values()
        return {topic.name: topic.partition_count for topic in found}

    def authorize_cluster_describe(self, principal: Principal) -> None:
        """Kafka's ListPartitionReassignments needs Describe on the Cluster."""
        authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)

    async def stored_bytes(self, principal: Principal, names: list[str] | None) -> dict[str, dict[int, int]]:
        """Kafka's DescribeLogDirs, which needs Describe on the Cluster: each partition's stored
        bytes (as retention by size counts them) of the named topics that exist (None: every topic)."""
        authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        return await topic_admin.stored_bytes(self._state.pool, names)

    async def configs_confirmed(self) -> None:
        """Returns once the synchronous standby has the configs read before (describe_config's,
        describe_group_config's: DescribeConfigs confirms its request's resources at once, after
        reading them all); DatabaseUnavailable when it has not within READ_WAIT_MIN_S. A config
        change the standby lacks (its request answered a retriable error) is taken back by a
        failover, and an operator who saw it in force would not make it again."""
        await confirmed_by_the_standby(self._state.replication_barrier, "the configs described")

    async def describe_config(self, principal: Principal, name: str, keys: list[str] | None) -> list[ConfigEntry]:
        """A topic's configs (`keys`: those named only; None: every one), or its absence, to be
        confirmed (configs_confirmed)."""
        authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, name)  # Kafka: DescribeConfigs, implied by it
        topic = (await topic_admin.find_topics(self._state.pool, [name])).get(name)
        if topic is None:  # as Kafka's broker: an invalid name is INVALID_TOPIC_EXCEPTION, not unknown
            raise topic_admin.missing_topic(name)
        return self._config_entries(topic, keys)

    def created_configs(self, principal: Principal, topic: topic_admin.TopicInfo) -> list[ConfigEntry] | None:
        """CreateTopics v5+'s configs of a topic it created (or validated): every config, as
        DescribeConfigs describes it, for a principal that may describe them (Kafka: DescribeConfigs
        on the topic, which txbroker's Describe stands for); None for another, whom Kafka answers
        TOPIC_AUTHORIZATION_FAILED as the topic's config error, the topic created all the same."""
        if not is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
            return None
        return self._config_entries(topic, None)

    def _config_entries(self, topic: topic_admin.TopicInfo, keys: list[str] | None) -> list[ConfigEntry]:
        defaults = {**topic_admin.KAFKA_CONFIG_DEFAULTS, **self._defaults}
        entries = []
        for spec in sorted(topic_admin.TOPIC_CONFIG_SPECS, key=lambda spec: spec.name):
            if keys is not None and spec.name not in keys:
                continue
            entries.append(
                ConfigEntry(
                    spec.name,
                    topic_admin.described_config_text(topic.setting(spec.key)),
                    topic_admin.described_config_text(defaults[spec.key]),
                    str(spec.kind),
                    spec.documentation,
                )
            )
        return entries

    def broker_settings(self, principal: Principal) -> Settings:
        """DescribeConfigs of this node's broker resource, which needs Describe on the Cluster (Kafka:
        DescribeConfigs on the Cluster, which txbroker's Describe stands for): the server's settings."""
        authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        return self._state.settings

    async def alter_config(
        self,
        principal: Principal,
        client_address: str | None,
        name: str,
        alterations: list[tuple[str, int, str | None]],
        validate_only: bool,
        details: str | None = None,
    ) -> None:
        """IncrementalAlterConfigs' operations on the topic's configs; `details`: the audit entry's
        (default: each operation, _described_alterations)."""
        authorize(principal, Operation.ALTER, ResourceType.TOPIC, name)  # Kafka: AlterConfigs, implied by Alter
        defaults = self._defaults
        await topic_admin.alter_config(
            self._state.pool,
            _actor(principal, client_address),
            name,
            lambda config: _altered(config, alterations, defaults),
            defaults,
            details or _described_alterations(alterations),
            validate_only=validate_only,
        )

    async def replace_config(
        self,
        principal: Principal,
        client_address: str | None,
        name: str,
        configs: list[tuple[str, str | None]],
        validate_only: bool,
    ) -> None:
        """Kafka's AlterConfigs: the topic's configs become those given, the others the defaults."""
        given = _described_alterations([(config, SET, value) for config, value in configs])
        await self.alter_config(
            principal,
            client_address,
            name,
            _replacement(configs),
            validate_only,
            f"replaced: {given or 'none given'}; every other config back to its default",
        )

    async def describe_group_config(self, principal: Principal, group_id: str) -> list[group_configs.GroupConfigEntry]:
        """A group's configs (Kafka's group configs: the group need not exist), to be confirmed
        (configs_confirmed). Needs Describe on the group (Kafka: DescribeConfigs on it, which
        txbroker's Describe stands for, as a topic's)."""
        authorize(principal, Operation.DESCRIBE, ResourceType.GROUP, group_id)
        return await group_configs.describe(self._state.pool, self._state.settings, group_id)

    async def alter_group_config(
        self,
        principal: Principal,
        client_address: str | None,
        group_id: str,
        alterations: list[tuple[str, int, str | None]],
        validate_only: bool,
        replace: bool = False,
    ) -> None:
        """IncrementalAlterConfigs' operations on a group's configs (`replace`: AlterConfigs', every
        config not named back to its default). Needs Alter on the group (Kafka: AlterConfigs on it)."""
        authorize(principal, Operation.ALTER, ResourceType.GROUP, group_id)
        changes: dict[str, str | None] = {}
        for name, operation, text in alterations:
            if operation not in (SET, DELETE):
                raise BrokerError(
                    ErrorCode.INVALID_CONFIG,
                    f"operation {operation} on {name!r}: a group config is an INT; expected 0 (set) or 1 (delete)",
                )
            changes[name] = text if operation == SET else None
        await group_configs.alter(
            self._state.pool,
            self._state.settings,
            _actor(principal, client_address),
            group_id,
            changes,
            ("replaced: " if replace else "") + (_described_alterations(alterations) or "none given"),
            replace=replace,
            validate_only=validate_only,
        )

    async def replace_group_config(
        self,
        principal: Principal,
        client_address: str | None,
        group_id: str,
        configs: list[tuple[str, str | None]],
        validate_only: bool,
    ) -> None:
        """Kafka's AlterConfigs on a group: its configs become those given, the others the defaults."""
        alterations = [(name, SET, value) for name, value in configs]
        await self.alter_group_config(principal, client_address, group_id, alterations, validate_only, replace=True)

    async def delete_records(
        self, principal: Principal, client_address: str | None, name: str, offsets: list[tuple[int, int]]
    ) -> list:
        """(partition, offset) each (offset -1: the high watermark); the new low watermark or a BrokerError each."""
        authorize(principal, Operation.DELETE, ResourceType.TOPIC, name)
        deleted = await topic_admin.delete_records(self._state.pool, _actor(principal, client_address), name, offsets)
        return [answer.low_watermark if answer.error is None else answer.error for answer in deleted]


# Kafka's transaction state names are txbroker's (TransactionState's values), but for KIP-939's
# Prepared, which Kafka's coordinator keeps as Ongoing (a prepared transaction is still open).
_KAFKA_STATE_NAMES = {
    state: (TransactionState.ONGOING if state == TransactionState.PREPARED else state).value
    for state in TransactionState
}


def kafka_state_filter(names: list[str]) -> tuple[list[str], list[str]]:
    """ListTransactions' state filters as txbroker's persisted states, and the names Kafka does not
    know (answered back in unknown_state_filters)."""
    states = [state.value for state in TransactionState if _KAFKA_STATE_NAMES[state] in names]
    known = set(_KAFKA_STATE_NAMES.values())
    return states, [name for name in names if name not in known]


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    state: str  # Kafka's name


@dataclass(frozen=True, slots=True)
class ListedTransactions:
    transactions: list[ListedTransaction]
    unknown_state_filters: list[str]


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    transactional_id: str
    error: BrokerError | None
    # With an error, the rest as Kafka leaves them: the schema's defaults.
    state: str = ""  # Kafka's name
    timeout_ms: int = 0
    start_time_ms: int = 0  # -1 (the transactions row's) when no transaction is open
    producer_id: int = 0
    producer_epoch: int = 0
    partitions: dict[str, list[int]] = field(default_factory=dict)  # topic -> partitions of the transaction


class TransactionAdminCalls:
    """KIP-664's APIs on the core's transaction admin (the operations HTTP's /v1/transactions and
    /v1/topics/{topic}/partitions/{partition}/producers call), with Kafka's ACLs: ListTransactions
    lists the ids the principal may Describe, DescribeTransactions needs Describe on the id (and
    shows the partitions of topics it may Describe), DescribeProducers needs Read on the topic."""

    def __init__(self, state) -> None:
        self._state = state

    async def list_transactions(
        self,
        principal: Principal,
        state_filters: list[str],
        producer_ids: list[int],
        min_duration_ms: int | None,
        id_pattern: str | None,
    ) -> ListedTransactions:
        """`id_pattern`: ListTransactions v2's pattern, matched against the whole id (None: every id);
        raises InvalidIdPattern."""
        states, unknown = kafka_state_filter(state_filters)
        if state_filters and not states:  # only states Kafka does not know: none can match
            return ListedTransactions([], unknown)
        found = await transaction_admin.list_transactions(
            self._state.coordinator,
            transaction_admin.TransactionFilter(
                states or None, None, frozenset(producer_ids) or None, min_duration_ms, id_pattern
            ),
            lambda transactional_id: is_allowed(
                principal, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id
            ),
        )
        return ListedTransactions(
            [ListedTransaction(m.transactional_id, m.producer_id, _KAFKA_STATE_NAMES[m.state]) for m in found],
            unknown,
        )

    async def describe_transaction(self, principal: Principal, transactional_id: str) -> DescribedTransaction:
        try:
            authorize(principal, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id)
            if not transactional_id:
                raise BrokerError(ErrorCode.INVALID_REQUEST, "an empty transactional id: name one")
            meta = await self._state.coordinator.describe(transactional_id)
        except BrokerError as error:
            return DescribedTransaction(transactional_id, error)
        partitions: dict[str, list[int]] = {}
        for entry in meta.partitions:
            if is_allowed(principal, Operation.DESCRIBE, ResourceType.TOPIC, entry.topic):
                partitions.setdefault(entry.topic, []).append(entry.partition)
        return DescribedTransaction(
            transactional_id,
            None,
            _KAFKA_STATE_NAMES[meta.state],
            meta.timeout_ms,
            meta.txn_start_ms,
            meta.producer_id,
            meta.producer_epoch,
            partitions,
        )

    async def describe_producers(self, principal: Principal, topic: str, partitions: list[int]) -> list:
        """Per partition, its producers with state (the core's PartitionProducer: producer id and
        epoch, last sequence, last timestamp, current transaction's first offset or None) or a
        BrokerError."""
        denied = _denied(principal, Operation.READ, ResourceType.TOPIC, topic)
        if denied is not None:
            return [denied] * len(partitions)
        return await transaction_admin.describe_producers_of(self._state.coordinator, topic, partitions)


# The rules of Kafka's ACL APIs as the core holds them (security_admin's, HTTP's /v1/acls), and the
# names handlers/acls.py gives their parts: the authorizer's enums and the filters' MATCH.
AclRule = security_admin.AclRow
AclResourceType, AclPatternType, AclOperation, AclPermission = ResourceType, PatternType, Operation, Permission
ACL_FILTER_MATCH = MATCH


class AclCalls:
    """Kafka's CreateAcls, DescribeAcls and DeleteAcls on the core's rules, the ones HTTP's
    /v1/acls adds, lists and removes, with its ACLs: Alter on the Cluster to change them, Describe
    on the Cluster to list them (CLUSTER_AUTHORIZATION_FAILED), and its audit entries."""

    def __init__(self, state) -> None:
        self._state = state

    async def create(
        self, principal: Principal, client_address: str | None, rules: list[AclRule]
    ) -> list[BrokerError | None]:
        """Each rule's refusal, None for one added; the added ones in one PostgreSQL transaction."""
        authorize(principal, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        added = await security_admin.add_acls(self._state.pool, _actor(principal, client_address), rules)
        return [answer if isinstance(answer, BrokerError) else None for answer in added]

    async def describe(self, principal: Principal, acl_filter: AclFilter | None) -> list[AclRule]:
        """`acl_filter` None: one no rule can match (an operation txbroker lacks, another host)."""
        authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        if acl_filter is None:
            return []
        found = await security_admin.find_acls(self._state.pool, acl_filter)
        # A rule whose removal the standby lacks comes back with a failover.
        await confirmed_by_the_standby(self._state.replication_barrier, "the ACL rules")
        return found

    async def delete(
        self, principal: Principal, client_address: str | None, acl_filters: list[AclFilter | None]
    ) -> list[list[AclRule]]:
        """For each filter (None as describe's), the rules it deleted; all in one PostgreSQL transaction."""
        authorize(principal, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        matching = [acl_filter for acl_filter in acl_filters if acl_filter is not None]
        deleted = iter(await security_admin.remove_acls(self._state.pool, _actor(principal, client_address), matching))
        return [[] if acl_filter is None else next(deleted) for acl_filter in acl_filters]


# The SCRAM credentials of Kafka's KIP-554 APIs as the core holds them (HTTP's
# /v1/principals/{name}/scram-credentials), and the names handlers/scram.py gives their parts.
ScramCredential = scram_credentials.ScramCredentialRow
PasswordAuthentication = scram_credentials.PasswordAuthentication
ScramCredentialInfo = scram_credentials.ScramCredentialInfo
ScramAlteration = scram_credentials.ScramAlteration
ScramCredentialRefused = scram_credentials.ScramCredentialRefused
ScramCredentialRefusal = scram_credentials.CredentialRefusal
SCRAM_MECHANISMS = scram_credentials.MECHANISMS


class ScramCalls:
    """Kafka's AlterUserScramCredentials and DescribeUserScramCredentials on the core's SCRAM
    credentials, with Kafka's ACLs: Alter on the Cluster to change them, Describe on the Cluster
    to describe them (CLUSTER_AUTHORIZATION_FAILED), and their audit entries."""

    def __init__(self, state) -> None:
        self._state = state

    async def alter(
        self, principal: Principal, client_address: str | None, alterations: list[ScramAlteration]
    ) -> dict[str, BrokerError | None]:
        authorize(principal, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        return await scram_credentials.alter_credentials(
            self._state.pool, _actor(principal, client_address), alterations
        )

    async def describe(self, principal: Principal, names: list[str] | None) -> list[ScramCredentialInfo]:
        authorize(principal, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        found = await scram_credentials.describe_credentials(self._state.pool, names)
        await confirmed_by_the_standby(self._state.replication_barrier, "the SCRAM credentials")
        return found


def _actor(principal: Principal, client_address: str | None) -> Actor:
    """Who makes a change over Kafka: what its audit entry names (`client_address`: the
    connection's peer, RequestContext's)."""
    return Actor(principal.name, AuditSource.KAFKA, client_address)


def _anonymous(principal: Principal) -> bool:
    """Whether `principal` is the unauthenticated one of a listener without SASL with auth required
    (security_admin.anonymous_principal: Kafka's User:ANONYMOUS, as a principal of that name is)."""
    return principal.name == security_admin.ANONYMOUS_NAME and not principal.is_super_user


def _producer_id_owner(principal: Principal) -> str | None:
    """Whom an idempotent producer id is recorded for (its owner, who alone may bump its epoch):
    None for a super user, as InitProducerId and produce both record it."""
    return None if principal.is_super_user else principal.name
