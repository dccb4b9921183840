"""Where the snapshot's rows go, and the jobs that put them there: `_WrittenOutput` when the table store's tasks can
write the tables' files themselves, else `_CachedOutput`, which caches, counts and appends them at the end."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from sweeper.objectstore.base import StoreTarget
from sweeper.snapshot.offload_listing import offload_dataframe, offload_written
from sweeper.snapshot.packer import TablePacker, _tuples, _unpack
from sweeper.snapshot.pending import pending_deletes_dataframe, pending_deletes_written
from sweeper.snapshot.scanners import ScanTotals, _scan_written, dealt_units, scan_dataframe, scan_totals
from sweeper.snapshot.settings import PACKED_SCHEMA, ScanTarget, SnapshotSettings
from sweeper.table_schemas import SNAPSHOT_TABLES
from sweeper.tables import CommitResult, TableStore
from sweeper.tables.files import TablesWriter


class _Output:
    """Where the snapshot's rows go, and the jobs that put them there. Two ways, by what the table store offers:
    `_WrittenOutput` when its tasks can write the tables' files themselves (TableStore.task_writer), else
    `_CachedOutput`, which caches each producer's packed rows, counts them, and appends them all at the end."""

    def scan(self, spark: SparkSession, settings: SnapshotSettings, target: ScanTarget, tasks: list[tuple[str, str]],
             sessions: int, weights: list[float]) -> ScanTotals:
        raise NotImplementedError

    def listing(self, spark: SparkSession, settings: SnapshotSettings, buckets: list[StoreTarget], run_id: str,
                started: datetime, offloaded_ledgers: int) -> ScanTotals:
        raise NotImplementedError

    def pending(self, spark: SparkSession, settings: SnapshotSettings, partitions: int, run_id: str,
                started: datetime) -> ScanTotals:
        raise NotImplementedError

    def driver_rows(self, spark: SparkSession, rows: list[dict[str, Any]], run_id: str, started: datetime) -> None:
        raise NotImplementedError

    def commit(self, store: TableStore, commit_metadata: dict[str, str]) -> dict[str, CommitResult]:
        raise NotImplementedError

    def close(self) -> None:
        """Frees what the output holds, however the snapshot ended."""


class _CachedOutput(_Output):
    """Each producer's packed rows cached and counted (a job each); one append_arrow_frames of them all at the
    end reads the caches again and writes the tables."""

    def __init__(self) -> None:
        self.frames: list[DataFrame] = []

    def _cached(self, frame: DataFrame) -> DataFrame:
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self.frames.append(frame)
        return frame

    def scan(self, spark: SparkSession, settings: SnapshotSettings, target: ScanTarget, tasks: list[tuple[str, str]],
             sessions: int, weights: list[float]) -> ScanTotals:
        return scan_totals(self._cached(scan_dataframe(spark, settings, target, tasks, sessions, weights)))

    def listing(self, spark: SparkSession, settings: SnapshotSettings, buckets: list[StoreTarget], run_id: str,
                started: datetime, offloaded_ledgers: int) -> ScanTotals:
        return scan_totals(self._cached(offload_dataframe(spark, settings, buckets, run_id, started,
                                                          offloaded_ledgers)))

    def pending(self, spark: SparkSession, settings: SnapshotSettings, partitions: int, run_id: str,
                started: datetime) -> ScanTotals:
        return scan_totals(self._cached(pending_deletes_dataframe(spark, settings, partitions, run_id, started)))

    def driver_rows(self, spark: SparkSession, rows: list[dict[str, Any]], run_id: str, started: datetime) -> None:
        # What the driver met while planning joins the tasks' rows, packed the same way.
        packer = TablePacker(run_id, started)
        packed = [b for row in rows for b in packer.add(row)] + list(packer.flush())
        self.frames.append(spark.createDataFrame([t for b in packed for t in _tuples([b])], PACKED_SCHEMA))

    def commit(self, store: TableStore, commit_metadata: dict[str, str]) -> dict[str, CommitResult]:
        scan = self.frames[0]
        for frame in self.frames[1:]:
            scan = scan.unionByName(frame)
        # One commit per table (independent Delta logs); the engine writes them all from the caches at once.
        tables = scan.where(F.col("record_type").isin(list(SNAPSHOT_TABLES))).select("record_type", "payload")
        return store.append_arrow_frames(tables, "record_type", _unpack, SNAPSHOT_TABLES,
                                         commit_metadata=commit_metadata)

    def close(self) -> None:
        for frame in self.frames:
            frame.unpersist()


class _WrittenOutput(_Output):
    """Each producer is one job whose tasks write their rows straight into the tables' files and return the files'
    records with their counts; nothing is cached or read twice, and the commit is the file records'."""

    def __init__(self, writer: TablesWriter) -> None:
        self.writer = writer
        self.files: dict[str, list[dict[str, Any]]] = {}

    def _kept(self, totals: ScanTotals) -> ScanTotals:
        for table, records in totals.files.items():
            self.files.setdefault(table, []).extend(records)
        return totals

    def scan(self, spark: SparkSession, settings: SnapshotSettings, target: ScanTarget, tasks: list[tuple[str, str]],
             sessions: int, weights: list[float]) -> ScanTotals:
        # An RDD, not a DataFrame: the output is a few small tuples, and a fresh session's first SQL plan (its
        # analysis and code generation on a cold JVM) cost seconds of a 225k snapshot.
        writer = self.writer
        rdd = dealt_units(spark, tasks, sessions, weights)
        return self._kept(ScanTotals.tally(rdd.mapPartitions(lambda units: _scan_written(target, writer, units))
                                           .collect()))

    def listing(self, spark: SparkSession, settings: SnapshotSettings, buckets: list[StoreTarget], run_id: str,
                started: datetime, offloaded_ledgers: int) -> ScanTotals:
        return self._kept(offload_written(spark, settings, buckets, run_id, started, self.writer, offloaded_ledgers))

    def pending(self, spark: SparkSession, settings: SnapshotSettings, partitions: int, run_id: str,
                started: datetime) -> ScanTotals:
        return self._kept(pending_deletes_written(spark, settings, partitions, run_id, started, self.writer))

    def driver_rows(self, spark: SparkSession, rows: list[dict[str, Any]], run_id: str, started: datetime) -> None:
        packer = TablePacker(run_id, started, self.writer.open(task=0))
        try:
            packed = [b for row in rows for b in packer.add(row)] + list(packer.flush()) + list(packer.files())
        except BaseException:
            packer.abort()
            raise
        self._kept(ScanTotals.tally(_tuples(packed)))

    def commit(self, store: TableStore, commit_metadata: dict[str, str]) -> dict[str, CommitResult]:
        return store.commit_written(self.writer, self.files, commit_metadata=commit_metadata)

