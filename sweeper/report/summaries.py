"""What each stage's result says, in one set of words: `sweep` and the single-stage commands print the same
`Summary` (issue 46), framed for where it is printed.

Each `*_summary` is a function of its result alone: the settings a line names (the system topic, the delete's
pace, whether the liveness gate was waived) are read from what the result carries, never from the config, so a
line cannot say one thing in `sweep` and another in `sweeper emit`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sweeper.report.console import human_bytes, plural
from sweeper.snapshot import zk_load

if TYPE_CHECKING:
    from sweeper.delete.run_result import DeleteRunResult
    from sweeper.emit.stage import EmitResult
    from sweeper.reconcile.stage import ReconcileResult
    from sweeper.retention.debt_types import RetentionDebtResult
    from sweeper.retention.repair_plan import RepairResult
    from sweeper.snapshot import SnapshotResult

TAG_WIDTH = 12  # "[reconcile] ": the sweep's lines line up under the longest tag


@dataclass(frozen=True)
class Summary:
    """One stage's result in words: a head line, notes under it, a block both callers print (a top-N table), the
    detail only a single-stage command prints (its counts tables, per-row lines), and the `--json` payload."""

    tag: str
    head: str
    notes: tuple[str, ...] = ()
    block: tuple[str, ...] = ()
    detail: tuple[str, ...] = ()
    payload: dict[str, Any] = field(default_factory=dict)

    def sweep_lines(self) -> list[str]:
        """In a sweep: tagged, since the run id is said once at the end."""
        return [f"{'[' + self.tag + ']':<{TAG_WIDTH}}{self.head}", *(" " * TAG_WIDTH + n for n in self.notes),
                *self.block]

    def command_lines(self) -> list[str]:
        """For a single-stage command: the run it acted on leads, then everything the result holds."""
        return [f"{self.tag} {self.payload['run_id']}: {self.head}", *(f"  {n}" for n in self.notes), *self.block,
                *self.detail]


def counts_lines(title: str, counts: Mapping[str, int]) -> list[str]:
    """A titled, aligned table of counts, keys sorted."""
    width = max((len(k) for k in counts), default=0)
    return [title, *(f"  {key:<{width}}  {counts[key]:>12,}" for key in sorted(counts))]


def snapshot_summary(result: SnapshotResult) -> Summary:
    c = result.counts
    tables = c.tables()
    return Summary(
        "snapshot",
        f"{c.bk_ledgers:,} ledgers, {c.managed_ledgers:,} managed ledgers, {c.quarantine:,} quarantined in "
        f"{result.duration_s:.1f}s ({result.ledgers_per_second:,.0f} ledgers/s; layout {result.layout}, "
        f"{result.units} scan units)",
        notes=(f"ZooKeeper: {zk_load(c)}",),
        detail=(*counts_lines("rows written per table:", tables),
                *counts_lines("other counts:", {k: v for k, v in c.as_row().items() if k not in tables})),
        payload={"run_id": result.run_id, "counts": c.as_row(), "versions": result.versions})


def reconcile_summary(result: ReconcileResult) -> Summary:
    c = result.counts
    engine = ("on the driver" if c.gates_on_driver
              else f"as Spark jobs, above [gates] driver_rows ({c.gates_driver_rows:,} rows)")
    gates = f" (the gates before it: {c.gates_ms / 1000:.1f}s, {engine})" if c.gates_passed else ""
    notes = []
    if c.other_cluster or c.stale_pointer or c.protected:
        notes.append(f"{c.other_cluster:,} of other clusters (never touched), {c.protected:,} protected by Pulsar or "
                     f"[retention] protected_*, {c.stale_pointer:,} compaction pointers ZooKeeper may hold stale (not "
                     "data loss)")
    if c.shared_bookkeeper_unverified:
        notes.append(result.sharing)
    if c.gates_passed and not c.live_brokers_required:  # recorded by the gated reconcile itself
        notes.append("liveness gate waived (--allow-no-brokers): no live broker registration was required")
    notes += [f"{count:>8,}  {reason}" for reason, count in sorted(c.by_reason.items(), key=lambda kv: -kv[1])]
    block = []
    if result.report:
        block.append("top topics by reclaimable bytes:")
        block += [f"  {row['tenant']}/{row['namespace']}/{row['topic']}: {plural(row['orphans'] or 0, 'orphan')}, "
                  f"{human_bytes(row['reclaimable_bytes'])}, oldest {plural(int(row['max_age_days'] or 0), 'day')}"
                  for row in result.report[:10]]
    if c.pending_deletes:
        block.append("pending deletes on the system topic: "
                     + ", ".join(f"{v:,} {k}" for k, v in sorted(c.pending_deletes.items())))
    by_status = c.with_counts(by_reason={}).as_row()
    return Summary(
        "reconcile",
        f"{c.candidate:,} candidates, {c.unknown:,} unknown, {c.young:,} young, {c.missing:,} missing in "
        f"{result.duration_s:.1f}s{gates}",
        notes=tuple(notes), block=tuple(block), detail=tuple(counts_lines("orphans by status:", by_status)),
        payload={"run_id": result.run_id, "counts": by_status, "by_reason": dict(c.by_reason)})


def retention_debt_summary(result: RetentionDebtResult, top: int = 10) -> Summary:
    """Reclaimable bytes by cause."""
    c = result.counts
    block = []
    rows = [r for r in result.report if r["total_bytes"]]
    if rows:
        shown = rows[:top]
        width = max(len(f"{r['tenant']}/{r['namespace']}") for r in shown)
        block = [f"reclaimable by cause:\n  {'tenant/namespace':<{width}}  {'orphans':>10}  "
                 f"{'expired, unloaded':>17}  {'idle cursors':>12}  {'total':>10}"]
        block += [f"  {r['tenant'] + '/' + r['namespace']:<{width}}  {_size(r['orphan_bytes']):>10}  "
                  f"{_size(r['expired_unloaded_bytes']):>17}  {_size(r['idle_cursor_bytes']):>12}  "
                  f"{_size(r['total_bytes']):>10}" for r in shown]
    return Summary(
        "retention",
        f"{plural(c.topics.get('candidate', 0), 'unloaded topic')} hold {human_bytes(c.expired_unloaded_bytes)} past "
        f"retention (`sweeper retention --execute` loads them) in {result.duration_s:.1f}s",
        notes=(f"{plural(c.idle_cursors, 'idle cursor')} pin {human_bytes(c.idle_cursor_bytes)} "
               f"({plural(c.cursors.get('candidate', 0), 'subscription')} past [retention] cursor_idle_days); "
               f"{plural(c.topics.get('unknown', 0), 'topic')} unknown; {human_bytes(c.awaiting_broker_bytes)} "
               f"await a loaded broker's trim; {plural(c.topics.get('protected', 0), 'topic')} and "
               f"{plural(c.cursors.get('protected', 0), 'idle cursor')} protected (never acted on)",),
        block=tuple(block), payload={"run_id": result.run_id, "counts": c.as_row()})


def _size(n: int | None) -> str:
    return human_bytes(n) if n else "-"


def emit_summary(result: EmitResult) -> Summary:
    c = result.counts
    return Summary(
        "emit",
        f"{c.published:,} records published to {result.topic or 'the system topic'}, {c.already_published:,} "
        f"already there, in {result.duration_s:.1f}s ({result.records_per_second:,.0f} records/s)",
        detail=tuple(counts_lines("records:", c.as_row())), payload={"run_id": result.run_id, "counts": c.as_row()})


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


def delete_run_summary(result: DeleteRunResult) -> Summary:
    pace = result.guards.get("deletes_per_second_per_task")
    paced = f" (paced at {pace:,.0f} deletes/s per task)" if pace else ""
    permissions = result.guards.get("permission_check", "ok")
    return Summary(
        "delete",
        f"{delete_summary(result)} in {result.duration_s:.1f}s{paced}"
        + ("" if result.execute else " (dry run: pass --execute to delete)"),
        notes=(f"ZooKeeper permissions: {permissions}",) if permissions != "ok" else (),
        detail=tuple(counts_lines("guards:", {k: int(v) for k, v in result.guards.items()
                                              if isinstance(v, int | float)})),
        payload={"run_id": result.run_id, "counts": result.counts.as_row(), "guards": result.guards})


def reclaim_summary(result: Any) -> Summary:
    """`result`: a sweeper.reclaim.stage.ReclaimResult, not imported: reclaim imports this package (a circle)."""
    gc = f", {result.counts.gc_triggered} GC triggered" if result.counts.gc_triggered else ""
    return Summary(
        "reclaim", f"{result.line} (in {result.duration_s:.1f}s{gc})",
        detail=tuple(f"{row['target']:<24} {row['verdict']:<18} expected {row['expected_bytes'] or 0:>14,}  freed "
                     f"{row['freed_bytes'] or 0:>14,}  pending {row['pending_bytes'] or 0:>14,}  {row['action']}"
                     + (f"  ({row['why']})" if row["why"] else "") for row in result.rows),
        payload={"run_id": result.run_id, "counts": result.counts.as_row()})


def repair_summary(result: RepairResult) -> Summary:
    counts = ", ".join(f"{v:,} {k}" for k, v in sorted(result.counts.as_row().items()) if v and k != "execute")
    rows = []
    for row in result.rows:
        what = row["topic_name"] + (f" subscription {row['cursor']!r}" if row["cursor"] else "")
        sizes = f" ({row['bytes_before']:,} -> {row['bytes_after']:,} bytes)" if row["bytes_after"] is not None else ""
        rows.append(f"{row['action']:<20} {row['outcome']:<15} {what}{sizes}: {row['detail']}")
    return Summary(
        "retention repair",
        f"{counts or 'nothing to do'} in {result.duration_s:.1f}s (plan {result.plan_run_id})"
        + ("" if result.execute else " (dry run: pass --execute to act)"),
        detail=tuple(rows),
        payload={"run_id": result.run_id, "plan_run_id": result.plan_run_id, "counts": result.counts.as_row()})
