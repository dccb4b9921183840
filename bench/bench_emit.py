"""Emit speed: N candidate records through the real emit stage vs one synchronous producer.

    .venv/bin/python bench/bench_emit.py --records 100000

Both sides talk to the same local endpoint (its own process, as in the sandbox) through the real
`pulsar-client`. Ours: `sweeper.emit.stage.run_emit` on an `orphans` table of N candidates (Spark
tasks, one producer per slot, batching, bounded in-flight). Baseline: one producer, batching
off, `send()` one record at a time waiting for each receipt; it runs on the first
`--baseline-records` records only (it is slow), and the two are compared as records per second.

`--persist-latency-ms` makes the endpoint hold each send receipt as long as a real cluster takes to
make a write durable (bookie journal fsync and replication to the ack quorum; a few ms). At 0 the
endpoint acknowledges at once, which flatters the one-at-a-time baseline; report both.

`--testbed HOME` runs both sides against the real Apache Pulsar testbed instead (`sweeper testbed up
--home HOME`; token auth through `[system_topic] auth_token_file`), on a partitioned topic of its own
in pulsar/system; the baseline's per-send latency is then the real broker's durable-write latency.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pulsar

from harness.sandbox.pulsar import start_pulsar, stop_pulsar
from harness.zkserver import free_port
from sweeper.codecs import pending_delete
from sweeper.config import PulsarMetadataConfig, SweeperConfig
from sweeper.emit.stage import run_emit
from sweeper.runs import GATES_PASSED
from sweeper.runs import record as record_run
from sweeper.spark import get_spark
from sweeper.table_schemas import ORPHANS
from sweeper.tables import open_table_store


def orphan_rows(run_id: str, n: int) -> list[dict[str, object]]:
    now = datetime.now(UTC)
    return [{
        "run_id": run_id, "captured_at": now, "object_type": "ledger", "ledger_id": 10_000 + i, "status": "candidate",
        "verdict": "orphan", "reason": "dropped_from_ledger_list", "component": "managed-ledger",
        "tenant": "bench", "namespace": f"ns-{i % 10}", "topic": f"topic-{i % 1000}",
        "managed_ledger": f"bench/ns-{i % 10}/persistent/topic-{i % 1000}", "size_bytes": 1 << 20,
        "created_ms": 0, "age_ms": 30 * 86_400_000, "zk_path": f"/ledgers/00/0000/L{10_000 + i:04d}",
        "zk_version": 0,
    } for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--baseline-records", type=int, default=10_000)
    parser.add_argument("--persist-latency-ms", type=float, default=0.0)
    parser.add_argument("--testbed", help="home of a running real Pulsar testbed (`sweeper testbed up`)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-emit-"))
    system_topic: dict[str, object] = {"read_in_snapshot": False, "records_per_producer": 25_000}
    auth = None
    if args.testbed:
        from harness.testbed.server import running_testbed

        testbed = running_testbed(args.testbed)
        if testbed is None:
            sys.exit(f"no testbed running under {args.testbed}: run `sweeper testbed up --home {args.testbed}`")
        broker = None
        service_url, admin_url = testbed.service_url, testbed.admin_url
        system_topic |= {"auth_token_file": str(testbed.superuser_token_file),
                         "topic": f"persistent://pulsar/system/bench_emit_{int(time.time())}"}
        auth = pulsar.AuthenticationToken(testbed.superuser_token())
        where = f"real Pulsar {testbed.pulsar_version} testbed"
    else:
        port, admin_port = free_port(), free_port()
        broker = start_pulsar(work / "pulsar", port, admin_port, persist_latency_ms=args.persist_latency_ms)
        service_url, admin_url = broker.service_url, broker.admin_url
        where = f"local endpoint, persist latency {args.persist_latency_ms} ms"
    try:
        spark = get_spark("bench-emit", master="local[2]", conf={"spark.sql.shuffle.partitions": "4"})
        cfg = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox")).replace(
            tables={"root": str(work / "tables"), "engine": "delta-rs"},
            system_topic={"service_url": service_url, "admin_url": admin_url, **system_topic})
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        run_id = "bench-emit"
        store.append_rows("orphans", orphan_rows(run_id, args.records), ORPHANS)
        # Synthetic orphans, no snapshot to gate: recorded as a gated reconcile, which emit requires.
        record_run(store, run_id, "reconcile", "succeeded", datetime.now(UTC), {GATES_PASSED: 1}, cfg)

        # Warm: in a sweep, emit runs right after reconcile in the same Spark session.
        store.read("orphans").count()
        t0 = time.monotonic()
        result = run_emit(spark, cfg, store, run_id)
        ours_s = time.monotonic() - t0
        assert result.counts.published == args.records, result.counts
        ours_rate = args.records / ours_s

        records = pending_delete.records_for_orphans(orphan_rows("baseline", args.baseline_records))
        payloads = [pending_delete.encode(r) for r in records]
        client = pulsar.Client(service_url, authentication=auth,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        producer = client.create_producer(f"persistent://pulsar/system/baseline_{int(time.time())}",
                                          batching_enabled=False)
        latencies = []
        t0 = time.monotonic()
        for record, payload in zip(records, payloads, strict=True):
            sent = time.monotonic()
            producer.send(payload, partition_key=str(record["ledgerId"]))
            latencies.append(time.monotonic() - sent)
        base_s = time.monotonic() - t0
        client.close()
        base_rate = len(payloads) / base_s
        latencies.sort()

        print(f"records: {args.records:,}  producers: {result.counts.producers}  "
              f"partitions: {result.counts.partitions}  against: {where}")
        median, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
        print(f"one synchronous send (a durable write, receipt included): median {median * 1000:.2f} ms, "
              f"p99 {p99 * 1000:.2f} ms")
        print(f"ours (run_emit, whole stage incl. planning and the Delta commit): {ours_s:.1f} s = "
              f"{ours_rate:,.0f} records/s")
        send_rate = args.records / (result.counts.send_ms / 1000)
        print(f"ours, sending only (the Spark job of producers, from task launch to the last receipt): "
              f"{result.counts.send_ms / 1000:.1f} s = {send_rate:,.0f} records/s")
        print(f"baseline (one sync producer, one send at a time, {len(payloads):,} records): {base_s:.1f} s = "
              f"{base_rate:,.0f} records/s")
        print(f"ratio, whole stage: {ours_rate / base_rate:.1f}x; sending only: {send_rate / base_rate:.1f}x")
        spark.stop()
    finally:
        if broker is not None:
            stop_pulsar(broker)


if __name__ == "__main__":
    main()
