"""The stages in order, with one run id: what `sweeper sweep` and the stage jobs call.

Each stage records a `runs` row through `runs.stage` (succeeded, partial, refused, failed or interrupted) so
that a scheduler, a notebook or an operator can see how far a run got and why it stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pyspark.sql import SparkSession

from sweeper import journal, runs, snapshot
from sweeper.broker.errors import SystemTopicError
from sweeper.config import SweeperConfig
from sweeper.delete.errors import DeleteRefused
from sweeper.delete.run_result import DeleteCounts, DeleteRunResult
from sweeper.delete.settings import DeleteSettings
from sweeper.delete.stage import run as run_delete
from sweeper.emit import stage as emit
from sweeper.emit.errors import EmitFailed, EmitRefused
from sweeper.emit.stage import EmitCounts, EmitResult, EmitSettings
from sweeper.errors import RunLockHeld
from sweeper.errors import StageRefused as StageRefused  # where the sweep's callers catch it
from sweeper.metastore.errors import MigrationRefused
from sweeper.reclaim import stage as reclaim
from sweeper.reclaim.stage import ReclaimCounts, ReclaimResult, ReclaimSettings, summary_line
from sweeper.reconcile.errors import GateFailed, ReconcileRefused
from sweeper.reconcile.gates import GateSettings
from sweeper.reconcile.gates import run as run_gates
from sweeper.reconcile.stage import ReconcileCounts, ReconcileResult, SafetySettings, run_reconcile
from sweeper.report.console import human_bytes, plural
from sweeper.report.errors import MetricsError
from sweeper.report.metrics import publish, registry
from sweeper.report.summaries import (
    Summary,
    delete_run_summary,
    delete_summary,  # noqa: F401  (where its callers have always found it)
    emit_summary,
    is_partial,
    reclaim_summary,
    reconcile_summary,
    repair_summary,
    retention_debt_summary,
    snapshot_summary,
)
from sweeper.retention import repair as retention_repair
from sweeper.retention.debt import run_retention_debt
from sweeper.retention.debt_types import RetentionDebtCounts, RetentionDebtResult, RetentionSettings
from sweeper.retention.errors import RetentionDebtRefused, RetentionRepairRefused
from sweeper.retention.repair_plan import RepairCounts, RepairResult, RepairSettings
from sweeper.snapshot import SnapshotCounts, SnapshotResult, SnapshotSettings
from sweeper.tables import TableStore

# In order; `sweep --until S` runs the stages up to S. A dry-run sweep ends after retention_debt (the report).
STAGES = ("snapshot", "reconcile", "retention_debt", "emit", "delete", "reclaim")
DRY_RUN_UNTIL = "retention_debt"
Log = Callable[[str], Any]


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
            gates = run_gates(store, run_id, GateSettings.from_config(config))
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
        settings = RetentionSettings.from_config(config)
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
        return run_delete(spark, store, run_id, DeleteSettings.from_config(
            config, execute=execute, from_json=from_json, from_topic=from_topic, recorded_in_runs=True))

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
        reclaim.baseline(store, run_id, ReclaimSettings.from_config(config, log=log))
    except Exception as exc:  # measuring is never a reason not to delete
        log(f"[reclaim] warning: the bookies could not be sampled before the delete: {exc}")


def reclaim_stage(config: SweeperConfig, store: TableStore, run_id: str, trigger: bool = False,
                  log: Any = print) -> ReclaimResult:
    """What the run's deletes gave back per bookie (and offload bucket); with `trigger`, a GC per bookie first."""
    def ending(result: ReclaimResult) -> runs.Ending:
        return runs.Ending(result.counts, message=summary_line(result.rows))

    settings = ReclaimSettings.from_config(config, trigger=trigger, log=log)
    return runs.stage(store, settings, run_id, "reclaim", lambda: reclaim.run(store, run_id, settings), ending,
                      journal=journal.PlainInterrupt())


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
class StageCall:
    """What the sweep or a single-stage command hands a step: the session, the config, the tables, the run (None:
    a new one, for the snapshot), whether to act, where to say things, and the command's own choices (`options`:
    `skip_gates`, `from_json`, `from_topic`, `trigger`, `plan_run_id`)."""

    spark: SparkSession | None
    config: SweeperConfig
    store: TableStore
    run_id: str | None
    execute: bool = False
    log: Log = print
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One stage as the sweep and the commands run it: its start line, the stage itself (with its `runs`
    bookkeeping), its result's one summary (sweeper.report.summaries), and what the sweep keeps of it. `sweep` is a
    loop over these, and each single-stage command runs its one step.

    A step may ride along after the step ahead of it (`rides_along`), and may need something before that step runs
    (`before`): reclaim's baseline of the bookies is only a baseline if it is taken before the delete."""

    name: str
    announce: Callable[[SweeperConfig, SweepResult], str]
    run: Callable[[StageCall], StageResult]
    summarize: Callable[[Any], Summary]
    keep: Callable[[Any, SweepResult], None] = lambda result, sweep: None  # beyond its counts: for metrics
    rides_along: Callable[[SweeperConfig, bool], bool] | None = None  # (config, execute): also after the one ahead
    before: Callable[[StageCall], None] | None = None  # runs before the one ahead, with that one's call

    def report(self, result: Any, sweep: SweepResult, log: Log) -> None:
        self.keep(result, sweep)
        for line in self.summarize(result).sweep_lines():
            log(line)


def _spark(call: StageCall) -> SparkSession:
    if call.spark is None:
        raise ValueError("this stage runs Spark jobs: its call needs a SparkSession")
    return call.spark


def _run_id(call: StageCall) -> str:
    if not call.run_id:
        raise ValueError("this stage works on a run: its call needs a run id")
    return call.run_id


def _snapshot(call: StageCall) -> SnapshotResult:
    return snapshot_stage(_spark(call), call.config, call.store, run_id=call.run_id)


def _reconcile(call: StageCall) -> ReconcileResult:
    return reconcile_stage(_spark(call), call.config, call.store, _run_id(call),
                           check_gates=not call.options.get("skip_gates", False))


def _retention_debt(call: StageCall) -> RetentionDebtResult:
    return retention_stage(_spark(call), call.config, call.store, _run_id(call))


def _emit(call: StageCall) -> EmitResult:
    return emit_stage(_spark(call), call.config, call.store, _run_id(call))


def _delete(call: StageCall) -> DeleteRunResult:
    return delete_stage(_spark(call), call.config, call.store, _run_id(call), execute=call.execute,
                        from_json=call.options.get("from_json"), from_topic=bool(call.options.get("from_topic")))


def _keep_delete(deleted: DeleteRunResult, sweep: SweepResult) -> None:
    sweep.partial = is_partial(deleted)
    sweep.outcomes = [(r.ledger_type, r.outcome) for r in deleted.results]


def _keep_reclaim(reclaimed: ReclaimResult, sweep: SweepResult) -> None:
    sweep.reclaim = reclaimed.rows


def _reclaims(config: SweeperConfig, execute: bool) -> bool:
    """Today's `--execute` ends with what the bookies gave back, when [reclaim] is enabled."""
    return execute and config.reclaim.enabled


def _reclaim_baseline(call: StageCall) -> None:
    if _reclaims(call.config, call.execute):
        sample_bookies_before(call.config, call.store, _run_id(call), call.log)


def _reclaim(call: StageCall) -> ReclaimResult:
    # In the sweep a GC needs --execute and [reclaim] trigger_gc: a dry run's reclaim measures, it never asks a
    # bookie for anything. `sweeper reclaim --execute` asks for one itself (`trigger`), whatever trigger_gc says.
    trigger = call.options.get("trigger", call.execute and call.config.reclaim.trigger_gc)
    return reclaim_stage(call.config, call.store, _run_id(call), trigger=bool(trigger), log=call.log)


def _repair(call: StageCall) -> RepairResult:
    """The retention repair of the plan `options["plan_run_id"]` names, under the call's own run id."""
    return repair_stage(call.config, call.store, str(call.options["plan_run_id"]), _run_id(call),
                        execute=call.execute)


def _announce_reclaim(config: SweeperConfig, sweep: SweepResult) -> str:
    if sweep.execute and config.reclaim.trigger_gc:
        return "[reclaim] started: a GC on each bookie that held deleted data, then what the bookies gave back"
    why = "[reclaim] trigger_gc = false" if sweep.execute else "a dry run"
    return f"[reclaim] started: what the bookies gave back (no GC triggered: {why})"


def _candidates(sweep: SweepResult) -> int:
    return int(sweep.stages.get("reconcile", {}).get("candidate", 0))


STEPS: dict[str, Step] = {step.name: step for step in (
    Step("snapshot", lambda config, sweep: "[snapshot] started: reading BookKeeper's and Pulsar's metadata",
         _snapshot, snapshot_summary),
    Step("reconcile",
         lambda config, sweep: f"[reconcile] started on snapshot {sweep.run_id}: gates, then the anti-joins",
         _reconcile, reconcile_summary),
    Step("retention_debt", lambda config, sweep: "[retention] started: retention debt (unloaded topics, idle cursors)",
         _retention_debt, retention_debt_summary),
    Step("emit",
         lambda config, sweep: f"[emit] started: marking {plural(_candidates(sweep), 'candidate')} on "
                               f"{config.system_topic.topic}",
         _emit, emit_summary),
    Step("delete",
         lambda config, sweep: "[delete] started: "
                               f"{'re-verifying and deleting' if sweep.execute else 're-verifying (dry run)'} what was "
                               "marked",
         _delete, delete_run_summary, _keep_delete),
    Step("reclaim", _announce_reclaim, _reclaim, reclaim_summary, _keep_reclaim, rides_along=_reclaims,
         before=_reclaim_baseline),
    # Not a stage of the sweep (STAGES): the repair acts on a finished run's retention-debt plan, when asked.
    Step("retention_repair", lambda config, sweep: "[retention] started: repairing the retention debt of a plan",
         _repair, repair_summary),
)}
assert tuple(STEPS)[:len(STAGES)] == STAGES

# Each stage's typed counts, to read a `runs` row's map back (`StageCounts.from_row`).
COUNTS: dict[str, type[runs.StageCounts]] = {
    "snapshot": SnapshotCounts, "reconcile": ReconcileCounts, "retention_debt": RetentionDebtCounts,
    "emit": EmitCounts, "delete": DeleteCounts, "retention_repair": RepairCounts, "reclaim": ReclaimCounts}


def riding_after(name: str, config: SweeperConfig, execute: bool) -> Step | None:
    """The step that runs after `name` unasked (reclaim after an executed delete), if any."""
    index = STAGES.index(name) + 1
    follower = STEPS[STAGES[index]] if index < len(STAGES) else None
    return follower if follower and follower.rides_along and follower.rides_along(config, execute) else None


def plan(config: SweeperConfig, until: str, execute: bool) -> list[Step]:
    """The steps a sweep up to `until` runs: those up to it, and one that rides along after it."""
    steps = [STEPS[name] for name in STAGES[:STAGES.index(until) + 1]]
    follower = riding_after(until, config, execute)
    return steps + ([follower] if follower else [])


def sweep(spark: SparkSession, config: SweeperConfig, store: TableStore, until: str = DRY_RUN_UNTIL,
          run_id: str | None = None, log: Log = print, execute: bool = False) -> SweepResult:
    """Stages in order up to `until`, one loop: each announces itself, runs with its `runs` bookkeeping, and
    reports. Emitting marks ledgers for deletion, so it only runs when asked."""
    if until not in STAGES:
        raise ValueError(f"unknown stage {until!r}; stages: {', '.join(STAGES)}")
    if execute and STAGES.index(until) < STAGES.index("delete"):
        raise ValueError(f"execute=True deletes, but until={until!r} stops before the delete")
    t0 = time.monotonic()
    result = SweepResult(run_id or "", execute=execute)
    steps = plan(config, until, execute)
    for step, ahead in zip(steps, [*steps[1:], None], strict=True):
        log(step.announce(config, result))
        call = StageCall(spark, config, store, result.run_id or None, execute, log)
        if ahead is not None and ahead.before is not None:
            ahead.before(call)
        done = step.run(call)
        result.run_id = done.run_id
        result.stages[step.name] = {"seconds": round(done.duration_s, 1), **done.counts.as_row()}
        step.report(done, result, log)
    if "reconcile" in result.stages and "emit" not in result.stages:
        log(f"dry run: {_candidates(result):,} candidates would be marked; nothing was published")
    return _finish(result, config, execute, t0, log)


def _finish(result: SweepResult, config: SweeperConfig, execute: bool, t0: float, log: Log) -> SweepResult:
    """The run's metrics, its stage table and its last line, wherever `until` ended it."""
    export_metrics(config, result, log)
    for line in summary_table(result):
        log(line)
    if execute:
        done = "deletes executed"
    elif "emit" in result.stages:
        done = (f"{result.stages['emit'].get('published', 0):,} marks published to {config.system_topic.topic}; "
                "nothing was deleted: `sweeper delete --execute` drains them")
    else:
        done = "dry run: nothing was deleted"
    log(f"run {result.run_id} done in {time.monotonic() - t0:.1f}s ({done})")
    return result
