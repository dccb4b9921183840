"""Snapshot and reconcile of the sandbox with and without adaptive execution on cached plans.

    .venv/bin/python bench/bench_cached_partitions.py [--topics 40] [--rounds 3]

`sweeper.spark.SQL_TUNING` lets adaptive execution change a cached plan's shuffle partitioning. Without it a
cached frame keeps `spark.sql.shuffle.partitions` (200 under a plain spark-submit) and every stage over it runs
that many tasks, most of them Python. Here one local[2] session with spark-submit's default of 200 shuffle
partitions runs the snapshot and the reconcile of the same seeded sandbox, the setting off and on alternately
(fresh tables each time), and prints the median seconds of each and the ratio off / on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_zookeeper
from harness.zkserver import start_zookeeper, stop_zookeeper
from sweeper.config import SweeperConfig
from sweeper.pipeline import snapshot_stage
from sweeper.reconcile.stage import SafetySettings, run_reconcile
from sweeper.rules.safety import CircuitBreaker
from sweeper.spark import get_spark
from sweeper.tables import open_table_store
from sweeper.zk import client as zkutil

SETTING = "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-cached-"))
    server = start_zookeeper(work / "zookeeper")
    try:
        client = zkutil.connect(server.connect_string)
        try:
            seed_zookeeper(client, build_cluster(SandboxSpec(seed=7, topics=args.topics)))
        finally:
            zkutil.close(client)
        spark = get_spark("bench-cached-partitions", master="local[2]",
                          conf={"spark.sql.shuffle.partitions": "200", "spark.default.parallelism": "2"})
        times: dict[str, dict[str, list[float]]] = {m: {"snapshot": [], "reconcile": []} for m in ("off", "on")}
        for n in range(args.rounds + 1):  # round 0 warms the JVM and is not counted
            for mode in ("off", "on") if n % 2 else ("on", "off"):
                spark.conf.set(SETTING, "true" if mode == "on" else "false")
                root = work / f"tables-{n}-{mode}"
                cfg = SweeperConfig().replace(bookkeeper={"zookeeper": server.connect_string},
                                              pulsar={"cluster_name": "sandbox"}, offload={"enabled": False},
                                              safety={"bookkeeper_dedicated": True},
                                              tables={"root": str(root), "engine": "delta-rs"})
                store = open_table_store(str(root), spark, engine="delta-rs")
                t0 = time.monotonic()
                run_id = snapshot_stage(spark, cfg, store).run_id
                t1 = time.monotonic()
                run_reconcile(spark, store, run_id, SafetySettings(breaker=CircuitBreaker(1.0),
                                                                   bookkeeper_dedicated=True))
                t2 = time.monotonic()
                if n:
                    times[mode]["snapshot"].append(t1 - t0)
                    times[mode]["reconcile"].append(t2 - t1)
                print(f"round {n} {mode:3}: snapshot {t1 - t0:5.1f}s reconcile {t2 - t1:5.1f}s", flush=True)
        for stage in ("snapshot", "reconcile"):
            off, on = statistics.median(times["off"][stage]), statistics.median(times["on"][stage])
            print(f"{stage:9}: off {off:5.1f}s  on {on:5.1f}s  ratio off/on {off / on:4.2f}x")
        spark.stop()
    finally:
        stop_zookeeper(server)


if __name__ == "__main__":
    main()
