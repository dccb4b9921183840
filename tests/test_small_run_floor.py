"""Issue 37: the work sized to the input, as plain functions (no Spark): how many scan sessions a cluster gets,
and the reconcile's counts from its one aggregation."""

from __future__ import annotations

from sweeper.reconcile.report import orphan_tally
from sweeper.reconcile.stage import CANDIDATE
from sweeper.snapshot import ZNODES_PER_SESSION, deal_tasks, session_count


def test_a_small_cluster_is_one_scan_session_and_a_large_one_uses_every_core() -> None:
    assert session_count(2, 0, 8, units=17, znodes=1_497) == 1  # the README's sandbox
    assert session_count(2, 0, 8, units=17, znodes=3 * ZNODES_PER_SESSION) == 3
    assert session_count(2, 0, 8, units=400, znodes=1_250_000) == 8  # 4 per core
    assert session_count(2, 0, 4, units=400, znodes=1_250_000) == 4  # [scan] max_sessions bounds the load
    assert session_count(2, 0, 8, units=3, znodes=1_250_000) == 3  # never more than the units
    assert session_count(2, 0, 8, units=17) == 8  # no estimate: as many as the cores can use
    assert session_count(2, 6, 8, units=17, znodes=10) == 6  # [spark] scan_partitions decides alone
    assert session_count(2, 0, 8, units=0, znodes=0) == 1


def test_scan_tasks_are_dealt_by_their_estimated_cost() -> None:
    tasks = [("bk", f"unit-{i}") for i in range(11)]
    weights = [10_000.0, 10_000, 10_000, 9_000, 4_000, 400, 300, 200, 100, 50, 0]
    dealt = deal_tasks(tasks, weights, 4)
    assert sorted(t for part in dealt for t in part) == sorted(tasks)  # each exactly once
    cost = dict(zip(tasks, weights, strict=True))
    loads = [sum(cost[t] for t in part) for part in dealt]
    # Round-robin put 10,000 + 4,000 + 100 in one partition (14,100); by cost the heaviest is the least a plan can
    # do (the 4,000 beside the 9,000) and the small units even out the rest.
    assert max(loads) == 13_000 and min(loads) >= 10_000
    assert deal_tasks(tasks, weights, 4) == dealt  # the same plan every time
    assert deal_tasks(tasks[:2], weights[:2], 4)[2:] == [[], []]


def test_the_reconcile_counts_come_from_one_aggregation() -> None:
    groups = [
        {"object_type": "ledger", "status": CANDIDATE, "reason": "topic_deleted", "rows": 5, "bytes": 500},
        {"object_type": "ledger", "status": CANDIDATE, "reason": "cursor_deleted", "rows": 2, "bytes": 20},
        {"object_type": "offload_object", "status": CANDIDATE, "reason": "topic_deleted", "rows": 3, "bytes": 30},
        {"object_type": "ledger", "status": "young", "reason": "topic_deleted", "rows": 4, "bytes": 40},
        {"object_type": "offload_object", "status": "unknown", "reason": "bucket_unlisted", "rows": 1, "bytes": None},
    ]
    tally = orphan_tally(groups)
    assert tally.counts == {
        CANDIDATE: 10, f"{CANDIDATE}.ledger": 7, f"{CANDIDATE}.offload_object": 3,
        "young": 4, "young.ledger": 4, "unknown": 1, "unknown.offload_object": 1,
        "reason.topic_deleted": 8, "reason.cursor_deleted": 2,  # candidates only
    }
    assert (tally.candidate_objects, tally.candidate_object_bytes) == (3, 30)
    assert orphan_tally([]).counts == {}


def test_a_few_offloaded_ledgers_are_listed_by_one_task_and_an_unknown_bucket_by_every_core() -> None:
    from sweeper.snapshot import OBJECTS_PER_HEAD_TASK, listing_tasks

    assert listing_tasks(2, units=76, offloaded_ledgers=70, head_metadata=True, extra_buckets=False) == 1
    assert listing_tasks(2, units=76, offloaded_ledgers=3 * OBJECTS_PER_HEAD_TASK, head_metadata=True,
                         extra_buckets=False) == 6
    assert listing_tasks(2, units=76, offloaded_ledgers=10**6, head_metadata=False, extra_buckets=False) == 8
    assert listing_tasks(2, units=76, offloaded_ledgers=0, head_metadata=True, extra_buckets=True) == 8
    assert listing_tasks(2, units=3, offloaded_ledgers=10**6, head_metadata=True, extra_buckets=False) == 3


def test_the_read_limit_is_shared_by_the_tasks_that_can_run_at_once() -> None:
    from sweeper.snapshot import share_divisor

    assert share_divisor(sessions=8, slots=2, may_grow=False) == 2  # local[2]: 2 of 8 run at once
    assert share_divisor(sessions=8, slots=64, may_grow=False) == 8
    assert share_divisor(sessions=8, slots=2, may_grow=True) == 8  # executors may be added, tasks re-run
    assert share_divisor(sessions=1, slots=2, may_grow=False) == 1


def test_the_packer_reports_the_offload_targets_its_rows_name_and_an_empty_ledger_directory_is_empty() -> None:
    import json
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from sweeper.snapshot import LEAVES_PER_DIRECTORY, OFFLOAD_TARGET, TablePacker
    from sweeper.snapshot.planning import _leaves

    packer = TablePacker("run-1", datetime.now(UTC))
    for ledger, bucket in ((1, "b1"), (2, "b1"), (3, None), (4, "b2")):
        list(packer.add({"record_type": "ml_ledgers", "managed_ledger": "t/ns/persistent/x", "ledger_id": ledger,
                         "offload_bucket": bucket, "offload_region": "r" if bucket else None}))
    targets = [b for b in packer.flush() if b.column("record_type")[0].as_py() == OFFLOAD_TARGET]
    (batch,) = targets
    assert [(tuple(json.loads(p)), n) for p, n in zip(batch.column("payload").to_pylist(),
                                                     batch.column("rows").to_pylist(), strict=True)] == [
        (("", "b1", "r", ""), 2), (("", "b2", "r", ""), 1)]
    assert list(packer.flush()) == []  # reported once

    assert _leaves(SimpleNamespace(numChildren=0)) == 0
    assert _leaves(SimpleNamespace(numChildren=1_170)) == 1_170
    assert _leaves(SimpleNamespace()) == LEAVES_PER_DIRECTORY  # a stat with no count: taken as full
    assert _leaves(None) == 0
