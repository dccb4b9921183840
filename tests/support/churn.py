"""The live-churn sweep the real-Pulsar tests run on each testbed (ZooKeeper and Oxia): a full sweep while
producers roll ledgers, topics are created and deleted and a topic is compacted, and what it must not do."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession

from harness.testbed.admin import Admin
from harness.testbed.server import TestbedInfo
from harness.testbed.workload import CHURN_NAMESPACE, admin_for, client_for, produce, read_all, topic
from harness.testbed.world import World, broker_references, metadata_for
from sweeper.pipeline import delete_stage, emit_stage, reconcile_stage, snapshot_stage
from sweeper.tables import open_table_store
from tests.support.real_pulsar import COST, sweeper_config


class Churn:
    """Producers rolling ledgers, topics created and deleted, compaction, until `stop` is set; every ledger the
    broker referenced at the end of any round is remembered."""

    def __init__(self, info: TestbedInfo, admin: Admin, stop: threading.Event) -> None:
        self.info, self.admin, self.stop = info, admin, stop
        self.errors: list[str] = []
        self.sent = self.compactions = self.deleted_topics = 0
        self.acked: dict[str, set[bytes]] = {}
        self.referenced: dict[int, str] = {}

    def run(self) -> None:
        client = client_for(self.info)
        metadata = metadata_for(self.info)
        keep = topic("steady", CHURN_NAMESPACE)
        round_ = 0
        try:
            while not self.stop.is_set():
                round_ += 1
                producer = client.create_producer(keep, batching_enabled=False)
                for i in range(12):  # > managedLedgerMaxEntriesPerLedger: at least one rollover per round
                    payload = f"r{round_}-{i}".encode()
                    producer.send(payload, partition_key=f"k{i % 3}")
                    self.acked.setdefault(keep, set()).add(payload)
                    self.sent += 1
                producer.close()
                short = topic(f"short-lived-{round_}", CHURN_NAMESPACE)
                produce(client, short, 11, prefix="short")
                self.admin.delete_topic(short)
                self.deleted_topics += 1
                if round_ % 3 == 0:
                    self.admin.compact(keep)
                    self.compactions += 1
                self.referenced.update(broker_references(self.admin, metadata))
        except Exception as exc:
            self.errors.append(repr(exc))
        finally:
            metadata.stop()
            client.close()


def churn_sweep_deletes_nothing_in_use(world: World, spark: SparkSession, tables: Path, cost_key: str) -> None:
    """A full sweep while the churn runs: nothing the broker references (before or after) is deleted, nothing
    acknowledged by the broker is lost, and no delete fails."""
    info = world.info
    cfg = sweeper_config(info, tables)
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    admin = admin_for(info)
    stop = threading.Event()
    churn = Churn(info, admin, stop)
    thread = threading.Thread(target=churn.run, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        time.sleep(3)
        snap = snapshot_stage(spark, cfg, store)
        reconcile_stage(spark, cfg, store, snap.run_id)
        emit_stage(spark, cfg, store, snap.run_id)
        result = delete_stage(spark, cfg, store, snap.run_id, execute=True)
    finally:
        stop.set()
        thread.join(timeout=120)
    COST[cost_key] = time.monotonic() - started
    assert churn.errors == [], churn.errors
    assert churn.sent > 0 and churn.compactions > 0 and churn.deleted_topics > 0
    assert not [(r.ledger_id, r.detail, r.error) for r in result.results if r.outcome == "failed"]
    deleted = {r.ledger_id for r in result.results if r.outcome == "deleted" and r.ledger_type == "LEDGER"}
    assert not deleted & set(churn.referenced), {k: churn.referenced[k] for k in deleted & set(churn.referenced)}
    metadata = metadata_for(info)
    try:
        assert not deleted & set(broker_references(admin, metadata))
    finally:
        metadata.stop()
    client = client_for(info)
    try:
        for name, payloads in churn.acked.items():
            got = {data for _, data in read_all(client, name)}
            assert payloads <= got, f"{name} lost {len(payloads - got)} acknowledged messages"
    finally:
        client.close()
