"""The whole pipeline at scale: a 1,000,000-ledger / 100,000-topic sandbox, `sweep --execute`.

    .venv/bin/python bench/bench_sweep.py --topics 100000 --max-rollovers 16

A private ZooKeeper (4 GiB heap) is seeded with the sandbox model, the local Pulsar endpoint runs in
its own process, and the real `sweeper.pipeline.sweep(until="delete", execute=True)` runs
snapshot, gates, reconcile, emit and delete in this process with a local[2] Spark session. It
reports each stage's wall time and the peak resident memory of the sweeper's process tree (this
process, the Spark JVM and its Python workers; not ZooKeeper or the endpoint, which stand in for
the cluster) while the stage ran, and checks the outcome against the ground truth.

Tiered storage is off here: moto's S3 server takes milliseconds per object and the model has
~200,000 offloaded objects at this size, so S3 is measured by the tests at small scale instead.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

import sweeper.pipeline as pipeline
from harness.sandbox.model import SandboxSpec, Status, build_cluster
from harness.sandbox.pulsar import start_pulsar, stop_pulsar
from harness.sandbox.seed import seed_zookeeper
from harness.zkserver import free_port, start_zookeeper, stop_zookeeper
from sweeper.config import PulsarMetadataConfig, SweeperConfig
from sweeper.spark import get_spark
from sweeper.tables import open_table_store
from sweeper.zk import client as zkutil


class TreeMemory:
    """Peak RSS of this process and its descendants, minus the ones standing in for the cluster."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.stage = "setup"
        self.peaks: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def tagged(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, noting that `stage` is running while it does."""
        def run(*args: Any, **kwargs: Any) -> Any:
            self.stage = stage
            return fn(*args, **kwargs)
        return run

    def _rss(self) -> int:
        me = psutil.Process()
        total = me.memory_info().rss
        for child in me.children(recursive=True):
            if child.pid in self.exclude or any(p.pid in self.exclude for p in child.parents()):
                continue
            with contextlib.suppress(psutil.Error):  # a worker that just exited
                total += child.memory_info().rss
        return total

    def _run(self) -> None:
        while not self.stop.is_set():
            rss = self._rss()
            self.peaks[self.stage] = max(self.peaks.get(self.stage, 0), rss)
            self.peaks["whole run"] = max(self.peaks.get("whole run", 0), rss)
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--max-rollovers", type=int, default=16)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    server = start_zookeeper(work / "zk", heap="4g")
    broker = start_pulsar(work / "pulsar", free_port(), free_port(), register_zookeeper=server.connect_string)
    memory = TreeMemory({server.pid, broker.pid})
    try:
        t0 = time.monotonic()
        cluster = build_cluster(SandboxSpec(topics=args.topics, max_rollovers=args.max_rollovers))
        client = zkutil.connect(server.connect_string, timeout=60)
        seeded = seed_zookeeper(client, cluster)
        zkutil.close(client)
        orphans = {i for i, x in cluster.ledgers.items() if x.status is Status.ORPHAN}
        print(f"sandbox: {len(cluster.ledgers):,} ledgers, {len(cluster.managed_ledgers):,} managed ledgers, "
              f"{seeded.znodes:,} znodes seeded in {time.monotonic() - t0:.0f}s; {len(orphans):,} orphans")

        cfg = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox")).replace(
            bookkeeper={"zookeeper": server.connect_string, "session_timeout_s": 60.0},
            tables={"root": str(work / "tables"), "engine": "delta-rs"}, offload={"enabled": False},
            safety={"max_orphan_fraction": 0.25, "bookkeeper_dedicated": True},  # as the sandbox's own config
            system_topic={"service_url": broker.service_url, "admin_url": broker.admin_url},
            delete={"max_deletes_per_run": 1_000_000, "deletes_per_second": 1e9},
            scan={"reads_per_second": 0.0})  # raw speed, as before the limit (bench_zk_impact.py measures it)
        spark = get_spark("bench-sweep", master="local[2]", conf={"spark.driver.memory": "6g"})
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        for name, stage in (("snapshot_stage", "snapshot"), ("reconcile_stage", "reconcile"), ("emit_stage", "emit"),
                            ("delete_stage", "delete")):
            setattr(pipeline, name, memory.tagged(stage, getattr(pipeline, name)))
        memory.thread.start()
        t0 = time.monotonic()
        result = pipeline.sweep(spark, cfg, store, until="delete", execute=True, log=lambda line: print(line))
        total = time.monotonic() - t0
        memory.stop.set()
        memory.thread.join()

        gib = 1 << 30
        print(f"\n{'stage':<10} {'seconds':>8} {'peak RSS (GiB)':>15}")
        for stage, counts in result.stages.items():
            print(f"{stage:<10} {counts['seconds']:>8.1f} {memory.peaks.get(stage, 0) / gib:>15.2f}")
        print(f"{'total':<10} {total:>8.1f} {memory.peaks.get('whole run', 0) / gib:>15.2f}")
        deleted = result.stages["delete"].get("deleted", 0)
        print(f"deleted {deleted:,} of {result.stages['reconcile'].get('candidate', 0):,} candidates; "
              f"ground-truth orphans (grace passed): {len(orphans):,}")
        spark.stop()
    finally:
        stop_pulsar(broker)
        stop_zookeeper(server)


if __name__ == "__main__":
    main()
