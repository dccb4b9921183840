"""The sweeper against a real Apache Pulsar 4.0.8 whose broker and bookie keep all their metadata in a real Oxia
server (issue 24): the testbed's `oxia` flavour (harness.testbed.server), three shards, the same workload and
orphans as on ZooKeeper (harness.testbed.world), made through the sweeper's kazoo-shaped `OxiaStore`.

What the ZooKeeper testbed proves (tests/real_pulsar/test_sweep.py), here on Oxia: the candidates are exactly the
induced orphans; none is a ledger the broker references; a sweep that emits to and drains from the broker's own
__ledger_deletion topic deletes exactly them, BookKeeper's shell no longer lists them; every topic still serves
every message and stats-internal names no deleted ledger. And the premise: what the broker and the bookie wrote is
spread over Oxia's shards, and every key of it is read where the server put it.

One testbed, snapshot and sweep for the module (the session's Oxia testbed, apart from the ZooKeeper one), all in
one xdist worker (tests/conftest.py): the tests read what the fixtures built, in file order, cheapest first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from kazoo.exceptions import NoNodeError
from pyspark.sql import SparkSession

from harness.testbed.admin import Admin
from harness.testbed.orphans import Metadata, ledger_znode
from harness.testbed.server import (
    OXIA_SHARDS,
    bookkeeper_ledgers,
)
from harness.testbed.workload import admin_for, client_for, read_all
from harness.testbed.world import World, broker_references, metadata_for, s3_client_for
from sweeper.layout import is_middle, is_tree_top
from sweeper.metastore.oxia import _server_hash as server_hash
from sweeper.pipeline import delete_stage, emit_stage, reconcile_stage
from sweeper.snapshot import run_snapshot
from sweeper.tables import open_table_store
from tests.support import testbed_session
from tests.support.real_pulsar import COST, GRACE_S, Reconciled, Swept, sweeper_config

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow,
              # The first test pays for the testbed, the workload, the grace period and the snapshot.
              pytest.mark.timeout(1500)]


@dataclass
class OxiaReconciled(Reconciled):
    """The plan, with the broker's view taken again right after the snapshot."""

    referenced_after: dict[int, str] = field(default_factory=dict)
    layout: str = ""

    def trimmed_by_pulsar(self) -> set[int]:
        """Ledgers the broker referenced before the snapshot and not after: Pulsar dropped them from their lists
        itself meanwhile, so whether the scan still saw them listed depends on the moment it read their topic.
        Seen on this testbed: about a minute after the broker restarts, it compacts a namespace's system topics
        (__change_events, __transaction_buffer_snapshot), trims their first ledgers and deletes them. Orphans
        either way; never ledgers the broker still uses."""
        return set(self.referenced_before) - set(self.referenced_after)

    def pulsar_leaks(self) -> set[int]:
        # A ledger being created while the views were taken (a rollover) is in use after: not a leak.
        return super().pulsar_leaks() - set(self.referenced_after)


@pytest.fixture(scope="session")
def oxia_world() -> World:
    """The Oxia testbed, prepared once for the session in the background (tests/support/testbed_session.py: by
    this process, or by the xdist controller, which stops it at the end)."""
    unavailable = testbed_session.unavailable(testbed_session.OXIA)
    if unavailable is not None:
        pytest.skip(unavailable)
    return testbed_session.world(testbed_session.OXIA)


@pytest.fixture(scope="module")
def oxia_reconciled(oxia_world: World, spark: SparkSession,
                    tmp_path_factory: pytest.TempPathFactory) -> OxiaReconciled:
    """Snapshot and reconcile once the orphans are past the grace period, between two views of the broker."""
    info = oxia_world.info
    # BookKeeper's shell during the grace period: a ledger created after it lists them is too young to be a
    # candidate, and one deleted after is taken out below.
    listed = bookkeeper_ledgers(info)
    newest = max(o.made_at_ms for o in oxia_world.manifest.orphans) / 1000
    waited = max(0.0, newest + GRACE_S + 2 - time.time())
    time.sleep(waited)
    COST["oxia_grace_wait_s"] = waited
    cfg = sweeper_config(info, tmp_path_factory.mktemp("oxia-tables"))
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    metadata = metadata_for(info)
    try:
        referenced = broker_references(admin_for(info), metadata)
        bk = {ledger for ledger in listed if metadata.exists(ledger_znode(ledger))}
        started = time.monotonic()
        snap = run_snapshot(spark, cfg, store)
        COST["oxia_snapshot_s"] = time.monotonic() - started
        started = time.monotonic()
        reconcile_stage(spark, cfg, store, snap.run_id)
        COST["oxia_reconcile_s"] = time.monotonic() - started
        after = broker_references(admin_for(info), metadata)
    finally:
        metadata.stop()
    rows = [r.asDict() for r in store.read("orphans").where(f"run_id = '{snap.run_id}'").collect()]
    return OxiaReconciled(oxia_world, cfg, store, snap.run_id, rows, referenced, bk, referenced_after=after,
                          layout=snap.layout)


@pytest.fixture(scope="module")
def oxia_swept(oxia_reconciled: OxiaReconciled, spark: SparkSession) -> Swept:
    """The plan emitted to the broker's own partitioned __ledger_deletion topic, drained and deleted (as the
    ZooKeeper testbed's `swept`)."""
    cfg, store = oxia_reconciled.cfg, oxia_reconciled.store
    started = time.monotonic()
    emitted = emit_stage(spark, cfg, store, oxia_reconciled.run_id)
    COST["oxia_emit_s"] = time.monotonic() - started
    offloaded = {key.rsplit("-ledger-", 1)[1].removesuffix("-index")
                 for key in oxia_reconciled.candidates("offload_object")}
    assert emitted.counts.get("published", 0) == len(oxia_reconciled.candidates("ledger")) + len(offloaded)
    started = time.monotonic()
    result = delete_stage(spark, cfg, store, f"topic-{datetime.now(UTC):%Y%m%dT%H%M%SZ}", execute=True,
                          from_topic=True)
    COST["oxia_delete_s"] = time.monotonic() - started
    deleted = {r.ledger_id for r in result.results if r.outcome == "deleted" and r.ledger_type == "LEDGER"}
    return Swept(oxia_reconciled, deleted, list(result.results))


def test_broker_and_bookie_keep_their_metadata_in_oxia_over_its_shards(oxia_reconciled: OxiaReconciled) -> None:
    """The premise. No ZooKeeper runs; the ledgers lie in all of Oxia's shards, and the sweeper's point reads find
    each one a listing (which asks every shard) names: PyPI's client alone would look for most in the wrong shard.
    Pulsar's metadata-store driver writes no /ledgers/LAYOUT record, and the snapshot reads the hybrid
    hierarchical layout that driver always uses (before the sweeper knew, the snapshot refused: "no LAYOUT
    znode under '/ledgers'")."""
    info = oxia_reconciled.world.info
    assert info.on_oxia and info.zk_port == 0
    assert oxia_reconciled.layout == "hierarchical"
    store = metadata_for(info)
    try:
        assert store.exists("/ledgers/LAYOUT") is None
        directories = [f"/ledgers/{top}/{middle}" for top in filter(is_tree_top, store.get_children("/ledgers"))
                       for middle in filter(is_middle, store.get_children(f"/ledgers/{top}"))]
        listed = _listed(store, directories)
        assert {ledger_znode(ledger) for ledger in oxia_reconciled.world.manifest.orphan_ledgers()} <= listed
        assert {_shard_of(key) for key in listed} == set(range(OXIA_SHARDS))
        unread = {key for key in listed if not _readable(store, key)}
        # Pulsar may delete a ledger between the listing and the read; one the listing still names must read.
        assert not unread & _listed(store, sorted({key.rsplit("/", 1)[0] for key in unread}))
    finally:
        store.stop()


def _listed(store: Metadata, directories: list[str]) -> set[str]:
    return {f"{directory}/{name}" for directory in directories for name in store.get_children(directory)}


def _readable(store: Metadata, key: str) -> bool:
    """A point read, which goes to the one shard the key hashes to."""
    try:
        return bool(store.get(key)[0])
    except NoNodeError:
        return False


def _shard_of(key: str) -> int:
    """The shard `oxia standalone` puts a key in: its namespace's hash space cut in equal ranges in shard order
    (oxia common/sharding `GenerateShards`), the key's hash as the server computes it."""
    return min(server_hash(key) // (0xFFFFFFFF // OXIA_SHARDS + 1), OXIA_SHARDS - 1)


def test_candidates_are_exactly_the_induced_orphans(oxia_reconciled: OxiaReconciled) -> None:
    manifest = oxia_reconciled.world.manifest
    candidates = oxia_reconciled.candidates("ledger")
    trimmed = oxia_reconciled.trimmed_by_pulsar()
    leaks = oxia_reconciled.pulsar_leaks()
    COST["oxia_pulsar_leaked_ledgers"] = len(leaks)
    COST["oxia_trimmed_during_snapshot"] = len(trimmed & set(candidates))
    expected = oxia_reconciled.expected_ledgers()
    assert set(candidates) - trimmed == expected, {
        r["ledger_id"]: (r["status"], r["reason"], r["managed_ledger"], r["cursor"])
        for r in oxia_reconciled.rows if r["ledger_id"] in (set(candidates) - trimmed) ^ expected}
    assert {ledger: reason for ledger, reason in candidates.items()
            if ledger not in leaks | trimmed} == manifest.orphan_ledgers()
    assert oxia_reconciled.candidates("offload_object") == manifest.orphan_objects()


def test_nothing_the_broker_references_is_a_candidate(oxia_reconciled: OxiaReconciled) -> None:
    """stats-internal of every topic (system topics included), cursor properties for bucket snapshots, before and
    after the snapshot. Before, only ledgers Pulsar itself dropped meanwhile may be planned."""
    planned = set(oxia_reconciled.candidates("ledger"))
    assert not {ledger: who for ledger, who in oxia_reconciled.referenced_after.items() if ledger in planned}
    assert planned & set(oxia_reconciled.referenced_before) <= oxia_reconciled.trimmed_by_pulsar()
    unreferenced = oxia_reconciled.bk_before - set(oxia_reconciled.referenced_before)
    assert set(oxia_reconciled.world.manifest.orphan_ledgers()) <= unreferenced


def test_sweep_deletes_exactly_the_orphans(oxia_swept: Swept) -> None:
    reconciled = oxia_swept.reconciled
    assert isinstance(reconciled, OxiaReconciled)
    trimmed = reconciled.trimmed_by_pulsar()
    # A ledger Pulsar was deleting itself may be gone before the delete reaches it.
    failed = [(r.ledger_id, r.ledger_type, r.outcome, r.detail) for r in oxia_swept.results
              if r.outcome != "deleted" and not (r.outcome == "already_gone" and r.ledger_id in trimmed)]
    assert not failed
    assert oxia_swept.deleted - trimmed == reconciled.expected_ledgers()
    info = reconciled.world.info
    keys = {o["Key"] for o in s3_client_for(info).list_objects_v2(Bucket=info.offload_bucket).get("Contents", [])}
    assert not keys & set(reconciled.world.manifest.orphan_objects())
    assert keys, "the offloaded topic's objects stay"
    assert not bookkeeper_ledgers(info) & oxia_swept.deleted


def test_every_topic_serves_every_message_and_the_broker_names_no_deleted_ledger(oxia_swept: Swept) -> None:
    world = oxia_swept.reconciled.world
    client = client_for(world.info)
    try:
        for name, held in world.held.items():
            assert [(mid, data.hex()) for mid, data in read_all(client, name)] == held, name
        for name, held in world.compacted.items():
            now = [(mid, data.hex()) for mid, data in read_all(client, name, compacted=True)]
            assert now == held, f"compacted read of {name}"
    finally:
        client.close()
    admin = admin_for(world.info)
    store = metadata_for(world.info)
    try:
        referenced = broker_references(admin, store)
        assert not {ledger: who for ledger, who in referenced.items() if ledger in oxia_swept.deleted}
        offloaded = {ledger for name in world.held for ledger in _offloaded(admin, name)}
        missing = {ledger: who for ledger, who in referenced.items()
                   if ledger not in offloaded and store.exists(ledger_znode(ledger)) is None}
        assert not missing
    finally:
        store.stop()


def _offloaded(admin: Admin, name: str) -> set[int]:
    return {int(ledger["ledgerId"]) for ledger in admin.internal_stats(name)["ledgers"] if ledger.get("offloaded")}

