"""The data source Spark sees: `TxbrokerDataSource`, named "txbroker". It parses and checks the
options and the schema on the driver, then hands out the readers and writers."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from spark_client.columns import check_write_schema, read_schema
from spark_client.options import OptionError, WriteOptions, read_options, write_options
from spark_client.reader import TxbrokerBatchReader, TxbrokerStreamReader
from spark_client.writer import TxbrokerBatchWriter, TxbrokerStreamWriter
from txbroker import Admin
from txbroker.errors import UnknownTopicOrPartitionError


class TxbrokerDataSource(DataSource):
    """Apache Kafka's transactional messaging, through txbroker: batch and streaming reads
    (read_committed by default) and exactly-once batch and streaming writes. See spark_client."""

    @classmethod
    def name(cls) -> str:
        return "txbroker"

    def schema(self) -> StructType:
        return read_schema(binary=str(self.options.get("binary", "false")).strip().lower() == "true")

    def reader(self, schema: StructType) -> TxbrokerBatchReader:
        return TxbrokerBatchReader(read_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> TxbrokerStreamReader:
        return TxbrokerStreamReader(read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> TxbrokerBatchWriter:
        options = write_options(self.options, streaming=False)
        _check_writable(schema, overwrite, options)
        return TxbrokerBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TxbrokerStreamWriter:
        options = write_options(self.options, streaming=True)
        _check_writable(schema, overwrite, options)
        return TxbrokerStreamWriter(options)


def _check_writable(schema: StructType, overwrite: bool, options: WriteOptions) -> None:
    topic, connection = options.topic, options.connection
    if overwrite:
        raise OptionError(
            "a topic is an append-only log: write with mode('append') (or outputMode('append') for a stream)"
        )
    check_write_schema(schema)
    # Within commit_timeout_ms: Spark asks for a stream's writer again for each micro-batch's commit
    # and abort, so this check is one of the driver's calls of the commit.
    with Admin(connection.url, default_api_timeout_ms=options.commit_timeout_ms, **connection.client_config) as admin:
        try:
            admin.describe_topic(topic)
        except UnknownTopicOrPartitionError:
            raise OptionError(
                f"topic {topic!r} does not exist on {connection.url}: create it first "
                f"(txbroker topics create, or Admin.create_topic)"
            ) from None
