"""The whole sweep on a multi-process Spark standalone cluster, at several sizes, memory per process.

    .venv/bin/python bench/bench_cluster.py --topics 25000,50000,100000 --max-rollovers 16 --tables s3

For each size: a private ZooKeeper (4 GiB heap) seeded with the sandbox model, the local Pulsar
endpoint, and (with `--tables s3`) moto's S3 server holding the tables; then the production path,
`spark-submit.sh sweep --until delete --execute`, against a standalone master with two workers
(one core each) started once from pyspark's launch classes. The engine is what `auto` picks under
spark-submit with the fetched jars: delta-spark.

Measured per stage (stage boundaries from the driver's own progress lines):
- wall time (the stage's own `seconds`);
- peak RSS of the driver JVM, of the driver's Python process, and of each executor (its JVM plus
  its Python workers), sampled every 250 ms;
- peak live heap of every JVM: the largest heap-after-GC in its `-Xlog:gc` log while the stage ran.
  RSS follows the heap's committed size, which the JVM grows lazily up to -Xmx; the heap left after
  a collection is what the process actually holds, so its slope over sizes is what says whether
  something grows with the data.

The run passes the safety gates as a production run must: the local Pulsar endpoint registers itself
as a live broker under /loadbalance/brokers (liveness), `[pulsar] cluster_name` is the model's, and
the sandbox ZooKeeper's settable clock (libfaketime) is set back while seed_zookeeper writes the
ledger znodes, so each znode is older than its ledger's metadata ctime. The scan runs at the default
`[scan] reads_per_second`, as a production run would. Sizes: about 10 ledgers per topic with
--max-rollovers 16, so 25,000 / 50,000 / 100,000 topics are about 250k / 500k / 1M ledgers (each
size prints its own count).

Tiered storage (offloaded objects) is off, as in bench_sweep.py: moto takes milliseconds per
object and the model has ~200,000 of them at 1M ledgers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3
import psutil

from harness.s3server import start_s3, stop_s3
from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.pulsar import start_pulsar, stop_pulsar
from harness.sandbox.seed import seed_zookeeper
from harness.spark_standalone import StandaloneCluster, start_cluster, stop_cluster
from harness.zkserver import free_port, start_zookeeper, stop_zookeeper
from sweeper.codecs.layout import ledger_path
from sweeper.zk import client as zkutil

REPO = Path(__file__).resolve().parents[1]
STAGES = ("snapshot", "reconcile", "emit", "delete")
AWS_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1"}
GIB = 1 << 30
MIB = 1 << 20


@dataclass
class Sample:
    at: float
    driver_jvm: int
    driver_python: int
    executors: dict[str, int]  # worker name -> executor JVM + its Python workers


@dataclass
class Run:
    ledgers: int
    stage_seconds: dict[str, float] = field(default_factory=dict)
    stage_end: dict[str, float] = field(default_factory=dict)  # wall clock (time.time()) a stage finished
    started: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def _rss(pid: int) -> int:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).memory_info().rss
    return 0


def _sample(driver_pid: int, cluster: StandaloneCluster) -> Sample:
    driver_python = 0
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(driver_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "python" in child.name():
                    driver_python += child.memory_info().rss
    executors = {}
    for worker, procs in cluster.processes().items():
        executors[worker] = sum(_rss(pid) for pid, _ in procs)
    return Sample(time.time(), _rss(driver_pid), driver_python, executors)


def _stage_of(run: Run, at: float) -> str:
    for stage in STAGES:
        end = run.stage_end.get(stage)
        if end is None or at <= end:
            return stage
    return "after"


_GC_LINE = re.compile(r"^\[(?P<ts>[^\]]+)\].*Pause.*?(?P<before>\d+)M->(?P<after>\d+)M\((?P<size>\d+)M\)")


def _gc_peaks(path: Path, run: Run) -> dict[str, int]:
    """Largest heap-after-GC (MiB) per stage in one JVM's -Xlog:gc log (decorator `time`)."""
    peaks: dict[str, int] = {}
    if not path.exists():
        return peaks
    for line in path.read_text(errors="replace").splitlines():
        match = _GC_LINE.match(line)
        if not match:
            continue
        at = datetime.strptime(match["ts"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        if at < run.started:
            continue
        stage = _stage_of(run, at)
        peaks[stage] = max(peaks.get(stage, 0), int(match["after"]))
    return peaks


def run_size(topics: int, args: argparse.Namespace, cluster: StandaloneCluster, work: Path) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model = build_cluster(SandboxSpec(topics=topics, max_rollovers=args.max_rollovers))
    # What a correct sweeper deletes with this bench's config (no bucket listed): SandboxCluster.deletable.
    orphans = model.deletable(offloads_verified=False)
    server = start_zookeeper(work / "zk", heap="4g")
    # Registered under /loadbalance/brokers: the liveness gate refuses a run with no live broker.
    broker = start_pulsar(work / "pulsar", free_port(), free_port(), register_zookeeper=server.connect_string)
    s3 = start_s3(work / "moto") if args.tables == "s3" else None
    run = Run(len(model.ledgers))
    try:
        client = zkutil.connect(server.connect_string, timeout=60)
        seeded = seed_zookeeper(client, model)
        zkutil.close(client)
        print(f"\n== {len(model.ledgers):,} ledgers, {len(model.managed_ledgers):,} managed ledgers; "
              f"{seeded.znodes:,} znodes seeded in {time.monotonic() - t0:.0f}s; {len(orphans):,} orphans", flush=True)
        if s3 is not None:
            boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id="bench",
                         aws_secret_access_key="bench-secret").create_bucket(Bucket="bench-tables")
            tables = f'root = "s3://bench-tables/t{topics}"\ns3_endpoint = "{s3.endpoint}"'
        else:
            tables = f'root = "{work / "tables"}"'
        config = work / "bench.toml"
        config.write_text(f"""
[pulsar]
cluster_name = "{model.spec.cluster_name}"
[bookkeeper]
zookeeper = "{server.connect_string}"
session_timeout_s = 60.0
[tables]
{tables}
[offload]
enabled = false
[safety]
max_orphan_fraction = 0.25
bookkeeper_dedicated = true
[system_topic]
service_url = "{broker.service_url}"
admin_url = "{broker.admin_url}"
[delete]
max_deletes_per_run = 1000000
deletes_per_second = 1000000000.0
""")
        logs = work / "gc"
        logs.mkdir(exist_ok=True)
        gc_opts = "-Xlog:gc:file={}:time"
        extra = [f"--conf spark.driver.memory={args.driver_memory}",
                 f"--conf spark.executor.memory={args.executor_memory}", "--conf spark.executor.cores=1",
                 "--conf spark.ui.enabled=false",
                 f"--conf spark.driver.extraJavaOptions={gc_opts.format(logs / 'driver.log')}",
                 f"--conf spark.executor.extraJavaOptions={gc_opts.format(logs / 'executor-%p.log')}"]
        env = {**os.environ, **AWS_ENV, "SPARK_MASTER": cluster.master_url, "PYTHONUNBUFFERED": "1",
               "SPARK_SUBMIT": str(Path(sys.executable).parent / "spark-submit"), "PYSPARK_PYTHON": sys.executable,
               "SWEEPER_BUILD_DIR": str(work / "build"), "SPARK_EXTRA_ARGS": " ".join(extra), "PYTHONPATH": ""}
        stderr = open(work / "driver.stderr", "wb")  # noqa: SIM115 - closed below
        run.started = time.time()
        proc = subprocess.Popen([str(REPO / "spark-submit.sh"), "sweep", "--config", str(config), "--until", "delete",
                                 "--execute", "--json"], env=env, cwd=work, stdout=subprocess.PIPE, stderr=stderr,
                                text=True)
        stop = threading.Event()

        def sampler() -> None:
            while not stop.is_set():
                run.samples.append(_sample(proc.pid, cluster))
                time.sleep(0.25)

        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        assert proc.stdout is not None
        last = ""
        for line in proc.stdout:
            line = line.rstrip()
            for stage in STAGES:
                if line.startswith(f"[{stage}]"):
                    run.stage_end[stage] = time.time()
                    print(f"  {line[:150]}", flush=True)
            if line.startswith("{"):
                last = line
        proc.wait()
        stop.set()
        thread.join()
        stderr.close()
        if proc.returncode != 0 or not last:
            raise SystemExit(f"sweep failed with {proc.returncode}; see {work / 'driver.stderr'}")
        run.summary = json.loads(last)
        run.stage_seconds = {s: run.summary["stages"][s]["seconds"] for s in STAGES}
        deleted = run.summary["stages"]["delete"]["deleted"]
        client = zkutil.connect(server.connect_string, timeout=60)
        try:
            sample = sorted(orphans)[:: max(1, len(orphans) // 500)]  # spot-check ZooKeeper itself
            left = [i for i in sample if client.exists(ledger_path("/ledgers", i, model.spec.layout))]
        finally:
            zkutil.close(client)
        print(f"  deleted {deleted:,}; ground-truth orphans {len(orphans):,}; sampled orphans still present: "
              f"{len(left)}", flush=True)
        if deleted != len(orphans) or left:
            print(f"  MISMATCH: deleted {deleted:,} of {len(orphans):,} to delete, {len(left)} sampled still present "
                  "(bench_sweep.py checks by ledger id and names the causes)", flush=True)
        run.summary["table_bytes"] = _table_bytes(s3, topics, work)
        sizes = run.summary["table_bytes"]
        print(f"  tables: {sum(sizes.values()) / MIB:,.1f} MiB "
              f"({', '.join(f'{k} {v / MIB:,.1f}' for k, v in sorted(sizes.items()))})", flush=True)
        run.summary["gc"] = {"driver": _gc_peaks(logs / "driver.log", run),
                             "executors": {p.name: _gc_peaks(p, run) for p in sorted(logs.glob("executor-*.log"))}}
        run.summary["orphans"] = len(orphans)
        return run
    finally:
        if s3 is not None:
            stop_s3(s3)
        stop_pulsar(broker)
        stop_zookeeper(server)


def _table_bytes(s3: object, topics: int, work: Path) -> dict[str, int]:
    """Bytes per table after the run (data files and log), on S3 or on disk."""
    sizes: dict[str, int] = {}
    if s3 is not None:
        client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1",  # type: ignore[attr-defined]
                              aws_access_key_id="bench", aws_secret_access_key="bench-secret")
        for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench-tables", Prefix=f"t{topics}/"):
            for obj in page.get("Contents", []):
                table = obj["Key"].split("/")[1]
                sizes[table] = sizes.get(table, 0) + obj["Size"]
    else:
        for path in (work / "tables").rglob("*"):
            if path.is_file():
                table = path.relative_to(work / "tables").parts[0]
                sizes[table] = sizes.get(table, 0) + path.stat().st_size
    return sizes


def report(run: Run) -> dict:
    rows = {}
    for stage in STAGES:
        samples = [s for s in run.samples if _stage_of(run, s.at) == stage]
        workers = sorted({w for s in samples for w in s.executors})
        rows[stage] = {
            "seconds": run.stage_seconds[stage],
            "driver_jvm_rss_mib": max((s.driver_jvm for s in samples), default=0) // MIB,
            "driver_python_rss_mib": max((s.driver_python for s in samples), default=0) // MIB,
            "executor_rss_mib": {w: max((s.executors.get(w, 0) for s in samples), default=0) // MIB for w in workers},
            "driver_heap_after_gc_mib": run.summary["gc"]["driver"].get(stage, 0),
            "executor_heap_after_gc_mib": {n: g.get(stage, 0) for n, g in run.summary["gc"]["executors"].items()},
        }
    print(f"\n{run.ledgers:,} ledgers")
    print(f"{'stage':<10} {'s':>7} {'drv JVM RSS':>12} {'drv heap':>9} {'drv py RSS':>11}  executors (RSS / heap, MiB)")
    for stage, row in rows.items():
        execs = "  ".join(f"{w}: {rss}" for w, rss in row["executor_rss_mib"].items())
        heaps = "/".join(str(h) for h in row["executor_heap_after_gc_mib"].values())
        print(f"{stage:<10} {row['seconds']:>7.1f} {row['driver_jvm_rss_mib']:>12} "
              f"{row['driver_heap_after_gc_mib']:>9} {row['driver_python_rss_mib']:>11}  {execs}  heap {heaps}")
    return {"ledgers": run.ledgers, "orphans": run.summary["orphans"], "stages": rows,
            "counts": run.summary["stages"], "table_bytes": run.summary["table_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", default="25000,50000,100000", help="comma-separated sizes")
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--tables", choices=["s3", "local"], default="s3")
    parser.add_argument("--worker-memory", default="4g")
    parser.add_argument("--executor-memory", default="3g")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cluster = start_cluster(work / "spark", workers=2, cores=1, memory=args.worker_memory, env=AWS_ENV)
    results = []
    try:
        for topics in (int(t) for t in args.topics.split(",")):
            results.append(report(run_size(topics, args, cluster, work / f"t{topics}")))
    finally:
        stop_cluster(cluster)
    if len(results) > 1:
        xs = [r["ledgers"] for r in results]
        print("\nslopes per 100,000 ledgers (least squares over the sizes):")
        for key in ("driver_heap_after_gc_mib", "driver_python_rss_mib", "driver_jvm_rss_mib"):
            ys = [max(r["stages"][s][key] for s in STAGES) for r in results]
            print(f"  {key}: {_slope(xs, ys) * 100_000:+.1f} MiB  ({', '.join(map(str, ys))})")
        ys = [max(max(r["stages"][s]["executor_heap_after_gc_mib"].values(), default=0) for s in STAGES)
              for r in results]
        print(f"  executor heap after GC: {_slope(xs, ys) * 100_000:+.1f} MiB  ({', '.join(map(str, ys))})")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


def _slope(xs: list[int], ys: list[int]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


if __name__ == "__main__":
    main()
