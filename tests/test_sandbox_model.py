"""The sandbox's ground truth must agree with its own references, or every later check is moot."""

from __future__ import annotations

import pytest

from harness.sandbox.model import OrphanKind, SandboxCluster, SandboxSpec, Status, build_cluster
from sweeper.layout import INT_MAX, LedgerLayout


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
        elif ledger.status in (Status.ORPHAN, Status.YOUNG_ORPHAN):
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
    assert {ledger.status for ledger in cluster.ledgers.values()} == set(Status)
    assert any(ml.properties.get("PULSAR.SHADOW_SOURCE") for ml in cluster.managed_ledgers)
    assert any("-partition-" in ml.topic for ml in cluster.managed_ledgers)
    assert any(x.offload for ml in cluster.managed_ledgers for x in ml.ledgers)
    assert any(i > INT_MAX for i in cluster.ledgers)
    assert {ml.compression for ml in cluster.managed_ledgers} >= {"NONE", "LZ4"}


def test_flat_layout_has_no_long_ids() -> None:
    cluster = build_cluster(SandboxSpec(seed=4, topics=40, layout=LedgerLayout.FLAT, long_id_fraction=0.5))
    assert max(cluster.ledgers) < INT_MAX
