"""The runs ledger (issue 22): one module writes and reads `runs`; a real Delta table through delta-rs, no Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sweeper import runs
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
    from sweeper.emit import EmitFailed
    from sweeper.pipeline import StageRefused, _stage

    store, cfg = _store(tmp_path), SweeperConfig()

    def send() -> None:
        raise EmitFailed("producer p-1: 3 sends failed")

    def escalate(exc: Exception) -> Exception | None:
        return StageRefused(f"emit failed: {exc}") if isinstance(exc, EmitFailed) else None

    with pytest.raises(StageRefused):
        _stage(store, cfg, "r1", "emit", send, lambda result: None, (), escalate)  # type: ignore[arg-type]
    with pytest.raises(EmitFailed):
        _stage(store, cfg, "r2", "emit", send, lambda result: None, ())  # type: ignore[arg-type]
    assert [(r["run_id"], r["status"]) for r in runs.rows(store, stage="emit")] == [
        ("r1", runs.REFUSED), ("r2", runs.FAILED)]
    assert runs.rows(store, run_id="r1")[0]["message"] == "emit failed: producer p-1: 3 sends failed"


def test_a_spark_job_cancelled_by_an_interrupt_is_the_interrupt(tmp_path: Path) -> None:
    """PySpark's SIGINT handler raises KeyboardInterrupt and cancels the running jobs; the collect that waited on
    one then fails with a py4j error raised while handling the interrupt. That is `interrupted` (exit 130), never
    `failed` with a Java trace (the kill test's SIGINT landed there once)."""
    from sweeper.errors import caused_by_interrupt
    from sweeper.pipeline import _stage

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
        _stage(store, cfg, "r1", "reconcile", cancelled, lambda result: None, ())  # type: ignore[arg-type]
    assert [(r["run_id"], r["status"]) for r in runs.rows(store, stage="reconcile")] == [("r1", runs.INTERRUPTED)]
