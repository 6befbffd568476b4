"""Writing a topic exactly once: `df.write` (TxbrokerBatchWriter) and `df.writeStream`
(TxbrokerStreamWriter). Thin adapters from Spark's writer API to spark_client.commit_protocol.

What runs where (pyspark 4.x): the writer object is created on the driver at planning and pickled
to the tasks; `write()` runs once per task attempt in an executor's Python worker; `commit()` or
`abort()` runs once per batch in another driver-side Python process. A batch write's commit gets the
very writer that planned it (so its job id); a stream's writer is created again for each commit,
which is why everything a streaming commit needs is the sink_id option and the batch id.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from spark_client.commit_protocol import TaskAttempt, TaskCommitMessage, abort_batch, commit_batch, write_task
from spark_client.decisions import SinkBatch
from spark_client.options import WriteOptions

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def _task_attempt(context: TaskContext) -> TaskAttempt:
    return TaskAttempt(
        context.partitionId(),
        context.attemptNumber(),
        context.taskAttemptId(),
        context.getLocalProperty(QUERY_ID_PROPERTY),
    )


class TxbrokerBatchWriter(DataSourceArrowWriter):
    """One batch write job: a fresh job id, so its transactions and decision are its own."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.batch = SinkBatch(options.sink_id, options.topic, job=f"job-{uuid.uuid4().hex[:16]}")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommitMessage:
        return write_task(self.options, self.batch, iterator, _task_attempt(TaskContext.get()))

    def commit(self, messages: Sequence[TaskCommitMessage | None]) -> None:
        commit_batch(self.options, self.batch, messages)

    def abort(self, messages: Sequence[TaskCommitMessage | None]) -> None:
        abort_batch(self.options, self.batch, messages)


class TxbrokerStreamWriter(DataSourceStreamArrowWriter):
    """A streaming sink: each micro-batch is one two-phase commit, idempotent per (sink_id, batch id)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def _batch(self, batch_id: int) -> SinkBatch:
        return SinkBatch(self.options.sink_id, self.options.topic, batch_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommitMessage:
        context = TaskContext.get()
        batch_id = int(context.getLocalProperty(BATCH_ID_PROPERTY))
        return write_task(self.options, self._batch(batch_id), iterator, _task_attempt(context))

    def commit(self, messages: Sequence[TaskCommitMessage | None], batchId: int) -> None:
        commit_batch(self.options, self._batch(batchId), messages)

    def abort(self, messages: Sequence[TaskCommitMessage | None], batchId: int) -> None:
        abort_batch(self.options, self._batch(batchId), messages)
