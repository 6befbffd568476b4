"""A local SparkSession with the txbroker data source registered: for examples, benchmarks and tests
on one machine (a cluster's session comes from its own configuration; register the data source
there with `spark.dataSource.register(TxbrokerDataSource)`).

    from spark_client.local import local_session
    spark = local_session("my-job")             # local[2]; "local[2,3]" retries failed tasks

Python workers run this interpreter (PYSPARK_PYTHON), so they import the same txbroker and
spark_client; Spark binds to loopback only and starts no web UI.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from spark_client.source import TxbrokerDataSource


def local_session(app_name: str = "txbroker", master: str = "local[2]", **conf: str) -> SparkSession:
    """`master` "local[N,F]" runs N task slots and tries each task up to F times (local mode ignores
    spark.task.maxFailures). `conf` entries are Spark settings (dots may be written as "__")."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    for key, value in conf.items():
        builder = builder.config(key.replace("__", "."), value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("TXBROKER_SPARK_LOG_LEVEL", "ERROR"))
    spark.dataSource.register(TxbrokerDataSource)
    return spark
