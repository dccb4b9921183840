"""Snapshot scan speed against a plain sequential kazoo `get` loop, measured in one run.

    .venv/bin/python bench/bench_snapshot.py --topics 20000 --max-rollovers 16

Starts its own ZooKeeper, seeds the sandbox, reads every ledger znode once with a sequential
kazoo loop (the baseline), then runs the real snapshot (distributed scan + Delta commits) and
prints both rates and their ratio. Results go to docs/benchmarks.md by hand, with this command.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_zookeeper
from harness.zkserver import start_zookeeper, stop_zookeeper
from sweeper.config import PulsarMetadataConfig, SweeperConfig
from sweeper.layout import LedgerLayout, ledger_path
from sweeper.snapshot import run_snapshot
from sweeper.spark import get_spark
from sweeper.tables import open_table_store
from sweeper.zk import client as zkutil


def sequential_baseline(hosts: str, paths: list[str]) -> float:
    client = zkutil.connect(hosts)
    try:
        started = time.monotonic()
        for path in paths:
            client.get(path)
        return time.monotonic() - started
    finally:
        zkutil.close(client)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=20_000)
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layout", default="hierarchical")
    parser.add_argument("--work", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-snapshot-"))
    layout = LedgerLayout(args.layout)
    spec = SandboxSpec(seed=args.seed, topics=args.topics, max_rollovers=args.max_rollovers, layout=layout)
    t = time.monotonic()
    cluster = build_cluster(spec)
    print(f"model: {len(cluster.ledgers):,} ledgers, {len(cluster.managed_ledgers):,} managed ledgers "
          f"({time.monotonic() - t:.1f}s)", flush=True)

    server = start_zookeeper(work / "zookeeper", heap="4g")
    try:
        client = zkutil.connect(server.connect_string)
        seeded = seed_zookeeper(client, cluster)
        zkutil.close(client)
        print(f"seeded {seeded.znodes:,} znodes in {seeded.seconds:.1f}s ({seeded.rate:,.0f}/s)", flush=True)

        paths = [ledger_path(spec.ledgers_root, i, layout) for i in sorted(cluster.ledgers)]
        baseline_s = sequential_baseline(server.connect_string, paths)
        baseline_rate = len(paths) / baseline_s
        print(f"baseline: sequential kazoo get over {len(paths):,} ledger znodes: {baseline_s:.1f}s "
              f"({baseline_rate:,.0f}/s)", flush=True)

        spark = get_spark("bench-snapshot")
        cfg = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox")).replace(
            bookkeeper={"zookeeper": server.connect_string},
            tables={"root": str(work / "tables"), "engine": "delta-rs"},
            scan={"reads_per_second": 0.0},  # raw speed; what the limit costs ZooKeeper: bench_zk_impact.py
        )
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        result = run_snapshot(spark, cfg, store)
        ours_rate = result.counts["bk_ledgers"] / result.scan_s
        end_to_end_rate = result.counts["bk_ledgers"] / result.duration_s
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"snapshot: {result.counts['bk_ledgers']:,} ledgers, {result.counts['ml_ledgers']:,} ml ledgers, "
              f"{result.counts['ml_cursors']:,} cursors, {result.counts['schema_ledgers']:,} schema refs; "
              f"{result.units} units", flush=True)
        print(f"  scan stage (all znodes read, decoded, cached): {result.scan_s:.1f}s -> {ours_rate:,.0f} ledgers/s")
        print(f"  end to end incl. Delta commits of all tables: {result.duration_s:.1f}s -> "
              f"{end_to_end_rate:,.0f} ledgers/s")
        print(f"  ratio vs sequential loop: scan {ours_rate / baseline_rate:.2f}x, "
              f"end to end {end_to_end_rate / baseline_rate:.2f}x")
        print(f"  driver peak RSS: {peak_mb:,.0f} MB")
        spark.stop()
    finally:
        stop_zookeeper(server)


if __name__ == "__main__":
    main()
