"""Pending deletes read back from the system topic by the snapshot, and classified by reconcile."""

from __future__ import annotations

from datetime import UTC, datetime

import pulsar
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec
from sweeper.broker.system_topic import partition_topic
from sweeper.codecs import pending_delete
from sweeper.codecs import pulsar as codec
from sweeper.delete.stage import run_delete
from sweeper.emit.stage import run_emit
from sweeper.pipeline import reconcile_stage, snapshot_stage
from sweeper.reconcile.gates import run_gates
from sweeper.runs import record as record_run
from sweeper.zk import client as zkutil
from tests.support.broker import TOPIC, Broker
from tests.support.seeded import SeededSnapshotMaker


def _publish_raw(broker: Broker, partition: int, payloads: list[bytes]) -> None:
    client = pulsar.Client(f"pulsar://127.0.0.1:{broker.port}", logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(partition_topic(TOPIC, partition))
    for payload in payloads:
        producer.send(payload)
    client.close()


def test_pending_deletes_are_read_quarantined_and_classified(
        zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, broker: Broker,
        live_broker: str) -> None:
    spec = SandboxSpec(seed=21, topics=30)
    # The topic does not exist yet: the first snapshot has nothing to read.
    cluster, cfg, store, first = seeded_snapshot(spec, safety={"max_orphan_fraction": 1.0},
                                                 system_topic=broker.config(), delete={"deletes_per_second": 100_000.0})
    assert store.read("pending_deletes").where(f"run_id = '{first}'").count() == 0
    reconcile_stage(spark, cfg, store, first)
    emitted = run_emit(spark, cfg, store, first)
    record_run(store, first, "emit", "succeeded", datetime.now(UTC), emitted.counts, cfg)
    records = {r["record_key"]: r for r in store.read("emitted").where(f"run_id = '{first}'").collect()}

    # Anyone with produce permission can write to the topic: garbage, a foreign Avro record, an incomplete one.
    incomplete = pending_delete.encode({
        "topicName": "persistent://t/ns/x", "ledgerComponent": "MANAGED_CURSOR", "ledgerType": "LEDGER",
        "ledgerId": 5, "cursorName": None, "schemaId": None, "offloadContext": None, "properties": {},
        "reason": None, "runId": None})
    _publish_raw(broker, 1, [b"\x00garbage\xff", b'{"ledgerId": 7}', incomplete])

    # Phase 2 runs for half of the records; one other ledger is referenced again (its metadata update
    # was rolled back), the rest stay stuck.
    ledger_keys = sorted(k for k in records if k.startswith("LEDGER/"))  # the order the delete stage takes them
    dropped = [k for k in ledger_keys if cluster.ledgers[int(k.split("/")[1])].orphan_kind is not None
               and cluster.ledgers[int(k.split("/")[1])].orphan_kind.value == "dropped_from_list"]
    regained = int(dropped[-1].split("/")[1])
    done_count = min(len(ledger_keys) // 2, ledger_keys.index(dropped[-1]))
    assert done_count > 0
    capped = cfg.replace(delete={"max_deletes_per_run": done_count})
    capped_run = run_delete(spark, capped, store, first, execute=True)
    # Only the first `done_count` records (by key) reached the driver; the rest wait, counted.
    assert capped_run.counts.records == done_count
    assert capped_run.counts.deferred_by_cap == len(records) - done_count
    deleted_ids = {int(k.split("/")[1]) for k in ledger_keys[:done_count]}
    still = [int(k.split("/")[1]) for k in ledger_keys[done_count:]]
    ml_name = cluster.ledgers[regained].custom["pulsar/managed-ledger"].decode()
    ml_path = zkutil.join(spec.managed_ledgers_root, ml_name)
    info = codec.decode_managed_ledger_info(zk.get(ml_path)[0])
    info.ledgerInfo.add(ledgerId=regained, entries=1, size=1)
    zk.set(ml_path, codec.encode_managed_ledger_info(info))

    second = snapshot_stage(spark, cfg, store).run_id
    pending = store.read("pending_deletes").where(f"run_id = '{second}'").collect()
    assert {r["record_key"] for r in pending} == set(records)  # every emitted record, read back once
    assert all(r["source_run_id"] == first and r["payload"] == records[r["record_key"]]["payload"] for r in pending)
    quarantined = store.read("quarantine").where(f"run_id = '{second}' AND source = 'pending_delete'").collect()
    assert sorted(bytes(r["raw"]) for r in quarantined) == sorted([b"\x00garbage\xff", b'{"ledgerId": 7}', incomplete])
    assert {r["error_kind"] for r in quarantined} <= {"malformed", "missing_field", "invalid_field"}
    assert run_gates(store, second, cfg.gates).passed  # forged messages never pass for a partial scan

    result = reconcile_stage(spark, cfg, store, second)
    states = {r["ledger_id"]: r["state"] for r in store.read("pending_delete_status").where(
        f"run_id = '{second}' AND ledger_type = 'LEDGER'").collect()}
    assert {i for i, s in states.items() if s == "done"} == deleted_ids
    assert states[regained] == "in_use"
    assert {i for i, s in states.items() if s == "stuck"} == set(still) - {regained}
    assert result.counts.pending_deletes["done"] == len(deleted_ids)
