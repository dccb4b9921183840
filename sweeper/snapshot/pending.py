"""The pending deletes on the system topic, read by the snapshot: one reader task per partition of the topic, its
records packed per table or written into the tables' files."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from sweeper.broker.system_topic import BrokerSettings, broker_partitions
from sweeper.scan.pending_deletes import read_partition
from sweeper.snapshot.packer import TablePacker, _tuples
from sweeper.snapshot.scanners import ScanTotals
from sweeper.snapshot.settings import PACKED_SCHEMA, SnapshotSettings
from sweeper.tables.files import TablesWriter


def topic_partitions(settings: SnapshotSettings) -> int:
    """How many partitions the pending-delete topic has now (0: it does not exist yet)."""
    cfg = settings.system_topic
    connections = settings.connections
    return (connections.admin().partitions(cfg.topic) if cfg.admin_url
            else broker_partitions(connections.broker(), cfg.topic))


def _read_pending(partitions: Iterator[int], broker: BrokerSettings, topic: str, run_id: str,
                  captured_at: datetime, writer: TablesWriter | None = None) -> Iterator[tuple[str, int, bytes]]:
    """One reader task: its partitions' records packed per table (with a `writer`, written and counted)."""
    packer = TablePacker(run_id, captured_at, writer.open() if writer is not None else None)

    def packed() -> Iterator[pa.RecordBatch]:
        for partition in partitions:
            for row in read_partition(broker, topic, partition):
                yield from packer.add(row)
        yield from packer.flush()
        yield from packer.files()

    try:
        yield from _tuples(packed())
    except BaseException:
        packer.abort()
        raise


def pending_deletes_dataframe(spark: SparkSession, settings: SnapshotSettings, partitions: int, run_id: str,
                              captured_at: datetime) -> DataFrame:
    """One Spark task per partition of the system topic, each with its own reader."""
    broker, topic = settings.connections.broker(), settings.system_topic.topic
    rdd = spark.sparkContext.parallelize(range(partitions), partitions).mapPartitions(
        lambda items: _read_pending(items, broker, topic, run_id, captured_at))
    return spark.createDataFrame(rdd, PACKED_SCHEMA)


def pending_deletes_written(spark: SparkSession, settings: SnapshotSettings, partitions: int, run_id: str,
                            captured_at: datetime, writer: TablesWriter) -> ScanTotals:
    """pending_deletes_dataframe as one job whose tasks write the records' rows into the tables' files."""
    broker, topic = settings.connections.broker(), settings.system_topic.topic
    return ScanTotals.tally(spark.sparkContext.parallelize(range(partitions), partitions).mapPartitions(
        lambda items: _read_pending(items, broker, topic, run_id, captured_at, writer)).collect())

