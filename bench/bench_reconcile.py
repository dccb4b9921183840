"""Reconcile speed and memory on a large snapshot, built straight from the sandbox model.

    .venv/bin/python bench/bench_reconcile.py --topics 100000 --max-rollovers 16 [--baseline-tree DIR]
    .venv/bin/python bench/bench_reconcile.py --topics 100000 --max-rollovers 16 --retention [--both-orders]

Seeding a million znodes through ZooKeeper only to read them back would measure the scan
again (bench_snapshot.py does that); here the snapshot tables are produced by the same row
builders the scan uses, from the model's encoded znodes, and committed to Delta. Then the real
reconcile runs and its wall time and the peak memory of the whole process tree are reported.

With `--baseline-tree DIR` (a checkout of an older commit, e.g. `git worktree add /tmp/old a06e5e9`),
that tree's reconcile runs on a copy of the same tables in a fresh process, and so does this tree's,
alternately: the ratio of the two is what this shared machine's load cannot blur.

With `--peer` a second cluster of the same size shares the bookies (issue 26): its model (the next seed, tenants
renamed `peer-tenant-*`, ledger ids shifted by 2^44 so the two never collide) adds its ledgers to this cluster's
`bk_ledgers` table and its references, owners and namespaces to `peer_references` through the snapshot's own
`references.peer_rows`, and `[safety] peer_metadata` names it. Reconcile without the peer (a dedicated
BookKeeper, as before) and with it run alternately in fresh processes, with the baseline tree's if one is given.

With `--jvm-defaults` this tree's reconcile also runs, alternately, in a JVM started with the JVM's own defaults
(tiered compilation up to C2, the G1 collector) in place of the options a local session gives its JVM
(`sweeper.spark.LOCAL_CONF`: C1 only, the parallel collector):

    .venv/bin/python bench/bench_reconcile.py --topics 100000 --max-rollovers 16 --jvm-defaults --rounds 3

With `--retention` the tables the retention-debt step reads beyond reconcile's are written too
(namespace policies through the scan's `namespace_policy_row`, bundle ownership), and after a small
warm-up run in the same Spark session the real `run_reconcile` and then `run_retention_debt` run on
the same tables: the ratio retention / reconcile is what the retention step adds to the reconcile
stage. `--both-orders` also runs them the other way round, on a copy of the pristine tables;
`--judge-all` once more with the step judging every topic (no topic left out by `retention.may_owe`),
the step's cost when every topic may owe. The sandbox's regular namespaces keep data forever; with
`--regular-retention default` (no policy: Pulsar's default 0/0 applies) or `--regular-retention MIN,MB`
they trim, as on most clusters, and whichever of their topics `may_owe` lets through are judged.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kazoo.protocol.states import ZnodeStat
from pyspark.sql.pandas.types import to_arrow_schema

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import (
    LEDGER_EPOCH_DAYS,
    cursor_info_bytes,
    ledger_znode_data,
    managed_ledger_info_bytes,
    offload_object_metadata,
    schema_locator_bytes,
)
from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.codecs.layout import ledger_path
from sweeper.codecs.pulsar import decode_schema_locator
from sweeper.config import SweeperConfig
from sweeper.objectstore.s3 import CLUSTER_NAME_KEY, MANAGED_LEDGER_NAME_KEY, parse_offload_key
from sweeper.reconcile.stage import SafetySettings, run_reconcile
from sweeper.retention.debt import run_retention_debt
from sweeper.retention.debt_types import RetentionSettings
from sweeper.rules.safety import CircuitBreaker
from sweeper.runs import record as record_run
from sweeper.scan import as_rows
from sweeper.scan import bookkeeper as bk_scan
from sweeper.scan import pulsar as pulsar_scan
from sweeper.snapshot import namespace_policy_row
from sweeper.spark import get_spark
from sweeper.table_schemas import SNAPSHOT_TABLES
from sweeper.tables import open_table_store


class PeakMemory:
    """Peak RSS of this process and its children (the Spark JVM and Python workers)."""

    def __init__(self, root: psutil.Process | None = None) -> None:
        self.root = root or psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = self.root
        while not self._stop.is_set():
            total = 0
            try:
                tree = [me, *me.children(recursive=True)]
            except psutil.Error:  # the root or a child exited while listing
                tree = [me]
            for proc in tree:
                with contextlib.suppress(psutil.Error):  # a worker may exit between listing and reading
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)
            time.sleep(0.2)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def snapshot_rows(cluster: Any, run_id: str, captured_at: datetime) -> dict[str, list[dict[str, Any]]]:
    spec = cluster.spec
    now = spec.now_ms
    def stat(mtime_ms: int | None) -> ZnodeStat:  # topics unloaded / cursors idle since then keep that mtime
        return ZnodeStat(1, 1, now, mtime_ms if mtime_ms is not None else now, 0, 0, 0, 0, 0, 0, 1)
    # Ledger znodes are created with their ledgers, before the metadata's ctime (as the sandbox seeds them).
    znode_ctime = now - LEDGER_EPOCH_DAYS * 86_400_000
    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in SNAPSHOT_TABLES}
    rows: list[dict[str, Any]] = [{"record_type": "namespaces", "namespace": ns, "sources": ["policies"]}
                                  for ns in cluster.namespaces]
    for ledger in cluster.ledgers.values():
        path = ledger_path(spec.ledgers_root, ledger.ledger_id, spec.layout)
        md = decode_ledger_metadata(ledger_znode_data(ledger))
        rows.append(bk_scan.ledger_row(path, ledger.ledger_id, "short", md, 0, znode_ctime, znode_ctime))
    for ml in cluster.managed_ledgers:
        path = f"{spec.managed_ledgers_root}/{ml.name}"
        rows += as_rows(pulsar_scan.managed_ledger_rows(ml.name, path, managed_ledger_info_bytes(ml),
                                                        stat(ml.zk_mtime_ms), len(ml.cursors)))
        for cursor in ml.cursors:
            rows += pulsar_scan.cursor_rows(ml.name, cursor.znode_name, f"{path}/{cursor.znode_name}",
                                            cursor_info_bytes(cursor, "NONE"), stat(cursor.zk_mtime_ms))
    for locator in cluster.schemas:
        decoded = decode_schema_locator(schema_locator_bytes(locator))
        rows += pulsar_scan.schema_rows(locator.schema_id, f"{spec.schemas_root}/{locator.schema_id}", 0, decoded)
    # The configuration store's policies as the sandbox seeds them (seed.cluster_znodes), parsed as the scan does.
    default_policies = json.dumps({"replication_clusters": [spec.cluster_name], "deleted": False}).encode()
    for ns in cluster.namespaces:
        policies = cluster.namespace_policies.get(ns, default_policies)
        if policies is not None:
            rows.append(namespace_policy_row(ns, policies, 0))
    rows += bundle_owner_rows(cluster.namespaces)
    rows += offload_object_rows(cluster, now)
    for row in rows:
        table = row.pop("record_type")
        row["run_id"], row["captured_at"] = run_id, captured_at
        tables[table].append(row)
    return tables


def offload_object_rows(cluster: Any, now_ms: int) -> list[dict[str, Any]]:
    """What the snapshot's S3 listing (offload.list_offload_objects) makes of the objects the sandbox uploads,
    without uploading them: reconcile verifies an offloaded copy against these before it lets a BookKeeper
    copy go, so without them every released ledger would be `offloaded_copy_not_verified`."""
    rows = []
    for obj in cluster.offload_objects:
        parsed = parse_offload_key(obj.key)
        metadata = {k.lower(): v for k, v in offload_object_metadata(obj).items()}
        rows.append({"record_type": "offload_objects", "bucket": obj.bucket, "key": obj.key, "uuid": parsed.uuid,
                     "ledger_id": parsed.ledger_id, "role": parsed.role, "size": 16,
                     "last_modified_ms": now_ms - LEDGER_EPOCH_DAYS * 86_400_000, "metadata_role": metadata.get("role"),
                     "managed_ledger": metadata.get(MANAGED_LEDGER_NAME_KEY),
                     "cluster_name": metadata.get(CLUSTER_NAME_KEY), "metadata_read": True})
    return rows


def bundle_owner_rows(namespaces: list[str], bundles: int = 4) -> list[dict[str, Any]]:
    """What scan.ownership reads from a cluster whose brokers own every other namespace's bundles (the sandbox
    has no brokers): four bundles a namespace, so the step hashes every topic of the owned namespaces."""
    step = 0x100000000 // bundles
    rows = []
    for i, ns in enumerate(namespaces):
        if i % 2:
            continue
        for b in range(bundles):
            lower, upper = b * step, min((b + 1) * step, 0xFFFFFFFF)
            rows.append({"record_type": "bundle_owners", "namespace": ns, "bundle": f"0x{lower:08x}_0x{upper:08x}",
                         "lower": lower, "upper": upper, "ephemeral": True, "owner": "pulsar://broker-0:6650"})
    return rows


def write_snapshot(spark: Any, root: Path, cluster: Any, run_id: str, captured_at: datetime) -> dict[str, int]:
    return write_tables(spark, root, snapshot_rows(cluster, run_id, captured_at), run_id, captured_at)


def write_tables(spark: Any, root: Path, tables: dict[str, list[dict[str, Any]]], run_id: str,
                 captured_at: datetime) -> dict[str, int]:
    store = open_table_store(str(root), spark, engine="delta-rs")
    counts = {}
    for table, rows in tables.items():
        schema = SNAPSHOT_TABLES[table]
        arrow = pa.Table.from_pylist(rows, schema=to_arrow_schema(schema, timezone="UTC"))
        store.append(table, spark.createDataFrame(arrow, schema=schema).repartition(8), schema)
        counts[table] = len(rows)
    record_run(store, run_id, "snapshot", "succeeded", captured_at, counts, SweeperConfig())
    return counts


PEER = "peer"  # the peer's name in [safety] peer_metadata and in its peer_references rows
PEER_LEDGER_OFFSET = 1 << 44  # above every id the model draws (its long ids start at 2^31)
_LEDGER_ID_COLUMNS = ("ledger_id", "cursors_ledger_id", "mark_delete_ledger_id")


def as_peer(tables: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """A model's snapshot rows as another cluster's: its own tenants and ledger ids (the model always names
    its tenants tenant-N and draws ids from the same ranges)."""
    def rename(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("tenant-", "peer-tenant-")
        if isinstance(value, list):
            return [rename(v) for v in value]
        return value
    out: dict[str, list[dict[str, Any]]] = {}
    for table, rows in tables.items():
        renamed = []
        for row in rows:
            row = {key: rename(value) for key, value in row.items()}
            for column in _LEDGER_ID_COLUMNS:
                if isinstance(row.get(column), int) and row[column] >= 0:
                    row[column] += PEER_LEDGER_OFFSET
            renamed.append(row)
        out[table] = renamed
    return out


def add_peer(spark: Any, work: Path, tables_root: Path, peer_tables: dict[str, list[dict[str, Any]]],
             run_id: str, captured_at: datetime) -> dict[str, int]:
    """The peer's ledgers join this cluster's `bk_ledgers` (the bookies are shared) and its snapshot, scanned as
    snapshot_peers stores it, fills `peer_references`."""
    from sweeper.rules.references import PEER_NAMESPACE, PEER_READ, peer_rows
    from sweeper.snapshot import PEER_TABLES
    from sweeper.table_schemas import PEER_REFERENCES

    peer_root = work / "peer-snapshot"
    write_tables(spark, peer_root, peer_tables, run_id, captured_at)
    peer_store = open_table_store(str(peer_root), spark, engine="delta-rs")
    store = open_table_store(str(tables_root), spark, engine="delta-rs")
    store.append("bk_ledgers", peer_store.read("bk_ledgers"), SNAPSHOT_TABLES["bk_ledgers"])
    columns = ("cluster", "kind", "ledger_id", "ref_kind", "owner", "referrer")
    notes = [(PEER, PEER_READ, None, None, None, None)]
    notes += [(PEER, PEER_NAMESPACE, None, None, row["namespace"], None) for row in peer_tables["namespaces"]]
    rows = spark.createDataFrame(notes, "cluster string, kind string, ledger_id long, ref_kind string, "
                                        "owner string, referrer string")
    rows = rows.unionByName(peer_rows({t: peer_store.read(t) for t in PEER_TABLES}, PEER))
    from pyspark.sql import functions as F
    rows = rows.select(F.lit(run_id).alias("run_id"), F.lit(captured_at).cast("timestamp").alias("captured_at"),
                       *columns)
    store.append("peer_references", rows, PEER_REFERENCES)
    shutil.rmtree(peer_root, ignore_errors=True)
    return {"peer_ledgers": len(peer_tables["bk_ledgers"]),
            "peer_references": store.read("peer_references").count()}


def timed_stages(spark: Any, root: Path, run_id: str, cluster_name: str, order: tuple[str, ...],
                 judge_all: bool = False) -> dict[str, float]:
    """Wall seconds of each stage, run in `order` on the tables at `root`; `judge_all`: the retention step
    without skipping the topics that cannot owe (as on a cluster where no namespace keeps data forever)."""
    store = open_table_store(str(root), spark, engine="delta-rs")
    config = SweeperConfig()
    walls: dict[str, float] = {}
    for stage in order:
        t = time.monotonic()
        if stage == "reconcile":
            result = run_reconcile(spark, store, run_id,
                                   SafetySettings(breaker=CircuitBreaker(1.0), local_cluster=cluster_name,
                   bookkeeper_dedicated=True))
        else:  # as pipeline.retention_stage builds its settings ([retention] topic_policies = "system_topic")
            settings = RetentionSettings.from_config(config)
            if judge_all:
                settings = dataclasses.replace(settings, skip_topics_that_cannot_owe=False)
            result = run_retention_debt(spark, store, run_id, settings)
        walls[stage] = time.monotonic() - t
        print(f"  {stage}: {walls[stage]:.1f}s wall; {result.counts}", flush=True)
    return walls


def retention_bench(spark: Any, work: Path, cluster: Any, run_id: str, captured_at: datetime,
                    both_orders: bool, judge_all: bool) -> None:
    # Warm-up on a small model in the same session: JIT, Python workers and imports are then paid for.
    small = build_cluster(SandboxSpec(seed=2, topics=200, max_rollovers=4))
    write_snapshot(spark, work / "warmup", small, run_id, captured_at)
    print("warm-up (200 topics):", flush=True)
    timed_stages(spark, work / "warmup", run_id, small.spec.cluster_name, ("reconcile", "retention_debt"))
    orders = [("reconcile", "retention_debt", False)]
    orders += [("retention_debt", "reconcile", False)] if both_orders else []
    orders += [("reconcile", "retention_debt", True)] if judge_all else []
    ratios = []
    for i, (*order, all_topics) in enumerate(orders):
        root = work / f"tables-{i}"
        shutil.copytree(work / "tables", root)
        print(f"order {' then '.join(order)}{' (judging every topic)' if all_topics else ''}:", flush=True)
        walls = timed_stages(spark, root, run_id, cluster.spec.cluster_name, tuple(order), all_topics)
        ratio = walls["retention_debt"] / walls["reconcile"]
        ratios.append(ratio)
        print(f"reconcile {walls['reconcile']:.1f}s, retention debt {walls['retention_debt']:.1f}s: "
              f"retention / reconcile = {ratio:.1%}", flush=True)
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()}")


def regular_retention_arg(text: str) -> tuple[int, int] | None:
    if text == "forever":
        return (-1, -1)
    if text == "default":
        return None
    minutes, size_mb = (int(x) for x in text.split(","))
    return (minutes, size_mb)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline-tree", default="", help="an older checkout to compare with, same tables")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per tree with --baseline-tree")
    parser.add_argument("--jvm-defaults", action="store_true",
                        help="also run this tree with the JVM's default compiler and collector, alternately")
    parser.add_argument("--peer", action="store_true",
                        help="also reconcile with a peer cluster of the same size on the same bookies")
    parser.add_argument("--retention", action="store_true", help="time retention debt against reconcile")
    parser.add_argument("--both-orders", action="store_true", help="with --retention: also retention first")
    parser.add_argument("--judge-all", action="store_true",
                        help="with --retention: also a run that skips no topic before the shuffle")
    parser.add_argument("--regular-retention", default="forever",
                        help="the regular namespaces' retention: forever (-1/-1, the sandbox's), default (not set: "
                             "the broker's 0/0), or MINUTES,MB")
    args = parser.parse_args()
    regular_retention = regular_retention_arg(args.regular_retention)

    work = Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    t = time.monotonic()
    cluster = build_cluster(SandboxSpec(seed=args.seed, topics=args.topics, max_rollovers=args.max_rollovers,
                                        regular_retention=regular_retention))
    print(f"model: {len(cluster.ledgers):,} ledgers, {len(cluster.managed_ledgers):,} managed ledgers "
          f"({time.monotonic() - t:.0f}s)", flush=True)
    spark = get_spark("bench-reconcile")
    run_id, captured_at = "bench", datetime.fromtimestamp(cluster.spec.now_ms / 1000, UTC)
    cluster_name = cluster.spec.cluster_name
    t = time.monotonic()
    counts = write_snapshot(spark, work / "tables", cluster, run_id, captured_at)
    print(f"snapshot tables written: {counts} ({time.monotonic() - t:.0f}s)", flush=True)
    if args.retention:
        retention_bench(spark, work, cluster, run_id, captured_at, args.both_orders, args.judge_all)
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
        return
    if args.baseline_tree or args.peer or args.jvm_defaults:
        here = Path(__file__).resolve().parents[1]
        variants: list[Variant] = [("current", here, work / "tables", False, {})]
        if args.baseline_tree:
            variants.append(("baseline", Path(args.baseline_tree).resolve(), work / "tables", False, {}))
        if args.jvm_defaults:
            # pyspark hands PYSPARK_SUBMIT_ARGS to spark-submit after the session's own --conf settings, so the
            # driver's Java options given here take the place of LOCAL_CONF's.
            variants.append(("current, JVM defaults", here, work / "tables", False, {"PYSPARK_SUBMIT_ARGS": (
                "--driver-java-options='-XX:TieredStopAtLevel=4 -XX:+UseG1GC' pyspark-shell")}))
        if args.peer:
            t = time.monotonic()
            peer_model = build_cluster(SandboxSpec(seed=args.seed + 1, topics=args.topics,
                                                   max_rollovers=args.max_rollovers, cluster_name=PEER,
                                                   regular_retention=regular_retention))
            peer_tables = as_peer(snapshot_rows(peer_model, run_id, captured_at))
            del peer_model
            shutil.copytree(work / "tables", work / "tables-peer")
            added = add_peer(spark, work, work / "tables-peer", peer_tables, run_id, captured_at)
            del peer_tables
            print(f"peer added: {added} ({time.monotonic() - t:.0f}s)", flush=True)
            variants.append(("current+peer", variants[0][1], work / "tables-peer", True, {}))
        spark.stop()
        expected = sum(1 for x in cluster.ledgers.values() if x.status.value == "orphan")
        del cluster
        compare(variants, cluster_name, args.rounds, expected)
        shutil.rmtree(work, ignore_errors=True)
        return

    store = open_table_store(str(work / "tables"), spark, engine="delta-rs")
    settings = SafetySettings(breaker=CircuitBreaker(1.0), local_cluster=cluster.spec.cluster_name,
                              bookkeeper_dedicated=True)
    with PeakMemory() as memory:
        t = time.monotonic()
        result = run_reconcile(spark, store, run_id, settings)
        wall = time.monotonic() - t
    print(f"reconcile: {wall:.1f}s wall, peak RSS (driver + JVM + workers) {memory.peak / 2**30:.2f} GiB")
    print(f"  counts: {result.counts}")
    expected = sum(1 for x in cluster.ledgers.values() if x.status.value == "orphan")
    print(f"  candidates {result.counts.candidate:,} (ground truth {expected:,})")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


# Runs one tree's reconcile on a table root; prints its wall time and candidate count as JSON.
_RECONCILE_IN_TREE = """
import inspect, json, sys, time
sys.path.insert(0, sys.argv[1])
from sweeper.reconcile.stage import SafetySettings, run_reconcile
from sweeper.rules.safety import CircuitBreaker
from sweeper.spark import get_spark
from sweeper.tables import open_table_store
spark = get_spark("bench-reconcile-tree")
store = open_table_store(sys.argv[2], spark, engine="delta-rs")
kwargs = {"breaker": CircuitBreaker(1.0)}
if "local_cluster" in inspect.signature(SafetySettings).parameters:
    kwargs["local_cluster"] = sys.argv[3]
if sys.argv[4]:  # the peers sharing the bookies, as [safety] peer_metadata names them
    kwargs["bookkeeper_dedicated"] = False
    kwargs["peer_metadata"] = tuple(sys.argv[4].split(","))
elif "bookkeeper_dedicated" in inspect.signature(SafetySettings).parameters:
    kwargs["bookkeeper_dedicated"] = True
t = time.monotonic()
result = run_reconcile(spark, store, "bench", SafetySettings(**kwargs))
print(json.dumps({"wall": time.monotonic() - t, "counts": result.counts.as_row()}))
spark.stop()
"""


Variant = tuple[str, Path, Path, bool, dict[str, str]]  # label, source tree, tables, with the peer, environment


def compare(variants: list[Variant], cluster_name: str, rounds: int, expected: int) -> None:
    """Each variant (label, source tree, tables, with the peer, environment added) reconciles a fresh copy of its
    tables in a fresh process, round after round, alternating: the ratios are what this shared machine's load cannot
    blur."""
    walls: dict[str, list[float]] = {label: [] for label, *_ in variants}
    for round_ in range(rounds):
        for index, (label, tree, tables, with_peer, extra_env) in enumerate(variants):
            copy = tables.parent / f"run-{index}-{round_}"
            shutil.copytree(tables, copy)
            env = {**os.environ, "PYTHONPATH": str(tree), **extra_env}
            proc = subprocess.Popen([sys.executable, "-c", _RECONCILE_IN_TREE, str(tree), str(copy), cluster_name,
                                     PEER if with_peer else ""],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                    cwd=tree)
            with PeakMemory(psutil.Process(proc.pid)) as memory:
                out, _ = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{label} reconcile failed in {tree}")
            got = json.loads(out.strip().splitlines()[-1])
            walls[label].append(got["wall"])
            counts = got["counts"]
            print(f"{label} ({tree}): {got['wall']:.1f}s wall, {counts.get('candidate', 0):,} candidates "
                  f"(ground truth of this cluster {expected:,}), peak RSS {memory.peak / 2**30:.2f} GiB; "
                  f"{counts}", flush=True)
            shutil.rmtree(copy, ignore_errors=True)
    first = variants[0][0]
    best = {label: min(w) for label, w in walls.items()}
    for label, wall in best.items():
        print(f"{label} / {first} (best of {rounds}): {wall:.1f}s / {best[first]:.1f}s = {wall / best[first]:.2f}x")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
