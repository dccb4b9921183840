"""Delete speed: N orphan ledgers through the real delete stage vs one synchronous `delete` per ledger.

    .venv/bin/python bench/bench_delete.py --orphans 100000

A private ZooKeeper is seeded with N orphan ledgers, half dropped from the lists of live topics
(whose managed ledger, live ledgers and a cursor exist, so every delete re-reads a real
referrer) and half left by deleted topics, plus a copy of the ledger znodes for the baseline.
Ours: `sweeper.delete.stage.run_delete(execute=True)` on the `emitted` records (Spark tasks,
re-verification of ledger and referrers, compare-and-set multi deletes, empty-parent cleanup,
the Delta commit of the results). Baseline: one kazoo `delete(path)` per ledger, no checks, on
the first `--baseline` ledgers of the copy; the two are compared as ledgers per second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kazoo.client import KazooClient

from harness.zkserver import start_zookeeper, stop_zookeeper
from sweeper.codecs import pending_delete
from sweeper.codecs import pulsar as codec
from sweeper.codecs.bookkeeper import LedgerMetadata, Segment, encode_ledger_metadata
from sweeper.codecs.layout import LedgerLayout, layout_znode, ledger_path
from sweeper.config import PulsarMetadataConfig, SweeperConfig
from sweeper.delete.stage import run_delete
from sweeper.runs import record as record_run
from sweeper.spark import get_spark
from sweeper.table_schemas import EMITTED, SNAPSHOT_TABLES
from sweeper.tables import open_table_store
from sweeper.zk import client as zkutil

PER_TOPIC = 10
OLD_MS = int(time.time() * 1000) - 30 * 86_400_000


def ledger_bytes(ml_name: str) -> bytes:
    md = LedgerMetadata(
        format_version=3, ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, last_entry_id=99, length=1 << 20,
        state="CLOSED", digest_type="CRC32C", password=b"", ctime=OLD_MS, ctoken=None,
        segments=(Segment(0, ("b1:3181", "b2:3181", "b3:3181")),),
        custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                         "pulsar/managed-ledger": ml_name.encode()})
    return encode_ledger_metadata(md)


def create_many(client: KazooClient, items: list[tuple[str, bytes]]) -> None:
    for start in range(0, len(items), 200):
        tx = client.transaction()
        for path, data in items[start:start + 200]:
            tx.create(path, data)
        results = tx.commit()
        bad = [r for r in results if isinstance(r, Exception)]
        if bad:
            raise RuntimeError(f"seeding failed: {bad[0]!r}")


def seed(client: KazooClient, orphans: int) -> tuple[list[dict[str, object]], list[str]]:
    layout = LedgerLayout.HIERARCHICAL
    client.ensure_path("/ledgers")
    client.set("/ledgers", b"")
    client.create("/ledgers/LAYOUT", layout_znode(layout))
    topics = orphans // PER_TOPIC
    records: list[dict[str, object]] = []
    znodes: list[tuple[str, bytes]] = []
    mls: list[tuple[str, bytes]] = []
    next_id = 1
    for t in range(topics):
        name = f"bench/ns-{t % 20}/persistent/topic-{t}"
        live_topic = t % 2 == 0
        if live_topic:
            live_ids = [next_id, next_id + 1]
            next_id += 2
            for lid in live_ids:
                znodes.append((ledger_path("/ledgers", lid, layout), ledger_bytes(name)))
            info = codec.pb.ManagedLedgerInfo()
            for lid in live_ids:
                info.ledgerInfo.add(ledgerId=lid, entries=100, size=1 << 20, timestamp=OLD_MS)
            mls.append((f"/managed-ledgers/{name}", codec.encode_managed_ledger_info(info)))
            cursor = codec.pb.ManagedCursorInfo()
            cursor.cursorsLedgerId = live_ids[0]
            cursor.markDeleteLedgerId, cursor.markDeleteEntryId = live_ids[0], 5
            mls.append((f"/managed-ledgers/{name}/sub", codec.encode_managed_cursor_info(cursor)))
        for _ in range(PER_TOPIC):
            znodes.append((ledger_path("/ledgers", next_id, layout), ledger_bytes(name)))
            parts = name.split("/")
            records.append({"topicName": f"persistent://{parts[0]}/{parts[1]}/{parts[3]}",
                            "ledgerComponent": "MANAGED_LEDGER", "ledgerType": "LEDGER", "ledgerId": next_id,
                            "cursorName": None, "schemaId": None, "offloadContext": None, "properties": {},
                            "reason": "dropped_from_list" if live_topic else "topic_deleted", "runId": "bench"})
            next_id += 1
    # Parents first: every layout directory, then the znodes.
    dirs = sorted({p.rsplit("/", i)[0] for p, _ in znodes for i in (1, 2)} - {"/ledgers"}, key=lambda p: p.count("/"))
    create_many(client, [(d, b"") for d in dirs])
    create_many(client, znodes)
    for ns in sorted({n.rsplit("/", 2)[0] for n, _ in mls}):
        client.ensure_path(ns)
    create_many(client, [m for m in mls if not m[0].endswith("/sub")])
    create_many(client, [m for m in mls if m[0].endswith("/sub")])
    baseline = [f"/baseline/L{i}" for i in range(len(records))]
    client.ensure_path("/baseline")
    create_many(client, [(p, ledger_bytes("x")) for p in baseline])
    return records, baseline


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--orphans", type=int, default=100_000)
    parser.add_argument("--baseline", type=int, default=20_000)
    parser.add_argument("--tasks", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-delete-"))
    server = start_zookeeper(work / "zk")
    try:
        client = zkutil.connect(server.connect_string)
        t0 = time.monotonic()
        # Ledger znodes created when their ledgers were (their age is the later of the two clocks).
        assert server.clock is not None, "the benchmark needs the sandbox ZooKeeper's settable clock (libfaketime)"
        with server.clock.at(OLD_MS - 86_400_000):
            records, baseline = seed(client, args.orphans)
        print(f"seeded {len(records):,} orphans (+ live topics and a baseline copy) in {time.monotonic() - t0:.1f}s")

        spark = get_spark("bench-delete", master="local[2]", conf={"spark.sql.shuffle.partitions": "4"})
        cfg = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox")).replace(
            bookkeeper={"zookeeper": server.connect_string}, offload={"enabled": False},
            tables={"root": str(work / "tables"), "engine": "delta-rs"},
            delete={"max_deletes_per_run": len(records), "deletes_per_second": 1e9, "tasks": args.tasks},
            scan={"reads_per_second": 0.0},  # the permission check's reads, unpaced like the deletes
            # No broker runs here (the delete's liveness check would refuse), and no other cluster shares it.
            gates={"require_live_brokers": False}, safety={"bookkeeper_dedicated": True})
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        now = datetime.now(UTC)
        store.append_rows("emitted", [{
            "run_id": "bench", "emitted_at": now, "record_key": pending_delete.record_key(r),
            "ledger_id": r["ledgerId"], "ledger_type": "LEDGER", "component": "MANAGED_LEDGER",
            "topic_name": r["topicName"], "topic_partition": 0, "producer_name": "bench", "sequence_id": i,
            "message_id": f"0:{i}:-1", "status": "published", "payload": pending_delete.encode(r)}
            for i, r in enumerate(records)], EMITTED)
        record_run(store, "bench", "emit", "succeeded", now, {}, cfg)
        # A snapshot was taken (the delete refuses to run without one: it names the shadow topics); none here.
        store.append("managed_ledgers", spark.createDataFrame([], SNAPSHOT_TABLES["managed_ledgers"]),
                     SNAPSHOT_TABLES["managed_ledgers"])
        store.read("emitted").count()  # warm: in a sweep, delete runs right after emit in the same session

        t0 = time.monotonic()
        result = run_delete(spark, cfg, store, "bench", execute=True)
        ours_s = time.monotonic() - t0
        assert result.counts.deleted == len(records), result.counts
        ours_rate = len(records) / ours_s
        left = client.get_children("/ledgers")
        print(f"ours: {len(records):,} deleted in {ours_s:.1f}s = {ours_rate:,.0f} ledgers/s "
              f"(re-verified, compare-and-set; layout dirs left: {len(left) - 1})")

        t0 = time.monotonic()
        for path in baseline[: args.baseline]:
            client.delete(path)
        base_s = time.monotonic() - t0
        base_rate = args.baseline / base_s
        print(f"baseline: {args.baseline:,} sync deletes in {base_s:.1f}s = {base_rate:,.0f} ledgers/s (no checks)")
        print(f"ratio: {ours_rate / base_rate:.1f}x")
        zkutil.close(client)
        spark.stop()
    finally:
        stop_zookeeper(server)


if __name__ == "__main__":
    main()
