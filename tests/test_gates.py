"""Data-quality gates: each bad snapshot shape stops the run with a readable reason."""

from __future__ import annotations

from pathlib import Path

from kazoo.client import KazooClient
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_zookeeper
from sweeper.config import GatesConfig
from sweeper.gates import GateFailed, run_gates
from sweeper.layout import LedgerLayout, layout_znode
from sweeper.snapshot import run_snapshot
from sweeper.table_schemas import BK_LEDGERS
from sweeper.tables import open_table_store
from tests.support.config import ZkTarget
from tests.support.gates import gates_on_both_engines
from tests.support.seeded import SeededSnapshotMaker, sandbox_config


def test_good_snapshot_passes_and_a_sharp_drop_fails(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, live_broker: str
) -> None:
    _, cfg, store, first = seeded_snapshot(SandboxSpec(seed=8, topics=20))
    good = gates_on_both_engines(store, first, GatesConfig())
    assert good.passed, good.failures
    assert good.checked > 10

    # Most of the ledger tree disappears from view (a wrong chroot half-migrated, say).
    zk.delete("/ledgers/00", recursive=True)
    zk.create("/ledgers/00/0000/L0001", b"BookieMetadataFormatVersion\t3\n\x00", makepath=True)
    second = run_snapshot(spark, cfg, store)
    bad = gates_on_both_engines(store, second.run_id, GatesConfig(max_drop_fraction=0.5))
    assert not bad.passed
    assert any("bk_ledgers" in f and "row_count" in f for f in bad.failures), bad.failures
    assert "row_count" in str(GateFailed(bad))


def test_empty_snapshot_fails(zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    zk.create("/ledgers/LAYOUT", layout_znode(LedgerLayout.HIERARCHICAL), makepath=True)
    zk.ensure_path("/managed-ledgers")
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables")
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    result = run_snapshot(spark, cfg, store)
    gate = gates_on_both_engines(store, result.run_id, GatesConfig())
    assert any("bk_ledgers" in f for f in gate.failures), gate.failures
    assert run_gates(store, result.run_id, GatesConfig(allow_empty=True, require_live_brokers=False)).passed


def test_mixed_or_tampered_snapshot_fails(
    seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    _, _, store, run_id = seeded_snapshot(SandboxSpec(seed=4, topics=10))
    # Rows of the run appended again by mistake: duplicates, and counts that no longer match.
    again = store.read("bk_ledgers").where(F.col("run_id") == run_id).limit(3)
    store.append("bk_ledgers", again, BK_LEDGERS)
    gate = gates_on_both_engines(store, run_id, GatesConfig())
    assert any("partial or mixed" in f for f in gate.failures), gate.failures
    assert any("unique" in f for f in gate.failures), gate.failures


def test_metadata_with_no_live_broker_or_lagging_the_ledgers_is_refused(
    zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path
) -> None:
    # Issue 11 (12): a stale copy of the metadata (or one Pulsar moved away from) makes every newer ledger
    # look orphaned. Brokers register with live sessions; they record each new ledger at once.
    cluster = build_cluster(SandboxSpec(seed=8, topics=20))
    seed_zookeeper(zk, cluster)
    zk.create("/loadbalance/brokers/10.0.0.9:8080", b"{}", makepath=True)  # left behind: no session holds it
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables")
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    run = run_snapshot(spark, cfg, store)
    gate = gates_on_both_engines(store, run.run_id, GatesConfig())
    assert [f for f in gate.failures if "/loadbalance/brokers" in f and "--allow-no-brokers" in f], gate.failures
    assert run_gates(store, run.run_id, GatesConfig(require_live_brokers=False)).passed

    # Only data ledgers measure the lag: a cursor's ledger or another application's ledger three hours newer than
    # any managed-ledger change says nothing about where the brokers write (on both engines of the gates).
    from harness.sandbox.seed import ledger_znode_data
    from sweeper.layout import ledger_path

    newest = max((x for x in cluster.ledgers.values() if x.custom.get("component") == b"managed-ledger"
                  and "pulsar/cursor" not in x.custom), key=lambda x: x.ledger_id)
    later = cluster.spec.now_ms + 3 * 3_600_000
    for offset, custom in ((1000, {**newest.custom, "pulsar/cursor": b"sub"}), (1001, {"application": b"other"})):
        other = type(newest)(**{**newest.__dict__, "ledger_id": newest.ledger_id + offset, "ctime_ms": later,
                                "custom": custom})
        zk.create(ledger_path("/ledgers", other.ledger_id, cluster.spec.layout), ledger_znode_data(other),
                  makepath=True)
    not_data = run_snapshot(spark, cfg, store)
    gate = gates_on_both_engines(store, not_data.run_id, GatesConfig(require_live_brokers=False))
    assert gate.passed, gate.failures

    # A data ledger three hours newer than any managed-ledger change: the brokers write elsewhere now.
    newer = type(newest)(**{**newest.__dict__, "ledger_id": newest.ledger_id + 1002, "ctime_ms": later})
    zk.create(ledger_path("/ledgers", newer.ledger_id, cluster.spec.layout), ledger_znode_data(newer),
              makepath=True)
    lagging = run_snapshot(spark, cfg, store)
    gate = gates_on_both_engines(store, lagging.run_id, GatesConfig(require_live_brokers=False))
    assert [f for f in gate.failures if "max_metadata_lag_minutes" in f], gate.failures
