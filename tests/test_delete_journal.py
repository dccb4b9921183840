"""The delete journal (issue 22): tasks append it themselves, concurrently; the next attempt folds a stopped one."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.delete.journal import JOURNAL_TABLE, open_journal, resolve_interrupted, unclosed_attempts
from sweeper.delete.records import PendingRecord
from sweeper.delete.results import DeleteResult
from sweeper.table_schemas import DELETE_JOURNAL
from sweeper.tables import open_table_store

LAYOUT = LedgerLayout.HIERARCHICAL


def _item(ledger: int) -> tuple[PendingRecord, dict[str, object]]:
    return PendingRecord(f"LEDGER/{ledger}/k", "emitted", "run-1", 0, b""), {"ledgerId": ledger, "ledgerType": "LEDGER"}


def test_concurrent_tasks_each_commit_their_rows(spark: SparkSession, tmp_path: Path) -> None:
    store = open_table_store(str(tmp_path / "t"), spark, engine="delta-rs")
    appender = store.task_appender(JOURNAL_TABLE, DELETE_JOURNAL)

    def task(index: int, rows: object) -> list[int]:
        from datetime import UTC, datetime

        for n in range(5):  # five small commits per task, four tasks at once
            appender.append([{"run_id": "r", "attempt_id": f"a{index}", "at": datetime.now(UTC), "phase": "intent",
                              "record_key": f"{index}/{n}"}])
        return [index]

    assert sorted(spark.sparkContext.parallelize(range(4), 4).mapPartitionsWithIndex(task).collect()) == [0, 1, 2, 3]
    keys = [r["record_key"] for r in store.read_arrow(JOURNAL_TABLE).to_pylist()]
    assert sorted(keys) == sorted(f"{i}/{n}" for i in range(4) for n in range(5))


def test_the_next_attempt_folds_a_stopped_one(spark: SparkSession, tmp_path: Path) -> None:
    store = open_table_store(str(tmp_path / "t"), spark, engine="delta-rs")
    stopped = open_journal(store, "run-1", "/ledgers", LAYOUT)
    stopped.intents([_item(1), _item(2), _item(3)])
    path = {i: ledger_path("/ledgers", i, LAYOUT) for i in (1, 2, 3)}
    stopped.outcomes([(_item(1)[0], DeleteResult(1, "LEDGER", None, None, "deleted", zk_path=path[1]))])
    # Killed here: ledger 2's multi went through, ledger 3's did not.
    finished = open_journal(store, "run-0", "/ledgers", LAYOUT)
    finished.close()
    assert unclosed_attempts(store) == [stopped.attempt_id]

    found = resolve_interrupted(store, lambda p: p == path[3], "next")
    assert (found.deleted, found.recovered, found.still_present) == (1, 1, 1)
    assert found.settled == {"LEDGER/1/k", "LEDGER/2/k"}
    rows = {r["ledger_id"]: r for r in store.read_arrow("delete_results").to_pylist()}
    assert set(rows) == {1, 2} and {r["outcome"] for r in rows.values()} == {"deleted"}
    assert rows[2]["run_id"] == "run-1" and rows[2]["detail"].startswith(f"deleted by attempt {stopped.attempt_id}")
    run = store.read_arrow("runs").to_pylist()[0]
    assert (run["run_id"], run["stage"], run["status"]) == ("run-1", "delete", "interrupted")
    counts = dict(run["counts"])  # an Arrow map: key-value pairs
    assert counts["deleted"] == 2 and counts["attempted_still_present"] == 1

    # Folded once: closed now, so a later attempt finds nothing, and nothing is written twice.
    assert unclosed_attempts(store) == []
    again = resolve_interrupted(store, lambda p: False, "later")
    assert not again.attempts and store.read_arrow("delete_results").num_rows == 2


def test_the_fold_counts_an_answer_lost_whose_ledger_is_gone_as_that_attempts_deletion(
        spark: SparkSession, tmp_path: Path) -> None:
    """A stopped attempt recorded three deletes whose answers were lost (DESIGN.md invariant 18). Ledger 4 is gone
    and its `failed` result never reached delete_results: the fold files it `deleted` by that attempt. Ledger 5 is
    still there: re-verified as usual. Ledger 6 is gone, but its `failed` result was committed and waits in the
    retry queue, whose next try is relabelled from the same outcome row: the fold leaves it, so it is recorded
    once."""
    from datetime import UTC, datetime

    from sweeper.delete.results import ANSWER_LOST, FAILED
    from sweeper.table_schemas import DELETE_RESULTS

    store = open_table_store(str(tmp_path / "t"), spark, engine="delta-rs")
    stopped = open_journal(store, "run-1", "/ledgers", LAYOUT)
    stopped.intents([_item(4), _item(5), _item(6)])
    path = {i: ledger_path("/ledgers", i, LAYOUT) for i in (4, 5, 6)}
    stopped.outcomes([(_item(i)[0], DeleteResult(i, "LEDGER", None, None, FAILED, ANSWER_LOST,
                                                 error="ConnectionLoss", zk_path=path[i])) for i in (4, 5, 6)])
    store.append_rows("delete_results", [{
        "run_id": "run-1", "origin_run_id": "run-1", "finished_at": datetime.now(UTC), "record_key": "LEDGER/6/k",
        "ledger_id": 6, "ledger_type": "LEDGER", "component": None, "topic_name": None, "outcome": FAILED,
        "detail": ANSWER_LOST, "error": "ConnectionLoss", "attempt": 1, "duration_ms": 1, "zk_path": path[6],
        "zk_version": None, "s3_bucket": None, "s3_keys": [], "dry_run": False, "source": "emitted"}], DELETE_RESULTS)

    found = resolve_interrupted(store, lambda p: p == path[5], "next")
    assert found.recovered == 1 and found.settled == {"LEDGER/4/k"}
    rows = [r for r in store.read_arrow("delete_results").to_pylist() if r["outcome"] == "deleted"]
    assert [r["ledger_id"] for r in rows] == [4]
    assert rows[0]["detail"].startswith(f"deleted by attempt {stopped.attempt_id}; the answer to its delete was lost")


def test_an_offloaded_copy_a_stopped_attempt_set_out_to_delete_is_its_deletion_once_seen_gone(
        spark: SparkSession, tmp_path: Path) -> None:
    """A stopped attempt journalled its intent for an offloaded copy and no outcome: it may have sent the
    DeleteObjects (DESIGN.md invariant 18). The fold cannot look into the bucket, so the next attempt re-verifies
    the record; finding the objects gone, its `already_gone` is that stopped attempt's deletion, not somebody
    else's. Without a stopped attempt behind it, `already_gone` stays."""
    from sweeper.delete.journal import relabel_lost_answers

    store = open_table_store(str(tmp_path / "t"), spark, engine="delta-rs")
    offload = PendingRecord("OFFLOAD_LEDGER/7/k", "emitted", "run-1", 0, b"")
    stopped = open_journal(store, "run-1", "/ledgers", LAYOUT)
    stopped.intents([(offload, {"ledgerId": 7, "ledgerType": "OFFLOAD_LEDGER"})])
    found = resolve_interrupted(store, lambda p: True, "next")
    assert found.still_present == 1 and not found.settled  # re-verified by the next attempt, as before

    nxt = open_journal(store, "run-1", "/ledgers", LAYOUT)
    nxt.intents([(offload, {"ledgerId": 7, "ledgerType": "OFFLOAD_LEDGER"})])
    gone = DeleteResult(7, "OFFLOAD_LEDGER", None, None, "already_gone", "no object left")
    other = DeleteResult(8, "OFFLOAD_LEDGER", None, None, "already_gone", "no object left")
    nxt.outcomes([(offload, gone)])
    assert relabel_lost_answers(store, nxt.attempt_id, [("OFFLOAD_LEDGER/7/k", gone),
                                                        ("OFFLOAD_LEDGER/8/k", other)]) == 1
    assert gone.outcome == "deleted" and gone.detail.startswith(f"deleted by attempt {stopped.attempt_id}")
    assert other.outcome == "already_gone"
