"""The sweeper against a real Apache Pulsar (the testbed, tests/real_pulsar/conftest.py): snapshot and
reconcile find exactly the induced orphans; a sweep that emits to and drains from the broker's own
__ledger_deletion topic deletes exactly them and nothing any topic still serves; and a sweep during
live churn deletes nothing the broker references."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pulsar
import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.testbed.admin import Admin, AdminError
from harness.testbed.orphans import ledger_znode, schema_path
from harness.testbed.server import TestbedInfo, bookkeeper_ledgers
from harness.testbed.workload import (
    CHURN_NAMESPACE,
    DELAYED,
    DELAYED_SUBSCRIPTION,
    SCHEMA_EVOLVE,
    admin_for,
    client_for,
    produce,
    read_all,
    topic,
)
from harness.testbed.world import (
    World,
    broker_references,
    managed_ledger_topics,
    s3_client_for,
    zk_for,
)
from sweeper.pipeline import delete_stage, emit_stage, reconcile_stage
from sweeper.snapshot import run_snapshot
from sweeper.tables import open_table_store
from tests.support.real_pulsar import COST, Reconciled, Swept, sweeper_config

# The first test also pays for the testbed (start, workload, orphans, grace) and the snapshot (the session's
# `reconciled` and `swept` fixtures, tests/real_pulsar/conftest.py).
pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_candidates_are_exactly_the_induced_orphans(reconciled: Reconciled) -> None:
    manifest = reconciled.world.manifest
    candidates = reconciled.candidates("ledger")
    leaks = reconciled.pulsar_leaks()
    COST["pulsar_leaked_ledgers"] = len(leaks)
    expected = reconciled.expected_ledgers()
    assert set(candidates) == expected, {r["ledger_id"]: (r["status"], r["reason"], r["managed_ledger"], r["cursor"])
                                         for r in reconciled.rows if r["ledger_id"] in set(candidates) ^ expected}
    assert {ledger: reason for ledger, reason in candidates.items() if ledger not in leaks} == manifest.orphan_ledgers()
    assert reconciled.candidates("offload_object") == manifest.orphan_objects()


def test_nothing_the_broker_references_is_a_candidate(reconciled: Reconciled) -> None:
    """The broker's own view (stats-internal of every topic, system topics included) against the plan."""
    planned = set(reconciled.candidates("ledger"))
    assert not {ledger: who for ledger, who in reconciled.referenced_before.items() if ledger in planned}
    # And the ground truth agrees with the broker: every induced orphan is one it does not reference; the
    # only others it does not reference are the few Pulsar leaked itself.
    unreferenced = reconciled.bk_before - set(reconciled.referenced_before)
    assert set(reconciled.world.manifest.orphan_ledgers()) <= unreferenced
    assert unreferenced == reconciled.expected_ledgers()


def test_current_compacted_ledgers_are_never_candidates(reconciled: Reconciled) -> None:
    """Includes the twice-compacted topic that stayed loaded and the system topics the broker compacts by
    itself (e.g. __transaction_buffer_snapshot, whose ZooKeeper znode keeps an older CompactedTopicLedger
    while its __compaction cursor has an active cursor ledger holding the newer one)."""
    current = dict(reconciled.world.manifest.compacted_current)
    current |= {who: ledger for ledger, who in reconciled.referenced_before.items() if who.endswith(" compacted")}
    assert reconciled.world.manifest.compacted_current, "the workload compacts topics"
    rows = {r["ledger_id"]: r for r in reconciled.rows if r["object_type"] == "ledger"}
    wrong = {name: rows[ledger] for name, ledger in current.items() if ledger in reconciled.candidates("ledger")}
    assert not wrong


def test_sweep_deletes_exactly_the_orphans(swept: Swept) -> None:
    manifest = swept.reconciled.world.manifest
    failed = [(r.ledger_id, r.ledger_type, r.outcome, r.detail) for r in swept.results if r.outcome != "deleted"]
    assert not failed
    assert swept.deleted == swept.reconciled.expected_ledgers()
    info = swept.reconciled.world.info
    s3 = s3_client_for(info)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=info.offload_bucket).get("Contents", [])}
    assert not keys & set(manifest.orphan_objects())
    assert keys, "the offloaded topic's objects stay"


def test_bookkeeper_no_longer_has_the_deleted_ledgers(swept: Swept) -> None:
    info = swept.reconciled.world.info
    after = bookkeeper_ledgers(info)
    assert not after & swept.deleted
    assert swept.reconciled.bk_before - swept.deleted <= after | _rolled_away(swept, after)


def _rolled_away(swept: Swept, after: set[int]) -> set[int]:
    """Ledgers the broker itself deleted since the snapshot (cursor-ledger switches, compaction)."""
    return swept.reconciled.bk_before - after - swept.deleted


def test_broker_view_names_no_deleted_ledger(swept: Swept) -> None:
    info = swept.reconciled.world.info
    zk = zk_for(info)
    try:
        referenced = broker_references(admin_for(info), zk)
        assert not {ledger: who for ledger, who in referenced.items() if ledger in swept.deleted}
        # Every ledger the broker references still exists in BookKeeper (offloaded ones excepted).
        missing = {ledger: who for ledger, who in referenced.items() if not zk.exists(ledger_znode(ledger))}
        offloaded = _offloaded_ledgers(admin_for(info), zk)
        assert not {k: v for k, v in missing.items() if k not in offloaded}
    finally:
        zk.stop()


def _offloaded_ledgers(admin: Admin, zk: KazooClient) -> set[int]:
    out: set[int] = set()
    for name in managed_ledger_topics(zk):
        try:
            ledgers = admin.internal_stats(name)["ledgers"]
        except AdminError as exc:  # the transaction log: the broker will not show it (409)
            if exc.status not in (404, 409):
                raise
            continue
        out |= {int(ledger["ledgerId"]) for ledger in ledgers if ledger.get("offloaded")}
    return out


def test_every_topic_serves_every_message_it_held(swept: Swept) -> None:
    world = swept.reconciled.world
    client = client_for(world.info)
    try:
        for name, held in world.held.items():
            now = [(mid, data.hex()) for mid, data in read_all(client, name)]
            assert now == held, name
        for name, held in world.compacted.items():
            now = [(mid, data.hex()) for mid, data in read_all(client, name, compacted=True)]
            assert now == held, f"compacted read of {name}"
    finally:
        client.close()


def test_schemas_still_fetchable(swept: Swept) -> None:
    info = swept.reconciled.world.info
    admin = admin_for(info)
    versions = admin.schema_versions(SCHEMA_EVOLVE)
    assert len(versions) == 3
    for version in range(3):
        assert "sensor" in admin.schema(SCHEMA_EVOLVE, version)["data"]
    zk = zk_for(info)
    try:
        assert zk.exists(schema_path(SCHEMA_EVOLVE))
    finally:
        zk.stop()


def test_live_churn_sweep_deletes_nothing_in_use(testbed_world: World, swept: Swept, spark: SparkSession,
                                                 tmp_path: Path) -> None:
    """A full sweep while the workload keeps producing, rolling ledgers, creating and deleting topics
    and compacting: nothing the broker references (before or after) is deleted, nothing acknowledged
    by the broker is lost, and what is left unreferenced afterwards is only younger than the grace."""
    info = testbed_world.info
    cfg = sweeper_config(info, tmp_path / "tables")
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    admin = admin_for(info)
    stop = threading.Event()
    churn = Churn(info, admin, stop)
    thread = threading.Thread(target=churn.run, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        time.sleep(3)
        snap = run_snapshot(spark, cfg, store)
        reconcile_stage(spark, cfg, store, snap.run_id)
        emit_stage(spark, cfg, store, snap.run_id)
        result = delete_stage(spark, cfg, store, snap.run_id, execute=True)
    finally:
        stop.set()
        thread.join(timeout=120)
    COST["churn_sweep_s"] = time.monotonic() - started
    assert churn.errors == [], churn.errors
    assert churn.sent > 0 and churn.compactions > 0 and churn.deleted_topics > 0
    assert not [(r.ledger_id, r.detail, r.error) for r in result.results if r.outcome == "failed"]
    deleted = {r.ledger_id for r in result.results if r.outcome == "deleted" and r.ledger_type == "LEDGER"}
    assert not deleted & set(churn.referenced), {k: churn.referenced[k] for k in deleted & set(churn.referenced)}
    zk = zk_for(info)
    try:
        after = broker_references(admin, zk)
        assert not deleted & set(after)
    finally:
        zk.stop()
    client = client_for(info)
    try:
        for name, payloads in churn.acked.items():
            got = {data for _, data in read_all(client, name)}
            assert payloads <= got, f"{name} lost {len(payloads - got)} acknowledged messages"
    finally:
        client.close()


class Churn:
    """Producers rolling ledgers, topics created and deleted, compaction, until `stop` is set."""

    def __init__(self, info: TestbedInfo, admin: Admin, stop: threading.Event) -> None:
        self.info, self.admin, self.stop = info, admin, stop
        self.errors: list[str] = []
        self.sent = self.compactions = self.deleted_topics = 0
        self.acked: dict[str, set[bytes]] = {}
        self.referenced: dict[int, str] = {}

    def run(self) -> None:
        client = client_for(self.info)
        zk = zk_for(self.info)
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
                self.referenced.update(broker_references(self.admin, zk))
        except Exception as exc:
            self.errors.append(repr(exc))
        finally:
            zk.stop()
            client.close()


def test_delayed_messages_are_delivered(swept: Swept) -> None:
    # Its consumer makes the broker deliver the bucket snapshots and delete them: `swept` requests `as_built`,
    # so what test_fidelity.py compares was read before.
    world = swept.reconciled.world
    client = client_for(world.info)
    consumer = client.subscribe(DELAYED, DELAYED_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Shared)
    got: set[bytes] = set()
    try:
        deadline = max(world.workload.delayed_due_at + 120, time.time() + 60)
        while len(got) < world.workload.delayed_count and time.time() < deadline:
            try:
                message = consumer.receive(5000)
            except pulsar.Timeout:
                continue
            got.add(message.data())
            consumer.acknowledge(message)
    finally:
        consumer.close()
        client.close()
    assert len(got) == world.workload.delayed_count
