"""The PostgreSQL schema, declared once as SQLModel tables.

These declarations are the metadata alembic compares migrations against (tests/test_migrations.py
checks that the migrated database and these models agree); the schema itself only ever changes
through a migration in alembic/versions/. Queries are written in SQL in the storage modules, against
asyncpg, because the hot paths need one round trip per statement and PostgreSQL-specific locking.

Everything is a log, as in Kafka: a topic partition is a sequence of record batches with dense
offsets; `partitions` holds the materialized head of each log (its high watermark), updated in the
same PostgreSQL transaction that appends the batch.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, LargeBinary, SmallInteger, func
from sqlalchemy.dialects.postgresql import JSONB
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
    created_at: datetime = Field(
        sa_column=Column(DateTime(timezone=True), nullable=False, server_default=func.now()))


class Partition(SQLModel, table=True):
    """The head of one partition's log. Appends to a partition serialize on this row (they UPDATE
    `high_watermark` first), which is what keeps offsets dense and unique; appends to different
    partitions touch different rows and never wait for each other."""

    __tablename__ = "partitions"

    topic_id: int = Field(primary_key=True, foreign_key="topics.topic_id", ondelete="CASCADE")
    partition: int = Field(primary_key=True)
    high_watermark: int = Field(default=0, sa_column_kwargs={"server_default": "0"},
                                sa_type=BigInteger, nullable=False)
    log_start_offset: int = Field(default=0, sa_column_kwargs={"server_default": "0"},
                                  sa_type=BigInteger, nullable=False)


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

