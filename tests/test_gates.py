"""Data-quality gates: each bad snapshot shape stops the run with a readable reason."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from harness.sandbox.entities import ml_custom
from harness.sandbox.model import SandboxCluster, SandboxSpec, build_cluster
from harness.sandbox.seed import ledger_znode_data, seed_zookeeper
from sweeper import runs
from sweeper.codecs.layout import LedgerLayout, layout_znode, ledger_path
from sweeper.config import GatesConfig
from sweeper.errors import StageRefused
from sweeper.pipeline import reconcile_stage, snapshot_stage
from sweeper.reconcile.errors import GateFailed
from sweeper.reconcile.gates import DRIVER_ROWS_FALLBACK, baseline, driver_row_limit, memory_available, run_gates
from sweeper.table_schemas import BK_LEDGERS
from sweeper.tables import open_table_store
from tests.support.config import ZkTarget
from tests.support.gates import gates_on_both_engines
from tests.support.peers import seed_peer
from tests.support.seeded import SeededSnapshotMaker, sandbox_config


def test_good_snapshot_passes_and_a_sharp_drop_fails(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, live_broker: str
) -> None:
    _, cfg, store, first = seeded_snapshot(SandboxSpec(seed=8, topics=20))
    good = gates_on_both_engines(store, first, GatesConfig())
    assert good.passed, good.failures
    assert good.checked > 10

    # Most of the ledger tree disappears from view (a wrong chroot half-migrated, say): empty, refused whatever the
    # baseline (test_two_bad_snapshots_in_a_row_are_both_refused weighs a shrink against the last good run).
    zk.delete("/ledgers/00", recursive=True)
    zk.create("/ledgers/00/0000/L0001", b"BookieMetadataFormatVersion\t3\n\x00", makepath=True)
    second = snapshot_stage(spark, cfg, store)
    bad = gates_on_both_engines(store, second.run_id, GatesConfig(max_drop_fraction=0.5))
    assert not bad.passed
    assert any("bk_ledgers" in f and "row_count" in f for f in bad.failures), bad.failures
    assert "row_count" in str(GateFailed(bad))


def test_two_bad_snapshots_in_a_row_are_both_refused(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, live_broker: str
) -> None:
    """Issue 34 (3): the shrink gate's baseline is the last run whose gates passed, not the last snapshot. A bad
    snapshot the gates refused, or one reconciled with --skip-gates (an audit), is no baseline: the next bad
    snapshot, compared with it, would pass."""
    # The missing-reference gate off: the audit below must be able to reconcile the shrunken snapshot.
    cluster, cfg, store, good = seeded_snapshot(SandboxSpec(seed=8, topics=20), safety={"max_orphan_fraction": 1.0},
                                                gates={"max_missing_reference_fraction": 1.0})
    reconciled = reconcile_stage(spark, cfg, store, good)
    assert runs.gates_passed(runs.rows(store, run_id=good, stage="reconcile")[-1])
    # The gates' time is the run's to see, apart from the anti-joins' (a small snapshot: on the driver).
    assert reconciled.counts.gates_ms > 0 and reconciled.counts.gates_on_driver == 1
    recorded = runs.rows(store, run_id=good, stage="reconcile")[-1]["counts"]
    assert recorded["gate.ms"] == reconciled.counts.gates_ms and recorded["gate.on_driver"] == 1

    # Seven in ten ledgers vanish from view (not all: an empty snapshot fails whatever the baseline).
    for ledger_id in cluster.ledgers:
        path = ledger_path("/ledgers", ledger_id, cluster.spec.layout)
        if ledger_id % 10 < 7 and zk.exists(path):
            zk.delete(path)
    first_bad = snapshot_stage(spark, cfg, store).run_id
    with pytest.raises(StageRefused, match="row_count"):
        reconcile_stage(spark, cfg, store, first_bad)
    assert runs.rows(store, run_id=first_bad, stage="reconcile")[-1]["status"] == runs.REFUSED

    # The same bad state again: compared with the refused snapshot it would be no drop at all.
    second_bad = snapshot_stage(spark, cfg, store).run_id
    gate = gates_on_both_engines(store, second_bad, cfg.gates)
    assert any("bk_ledgers" in f and "row_count" in f for f in gate.failures), gate.failures
    assert gate.baseline == good, gate.baseline
    with pytest.raises(StageRefused, match="row_count"):
        reconcile_stage(spark, cfg, store, second_bad)

    # An audit of the bad snapshot (--skip-gates) succeeds, and is no baseline either.
    audited = reconcile_stage(spark, cfg, store, snapshot_stage(spark, cfg, store).run_id, check_gates=False)
    assert not runs.gates_passed(runs.rows(store, run_id=audited.run_id, stage="reconcile")[-1])
    third_bad = snapshot_stage(spark, cfg, store).run_id
    gate = gates_on_both_engines(store, third_bad, cfg.gates)
    assert any("bk_ledgers" in f and "row_count" in f for f in gate.failures), gate.failures
    assert gate.baseline == good, gate.baseline


def _row(run_id: str, stage: str, status: str, minute: int, counts: dict[str, int] | None = None) -> dict[str, Any]:
    return {"run_id": run_id, "stage": stage, "status": status, "counts": counts or {},
            "started_at": datetime(2026, 11, 27, 1, minute, tzinfo=UTC)}


def test_the_gates_engine_is_sized_by_the_memory_the_driver_can_get(tmp_path: Path) -> None:
    gib = 2**30
    assert driver_row_limit(250_000, 64 * gib) == 250_000  # a number is the operator's: kept as set
    assert driver_row_limit(0, 64 * gib) == 0
    assert driver_row_limit("auto", 24 * gib) > 2_500_000  # a million ledgers' gated rows, on this machine kind
    assert 500_000 < driver_row_limit("auto", 1 * gib) < 1_000_000  # spark-submit's default 1 GiB driver
    assert driver_row_limit("auto", 0) == 0 and driver_row_limit("auto", None) == DRIVER_ROWS_FALLBACK
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    cgroup.mkdir()
    assert memory_available(str(proc), str(cgroup)) is None  # nothing to read: the fallback decides
    (proc / "meminfo").write_text("MemTotal:       24000000 kB\nMemAvailable:   12000000 kB\n")
    assert memory_available(str(proc), str(cgroup)) == 12_000_000 * 1024
    (cgroup / "memory.max").write_text("max\n")  # cgroup v2 without a limit
    (cgroup / "memory.current").write_text("5000000000\n")
    assert memory_available(str(proc), str(cgroup)) == 12_000_000 * 1024
    (cgroup / "memory.max").write_text(f"{2 * gib}\n")  # a driver container of 2 GiB, 1.5 GiB of it in use
    (cgroup / "memory.current").write_text(f"{gib + gib // 2}\n")
    assert memory_available(str(proc), str(cgroup)) == gib // 2


def test_the_baseline_is_the_newest_earlier_run_whose_gates_passed() -> None:
    snapshots = [_row(r, "snapshot", runs.SUCCEEDED, i) for i, r in enumerate("abcdef")]
    gated = {runs.GATES_PASSED: 1}
    reconciles = [_row("a", "reconcile", runs.SUCCEEDED, 10, gated),
                  _row("b", "reconcile", runs.SUCCEEDED, 11, {runs.GATES_PASSED: 0}),  # --skip-gates
                  _row("c", "reconcile", runs.SUCCEEDED, 12),  # recorded before gates were recorded
                  _row("d", "reconcile", runs.REFUSED, 13, gated),  # a refusal is never a pass
                  _row("f", "reconcile", runs.SUCCEEDED, 14, gated)]  # later than e: not e's baseline
    assert baseline(snapshots, reconciles, "e") == snapshots[0]
    assert baseline(snapshots, reconciles, "a") is None
    assert baseline(snapshots, reconciles, "x") is None
    assert baseline(snapshots, [*reconciles, _row("d", "reconcile", runs.SUCCEEDED, 15, gated)], "e") == snapshots[3]


def test_empty_snapshot_fails(zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    zk.create("/ledgers/LAYOUT", layout_znode(LedgerLayout.HIERARCHICAL), makepath=True)
    zk.ensure_path("/managed-ledgers")
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables")
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    result = snapshot_stage(spark, cfg, store)
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
    run = snapshot_stage(spark, cfg, store)
    gate = gates_on_both_engines(store, run.run_id, GatesConfig())
    assert [f for f in gate.failures if "/loadbalance/brokers" in f and "--allow-no-brokers" in f], gate.failures
    assert run_gates(store, run.run_id, GatesConfig(require_live_brokers=False)).passed

    # Only data ledgers measure the lag: a cursor's ledger or another application's ledger three hours newer than
    # any managed-ledger change says nothing about where the brokers write (on both engines of the gates).
    newest = max((x for x in cluster.ledgers.values() if x.custom.get("component") == b"managed-ledger"
                  and "pulsar/cursor" not in x.custom), key=lambda x: x.ledger_id)
    later = cluster.spec.now_ms + 3 * 3_600_000
    for offset, custom in ((1000, {**newest.custom, "pulsar/cursor": b"sub"}), (1001, {"application": b"other"})):
        other = type(newest)(**{**newest.__dict__, "ledger_id": newest.ledger_id + offset, "ctime_ms": later,
                                "custom": custom})
        zk.create(ledger_path("/ledgers", other.ledger_id, cluster.spec.layout), ledger_znode_data(other),
                  makepath=True)
    not_data = snapshot_stage(spark, cfg, store)
    gate = gates_on_both_engines(store, not_data.run_id, GatesConfig(require_live_brokers=False))
    assert gate.passed, gate.failures

    # A data ledger three hours newer than any managed-ledger change: the brokers write elsewhere now.
    newer = type(newest)(**{**newest.__dict__, "ledger_id": newest.ledger_id + 1002, "ctime_ms": later})
    zk.create(ledger_path("/ledgers", newer.ledger_id, cluster.spec.layout), ledger_znode_data(newer),
              makepath=True)
    lagging = snapshot_stage(spark, cfg, store)
    gate = gates_on_both_engines(store, lagging.run_id, GatesConfig(require_live_brokers=False))
    assert [f for f in gate.failures if "max_metadata_lag_minutes" in f], gate.failures


HOUR_MS = 3_600_000


def _newest_data_ledger(cluster: SandboxCluster) -> Any:
    return max((x for x in cluster.ledgers.values() if x.custom.get("component") == b"managed-ledger"
                and "pulsar/cursor" not in x.custom), key=lambda x: x.ledger_id)


def _add_ledger(zk: KazooClient, cluster: SandboxCluster, ledger_id: int, ctime_ms: int,
                custom: dict[str, bytes]) -> str:
    like = _newest_data_ledger(cluster)
    ledger = type(like)(**{**like.__dict__, "ledger_id": ledger_id, "ctime_ms": ctime_ms, "custom": custom})
    path = ledger_path("/ledgers", ledger_id, cluster.spec.layout)
    zk.create(path, ledger_znode_data(ledger), makepath=True)
    return path


def test_a_busy_peers_fresh_ledgers_are_not_this_clusters_metadata_lag(
    zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, live_broker: str
) -> None:
    """Issue 34 (5): a quiet cluster sharing its bookies with a busy peer (`[safety] peer_metadata`) is not stale.
    BookKeeper's ledger metadata names no cluster, so the lag gate tells this cluster's data ledgers from the peer's
    by Pulsar's custom metadata (`pulsar/managed-ledger`, LedgerMetadataUtils) and the peer's snapshot: a ledger the
    peer lists, one of a managed ledger only the peer has, one of a namespace this cluster does not know. A fresh
    ledger of this cluster's, or of an owner nobody can name, still shows a stale store (on both engines)."""
    cluster = build_cluster(SandboxSpec(seed=4, topics=10))
    seed_zookeeper(zk, cluster)
    ours = _newest_data_ledger(cluster).custom["pulsar/managed-ledger"].decode()  # tenant/ns/persistent/topic
    namespace = ours.rsplit("/persistent/", 1)[0]
    later = cluster.spec.now_ms + 3 * HOUR_MS  # three hours after every change of this cluster's metadata
    first = max(cluster.ledgers) + 1000
    peer_topic, peer_namespace = f"{namespace}/persistent/peer-topic", "peer-tenant/peer-ns"
    peer_lists = {
        ours: [first],  # the peer's topic of the same name (every cluster has public/default)
        peer_topic: [first + 1],  # a topic only the peer has, in a namespace both have
        f"{peer_namespace}/persistent/busy": [first + 2],
    }
    seed_peer(zk, peer_lists)
    for ml, ids in peer_lists.items():
        for ledger_id in ids:
            _add_ledger(zk, cluster, ledger_id, later, ml_custom(ml))
    _add_ledger(zk, cluster, first + 3, later, ml_custom(peer_topic))  # rolled over, not yet in the peer's list
    _add_ledger(zk, cluster, first + 4, later, ml_custom(f"{peer_namespace}/persistent/deleted"))  # listed nowhere
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables",
                         safety={"bookkeeper_dedicated": False, "peer_metadata": [f"{zk_target.hosts}/peer"]})
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    quiet = snapshot_stage(spark, cfg, store).run_id
    gate = gates_on_both_engines(store, quiet, cfg.gates)
    assert gate.passed, gate.failures
    # On a BookKeeper declared dedicated, every ledger on it is this cluster's: then they are its lag.
    dedicated = run_gates(store, quiet, cfg.gates, dedicated=True)
    assert [f for f in dedicated.failures if "max_metadata_lag_minutes" in f], dedicated.failures

    # A really stale store: a fresh ledger of one of this cluster's topics its metadata does not list; of a topic
    # in its namespace the metadata does not have; of an owner nobody can name. Each alone is refused.
    for custom in (ml_custom(ours), ml_custom(f"{namespace}/persistent/created-since"),
                   {"application": b"pulsar", "component": b"managed-ledger"}):
        path = _add_ledger(zk, cluster, first + 10, later, custom)
        stale = snapshot_stage(spark, cfg, store).run_id
        gate = gates_on_both_engines(store, stale, cfg.gates)
        assert [f for f in gate.failures if "max_metadata_lag_minutes" in f], (custom, gate.failures)
        zk.delete(path)
