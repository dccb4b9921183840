"""The whole pipeline at scale: a 1,000,000-ledger / 100,000-topic sandbox, `sweep --execute`.

    .venv/bin/python bench/bench_sweep.py --topics 100000 --max-rollovers 16

A private ZooKeeper (4 GiB heap) is seeded with the sandbox model by a child process (the model is 1.3 GiB of
Python objects at 1M ledgers, and is not the sweeper's memory), the local Pulsar endpoint runs in
its own process, and the real `sweeper.pipeline.sweep(until="delete", execute=True)` runs
snapshot, gates, reconcile, emit and delete in this process with a local[2] Spark session. It
reports each stage's wall time and the peak resident memory of the sweeper's process tree (this
process, the Spark JVM and its Python workers; not ZooKeeper or the endpoint, which stand in for
the cluster) while the stage ran, and checks the outcome against the ground truth, by ledger id: the
candidates, and the ledgers deleted, must each be exactly the ledgers the model says a correct sweeper deletes
with this config (`SandboxCluster.deletable`); the bench prints every difference by cause and exits non-zero.

Tiered storage is off here: moto's S3 server takes milliseconds per object and the model has
~200,000 offloaded objects at this size, so S3 is measured by the tests at small scale instead. So the BookKeeper
copies of offloaded ledgers (`bookkeeperDeleted=true`) stay `unknown` (their offloaded copy is not verified) and
are not in the ground truth to delete, and neither are leftover cursor ledgers of `__compaction` on live topics
(`protected`): `SandboxCluster.kept` and `Status.PROTECTED` say why.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

import sweeper.pipeline as pipeline
from harness.sandbox.model import SandboxCluster, SandboxSpec, Status, build_cluster
from harness.sandbox.pulsar import start_pulsar, stop_pulsar
from harness.sandbox.seed import seed_zookeeper
from harness.zkserver import ServerClock, free_port, start_zookeeper, stop_zookeeper
from sweeper.config import PulsarMetadataConfig, SweeperConfig
from sweeper.spark import get_spark
from sweeper.tables import TableStore, open_table_store
from sweeper.zk import client as zkutil


class TreeMemory:
    """Peak RSS of this process and its descendants, minus the ones standing in for the cluster."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.stage = "setup"
        self.peaks: dict[str, int] = {}
        self.parts: dict[str, dict[str, int]] = {}  # at each stage's peak: RSS by process kind
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def tagged(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, noting that `stage` is running while it does."""
        def run(*args: Any, **kwargs: Any) -> Any:
            self.stage = stage
            return fn(*args, **kwargs)
        return run

    def _rss(self) -> dict[str, int]:
        """RSS by kind: this process (the driver's Python), the Spark JVM, the Python workers, anything else."""
        me = psutil.Process()
        parts = {"driver python": me.memory_info().rss, "jvm": 0, "python workers": 0, "other": 0}
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # a worker that just exited (its parents() too: it killed the
                if child.pid in self.exclude or any(p.pid in self.exclude for p in child.parents()):  # sampler)
                    continue
                name = child.name()
                kind = "jvm" if name == "java" else "python workers" if name.startswith("python") else "other"
                parts[kind] += child.memory_info().rss
        return parts

    def _run(self) -> None:
        while not self.stop.is_set():
            parts = self._rss()
            rss = sum(parts.values())
            for stage in (self.stage, "whole run"):
                if rss > self.peaks.get(stage, 0):
                    self.peaks[stage] = rss
                    self.parts[stage] = parts
            time.sleep(0.2)


def model_labels(cluster: SandboxCluster) -> dict[int, str]:
    """`status/kind` of every ledger the model does not call in use: all the check needs of the model, so the
    model itself (1.3 GiB of Python objects at 1M ledgers) is not held in this process while the sweep runs."""
    return {i: f"{x.status.value}/{x.orphan_kind.value if x.orphan_kind else '-'}" for i, x in cluster.ledgers.items()
            if x.status is not Status.IN_USE}


def check_outcome(store: TableStore, run_id: str, labels: dict[int, str], truth: set[int]) -> list[str]:
    """The run's candidates and deleted ledgers against the ground truth, by id; each difference printed by cause
    (the model's kind and status, the product's status and reason). Returns the problems (none: it matched)."""
    planned = {r["ledger_id"]: r for r in store.read_arrow(
        "orphans", where={"run_id": run_id, "object_type": "ledger"},
        columns=["ledger_id", "status", "reason", "detail"]).to_pylist()}
    candidates = {i for i, r in planned.items() if r["status"] == "candidate"}
    deleted = {r["ledger_id"] for r in store.read_arrow(
        "delete_results", where={"run_id": run_id, "outcome": "deleted", "ledger_type": "LEDGER"},
        columns=["ledger_id"]).to_pylist()} if store.exists("delete_results") else set()  # none: nothing deleted
    problems = []
    for name, got in (("candidates", candidates), ("deleted", deleted)):
        missed, beyond = sorted(truth - got), sorted(got - truth)
        verdict = "== ground truth" if not (missed or beyond) else "!= ground truth"
        print(f"{name}: {len(got):,} {verdict} ({len(truth):,}): {len(missed):,} missed, {len(beyond):,} beyond it")
        causes: Counter[tuple[str, ...]] = Counter()
        examples: dict[tuple[str, ...], int] = {}
        for i in missed + beyond:
            row = planned.get(i)
            cause = ("missed" if i in truth else "beyond", f"model {labels.get(i, 'in_use (or not in it)')}",
                     f"product {row['status']}/{row['reason']}" if row
                     else "product: no orphans row (referenced, or not in the snapshot)")
            causes[cause] += 1
            examples.setdefault(cause, i)
        for cause, n in causes.most_common():
            row = planned.get(examples[cause])
            print(f"  {n:>7,}  {', '.join(cause)}  e.g. ledger {examples[cause]}"
                  + (f": {row['detail']}" if row and row["detail"] else ""))
        if missed or beyond:
            problems.append(f"{name}: {len(missed):,} ground-truth orphans missed, {len(beyond):,} beyond the truth")
    return problems


def seed_model(connect_string: str, clock_file: str | None, topics: int, max_rollovers: int,
               offload_enabled: bool) -> dict[str, Any]:
    """Build the sandbox model and seed ZooKeeper with it, in a child process: the model (1.3 GiB of Python objects
    at 1M ledgers, which this process would not give back to the OS once freed) never lives in the process whose
    RSS is the sweeper's. Returns what the check needs: the ids to delete, the labels of non-in-use ledgers, and a
    summary."""
    # The server's clock (set back while ledger znodes are created) is found by port in the process that started
    # it, so the child is handed its file.
    clock = ServerClock(Path(clock_file)) if clock_file else None
    return seed(build_cluster(SandboxSpec(topics=topics, max_rollovers=max_rollovers)), connect_string,
                offload_enabled, clock)


def seed(cluster: SandboxCluster, connect_string: str, offload_enabled: bool,
         clock: ServerClock | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    client = zkutil.connect(connect_string, timeout=60)
    seeded = seed_zookeeper(client, cluster, clock=clock)
    zkutil.close(client)
    orphans = sum(1 for x in cluster.ledgers.values() if x.status is Status.ORPHAN)
    truth = cluster.deletable(offloads_verified=offload_enabled)
    statuses = Counter(x.status for x in cluster.ledgers.values())
    lines = [f"sandbox: {len(cluster.ledgers):,} ledgers, {len(cluster.managed_ledgers):,} managed ledgers, "
             f"{seeded.znodes:,} znodes seeded in {time.monotonic() - t0:.0f}s; {orphans:,} orphans, "
             f"{len(truth):,} to delete with this config"]
    lines += [f"  kept: {n:,} orphans, {why}"
              for why, n in Counter(cluster.kept(offloads_verified=offload_enabled).values()).most_common()]
    lines.append("  never candidates: " + ", ".join(f"{statuses[s]:,} {s.value}" for s in (
        Status.PROTECTED, Status.YOUNG_ORPHAN, Status.UNKNOWN, Status.NON_PULSAR)))
    return {"truth": truth, "labels": model_labels(cluster), "lines": lines}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--driver-memory", default="6g",
                        help="spark.driver.memory (local mode: the JVM's -Xmx; the product's default is 4g)")
    parser.add_argument("--keep-model", action="store_true",
                        help="build and seed the sandbox model in this process and keep it during the sweep, as the "
                             "bench did until issue 37 (its RSS then counts ~1.3 GiB of ground truth at 1M ledgers)")
    parser.add_argument("--gates-driver-rows", type=int, default=None,
                        help="[gates] driver_rows (default: the product's, \"auto\": a quarter of the memory free "
                             "at 400 B a gated row; a 1M-ledger snapshot has ~2.5M; 0: always Spark jobs)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    server = start_zookeeper(work / "zk", heap="4g")
    broker = start_pulsar(work / "pulsar", free_port(), free_port(), register_zookeeper=server.connect_string)
    memory = TreeMemory({server.pid, broker.pid})
    problems: list[str] = []
    try:
        offload_enabled = False  # see the module docstring
        seeding = (server.connect_string, server.clock_file, args.topics, args.max_rollovers, offload_enabled)
        kept_model = None
        if args.keep_model:
            kept_model = build_cluster(SandboxSpec(topics=args.topics, max_rollovers=args.max_rollovers))
            seeded = seed(kept_model, server.connect_string, offload_enabled)
        else:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
                seeded = child.submit(seed_model, *seeding).result()
        truth, labels = seeded["truth"], seeded["labels"]
        for line in seeded["lines"]:
            print(line)
        print(f"  this process before the sweep: {psutil.Process().memory_info().rss / (1 << 30):.2f} GiB RSS "
              f"({'the model kept in it' if kept_model else 'the model was built and seeded in a child process'})")

        cfg = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox")).replace(
            bookkeeper={"zookeeper": server.connect_string, "session_timeout_s": 60.0},
            tables={"root": str(work / "tables"), "engine": "delta-rs"}, offload={"enabled": offload_enabled},
            safety={"max_orphan_fraction": 0.25, "bookkeeper_dedicated": True},  # as the sandbox's own config
            system_topic={"service_url": broker.service_url, "admin_url": broker.admin_url},
            delete={"max_deletes_per_run": 1_000_000, "deletes_per_second": 1e9},
            scan={"reads_per_second": 0.0})  # raw speed, as before the limit (bench_zk_impact.py measures it)
        if args.gates_driver_rows is not None:
            cfg = cfg.replace(gates={"driver_rows": args.gates_driver_rows})
        spark = get_spark("bench-sweep", master="local[2]", conf={"spark.driver.memory": args.driver_memory})
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        for name, stage in (("snapshot_stage", "snapshot"), ("reconcile_stage", "reconcile"),
                            ("retention_stage", "retention_debt"), ("emit_stage", "emit"), ("delete_stage", "delete"),
                            ("reclaim_stage", "reclaim")):
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
        print("at each peak, GiB: " + "; ".join(
            f"{stage} " + ", ".join(f"{kind} {rss / gib:.2f}" for kind, rss in parts.items() if rss)
            for stage, parts in memory.parts.items()))
        deleted = result.stages["delete"].get("deleted", 0)
        print(f"deleted {deleted:,} of {result.stages['reconcile'].get('candidate', 0):,} candidates; "
              f"ground truth: {len(truth):,} to delete")
        problems = check_outcome(store, result.run_id, labels, truth)
        del kept_model
        spark.stop()
    finally:
        stop_pulsar(broker)
        stop_zookeeper(server)
    if problems:
        sys.exit("outcome != ground truth: " + "; ".join(problems))
    print("outcome == ground truth: every ledger to delete was a candidate and was deleted, and nothing else")


if __name__ == "__main__":
    main()
