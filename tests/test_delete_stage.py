"""The delete stage end to end on the sandbox: snapshot, reconcile, emit, then re-verified deletes by
Spark tasks against real ZooKeeper, S3 (moto's server) and the local Pulsar endpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.s3server import S3ServerInfo
from harness.sandbox.model import SandboxSpec, Status
from harness.zkserver import free_port, start_zookeeper, stop_zookeeper
from sweeper.codecs import pulsar as codec
from sweeper.codecs.layout import ledger_path
from sweeper.delete.errors import DeleteRefused
from sweeper.delete.inputs import dead_letters, redrive, retry_states
from sweeper.delete.lock import DeleteRunLock
from sweeper.delete.stage import run_delete
from sweeper.errors import RunLockHeld
from sweeper.objectstore.s3 import S3Target, s3_client
from sweeper.pipeline import delete_summary
from sweeper.tables import open_table_store
from sweeper.zk import client as zkutil
from tests.support.broker import Broker
from tests.support.config import ZkTarget
from tests.support.s3_faults import KeyFault, S3FaultProxy
from tests.support.seeded import LATER_MS, later, orphans_past_grace, planned_delete


def dump(zk: KazooClient, path: str = "/") -> dict[str, tuple[bytes, int]]:
    """Every znode with its data and version, except the sweeper's own run-lock directory."""
    out: dict[str, tuple[bytes, int]] = {}
    stack = [path]
    while stack:
        node = stack.pop()
        if node.startswith("/ledger-sweeper"):
            continue
        data, stat = zk.get(node)
        out[node] = (data, stat.version)
        stack.extend(zkutil.join(node, c) for c in zk.get_children(node))
    return out


def test_sandbox_orphans_deleted_and_nothing_else_touched(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker,
        s3_server: S3ServerInfo) -> None:
    spec = SandboxSpec(seed=5, topics=30, offload_bucket=f"offload-{free_port()}")
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec, s3_server)
    orphans = orphans_past_grace(cluster, LATER_MS, offloads_listed=True)
    before = dump(zk)
    objects = s3_client(S3Target(spec.offload_bucket), s3_server.endpoint)
    seeded = {o["Key"] for o in objects.list_objects_v2(Bucket=spec.offload_bucket).get("Contents", [])}

    dry = run_delete(spark, cfg, store, run_id, now_ms=later())  # dry run is the default
    assert dump(zk) == before
    not_planned = [(r.ledger_id, r.outcome, r.detail, r.error) for r in dry.results
                   if r.ledger_type == "LEDGER" and r.outcome != "would_delete"]
    assert not not_planned
    assert {r.ledger_id for r in dry.results if r.outcome == "would_delete" and r.ledger_type == "LEDGER"} == orphans

    done = run_delete(spark, cfg, store, run_id, execute=True, now_ms=later())
    deleted = {r.ledger_id for r in done.results if r.outcome == "deleted" and r.ledger_type == "LEDGER"}
    assert deleted == orphans
    after = dump(zk)
    layout = spec.layout
    gone = set(before) - set(after)
    orphan_paths = {ledger_path(spec.ledgers_root, i, layout) for i in orphans}
    assert orphan_paths <= gone
    # Everything else that vanished is a layout directory the deletes emptied; nothing changed in place.
    assert all(before[p][0] == b"" and not any(q.startswith(p + "/") for q in after) for p in gone - orphan_paths)
    assert all(after[p] == before[p] for p in after)

    left = {o["Key"] for o in objects.list_objects_v2(Bucket=spec.offload_bucket).get("Contents", [])}
    assert left == seeded - {o.key for o in cluster.offload_objects if o.status == "orphan"}
    assert done.counts.failed == 0 and done.counts.in_use == 0

    # A rerun is a no-op: every record has its final result for this run.
    again = run_delete(spark, cfg, store, run_id, execute=True, now_ms=later())
    assert again.counts.records == 0 and dump(zk) == after


def test_under_pulsars_metadata_store_driver_a_root_without_layout_is_deleted_from_as_hierarchical(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    """Bookies on Pulsar's `metadata-store:zk:` driver leave no LAYOUT (upstream PulsarLedgerManagerFactory stores
    none): with that URI configured the delete reads the ledgers at the hybrid hierarchical paths, as the snapshot
    does, and deletes exactly the orphans; with BookKeeper's own spelling it refuses the root."""
    spec = SandboxSpec(seed=8, topics=12)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    zk.delete(zkutil.join(spec.ledgers_root, "LAYOUT"))
    with pytest.raises(Exception, match="no LAYOUT"):
        run_delete(spark, cfg, store, run_id, execute=False)
    driver = cfg.replace(bookkeeper={"metadata_service_uri": f"metadata-store:zk:{zk_target.hosts}"})
    result = run_delete(spark, driver, store, run_id, execute=True)
    deleted = {r.ledger_id for r in result.results if r.ledger_type == "LEDGER" and r.outcome == "deleted"}
    assert deleted == orphans_past_grace(cluster)
    assert not [i for i in deleted if zk.exists(ledger_path(spec.ledgers_root, i, spec.layout))]


def test_reference_regained_or_new_ledger_between_plan_and_delete_is_left_alone(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    spec = SandboxSpec(seed=8, topics=30)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    # An orphan dropped from a live topic's list: put it back, as if the metadata update had been rolled back.
    live_mls = {m.name: m for m in cluster.managed_ledgers}
    regained = min(i for i in orphans_past_grace(cluster)
                   if cluster.ledgers[i].orphan_kind.value == "dropped_from_list"  # type: ignore[union-attr]
                   and cluster.ledgers[i].custom.get("pulsar/managed-ledger", b"").decode() in live_mls)
    ml = live_mls[cluster.ledgers[regained].custom["pulsar/managed-ledger"].decode()]
    ml_path = zkutil.join(spec.managed_ledgers_root, ml.name)
    data, _ = zk.get(ml_path)
    info = codec.decode_managed_ledger_info(data)
    info.ledgerInfo.add(ledgerId=regained, entries=1, size=1)
    zk.set(ml_path, codec.encode_managed_ledger_info(info))
    # A ledger created after the plan: never in any record, so never touched.
    fresh = ledger_path(spec.ledgers_root, 999_999, spec.layout)
    zk.create(fresh, zk.get(ledger_path(spec.ledgers_root, regained, spec.layout))[0], makepath=True)

    result = run_delete(spark, cfg, store, run_id, execute=True)
    outcome = {r.ledger_id: r for r in result.results if r.ledger_type == "LEDGER"}
    assert outcome[regained].outcome == "in_use" and "listed in managed ledger" in outcome[regained].detail
    assert zk.exists(ledger_path(spec.ledgers_root, regained, spec.layout))
    assert zk.exists(fresh)
    assert {i for i, r in outcome.items() if r.outcome == "deleted"} == orphans_past_grace(cluster) - {regained}


def test_operator_list_forged_and_bad_entries_get_final_outcomes(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    spec = SandboxSpec(seed=9, topics=20)
    cluster, cfg, store, _ = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    orphan = min(orphans_past_grace(cluster))
    in_use = min(i for i, x in cluster.ledgers.items() if x.status is Status.IN_USE)
    in_use_ml = cluster.ledgers[in_use].custom.get("pulsar/managed-ledger", b"").decode()
    non_pulsar = min(i for i, x in cluster.ledgers.items() if x.status is Status.NON_PULSAR)
    other_topic = "persistent://someone/else/topic"
    # The source topic of a shadow drops a ledger from its list (PIP-180); the shadow still lists it.
    shadow = next(m for m in cluster.managed_ledgers if m.properties.get("PULSAR.SHADOW_SOURCE"))
    source = next(m for m in cluster.managed_ledgers if m.topic_name == shadow.properties["PULSAR.SHADOW_SOURCE"])
    source_path = zkutil.join(spec.managed_ledgers_root, source.name)
    info = codec.decode_managed_ledger_info(zk.get(source_path)[0])
    shadow_held = min(e.ledgerId for e in info.ledgerInfo if e.ledgerId in {x.ledger_id for x in shadow.ledgers}
                      and e.ledgerId != in_use)
    kept = [e for e in info.ledgerInfo if e.ledgerId != shadow_held]
    del info.ledgerInfo[:]
    info.ledgerInfo.extend(kept)
    zk.set(source_path, codec.encode_managed_ledger_info(info))
    entries: list[Any] = [
        {"ledgerId": shadow_held},
        {"ledgerId": orphan},  # completed from its metadata: the normal verified path
        orphan,  # a duplicate: already gone by the time it runs
        {"ledgerId": in_use},
        {"ledgerId": non_pulsar},
        {"ledgerId": 77_777_777},  # never existed
        {"ledgerType": "LEDGER", "ledgerComponent": "MANAGED_LEDGER", "ledgerId": in_use, "topicName": other_topic},
        {"ledgerType": "LEDGER", "ledgerComponent": "SCHEMA_STORAGE", "ledgerId": in_use},  # no schemaId
        {"ledgerType": "OFFLOAD_LEDGER", "ledgerComponent": "MANAGED_LEDGER", "ledgerId": in_use,
         "topicName": "persistent://" + in_use_ml.replace("/persistent/", "/"),
         "offloadContext": {"uuid": "00000000-0000-0000-0000-000000000001", "bucket": "not-our-bucket",
                            "keys": [f"00000000-0000-0000-0000-000000000001-ledger-{in_use}"]}},
    ]
    listing = tmp_path / "ledgers.json"
    listing.write_text(json.dumps(entries))
    before = dump(zk)
    result = run_delete(spark, cfg, store, "operator", execute=True, from_json=listing)
    outcomes = [r.outcome for r in result.results]
    by_entry = dict(zip(range(len(entries)), sorted(result.results, key=lambda r: 0), strict=False))
    assert len(outcomes) == len(entries)
    assert by_entry  # every entry answered
    keyed = {(r.ledger_id, r.outcome) for r in result.results}
    assert (orphan, "deleted") in keyed and (orphan, "already_gone") in keyed
    assert (in_use, "in_use") in keyed
    held = next(r for r in result.results if r.ledger_id == shadow_held)
    assert held.outcome == "in_use" and shadow.name in held.detail, held.detail
    assert result.counts.shadow_topics >= 1
    assert (non_pulsar, "mismatch") in keyed
    # Issue 23: an id no snapshot ever listed is a likely typo, not someone else's delete; the duplicate of a
    # ledger the snapshot saw stays `already_gone` (above).
    missing = next(r for r in result.results if r.ledger_id == 77_777_777)
    assert missing.outcome == "not_found" and "check the id" in missing.detail, missing
    assert result.counts.not_found == 1 and "1 not found (no snapshot lists them" in delete_summary(result)
    assert (in_use, "mismatch") in keyed  # the forged topic
    assert sum(1 for r in result.results if r.outcome == "invalid") == 2  # missing schemaId, foreign bucket
    gone = set(before) - set(dump(zk))
    assert ledger_path(spec.ledgers_root, orphan, spec.layout) in gone
    assert all(before[p][0] == b"" for p in gone - {ledger_path(spec.ledgers_root, orphan, spec.layout)})


def test_zookeeper_down_refuses_cleanly_and_the_run_completes_once_it_is_back(
        spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    server = start_zookeeper(tmp_path / "zk")
    client = zkutil.connect(server.connect_string)
    try:
        spec = SandboxSpec(seed=12, topics=15)
        cluster, cfg, store, run_id = planned_delete(client, server.connect_string, spark, tmp_path, broker, spec)
        zkutil.close(client)
        cfg = cfg.replace(delete={"max_attempts": 3, "retry_after_s": 60}, bookkeeper={"session_timeout_s": 4.0})
        # The driver reads the layout, then ZooKeeper goes away before the tasks connect.
        stop_zookeeper(server)
        with pytest.raises(Exception, match="ZooKeeper"):
            run_delete(spark, cfg, store, run_id, execute=True)
        server = start_zookeeper(tmp_path / "zk", port=server.port)
        client = zkutil.connect(server.connect_string)  # a broker registers again, as Pulsar's would
        client.create("/loadbalance/brokers/127.0.0.1:8080", b"{}", ephemeral=True, makepath=True)
        first = run_delete(spark, cfg, store, run_id, execute=True)
        assert first.counts.deleted == len(orphans_past_grace(cluster))
        assert retry_states(store) == {}
    finally:
        zkutil.close(client)
        stop_zookeeper(server)


def test_failures_are_queued_with_backoff_then_dead_lettered_and_redriven(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker,
        s3_server: S3ServerInfo) -> None:
    spec = SandboxSpec(seed=4, topics=20, offload_bucket=f"offload-{free_port()}")
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec, s3_server)
    objects = {o.key for o in cluster.offload_objects if o.status == "orphan"}
    assert objects, "the sandbox should have orphan offloaded objects"
    # S3 unreachable: transient errors, retried in the task, then queued with back-off.
    broken = cfg.replace(offload={"endpoint_override": f"http://127.0.0.1:{free_port()}"},
                         delete={"max_attempts": 4, "in_task_attempts": 2, "retry_after_s": 60})
    first = run_delete(spark, broken, store, run_id, execute=True, now_ms=later())
    assert first.counts.queued_for_retry > 0
    assert first.counts.deleted == len(orphans_past_grace(cluster, LATER_MS))
    queued = {k for k, v in retry_states(store).items() if v["state"] == "queued"}
    # Offloaded copies, and the BookKeeper copies whose offloaded copy could not be checked: S3 is unreachable.
    released = orphans_past_grace(cluster, LATER_MS, offloads_listed=True) - orphans_past_grace(cluster, LATER_MS)
    assert queued and all(k.startswith("OFFLOAD_LEDGER/") or int(k.split("/")[1]) in released for k in queued)
    # Not due yet: a rerun now does nothing.
    assert run_delete(spark, broken, store, run_id, execute=True, now_ms=later()).counts.records == 0
    second = run_delete(spark, broken, store, run_id, execute=True, now_ms=later() + 61_000)
    assert second.counts.dead_lettered == len(queued)  # 2 + 2 attempts = max_attempts
    assert {r["record_key"] for r in dead_letters(store)} == queued

    assert redrive(store) == len(queued)
    # S3 is back but throttles every key once (per-key SlowDown in a 200 DeleteObjects answer):
    # the tasks retry in place and the redriven records end deleted in this one run.
    proxy = S3FaultProxy(s3_server.endpoint).start()
    try:
        proxy.faults.update({key: KeyFault("SlowDown", times=1) for key in objects})
        throttled = cfg.replace(offload={"endpoint_override": proxy.endpoint},
                                delete={"in_task_attempts": 3})
        healed = run_delete(spark, throttled, store, run_id, execute=True, now_ms=later() + 61_000)
    finally:
        proxy.stop()
    assert sorted(proxy.refused) == sorted(objects)
    assert healed.counts.deleted == len(queued), [(r.ledger_id, r.outcome, r.detail) for r in healed.results]
    assert {v["state"] for v in retry_states(store).values()} == {"resolved"}
    left = {o["Key"] for o in s3_client(S3Target(spec.offload_bucket), s3_server.endpoint).list_objects_v2(
        Bucket=spec.offload_bucket).get("Contents", [])}
    assert not left & objects


def test_a_second_delete_run_is_locked_out_and_config_cannot_switch_deleting_on(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    spec = SandboxSpec(seed=2, topics=10)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    before = dump(zk)
    with DeleteRunLock(zk, cfg.delete.lock_path, run_id="someone-else"), pytest.raises(RunLockHeld):
        run_delete(spark, cfg, store, run_id, execute=True)
    assert dump(zk) == before
    with pytest.raises(Exception, match="--execute"):
        cfg.replace(delete={"execute": True})
    with pytest.raises(DeleteRefused, match="no successful emit"):
        run_delete(spark, cfg, store, "r-unknown", execute=True)
    # Tables with no snapshot at all: shadow topics are unknown, so an operator's list is not executed.
    listing = tmp_path / "one.json"
    listing.write_text(json.dumps([min(orphans_past_grace(cluster))]))
    bare = open_table_store(str(tmp_path / "bare-tables"), spark, engine="delta-rs")
    with pytest.raises(DeleteRefused, match="run `sweeper snapshot` first"):
        run_delete(spark, cfg, bare, "operator", execute=True, from_json=listing)
    assert dump(zk) == before
    assert run_delete(spark, cfg, bare, "operator", from_json=listing).counts.would_delete == 1


def test_draining_the_topic_acknowledges_only_committed_outcomes(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    spec = SandboxSpec(seed=6, topics=20)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    emitted = store.read("emitted").where(f"run_id = '{run_id}'").count()
    before = dump(zk)

    dry = run_delete(spark, cfg, store, "drain-dry", from_topic=True)
    assert dry.counts.from_topic == emitted and dry.counts.acknowledged == 0
    assert {r.ledger_id for r in dry.results if r.outcome == "would_delete"} == orphans_past_grace(cluster)
    assert dump(zk) == before

    # The dry run acknowledged nothing: the same messages come back, now to be executed.
    done = run_delete(spark, cfg, store, "drain-1", from_topic=True, execute=True)
    assert done.counts.from_topic == emitted and done.counts.acknowledged == emitted
    assert {r.ledger_id for r in done.results if r.outcome == "deleted"} == orphans_past_grace(cluster)
    assert set(store.read("delete_results").where("run_id = 'drain-1'").toPandas().source) == {"topic"}

    again = run_delete(spark, cfg, store, "drain-2", from_topic=True, execute=True)
    assert again.counts.from_topic == 0 and again.counts.records == 0


def test_the_chunk_pacer_counts_the_work_toward_the_rate_and_never_exceeds_it() -> None:
    """A chunk's own work time is part of its budget: work as slow as the pace adds no sleep (a pacer that
    slept a whole chunk's worth after slow work halved the delete rate), and fast work is held to the rate."""
    from sweeper.delete.tasks import _paced

    started = time.monotonic()
    for part in _paced(list(range(40)), 20.0):  # two chunks of a second's worth each
        time.sleep(len(part) / 20.0 * 0.9)
    slow = time.monotonic() - started
    started = time.monotonic()
    chunks = list(_paced(list(range(40)), 20.0))
    fast = time.monotonic() - started
    assert slow < 2.4, f"40 records at 20/s whose work took 1.8 s took {slow:.2f}s"  # double-paying: 2.8 s
    assert 0.9 < fast < 1.3 and [len(c) for c in chunks] == [20, 20], fast
