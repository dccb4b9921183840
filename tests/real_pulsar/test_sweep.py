"""The sweeper against a real Apache Pulsar (the testbed, tests/real_pulsar/conftest.py): snapshot and
reconcile find exactly the induced orphans; a sweep that emits to and drains from the broker's own
__ledger_deletion topic deletes exactly them and nothing any topic still serves; and a sweep during
live churn deletes nothing the broker references."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.testbed.admin import Admin, AdminError
from harness.testbed.orphans import ledger_znode, schema_path
from harness.testbed.server import bookkeeper_ledgers
from harness.testbed.workload import (
    SCHEMA_EVOLVE,
    SHADOW,
    SHADOW_SOURCE,
    admin_for,
    client_for,
    read_all,
)
from harness.testbed.world import (
    World,
    broker_references,
    managed_ledger_topics,
    s3_client_for,
    zk_for,
)
from tests.support.churn import churn_sweep_deletes_nothing_in_use
from tests.support.real_pulsar import COST, Reconciled, Swept, receive_the_delayed_messages

# The first test also pays for the testbed (start, workload, orphans, grace) and the snapshot (the session's
# `reconciled` and `swept` fixtures, tests/real_pulsar/conftest.py).
pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_candidates_are_exactly_the_induced_orphans(reconciled: Reconciled) -> None:
    manifest = reconciled.world.manifest
    candidates = reconciled.candidates("ledger")
    leaks, trimmed = reconciled.pulsar_leaks(), reconciled.trimmed_by_pulsar()
    COST["pulsar_leaked_ledgers"] = len(leaks)
    COST["trimmed_during_snapshot"] = len(trimmed & set(candidates))
    expected = reconciled.expected_ledgers()
    found = set(candidates) - trimmed
    assert found == expected, {r["ledger_id"]: (r["status"], r["reason"], r["managed_ledger"], r["cursor"])
                               for r in reconciled.rows if r["ledger_id"] in found ^ expected}
    assert {ledger: reason for ledger, reason in candidates.items()
            if ledger not in leaks | trimmed} == manifest.orphan_ledgers()
    assert reconciled.candidates("offload_object") == manifest.orphan_objects()


def test_nothing_the_broker_references_is_a_candidate(reconciled: Reconciled) -> None:
    """The broker's own view (stats-internal of every topic, system topics included) against the plan."""
    planned = set(reconciled.candidates("ledger"))
    assert not {ledger: who for ledger, who in reconciled.referenced_after.items() if ledger in planned}
    # Before, only ledgers Pulsar itself dropped meanwhile may be planned.
    assert planned & set(reconciled.referenced_before) <= reconciled.trimmed_by_pulsar()
    # And the ground truth agrees with the broker: every induced orphan is one it does not reference; the
    # only others it does not reference are the few Pulsar leaked itself.
    unreferenced = reconciled.bk_before - set(reconciled.referenced_before)
    assert set(reconciled.world.manifest.orphan_ledgers()) <= unreferenced
    assert unreferenced - set(reconciled.referenced_after) == reconciled.expected_ledgers()


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
    trimmed = swept.reconciled.trimmed_by_pulsar()
    # A ledger Pulsar was deleting itself may be gone before the delete reaches it.
    failed = [(r.ledger_id, r.ledger_type, r.outcome, r.detail) for r in swept.results
              if r.outcome != "deleted" and not (r.outcome == "already_gone" and r.ledger_id in trimmed)]
    assert not failed
    assert swept.deleted - trimmed == swept.reconciled.expected_ledgers()
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
        # A shadow topic's view of its source may name a ledger the source dropped and deleted (upstream
        # ShadowManagedLedgerImpl.processSourceManagedLedgerInfo keeps the last ledger it saw until its open
        # fails): Pulsar's lag, never ours when the ledger was gone before our snapshot and the source no
        # longer lists it.
        source = {int(ledger["ledgerId"]) for ledger in admin_for(info).internal_stats(SHADOW_SOURCE)["ledgers"]}
        lagging = {ledger for ledger, who in missing.items()
                   if who.startswith(SHADOW + " ") and ledger not in swept.reconciled.bk_before | source}
        assert not {k: v for k, v in missing.items() if k not in offloaded and k not in lagging}
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
    churn_sweep_deletes_nothing_in_use(testbed_world, spark, tmp_path / "tables", "churn_sweep_s")


def test_delayed_messages_are_delivered(swept: Swept) -> None:
    # Its consumer makes the broker deliver the bucket snapshots and delete them: `swept` requests `as_built`,
    # so what test_fidelity.py compares was read before.
    world = swept.reconciled.world
    assert receive_the_delayed_messages(world) == world.workload.delayed_count
