"""Issue 45: the ZooKeeper ensemble loses its leader while the snapshot scans it.

A synthetic Pulsar cluster with known orphans (harness.sandbox) is seeded into a chroot of the three-node ensemble;
`sweeper snapshot` runs as an operator runs it (a CLI process with its own Spark JVM), connected to all three members
with the chroot, its reads paced ([scan] reads_per_second) so that the scan lasts several seconds. Once the scan's
reads are under way (counted on the members themselves), the leader is SIGKILLed. Every member drops its clients
while the other two elect a new leader, so the scan's wire-protocol sessions lose their connections mid-iteration.

The run must either finish correctly or stop with exit 3 and one line; this one finishes, since the scan's reader
reconnects (sweeper.zk.wire): exit 0, a `succeeded` run whose tables hold exactly what a clean snapshot of the same
chroot holds (nothing lost, nothing read twice), and whose reconcile plans exactly the seed's orphans (the ground
truth), so nothing in use would be deleted. Without the reconnect the same run stops with exit 3 ("connection to
ZooKeeper ... lost: Broken pipe") and this test fails on its exit code.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec, Status, build_cluster
from harness.sandbox.seed import seed_zookeeper
from harness.zkensemble import EnsembleInfo
from sweeper.config import to_toml
from sweeper.pipeline import reconcile_stage, snapshot_stage
from sweeper.table_schemas import SNAPSHOT_TABLES
from sweeper.tables import open_table_store
from tests.support.seeded import orphans_past_grace, sandbox_config
from tests.support.zk_ensemble import (
    Election,
    EnsembleTarget,
    RequestCounter,
    assert_finished_or_refused,
    kill_leader,
    run_cli,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("zk-ensemble-scan"), pytest.mark.timeout(600)]

# The scan's ZooKeeper requests before the kill: past the planning (about a hundred requests for this cluster: its
# listings of the roots and the policies) and well short of the scan's seven hundred or so, which take about 10 s
# at the pace below: room for a slow poll of the members on a loaded machine.
KILL_AFTER_REQUESTS = 250


def _rows(store: object, table: str, run_id: str) -> list[dict[str, object]]:
    return store.read_arrow(table, where={"run_id": run_id}).to_pylist()  # type: ignore[attr-defined]


def test_the_snapshot_rides_out_the_leader_killed_mid_scan(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient, spark: SparkSession,
        tmp_path: Path) -> None:
    spec = SandboxSpec(seed=5, topics=200)
    cluster = build_cluster(spec)
    seed_zookeeper(ensemble_zk, cluster)
    # A live broker, as the reconcile's liveness gate asks (its session is this test's client's).
    ensemble_zk.create("/loadbalance/brokers/127.0.0.1:8080", b"{}", ephemeral=True, makepath=True)
    cfg = sandbox_config(ensemble_target.hosts, tmp_path / "tables",
                         scan={"reads_per_second": 200.0, "multi_read": 10})
    assert cfg.bookkeeper.zookeeper.count(",") == 2 and cfg.bookkeeper.zookeeper.endswith(ensemble_target.chroot)
    config_file = tmp_path / "sweeper.toml"
    config_file.write_text(to_toml(cfg))

    counter = RequestCounter(zk_ensemble)
    struck: list[tuple[Election, RequestCounter]] = []

    def strike(proc: object) -> None:
        wait_until("the scan's reads", lambda: counter() >= KILL_AFTER_REQUESTS, proc)  # type: ignore[arg-type]
        election = kill_leader(zk_ensemble)
        struck.append((election, RequestCounter(zk_ensemble)))

    run = run_cli(["snapshot", "--config", str(config_file)], tmp_path, "snapshot", during=strike)
    [(election, after)] = struck
    read_after = after()
    print(f"\nkilled {election.killed} after {KILL_AFTER_REQUESTS} requests; new leader in {election.elected_s:.2f} s; "
          f"{read_after} requests after it; snapshot exit {run.code}")
    stopped = assert_finished_or_refused(run)
    assert stopped is None, f"the scan did not ride out the election: {stopped}"
    assert read_after >= 100, "the scan had (nearly) finished before the kill: it proves nothing"
    run_id = re.search(r"^snapshot (\S+):", run.out, re.MULTILINE).group(1)  # type: ignore[union-attr]
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    [row] = _rows(store, "runs", run_id)
    assert row["status"] == "succeeded", row

    # The same chroot snapshotted again with nothing failing: the run across the election holds the same rows.
    clean = snapshot_stage(spark, cfg, store).run_id
    for table in SNAPSHOT_TABLES:
        if not store.exists(table):
            continue
        faulted, calm = (len(_rows(store, table, r)) for r in (run_id, clean))
        assert faulted == calm, f"{table}: {faulted} rows across the election, {calm} without it"
    ids = Counter(r["ledger_id"] for r in _rows(store, "bk_ledgers", run_id))
    assert max(ids.values()) == 1, "a ledger read twice"
    assert set(ids) == {r["ledger_id"] for r in _rows(store, "bk_ledgers", clean)}

    # What the plan from it would delete is the seed's ground truth: nothing in use.
    reconcile_stage(spark, cfg, store, run_id)
    candidates = {r["ledger_id"] for r in _rows(store, "orphans", run_id)
                  if r["status"] == "candidate" and r["object_type"] == "ledger"}
    in_use = {i for i, x in cluster.ledgers.items() if x.status is Status.IN_USE}
    assert candidates == orphans_past_grace(cluster) and not candidates & in_use
