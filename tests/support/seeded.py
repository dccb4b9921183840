"""A sandbox seeded into a test's ZooKeeper chroot and snapshotted into its tables: what the stage tests start
from (reconcile, retention debt, emit, delete, ...), in one place so that they all start from the same thing.

The `seeded_snapshot` fixture (tests/conftest.py) binds `seed_and_snapshot` to the test's chroot, Spark session
and tmp_path; `planned_delete` goes on through reconcile and emit for the delete stage's tests.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.s3server import S3ServerInfo
from harness.sandbox.model import OrphanKind, SandboxCluster, SandboxSpec, Status, build_cluster
from harness.sandbox.seed import seed_s3, seed_zookeeper
from sweeper.config import SweeperConfig
from sweeper.emit.stage import run_emit
from sweeper.objectstore.s3 import S3Target, s3_client
from sweeper.pipeline import reconcile_stage, snapshot_stage
from sweeper.reconcile.stage import SafetySettings, run_reconcile
from sweeper.runs import record as record_run
from sweeper.tables import TableStore, open_table_store
from sweeper.vocabulary import DAY_MS
from tests.support.broker import Broker
from tests.support.config import BASE_CONFIG
from tests.support.gates import record_gated_reconcile

# Past the 7-day grace period: moto cannot backdate the objects a test seeds, so its orphan objects are candidates
# only to a clock this far ahead.
LATER_MS = 8 * DAY_MS


class SeededSnapshot(NamedTuple):
    cluster: SandboxCluster
    cfg: SweeperConfig
    store: TableStore
    run_id: str


class SeededSnapshotMaker(Protocol):
    """The `seeded_snapshot` fixture: `seed_and_snapshot` on the test's chroot, Spark session and tables."""

    def __call__(self, sandbox: SandboxSpec | SandboxCluster, *, reseed: bool = True,
                 **sections: dict[str, Any]) -> SeededSnapshot: ...


def sandbox_config(hosts: str, tables: Path, **sections: dict[str, Any]) -> SweeperConfig:
    """BASE_CONFIG on a test's ZooKeeper and tables (delta-rs), offload off unless `sections` say otherwise.

    Each of `sections` is merged into these defaults, not put in their place: `offload={"endpoint_override": ...}`
    alone keeps the listing off."""
    merged: dict[str, dict[str, Any]] = {"bookkeeper": {"zookeeper": hosts},
                                         "tables": {"root": str(tables), "engine": "delta-rs"},
                                         "offload": {"enabled": False}}
    for name, values in sections.items():
        merged[name] = {**merged.get(name, {}), **values}
    return BASE_CONFIG.replace(**merged)


def seed_and_snapshot(zk: KazooClient, hosts: str, spark: SparkSession, tables: Path,
                      sandbox: SandboxSpec | SandboxCluster, *, reseed: bool = True,
                      **sections: dict[str, Any]) -> SeededSnapshot:
    """`sandbox` seeded into `zk`, then one snapshot of `hosts` into the tables under `tables`, configured by
    `sandbox_config(hosts, tables, **sections)`.

    `reseed=False` snapshots what is there: a test that seeded the cluster itself and changed it before the
    snapshot, or a second snapshot of the same chroot."""
    cluster = sandbox if isinstance(sandbox, SandboxCluster) else build_cluster(sandbox)
    if reseed:
        seed_zookeeper(zk, cluster)
    cfg = sandbox_config(hosts, tables, **sections)
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    return SeededSnapshot(cluster, cfg, store, snapshot_stage(spark, cfg, store).run_id)


def later() -> int:
    """Now plus LATER_MS, in epoch milliseconds."""
    return int(time.time() * 1000) + LATER_MS


def planned_delete(zk: KazooClient, hosts: str, spark: SparkSession, tmp_path: Path, broker: Broker,
                   spec: SandboxSpec, s3: S3ServerInfo | None = None, emit: bool = True) -> SeededSnapshot:
    """Seed, snapshot, reconcile and emit: what the delete stage starts from.

    With S3, reconcile looks LATER_MS ahead: moto cannot backdate objects, so only then are its
    orphan objects past the grace period (the delete stage is then run with the same clock).
    """
    cluster = build_cluster(spec)
    seed_zookeeper(zk, cluster)
    # A live broker, as the liveness gate asks (its session is this test's client's).
    zk.create("/loadbalance/brokers/127.0.0.1:8080", b"{}", ephemeral=True, makepath=True)
    if s3 is not None:
        seed_s3(s3_client(S3Target(spec.offload_bucket), s3.endpoint), cluster)
    planned = seed_and_snapshot(
        zk, hosts, spark, tmp_path / "tables", cluster, reseed=False,
        offload={"enabled": s3 is not None, "endpoint_override": s3.endpoint if s3 else ""},
        safety={"max_orphan_fraction": 1.0}, system_topic=broker.config(read_in_snapshot=False),
        delete={"deletes_per_second": 100_000.0, "in_task_attempts": 2, "op_timeout_s": 3.0})
    _, cfg, store, run_id = planned
    if s3 is None:
        reconcile_stage(spark, cfg, store, run_id)
    else:
        started = datetime.now(UTC)
        rec = run_reconcile(spark, store, run_id, SafetySettings.from_config(cfg), now_ms=later())
        record_gated_reconcile(store, run_id, rec.counts, cfg, started)
    if emit:
        emitted = run_emit(spark, cfg, store, run_id)
        record_run(store, run_id, "emit", "succeeded", datetime.now(UTC), emitted.counts, cfg)
    return planned


def orphans_past_grace(cluster: SandboxCluster, later_ms: int = 0, offloads_listed: bool = False) -> set[int]:
    """Orphans past the 7-day grace period, `later_ms` from now (young orphans age into candidates). Without
    the offload buckets listed, a BookKeeper copy released by an offload is never one (issue 26, 7)."""
    now = int(time.time() * 1000) + later_ms
    return {i for i, x in cluster.ledgers.items() if (x.status is Status.ORPHAN or (
        later_ms and x.status is Status.YOUNG_ORPHAN and x.ctime_ms is not None and now - x.ctime_ms >= 7 * DAY_MS))
        and (offloads_listed or x.orphan_kind is not OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT)}
