"""The runs ledger (issue 22): one module writes and reads `runs`; a real Delta table through delta-rs, no Spark."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sweeper import journal, runs
from sweeper.config import SweeperConfig
from sweeper.tables.delta_rs import DeltaRsTableStore


class NotReady(RuntimeError):
    pass


def _store(tmp_path: Path) -> DeltaRsTableStore:
    return DeltaRsTableStore(str(tmp_path / "tables"), None)  # type: ignore[arg-type] - reads need no Spark


def test_latest_require_and_holder_read_what_record_wrote(tmp_path: Path) -> None:
    store, cfg = _store(tmp_path), SweeperConfig()
    assert runs.latest(store, "snapshot") is None and runs.rows(store) == []
    with pytest.raises(NotReady, match="no snapshot"):
        runs.require(store, "r1", "snapshot", NotReady, "no snapshot")
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    runs.record(store, "r1", "snapshot", runs.SUCCEEDED, t0, {"bk_ledgers": 7}, cfg)
    runs.record(store, "r2", "snapshot", runs.SUCCEEDED, t0 + timedelta(minutes=1), {"bk_ledgers": 9}, cfg)
    runs.record(store, "r3", "snapshot", runs.FAILED, t0 + timedelta(minutes=2), {}, cfg, RuntimeError("boom"))
    assert runs.latest(store, "snapshot") == "r2"  # the newest that succeeded, not the newest
    assert runs.require(store, "r1", "snapshot", NotReady, "x") == {"bk_ledgers": 7}
    with pytest.raises(NotReady):
        runs.require(store, "r3", "snapshot", NotReady, "r3 failed")
    assert runs.holder(store, "r3") == "its snapshot stage is recorded (failed)" and runs.holder(store, "r9") is None
    assert runs.started_at(store, "r1") == t0
    assert [r["run_id"] for r in runs.rows(store, stage="snapshot")] == ["r1", "r2", "r3"]


def test_messages_are_one_line_and_never_a_stack_trace(tmp_path: Path) -> None:
    store, cfg = _store(tmp_path), SweeperConfig()
    trace = "py4j.protocol.Py4JJavaError: An error occurred\n" + "\tat org.apache.spark.Foo.bar(Foo.java:1)\n" * 500
    runs.record(store, "r1", "delete", runs.FAILED, datetime.now(UTC), {}, cfg, RuntimeError(trace))
    runs.record(store, "r1", "reconcile", runs.REFUSED, datetime.now(UTC), {}, cfg,
                "data-quality gates failed for snapshot r1:\n  - bk_ledgers empty\n  - no live broker")
    messages = {r["stage"]: r["message"] for r in runs.rows(store, run_id="r1")}
    assert messages["delete"] == "RuntimeError: py4j.protocol.Py4JJavaError: An error occurred"
    assert messages["reconcile"] == "data-quality gates failed for snapshot r1: - bk_ledgers empty - no live broker"
    with pytest.raises(ValueError, match="unknown run status"):
        runs.record(store, "r1", "delete", "done", datetime.now(UTC), {}, cfg)


def test_run_ids_sort_by_time() -> None:
    early = runs.new_run_id(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    late = runs.new_run_id(datetime(2026, 11, 25, tzinfo=UTC))
    assert early.startswith("20260102T030405Z-") and early < late


def test_the_runs_status_agrees_with_the_exit_code_a_stage_ends_with(tmp_path: Path) -> None:
    """Issue 23: a failure the stage escalates to a refusal (exit 3) was recorded `failed` in `runs`."""
    from sweeper.emit.errors import EmitFailed
    from sweeper.errors import StageRefused

    store, cfg = _store(tmp_path), SweeperConfig()

    def send() -> None:
        raise EmitFailed("producer p-1: 3 sends failed")

    def escalate(exc: Exception) -> Exception | None:
        return StageRefused(f"emit failed: {exc}") if isinstance(exc, EmitFailed) else None

    with pytest.raises(StageRefused):
        runs.stage(store, cfg, "r1", "emit", send, lambda result: None, (), escalate, journal=journal.PlainInterrupt())  # type: ignore[arg-type]
    with pytest.raises(EmitFailed):
        runs.stage(store, cfg, "r2", "emit", send, lambda result: None, (), journal=journal.PlainInterrupt())  # type: ignore[arg-type]
    assert [(r["run_id"], r["status"]) for r in runs.rows(store, stage="emit")] == [
        ("r1", runs.REFUSED), ("r2", runs.FAILED)]
    assert runs.rows(store, run_id="r1")[0]["message"] == "emit failed: producer p-1: 3 sends failed"

    # Any refusal exits 3, so it is `refused` whether or not the stage names it (the snapshot named none, and a
    # wrong root or a refused ZooKeeper login was `failed` in `runs` while the command said "refused", exit 3).
    from sweeper.zk.errors import WrongRootError

    def wrong_root() -> None:
        raise WrongRootError("/ledgers does not exist on 127.0.0.1:2181: check [bookkeeper] ledgers_root")

    with pytest.raises(WrongRootError):
        runs.stage(store, cfg, "r3", "snapshot", wrong_root, lambda result: None, journal=journal.PlainInterrupt())  # type: ignore[arg-type]
    assert [r["status"] for r in runs.rows(store, run_id="r3")] == [runs.REFUSED]


def test_a_spark_job_cancelled_by_an_interrupt_is_the_interrupt(tmp_path: Path) -> None:
    """PySpark's SIGINT handler raises KeyboardInterrupt and cancels the running jobs; the collect that waited on
    one then fails with a py4j error raised while handling the interrupt. That is `interrupted` (exit 130), never
    `failed` with a Java trace (the kill test's SIGINT landed there once)."""
    from sweeper.errors import caused_by_interrupt

    store, cfg = _store(tmp_path), SweeperConfig()

    def cancelled() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("[SPARK_JOB_CANCELLED] Job 6 cancelled as part of cancellation of all jobs") from None

    with pytest.raises(RuntimeError) as raised:
        cancelled()
    assert caused_by_interrupt(raised.value) and not caused_by_interrupt(RuntimeError("boom"))
    with pytest.raises(KeyboardInterrupt):
        runs.stage(store, cfg, "r1", "reconcile", cancelled, lambda result: None, (), journal=journal.PlainInterrupt())  # type: ignore[arg-type]
    assert [(r["run_id"], r["status"]) for r in runs.rows(store, stage="reconcile")] == [("r1", runs.INTERRUPTED)]

    # A stage that turns such a failure into a refusal on its way out (the snapshot's system-topic read does) is
    # still the interrupt: `interrupted`, as the exit code 130 says, never `refused`.
    from sweeper.broker.errors import SystemTopicError

    def read_cancelled() -> None:
        try:
            cancelled()
        except RuntimeError as exc:
            raise SystemTopicError(f"reading the system topic: {exc}") from exc

    with pytest.raises(KeyboardInterrupt):
        runs.stage(store, cfg, "r2", "snapshot", read_cancelled, lambda result: None, journal=journal.PlainInterrupt())  # type: ignore[arg-type]
    assert [r["status"] for r in runs.rows(store, run_id="r2")] == [runs.INTERRUPTED]


def test_typed_counts_are_the_runs_map_and_read_back_whole(tmp_path: Path) -> None:
    """A stage's counts are typed fields; `runs` keeps the flat map it always had, and reading it back gives the
    same typed counts. A key no field declares is kept in `extra`, never dropped."""
    from sweeper.reconcile.stage import ReconcileCounts
    from sweeper.retention.debt_types import RetentionDebtCounts

    by_type = {"candidate.ledger": 2, "candidate.offload_object": 1, "young.ledger": 1}
    counts = ReconcileCounts(candidate=3, young=1, by_status_and_type=by_type, by_reason={"topic_deleted": 3},
                             pending_deletes={"done": 4}, live_brokers_required=1)
    row = counts.as_row()
    assert row["candidate"] == 3 and row["candidate.offload_object"] == 1 and row["reason.topic_deleted"] == 3
    assert row["pending_delete.done"] == 4 and row["gate.live_brokers_required"] == 1 and row["missing"] == 0
    assert ReconcileCounts.from_row(row) == counts
    store = _store(tmp_path)
    runs.record(store, "r1", "reconcile", runs.SUCCEEDED, datetime.now(UTC), counts, None)
    assert ReconcileCounts.from_row(runs.succeeded(store, "r1", "reconcile") or {}) == counts

    debt = RetentionDebtCounts.from_row({"topic.candidate": 2, "cursor.idle": 3, "cursor.candidate": 1,
                                         "cursor.protected": 1, "cursor.unknown": 2, "bytes.idle_cursor": 10,
                                         "something_new": 7})
    # Idle means idle: neither the cursors the step could not judge nor those Pulsar protects (issue 36).
    assert debt.topics == {"candidate": 2} and debt.idle_cursors == 4 and debt.idle_cursor_bytes == 10
    assert debt.extra == {"something_new": 7} and debt.as_row()["something_new"] == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        debt.topics_judged = 1  # type: ignore[misc]


def test_the_retention_repair_records_its_run_through_the_stage_wrapper(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`sweeper retention` once kept its own `runs` bookkeeping (issue 22's fifth wrapper): an interrupted or
    failed repair left no row. Now: stopped by the broker = refused, failed actions = partial, Ctrl-C =
    interrupted, a refusal = refused (exit 3), each with its typed counts."""
    from sweeper import pipeline
    from sweeper.retention.errors import RetentionRepairRefused
    from sweeper.retention.repair_plan import RepairCounts, RepairResult

    store, cfg = _store(tmp_path), SweeperConfig()
    endings: list[Any] = [
        RepairResult("x", "plan", True, counts=RepairCounts(deleted=2, execute=1)),
        RepairResult("x", "plan", True, counts=RepairCounts(deleted=1, failed=1, execute=1)),
        RepairResult("x", "plan", True, counts=RepairCounts(skipped=1), stopped="stopped: HTTP 401 from the broker"),
        KeyboardInterrupt(), RetentionRepairRefused("plan-9 is older than [retention] max_plan_age_hours")]

    def run_repair(*args: Any, **kwargs: Any) -> RepairResult:
        ending = endings.pop(0)
        if isinstance(ending, BaseException):
            raise ending
        return ending

    from sweeper.retention import repair as retention_repair

    monkeypatch.setattr(retention_repair, "run", run_repair)
    for n in range(3):
        pipeline.repair_stage(cfg, store, "plan", f"retention-{n}", execute=True)
    with pytest.raises(KeyboardInterrupt):
        pipeline.repair_stage(cfg, store, "plan", "retention-3", execute=True)
    with pytest.raises(pipeline.StageRefused):
        pipeline.repair_stage(cfg, store, "plan", "retention-4", execute=True)
    found = runs.rows(store, stage="retention_repair")
    assert [(r["run_id"], r["status"]) for r in found] == [
        ("retention-0", runs.SUCCEEDED), ("retention-1", runs.PARTIAL), ("retention-2", runs.REFUSED),
        ("retention-3", runs.INTERRUPTED), ("retention-4", runs.REFUSED)]
    assert RepairCounts.from_row(found[1]["counts"]) == RepairCounts(deleted=1, failed=1, execute=1)
    assert found[2]["message"] == "stopped: HTTP 401 from the broker" and "max_plan_age_hours" in found[4]["message"]
