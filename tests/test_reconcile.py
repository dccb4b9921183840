"""Reconcile against the sandbox's ground truth: recall and precision of 100%, at several seeds."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import OrphanKind, SandboxSpec, Status, build_cluster
from harness.sandbox.seed import seed_zookeeper
from sweeper.codecs.layout import LedgerLayout
from sweeper.reconcile.errors import ReconcileRefused
from sweeper.reconcile.stage import (
    CANDIDATE,
    MISSING,
    OUT_OF_SCOPE,
    PROTECTED,
    STALE_POINTER,
    UNKNOWN,
    YOUNG,
    SafetySettings,
    run_reconcile,
)
from sweeper.rules.safety import CircuitBreaker, GracePeriod, Scope
from sweeper.tables import TableStore
from tests.support.ledgers import CREATED, ledger_bytes
from tests.support.seeded import SeededSnapshotMaker

PERMISSIVE = SafetySettings(breaker=CircuitBreaker(1.0),
                   bookkeeper_dedicated=True)


def _orphans(store: TableStore, run_id: str) -> dict[tuple[str, int], dict[str, Any]]:
    rows = store.read("orphans").where(f"run_id = '{run_id}'").collect()
    return {(r["object_type"], r["ledger_id"]): r.asDict() for r in rows}


@pytest.mark.parametrize(("seed", "topics", "layout"), [
    (11, 30, LedgerLayout.HIERARCHICAL),
    (23, 80, LedgerLayout.LONG_HIERARCHICAL),
    (5, 50, LedgerLayout.FLAT),
    (3, 30, LedgerLayout.HIERARCHICAL),  # a replaced cursor ledger of `__compaction` on a live topic: protected
])
def test_every_injected_orphan_found_and_nothing_in_use_listed(
    seed: int, topics: int, layout: LedgerLayout, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession,
) -> None:
    cluster, _, store, run_id = seeded_snapshot(SandboxSpec(seed=seed, topics=topics, layout=layout))
    result = run_reconcile(spark, store, run_id, PERMISSIVE)
    found = _orphans(store, run_id)
    ledgers = {lid: row for (kind, lid), row in found.items() if kind == "ledger"}

    truth = cluster.ledgers
    # Offload is off here: no bucket listed, so no BookKeeper copy of an offloaded ledger may go (issue 26, 7).
    kept = {i for i, x in truth.items() if x.orphan_kind is OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT}
    expected_candidates = {i: x.orphan_kind.value for i, x in truth.items()
                           if x.status is Status.ORPHAN and i not in kept}
    got_candidates = {i: r["reason"] for i, r in ledgers.items() if r["status"] == CANDIDATE}
    assert got_candidates == expected_candidates  # recall and precision, and the reason for each
    assert {ledgers[i]["reason"] for i in kept if i in ledgers} <= {"offloaded_copy_not_verified"}

    kept = {i for i in kept if truth[i].status in (Status.ORPHAN, Status.YOUNG_ORPHAN)}
    assert {i for i, r in ledgers.items() if r["status"] == YOUNG} == {
        i for i, x in truth.items() if x.status is Status.YOUNG_ORPHAN} - kept
    assert {i for i, r in ledgers.items() if r["status"] == UNKNOWN} == {
        i for i, x in truth.items() if x.status is Status.UNKNOWN} | kept
    assert {i for i, r in ledgers.items() if r["status"] == PROTECTED} == {
        i for i, x in truth.items() if x.status is Status.PROTECTED}
    in_use = {i for i, x in truth.items() if x.status in (Status.IN_USE, Status.NON_PULSAR)}
    assert not in_use & set(ledgers), "a ledger in use (or not Pulsar's) was listed"
    missing = {lid for (kind, lid), row in found.items() if kind == "missing_ledger" and row["status"] == MISSING}
    assert missing == set(cluster.missing_ledgers)
    # A compaction pointer ZooKeeper holds while a cursor ledger is active names a ledger a newer
    # compaction deleted: reported as a possibly stale pointer, never as lost data.
    stale = {lid for (kind, lid), row in found.items() if kind == "missing_ledger" and row["status"] == STALE_POINTER}
    assert stale == set(cluster.stale_pointers) and stale
    assert result.counts.by_status_and_type[f"{CANDIDATE}.ledger"] == len(expected_candidates)
    assert result.counts.non_pulsar_ledgers == sum(1 for x in truth.values() if x.status is Status.NON_PULSAR)
    report = store.read("orphan_report").where(f"run_id = '{run_id}'").collect()
    assert sum(r["orphans"] for r in report) == len(expected_candidates)
    # Without a clock given, the grace period is measured at the snapshot's capture: each row's age and time.
    (captured,) = {r["captured_at"] for r in store.read("bk_ledgers").where(f"run_id = '{run_id}'").collect()}
    captured_ms = int(captured.timestamp() * 1000)  # the classifier's clock is whole milliseconds
    assert {int(row["captured_at"].timestamp() * 1000) for row in found.values()} == {captured_ms}
    assert all(row["age_ms"] == captured_ms - row["created_ms"] for row in ledgers.values())


def test_circuit_breaker_stops_the_run_and_writes_nothing(
    seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    _, _, store, run_id = seeded_snapshot(SandboxSpec(seed=3, topics=20))
    with pytest.raises(ReconcileRefused, match="circuit breaker"):
        run_reconcile(spark, store, run_id, SafetySettings(breaker=CircuitBreaker(0.01),
                   bookkeeper_dedicated=True))
    assert not store.exists("orphans")


def test_grace_period_holds_back_every_candidate(
    seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    _, _, store, run_id = seeded_snapshot(SandboxSpec(seed=11, topics=30))
    # A grace period longer than any orphan's age: nothing may be a candidate.
    settings = SafetySettings(grace=GracePeriod.of(10_000 * 86_400_000), breaker=CircuitBreaker(1.0),
                   bookkeeper_dedicated=True)
    run_reconcile(spark, store, run_id, settings)
    rows = [r for r in _orphans(store, run_id).values() if r["object_type"] == "ledger"]
    assert rows and {r["status"] for r in rows} == {YOUNG, UNKNOWN}


def test_scope_deny_list_holds_back_a_tenant(
    seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    _, _, store, run_id = seeded_snapshot(SandboxSpec(seed=11, topics=30))
    deny = Scope(deny=("tenant-1", "sandbox-peer-tenant"))
    run_reconcile(spark, store, run_id, SafetySettings(breaker=CircuitBreaker(1.0), scope=deny,
                                                       bookkeeper_dedicated=True))
    rows = [r for r in _orphans(store, run_id).values() if r["object_type"] == "ledger"]
    assert {r["tenant"] for r in rows if r["status"] == CANDIDATE} == {"tenant-0"}
    assert {r["tenant"] for r in rows if r["status"] == OUT_OF_SCOPE} == {"tenant-1", "sandbox-peer-tenant"}


def test_reconcile_twice_for_one_run_is_refused(
    seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    _, _, store, run_id = seeded_snapshot(SandboxSpec(seed=2, topics=10))
    run_reconcile(spark, store, run_id, PERMISSIVE)
    with pytest.raises(ReconcileRefused, match="already"):
        run_reconcile(spark, store, run_id, PERMISSIVE)


def test_unknown_run_is_refused(seeded_snapshot: SeededSnapshotMaker, spark: SparkSession) -> None:
    _, _, store, _ = seeded_snapshot(SandboxSpec(seed=2, topics=5))
    with pytest.raises(ReconcileRefused, match="no successful snapshot"):
        run_reconcile(spark, store, "no-such-run", PERMISSIVE)


def test_a_quarantined_managed_ledger_makes_its_bucket_and_compacted_ledgers_unknown(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    # Issue 11 (5): bucket and compacted ledgers name their topic, not their managed ledger; the quarantine
    # join went through a managed-ledger row that a quarantined znode does not have, so they looked deleted.
    from harness.sandbox.model import SPECIAL_TOPIC

    cluster = build_cluster(SandboxSpec(seed=11, topics=30))
    seed_zookeeper(zk, cluster)
    special = next(m for m in cluster.managed_ledgers if m.topic == SPECIAL_TOPIC)
    zk.set(f"/managed-ledgers/{special.name}", b"\x47\x78\x00\x00\x00\x02\x08\x09junk")  # undecodable
    owned = {i for i, x in cluster.ledgers.items() if x.status is not Status.IN_USE and special.topic_name.encode()
             in (x.custom.get("pulsar/delayedIndexTopic"), x.custom.get("pulsar/compactedTopic"))}
    assert len(owned) >= 2
    _, _, store, run_id = seeded_snapshot(cluster, reseed=False)
    run_reconcile(spark, store, run_id, PERMISSIVE)
    found = _orphans(store, run_id)
    assert {found[("ledger", i)]["status"] for i in owned} == {UNKNOWN}
    assert {found[("ledger", i)]["reason"] for i in owned} == {"owner_metadata_quarantined"}


def test_a_deleted_namespaces_ledgers_are_orphans_only_on_a_dedicated_bookkeeper(
    seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    # Issue 11 (3): ledger metadata names no cluster; a namespace unknown here may be another cluster's.
    cluster, _, store, run_id = seeded_snapshot(SandboxSpec(seed=2, topics=10))
    foreign = {i for i, x in cluster.ledgers.items()
               if x.custom.get("pulsar/managed-ledger", b"").startswith(b"sandbox-peer-tenant/")}
    assert len(foreign) == 1
    shared = SafetySettings(breaker=CircuitBreaker(1.0))  # bookkeeper_dedicated = false, no peer_metadata
    result = run_reconcile(spark, store, run_id, shared)
    rows = _orphans(store, run_id)
    row = rows[("ledger", *foreign)]
    assert (row["status"], row["reason"]) == (UNKNOWN, "namespace_unknown")
    # Issue 26 (3): nothing at all is a candidate on a shared BookKeeper whose other clusters were not read.
    ledgers = [r for (kind, _), r in rows.items() if kind == "ledger"]
    assert result.counts.by_status_and_type.get("candidate.ledger", 0) == 0
    assert result.counts.shared_bookkeeper_unverified == 1
    assert sum(r["reason"] == "shared_bookkeeper_unverified" for r in ledgers) > 10
    assert "peer_metadata" in result.sharing
    _, _, _, again = seeded_snapshot(SandboxSpec(seed=2, topics=10), reseed=False)
    run_reconcile(spark, store, again, SafetySettings(breaker=CircuitBreaker(1.0),
                   bookkeeper_dedicated=True))
    row = _orphans(store, again)[("ledger", *foreign)]
    assert (row["status"], row["reason"]) == (CANDIDATE, "topic_deleted")


def test_cursor_ledgers_of_protected_cursors_on_a_live_topic_are_protected(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, zk_clock: Any
) -> None:
    # Issue 26 (1): an unreferenced cursor ledger of a cursor Pulsar (or the operator) protects is never a
    # candidate while its topic lives; the same leftover of an ordinary subscription is.
    from sweeper.codecs.layout import ledger_path
    from sweeper.rules.protection import Protection

    spec = SandboxSpec(seed=11, topics=30)
    cluster = build_cluster(spec)
    seed_zookeeper(zk, cluster)
    live = cluster.managed_ledgers[0].name
    cursors = {900_001: "__pending_ack_state", 900_002: "audit-7", 900_003: "plain-sub"}
    with zk_clock.at(CREATED):
        for ledger_id, cursor in cursors.items():
            custom = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": live,
                      "pulsar/cursor": cursor}
            zk.create(ledger_path(spec.ledgers_root, ledger_id, spec.layout), ledger_bytes(custom), makepath=True)
    _, _, store, run_id = seeded_snapshot(spec, reseed=False)
    settings = SafetySettings(breaker=CircuitBreaker(1.0), bookkeeper_dedicated=True,
                              protection=Protection.of(subscriptions="audit-*"))
    run_reconcile(spark, store, run_id, settings)
    rows = _orphans(store, run_id)
    assert (rows[("ledger", 900_001)]["status"], rows[("ledger", 900_001)]["reason"]) == ("protected", "cursor_deleted")
    assert "transaction_pending_ack_cursor" in rows[("ledger", 900_001)]["detail"]
    assert "operator_protected_subscription" in rows[("ledger", 900_002)]["detail"]
    assert rows[("ledger", 900_002)]["status"] == "protected"
    assert (rows[("ledger", 900_003)]["status"], rows[("ledger", 900_003)]["reason"]) == (CANDIDATE, "cursor_deleted")
