"""Reconcile speed and memory on a large snapshot, built straight from the sandbox model.

    .venv/bin/python bench/bench_reconcile.py --topics 100000 --max-rollovers 16

Seeding a million znodes through ZooKeeper only to read them back would measure the scan
again (bench_snapshot.py does that); here the snapshot tables are produced by the same row
builders the scan uses, from the model's encoded znodes, and committed to Delta. Then the real
reconcile runs and its wall time and the peak memory of the whole process tree are reported.
"""

from __future__ import annotations

import argparse
import contextlib
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

from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.codecs.pulsar import decode_schema_locator
from sweeper.config import SweeperConfig
from sweeper.layout import ledger_path
from sweeper.reconcile import SafetySettings, run_reconcile
from sweeper.safety import CircuitBreaker
from sweeper.sandbox.model import SandboxSpec, build_cluster
from sweeper.sandbox.seed import (
    LEDGER_EPOCH_DAYS,
    cursor_info_bytes,
    ledger_znode_data,
    managed_ledger_info_bytes,
    schema_locator_bytes,
)
from sweeper.scan import bookkeeper as bk_scan
from sweeper.scan import pulsar as pulsar_scan
from sweeper.snapshot import record_run
from sweeper.spark import get_spark
from sweeper.table_schemas import SNAPSHOT_TABLES
from sweeper.tables import open_table_store


class PeakMemory:
    """Peak RSS of this process and its children (the Spark JVM and Python workers)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for proc in [me, *me.children(recursive=True)]:
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
    stat = ZnodeStat(1, 1, now, now, 0, 0, 0, 0, 0, 0, 1)
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
        rows += pulsar_scan.managed_ledger_rows(ml.name, path, managed_ledger_info_bytes(ml), stat, len(ml.cursors))
        for cursor in ml.cursors:
            rows += pulsar_scan.cursor_rows(ml.name, cursor.znode_name, f"{path}/{cursor.znode_name}",
                                            cursor_info_bytes(cursor, "NONE"), stat)
    for locator in cluster.schemas:
        decoded = decode_schema_locator(schema_locator_bytes(locator))
        rows += pulsar_scan.schema_rows(locator.schema_id, f"{spec.schemas_root}/{locator.schema_id}", 0, decoded)
    for row in rows:
        table = row.pop("record_type")
        row["run_id"], row["captured_at"] = run_id, captured_at
        tables[table].append(row)
    return tables


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--max-rollovers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    t = time.monotonic()
    cluster = build_cluster(SandboxSpec(seed=args.seed, topics=args.topics, max_rollovers=args.max_rollovers))
    print(f"model: {len(cluster.ledgers):,} ledgers, {len(cluster.managed_ledgers):,} managed ledgers "
          f"({time.monotonic() - t:.0f}s)", flush=True)
    spark = get_spark("bench-reconcile")
    store = open_table_store(str(work / "tables"), spark, engine="delta-rs")
    run_id, captured_at = "bench", datetime.fromtimestamp(cluster.spec.now_ms / 1000, UTC)
    t = time.monotonic()
    counts = {}
    for table, rows in snapshot_rows(cluster, run_id, captured_at).items():
        schema = SNAPSHOT_TABLES[table]
        arrow = pa.Table.from_pylist(rows, schema=to_arrow_schema(schema, timezone="UTC"))
        store.append(table, spark.createDataFrame(arrow, schema=schema).repartition(8), schema)
        counts[table] = len(rows)
    record_run(store, run_id, "snapshot", "succeeded", captured_at, counts, SweeperConfig())
    print(f"snapshot tables written: {counts} ({time.monotonic() - t:.0f}s)", flush=True)

    settings = SafetySettings(breaker=CircuitBreaker(1.0), local_cluster=cluster.spec.cluster_name)
    with PeakMemory() as memory:
        t = time.monotonic()
        result = run_reconcile(spark, store, run_id, settings)
        wall = time.monotonic() - t
    print(f"reconcile: {wall:.1f}s wall, peak RSS (driver + JVM + workers) {memory.peak / 2**30:.2f} GiB")
    print(f"  counts: {result.counts}")
    expected = sum(1 for x in cluster.ledgers.values() if x.status.value == "orphan")
    print(f"  candidates {result.counts.get('candidate', 0):,} (ground truth {expected:,})")
    spark.stop()


if __name__ == "__main__":
    main()
