"""txbroker's PySpark data source (the `pyspark.sql.datasource` API, pyspark >= 4.2), named "txbroker",
built on the Python SDK: read topics in batch and streaming queries (read_committed by default), and
write them exactly once, in batch and streaming queries alike.

    from spark_client import TxbrokerDataSource
    spark.dataSource.register(TxbrokerDataSource)

    df.write.format("txbroker").option("url", URL).option("topic", "out").mode("append").save()
    spark.read.format("txbroker").option("url", URL).option("topic", "in").load()
    (spark.readStream.format("txbroker").option("url", URL).option("topic", "in").load()
        .writeStream.format("txbroker").option("url", URL).option("topic", "out")
        .option("checkpointLocation", CP).option("sink_id", "orders-enricher").start())

(Spark allows Python data sources only the modes append and overwrite: a batch write needs
`.mode("append")`; a topic cannot be overwritten.)

Columns read: key, value (string; binary with binary=true), headers (array<struct<key: string,
value: string|binary>>), partition (int), offset (long), timestamp (timestamp). Columns written:
value (required), key, partition (null: murmur2 of the key), headers (that array, or a map),
timestamp; other columns are ignored, so a DataFrame read from a topic writes back as is.

Options (case-insensitive, as always in Spark; spark_client/README.md has the details):
- url (required): the txbroker server, e.g. http://127.0.0.1:8080; token: a bearer token, when the
  server requires credentials; request_timeout_ms (30000): per HTTP request.
- topic (required): the topic to read or write.
- Reads: isolation_level (read_committed, or read_uncommitted); startingOffsets (earliest for
  batch reads, latest for streams; or JSON {"<topic>": {"<partition>": offset}}, -2 earliest and -1
  latest, an offset started at exactly, one below the log start a DataLossError unless
  failOnDataLoss is false; a restarted stream continues from its checkpoint); endingOffsets (batch reads: latest,
  the last stable offset under read_committed, or JSON); maxRecordsPerTrigger (streams: at most this
  many offsets per micro-batch, shared fairly by the partitions; markers count too); binary (false:
  key, value and header values as strings; true: as binary); max_records_per_fetch (10000);
  failOnDataLoss (true: a range whose records were deleted before it was read fails its task;
  false: what is gone is skipped).
- Writes: sink_id (required for streams, default "batch"): names the sink's transactions and
  decision records, one per streaming query, kept across restarts from its checkpoint;
  transaction_timeout_ms (600000): the server aborts a task's transaction left open this long;
  delivery_timeout_ms (120000, or request_timeout_ms + the producer's linger_ms if larger; one
  given below that is refused): how long a task's records are retried, and how long a slow
  server's prepare is waited out (prepare_transaction() called again after each max_block_ms)
  before the task fails; max_block_ms (60000): how long one call of the task's producer blocks;
  commit_timeout_ms (120000): how long the driver's calls of a commit or abort, and a task's reads
  of the decision, retry a server that does not answer. A commit that fails once its decision is
  recorded raises IncompleteCommitError: the batch IS committed, and recover() (a batch write) or a
  restart from the checkpoint (a stream) finishes it -- never a new run of the write. A commit
  whose decision record went unanswered reads the decision back; when that fails too, its
  IncompleteCommitError says the outcome is UNKNOWN, and recover() then job_outcome() (a batch
  write) or a restart from the checkpoint (a stream) settle it.

Exactly once (spark_client.commit_protocol): every task attempt writes its rows in a transaction of
its own and prepares it (KIP-939); the driver records which prepared transactions make up the batch
(spark_client.decisions), then commits them and aborts every other transaction of the batch (failed,
retried and speculative attempts). A streaming batch that Spark re-runs after a crash finds its
decision and rolls it forward instead of writing again. `recover()` finishes what a crashed batch
write's driver left behind; `job_outcome()` says whether a batch write committed.
Trigger.AvailableNow is supported by the stream reader.
"""

from spark_client.commit_protocol import IncompleteCommitError, job_outcome, recover
from spark_client.options import OptionError
from spark_client.reader import DataLossError
from spark_client.source import TxbrokerDataSource

__all__ = ["DataLossError", "IncompleteCommitError", "OptionError", "TxbrokerDataSource", "job_outcome", "recover"]
