"""The PostgreSQL schema, declared once as SQLModel tables.

These declarations are the metadata alembic compares migrations against (tests/operations/test_migrations.py
checks that the migrated database and these models agree); the schema itself only ever changes
through a migration in alembic/versions/. Queries are written in SQL in the storage modules, against
asyncpg, because the hot paths need one round trip per statement and PostgreSQL-specific locking.

Everything is a log, as in Kafka: a topic partition is a sequence of record batches with dense
offsets; `partitions` holds the materialized head of each log (its high watermark), updated in the
same PostgreSQL transaction that appends the batch.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Identity,
    Index,
    LargeBinary,
    SmallInteger,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy import text as sa_text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlmodel import Field, SQLModel


class Topic(SQLModel, table=True):
    """A named topic. `topic_id` is never reused, so a deleted and re-created topic never sees the
    old topic's batches."""

    __tablename__ = "topics"

    topic_id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=249, unique=True, nullable=False)
    partition_count: int = Field(nullable=False)
    config: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False, server_default="{}"))
    is_internal: bool = Field(default=False, nullable=False)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False, server_default=func.now()))
    # Kafka's topic id (KIP-516): generated with the row, so a re-created topic gets a new one.
    topic_uuid: uuid.UUID = Field(
        sa_column=Column(UUID(as_uuid=True), nullable=False, unique=True, server_default=sa_text("gen_random_uuid()"))
    )


class Partition(SQLModel, table=True):
    """The head of one partition's log. Appends to a partition serialize on this row (they UPDATE
    `high_watermark` first), which is what keeps offsets dense and unique; appends to different
    partitions touch different rows and never wait for each other."""

    __tablename__ = "partitions"

    topic_id: int = Field(primary_key=True, foreign_key="topics.topic_id", ondelete="CASCADE")
    partition: int = Field(primary_key=True)
    high_watermark: int = Field(default=0, sa_column_kwargs={"server_default": "0"}, sa_type=BigInteger, nullable=False)
    log_start_offset: int = Field(
        default=0, sa_column_kwargs={"server_default": "0"}, sa_type=BigInteger, nullable=False
    )


class RecordBatch(SQLModel, table=True):
    """One appended batch, like Kafka's RecordBatch: offsets base_offset..last_offset, all records
    of one produce request to one partition, stored together in `records` (see record_codec.py).

    A control batch (a transaction marker) has `control_type` set and takes exactly one offset.
    The primary key ends in `last_offset` because batches never overlap, so ordering by it is log
    order, and `last_offset >= X` finds the batch holding offset X with one index probe.
    """

    __tablename__ = "record_batches"

    topic_id: int = Field(primary_key=True)
    partition: int = Field(primary_key=True)
    last_offset: int = Field(primary_key=True, sa_type=BigInteger)
    base_offset: int = Field(sa_type=BigInteger, nullable=False)
    producer_id: int = Field(sa_type=BigInteger, nullable=False)
    producer_epoch: int = Field(sa_type=SmallInteger, nullable=False)
    base_sequence: int = Field(nullable=False)
    is_transactional: bool = Field(nullable=False)
    control_type: int | None = Field(default=None, sa_type=SmallInteger, nullable=True)
    first_timestamp_ms: int = Field(sa_type=BigInteger, nullable=False)
    max_timestamp_ms: int = Field(sa_type=BigInteger, nullable=False)
    record_count: int = Field(nullable=False)
    size_bytes: int = Field(nullable=False)
    records: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    # When compaction first kept a tombstone of this batch: its delete horizon (KIP-534) starts
    # there, not at the record's timestamp, which is the client's (log_compaction.py).
    tombstones_seen_ms: int | None = Field(default=None, sa_type=BigInteger, nullable=True)
    # When the server appended it, for a batch whose records have no timestamp (max_timestamp_ms -1,
    # from a Kafka client) only: retention_ms and min_compaction_lag_ms go by it for such a batch, as
    # Kafka's go by its segment's last-modified time (log_cleaner.py, log_compaction.py). NULL for any
    # other batch.
    untimestamped_appended_ms: int | None = Field(default=None, sa_type=BigInteger, nullable=True)


class PartitionCleanup(SQLModel, table=True):
    """What the log cleaner last did to one partition (log_cleaner.py), inserted when a run first
    takes the partition (one at a time across servers: a session advisory lock on (topic_id,
    partition)); appends never touch it, so cleaning never makes a produce wait.

    `compacted_through`: compaction has run up to this offset (the LSO it saw), so a partition with
    nothing new is not compacted again; `earliest_tombstone_seen_ms`: of the tombstones it kept, the
    earliest time the cleaner first kept one (it runs again once that is delete_retention_ms ago, even
    with nothing new)."""

    __tablename__ = "partition_cleanups"

    topic_id: int = Field(primary_key=True)
    partition: int = Field(primary_key=True)
    last_cleanup_ms: int | None = Field(default=None, sa_type=BigInteger, nullable=True)
    removed_batches: int = Field(
        default=0, sa_type=BigInteger, nullable=False, sa_column_kwargs={"server_default": "0"}
    )
    rewritten_batches: int = Field(
        default=0, sa_type=BigInteger, nullable=False, sa_column_kwargs={"server_default": "0"}
    )
    compacted_through: int = Field(
        default=0, sa_type=BigInteger, nullable=False, sa_column_kwargs={"server_default": "0"}
    )
    earliest_tombstone_seen_ms: int | None = Field(default=None, sa_type=BigInteger, nullable=True)


class DeletedTopic(SQLModel, table=True):
    """A deleted topic whose batches, markers and producer states the log cleaner still has to
    remove (a bounded chunk per run, so deleting a large topic is one quick statement)."""

    __tablename__ = "deleted_topics"

    topic_id: int = Field(primary_key=True)
    deleted_ms: int = Field(sa_type=BigInteger, nullable=False)


class ProducerIdRecord(SQLModel, table=True):
    """Every producer id issued (from `producer_id_seq`), with the latest epoch issued for it. A
    produce naming an id that is not here gets UNKNOWN_PRODUCER_ID. `principal`: the one an
    idempotent producer id was issued to, the only one that may bump its epoch (NULL: a super
    user's, a transactional id's, or one issued before owners were kept)."""

    __tablename__ = "producer_ids"

    producer_id: int = Field(primary_key=True, sa_type=BigInteger)
    producer_epoch: int = Field(sa_type=SmallInteger, nullable=False)
    transactional_id: str | None = Field(default=None, sa_type=Text, nullable=True)
    issued_ms: int = Field(sa_type=BigInteger, nullable=False)
    principal: str | None = Field(default=None, sa_type=Text, nullable=True)


class ProducerState(SQLModel, table=True):
    """A producer's state on one partition (Kafka's ProducerStateEntry): its epoch, last sequence,
    the last 5 batches' metadata for duplicate detection, and the first offset of its open
    transaction there (which pins the partition's LSO). Only ever changed while holding the
    partition's row lock, in the transaction that appends the batch or the marker."""

    __tablename__ = "producer_states"

    topic_id: int = Field(primary_key=True)
    partition: int = Field(primary_key=True)
    producer_id: int = Field(primary_key=True, sa_type=BigInteger)
    producer_epoch: int = Field(sa_type=SmallInteger, nullable=False)
    last_sequence: int = Field(nullable=False)
    last_timestamp_ms: int = Field(sa_type=BigInteger, nullable=False)  # the newest record timestamp (the client's)
    # The server's clock at the last append (expiry goes by this, never by the client's timestamps).
    last_append_ms: int = Field(
        sa_type=BigInteger,
        nullable=False,
        sa_column_kwargs={"server_default": sa_text("(extract(epoch from clock_timestamp()) * 1000)::bigint")},
    )
    recent_batches: list = Field(sa_column=Column(JSONB, nullable=False))
    current_txn_first_offset: int | None = Field(default=None, sa_type=BigInteger, nullable=True)


Index(
    "producer_states_open_transactions",
    ProducerState.topic_id,
    ProducerState.partition,
    ProducerState.current_txn_first_offset,
    postgresql_where=sa_text("current_txn_first_offset IS NOT NULL"),
)
Index("producer_states_by_producer", ProducerState.producer_id, ProducerState.last_append_ms)


class TransactionRecord(SQLModel, table=True):
    """The coordinator's current metadata of one transactional id, materialized from (and written
    together with) its records in `__transaction_state`. Coordinator requests serialize on this row.

    `producer_id/epoch` are what the producer must use now; `txn_producer_id/epoch` what the open
    transaction's records were written with (its markers carry those); `last_producer_id/epoch` the
    ids of the EndTxn that completed the previous transaction, or those a KIP-360 InitProducerId bumped
    from, so a retry of either is recognised."""

    __tablename__ = "transactions"

    transactional_id: str = Field(primary_key=True, sa_type=Text)
    producer_id: int = Field(sa_type=BigInteger, nullable=False)
    producer_epoch: int = Field(sa_type=SmallInteger, nullable=False)
    last_producer_id: int | None = Field(default=None, sa_type=BigInteger, nullable=True)
    last_producer_epoch: int | None = Field(default=None, sa_type=SmallInteger, nullable=True)
    txn_producer_id: int | None = Field(default=None, sa_type=BigInteger, nullable=True)
    txn_producer_epoch: int | None = Field(default=None, sa_type=SmallInteger, nullable=True)
    state: str = Field(sa_type=Text, nullable=False, index=False)
    timeout_ms: int = Field(nullable=False)
    txn_start_ms: int = Field(sa_type=BigInteger, nullable=False)
    last_update_ms: int = Field(sa_type=BigInteger, nullable=False)
    partitions: list = Field(sa_column=Column(JSONB, nullable=False))
    groups: list = Field(sa_column=Column(JSONB, nullable=False))
    principal: str | None = Field(default=None, sa_type=Text, nullable=True)  # who created the id (quota)
    # How the last EndTxn ended its transaction: 1 (classic: the epoch carries over to the next
    # transaction, Kafka's EndTxn below v5) or 2 (KIP-890: the epoch is bumped, HTTP and EndTxn v5+);
    # NULL until an EndTxn ends one of the id's transactions (migration 0015).
    transaction_version: int | None = Field(default=None, sa_type=SmallInteger, nullable=True)


Index("transactions_by_state", TransactionRecord.state)
Index("transactions_by_principal", TransactionRecord.principal)


class TxnMarker(SQLModel, table=True):
    """One transaction marker, keyed by its offset in its partition. With transaction version 1 a
    producer's epoch carries over from one transaction to the next, so (partition, producer id,
    epoch) may name several transactions: a transactional batch belongs to the transaction ended by
    the first marker of its producer after it (txn_markers_by_producer finds it). This table is the
    aborted-transactions index read_committed reads use and the markers listing."""

    __tablename__ = "txn_markers"

    topic_id: int = Field(primary_key=True)
    partition: int = Field(primary_key=True)
    marker_offset: int = Field(primary_key=True, sa_type=BigInteger)
    producer_id: int = Field(sa_type=BigInteger, nullable=False)
    producer_epoch: int = Field(sa_type=SmallInteger, nullable=False)
    control_type: int = Field(sa_type=SmallInteger, nullable=False)
    first_offset: int | None = Field(default=None, sa_type=BigInteger, nullable=True)
    timestamp_ms: int = Field(sa_type=BigInteger, nullable=False)


Index(
    "txn_markers_by_producer", TxnMarker.topic_id, TxnMarker.partition, TxnMarker.producer_id, TxnMarker.marker_offset
)


class ConsumerGroup(SQLModel, table=True):
    """A consumer group's generation and the assignment computed when it began. Membership changes
    serialize on this row."""

    __tablename__ = "consumer_groups"

    group_id: str = Field(primary_key=True, sa_type=Text)
    generation_id: int = Field(nullable=False)
    assignment: dict = Field(sa_column=Column(JSONB, nullable=False))
    last_update_ms: int = Field(sa_type=BigInteger, nullable=False)


class GroupMember(SQLModel, table=True):
    __tablename__ = "group_members"

    group_id: str = Field(primary_key=True, sa_type=Text)
    member_id: str = Field(primary_key=True, sa_type=Text)
    topics: list = Field(sa_column=Column(JSONB, nullable=False))
    session_timeout_ms: int = Field(nullable=False)
    joined_ms: int = Field(sa_type=BigInteger, nullable=False)
    last_heartbeat_ms: int = Field(sa_type=BigInteger, nullable=False)
    # A KIP-848 consumer group member's deadline to revoke its partitions (migration 0016), else NULL.
    revocation_due_ms: int | None = Field(default=None, sa_type=BigInteger, nullable=True)


Index("group_members_by_deadline", GroupMember.last_heartbeat_ms + GroupMember.session_timeout_ms)
Index("group_members_by_revocation_due", GroupMember.revocation_due_ms)


class GroupConfig(SQLModel, table=True):
    """A group's own value of one of Kafka's group configs (migration 0017), under Kafka's name; the
    group need not exist."""

    __tablename__ = "group_configs"

    group_id: str = Field(primary_key=True, sa_type=Text)
    name: str = Field(primary_key=True, sa_type=Text)
    value: str = Field(sa_type=Text, nullable=False)


class GroupOffset(SQLModel, table=True):
    """A committed (visible) offset, materialized from __consumer_offsets."""

    __tablename__ = "group_offsets"

    group_id: str = Field(primary_key=True, sa_type=Text)
    topic: str = Field(primary_key=True, sa_type=Text)
    partition: int = Field(primary_key=True)
    committed_offset: int = Field(sa_type=BigInteger, nullable=False)
    metadata_: str | None = Field(default=None, sa_column=Column("metadata", Text, nullable=True))
    commit_timestamp_ms: int = Field(sa_type=BigInteger, nullable=False)
    # The offset in __consumer_offsets of the record that committed it: the commit appended last wins.
    record_offset: int = Field(
        default=-1, sa_column_kwargs={"server_default": "-1"}, sa_type=BigInteger, nullable=False
    )
    # The leader epoch the commit carried (Kafka's committed leader epoch); -1: none.
    leader_epoch: int = Field(default=-1, sa_column_kwargs={"server_default": "-1"}, nullable=False)


class PendingTxnOffset(SQLModel, table=True):
    """A transactional offset commit (TxnOffsetCommit) waiting for its transaction's marker in
    `offsets_partition` of __consumer_offsets: COMMIT moves it to group_offsets, ABORT drops it."""

    __tablename__ = "pending_txn_offsets"

    group_id: str = Field(primary_key=True, sa_type=Text)
    topic: str = Field(primary_key=True, sa_type=Text)
    partition: int = Field(primary_key=True)
    producer_id: int = Field(primary_key=True, sa_type=BigInteger)
    producer_epoch: int = Field(sa_type=SmallInteger, nullable=False)
    offsets_partition: int = Field(nullable=False)
    committed_offset: int = Field(sa_type=BigInteger, nullable=False)
    metadata_: str | None = Field(default=None, sa_column=Column("metadata", Text, nullable=True))
    commit_timestamp_ms: int = Field(sa_type=BigInteger, nullable=False)
    # The offset in __consumer_offsets of the record that committed it: the commit appended last wins.
    record_offset: int = Field(
        default=-1, sa_column_kwargs={"server_default": "-1"}, sa_type=BigInteger, nullable=False
    )
    # The leader epoch the commit carried (Kafka's committed leader epoch); -1: none.
    leader_epoch: int = Field(default=-1, sa_column_kwargs={"server_default": "-1"}, nullable=False)


Index(
    "pending_txn_offsets_by_transaction",
    PendingTxnOffset.offsets_partition,
    PendingTxnOffset.producer_id,
    PendingTxnOffset.producer_epoch,
)


class PrincipalRecord(SQLModel, table=True):
    """Someone who may call the API (with auth=required), identified by any of its API keys."""

    __tablename__ = "principals"

    name: str = Field(primary_key=True, sa_type=Text)
    is_super_user: bool = Field(nullable=False)
    created_ms: int = Field(sa_type=BigInteger, nullable=False)


class ApiKey(SQLModel, table=True):
    """A bearer token, stored as its SHA-256 only (tokens are 256-bit random, so a fast hash is
    enough: there is nothing to brute-force). Revocation is immediate: every request looks it up."""

    __tablename__ = "api_keys"

    key_id: str = Field(primary_key=True, sa_type=Text)
    principal: str = Field(sa_type=Text, foreign_key="principals.name", ondelete="CASCADE", nullable=False)
    token_sha256: bytes = Field(sa_column=Column(LargeBinary, nullable=False, unique=True))
    created_ms: int = Field(sa_type=BigInteger, nullable=False)
    revoked_ms: int | None = Field(default=None, sa_type=BigInteger, nullable=True)


class ScramCredential(SQLModel, table=True):
    """A principal's SASL/SCRAM credential for one mechanism (migration 0018): what a SCRAM server
    keeps (RFC 5802), never the password. Deleted with its principal."""

    __tablename__ = "scram_credentials"

    principal: str = Field(
        primary_key=True, sa_type=Text, foreign_key="principals.name", ondelete="CASCADE", nullable=False
    )
    mechanism: str = Field(primary_key=True, sa_type=Text)  # SCRAM-SHA-256 or SCRAM-SHA-512
    salt: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    iterations: int = Field(nullable=False)
    stored_key: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    server_key: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    updated_ms: int = Field(sa_type=BigInteger, nullable=False)


class KafkaNodeListener(SQLModel, table=True):
    """The address a node advertises for one of its Kafka listeners (migration 0019), read for the
    nodes whose presence session is live (app/storage/node_presence.py), rewritten by the node when
    it announces itself."""

    __tablename__ = "kafka_node_listeners"

    node_id: int = Field(primary_key=True)
    protocol: str = Field(primary_key=True, sa_type=Text)  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    host: str = Field(sa_type=Text, nullable=False)
    port: int = Field(nullable=False)


class AclRule(SQLModel, table=True):
    """Kafka's ACL model: principal, resource (type, pattern type, name), operation, allow/deny."""

    __tablename__ = "acls"
    __table_args__ = (
        UniqueConstraint(
            "principal",
            "resource_type",
            "pattern_type",
            "resource_name",
            "operation",
            "permission",
            name="acls_unique_rule",
        ),
    )

    acl_id: int | None = Field(default=None, sa_column=Column(BigInteger, Identity(), primary_key=True))
    principal: str = Field(sa_type=Text, nullable=False)
    resource_type: str = Field(sa_type=Text, nullable=False)
    pattern_type: str = Field(sa_type=Text, nullable=False)
    resource_name: str = Field(sa_type=Text, nullable=False)
    operation: str = Field(sa_type=Text, nullable=False)
    permission: str = Field(sa_type=Text, nullable=False)


class AuditEntry(SQLModel, table=True):
    """An administrative action and who did it."""

    __tablename__ = "audit_log"

    entry_id: int | None = Field(default=None, sa_column=Column(BigInteger, Identity(), primary_key=True))
    timestamp_ms: int = Field(sa_type=BigInteger, nullable=False)
    principal: str = Field(sa_type=Text, nullable=False)
    action: str = Field(sa_type=Text, nullable=False)
    resource: str = Field(sa_type=Text, nullable=False)
    details: str = Field(sa_type=Text, nullable=False)
    # The door the action came through (http, kafka, console) or `server`; NULL for entries written
    # before migration 0013.
    source: str | None = Field(default=None, sa_type=Text, nullable=True)
    # HOST:PORT of the client's connection as its door saw it; NULL for what a node does itself
    # (`server`) and for entries written before migration 0014.
    client_address: str | None = Field(default=None, sa_type=Text, nullable=True)
