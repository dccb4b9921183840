"""The snapshot's scan tasks: each reads its share of the scan units with its own ZooKeeper sessions (ScanReader) and
emits its rows packed per table, or writes them into the tables' files; and what the packed output of any producer
holds (ScanTotals)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sweeper.connections import MetadataEndpoint
from sweeper.objectstore.base import StoreTarget
from sweeper.ratelimit import TokenBucket
from sweeper.records import ChildrenRead, ZnodeRead
from sweeper.scan import bookkeeper as bk_scan
from sweeper.scan import pulsar as pulsar_scan
from sweeper.snapshot.packer import TablePacker, _tuples
from sweeper.snapshot.planning import _shard, deal_tasks, scan_sessions
from sweeper.snapshot.settings import (
    FILE_WRITTEN,
    OFFLOAD_TARGET,
    PACKED_SCHEMA,
    STAT_READS,
    STAT_WAIT_MS,
    TASK_BK,
    TASK_ML,
    TASK_SCHEMA,
    ScanTarget,
    SnapshotSettings,
)
from sweeper.spark import task_error
from sweeper.tables.files import TablesWriter
from sweeper.zk import client as zkutil
from sweeper.zk.errors import ZooKeeperPermissionError, ZooKeeperSecurityError, ZooKeeperUnavailableError


class ScanReader:
    """The reads of one scan task: one ZooKeeper session speaking the wire protocol directly.

    Data reads go `multi_read` to a request (ZooKeeper >= 3.6); directory listings go one to a
    request, since a single listing may already hold 10,000 names. A `limiter` paces the reads.
    A read refused for lack of permission fails the task (and the snapshot) naming the znode:
    a snapshot missing what it may not read would look like orphans.
    """

    def __init__(self, endpoint: MetadataEndpoint, multi_read: int, limiter: TokenBucket | None = None) -> None:
        self.reader = endpoint.wire_reader(multi_read, limiter)
        self.reads = 0

    def get_many(self, paths: Iterable[str], window: int = zkutil.DEFAULT_WINDOW) -> Iterator[ZnodeRead]:
        return self._checked(self.reader.get_many(paths, window))

    def children_many(self, paths: Iterable[str], window: int = zkutil.DEFAULT_WINDOW) -> Iterator[ChildrenRead]:
        return self._checked(self.reader.children_many(paths, window, multi_read=1))

    def _checked(self, reads: Iterator[Any]) -> Iterator[Any]:
        for read in reads:
            if isinstance(read.error, ZooKeeperPermissionError):
                raise read.error
            self.reads += 1
            yield read

    def close(self) -> None:
        self.reader.close()


def _scan_partition(target: ScanTarget, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One Spark task (mapInArrow): read its share of units and emit its rows, packed per table."""
    tasks = [(kind, payload) for batch in batches for kind, payload in zip(
        batch.column("kind").to_pylist(), batch.column("payload").to_pylist(), strict=True)]
    yield from scan_units(target, tasks)


def _scan_written(target: ScanTarget, writer: TablesWriter, units: Iterable[tuple[str, str]]
                  ) -> Iterator[tuple[str, int, bytes]]:
    """One Spark task (an RDD's partition): read its share of units, write their rows straight into the tables'
    files, and return only what the driver needs: rows per table, the statistics, the offload targets and the
    file records (a few hundred bytes a table)."""
    yield from _tuples(scan_units(target, list(units), writer))


def scan_units(target: ScanTarget, tasks: list[tuple[str, str]], writer: TablesWriter | None = None
               ) -> Iterator[pa.RecordBatch]:
    """A scan task's work: its units read, their rows packed per table (or, with a `writer`, written into the
    tables' files and counted), then its statistics."""
    if not tasks:
        return
    readers: dict[MetadataEndpoint, ScanReader] = {}
    # One budget for the task, whichever ensemble its reads go to, banking at least one whole multiRead request.
    rate = target.reads_per_task
    limiter = TokenBucket.for_requests(rate, target.multi_read) if rate > 0 else None

    def client(endpoint: MetadataEndpoint) -> zkutil.ZnodeReader:
        if endpoint not in readers:
            readers[endpoint] = ScanReader(endpoint, target.multi_read, limiter)
        return readers[endpoint]

    def rows() -> Iterator[dict[str, Any]]:
        pulsar = target.pulsar
        for kind, payload in tasks:
            if kind == TASK_BK:
                yield from bk_scan.scan_ledger_units(
                    client(target.bookkeeper), target.ledgers_root, payload.split("\n"), target.window
                )
            elif kind == TASK_ML:
                parent, shard, shards = _shard(payload)
                names = pulsar_scan.list_shard(client(pulsar), target.ml_root, parent, shard, shards)
                yield from pulsar_scan.scan_managed_ledgers(client(pulsar), target.ml_root, names, target.window)
            elif kind == TASK_SCHEMA:
                parent, shard, shards = _shard(payload)
                ids = pulsar_scan.list_shard(client(pulsar), target.schemas_root, parent, shard, shards)
                yield from pulsar_scan.scan_schemas(client(pulsar), target.schemas_root, ids, target.window)

    # No cyclic garbage collection while the task runs: it makes ~10 allocations a row (dicts, decoded messages,
    # buffered rows), and the collector kept traversing the growing buffers, ~10-20% of the task's CPU (driver
    # profile). The task makes no reference cycles of note, and it restores the collector when it ends.
    import gc

    collecting = gc.isenabled()
    gc.disable()
    packer = TablePacker(target.run_id, target.captured_at, writer.open() if writer is not None else None)
    try:
        for row in rows():
            yield from packer.add(row)
        yield from packer.flush()
        waited = limiter.waited_s if limiter is not None else 0.0
        yield pa.RecordBatch.from_pydict(
            {"record_type": [STAT_READS, STAT_WAIT_MS],
             "rows": [sum(r.reads for r in readers.values()), int(waited * 1000)], "payload": [b"", b""]},
            schema=packer.packed)
        # Last, once every row is in them: the files' records (a task that fails before this returns none).
        yield from packer.files()
    except BaseException:
        packer.abort()
        raise
    finally:
        if collecting:
            gc.enable()
        for reader in readers.values():
            reader.close()


_TASK_ERRORS: dict[str, type[Exception]] = {
    "ZooKeeperPermissionError": ZooKeeperPermissionError,
    "ZooKeeperSecurityError": ZooKeeperSecurityError,
    "ZooKeeperUnavailableError": ZooKeeperUnavailableError,
}


def zookeeper_task_error(exc: BaseException) -> Exception | None:
    """Our ZooKeeper error a Spark task failed with, rebuilt on the driver with its message (or None)."""
    text = str(exc)
    for name, cls in _TASK_ERRORS.items():
        if f"{name}: " in text:
            message = task_error(exc, (name,))
            if cls is ZooKeeperPermissionError:
                return ZooKeeperPermissionError("", "", message=message)
            return cls(message)
    return None


def scan_dataframe(spark: SparkSession, settings: SnapshotSettings, target: ScanTarget,
                   tasks: list[tuple[str, str]], partitions: int | None = None,
                   weights: list[float] | None = None) -> DataFrame:
    partitions = partitions or scan_sessions(spark, settings, len(tasks))
    units = spark.createDataFrame(dealt_units(spark, tasks, partitions, weights), "kind string, payload string")
    return units.mapInArrow(lambda batches: _scan_partition(target, batches), PACKED_SCHEMA)


def dealt_units(spark: SparkSession, tasks: list[tuple[str, str]], partitions: int,
                weights: list[float] | None = None) -> Any:
    """An RDD of the tasks whose partitions are deal_tasks' (unweighted: round-robin, big and small interleaved).
    Each partition is one element of the parallelized list, opened where it lands: no shuffle."""
    dealt = (deal_tasks(tasks, weights, partitions) if weights is not None
             else [tasks[i::partitions] for i in range(partitions)])
    return spark.sparkContext.parallelize(dealt, partitions).flatMap(lambda part: part)


@dataclass
class ScanTotals:
    """What the packed output of a scan, listing or read holds: rows per table and per statistic, the offload
    targets its tasks met, and (when the tasks wrote the tables' files themselves) those files' records."""

    counts: dict[str, int]
    offload_targets: list[StoreTarget] = field(default_factory=list)
    offloaded_ledgers: int = 0  # the ledgers the managed ledgers list as offloaded to those targets
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # table -> file records

    @classmethod
    def tally(cls, packed: Iterable[tuple[str, int, bytes | None]]) -> ScanTotals:
        """From (record_type, rows, payload) rows; a payload is read only for offload targets and written files."""
        counts: dict[str, int] = {}
        targets: set[tuple[str, ...]] = set()
        offloaded = 0
        files: dict[str, list[dict[str, Any]]] = {}
        for record_type, rows, payload in packed:
            if record_type == OFFLOAD_TARGET:
                targets.add(tuple(json.loads(bytes(payload or b""))))
                offloaded += int(rows)
            elif record_type == FILE_WRITTEN:
                record = json.loads(bytes(payload or b""))
                files.setdefault(record.pop("table"), []).append(record)
            else:
                counts[record_type] = counts.get(record_type, 0) + int(rows)
        return cls(counts, [StoreTarget(*t) for t in sorted(targets)], offloaded, files)

    def merge(self, other: ScanTotals) -> None:
        """`other`'s rows and files added to these (its offload targets are not: only the ZooKeeper scan's count)."""
        for key, rows in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + rows
        for table, records in other.files.items():
            self.files.setdefault(table, []).extend(records)


def scan_totals(packed: DataFrame) -> ScanTotals:
    """One job: rows per record type, and the offload targets' payloads (a handful of distinct values)."""
    target = F.when(F.col("record_type") == OFFLOAD_TARGET, F.col("payload")).alias("target")
    return ScanTotals.tally((row["record_type"], row["rows"], row["target"]) for row in
                            packed.groupBy("record_type", target).agg(F.sum("rows").alias("rows")).collect())


def _counts(packed: DataFrame) -> dict[str, int]:
    return scan_totals(packed).counts

