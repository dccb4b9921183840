"""The listing of the offloaded objects: the containers the scan found in the offload contexts (and the configured
extra S3 buckets), sliced into listing tasks that list them through the adapter their driver names
(sweeper.objectstore: S3, GCS, Azure Blob; on S3 with `head_metadata`, a HEAD an object), their rows packed per
table or written into the tables' files; a slice that cannot be listed is a quarantine row, never a gap, and a
driver we cannot read is a quarantine row of its own (`unknown_driver`), whose objects stay unknown."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from sweeper.objectstore import ObjectStore, ObjectStoreError, StoreTarget, open_store
from sweeper.objectstore.listing import offload_rows
from sweeper.objectstore.s3 import listing_units
from sweeper.scan import quarantine_row
from sweeper.snapshot.packer import TablePacker, _tuples
from sweeper.snapshot.scanners import ScanTotals
from sweeper.snapshot.settings import PACKED_SCHEMA, STAT_LISTING_FAILED, SnapshotSettings
from sweeper.tables.files import TablesWriter
from sweeper.vocabulary import LISTING_FAILED, UNKNOWN_DRIVER

# Offloaded objects one listing task handles before another pays for itself (a task imports boto3 and makes a
# client per bucket); with `head_metadata` each object costs a HEAD, so far fewer.
OBJECTS_PER_LISTING_TASK, OBJECTS_PER_HEAD_TASK = 100_000, 2_000


def listing_tasks(parallelism: int, units: int, offloaded_ledgers: int, head_metadata: bool,
                  extra_buckets: bool) -> int:
    """Listing partitions: as many as the cores can use, fewer when the contexts name few offloaded ledgers (two
    objects each, data and index). A configured extra bucket is of unknown size: as many as the cores can use."""
    wanted = 4 * parallelism
    if not extra_buckets:
        per_task = OBJECTS_PER_HEAD_TASK if head_metadata else OBJECTS_PER_LISTING_TASK
        wanted = min(wanted, -(-2 * offloaded_ledgers // per_task))
    return max(1, min(wanted, units))


def offload_targets(found: Iterable[StoreTarget], settings: SnapshotSettings) -> list[StoreTarget]:
    """Containers named in the managed ledgers' offload contexts (as the scan tasks found them), one per store API
    and name, plus the configured extra buckets (S3)."""
    targets: dict[tuple[str, str], StoreTarget] = {}
    for target in found:
        targets.setdefault((target.kind or target.driver, target.container), target)
    for bucket in (b.strip() for b in settings.offload.extra_buckets.split(",")):
        if bucket and ("s3", bucket) not in targets:
            targets[("s3", bucket)] = StoreTarget("aws-s3", bucket, settings.offload.region)
    return [targets[k] for k in sorted(targets)]


def _list_partition(batches: Iterator[pa.RecordBatch], endpoint_override: str, head_metadata: bool,
                    run_id: str, captured_at: datetime) -> Iterator[pa.RecordBatch]:
    """One listing task (mapInArrow): its slices' objects, packed per table."""
    items = (item for batch in batches for item in batch.to_pylist())
    yield from list_units(items, endpoint_override, head_metadata, run_id, captured_at)


def list_units(items: Iterable[dict[str, Any]], endpoint_override: str, head_metadata: bool, run_id: str,
               captured_at: datetime, writer: TablesWriter | None = None) -> Iterator[pa.RecordBatch]:
    """A listing task's work: its slices' objects packed per table (with a `writer`, written and counted)."""
    packer = TablePacker(run_id, captured_at, writer.open() if writer is not None else None)
    stores: dict[StoreTarget, ObjectStore | ObjectStoreError] = {}
    failed = 0
    try:
        for item in items:
            target = StoreTarget(item["driver"], item["bucket"], item["region"], item["endpoint"])
            if target not in stores:
                stores[target] = _open(target, endpoint_override)
            unit = (item["prefix"], item["start_after"], item["stop_at"])
            store = stores[target]
            rows: list[dict[str, Any]] = []
            if target.kind is None:
                if item["slot"] == 0:  # one row per container, not one per slice
                    rows = [quarantine_row("offload", f"{target.driver}://{target.container}/", UNKNOWN_DRIVER,
                                           f"offload driver {target.driver!r} is not one the sweeper reads: the "
                                           "objects there are not listed, and the ledgers offloaded there stay "
                                           "unknown")]
            else:
                try:
                    if isinstance(store, ObjectStoreError):
                        raise store
                    rows = list(offload_rows(store, unit, head_metadata))
                except ObjectStoreError as exc:
                    # One row per failed slice: a bucket listed in part must never pass for a complete listing.
                    prefix, start_after, stop_at = unit
                    where = prefix or f"({start_after!r}, {stop_at!r})"
                    rows = [quarantine_row("offload", _url(target, prefix), LISTING_FAILED,
                                           f"cannot list {target.driver} container {target.container} slice "
                                           f"{where}: {exc}")]
                    failed += 1
            for row in rows:
                yield from packer.add(row)
        yield from packer.flush()
        if failed:
            yield pa.RecordBatch.from_pydict({"record_type": [STAT_LISTING_FAILED], "rows": [failed],
                                              "payload": [b""]}, schema=packer.packed)
        yield from packer.files()
    except BaseException:
        packer.abort()
        raise


def _open(target: StoreTarget, endpoint_override: str) -> ObjectStore | ObjectStoreError:
    """The target's adapter, or why it cannot be had (kept, and filed once per slice of the container)."""
    if target.kind is None:
        return ObjectStoreError(f"unknown driver {target.driver!r}")
    try:
        # The configured override is the S3 endpoint's (`[offload] endpoint_override`), never another store's.
        return open_store(target, endpoint_override if target.kind == "s3" else "")
    except ObjectStoreError as exc:
        return exc


def _url(target: StoreTarget, prefix: str) -> str:
    scheme = {"s3": "s3", "gcs": "gs", "azure": "azure", "filesystem": "file"}.get(target.kind or "", target.driver)
    return f"{scheme}://{target.container}/{prefix}"


def _listing_units(spark: SparkSession, settings: SnapshotSettings, targets: list[StoreTarget],
                   offloaded_ledgers: int | None) -> tuple[list[tuple[Any, ...]], int]:
    """The listing's slices, dealt to its tasks, and how many tasks."""
    units = [(t.driver, t.container, t.region, t.endpoint, slot, prefix, start_after, stop_at)
             for t in targets for slot, (prefix, start_after, stop_at) in enumerate(listing_units())
             if t.kind is not None or slot == 0]  # a driver we cannot read: one unit, for its quarantine row
    extra = offloaded_ledgers is None or any(b.strip() for b in settings.offload.extra_buckets.split(","))
    tasks = listing_tasks(spark.sparkContext.defaultParallelism, len(units), offloaded_ledgers or 0,
                          settings.offload.head_metadata, extra)
    # Dealt round-robin, so each task gets slices of every bucket, and no shuffle to split them.
    return [unit for part in range(tasks) for unit in units[part::tasks]], tasks


_LISTING_COLUMNS = ("driver", "bucket", "region", "endpoint", "slot", "prefix", "start_after", "stop_at")


def offload_dataframe(spark: SparkSession, settings: SnapshotSettings, targets: list[StoreTarget], run_id: str,
                      captured_at: datetime, offloaded_ledgers: int | None = None) -> DataFrame:
    dealt, tasks = _listing_units(spark, settings, targets, offloaded_ledgers)
    frame = spark.createDataFrame(
        spark.sparkContext.parallelize(dealt, tasks),
        "driver string, bucket string, region string, endpoint string, slot int, prefix string, start_after string, "
        "stop_at string")
    override, head = settings.offload.endpoint_override, settings.offload.head_metadata
    return frame.mapInArrow(lambda b: _list_partition(b, override, head, run_id, captured_at), PACKED_SCHEMA)


def offload_written(spark: SparkSession, settings: SnapshotSettings, targets: list[StoreTarget], run_id: str,
                    captured_at: datetime, writer: TablesWriter, offloaded_ledgers: int | None = None
                    ) -> ScanTotals:
    """The listing as one job whose tasks write the objects' rows into the tables' files themselves."""
    dealt, tasks = _listing_units(spark, settings, targets, offloaded_ledgers)
    override, head = settings.offload.endpoint_override, settings.offload.head_metadata

    def task(units: Iterator[tuple[Any, ...]]) -> Iterator[tuple[str, int, bytes]]:
        items = (dict(zip(_LISTING_COLUMNS, unit, strict=True)) for unit in units)
        return _tuples(list_units(items, override, head, run_id, captured_at, writer))

    return ScanTotals.tally(spark.sparkContext.parallelize(dealt, tasks).mapPartitions(task).collect())

