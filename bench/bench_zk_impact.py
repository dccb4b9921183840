"""What the snapshot's scan does to a busy ZooKeeper: a broker-like probe's latency, idle vs scanned.

    .venv/bin/python bench/bench_zk_impact.py --topics 3000 --duration 30 --rounds 3

Starts its own ZooKeeper, seeds the sandbox, then runs a probe client in its own process doing
what a broker does to its metadata store: reads and small writes of managed-ledger-sized znodes
(1 KiB; one write in four), 200 operations a second, each timed. The probe runs on the same
server and data with no sweeper (idle), while the scan reads at full speed ([scan]
reads_per_second = 0) and while it reads at the default limit; `--limits 5000,50000` adds rows (to
choose the default). `--rounds` repeats the runs interleaved and reports medians.

The load is the scan's own read path from `[scan] max_sessions` processes: the wire reader with
multiRead, paced per session by the scan's token bucket (`--load reads`, the default), without
decoding, so that on a small machine the sweeper's CPU is not what limits the load. `--load tasks`
runs the scan task code itself (reads and decoding, `_scan_partition`) in those processes, and
`--load spark` the Spark scan stage in local mode. ZooKeeper and the probe run at a raised
priority (`--priority`), so that neither the sweeper's processes nor other work on a shared machine
take their CPU: what the scan can do to them is fill ZooKeeper's request queue, as it would on a
dedicated ensemble (`--cpu-split` pins them to the first CPU and the sweeper to the others; on two
CPUs that leaves the sweeper too little to load ZooKeeper at full speed). Prints one row per run:
probe latency overall and for reads (a write's latency includes the server's fsync, which a shared
disk disturbs more than any reader could), each against idle, and the load's achieved read rate.
Results go to docs/benchmarks.md by hand, with this command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_zookeeper
from harness.zkserver import start_zookeeper, stop_zookeeper
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.config import ScanConfig, SweeperConfig
from sweeper.zk import client as zkutil

PROBE_ZNODES = 200
PROBE_BYTES = 1024  # a managed ledger's info with a handful of ledgers, or a cursor's
WRITE_EVERY = 4  # one write in four operations: ledger rollovers and cursor updates among topic loads


# ---- the probe (its own process, so the benchmark driver's GIL never delays it) --------------------

def probe(hosts: str, rate: float, duration: float, warmup: float, out: Path) -> None:
    client = zkutil.connect(hosts, timeout=30)
    root = "/probe"
    paths = [f"{root}/persistent/topic-{i}" for i in range(PROBE_ZNODES)]
    for path in paths:
        client.ensure_path(path)
        client.set(path, os.urandom(PROBE_BYTES))
    interval = 1.0 / rate
    latencies: list[tuple[str, float]] = []
    started = time.perf_counter()
    next_at = started
    i = 0
    while True:
        now = time.perf_counter()
        if now - started >= warmup + duration:
            break
        if now < next_at:
            time.sleep(next_at - now)
        path = paths[i % PROBE_ZNODES]
        write = i % WRITE_EVERY == WRITE_EVERY - 1
        t0 = time.perf_counter()
        if write:
            client.set(path, os.urandom(PROBE_BYTES))
        else:
            client.get(path)
        t1 = time.perf_counter()
        if t0 - started >= warmup:
            latencies.append(("write" if write else "read", (t1 - t0) * 1000.0))
        i += 1
        next_at += interval
        if next_at < t1 - 1.0:  # fell far behind (a stall): do not fire a burst to catch up
            next_at = t1
    zkutil.close(client)
    out.write_text(json.dumps(latencies))


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def summarize(latencies: list[tuple[str, float]]) -> dict[str, float]:
    """All operations, and reads apart: a write's latency includes the server's fsync, which other work on a
    shared disk disturbs far more than any reader could; reads show what the scan does to the server."""
    every = [ms for _, ms in latencies]
    reads = [ms for kind, ms in latencies if kind == "read"]
    writes = [ms for kind, ms in latencies if kind == "write"]
    return {"ops": len(every), "p50": statistics.median(every), "p99": _p99(every), "max": max(every),
            "read_p50": statistics.median(reads), "read_p99": _p99(reads), "write_p99": _p99(writes)}


def run_probe(hosts: str, rate: float, duration: float, warmup: float, work: Path, name: str,
              cpus: set[int] | None, priority: int) -> subprocess.Popen:
    out = work / f"probe-{name}.json"
    proc = subprocess.Popen([sys.executable, __file__, "--probe", hosts, "--rate", str(rate), "--duration",
                             str(duration), "--warmup", str(warmup), "--out", str(out)])
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    if priority:
        renice(proc.pid, priority)
    return proc


def renice(pid: int, priority: int) -> None:
    """Every thread of `pid` (niceness is per thread on Linux: a JVM's threads each need it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(PermissionError, ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(tid), priority)


# ---- the load: the snapshot's scan ------------------------------------------------------------------

def _target(cfg: SweeperConfig, sessions: int) -> Any:
    from datetime import UTC, datetime

    from sweeper.connections import ZooKeeperEndpoint
    from sweeper.runs import new_run_id
    from sweeper.snapshot import ScanTarget

    return ScanTarget(
        bookkeeper=ZooKeeperEndpoint(cfg.bookkeeper.zookeeper, 30.0), ledgers_root=cfg.bookkeeper.ledgers_root,
        pulsar=ZooKeeperEndpoint(cfg.pulsar_zookeeper, 30.0), ml_root=cfg.pulsar.managed_ledgers_root,
        schemas_root=cfg.pulsar.schemas_root, window=cfg.scan.window,
        multi_read=cfg.scan.multi_read, run_id=new_run_id(), captured_at=datetime.now(UTC),
        reads_per_task=cfg.scan.reads_per_second / sessions)


def spark_loop(spark: Any, cfg: SweeperConfig, stop: threading.Event, stats: dict[str, float]) -> None:
    """The snapshot's scan stage as Spark runs it, again and again."""
    from sweeper.snapshot import STAT_READS, SnapshotSettings, plan_tasks, scan_dataframe, scan_sessions
    from sweeper.snapshot.scanners import _counts

    tasks = plan_tasks(SnapshotSettings.from_config(cfg)).tasks
    sessions = scan_sessions(spark, SnapshotSettings.from_config(cfg), len(tasks))
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            counts = _counts(scan_dataframe(spark, SnapshotSettings.from_config(cfg), _target(cfg, sessions), tasks))
        except Exception:
            if stop.is_set():  # cancelled at the end of the measurement
                return
            raise
        stats["reads"] += counts.get(STAT_READS, 0)
        stats["seconds"] += time.monotonic() - t0


def task_worker(cfg: SweeperConfig, sessions: int, units: list[tuple[str, str]], stop_file: str,
                result_file: str) -> None:
    """One scan session: the scan task's own code (`_scan_partition`), over its share, again and again."""
    import pyarrow as pa

    from sweeper.snapshot import STAT_READS
    from sweeper.snapshot.scanners import _scan_partition

    batch = pa.RecordBatch.from_pydict({"kind": [k for k, _ in units], "payload": [p for _, p in units]})
    reads, started = 0, time.monotonic()
    while not os.path.exists(stop_file):
        for out in _scan_partition(_target(cfg, sessions), iter([batch])):
            kinds = out.column("record_type").to_pylist()
            if STAT_READS in kinds:
                reads += out.column("rows").to_pylist()[kinds.index(STAT_READS)]
    Path(result_file).write_text(json.dumps({"reads": reads, "seconds": time.monotonic() - started}))


def reads_worker(hosts: str, rate: float, multi_read: int, window: int, paths: list[str], stop_file: str,
                 result_file: str) -> None:
    """One scan session's reads (the wire reader with multiRead, paced as the scan paces them), no decoding."""
    from sweeper.ratelimit import TokenBucket
    from sweeper.zk.wire import WireReader

    reads, started = 0, time.monotonic()
    limiter = TokenBucket(rate) if rate > 0 else None
    with WireReader(hosts, timeout=30, multi_read=multi_read, limiter=limiter) as reader:
        while not os.path.exists(stop_file):
            for start in range(0, len(paths), 5000):
                for _ in reader.get_many(paths[start:start + 5000], window):
                    reads += 1
                if os.path.exists(stop_file):
                    break
    Path(result_file).write_text(json.dumps({"reads": reads, "seconds": time.monotonic() - started}))


def _run_workers(work: Path, stop: threading.Event, stats: dict[str, float], cpus: set[int] | None,
                 jobs: list[tuple[Any, tuple[Any, ...]]]) -> None:
    import multiprocessing

    stop_file = work / f"stop-{time.monotonic_ns()}"
    context = multiprocessing.get_context("fork")
    workers = []
    for i, (target, job_args) in enumerate(jobs):
        result = work / f"{stop_file.name}-{i}.json"
        proc = context.Process(target=target, args=(*job_args, str(stop_file), str(result)))
        proc.start()
        if cpus:
            os.sched_setaffinity(proc.pid, cpus)
        workers.append((proc, result))
    stop.wait()
    stop_file.touch()
    for proc, result in workers:
        proc.join()
        done = json.loads(result.read_text())
        stats["reads"] += done["reads"]
        stats["seconds"] = max(stats["seconds"], done["seconds"])


def reads_loop(cfg: SweeperConfig, paths: list[str], work: Path, stop: threading.Event, stats: dict[str, float],
               cpus: set[int] | None) -> None:
    sessions = cfg.scan.max_sessions
    rate = cfg.scan.reads_per_second / sessions
    _run_workers(work, stop, stats, cpus, [
        (reads_worker, (cfg.bookkeeper.zookeeper, rate, cfg.scan.multi_read, cfg.scan.window, paths[i::sessions]))
        for i in range(sessions)])


def tasks_loop(cfg: SweeperConfig, work: Path, stop: threading.Event, stats: dict[str, float],
               cpus: set[int] | None) -> None:
    """max_sessions processes, each a scan task with its share of the units, as Spark would deal them."""
    from sweeper.snapshot import SnapshotSettings, plan_tasks

    tasks = plan_tasks(SnapshotSettings.from_config(cfg)).tasks
    sessions = max(1, min(cfg.scan.max_sessions, len(tasks)))
    _run_workers(work, stop, stats, cpus, [(task_worker, (cfg, sessions, tasks[i::sessions]))
                                           for i in range(sessions)])


def measure(spark: Any, hosts: str, work: Path, name: str, args: argparse.Namespace,
            reads_per_second: float | None) -> dict[str, Any]:
    stats = {"reads": 0.0, "seconds": 0.0}
    stop = threading.Event()
    loader = None
    failures: list[BaseException] = []

    def guarded(target: Any, *load_args: Any) -> None:
        try:
            target(*load_args)
        except BaseException as exc:
            failures.append(exc)
            stop.set()

    if reads_per_second is not None:
        cfg = SweeperConfig().replace(bookkeeper={"zookeeper": hosts}, offload={"enabled": False},
                                      scan={"reads_per_second": reads_per_second})
        if args.load == "spark":
            loader = threading.Thread(target=guarded, args=(spark_loop, spark, cfg, stop, stats), daemon=True)
        elif args.load == "reads":
            loader = threading.Thread(target=guarded, daemon=True,
                                      args=(reads_loop, cfg, args.paths, work, stop, stats, args.sweeper_cpus))
        else:
            loader = threading.Thread(target=guarded, args=(tasks_loop, cfg, work, stop, stats, args.sweeper_cpus),
                                      daemon=True)
        loader.start()
        time.sleep(args.ramp)  # the scan is reading before the probe starts timing
    proc = run_probe(hosts, args.rate, args.duration, args.warmup, work, name, args.server_cpus, args.priority)
    proc.wait()
    if loader is not None:
        stop.set()
        if spark is not None:
            spark.sparkContext.cancelAllJobs()
        loader.join()
        if failures:
            raise RuntimeError(f"the load of run {name!r} failed") from failures[0]
    row = {"run": name, **summarize(json.loads((work / f"probe-{name}.json").read_text()))}
    row["scan_reads_per_s"] = stats["reads"] / stats["seconds"] if stats["seconds"] else None
    return row


def _median_row(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["scan_reads_per_s"] for r in rows if r["scan_reads_per_s"]]
    keys = ("p50", "p99", "max", "read_p50", "read_p99", "write_p99")
    return {"run": name, **{k: statistics.median(r[k] for r in rows) for k in keys},
            "scan_reads_per_s": statistics.median(rates) if rates else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds the probe is timed in each run")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--ramp", type=float, default=8.0, help="seconds the scan runs before the probe starts")
    parser.add_argument("--rate", type=float, default=200.0, help="probe operations per second")
    parser.add_argument("--limits", default="", help="extra [scan] reads_per_second values to measure, comma-separated")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the runs, interleaved; the table shows medians")
    parser.add_argument("--cpu-split", action="store_true",
                        help="ZooKeeper and the probe on the first CPU, the sweeper on the others (default: all share "
                             "every CPU, ZooKeeper and the probe at a raised priority). On two CPUs a split leaves "
                             "the sweeper one core, too little to load ZooKeeper at full speed")
    parser.add_argument("--load", choices=["reads", "tasks", "spark"], default="reads",
                        help="reads (default): the scan's reads (wire reader, multiRead, paced per session) from "
                             "max_sessions processes, without decoding, so that the sweeper's CPU is not what limits "
                             "the load; tasks: the scan task code itself (reads and decoding) in max_sessions "
                             "processes; spark: the Spark scan stage in local mode")
    parser.add_argument("--priority", type=int, default=-10,
                        help="nice value for ZooKeeper and the probe (0: unchanged), so that other work on a shared "
                             "machine disturbs the probe less")
    parser.add_argument("--work", default=None)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe, args.rate, args.duration, args.warmup, Path(args.out))
        return

    from sweeper.spark import get_spark

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-zk-impact-"))
    cluster = build_cluster(SandboxSpec(seed=1, topics=args.topics, max_rollovers=args.max_rollovers))
    # A real clock: libfaketime (the sandbox's settable clock) re-reads its file on every clock call, which
    # ZooKeeper makes per request; ages do not matter here, latency does.
    server = start_zookeeper(work / "zookeeper", heap="2g", fake_clock=False)
    cpus = sorted(os.sched_getaffinity(0))
    args.server_cpus = args.sweeper_cpus = None
    if args.cpu_split and len(cpus) >= 2:
        # ZooKeeper (and the probe) on one CPU, the sweeper on the rest, as on separate machines.
        args.server_cpus, args.sweeper_cpus = {cpus[0]}, set(cpus[1:])
        os.sched_setaffinity(server.pid, args.server_cpus)
        os.sched_setaffinity(0, args.sweeper_cpus)
    if args.priority:
        renice(server.pid, args.priority)
    root = SandboxSpec().ledgers_root
    args.paths = [ledger_path(root, i, LedgerLayout.HIERARCHICAL) for i in sorted(cluster.ledgers)]
    try:
        client = zkutil.connect(server.connect_string, timeout=60)
        seeded = seed_zookeeper(client, cluster)
        zkutil.close(client)
        print(f"seeded {seeded.znodes:,} znodes ({len(cluster.ledgers):,} ledgers); probe: {args.rate:.0f} ops/s "
              f"(1 write in {WRITE_EVERY}) on {PROBE_ZNODES} znodes of {PROBE_BYTES} B, {args.duration:.0f}s per run",
              flush=True)
        spark = None
        if args.load == "spark":
            spark = get_spark("bench-zk-impact")
            spark.sparkContext.setLogLevel("ERROR")
        default = ScanConfig().reads_per_second
        runs: list[tuple[str, float | None]] = [("no sweeper", None), ("snapshot, unlimited", 0.0),
                                                (f"snapshot, default limit {default:,.0f}/s", default)]
        runs += [(f"snapshot, limit {float(x):,.0f}/s", float(x)) for x in args.limits.split(",") if x.strip()]
        measured: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in runs}
        for round_no in range(args.rounds):
            for name, limit in runs:
                row = measure(spark, server.connect_string, work, f"{round_no}-{limit}", args, limit)
                row["run"] = name
                measured[name].append(row)
                print(json.dumps(row), flush=True)
        rows = [_median_row(name, measured[name]) for name, _ in runs]
        idle = rows[0]["p99"]
        idle_reads = rows[0]["read_p99"]
        print("\n| run | sweeper reads/s | probe p50 | probe p99 | probe max | p99 vs idle | read p50 | read p99 "
              "| read p99 vs idle | write p99 |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            rate = f"{row['scan_reads_per_s']:,.0f}" if row["scan_reads_per_s"] else "-"
            print(f"| {row['run']} | {rate} | {row['p50']:.2f} ms | {row['p99']:.2f} ms | {row['max']:.1f} ms | "
                  f"{row['p99'] / idle:.2f}x | {row['read_p50']:.2f} ms | {row['read_p99']:.2f} ms | "
                  f"{row['read_p99'] / idle_reads:.2f}x | {row['write_p99']:.2f} ms |")
    finally:
        stop_zookeeper(server)


if __name__ == "__main__":
    main()
