"""The sweeper against a real Apache Pulsar 4.0.8 whose broker and bookies keep all their metadata in a real Oxia
server (issue 24): the testbed's `oxia` flavour (harness.testbed.server), three shards, the same workload and
orphans as on ZooKeeper (harness.testbed.world), made through the sweeper's kazoo-shaped `OxiaStore`.

What the ZooKeeper testbed proves (tests/real_pulsar/test_sweep.py), here on Oxia: the candidates are exactly the
induced orphans; none is a ledger the broker references; a sweep that emits to and drains from the broker's own
__ledger_deletion topic deletes exactly them, BookKeeper's shell no longer lists them; every topic still serves
every message and stats-internal names no deleted ledger; a sweep during live churn deletes nothing in use; the
delayed messages, read back from bucket snapshots, are delivered after the sweep. And the premises: what the
broker and the bookies wrote is spread over Oxia's shards, and every key of it is read where the server put it;
the sandbox seeds Oxia as Pulsar leaves it. And the testbed's three bookies, as on ZooKeeper (test_bookies.py):
each registers its own HTTP server, every ledger is striped over them, and one stopped or killed comes back by pid
(last: the broker closes the ledgers it was writing when a bookie goes down).

One testbed, snapshot and sweep for the module (the session's Oxia testbed, apart from the ZooKeeper one), all in
one xdist worker (tests/conftest.py): the tests read what the fixtures built, in file order, cheapest first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.exceptions import NoNodeError
from pyspark.sql import SparkSession

from harness.testbed.admin import Admin
from harness.testbed.bulk import FREED, ReclaimLayout
from harness.testbed.orphans import Metadata, ledger_znode, ml_path
from harness.testbed.server import (
    OXIA_SHARDS,
    bookkeeper_ledgers,
)
from harness.testbed.workload import admin_for, client_for, read_all
from harness.testbed.world import World, broker_references, managed_ledger_topics, metadata_for, s3_client_for
from sweeper.codecs.layout import is_middle, is_tree_top
from sweeper.metastore.oxia_keys import server_hash
from tests.real_pulsar.test_reclaim import assert_freed, build_layout, delete_pads, sweep_case
from tests.support import testbed_session
from tests.support.bookies import (
    assert_a_bookie_stopped_or_killed_comes_back_by_pid,
    assert_every_bookie_registers_its_http_server,
    assert_ledgers_are_striped_over_the_three_bookies,
)
from tests.support.churn import churn_sweep_deletes_nothing_in_use
from tests.support.real_pulsar import (
    COST,
    Reconciled,
    Swept,
    receive_the_delayed_messages,
    reconcile_the_world,
    sweep_the_plan,
)

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow,
              # The first test pays for the testbed, the workload, the grace period and the snapshot.
              pytest.mark.timeout(1500)]


@pytest.fixture(scope="session")
def oxia_world() -> World:
    """The Oxia testbed, prepared once for the session in the background (tests/support/testbed_session.py: by
    this process, or by the xdist controller, which stops it at the end)."""
    unavailable = testbed_session.unavailable(testbed_session.OXIA)
    if unavailable is not None:
        pytest.skip(unavailable)
    return testbed_session.world(testbed_session.OXIA)


@pytest.fixture(scope="module")
def oxia_reconciled(oxia_world: World, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Reconciled:
    """Snapshot and reconcile, between two views of the broker (as the ZooKeeper testbed's `reconciled`)."""
    return reconcile_the_world(oxia_world, spark, tmp_path_factory.mktemp("oxia-tables"), cost_prefix="oxia_")


@pytest.fixture(scope="module")
def oxia_swept(oxia_reconciled: Reconciled, spark: SparkSession) -> Swept:
    """The plan emitted to the broker's own partitioned __ledger_deletion topic, drained and deleted (as the
    ZooKeeper testbed's `swept`)."""
    return sweep_the_plan(oxia_reconciled, spark, cost_prefix="oxia_")


def test_broker_and_bookie_keep_their_metadata_in_oxia_over_its_shards(oxia_reconciled: Reconciled) -> None:
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
        listed = _listed(store, _ledger_directories(store))
        assert {ledger_znode(ledger) for ledger in oxia_reconciled.world.manifest.orphan_ledgers()} <= listed
        assert {_shard_of(key) for key in listed} == set(range(OXIA_SHARDS))
        unread = {key for key in listed if not _readable(store, key)}
        # Pulsar may delete a ledger between the listing and the read; one the listing still names must read.
        assert not unread & _listed(store, sorted({key.rsplit("/", 1)[0] for key in unread}))
    finally:
        store.stop()


def _ledger_directories(store: Metadata) -> list[str]:
    """The directories that hold ledger records (`/ledgers/00/0000`, ...)."""
    return [f"/ledgers/{top}/{middle}" for top in filter(is_tree_top, store.get_children("/ledgers"))
            for middle in filter(is_middle, store.get_children(f"/ledgers/{top}"))]


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


def test_every_parent_pulsar_leaves_in_oxia_is_an_empty_record_as_the_sandbox_seeds_it(oxia_world: World) -> None:
    """Fidelity of the sandbox's Oxia (harness.sandbox.seed.seed_oxia, which tests/test_oxia.py sweeps): it writes
    every record's parents first as empty records, as Pulsar's `OxiaMetadataStore` creates missing parents, and no
    /ledgers/LAYOUT. On what the real broker and bookie wrote: every parent of a ledger, a managed ledger and a
    cursor record is itself a record, and an empty one."""
    store = metadata_for(oxia_world.info)
    try:
        records = _listed(store, _ledger_directories(store))
        for name in managed_ledger_topics(store):
            managed_ledger = ml_path(name)
            records.add(managed_ledger)
            records |= {f"{managed_ledger}/{cursor}" for cursor in store.get_children(managed_ledger)}
        parents = {"/" + "/".join(key.strip("/").split("/")[:depth])
                   for key in records for depth in range(1, key.count("/"))} - records
        assert {"/ledgers", "/ledgers/00", "/managed-ledgers"} <= parents
        assert any(parent.endswith("/persistent") for parent in parents), "managed ledgers were read"
        assert any(key.count("/") == 6 for key in records), "cursors were read"
        values: dict[str, bytes | None] = {}
        for parent in sorted(parents):
            try:
                values[parent] = store.get(parent)[0]
            except NoNodeError:
                values[parent] = None
        assert {parent: value for parent, value in values.items() if value != b""} == {}
    finally:
        store.stop()


def test_candidates_are_exactly_the_induced_orphans(oxia_reconciled: Reconciled) -> None:
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


def test_nothing_the_broker_references_is_a_candidate(oxia_reconciled: Reconciled) -> None:
    """stats-internal of every topic (system topics included), cursor properties for bucket snapshots, before and
    after the snapshot. Before, only ledgers Pulsar itself dropped meanwhile may be planned."""
    planned = set(oxia_reconciled.candidates("ledger"))
    assert not {ledger: who for ledger, who in oxia_reconciled.referenced_after.items() if ledger in planned}
    assert planned & set(oxia_reconciled.referenced_before) <= oxia_reconciled.trimmed_by_pulsar()
    unreferenced = oxia_reconciled.bk_before - set(oxia_reconciled.referenced_before)
    assert set(oxia_reconciled.world.manifest.orphan_ledgers()) <= unreferenced


def test_sweep_deletes_exactly_the_orphans(oxia_swept: Swept) -> None:
    reconciled = oxia_swept.reconciled
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



def test_live_churn_sweep_deletes_nothing_in_use(oxia_world: World, oxia_swept: Swept, spark: SparkSession,
                                                 tmp_path: Path) -> None:
    """As on ZooKeeper: a full sweep while producers roll ledgers, topics come and go and a topic is compacted.
    On Oxia each ledger is its own compare-and-set (no multi-key transaction), so this is where a referrer
    written between the delete's check and its delete would show."""
    churn_sweep_deletes_nothing_in_use(oxia_world, spark, tmp_path / "tables", "oxia_churn_sweep_s")


@pytest.fixture(scope="module")
def oxia_reclaim_layout(oxia_world: World, oxia_swept: Swept) -> ReclaimLayout:
    """Issue 35's orphans, made after the module's sweep (its plan must not see them)."""
    return build_layout(oxia_world.info, (FREED,))


def test_orphans_in_logs_of_their_own_are_freed_as_on_zookeeper(oxia_world: World,
                                                                oxia_reclaim_layout: ReclaimLayout,
                                                                spark: SparkSession, tmp_path: Path) -> None:
    """tests/real_pulsar/test_reclaim.py's `freed` case on Oxia: every bookie registers its HTTP server there too
    (found as registered, 127.0.0.1), and each bookie's disk shrinks as its `reclaim` row says. Before the delayed
    messages' test, which waits for them to be due anyway."""
    info = oxia_world.info
    delete_pads(info, oxia_reclaim_layout, FREED)
    measured = sweep_case(spark, info, tmp_path / "tables", oxia_reclaim_layout, FREED, trigger_gc=True)
    COST["oxia_reclaim_freed_sweep_s"] = measured.seconds
    assert_freed(measured, oxia_reclaim_layout, info)


def test_delayed_messages_are_delivered(oxia_swept: Swept) -> None:
    """The bucket snapshots, which only the delayed subscription's cursor properties name, outlived the sweep."""
    world = oxia_swept.reconciled.world
    assert receive_the_delayed_messages(world) == world.workload.delayed_count


def test_every_bookie_registers_its_own_http_server_in_oxia(oxia_world: World) -> None:
    """The three bookies' registrations, as the ZooKeeper testbed's (test_bookies.py): host:port ids, the HTTP
    endpoint on loopback (httpServerHost set)."""
    assert_every_bookie_registers_its_http_server(oxia_world.info)


def test_every_ledger_is_striped_over_the_three_bookies_on_oxia(oxia_world: World) -> None:
    assert_ledgers_are_striped_over_the_three_bookies(oxia_world)


def test_a_bookie_stopped_or_killed_comes_back_by_pid_on_oxia(oxia_world: World, oxia_swept: Swept) -> None:
    """Last in the module: a bookie down makes the broker close the ledgers it was writing. On Oxia a killed
    bookie's registration is a lock Pulsar's registration manager will not wait for: start_bookie waits it out."""
    seconds = assert_a_bookie_stopped_or_killed_comes_back_by_pid(
        oxia_world, "persistent://public/default/written-after-a-bookie-restart")
    COST.update({f"oxia_bookie_{step}_s": value for step, value in seconds.items()})
