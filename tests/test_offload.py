"""Tiered storage: listing a real S3 endpoint (moto's server) and reconciling its objects."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.s3server import S3ServerInfo
from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_s3, seed_zookeeper
from sweeper.objectstore.s3 import S3Target, listing_units, parse_offload_key, s3_client
from sweeper.reconcile.stage import CANDIDATE, OTHER_CLUSTER, UNKNOWN, YOUNG, SafetySettings, run_reconcile
from sweeper.rules.safety import DAY_MS, CircuitBreaker
from tests.support.config import BASE_CONFIG
from tests.support.seeded import SeededSnapshotMaker


def test_key_parsing() -> None:
    key = parse_offload_key("123e4567-e89b-12d3-a456-426614174000-ledger-42-index")
    assert key is not None and (key.uuid, key.ledger_id, key.role) == ("123e4567-e89b-12d3-a456-426614174000", 42,
                                                                       "index")
    for bad in ("notes.txt", "123e4567-e89b-12d3-a456-426614174000-ledger-", "x-ledger-1",
                "123e4567-e89b-12d3-a456-426614174000-ledger-99999999999999999999"):
        assert parse_offload_key(bad) is None


def test_listing_units_cover_every_key(s3_server: S3ServerInfo) -> None:
    client = s3_client(S3Target("cover"), s3_server.endpoint)
    client.create_bucket(Bucket="cover")
    keys = ["!early", "0abc", "9zz", ":colon", "Upper", "`tick", "a1", "fff", "f~", "g", "zzz", "\u00e9t\u00e9"]
    for key in keys:
        client.put_object(Bucket="cover", Key=key, Body=b"")
    from sweeper.objectstore.s3 import _list

    seen = [obj["Key"] for unit in listing_units() for obj in _list(client, "cover", *unit)]
    assert sorted(seen) == sorted(keys)


def _offload(endpoint: str, extra: str = "") -> dict[str, Any]:
    """The buckets listed, through `endpoint` (moto, or a proxy in front of it)."""
    return {"enabled": True, "endpoint_override": endpoint, "extra_buckets": extra}


def test_offloaded_objects_snapshot_and_reconcile(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, s3_server: S3ServerInfo
) -> None:
    cluster = build_cluster(SandboxSpec(seed=5, topics=50, offload_bucket="offload-a"))
    seed_zookeeper(zk, cluster)
    seed_s3(s3_client(S3Target("offload-a"), s3_server.endpoint), cluster)
    assert {o.status for o in cluster.offload_objects} == {"in_use", "in_flight", "orphan", "other_cluster", "unknown"}

    _, _, store, run_id = seeded_snapshot(cluster, reseed=False,
                                          offload=_offload(s3_server.endpoint, extra="no-such-bucket"))
    objects = {r["key"]: r for r in (x.asDict() for x in store.read("offload_objects").collect())}
    assert set(objects) == {o.key for o in cluster.offload_objects}
    some = cluster.offload_objects[0]
    assert objects[some.key]["managed_ledger"] == some.managed_ledger
    assert objects[some.key]["uuid"] == some.uuid
    quarantine = {r["path"]: r["error_kind"] for r in store.read("quarantine").collect()}
    assert quarantine["s3://offload-a/notes/readme-0.txt"] == "unknown_key"
    assert quarantine["s3://no-such-bucket/"] == "listing_failed"
    assert objects[some.key]["cluster_name"] == "sandbox" and objects[some.key]["metadata_read"]

    # Now: the orphan objects were written seconds ago, so they are inside the grace period.
    permissive = SafetySettings(breaker=CircuitBreaker(1.0), local_cluster="sandbox", bookkeeper_dedicated=True)
    run_reconcile(spark, store, run_id, permissive)
    rows = [r.asDict() for r in store.read("orphans").where(f"run_id = '{run_id}'").collect()]
    listed = {r["s3_key"]: r for r in rows if r["object_type"] == "offload_object"}
    orphans = {o.key for o in cluster.offload_objects if o.status == "orphan"}
    assert {k for k, r in listed.items() if r["status"] == YOUNG} == orphans
    # A peer cluster's objects in the shared bucket, and objects naming no owner, are never candidates.
    by_status = {status: {o.key for o in cluster.offload_objects if o.status == status}
                 for status in ("other_cluster", "unknown")}
    assert {k for k, r in listed.items() if r["status"] == OTHER_CLUSTER} == by_status["other_cluster"]
    assert {k for k, r in listed.items() if r["status"] == UNKNOWN} == by_status["unknown"]
    assert not {o.key for o in cluster.offload_objects if o.status in ("in_use", "in_flight")} & set(listed)

    # Eight days on: the same objects are candidates; the in-flight offloads are now stale, never candidates.
    *_, later_run = seeded_snapshot(cluster, reseed=False, offload=_offload(s3_server.endpoint))
    run_reconcile(spark, store, later_run, permissive, now_ms=int(time.time() * 1000) + 8 * DAY_MS)
    rows = [r.asDict() for r in store.read("orphans").where(f"run_id = '{later_run}'").collect()]
    listed = {r["s3_key"]: r for r in rows if r["object_type"] == "offload_object"}
    assert {k for k, r in listed.items() if r["status"] == CANDIDATE} == orphans
    assert {r["reason"] for k, r in listed.items() if r["status"] == CANDIDATE} == {"offload_unreferenced"}
    in_flight = {o.key for o in cluster.offload_objects if o.status == "in_flight"}
    assert {listed[k]["status"] for k in in_flight} == {UNKNOWN}
    assert {listed[k]["status"] for k in by_status["other_cluster"]} == {OTHER_CLUSTER}


def test_a_bucket_listed_only_in_part_fails_the_gate_and_proves_no_delete_done(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, s3_server: S3ServerInfo,
    live_broker: str
) -> None:
    # Issue 11 (11): listing errors on slices other than the first were dropped, so a bucket listed in part
    # passed for complete, and a pending delete of an object in the unlisted part read as carried out.
    from sweeper.reconcile.frames import snapshot_frames
    from sweeper.reconcile.gates import run_gates
    from sweeper.reconcile.stage import pending_delete_states, references
    from sweeper.table_schemas import PENDING_DELETES
    from tests.support.gates import gates_on_both_engines
    from tests.support.s3_faults import S3FaultProxy

    cluster = build_cluster(SandboxSpec(seed=5, topics=50, offload_bucket="offload-p"))
    seed_zookeeper(zk, cluster)
    seed_s3(s3_client(S3Target("offload-p"), s3_server.endpoint), cluster)
    victim = next(o for o in cluster.offload_objects if o.status == "orphan" and o.key[0] != "0")
    proxy = S3FaultProxy(s3_server.endpoint, list_faults={victim.key[0]}).start()
    try:
        _, _, store, run_id = seeded_snapshot(cluster, reseed=False, offload=_offload(proxy.endpoint))
    finally:
        proxy.stop()
    listed = {r["key"] for r in store.read("offload_objects").where(f"run_id = '{run_id}'").collect()}
    assert victim.key not in listed and listed
    rows = store.read("quarantine").where(f"run_id = '{run_id}' AND error_kind = 'listing_failed'").collect()
    assert [r["path"] for r in rows] == [f"s3://offload-p/{victim.key[0]}"]

    gate = gates_on_both_engines(store, run_id, BASE_CONFIG.gates)
    assert [f for f in gate.failures if "could not be listed" in f and "offload-p" in f], gate.failures
    assert run_gates(store, run_id, BASE_CONFIG.replace(gates={"allow_offload_listing_errors": True}).gates).passed

    # A pending delete of the unlisted object: absent from a partial listing is not "done".
    store.append_rows("pending_deletes", [{
        "run_id": run_id, "captured_at": datetime.now(UTC), "topic_partition": 0, "message_id": "1:1:-1",
        "record_key": f"OFFLOAD_LEDGER/{victim.ledger_id}/offload-p/{victim.uuid}", "ledger_id": victim.ledger_id,
        "ledger_type": "OFFLOAD_LEDGER", "component": "MANAGED_LEDGER", "offload_uuid": victim.uuid,
        "s3_bucket": "offload-p", "payload": b"x"}], PENDING_DELETES)
    frames = snapshot_frames(store, run_id)
    states = {r["record_key"]: r["state"] for r in pending_delete_states(frames, references(frames), run_id).collect()}
    assert states == {f"OFFLOAD_LEDGER/{victim.ledger_id}/offload-p/{victim.uuid}": "unknown"}
