"""Issue 26: one BookKeeper written by several Pulsar clusters, and a BookKeeper that is not this Pulsar's at all.

A peer cluster's metadata lives in its own chroot of the same real ZooKeeper, with a managed ledger of the
same name as one of ours (every cluster has `public/default`): without `[safety] peer_metadata` nothing may
be a candidate; with it, the peer's references count like ours and its ledgers are never candidates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import OrphanKind, SandboxCluster, SandboxSpec, Status, build_cluster
from harness.sandbox.seed import seed_zookeeper
from sweeper.codecs.layout import ledger_path
from sweeper.config import SweeperConfig
from sweeper.delete.stage import run_delete
from sweeper.pipeline import snapshot_stage
from sweeper.reconcile.errors import ReconcileRefused
from sweeper.reconcile.stage import CANDIDATE, OTHER_CLUSTER, SafetySettings, run_reconcile
from sweeper.tables import TableStore, open_table_store
from sweeper.zk import client as zkutil
from tests.support.config import ZkTarget
from tests.support.peers import seed_peer
from tests.support.seeded import sandbox_config

SPEC = SandboxSpec(seed=4, topics=12)


def _owner(cluster: SandboxCluster, ledger_id: int) -> str:
    return cluster.ledgers[ledger_id].custom["pulsar/managed-ledger"].decode()


def _owner_or_none(cluster: SandboxCluster, ledger_id: int) -> str | None:
    value = cluster.ledgers[ledger_id].custom.get("pulsar/managed-ledger")
    return value.decode() if value else None


def _orphans_of(cluster: SandboxCluster, kind: OrphanKind, tenant: str) -> list[int]:
    """Data-ledger orphans (no cursor) of one kind and tenant."""
    return sorted(i for i, x in cluster.ledgers.items() if x.status is Status.ORPHAN and x.orphan_kind is kind
                  and "pulsar/cursor" not in x.custom
                  and (_owner_or_none(cluster, i) or "").startswith(f"{tenant}/"))


def _config(target: ZkTarget, tmp_path: Path, **safety: object) -> SweeperConfig:
    return sandbox_config(target.hosts, tmp_path / "tables", safety={"max_orphan_fraction": 1.0, **safety})


def _orphans(store: TableStore, run_id: str) -> dict[int, dict[str, object]]:
    rows = store.read("orphans").where(f"run_id = '{run_id}' and object_type = 'ledger'").collect()
    return {r["ledger_id"]: r.asDict() for r in rows}


def test_a_peer_on_the_same_bookies_is_read_and_its_ledgers_never_candidates(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    cluster = build_cluster(SPEC)
    seed_zookeeper(zk, cluster)
    # The peer lists, under the same name as our topic, a ledger our topic dropped; and it has a topic we deleted.
    dropped = _orphans_of(cluster, OrphanKind.DROPPED_FROM_LIST, "tenant-0")[0]
    deleted = _orphans_of(cluster, OrphanKind.TOPIC_DELETED, "tenant-1")[0]
    peers_topic = {i for i in cluster.ledgers if _owner_or_none(cluster, i) == _owner(cluster, deleted)}
    # (A ledger list Pulsar wrote is never empty: an empty znode is a topic mid-creation, quarantined.)
    seed_peer(zk, {_owner(cluster, dropped): [dropped], _owner(cluster, deleted): [900_000]})
    peer = f"{zk_target.hosts}/peer"
    expected = {i for i, x in cluster.ledgers.items() if x.status is Status.ORPHAN
                and x.orphan_kind is not OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT}  # offload is off here
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")

    # Shared, and nobody said who else writes here: nothing is a candidate, the run completes.
    shared = _config(zk_target, tmp_path, bookkeeper_dedicated=False)
    run_id = snapshot_stage(spark, shared, store).run_id
    result = run_reconcile(spark, store, run_id, SafetySettings.from_config(shared))
    rows = _orphans(store, run_id)
    assert result.counts.candidate == 0
    assert {rows[i]["reason"] for i in expected} <= {"shared_bookkeeper_unverified", "namespace_unknown"}
    assert "peer_metadata" in result.sharing

    # Every peer read: the union of references decides; the peer's ledger and its topic's are never ours.
    with_peer = _config(zk_target, tmp_path, bookkeeper_dedicated=False, peer_metadata=[peer])
    run_id = snapshot_stage(spark, with_peer, store).run_id
    result = run_reconcile(spark, store, run_id, SafetySettings.from_config(with_peer))
    rows = _orphans(store, run_id)
    candidates = {i for i, r in rows.items() if r["status"] == CANDIDATE}
    assert dropped not in rows  # referenced by the peer: in use
    assert {(rows[i]["status"], rows[i]["reason"]) for i in peers_topic} == {(OTHER_CLUSTER, "owned_by_peer_cluster")}
    assert candidates == expected - {dropped} - peers_topic
    assert result.counts.peer_clusters_read == 1

    # A peer whose store shows no live broker may be a stale copy: unread, so nothing is a candidate again.
    zk.delete("/peer/loadbalance/brokers/peer-broker:8080")
    run_id = snapshot_stage(spark, with_peer, store).run_id
    result = run_reconcile(spark, store, run_id, SafetySettings.from_config(with_peer))
    assert result.counts.candidate == 0
    assert peer in result.sharing and "no live broker" in result.sharing


def test_delete_from_json_refuses_a_denied_namespace_and_an_unverified_or_peer_ledger(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    cluster = build_cluster(SPEC)
    seed_zookeeper(zk, cluster)
    zk.create("/loadbalance/brokers/127.0.0.1:8080", b"{}", ephemeral=True, makepath=True)
    denied = _orphans_of(cluster, OrphanKind.TOPIC_DELETED, "tenant-1")[0]
    ours = _orphans_of(cluster, OrphanKind.TOPIC_DELETED, "tenant-0")[0]
    peers = _orphans_of(cluster, OrphanKind.DROPPED_FROM_LIST, "tenant-0")[0]
    seed_peer(zk, {_owner(cluster, peers): [peers]})
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    snapshot_stage(spark, _config(zk_target, tmp_path), store)  # shadow topics known, as the delete requires
    listing = tmp_path / "ledgers.json"
    listing.write_text(json.dumps([denied, ours, peers]))

    def delete(cfg: SweeperConfig) -> dict[int, tuple[str, str]]:
        result = run_delete(spark, cfg, store, "operator", execute=True, from_json=listing)
        return {r.ledger_id: (r.outcome, r.detail) for r in result.results if r.ledger_id is not None}

    def present(ledger_id: int) -> bool:
        return zk.exists(ledger_path(SPEC.ledgers_root, ledger_id, SPEC.layout)) is not None

    # A shared BookKeeper nobody vouched for: every record is refused, nothing deleted.
    got = delete(_config(zk_target, tmp_path, bookkeeper_dedicated=False))
    assert {outcome for outcome, _ in got.values()} == {"refused"}
    assert all(detail.startswith("shared_bookkeeper_unverified") for _, detail in got.values())
    # Dedicated, but the operator denies tenant-1 today: that record is refused by scope, whoever wrote it.
    cfg = _config(zk_target, tmp_path, deny="tenant-1")
    got = delete(cfg.replace(safety={"bookkeeper_dedicated": False, "peer_metadata": [f"{zk_target.hosts}/peer"]}))
    assert got[denied][0] == "refused" and got[denied][1].startswith("out_of_scope"), got[denied]
    assert got[peers][0] == "in_use" and "peer cluster" in got[peers][1], got[peers]
    assert got[ours][0] == "deleted", got[ours]
    assert present(denied) and present(peers) and not present(ours)


def test_a_wrong_chroot_for_bookkeeper_is_refused_on_a_first_run(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    # Ours in the chroot; another cluster's BookKeeper (and metadata) one level down, as a wrong chroot would name.
    seed_zookeeper(zk, build_cluster(SPEC))
    zk.ensure_path("/other")
    other = zkutil.connect(f"{zk_target.hosts}/other")
    try:
        seed_zookeeper(other, build_cluster(SandboxSpec(seed=3, topics=12)))
    finally:
        zkutil.close(other)
    cfg = _config(zk_target, tmp_path).replace(bookkeeper={"zookeeper": f"{zk_target.hosts}/other"},
                                               pulsar={"zookeeper": zk_target.hosts})
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    run_id = snapshot_stage(spark, cfg, store).run_id
    with pytest.raises(ReconcileRefused, match="max_missing_reference_fraction") as refused:
        run_reconcile(spark, store, run_id, SafetySettings.from_config(cfg))
    assert "/ledgers" in str(refused.value)
    assert not store.exists("orphans") or not store.read("orphans").where(f"run_id = '{run_id}'").count()
