"""Issue 26 on a real Pulsar: a second cluster writes to the testbed's bookie (harness.testbed.peer).

The peer is a real broker with its own metadata in a chroot of the same ZooKeeper, registered the way upstream
shares a BookKeeper (`initialize-cluster-metadata --existing-bk-metadata-service-uri`). Nothing in the
testbed cluster's metadata refers to its ledgers, so a sweeper that read only its own cluster would delete them:
the control run (BookKeeper declared dedicated) shows it would, and the runs that follow the rules show they
do not. The peer comes up after the orphan sweep (its fixture requests the session's `swept`): the peer's
ledgers would be orphans to that sweep's dedicated-BookKeeper configuration, and the peer's own sweep, which drains
the deletion topic and deletes, would take the orphans that sweep must delete itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.testbed.admin import Admin
from harness.testbed.orphans import ledger_znode
from harness.testbed.peer import PeerInfo, peer_down, peer_up
from harness.testbed.workload import produce, read_all
from harness.testbed.world import World, broker_references, zk_for
from sweeper.config import SweeperConfig
from sweeper.delete.stage import run_delete
from sweeper.pipeline import delete_stage, emit_stage, reconcile_stage, snapshot_stage
from sweeper.tables import TableStore, open_table_store
from tests.support.real_pulsar import COST, GRACE_S, Swept, sweeper_config

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1200)]

PEER_TOPIC = "persistent://public/default/written-by-the-peer"


@dataclass
class Peer:
    info: PeerInfo
    held: list[tuple[str, bytes]]
    ledgers: dict[int, str]  # every ledger the peer's broker references -> who
    data_ledgers: list[int]  # the peer topic's closed data ledgers
    written_at: float


def _peer_references(peer: PeerInfo) -> dict[int, str]:
    zk = KazooClient(hosts=peer.metadata, timeout=15.0)
    zk.start(timeout=30)
    try:
        return broker_references(Admin(peer.admin_url, ""), zk)
    finally:
        zk.stop()


@pytest.fixture(scope="module")
def peer(testbed_world: World, swept: Swept) -> Iterator[Peer]:
    started = time.monotonic()
    info = peer_up(testbed_world.info)
    COST["peer_up_s"] = time.monotonic() - started
    try:
        client = pulsar.Client(info.service_url, operation_timeout_seconds=30)
        try:
            consumer = client.subscribe(PEER_TOPIC, "peer-sub")
            produce(client, PEER_TOPIC, 35, prefix="peer")  # 10 entries a ledger: four ledgers
            for _ in range(12):  # a cursor that has moved: its position lives in a cursor ledger
                consumer.acknowledge(consumer.receive(timeout_millis=30_000))
            consumer.close()
            held = read_all(client, PEER_TOPIC)
        finally:
            client.close()
        time.sleep(2)  # the cursor's position flush (managedLedgerCursorPositionFlushSeconds=1)
        stats = Admin(info.admin_url, "").internal_stats(PEER_TOPIC)
        closed = [int(x["ledgerId"]) for x in stats["ledgers"][:-1]]
        assert len(closed) >= 3, stats["ledgers"]
        yield Peer(info, held, _peer_references(info), closed, time.time())
    finally:
        peer_down(info)


def _config(world: World, tables: Path, **safety: Any) -> SweeperConfig:
    return sweeper_config(world.info, tables).replace(safety=safety)


def _snapshot_reconcile(spark: SparkSession, cfg: SweeperConfig, store: TableStore) -> tuple[str, Any]:
    run_id = snapshot_stage(spark, cfg, store).run_id
    return run_id, reconcile_stage(spark, cfg, store, run_id)


def _candidates(store: TableStore, run_id: str) -> dict[int, str]:
    rows = store.read("orphans").where(f"run_id = '{run_id}' AND object_type = 'ledger'").collect()
    return {r["ledger_id"]: r["reason"] for r in rows if r["status"] == "candidate"}


def _in_bookkeeper(world: World, ledgers: list[int] | set[int]) -> set[int]:
    zk = zk_for(world.info)
    try:
        return {ledger for ledger in ledgers if zk.exists(ledger_znode(ledger))}
    finally:
        zk.stop()


def test_a_peer_clusters_ledgers_are_never_candidates_and_survive_a_sweep(
        testbed_world: World, peer: Peer, spark: SparkSession, tmp_path: Path) -> None:
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    assert _in_bookkeeper(testbed_world, peer.ledgers) == set(peer.ledgers), "the peer writes to our bookie"

    # Shared, and nobody named the peer: nothing at all is a candidate, and the summary says what to set.
    unverified = _config(testbed_world, tmp_path / "tables", bookkeeper_dedicated=False, peer_metadata=[])
    run_id, result = _snapshot_reconcile(spark, unverified, store)
    assert _candidates(store, run_id) == {}
    assert "peer_metadata" in result.sharing

    # The peer named: its references join ours.
    shared = _config(testbed_world, tmp_path / "tables", bookkeeper_dedicated=False,
                     peer_metadata=[peer.info.metadata])
    run_id, result = _snapshot_reconcile(spark, shared, store)
    assert result.counts.peer_clusters_read == 1, result.sharing
    assert not set(_candidates(store, run_id)) & set(peer.ledgers)

    # The peer's ledgers past the grace period, so only the rules above stand between them and a delete.
    time.sleep(max(0.0, peer.written_at + GRACE_S + 2 - time.time()))

    # Control: the same BookKeeper declared dedicated. The peer's ledgers are now orphans of a topic this
    # cluster does not have, which is what the union above prevents (so this test can fail).
    lie = _config(testbed_world, tmp_path / "tables", bookkeeper_dedicated=True, peer_metadata=[])
    run_id, _ = _snapshot_reconcile(spark, lie, store)
    assert set(peer.data_ledgers) <= set(_candidates(store, run_id)), _candidates(store, run_id)

    # The sweep as an operator would run it, with --execute: the peer's ledgers stay, its topic is intact.
    started = time.monotonic()
    run_id, _ = _snapshot_reconcile(spark, shared, store)
    assert not set(_candidates(store, run_id)) & set(peer.ledgers)
    emit_stage(spark, shared, store, run_id)
    result = delete_stage(spark, shared, store, f"peer-{run_id}", execute=True, from_topic=True)
    assert not {r.ledger_id for r in result.results if r.outcome == "deleted"} & set(peer.ledgers)
    # An operator's list naming the peer's ledgers (a stale plan, a mistake): each refused as in use.
    listing = tmp_path / "peer-ledgers.json"
    listing.write_text(json.dumps(peer.data_ledgers))
    listed = run_delete(spark, shared, store, "operator", execute=True, from_json=listing)
    got = {r.ledger_id: (r.outcome, r.detail) for r in listed.results if r.ledger_id is not None}
    assert set(got) == set(peer.data_ledgers)
    assert all(outcome == "in_use" and "peer cluster" in detail for outcome, detail in got.values()), got
    COST["peer_sweep_s"] = time.monotonic() - started

    assert _in_bookkeeper(testbed_world, peer.ledgers) == set(peer.ledgers)
    client = pulsar.Client(peer.info.service_url, operation_timeout_seconds=30)
    try:
        assert read_all(client, PEER_TOPIC) == peer.held
    finally:
        client.close()
