"""What the real-Pulsar tests (tests/real_pulsar/) share besides their fixtures, on either testbed (ZooKeeper or
Oxia): the grace period, the cost record printed at the end of the session, the sweeper's configuration for the
testbed, the orphan sweep (its plan between two views of the broker, and its deletes, `reconcile_the_world` and
`sweep_the_plan`), and the broker's metadata as built."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulsar
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.testbed.orphans import ledger_znode, pulsar_made_schema_orphans
from harness.testbed.server import TestbedInfo, bookkeeper_ledgers
from harness.testbed.workload import DELAYED, DELAYED_SUBSCRIPTION, admin_for, client_for
from harness.testbed.world import World, broker_references, metadata_for
from sweeper import config as config_mod
from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.config import SweeperConfig
from sweeper.pipeline import delete_stage, emit_stage, reconcile_stage, snapshot_stage
from sweeper.tables import TableStore, open_table_store

GRACE_S = 45.0
COST: dict[str, float] = {}  # seconds per step, printed at the end of the session

# Ledgers Pulsar itself leaves behind during the workload: a few at most (see Reconciled.pulsar_leaks).
MAX_PULSAR_LEAKS = 3


def sweeper_config(info: TestbedInfo, tables: Path, **sections: dict[str, Any]) -> SweeperConfig:
    return config_mod.load(info.sweeper_config).replace(
        tables={"root": str(tables), "engine": "delta-rs"},
        safety={"min_age_hours": GRACE_S / 3600, "force_min_age": True, "max_orphan_fraction": 1.0},
        delete={"deletes_per_second": 1000.0, "op_timeout_s": 10.0},
        **sections)


@dataclass
class Reconciled:
    """The orphan sweep's plan, with the broker's and BookKeeper's views taken just before the snapshot and the
    broker's again just after it."""

    world: World
    cfg: SweeperConfig
    store: TableStore
    run_id: str
    rows: list[dict[str, Any]]
    referenced_before: dict[int, str]
    bk_before: set[int]
    referenced_after: dict[int, str] = field(default_factory=dict)
    layout: str = ""
    schema_unlisted: set[int] = field(default_factory=set)

    def trimmed_by_pulsar(self) -> set[int]:
        """Ledgers the broker referenced before the snapshot and not after: Pulsar dropped them from their lists
        itself meanwhile, so whether the scan still saw them listed depends on the moment it read their topic.
        Seen on the Oxia testbed: about a minute after the broker starts it compacts a namespace's system topics
        (__change_events, __transaction_buffer_snapshot), trims their first ledgers and deletes them. Orphans
        either way; never ledgers the broker still uses."""
        return set(self.referenced_before) - set(self.referenced_after)

    def pulsar_leaks(self) -> set[int]:
        """Ledgers Pulsar itself left behind during the workload, by the broker's own view (not the sweeper's):
        in BookKeeper, referenced by no topic stats-internal shows (system topics included), and not induced
        by the world. Pulsar 4.0.8 makes them now and then, e.g. a ledger created for a topic just before
        its broker is killed, never added to the topic's list. Real orphans, so the sweep must find them.
        A ledger being created while the views were taken (a rollover) is in use after: not a leak."""
        return (self.bk_before - set(self.referenced_before) - set(self.world.manifest.orphan_ledgers())
                - set(self.referenced_after))

    def expected_ledgers(self) -> set[int]:
        leaks = self.pulsar_leaks()
        # Schema ledgers no locator lists are Pulsar's own race, as many as its registrations raced: upstream
        # BookkeeperSchemaStorage.putSchema writes the schema to a new ledger, then updates the locator with
        # compare-and-set, and on BadVersionException retries the whole put without deleting that ledger (seen
        # after a broker restart, when producers re-register at once). Others are a few at most: more would mean
        # the broker's view and the manifest disagree for another reason.
        others = leaks - self.schema_unlisted
        assert len(others) <= MAX_PULSAR_LEAKS, {r["ledger_id"]: (r["reason"], r["managed_ledger"])
                                                for r in self.rows if r["ledger_id"] in others}
        return set(self.world.manifest.orphan_ledgers()) | leaks

    def candidates(self, object_type: str) -> dict[Any, str]:
        key = "ledger_id" if object_type == "ledger" else "s3_key"
        return {r[key]: r["reason"] for r in self.rows
                if r["status"] == "candidate" and r["object_type"] == object_type}


def reconcile_the_world(world: World, spark: SparkSession, tables: Path, cost_prefix: str = "") -> Reconciled:
    """Snapshot and reconcile the testbed (its orphans are past the grace period: the testbed session waited), with
    BookKeeper's view and the broker's taken just before and the broker's again just after. `cost_prefix` names
    the testbed in the cost record."""
    info = world.info
    cfg = sweeper_config(info, tables)
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    listed = bookkeeper_ledgers(info)  # first: a ledger the broker creates after this is in neither view
    metadata = metadata_for(info)
    try:
        referenced = broker_references(admin_for(info), metadata)
        # A ledger the broker deleted in between (an old compacted or cursor ledger) is in neither either.
        bk = {ledger for ledger in listed if metadata.exists(ledger_znode(ledger))}
        unlisted = {ledger for orphan in pulsar_made_schema_orphans(metadata) for ledger in orphan.ledgers}
        started = time.monotonic()
        snap = snapshot_stage(spark, cfg, store)
        COST[f"{cost_prefix}snapshot_s"] = time.monotonic() - started
        started = time.monotonic()
        reconcile_stage(spark, cfg, store, snap.run_id)
        COST[f"{cost_prefix}reconcile_s"] = time.monotonic() - started
        after = broker_references(admin_for(info), metadata)
    finally:
        metadata.stop()
    rows = [r.asDict() for r in store.read("orphans").where(f"run_id = '{snap.run_id}'").collect()]
    return Reconciled(world, cfg, store, snap.run_id, rows, referenced, bk, after, snap.layout, unlisted)


def sweep_the_plan(reconciled: Reconciled, spark: SparkSession, cost_prefix: str = "") -> Swept:
    """The plan emitted to the broker's own partitioned __ledger_deletion topic, drained from it and deleted."""
    cfg, store = reconciled.cfg, reconciled.store
    started = time.monotonic()
    emitted = emit_stage(spark, cfg, store, reconciled.run_id)
    COST[f"{cost_prefix}emit_s"] = time.monotonic() - started
    offloaded = {key.rsplit("-ledger-", 1)[1].removesuffix("-index") for key in reconciled.candidates("offload_object")}
    # One record per ledger, one per offloaded ledger (its data and index objects together).
    assert emitted.counts.published == len(reconciled.candidates("ledger")) + len(offloaded), emitted.counts
    assert admin_for(reconciled.world.info).partitions(cfg.system_topic.topic) == cfg.system_topic.partitions
    started = time.monotonic()
    result = delete_stage(spark, cfg, store, f"topic-{datetime.now(UTC):%Y%m%dT%H%M%SZ}", execute=True,
                          from_topic=True)
    COST[f"{cost_prefix}delete_s"] = time.monotonic() - started
    deleted = {r.ledger_id for r in result.results if r.outcome == "deleted" and r.ledger_type == "LEDGER"}
    return Swept(reconciled, deleted, list(result.results))


@dataclass
class Swept:
    reconciled: Reconciled
    deleted: set[int]
    results: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class AsBuilt:
    """What the broker wrote, read before any test changed it: every ledger's custom metadata, and the delayed
    subscription's cursor (its properties name the bucket snapshots)."""

    ledgers: dict[int, dict[str, bytes]]
    delayed_cursor: bytes


def real_ledgers(zk: KazooClient) -> dict[int, dict[str, bytes]]:
    """Every ledger under /ledgers (hierarchical layout) -> its custom metadata."""
    out: dict[int, dict[str, bytes]] = {}
    for top in zk.get_children("/ledgers"):
        if not (len(top) == 2 and top.isdigit()):
            continue
        for middle in zk.get_children(f"/ledgers/{top}"):
            for leaf in zk.get_children(f"/ledgers/{top}/{middle}"):
                data, _ = zk.get(f"/ledgers/{top}/{middle}/{leaf}")
                out[int(top + middle + leaf[1:])] = decode_ledger_metadata(data).custom_metadata
    return out


def receive_the_delayed_messages(world: World) -> int:
    """Consumes the workload's delayed messages once they are due (the broker reads them back from its bucket
    snapshots, whose ledgers only the cursor's properties name) and says how many arrived."""
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
    return len(got)
