"""The delete action (PIP-186 phase 2): a run's pending deletes, re-verified and deleted by Spark tasks.

Input is what the run emitted plus whatever the retry queue says is due. Records are spread over
tasks by ledger id; each task opens its own ZooKeeper (and S3) clients and runs the executors of
`sweeper.delete`, which re-read the ledger and its referrers and delete with compare-and-set.
The driver then commits one `delete_results` row per record, queues what still fails in
`retry_queue` (with back-off), and moves what exhausted its attempts to `dead_letter`.

Dry run unless `execute`; with `execute`, a ZooKeeper run lock keeps a second delete run out.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kazoo.exceptions import NoAuthError
from pyspark.sql import SparkSession

from sweeper import runs
from sweeper.broker.liveness import clock_problem, live_brokers
from sweeper.config import SweeperConfig
from sweeper.connections import OxiaEndpoint
from sweeper.delete import permissions
from sweeper.delete.drain import TopicDrain
from sweeper.delete.errors import DeleteRefused
from sweeper.delete.inputs import (
    DEAD_LETTERED,
    QUEUED,
    RESOLVED,
    Layouts,
    _buckets,
    _never_seen,
    _shadows,
    listed_ledger_ids,
    load_inputs,
    other_stores,
    read_operator_list,
    records_from_json,
    run_buckets,
)
from sweeper.delete.journal import Journal, open_journal, relabel_lost_answers, resolve_interrupted
from sweeper.delete.lock import DeleteRunLock
from sweeper.delete.records import SOURCE_EMITTED, SOURCE_JSON, SOURCE_RETRY, PendingRecord
from sweeper.delete.results import DELETED, FAILED, DeleteResult
from sweeper.delete.retry import RetryPolicy
from sweeper.delete.run_result import DeleteCounts, DeleteRunResult
from sweeper.delete.settings import DeleteSettings, DeleteTarget
from sweeper.delete.tasks import TaskRow, delete_partition
from sweeper.delete.zk_executor import LOCK_LOST
from sweeper.errors import LockLost
from sweeper.metastore.errors import MigrationRefused
from sweeper.metastore.migration import MIGRATION_NOT_ATTEMPTED, MigrationGuard, check_stores
from sweeper.rules.classify import Sharing
from sweeper.rules.owner import ActingRules
from sweeper.rules.protection import Protection
from sweeper.rules.safety import GracePeriod, Scope
from sweeper.scan.bookkeeper import read_layout
from sweeper.table_schemas import DEAD_LETTER, DELETE_RESULTS, RETRY_QUEUE
from sweeper.tables import TableStore
from sweeper.vocabulary import HOUR_MS
from sweeper.zk import client as zkutil
from sweeper.zk.errors import ZooKeeperPermissionError

# ---- the stage ---------------------------------------------------------------------------------

def _check_emitted(store: TableStore, run_id: str) -> None:
    runs.require(store, run_id, "emit", DeleteRefused,
                 f"run {run_id} has no successful emit: nothing was marked for deletion")
    # Emit refuses an ungated run too; the delete asks again, whoever recorded that emit (DESIGN invariant 19).
    runs.require_gated(store, run_id, DeleteRefused)


def _partitions(spark: SparkSession, settings: DeleteSettings, records: int) -> int:
    wanted = settings.delete.tasks or 2 * spark.sparkContext.defaultParallelism
    return max(1, min(wanted, (records + 999) // 1000))


def run_delete(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str, *, execute: bool = False,
               from_json: str | Path | None = None, from_topic: bool = False,
               now_ms: int | None = None, recorded_in_runs: bool = False) -> DeleteRunResult:
    return run(spark, store, run_id, DeleteSettings.from_config(config, execute=execute, from_json=from_json,
                                                               from_topic=from_topic, now_ms=now_ms,
                                                               recorded_in_runs=recorded_in_runs))


def run(spark: SparkSession, store: TableStore, run_id: str, settings: DeleteSettings) -> DeleteRunResult:
    """One delete run. Input: the run's emitted records and due retries; or an operator's JSON list; or
    (`from_topic`) up to `max_deletes_per_run` messages drained from the system topic's Shared
    subscription, acknowledged only once their outcomes are committed (never in a dry run)."""
    execute, from_json, from_topic, now_ms = settings.execute, settings.from_json, settings.from_topic, settings.now_ms
    t0 = time.monotonic()
    now = datetime.now(UTC) if now_ms is None else datetime.fromtimestamp(now_ms / 1000, UTC)
    d = settings.delete
    connections = settings.connections
    split = connections.pulsar.hosts != connections.bookkeeper.hosts
    if split and execute and not isinstance(connections.pulsar, OxiaEndpoint):
        # The compare-and-set multi must cover the ledger znode and its referrers in one ensemble.
        raise DeleteRefused("Pulsar and BookKeeper metadata are in different ZooKeeper ensembles; deleting "
                            "needs one multi-operation across both, so only dry runs are possible")
    if split and execute and isinstance(connections.pulsar, OxiaEndpoint) != isinstance(connections.bookkeeper,
                                                                                         OxiaEndpoint):
        raise DeleteRefused("Pulsar's metadata and BookKeeper's are in different kinds of store (one ZooKeeper, "
                            "one Oxia): a cluster midway through a migration; only dry runs are possible")
    client = connections.bookkeeper.connect()
    lock: DeleteRunLock | None = None
    drain: TopicDrain | None = None
    journal: Journal | None = None
    never_seen: frozenset[int] = frozenset()  # snapshots and the system topic name only ids Pulsar had
    layouts: Layouts = {}  # what the run's emitted rows carry for delete_results (issue 46)
    try:
        # PIP-454: no delete while a migration copies the store, none on a store migrated away from (issue 24);
        # checked before anything else is read.
        check_stores(connections.pulsar, settings.pulsar_store, deleting=execute,
                     acknowledged_completed=settings.safety.acknowledge_migration_completed,
                     source=connections.migration_source)
        layout = read_layout(client, settings.bookkeeper.ledgers_root, settings.bookkeeper.writes_layout_record)
        if from_topic:
            drain = TopicDrain(settings.system_topic, connections.broker(), d.subscription, d.max_deletes_per_run)
            inputs = drain.receive()
            counts = {"from_topic": len(drain.messages)}
            buckets = _buckets(store, settings, None)
            others = other_stores(store, None, inputs)
        elif from_json is not None:
            listed = read_operator_list(from_json)
            inputs = records_from_json(listed, client, settings.bookkeeper.ledgers_root, layout)
            counts = {"from_json": len(inputs)}
            never_seen = _never_seen(store, listed_ledger_ids(listed))
            buckets = _buckets(store, settings, None)
            others = other_stores(store, None, inputs)
        else:
            _check_emitted(store, run_id)
            inputs, counts = load_inputs(store, run_id, now, limit=d.max_deletes_per_run, carried=layouts)
            buckets = run_buckets(store, settings, run_id, inputs)
            others = other_stores(store, run_id, inputs)
        cap = d.max_deletes_per_run
        counts["deferred_by_cap"] = max(0, counts.pop("selected", len(inputs)) - cap)
        inputs = inputs[:cap]
        counts["records"] = len(inputs)
        guards = {"execute": execute, "max_deletes_per_run": cap, "deletes_per_second_per_task": d.deletes_per_second,
                  "min_age_hours": settings.safety.min_age_hours, "lock": d.lock_path if execute else None}
        shadows = _shadows(store)
        if shadows is None and execute and inputs:
            raise DeleteRefused("no snapshot in the tables: run `sweeper snapshot` first, so that shadow topics "
                                "(which list their source topics' ledgers) are known and re-checked")
        counts["shadow_topics"] = sum(len(names) for _, names in shadows or ())
        if inputs and isinstance(connections.bookkeeper, OxiaEndpoint):
            guards["permission_check"] = "not applicable: Oxia has no per-record ACLs"
        elif inputs:
            allowed = permissions.check(
                connections.bookkeeper, [item.payload for item in inputs],
                ledgers_root=settings.bookkeeper.ledgers_root, layout=layout,
                ml_root=settings.pulsar.managed_ledgers_root, schemas_root=settings.pulsar.schemas_root,
                shadows=dict(shadows or ()), reads_per_second=settings.scan.reads_per_second,
                multi_read=settings.scan.multi_read, max_sessions=settings.scan.max_sessions)
            guards["permission_check"] = allowed.status
            counts["missing_permissions"] = len(allowed.missing)
            if allowed.missing:
                guards["permission_check"] = allowed.refusal()
                if execute:
                    raise DeleteRefused(allowed.refusal())
        if execute:
            lock = DeleteRunLock(client, d.lock_path, run_id=run_id,
                                 wait_for_dead_local_holder_s=settings.bookkeeper.session_timeout_s + 2.0,
                                 log=settings.log)
            try:
                lock.acquire()
            except NoAuthError as exc:
                lock = None
                raise DeleteRefused(str(ZooKeeperPermissionError(
                    d.lock_path.rsplit("/", 1)[0] or "/", "CREATE",
                    f"the run lock {d.lock_path} (create its parent writable by the sweeper, or set [delete] "
                    "lock_path)"))) from exc
            # Under the lock, an attempt the journal shows unclosed has stopped: its deletes go on record (with its
            # run id) before this attempt could take them for its own `already_gone`.
            journal = open_journal(store, run_id, settings.bookkeeper.ledgers_root, layout,
                                   runs_row_follows=settings.recorded_in_runs)
            resolution = resolve_interrupted(store, lambda path: client.exists(path) is not None, journal.attempt_id)
            if resolution.attempts or resolution.unrecorded:
                counts.update(resolution.counts())
                guards["interrupted_attempts"] = resolution.attempts + resolution.unrecorded
                inputs = [item for item in inputs if item.record_key not in resolution.settled]
                counts["records"] = len(inputs)
            skew = clock_problem(lock.clock_skew_ms, settings.safety.max_clock_skew_seconds)
            guards["clock_skew_ms"] = lock.clock_skew_ms
            if skew:
                # Every grace-period decision compares this host's clock with ledger times: refuse.
                raise DeleteRefused(skew)
            if settings.gates.require_live_brokers:
                # The liveness gate reconcile's snapshot passed, again now: a record from a stale copy of the
                # metadata (a cluster moved elsewhere) would be checked against references nobody updates.
                pulsar = client if connections.pulsar.hosts == connections.bookkeeper.hosts else None
                brokers = _live_brokers(settings, pulsar)
                guards["live_brokers"] = brokers
                if not brokers:
                    raise DeleteRefused(f"no live broker registered under {settings.pulsar.brokers_path}: this "
                                        "metadata may be a stale copy; pass --allow-no-brokers for a cleanup with the "
                                        "brokers stopped")
        grace = GracePeriod.of(int(settings.safety.min_age_hours * HOUR_MS), force=settings.safety.force_min_age)
        target = DeleteTarget(
            bookkeeper=connections.bookkeeper, pulsar=connections.pulsar if split else None,
            ledgers_root=settings.bookkeeper.ledgers_root, layout=layout.value,
            ml_root=settings.pulsar.managed_ledgers_root, schemas_root=settings.pulsar.schemas_root,
            min_age_ms=grace.min_age_ms, now_ms=now_ms, execute=execute,
            batch_size=d.batch_size, deletes_per_second=d.deletes_per_second, op_timeout_s=d.op_timeout_s,
            multi_read=settings.scan.multi_read,
            policy=RetryPolicy(max_attempts=d.max_attempts, in_task_attempts=d.in_task_attempts,
                               retry_after_s=d.retry_after_s),
            endpoint_override=settings.offload.endpoint_override, buckets=buckets, other_stores=others,
            shadows=shadows or (),
            local_cluster=settings.pulsar.cluster_name, rules=acting_rules(settings),
            peers=connections.peers,
            offload_enabled=settings.offload.enabled, journal=journal,
            never_seen=never_seen,
            migration=MigrationGuard(settings.pulsar_store, settings.safety.acknowledge_migration_completed,
                                     d.op_timeout_s) if execute else None,
            fence=lock.fence if lock is not None else None)
        rows: list[TaskRow] = []
        if inputs:
            parts = _partitions(spark, settings, len(inputs))
            # Grouped by ledger id on the driver, one group per Spark partition: no shuffle of the payloads.
            groups: list[list[PendingRecord]] = [[] for _ in range(parts)]
            for item in inputs:
                groups[max(_ledger_of(item), 0) % parts].append(item)
            rows = (spark.sparkContext.parallelize(groups, parts)
                    .mapPartitions(lambda it: delete_partition(it, target)).collect())
        if lock is not None:
            _stop_if_lock_lost(lock, rows, journal)
        result = _commit(store, run_id, rows, target, execute, now, counts, layouts)
        if journal is not None:
            if lock is not None:
                # Paused between the check above and here, the run may have lost its lock meanwhile, and its next
                # holder folded this attempt in: it must not also close it and record a status of its own.
                lock.check()
            journal.close()
        refused = [r.error for r in result.results if r.error and "(ZooKeeper NoAuth)" in r.error]
        if refused:
            # Committed first, so every outcome is on record; then the run stops as refused (exit 3).
            raise DeleteRefused(f"{refused[0]}; {len(refused)} record(s) not done wait in the retry queue: grant the "
                                "permission and run again")
        _refuse_if_migrating(result, settings, bool(rows))
        if drain is not None and execute:
            # Committed: every record has its final result or sits in the retry queue.
            result.counts = result.counts.with_counts(acknowledged=drain.acknowledge())
    finally:
        if drain is not None:
            drain.close()
        if lock is not None:
            lock.release()
        zkutil.close(client)
    result.guards = guards
    result.duration_s = time.monotonic() - t0
    return result


def _stop_if_lock_lost(lock: DeleteRunLock, rows: list[TaskRow], journal: Journal | None) -> None:
    """Before anything is committed: when a task met the lost lock, or the driver cannot show it still holds it,
    the run stops here (LockLost, exit 3). It commits nothing and leaves its journal open: what its tasks did is
    there, and the run that takes the lock next folds it in as it folds in a killed run, so every deletion has one
    `deleted` row and the run one status (`interrupted`). DESIGN.md invariant 22."""
    met = next((row[4] for row in rows if row[4].detail == LOCK_LOST), None)
    why = met.error if met is not None else (lock.fence.verify(lock.client) if lock.fence is not None else None)
    if why is None:
        return
    deleted = sum(1 for row in rows if row[4].outcome == DELETED)
    where = f"delete_journal (attempt {journal.attempt_id})" if journal is not None else "delete_journal"
    raise LockLost(f"the delete run {lock.run_id} stopped acting: {why}. It deleted {deleted:,} ledger(s) or "
                   f"object(s) before it stopped; each is on record in {where}, and the next `delete --execute` "
                   "files them under this run and re-verifies the rest")


def _refuse_if_migrating(result: DeleteRunResult, settings: DeleteSettings, ran: bool) -> None:
    """After the commit, so that every outcome is on record: MigrationRefused (exit 3) naming the phase when a
    task met a PIP-454 migration, or when one began while the last chunks ran (read once more here)."""
    stopped = [r.error for r in result.results if r.detail == MIGRATION_NOT_ATTEMPTED]
    if stopped:
        raise MigrationRefused(f"{stopped[0]}. The delete stopped mid-run: {len(stopped)} record(s) not attempted "
                               "wait in the retry queue")
    if ran and settings.execute:
        try:
            check_stores(settings.connections.pulsar, settings.pulsar_store, deleting=True,
                         acknowledged_completed=settings.safety.acknowledge_migration_completed,
                         source=settings.connections.migration_source)
        except MigrationRefused as exc:
            raise MigrationRefused(f"{exc} (read as the delete's tasks ended: every outcome of this run is on "
                                   "record)") from exc


def acting_rules(settings: DeleteSettings) -> ActingRules:
    """The rules of today's settings, as reconcile applies them (sweeper.reconcile.stage.SafetySettings.from_config)."""
    sharing = (Sharing.DEDICATED if settings.safety.bookkeeper_dedicated
               else Sharing.PEERS_READ if settings.safety.peer_metadata else Sharing.UNVERIFIED)
    return ActingRules(Scope.of(settings.safety.allow, settings.safety.deny),
                       Protection.of(settings.retention.protected_subscriptions, settings.retention.protected_topics),
                       sharing)


def _live_brokers(settings: DeleteSettings, client: Any) -> int:
    own = client is None
    if own:
        client = settings.connections.pulsar.connect()
    try:
        return len(live_brokers(client, settings.pulsar.brokers_path))
    finally:
        if own:
            zkutil.close(client)


def _ledger_of(item: PendingRecord) -> int:
    parts = item.record_key.split("/")
    try:
        if item.source == SOURCE_JSON:
            return int(parts[-1])
        return int(parts[1]) if parts[0] in ("LEDGER", "OFFLOAD_LEDGER") else -1
    except (ValueError, IndexError):
        return -1


def _commit(store: TableStore, run_id: str, rows: list[TaskRow], target: DeleteTarget, execute: bool,
            now: datetime, counts: dict[str, int], layouts: Layouts | None = None) -> DeleteRunResult:
    # Rows are ordered by when they were written; `now` (the decision clock) only sets next_attempt_at.
    written = datetime.now(UTC)
    if execute and target.journal is not None:
        # A target found gone that a delete of ours may have removed (its answer lost, its task run again) is ours
        # (DESIGN.md invariant 18), before anything is counted or committed.
        relabel_lost_answers(store, target.journal.attempt_id, [(row[0], row[4]) for row in rows])
    columns: dict[str, list[Any]] = {name: [] for name in DELETE_RESULTS.fieldNames()}
    queue_rows, dead_rows = [], []
    results: list[DeleteResult] = []
    for record_key, source, origin_run_id, payload, result in rows:
        results.append(result)
        # The emitted row's carried layout, for reclaim; other sources carry none (reclaim reads bk_ledgers for them).
        carried = source == SOURCE_EMITTED and record_key in (layouts or {})
        layout = (layouts or {}).get(record_key) if carried else None
        counts[result.outcome] = counts.get(result.outcome, 0) + 1
        for name, value in (
                ("run_id", run_id), ("origin_run_id", origin_run_id), ("finished_at", written),
                ("record_key", record_key), ("ledger_id", result.ledger_id), ("ledger_type", result.ledger_type),
                ("component", result.component), ("topic_name", result.topic_name), ("outcome", result.outcome),
                ("detail", result.detail[:2000]), ("error", (result.error or "")[:2000] or None),
                ("attempt", result.attempt), ("duration_ms", result.duration_ms), ("zk_path", result.zk_path),
                ("zk_version", result.zk_version), ("s3_bucket", result.s3_bucket), ("s3_keys", result.s3_keys),
                ("dry_run", not execute), ("source", source), ("carried", True if carried else None),
                ("bk_layout", layout)):
            columns[name].append(value)
        if not execute:
            continue
        base = {"run_id": run_id, "recorded_at": written, "record_key": record_key,
                "ledger_id": result.ledger_id, "attempts": result.attempt}
        if result.outcome == FAILED:
            step, due_ms = target.policy.next_step(result.attempt, int(now.timestamp() * 1000))
            if step == "retry":
                queue_rows.append({**base, "payload": payload, "state": QUEUED, "last_error": result.error,
                                   "next_attempt_at": datetime.fromtimestamp((due_ms or 0) / 1000, UTC)})
            else:
                queue_rows.append({**base, "payload": payload, "state": DEAD_LETTERED, "last_error": result.error})
                dead_rows.append({**base, "payload": payload, "state": "dead", "last_error": result.error})
        elif source == SOURCE_RETRY:
            queue_rows.append({**base, "payload": b"", "state": RESOLVED, "last_error": None})
    metadata = {"run_id": run_id, "stage": "delete"}
    if rows:
        store.append_columns("delete_results", columns, DELETE_RESULTS, commit_metadata=metadata)
    if queue_rows:
        store.append_rows("retry_queue", queue_rows, RETRY_QUEUE, commit_metadata=metadata)
    if dead_rows:
        store.append_rows("dead_letter", dead_rows, DEAD_LETTER, commit_metadata=metadata)
    counts["queued_for_retry"] = sum(1 for r in queue_rows if r["state"] == QUEUED)
    counts["dead_lettered"] = len(dead_rows)
    counts["execute"] = int(execute)
    counts["deletes_per_second_per_task"] = int(target.deletes_per_second)
    return DeleteRunResult(run_id, execute, DeleteCounts.from_row(counts), 0.0, results)


def describe(result: DeleteResult) -> str:
    """One line per record, for `sweeper delete --from-json` and the logs."""
    where = result.zk_path or (f"s3://{result.s3_bucket}/{','.join(result.s3_keys)}" if result.s3_bucket else "")
    error = f" error={result.error}" if result.error else ""
    return (f"{result.outcome:<13} ledger={result.ledger_id} type={result.ledger_type} "
            f"component={result.component} {where} attempt={result.attempt} {result.detail}{error}")
