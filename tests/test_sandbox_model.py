"""The sandbox's ground truth must agree with its own references, or every later check is moot."""

from __future__ import annotations

import pytest

from harness.sandbox.model import (
    COMPACTION_CURSOR,
    OrphanKind,
    SandboxCluster,
    SandboxSpec,
    Status,
    build_cluster,
    pulsar_protects_cursor,
)
from sweeper.codecs.layout import INT_MAX, LedgerLayout


def referenced_ids(cluster: SandboxCluster) -> set[int]:
    refs: set[int] = set()
    for ml in cluster.managed_ledgers:
        refs |= {x.ledger_id for x in ml.ledgers}
        for cursor in ml.cursors:
            if cursor.cursors_ledger_id != -1:
                refs.add(cursor.cursors_ledger_id)
            refs |= {int(v) for v in cursor.string_properties.values()}
            refs |= set(cursor.long_properties.values())
    for locator in cluster.schemas:
        refs |= {e.ledger_id for e in locator.entries}
    return refs


@pytest.mark.parametrize("seed", [1, 2, 3, 42])
@pytest.mark.parametrize("layout", list(LedgerLayout))
def test_status_agrees_with_references(seed: int, layout: LedgerLayout) -> None:
    cluster = build_cluster(SandboxSpec(seed=seed, topics=60, layout=layout))
    refs = referenced_ids(cluster)
    for ledger in cluster.ledgers.values():
        if ledger.status is Status.IN_USE:
            assert ledger.ledger_id in refs, ledger
        elif ledger.status in (Status.ORPHAN, Status.YOUNG_ORPHAN, Status.PROTECTED):
            # bookkeeperDeleted=true ledgers are listed, yet BookKeeper should not have them.
            listed = ledger.orphan_kind is OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT
            assert (ledger.ledger_id in refs) == listed, ledger
            assert ledger.ctime_ms is not None
    assert set(cluster.missing_ledgers) <= refs
    assert not set(cluster.missing_ledgers) & set(cluster.ledgers)


def test_deterministic() -> None:
    a = build_cluster(SandboxSpec(seed=9, topics=50))
    b = build_cluster(SandboxSpec(seed=9, topics=50))
    assert a.counts() == b.counts()
    assert [(x.ledger_id, x.status, x.custom) for x in a.ledgers.values()] == [
        (x.ledger_id, x.status, x.custom) for x in b.ledgers.values()
    ]


def test_every_orphan_kind_and_feature_appears() -> None:
    cluster = build_cluster(SandboxSpec(seed=11, topics=30))
    kinds = {ledger.orphan_kind for ledger in cluster.ledgers.values() if ledger.orphan_kind}
    assert kinds == set(OrphanKind)
    # A protected leftover needs a topic whose only cursor is `__compaction`: seed 3 has one (the next test).
    assert {ledger.status for ledger in cluster.ledgers.values()} == set(Status) - {Status.PROTECTED}
    assert any(ml.properties.get("PULSAR.SHADOW_SOURCE") for ml in cluster.managed_ledgers)
    assert any("-partition-" in ml.topic for ml in cluster.managed_ledgers)
    assert any(x.offload for ml in cluster.managed_ledgers for x in ml.ledgers)
    assert any(i > INT_MAX for i in cluster.ledgers)
    assert {ml.compression for ml in cluster.managed_ledgers} >= {"NONE", "LZ4"}


def test_a_leftover_cursor_ledger_of_a_cursor_pulsar_protects_is_protected_not_an_orphan() -> None:
    # The sweeper keeps every cursor ledger of `__compaction` (and `pulsar.*`) cursors on a live topic (DESIGN
    # invariant 15), so the ground truth must not ask for its deletion; once the topic is gone it is an orphan.
    cluster = build_cluster(SandboxSpec(seed=3, topics=30))
    live = {ml.name for ml in cluster.managed_ledgers}
    protected = [x for x in cluster.ledgers.values() if x.status is Status.PROTECTED]
    assert protected
    for ledger in protected:
        assert ledger.orphan_kind is OrphanKind.CURSOR_LEDGER_REPLACED and not ledger.referrers
        assert ledger.custom["pulsar/cursor"].decode() == COMPACTION_CURSOR
        assert ledger.custom["pulsar/managed-ledger"].decode() in live
    for ledger in cluster.ledgers.values():
        cursor = ledger.custom.get("pulsar/cursor")
        if ledger.status is Status.ORPHAN and cursor is not None and pulsar_protects_cursor(cursor.decode()):
            assert ledger.custom["pulsar/managed-ledger"].decode() not in live, ledger


@pytest.mark.parametrize(("seed", "topics"), [(7, 200), (4, 200), (9, 200)])
def test_what_a_sweeper_must_delete_depends_on_seeing_the_offloaded_copies(seed: int, topics: int) -> None:
    cluster = build_cluster(SandboxSpec(seed=seed, topics=topics))
    orphans = {i for i, x in cluster.ledgers.items() if x.status is Status.ORPHAN}
    released = {i for i in orphans if cluster.ledgers[i].orphan_kind is OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT}
    assert released  # every size the tests use has some
    assert cluster.deletable(offloads_verified=True) == orphans and not cluster.kept(offloads_verified=True)
    assert cluster.deletable(offloads_verified=False) == orphans - released
    assert set(cluster.kept(offloads_verified=False)) == released


def test_the_default_sandbox_ground_truth() -> None:
    # README's first command (seed 7, 200 topics, the bucket listed): 72 candidates. No protected leftover there.
    cluster = build_cluster(SandboxSpec(seed=7, topics=200))
    assert len(cluster.ledgers) == 1_222
    assert len(cluster.deletable(offloads_verified=True)) == 72
    assert not any(x.status is Status.PROTECTED for x in cluster.ledgers.values())


def test_flat_layout_has_no_long_ids() -> None:
    cluster = build_cluster(SandboxSpec(seed=4, topics=40, layout=LedgerLayout.FLAT, long_id_fraction=0.5))
    assert max(cluster.ledgers) < INT_MAX
