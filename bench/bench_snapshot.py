"""Snapshot scan speed against a plain sequential kazoo `get` loop, measured in one run.

    .venv/bin/python bench/bench_snapshot.py --topics 20000 --max-rollovers 16 [--store oxia]

Starts its own ZooKeeper, seeds the sandbox, reads every ledger znode once with a sequential
kazoo loop (the baseline), then runs the real snapshot (distributed scan + Delta commits) and
prints both rates and their ratio. With `--store oxia` the same model is also seeded into an Oxia server,
read once with a sequential `get` loop through the same client (Oxia's baseline), and snapshotted: the Oxia
scan against that loop, and against the ZooKeeper snapshot of the same run. Results go to
docs/benchmarks.md by hand, with this command.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.oxiaserver import start_oxia, stop_oxia
from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_oxia, seed_zookeeper
from harness.zkserver import start_zookeeper, stop_zookeeper
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.config import PulsarMetadataConfig, SweeperConfig
from sweeper.metastore.oxia import OxiaStore
from sweeper.pipeline import snapshot_stage
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


def sequential_oxia_baseline(store: OxiaStore, paths: list[str]) -> float:
    started = time.monotonic()
    for path in paths:
        store.get(path)
    return time.monotonic() - started


def snapshot_rates(spark: Any, cfg: SweeperConfig, label: str) -> tuple[float, float]:
    """The real snapshot on `cfg`'s store: (scan stage, end to end) in ledgers per second."""
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    result = snapshot_stage(spark, cfg, store)
    ours_rate = result.counts.bk_ledgers / result.scan_s
    end_to_end_rate = result.counts.bk_ledgers / result.duration_s
    print(f"{label} snapshot: {result.counts.bk_ledgers:,} ledgers, {result.counts.ml_ledgers:,} ml ledgers, "
          f"{result.counts.ml_cursors:,} cursors, {result.counts.schema_ledgers:,} schema refs; "
          f"{result.units} units", flush=True)
    # With the delta-rs engine the scan's tasks also write the tables' files: the scan stage is then all but the
    # planning and the commits.
    print(f"  scan stage (all records read, decoded, written or cached): {result.scan_s:.1f}s -> "
          f"{ours_rate:,.0f} ledgers/s")
    print(f"  end to end incl. Delta commits of all tables: {result.duration_s:.1f}s -> "
          f"{end_to_end_rate:,.0f} ledgers/s", flush=True)
    return ours_rate, end_to_end_rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=20_000)
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layout", default="hierarchical")
    parser.add_argument("--store", choices=("zookeeper", "oxia"), default="zookeeper",
                        help="oxia: also seed the same model into Oxia and compare its snapshot with ZooKeeper's")
    parser.add_argument("--work", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="snapshots per store, alternating with --store oxia (default: 1, or 3 with oxia)")
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 3 if args.store == "oxia" else 1

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-snapshot-"))
    layout = LedgerLayout(args.layout)
    spec = SandboxSpec(seed=args.seed, topics=args.topics, max_rollovers=args.max_rollovers, layout=layout)
    t = time.monotonic()
    cluster = build_cluster(spec)
    print(f"model: {len(cluster.ledgers):,} ledgers, {len(cluster.managed_ledgers):,} managed ledgers "
          f"({time.monotonic() - t:.1f}s)", flush=True)
    paths = [ledger_path(spec.ledgers_root, i, layout) for i in sorted(cluster.ledgers)]
    base = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox")).replace(
        offload={"enabled": False},
        scan={"reads_per_second": 0.0},  # raw speed; what the limit costs ZooKeeper: bench_zk_impact.py
    )

    server = start_zookeeper(work / "zookeeper", heap="4g")
    oxia_server = None
    try:
        client = zkutil.connect(server.connect_string)
        seeded = seed_zookeeper(client, cluster)
        zkutil.close(client)
        print(f"seeded {seeded.znodes:,} znodes in {seeded.seconds:.1f}s ({seeded.rate:,.0f}/s)", flush=True)

        baseline_s = sequential_baseline(server.connect_string, paths)
        baseline_rate = len(paths) / baseline_s
        print(f"baseline: sequential kazoo get over {len(paths):,} ledger znodes: {baseline_s:.1f}s "
              f"({baseline_rate:,.0f}/s)", flush=True)

        oxia_cfg = oxia_baseline = None
        if args.store == "oxia":
            # Both stores seeded before either is snapshotted, so the snapshots can alternate in one JVM.
            oxia_server = start_oxia(work / "oxia")
            oxia = OxiaStore(oxia_server.address, "default")
            seeded = seed_oxia(oxia, cluster)
            print(f"seeded Oxia: {seeded.znodes:,} records in {seeded.seconds:.1f}s ({seeded.rate:,.0f}/s)",
                  flush=True)
            # A rate, so a sample of the ledgers is enough (a whole loop would take minutes at ~1,700 gets/s).
            sample = paths[::max(1, len(paths) // 50_000)]
            oxia_baseline_s = sequential_oxia_baseline(oxia, sample)
            oxia.close()
            oxia_baseline = len(sample) / oxia_baseline_s
            print(f"baseline: sequential Oxia get (same client) over {len(sample):,} of the ledger records: "
                  f"{oxia_baseline_s:.1f}s ({oxia_baseline:,.0f}/s)", flush=True)
            oxia_cfg = base.replace(
                bookkeeper={"metadata_service_uri": f"metadata-store:{oxia_server.url()}"},
                pulsar={"metadata_store_url": oxia_server.url()},
                tables={"root": str(work / "tables-oxia"), "engine": "delta-rs"})

        spark = get_spark("bench-snapshot")
        zk_cfg = base.replace(bookkeeper={"zookeeper": server.connect_string},
                              tables={"root": str(work / "tables-zk"), "engine": "delta-rs"})
        zk_runs: list[tuple[float, float]] = []
        oxia_runs: list[tuple[float, float]] = []
        # With --store oxia the snapshots alternate (ZooKeeper, Oxia, ZooKeeper, ...): the first one also warms
        # the JVM and the Python workers up, so one round alone would favour the store that goes second.
        for round_ in range(1, args.rounds + 1):
            suffix = f" (round {round_})" if args.rounds > 1 else ""
            zk_runs.append(snapshot_rates(spark, zk_cfg.replace(
                tables={"root": str(work / f"tables-zk-{round_}"), "engine": "delta-rs"}), "ZooKeeper" + suffix))
            if oxia_cfg is not None:
                oxia_runs.append(snapshot_rates(spark, oxia_cfg.replace(
                    tables={"root": str(work / f"tables-oxia-{round_}"), "engine": "delta-rs"}), "Oxia" + suffix))
        zk_scan, zk_e2e = max(r[0] for r in zk_runs), max(r[1] for r in zk_runs)
        best = " (best of each)" if args.rounds > 1 else ""
        print(f"ZooKeeper ratio vs sequential loop{best}: scan {zk_scan / baseline_rate:.2f}x, "
              f"end to end {zk_e2e / baseline_rate:.2f}x", flush=True)
        if oxia_runs and oxia_baseline is not None:
            ox_scan, ox_e2e = max(r[0] for r in oxia_runs), max(r[1] for r in oxia_runs)
            print(f"Oxia ratio vs sequential Oxia get loop{best}: scan {ox_scan / oxia_baseline:.2f}x, "
                  f"end to end {ox_e2e / oxia_baseline:.2f}x")
            print(f"Oxia against ZooKeeper, same model, same run{best}: scan {ox_scan / zk_scan:.2f}x, "
                  f"end to end {ox_e2e / zk_e2e:.2f}x")
            for (z_scan, z_e2e), (o_scan, o_e2e), round_ in zip(zk_runs, oxia_runs, range(1, args.rounds + 1),
                                                                strict=True):
                print(f"  round {round_}: scan {o_scan / z_scan:.2f}x, end to end {o_e2e / z_e2e:.2f}x")
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"  driver peak RSS: {peak_mb:,.0f} MB")
        spark.stop()
    finally:
        stop_zookeeper(server)
        if oxia_server is not None:
            stop_oxia(oxia_server)


if __name__ == "__main__":
    main()
