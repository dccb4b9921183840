"""Retention debt against the sandbox's ground truth, at several sizes: expired-but-unloaded topics with
the right ledgers and bytes, idle cursors with what each alone pins, bad or missing policies `unknown`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from sweeper.reconcile import SafetySettings, run_reconcile
from sweeper.retention import DAY_MS
from sweeper.retention_debt import RetentionDebtRefused, RetentionSettings, run_retention_debt
from sweeper.safety import CircuitBreaker, Scope
from sweeper.sandbox.model import SandboxCluster, SandboxSpec, build_cluster
from sweeper.sandbox.retention_scenarios import SIZE_NS, TIME_NS
from sweeper.sandbox.seed import seed_zookeeper
from sweeper.snapshot import run_snapshot
from sweeper.tables import TableStore, open_table_store
from sweeper.zkserver import ServerClock
from tests.conftest import BASE_CONFIG, ZkTarget


def _snapshot(zk: KazooClient, target: ZkTarget, spark: SparkSession, tmp_path: Path,
              spec: SandboxSpec) -> tuple[SandboxCluster, TableStore, str]:
    cluster = build_cluster(spec)
    seed_zookeeper(zk, cluster)
    cfg = BASE_CONFIG.replace(bookkeeper={"zookeeper": target.hosts}, offload={"enabled": False},
                              tables={"root": str(tmp_path / "tables"), "engine": "delta-rs"})
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    return cluster, store, run_snapshot(spark, cfg, store).run_id


def _debt(store: TableStore, run_id: str) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], dict[str, Any]]]:
    rows = [r.asDict() for r in store.read("retention_debt").where(f"run_id = '{run_id}'").collect()]
    topics = {r["managed_ledger"]: r for r in rows if r["kind"] == "topic"}
    cursors = {(r["managed_ledger"], r["cursor"]): r for r in rows if r["kind"] == "cursor"}
    assert len(topics) + len(cursors) == len(rows)
    return topics, cursors


@pytest.mark.parametrize(("seed", "topics"), [(11, 30), (23, 250)])
def test_retention_debt_is_the_sandboxs_ground_truth(
        seed: int, topics: int, zk: KazooClient, zk_target: ZkTarget, zk_clock: ServerClock, spark: SparkSession,
        tmp_path: Path) -> None:
    cluster, store, run_id = _snapshot(zk, zk_target, spark, tmp_path, SandboxSpec(seed=seed, topics=topics))
    run_reconcile(spark, store, run_id, SafetySettings(breaker=CircuitBreaker(1.0)))
    settings = RetentionSettings(delete_after_ms=30 * DAY_MS)
    result = run_retention_debt(spark, store, run_id, settings)
    found, cursors = _debt(store, run_id)
    expected = {e.managed_ledger: e for e in cluster.retention}
    assert len(expected) >= 13 * max(1, topics // 100) - 2 * (max(1, topics // 100) - 1)
    # Recall and precision: every scenario that owes something (or cannot be judged) has its row, and no
    # regular topic (kept forever) or young one has any.
    assert set(found) == {ml for ml, e in expected.items() if e.status != "none" or e.cursors}
    for ml, row in found.items():
        e = expected[ml]
        assert (row["status"], row["reason"]) == (e.status, e.reason), (e.scenario, row["detail"])
        assert row["ledger_ids"] == e.trimmable, e.scenario
        assert row["reclaimable_bytes"] == e.trimmable_bytes, e.scenario
        if e.status == "candidate":
            assert row["unloaded_evidence"] == "not_trimmed_since" and row["bundle_owned"] is None
        if e.status == "unknown":
            assert row["policy_source"] is None and row["reclaimable_bytes"] == 0  # never "expired"
    expected_cursors = {(ml, c.name): c for ml, e in expected.items() for c in e.cursors}
    assert set(cursors) == set(expected_cursors)
    for key, row in cursors.items():
        c = expected_cursors[key]
        assert row["idle_ms"] >= c.min_idle_ms, key
        assert row["ledger_ids"] == c.pinned and row["reclaimable_bytes"] == c.pinned_bytes, key
        assert row["position_may_lag"] is c.position_may_lag, key
        # Deletion at 30 days: the 60-day closed cursor is a candidate; the one whose cursor ledger may hold
        # four more hours of acknowledgements is not yet; system cursors and unknown topics never are.
        want = ("unknown" if expected[key[0]].status == "unknown" else "protected" if c.system
                else "candidate" if c.min_idle_ms >= 30 * DAY_MS else "idle")
        assert row["status"] == want, (key, row["detail"])
    # The report by cause adds up, per namespace.
    report = {(r["tenant"], r["namespace"]): r.asDict()
              for r in store.read("reclaimable_report").where(f"run_id = '{run_id}'").collect()}
    tenant, ns = TIME_NS.split("/")
    unloaded = sum(e.trimmable_bytes for ml, e in expected.items()
                   if ml.startswith(TIME_NS + "/") and e.reason == "expired_not_trimmed")
    assert report[(tenant, ns)]["expired_unloaded_bytes"] == unloaded
    assert report[(tenant, ns)]["idle_cursor_bytes"] >= sum(
        c.pinned_bytes for ml, e in expected.items() if ml.startswith(TIME_NS + "/") for c in e.cursors)
    orphan_bytes = sum(r["orphan_bytes"] for r in report.values())
    assert orphan_bytes == sum(r["size_bytes"] or 0 for r in store.read("orphans").where(
        f"run_id = '{run_id}' and status = 'candidate'").collect())
    assert result.counts["topic.candidate"] == sum(1 for e in expected.values() if e.status == "candidate")
    with pytest.raises(RetentionDebtRefused, match="already"):
        run_retention_debt(spark, store, run_id, settings)


def test_a_bundle_nobody_owns_has_no_topic_loaded(
        zk: KazooClient, zk_target: ZkTarget, zk_clock: ServerClock, spark: SparkSession, tmp_path: Path) -> None:
    """With ownership readable (a live broker owns bundles), a topic whose bundle nobody owns is unloaded even
    when its list changed a minute ago; in an owned bundle only the clocks can tell."""
    size_tenant, size_ns = SIZE_NS.split("/")
    zk.create(f"/namespace/{size_tenant}/{size_ns}/0x00000000_0xffffffff", b'{"nativeUrl": "pulsar://b:6650"}',
              ephemeral=True, makepath=True)
    zk.create("/namespace/tenant-0/retention-time/0x80000000_0xc0000000", b"{}", makepath=True)  # not ephemeral
    cluster, store, run_id = _snapshot(zk, zk_target, spark, tmp_path, SandboxSpec(seed=5, topics=10))
    run_retention_debt(spark, store, run_id, RetentionSettings())
    found, _ = _debt(store, run_id)
    loaded = next(e.managed_ledger for e in cluster.retention if e.scenario == "expired_loaded")
    assert found[loaded]["status"] == "candidate" and found[loaded]["unloaded_evidence"] == "bundle_not_owned"
    assert found[loaded]["bundle_owned"] is False
    over_quota = next(e.managed_ledger for e in cluster.retention if e.scenario == "over_quota")
    assert found[over_quota]["bundle_owned"] is True
    assert found[over_quota]["unloaded_evidence"] == "not_trimmed_since"


def test_repairs_outside_the_allow_list_are_out_of_scope(
        zk: KazooClient, zk_target: ZkTarget, zk_clock: ServerClock, spark: SparkSession, tmp_path: Path) -> None:
    _, store, run_id = _snapshot(zk, zk_target, spark, tmp_path, SandboxSpec(seed=5, topics=10))
    settings = RetentionSettings(delete_after_ms=DAY_MS, scope=Scope(allow=("tenant-1",)))
    run_retention_debt(spark, store, run_id, settings)
    found, cursors = _debt(store, run_id)
    statuses = {(row["tenant"], row["status"]) for row in [*found.values(), *cursors.values()]}
    assert ("tenant-0", "candidate") not in statuses and ("tenant-1", "candidate") in statuses
    assert ("tenant-0", "out_of_scope") in statuses
