"""The stages in order, with one run id: what `sweeper sweep` and the stage jobs call.

Each stage records a `runs` row through `runs.stage` (succeeded, partial, refused, failed or interrupted) so
that a scheduler, a notebook or an operator can see how far a run got and why it stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pyspark.sql import SparkSession

from sweeper import journal, runs, snapshot
from sweeper.broker.system_topic import SystemTopicError
from sweeper.config import SweeperConfig
from sweeper.delete.lock import RunLockHeld
from sweeper.delete.run_result import DeleteCounts, DeleteRunResult
from sweeper.delete.settings import DeleteRefused
from sweeper.delete.stage import run_delete
from sweeper.emit import stage as emit
from sweeper.emit.stage import EmitCounts, EmitFailed, EmitRefused, EmitResult, EmitSettings
from sweeper.errors import StageRefused as StageRefused  # where the sweep's callers catch it
from sweeper.metastore.migration import MigrationRefused
from sweeper.reclaim.stage import ReclaimCounts, ReclaimResult, run_reclaim, sample_before, summary_line
from sweeper.reconcile.gates import GateFailed, run_gates
from sweeper.reconcile.stage import ReconcileCounts, ReconcileRefused, ReconcileResult, SafetySettings, run_reconcile
from sweeper.report.console import human_bytes, plural
from sweeper.report.metrics import MetricsError, publish, registry
from sweeper.retention import repair as retention_repair
from sweeper.retention.debt import (
    RetentionDebtCounts,
    RetentionDebtRefused,
    RetentionDebtResult,
    RetentionSettings,
    run_retention_debt,
)
from sweeper.retention.repair import RepairCounts, RepairResult, RepairSettings, RetentionRepairRefused
from sweeper.snapshot import SnapshotCounts, SnapshotResult, SnapshotSettings, zk_load
from sweeper.tables import TableStore

# In order; `sweep --until S` runs the stages up to S. A dry-run sweep ends after retention_debt (the report).
STAGES = ("snapshot", "reconcile", "retention_debt", "emit", "delete")
DRY_RUN_UNTIL = "retention_debt"


@dataclass
class SweepResult:
    run_id: str
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    stopped_at: str | None = None
    reason: str = ""
    partial: bool = False  # some deletes failed and wait in the retry queue (or dead-lettered)
    outcomes: list[tuple[str | None, str]] = field(default_factory=list)  # (ledger type, outcome) of deletes
    execute: bool = False
    reclaim: list[dict[str, Any]] = field(default_factory=list)  # the `reclaim` rows: what the bookies gave back


def snapshot_stage(spark: SparkSession, config: SweeperConfig, store: TableStore,
                   run_id: str | None = None) -> SnapshotResult:
    """The snapshot from a whole config, under a new run id (or `run_id`, refused when it names rows already), with
    its `runs` row: a refusal such as a wrong root is `refused`, as its exit code 3 says."""
    run_id = snapshot.claim_run_id(store, run_id)
    settings = SnapshotSettings.from_config(config)
    started = datetime.now(UTC)
    return runs.stage(store, settings, run_id, "snapshot",
                      lambda: snapshot.run(spark, store, run_id, settings, started),
                      lambda result: runs.Ending(result.counts), started=started,
                      journal=journal.PlainInterrupt("interrupted during the snapshot: its rows are never reconciled; "
                                                     "start a new run"))


def reconcile_stage(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str,
                    check_gates: bool = True) -> ReconcileResult:
    gated: dict[str, int] = {}

    def body() -> ReconcileResult:
        if check_gates:
            started = time.monotonic()
            gates = run_gates(store, run_id, config.gates, config.pulsar.brokers_path,
                              dedicated=config.safety.bookkeeper_dedicated)
            gated.update(gates_ms=int((time.monotonic() - started) * 1000), gates_on_driver=int(gates.on_driver),
                         gates_driver_rows=gates.driver_rows)
            if not gates.passed:
                raise GateFailed(gates)
        return run_reconcile(spark, store, run_id, SafetySettings.from_config(config))

    def ending(result: ReconcileResult) -> runs.Ending:
        required = int(check_gates and config.gates.require_live_brokers)
        # Only a gated reconcile may be emitted, deleted, or be a later run's baseline (runs.gates_passed).
        result.counts = result.counts.with_counts(live_brokers_required=required, gates_passed=int(check_gates),
                                                  **gated)
        waived = "" if required else "liveness gate waived: no live broker was required"
        if not check_gates:
            waived = "gates skipped (--skip-gates): audit only, never emitted or deleted"
        return runs.Ending(result.counts, message=waived)

    return runs.stage(store, config, run_id, "reconcile", body, ending, (GateFailed, ReconcileRefused),
                      journal=journal.PlainInterrupt())


def retention_stage(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str) -> RetentionDebtResult:
    """Retention debt (issue 15), after reconcile: expired ledgers nobody trims, what idle cursors pin."""
    def body() -> RetentionDebtResult:
        settings = RetentionSettings.from_config(config.retention, config.safety)
        lookup = None
        if config.retention.topic_policies == "admin":
            from sweeper.connections import Connections
            from sweeper.retention.policies import TopicPolicyLookup

            # The owner of a topic is often another broker of this cluster: its redirects are followed, others not.
            lookup = TopicPolicyLookup(Connections.from_config(config).cluster_admin(),
                                       config.retention.actions_per_second)
        return run_retention_debt(spark, store, run_id, settings, topic_policy_lookup=lookup)

    return runs.stage(store, config, run_id, "retention_debt", body, lambda result: runs.Ending(result.counts),
                      (RetentionDebtRefused, SystemTopicError), journal=journal.PlainInterrupt())


def retention_summary(result: RetentionDebtResult, log: Any = print, top: int = 10) -> None:
    """Reclaimable bytes by cause, the sweep report's retention lines."""
    c = result.counts
    log(f"[retention] {plural(c.topics.get('candidate', 0), 'unloaded topic'):>24} hold "
        f"{human_bytes(c.expired_unloaded_bytes)} past retention (`sweeper retention --execute` loads "
        f"them) in {result.duration_s:.1f}s")
    log(f"            {plural(c.idle_cursors, 'idle cursor')} pin {human_bytes(c.idle_cursor_bytes)} "
        f"({plural(c.cursors.get('candidate', 0), 'subscription')} past [retention] cursor_idle_days); "
        f"{plural(c.topics.get('unknown', 0), 'topic')} unknown; {human_bytes(c.awaiting_broker_bytes)} "
        f"await a loaded broker's trim; {plural(c.topics.get('protected', 0), 'topic')} and "
        f"{plural(c.cursors.get('protected', 0), 'idle cursor')} protected (never acted on)")
    rows = [r for r in result.report if r["total_bytes"]]
    if rows:
        shown = rows[:top]
        width = max(len(f"{r['tenant']}/{r['namespace']}") for r in shown)
        log(f"reclaimable by cause:\n  {'tenant/namespace':<{width}}  {'orphans':>10}  {'expired, unloaded':>17}  "
            f"{'idle cursors':>12}  {'total':>10}")
        for r in shown:
            log(f"  {r['tenant'] + '/' + r['namespace']:<{width}}  {_size(r['orphan_bytes']):>10}  "
                f"{_size(r['expired_unloaded_bytes']):>17}  {_size(r['idle_cursor_bytes']):>12}  "
                f"{_size(r['total_bytes']):>10}")


def _size(n: int | None) -> str:
    return human_bytes(n) if n else "-"


def emit_stage(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str) -> EmitResult:
    def escalate(exc: Exception) -> Exception | None:
        if isinstance(exc, EmitFailed):
            return StageRefused(f"emit failed; what the broker acknowledged is recorded in emitted, and a rerun "
                                f"sends only the rest: {exc}")
        return None

    settings = EmitSettings.from_config(config, recorded_in_runs=True)
    # An interrupted emit is recorded with what its journal and `emitted` hold (issue 22), here, by the wrapper.
    return runs.stage(store, settings, run_id, "emit", lambda: emit.run(spark, store, run_id, settings),
                      lambda result: runs.Ending(result.counts), (EmitRefused,), escalate,
                      journal=emit.interrupts(store, run_id))


def delete_stage(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str, execute: bool = False,
                 from_json: str | None = None, from_topic: bool = False) -> DeleteRunResult:
    def body() -> DeleteRunResult:
        if execute:
            sample_bookies_before(config, store, run_id)
        return run_delete(spark, config, store, run_id, execute=execute, from_json=from_json, from_topic=from_topic,
                          recorded_in_runs=True)

    def ending(result: DeleteRunResult) -> runs.Ending:
        return runs.Ending(result.counts, runs.PARTIAL if is_partial(result) else runs.SUCCEEDED,
                       json.dumps({"guards": result.guards}))

    # An interrupted delete is recorded by its next attempt, from the journal, with what it did (issue 22).
    return runs.stage(store, config, run_id, "delete", body, ending,
                      (DeleteRefused, RunLockHeld, SystemTopicError, MigrationRefused), journal=journal.FoldedByNext())


def sample_bookies_before(config: SweeperConfig, store: TableStore, run_id: str, log: Any = print) -> None:
    """The bookies' counters before an executed delete (issue 35): the baseline of what it gives back. Measuring
    never stops a delete: a bookie that does not answer is reported `not_measured` afterwards."""
    try:
        sample_before(config, store, run_id, log)
    except Exception as exc:  # measuring is never a reason not to delete
        log(f"[reclaim] warning: the bookies could not be sampled before the delete: {exc}")


def reclaim_stage(config: SweeperConfig, store: TableStore, run_id: str, trigger: bool = False,
                  log: Any = print) -> ReclaimResult:
    """What the run's deletes gave back per bookie (and offload bucket); with `trigger`, a GC per bookie first."""
    def ending(result: ReclaimResult) -> runs.Ending:
        return runs.Ending(result.counts, message=summary_line(result.rows))

    return runs.stage(store, config, run_id, "reclaim",
                      lambda: run_reclaim(config, store, run_id, trigger=trigger, log=log), ending,
                      journal=journal.PlainInterrupt())


def reclaim_report(result: ReclaimResult, log: Any = print) -> None:
    log(f"[reclaim]   {summary_line(result.rows)} (in {result.duration_s:.1f}s"
        + (f", {result.counts.gc_triggered} GC triggered" if result.counts.gc_triggered else "") + ")")


def repair_stage(config: SweeperConfig, store: TableStore, plan_run_id: str, run_id: str,
                 execute: bool = False) -> RepairResult:
    """The retention repair of one retention-debt plan, under its own run id (`retention-...`)."""
    def ending(result: RepairResult) -> runs.Ending:
        status = runs.REFUSED if result.stopped else runs.PARTIAL if result.counts.failed else runs.SUCCEEDED
        return runs.Ending(result.counts, status, result.stopped or "")

    return runs.stage(store, config, run_id, "retention_repair",
                  lambda: retention_repair.run(None, store, run_id,
                                               RepairSettings.from_config(config, plan_run_id, execute,
                                                                          recorded_in_runs=True)), ending,
                  (RetentionRepairRefused,), journal=journal.PlainInterrupt())


def is_partial(result: DeleteRunResult) -> bool:
    return bool(result.counts.queued_for_retry or result.counts.dead_lettered or result.counts.failed)


def delete_summary(result: DeleteRunResult) -> str:
    c = result.counts
    verb = "deleted" if result.execute else "would delete"
    done = c.deleted if result.execute else c.would_delete
    not_found = f"{c.not_found:,} not found (no snapshot lists them: check the ids), " if c.not_found else ""
    return (f"{done:,} {verb}, {c.already_gone:,} already gone, {not_found}{c.in_use:,} in use, "
            f"{c.mismatch:,} mismatch, {c.invalid:,} invalid, {c.refused:,} refused by the rules, {c.failed:,} failed "
            f"({c.queued_for_retry:,} queued for retry, {c.dead_lettered:,} dead-lettered); "
            f"{c.deferred_by_cap:,} deferred by max_deletes_per_run")


def export_metrics(config: SweeperConfig, result: SweepResult, log: Any = print) -> None:
    """Prometheus text file / Pushgateway, when configured; a metrics outage never fails a sweep."""
    if not (config.metrics.textfile or config.metrics.pushgateway_url):
        return
    metrics = registry(result.run_id, result.stages, result.outcomes, finished_at_s=time.time(),
                       status="partial" if result.partial else "succeeded", reclaim=result.reclaim)
    try:
        for target in publish(metrics, config.metrics):
            log(f"metrics written to {target}")
    except MetricsError as exc:
        log(f"warning: {exc}")


_SUMMARY_KEYS = {
    "snapshot": ("bk_ledgers", "managed_ledgers", "quarantine", "pending_deletes"),
    "reconcile": ("candidate", "young", "unknown", "missing", "stale_pointer", "other_cluster", "protected"),
    "retention_debt": ("topic.candidate", "topic.unknown", "idle_cursors", "cursor.candidate",
                       "bytes.expired_unloaded", "bytes.idle_cursor"),
    "emit": ("published", "already_published"),
    "delete": ("deleted", "would_delete", "in_use", "refused", "failed", "queued_for_retry"),
    "reclaim": ("freed", "pending_compaction", "pending_gc", "shared_window", "restarted", "unknown", "not_measured",
                "gc_triggered", "bytes.expected", "bytes.freed", "bytes.freed_upper"),
}


def summary_table(result: SweepResult) -> list[str]:
    """The run at a glance: one row per stage that ran, with its time and main counts."""
    width = max([len("stage"), *map(len, result.stages)])
    lines = [f"{'stage':<{width}} {'seconds':>8}  counts", f"{'-' * width} {'-' * 8}  {'-' * 40}"]
    for stage, counts in result.stages.items():
        if stage == "retention_debt":
            counts = {**counts, "idle_cursors": RetentionDebtCounts.from_row(counts).idle_cursors}
        shown = ", ".join(f"{k}={human_bytes(counts[k]) if k.startswith('bytes.') else format(counts[k], ',')}"
                          for k in _SUMMARY_KEYS.get(stage, ()) if counts.get(k))
        lines.append(f"{stage:<{width}} {counts.get('seconds', 0):>8.1f}  {shown or '-'}")
    return lines


class StageResult(Protocol):
    """What every stage returns (each adds its own detail): the run, its counts, its time."""

    run_id: str
    counts: runs.StageCounts
    duration_s: float


@dataclass(frozen=True)
class Step:
    """One stage as the sweep runs it: its start line, the stage itself (with its `runs` bookkeeping), and what
    the sweep prints and keeps of its result. `sweep` is a loop over these."""

    name: str
    announce: Callable[[SweeperConfig, SweepResult], str]
    run: Callable[[SparkSession, SweeperConfig, TableStore, str | None, bool], StageResult]
    report: Callable[[Any, SweeperConfig, SweepResult, Any], None]


def _snapshot(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str | None,
              execute: bool) -> SnapshotResult:
    return snapshot_stage(spark, config, store, run_id=run_id)


def _report_snapshot(snap: SnapshotResult, config: SweeperConfig, sweep: SweepResult, log: Any) -> None:
    log(f"[snapshot]  {snap.counts.bk_ledgers:>10,} ledgers, {snap.counts.managed_ledgers:,} "
        f"managed ledgers, {snap.counts.quarantine:,} quarantined in {snap.duration_s:.1f}s "
        f"({snap.ledgers_per_second:,.0f} ledgers/s)")
    log(f"            ZooKeeper: {zk_load(snap.counts)}")


def _report_reconcile(rec: ReconcileResult, config: SweeperConfig, sweep: SweepResult, log: Any) -> None:
    c = rec.counts
    engine = ("on the driver" if c.gates_on_driver
              else f"as Spark jobs, above [gates] driver_rows ({c.gates_driver_rows:,} rows)")
    gates = f" (the gates before it: {c.gates_ms / 1000:.1f}s, {engine})" if c.gates_passed else ""
    log(f"[reconcile] {c.candidate:>10,} candidates, {c.unknown:,} unknown, {c.young:,} young, {c.missing:,} missing "
        f"in {rec.duration_s:.1f}s{gates}")
    if c.other_cluster or c.stale_pointer or c.protected:
        log(f"              {c.other_cluster:,} of other clusters (never touched), {c.protected:,} protected by "
            f"Pulsar or [retention] protected_*, {c.stale_pointer:,} compaction pointers ZooKeeper may hold stale "
            "(not data loss)")
    if c.shared_bookkeeper_unverified:
        log(f"              {rec.sharing}")
    if not config.gates.require_live_brokers:
        log("              liveness gate waived (--allow-no-brokers): no live broker registration was required")
    for reason, count in sorted(c.by_reason.items(), key=lambda kv: -kv[1]):
        log(f"              {count:>8,}  {reason}")
    if rec.report:
        log("top topics by reclaimable bytes:")
        for row in rec.report[:10]:
            log(f"  {row['tenant']}/{row['namespace']}/{row['topic']}: {plural(row['orphans'] or 0, 'orphan')}, "
                f"{human_bytes(row['reclaimable_bytes'])}, oldest {plural(int(row['max_age_days'] or 0), 'day')}")
    if c.pending_deletes:
        log("pending deletes on the system topic: "
            + ", ".join(f"{v:,} {k}" for k, v in sorted(c.pending_deletes.items())))


def _report_emit(emitted: EmitResult, config: SweeperConfig, sweep: SweepResult, log: Any) -> None:
    log(f"[emit]      {emitted.counts.published:>10,} records published to "
        f"{config.system_topic.topic}, {emitted.counts.already_published:,} already there, in "
        f"{emitted.duration_s:.1f}s")


def _report_delete(deleted: DeleteRunResult, config: SweeperConfig, sweep: SweepResult, log: Any) -> None:
    sweep.partial = is_partial(deleted)
    sweep.outcomes = [(r.ledger_type, r.outcome) for r in deleted.results]
    log(f"[delete]    {delete_summary(deleted)} in {deleted.duration_s:.1f}s (paced at "
        f"{config.delete.deletes_per_second:,.0f} deletes/s per task)")


def _candidates(sweep: SweepResult) -> int:
    return int(sweep.stages.get("reconcile", {}).get("candidate", 0))


STEPS: dict[str, Step] = {step.name: step for step in (
    Step("snapshot", lambda config, sweep: "[snapshot] started: reading BookKeeper's and Pulsar's metadata",
         _snapshot, _report_snapshot),
    Step("reconcile",
         lambda config, sweep: f"[reconcile] started on snapshot {sweep.run_id}: gates, then the anti-joins",
         lambda spark, config, store, run_id, execute: reconcile_stage(spark, config, store, str(run_id)),
         _report_reconcile),
    Step("retention_debt", lambda config, sweep: "[retention] started: retention debt (unloaded topics, idle cursors)",
         lambda spark, config, store, run_id, execute: retention_stage(spark, config, store, str(run_id)),
         lambda debt, config, sweep, log: retention_summary(debt, log)),
    Step("emit",
         lambda config, sweep: f"[emit] started: marking {plural(_candidates(sweep), 'candidate')} on "
                               f"{config.system_topic.topic}",
         lambda spark, config, store, run_id, execute: emit_stage(spark, config, store, str(run_id)),
         _report_emit),
    Step("delete",
         lambda config, sweep: "[delete] started: "
                               f"{'re-verifying and deleting' if sweep.execute else 're-verifying (dry run)'} what was "
                               "marked",
         lambda spark, config, store, run_id, execute: delete_stage(spark, config, store, str(run_id),
                                                                     execute=execute),
         _report_delete),
)}
assert tuple(STEPS) == STAGES

# Each stage's typed counts, to read a `runs` row's map back (`StageCounts.from_row`).
COUNTS: dict[str, type[runs.StageCounts]] = {
    "snapshot": SnapshotCounts, "reconcile": ReconcileCounts, "retention_debt": RetentionDebtCounts,
    "emit": EmitCounts, "delete": DeleteCounts, "retention_repair": RepairCounts, "reclaim": ReclaimCounts}


def sweep(spark: SparkSession, config: SweeperConfig, store: TableStore, until: str = DRY_RUN_UNTIL,
          run_id: str | None = None, log: Any = print, execute: bool = False) -> SweepResult:
    """Stages in order up to `until`, one loop: each announces itself, runs with its `runs` bookkeeping, and
    reports. Emitting marks ledgers for deletion, so it only runs when asked."""
    if until not in STAGES:
        raise ValueError(f"unknown stage {until!r}; stages: {', '.join(STAGES)}")
    if execute and until != "delete":
        raise ValueError(f"execute=True deletes, but until={until!r} stops before the delete")
    t0 = time.monotonic()
    result = SweepResult(run_id or "", execute=execute)
    for name in STAGES[:STAGES.index(until) + 1]:
        step = STEPS[name]
        log(step.announce(config, result))
        done = step.run(spark, config, store, result.run_id or None, execute)
        result.run_id = done.run_id
        result.stages[name] = {"seconds": round(done.duration_s, 1), **done.counts.as_row()}
        step.report(done, config, result, log)
    if execute and "delete" in result.stages and config.reclaim.enabled:
        trigger = config.reclaim.trigger_gc
        log("[reclaim] started: " + ("a GC on each bookie that held deleted data, then what the bookies gave back"
                                     if trigger else "what the bookies gave back (no GC triggered: [reclaim] "
                                                     "trigger_gc = false)"))
        reclaimed = reclaim_stage(config, store, result.run_id, trigger=trigger, log=log)
        result.stages["reclaim"] = {"seconds": round(reclaimed.duration_s, 1), **reclaimed.counts.as_row()}
        result.reclaim = reclaimed.rows
        reclaim_report(reclaimed, log)
    if "reconcile" in result.stages and "emit" not in result.stages:
        log(f"dry run: {_candidates(result):,} candidates would be marked; nothing was published")
    return _finish(result, config, until, execute, t0, log)


def _finish(result: SweepResult, config: SweeperConfig, until: str, execute: bool, t0: float,
            log: Any) -> SweepResult:
    """The run's metrics, its stage table and its last line, wherever `until` ended it."""
    export_metrics(config, result, log)
    for line in summary_table(result):
        log(line)
    if until == "delete" and execute:
        done = "deletes executed"
    elif "emit" in result.stages:
        done = (f"{result.stages['emit'].get('published', 0):,} marks published to {config.system_topic.topic}; "
                "nothing was deleted: `sweeper delete --execute` drains them")
    else:
        done = "dry run: nothing was deleted"
    log(f"run {result.run_id} done in {time.monotonic() - t0:.1f}s ({done})")
    return result
