"""The snapshot action: ZooKeeper metadata into Delta tables, one run at a time.

The driver plans (lists directories down to where the znodes are); Spark tasks read the znodes,
each with its own ZooKeeper session and pipelined requests, and emit rows for every snapshot
table at once. Each table then gets one Delta commit for the run.

Where the table store can write from the tasks (`TableStore.task_writer`, the delta-rs engine), the scan
is one Spark job: its tasks write their rows straight into the tables' Parquet files and return the files'
records with their own row counts, and the driver commits those records. Otherwise (delta-spark) the
scan's packed rows are cached, counted, and appended by a second job. Either way the rows each table
commits are held against the rows the producers counted (SnapshotIncomplete).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from sweeper import runs
from sweeper.broker.errors import SystemTopicError
from sweeper.broker.liveness import clock_problem
from sweeper.errors import RunIdTaken
from sweeper.snapshot.errors import ClockSkewRefused, SnapshotIncomplete
from sweeper.snapshot.offload_listing import offload_targets
from sweeper.snapshot.outputs import _CachedOutput, _Output, _WrittenOutput
from sweeper.snapshot.peers import snapshot_peers
from sweeper.snapshot.pending import topic_partitions
from sweeper.snapshot.planning import concurrent_scan_tasks, estimated_znodes, plan_tasks, scan_sessions
from sweeper.snapshot.scanners import zookeeper_task_error
from sweeper.snapshot.settings import (
    STAT_LISTING_FAILED,
    STAT_READS,
    ScanTarget,
    SnapshotCounts,
    SnapshotResult,
    SnapshotSettings,
)
from sweeper.spark import task_error
from sweeper.table_schemas import SNAPSHOT_TABLES
from sweeper.tables import TableStore


def run_id_holder(store: TableStore, run_id: str) -> str | None:
    """What already uses `run_id` in the tables (a `runs` row of any stage, or rows of any snapshot table, as
    a snapshot killed before its `runs` row leaves), or None when it is free."""
    recorded = runs.holder(store, run_id)
    if recorded is not None:
        return recorded
    for table in SNAPSHOT_TABLES:
        if store.exists(table) and store.read_arrow(table, where={"run_id": run_id}, columns=["run_id"]).num_rows:
            return f"the {table} table has its rows (a snapshot that did not finish)"
    return None


def claim_run_id(store: TableStore, run_id: str | None) -> str:
    """A new run id, or `run_id` when it names no rows yet: a scheduler retrying a job with the same id would
    otherwise append a second copy of the snapshot under it (issue 27), refused before anything is written."""
    if run_id is not None:
        holder = run_id_holder(store, run_id)
        if holder is not None:
            raise RunIdTaken(f"run id {run_id} is taken: {holder}. Leave out --run-id for a new run, or give one "
                             "not used before; later stages of that run take it with --run-id")
    return run_id or runs.new_run_id()


def run(spark: SparkSession, store: TableStore, run_id: str, settings: SnapshotSettings,
        started: datetime | None = None) -> SnapshotResult:
    """Every store's metadata into the snapshot tables under `run_id`. Its `runs` row is the pipeline's to write
    (`pipeline.snapshot_stage`, the one wrapper of every stage); `started` is the row's start, the rows'
    `captured_at`."""
    return _snapshot(spark, store, run_id, settings, started or datetime.now(UTC))


def _snapshot(spark: SparkSession, store: TableStore, run_id: str, settings: SnapshotSettings,
              started: datetime) -> SnapshotResult:
    t0 = time.monotonic()
    plan = plan_tasks(settings)
    skew = clock_problem(plan.clock.skew_ms, settings.safety.max_clock_skew_seconds)
    if skew:
        raise ClockSkewRefused(skew)
    tasks, ledger_plan = plan.tasks, plan.ledgers
    sessions = scan_sessions(spark, settings, len(tasks), estimated_znodes(plan))
    connections = settings.connections
    target = ScanTarget(
        bookkeeper=connections.bookkeeper,
        ledgers_root=settings.bookkeeper.ledgers_root,
        pulsar=connections.pulsar,
        ml_root=settings.pulsar.managed_ledgers_root,
        schemas_root=settings.pulsar.schemas_root,
        window=settings.scan.window,
        multi_read=settings.scan.multi_read,
        run_id=run_id,
        captured_at=started,
        # Each task at once gets an equal share, so the sum never exceeds the limit.
        reads_per_task=settings.scan.reads_per_second / concurrent_scan_tasks(spark, sessions),
    )
    writer = store.task_writer(SNAPSHOT_TABLES)
    output: _Output = _WrittenOutput(writer) if writer is not None else _CachedOutput()
    try:
        t_scan = time.monotonic()
        try:
            totals = output.scan(spark, settings, target, tasks, sessions, plan.task_weights())
        except Exception as exc:
            failure = zookeeper_task_error(exc)
            if failure is None:
                raise
            raise failure from exc
        counts = totals.counts
        scan_s = time.monotonic() - t_scan
        # The load put on ZooKeeper, and the limits that bounded it, in the run's report.
        counts["scan_sessions"] = sessions
        counts["reads_per_second_limit"] = int(settings.scan.reads_per_second)
        counts["zk_reads_per_second"] = int(counts.get(STAT_READS, 0) / scan_s) if scan_s else 0
        buckets = offload_targets(totals.offload_targets, settings) if settings.offload.enabled else []
        if buckets:
            listing_counts = output.listing(spark, settings, buckets, run_id, started, totals.offloaded_ledgers).counts
            failed_slices = listing_counts.pop(STAT_LISTING_FAILED, 0)
            for table, rows in listing_counts.items():
                counts[table] = counts.get(table, 0) + rows
            if failed_slices:
                counts["quarantine.offload_listing"] = failed_slices
        if settings.system_topic.service_url and settings.system_topic.read_in_snapshot:
            partitions = topic_partitions(settings)
            counts["pending_delete_partitions"] = partitions
            if partitions:
                try:
                    pending_counts = output.pending(spark, settings, partitions, run_id, started).counts
                except Exception as exc:
                    raise SystemTopicError(f"reading {settings.system_topic.topic}: "
                                           f"{task_error(exc, ('SystemTopicError',))}") from exc
                for table, rows in pending_counts.items():
                    counts[table] = counts.get(table, 0) + rows
                # Messages anyone could have produced: counted apart so they never pass for a partial scan.
                counts["quarantine.pending_delete"] = pending_counts.get("quarantine", 0)
        commit_metadata = {"run_id": run_id, "stage": "snapshot"}
        namespace_rows = [{"record_type": "namespaces", "namespace": ns, "sources": sorted(sources)}
                          for ns, sources in sorted(plan.pulsar.namespaces.items())]
        driver_rows = ([dict(row) for row in ledger_plan.quarantine] + namespace_rows
                       + [dict(row) for row in plan.policy_rows] + [dict(row) for row in plan.owner_rows])
        if driver_rows:
            output.driver_rows(spark, driver_rows, run_id, started)
            counts["quarantine"] = counts.get("quarantine", 0) + len(ledger_plan.quarantine)
            counts["namespaces"] = counts.get("namespaces", 0) + len(namespace_rows)
            counts["namespace_policies"] = len(plan.policy_rows)
            counts["bundle_owners"] = len(plan.owner_rows)
        counts["bundle_owners_unreadable"] = int(plan.owners_problem is not None)
        counts["live_brokers"] = plan.live_brokers
        if plan.clock.skew_ms is not None:
            counts["clock_skew_ms"] = plan.clock.skew_ms
        commits = output.commit(store, commit_metadata)
        versions = {table: commit.version for table, commit in commits.items()}
        # A row lost between the scan and its table would make a referenced ledger look unreferenced. The counts
        # are the producers' own (rows packed); the committed rows are the files' (rows written), so a writer or
        # a commit that drops rows is caught here either way.
        lost = {table: (counts.get(table, 0), commit.rows) for table, commit in commits.items()
                if commit.rows != counts.get(table, 0)}
        if lost:
            raise SnapshotIncomplete("the snapshot's tables do not hold what the scan read (table: read, "
                                     f"committed): {lost}; do not reconcile run {run_id}")
        if plan.peers:
            peer_counts = snapshot_peers(spark, settings, store, target, plan.peers, commit_metadata)
            counts.update(peer_counts)
        for table in SNAPSHOT_TABLES:
            counts.setdefault(table, 0)
        counts["scan_units"] = len(tasks)
    finally:
        output.close()
    typed = SnapshotCounts.from_row(counts)
    return SnapshotResult(
        run_id=run_id,
        counts=typed,
        versions=versions,
        duration_s=time.monotonic() - t0,
        scan_s=scan_s,
        layout=ledger_plan.layout.value,
        units=len(tasks),
        quarantined=typed.quarantine,
    )
