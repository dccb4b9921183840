"""The data-quality gates on their two engines, on the same snapshot: the driver (Arrow, pandas) and Spark jobs.

    .venv/bin/python bench/bench_gates.py --topics 2000 20000 100000 [--rounds 3]

For each size the snapshot tables are written from the sandbox model (bench_reconcile.py's writer), then
`run_gates` runs with `[gates] driver_rows` forcing each engine, alternately, in one Spark session; a warm-up run
of each comes first (GX's import and Spark's first jobs are not what differs). Reported: each engine's median
wall time, the ratio Spark / driver, and what the driver engine holds: the gated columns' Arrow bytes, and the
driver process's peak RSS during a driver run above its RSS before it (Arrow, pandas' copy for GX one table at a
time, GX's own objects): what `[gates] driver_rows = "auto"` budgets a row at. Both engines must report the same
failures.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_reconcile import write_snapshot
from harness.sandbox.model import SandboxSpec, build_cluster
from sweeper.config import GatesConfig
from sweeper.reconcile.gates import GATED, run_gates
from sweeper.spark import get_spark
from sweeper.tables import open_table_store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, nargs="+", default=[2000, 20000, 100000])
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = get_spark("bench-gates")
    config = GatesConfig(require_live_brokers=False)
    engines = {"driver": dataclasses.replace(config, driver_rows=10**12),
               "spark": dataclasses.replace(config, driver_rows=0)}
    print("| topics | gated rows | driver s | Spark s | Spark / driver | Arrow on the driver | driver peak RSS added |")
    print("|---|---|---|---|---|---|---|")
    for topics in args.topics:
        work = Path(tempfile.mkdtemp(prefix="bench-gates-"))
        cluster = build_cluster(SandboxSpec(seed=1, topics=topics, max_rollovers=args.max_rollovers))
        captured_at = datetime.fromtimestamp(cluster.spec.now_ms / 1000, UTC)
        counts = write_snapshot(spark, work / "tables", cluster, "bench", captured_at)
        del cluster
        store = open_table_store(str(work / "tables"), spark, engine="delta-rs")
        gated = sum(counts.get(t, 0) for t in GATED)
        held_mib = sum(store.read_arrow(t, where={"run_id": "bench"}, columns=list(c)).nbytes
                       for t, c in GATED.items() if store.exists(t)) / 2**20
        failures = {name: run_gates(store, "bench", cfg).failures for name, cfg in engines.items()}  # warm-up
        if failures["driver"] != failures["spark"]:
            raise SystemExit(f"the engines disagree: {failures}")
        before = _reset_peak_rss()
        run_gates(store, "bench", engines["driver"])
        added_mib = (_peak_rss() - before) / 2**20
        times: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, cfg in engines.items():
                started = time.perf_counter()
                run_gates(store, "bench", cfg)
                times[name].append(time.perf_counter() - started)
        driver, on_spark = statistics.median(times["driver"]), statistics.median(times["spark"])
        print(f"| {topics:,} | {gated:,} | {driver:.2f} | {on_spark:.2f} | {on_spark / driver:.1f}x | "
              f"{held_mib:.0f} MiB | {added_mib:.0f} MiB ({added_mib * 2**20 / max(gated, 1):.0f} B a row) |",
              flush=True)
        shutil.rmtree(work, ignore_errors=True)
    spark.stop()


def _reset_peak_rss() -> int:
    """Linux: the high-water mark set back to the current RSS (clear_refs 5); returns that RSS in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") * 1024


def _peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


if __name__ == "__main__":
    main()
