"""Issue 45, "no gap in the record": a driver killed between closing its journal and writing its `runs` row leaves no
`runs` row; the next run settles it as it settles an unclosed journal (delete, retention repair and emit alike).

The kill is stood for by calling each stage's body as the stage wrapper does (so its journal says a runs row follows
its close) without the wrapper that would write that row: exactly what a kill in between leaves. The next attempt,
through the wrapper, then records the first as `interrupted`, once, and writes its own status; a third attempt adds
nothing more. Without the `journal.RUNS_ROW_FOLLOWS` check these attempts have no status at all: the tests fail.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec
from sweeper import runs
from sweeper.delete.stage import run_delete
from sweeper.emit.stage import EmitSettings
from sweeper.emit.stage import run as run_emit_stage
from sweeper.pipeline import delete_stage, emit_stage, repair_stage
from sweeper.retention.repair import run as run_repair_stage
from sweeper.retention.repair_plan import RepairSettings
from sweeper.runs import record as record_run
from sweeper.table_schemas import RETENTION_DEBT
from sweeper.tables import open_table_store
from tests.support.admin_server import AdminServer, pulsar_like_answers
from tests.support.broker import Broker
from tests.support.config import ZkTarget
from tests.support.gates import record_gated_reconcile
from tests.support.seeded import planned_delete, sandbox_config
from tests.test_retention_repair_killed import _plan_row, _seed


def _statuses(store: object, run_id: str, stage: str) -> list[str]:
    return [r["status"] for r in runs.rows(store, run_id, stage)]  # type: ignore[arg-type]


def test_a_delete_killed_before_its_runs_row_is_recorded_by_the_next(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    _, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, SandboxSpec(seed=9, topics=12))
    first = run_delete(spark, cfg, store, run_id, execute=True, recorded_in_runs=True)  # then "killed"
    assert first.counts.deleted > 0 and _statuses(store, run_id, "delete") == []
    second = delete_stage(spark, cfg, store, run_id, execute=True)
    assert second.counts.interrupted_attempts == 1
    assert _statuses(store, run_id, "delete") == ["interrupted", "succeeded"]
    [gap] = [r for r in runs.rows(store, run_id, "delete") if r["status"] == "interrupted"]
    assert gap["counts"]["deleted"] == first.counts.deleted and "stopped before recording its end" in gap["message"]
    delete_stage(spark, cfg, store, run_id, execute=True)
    assert _statuses(store, run_id, "delete") == ["interrupted", "succeeded", "succeeded"]  # recorded once


def test_a_repair_killed_before_its_runs_row_is_recorded_by_the_next(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    _seed(zk, "a", None)
    admin = AdminServer(pulsar_like_answers(zk))
    try:
        cfg = sandbox_config(zk_target.hosts, tmp_path / "tables",
                             system_topic={"admin_url": admin.url, "auth_token_env": "SWEEPER_TEST_TOKEN"},
                             retention={"actions_per_second": 1000.0})
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        store.append_rows("retention_debt", [_plan_row("a", None, 100)], RETENTION_DEBT)
        record_gated_reconcile(store, "plan-1", {}, cfg)
        record_run(store, "plan-1", "retention_debt", "succeeded", datetime.now(UTC), {}, cfg)
        import os

        os.environ["SWEEPER_TEST_TOKEN"] = "t"
        settings = RepairSettings.from_config(cfg, "plan-1", execute=True, recorded_in_runs=True)
        run_repair_stage(None, store, "retention-1", settings)  # then "killed": its journal closed, no runs row
        assert _statuses(store, "retention-1", "retention_repair") == []
        repair_stage(cfg, store, "plan-1", "retention-2", execute=True)
        assert _statuses(store, "retention-1", "retention_repair") == ["interrupted"]
        assert _statuses(store, "retention-2", "retention_repair") == ["succeeded"]
        repair_stage(cfg, store, "plan-1", "retention-3", execute=True)
        assert _statuses(store, "retention-1", "retention_repair") == ["interrupted"]  # once
    finally:
        admin.close()


def test_an_emit_killed_before_its_runs_row_is_recorded_by_the_next(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    _, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, SandboxSpec(seed=10, topics=8),
                                           emit=False)
    first = run_emit_stage(spark, store, run_id, EmitSettings.from_config(cfg, recorded_in_runs=True))
    assert first.counts.published > 0 and _statuses(store, run_id, "emit") == []
    second = emit_stage(spark, cfg, store, run_id)
    assert second.counts.published == 0 and second.counts.previously_emitted == first.counts.published
    assert _statuses(store, run_id, "emit") == ["interrupted", "succeeded"]
    emit_stage(spark, cfg, store, run_id)
    assert _statuses(store, run_id, "emit") == ["interrupted", "succeeded", "succeeded"]
