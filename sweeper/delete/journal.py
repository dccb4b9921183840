"""Durable outcomes of a delete attempt, so "what did the sweeper delete, and when?" has an answer after a kill.

A delete attempt (one `delete --execute` invocation) used to commit its `delete_results` only at the end, on the
driver: a run killed halfway left nothing for the ledgers it had already deleted, and the next attempt filed
them as `already_gone`. Now each Spark task appends to `delete_journal` itself, one small Delta commit per
chunk of records: the intents before the chunk's compare-and-set deletes, the outcomes after. The driver
closes the attempt once its results are committed.

The next `--execute` attempt, holding the run lock (so no attempt it finds unclosed is still running), folds
every unclosed attempt into the tables: its recorded final outcomes become `delete_results` rows of its run,
an intent without an outcome whose ledger znode is gone becomes `deleted` (that attempt deleted it: records
are orphans nobody else deletes, and the journal says it was about to), an intent whose ledger is still there
is left to be re-verified as usual, and the attempt gets a `runs` row `interrupted` with its counts.

A delete whose answer was lost (DESIGN.md invariant 18: ZooKeeper's ConnectionLoss, an Oxia or S3 timeout) has an
outcome row `failed` with the detail ANSWER_LOST: it may have been applied. The next look at that target uses the
journal: the executors remember their own lost answers across the in-task retries; the driver, before committing
an attempt's results, turns `already_gone` into `deleted` where the journal shows this run may have sent the delete
(`lost_answer_evidence`: an answer-lost outcome, or a task Spark ran again whose first execution journalled its
intent or its deletion but never reached the driver); the fold above counts an answer-lost outcome whose ledger
is gone as that attempt's deletion. `already_gone` is left for targets no journalled delete of ours names.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sweeper import journal
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.delete.records import PendingRecord
from sweeper.delete.results import (
    ALREADY_GONE,
    ANSWER_LOST,
    DELETED,
    FAILED,
    FINAL_OUTCOMES,
    DeleteResult,
    answer_lost_deleted,
)
from sweeper.table_schemas import DELETE_JOURNAL, DELETE_RESULTS
from sweeper.tables import TableStore, TaskAppender

JOURNAL_TABLE = journal.DELETE.table
INTENT, OUTCOME, CLOSED = journal.INTENT, journal.OUTCOME, journal.CLOSED


def new_attempt_id(run_id: str) -> str:
    return f"{run_id}@{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Journal:
    """What a task needs to journal its records (picklable: it travels in the DeleteTarget)."""

    appender: TaskAppender
    run_id: str
    attempt_id: str
    ledgers_root: str
    layout: str
    runs_row_follows: bool = False  # closed by a stage wrapper that records the attempt in `runs` next

    def _row(self, phase: str, **values: Any) -> dict[str, Any]:
        return {"run_id": self.run_id, "attempt_id": self.attempt_id, "at": datetime.now(UTC), "phase": phase,
                **values}

    def intents(self, pairs: Sequence[tuple[PendingRecord, Mapping[str, Any]]]) -> None:
        rows = []
        for item, record in pairs:
            ledger_id, ledger_type = record.get("ledgerId"), record.get("ledgerType")
            zk_path = (ledger_path(self.ledgers_root, int(ledger_id), LedgerLayout(self.layout))
                       if ledger_type == "LEDGER" and isinstance(ledger_id, int) else None)
            rows.append(self._row(INTENT, record_key=item.record_key, source=item.source,
                                  origin_run_id=item.origin_run_id, ledger_id=ledger_id, ledger_type=ledger_type,
                                  zk_path=zk_path))
        self.appender.append(rows)

    def outcomes(self, done: Sequence[tuple[PendingRecord, DeleteResult]]) -> None:
        self.appender.append([
            self._row(OUTCOME, record_key=item.record_key, source=item.source, origin_run_id=item.origin_run_id,
                      ledger_id=result.ledger_id, ledger_type=result.ledger_type, zk_path=result.zk_path,
                      outcome=result.outcome, detail=(result.detail or result.error or "")[:2000],
                      zk_version=result.zk_version, attempt=result.attempt)
            for item, result in done])

    def close(self, detail: str = "") -> None:
        said = journal.closed_detail(detail, self.runs_row_follows)
        self.appender.append([self._row(CLOSED, detail=said)])


def open_journal(store: TableStore, run_id: str, ledgers_root: str, layout: LedgerLayout,
                 runs_row_follows: bool = False) -> Journal:
    return Journal(store.task_appender(JOURNAL_TABLE, DELETE_JOURNAL), run_id, new_attempt_id(run_id), ledgers_root,
                   layout.value, runs_row_follows)


@dataclass
class Resolution:
    """What folding the unclosed attempts found (counts over all of them)."""

    attempts: list[str] = field(default_factory=list)
    deleted: int = 0  # outcomes `deleted` the attempts had recorded themselves
    recovered: int = 0  # intents without an outcome whose ledger is gone: deleted by that attempt
    still_present: int = 0  # intents without an outcome whose ledger is there: re-verified as usual
    other_outcomes: int = 0
    settled: set[str] = field(default_factory=set)  # record keys with a final outcome from those attempts
    unrecorded: list[str] = field(default_factory=list)  # closed attempts killed before their `runs` row

    def counts(self) -> dict[str, int]:
        return {"interrupted_attempts": len(self.attempts) + len(self.unrecorded),
                "interrupted_deleted": self.deleted + self.recovered,
                "interrupted_recovered": self.recovered, "interrupted_still_present": self.still_present}


def unclosed_attempts(store: TableStore) -> list[str]:
    if not store.exists(JOURNAL_TABLE):
        return []
    phases = store.aggregate_arrow(JOURNAL_TABLE, ["attempt_id", "phase"], [("run_id", "count")]).to_pylist()
    closed = {r["attempt_id"] for r in phases if r["phase"] == CLOSED}
    return sorted({r["attempt_id"] for r in phases} - closed)


def settle_unrecorded(store: TableStore, by_attempt: str) -> list[str]:
    """Record as `interrupted` every attempt that closed itself under the stage wrapper (journal.RUNS_ROW_FOLLOWS) and
    has no `runs` row of its run's delete stage written since: it was killed between the two. Its results are
    already in `delete_results`; only its status was missing. The attempts recorded. Holding the delete run lock."""
    if not store.exists(JOURNAL_TABLE):
        return []
    closed = store.aggregate_arrow(JOURNAL_TABLE, ["attempt_id", "run_id", "detail"], [("at", "max")],
                                   where={"phase": CLOSED}).to_pylist()
    gaps = journal.unrecorded(store, "delete", ({**r, "at": r["at_max"]} for r in closed))
    if not gaps:
        return []
    tallies = store.aggregate_arrow(JOURNAL_TABLE, ["attempt_id", "outcome"], [("at", "count")],
                                    where={"attempt_id": [r["attempt_id"] for r in gaps], "phase": OUTCOME})
    firsts = store.aggregate_arrow(JOURNAL_TABLE, ["attempt_id"], [("at", "min")],
                                   where={"attempt_id": [r["attempt_id"] for r in gaps]}).to_pylist()
    started = {r["attempt_id"]: r["at_min"] for r in firsts}
    run_rows = []
    for gap in gaps:
        attempt = gap["attempt_id"]
        outcomes = {r["outcome"]: int(r["at_count"]) for r in tallies.to_pylist() if r["attempt_id"] == attempt}
        begun = started.get(attempt, gap["at"])
        run_rows.append(journal.interrupted_row(
            gap["run_id"], "delete", begun, gap["at"],
            {"deleted": outcomes.get(DELETED, 0)},  # fields of run_result.DeleteCounts
            f"attempt {attempt} committed its results ({outcomes.get(DELETED, 0)} deleted, in delete_results) and "
            f"stopped before recording its end here (recorded by {by_attempt})", store.engine))
    journal.record_interrupted(store, "delete", run_rows, by_attempt)
    return [r["attempt_id"] for r in gaps]


def resolve_interrupted(store: TableStore, exists: Any, by_attempt: str) -> Resolution:
    """Fold every unclosed attempt (see the module doc), and record the attempts killed between closing themselves
    and their `runs` row (`settle_unrecorded`). `exists(zk_path)` re-reads a ledger znode. Only call this holding
    the delete run lock: an unclosed attempt is then one that stopped."""
    found = Resolution(unrecorded=settle_unrecorded(store, by_attempt))
    attempts = unclosed_attempts(store)
    if not attempts:
        return found
    rows = store.read_arrow(JOURNAL_TABLE, where={"attempt_id": attempts}).to_pylist()
    run_ids = sorted({r["run_id"] for r in rows})
    final: set[tuple[str, str]] = set()
    committed: set[tuple[str, str]] = set()
    if store.exists("delete_results"):
        recorded = store.read_arrow("delete_results", where={"run_id": run_ids, "dry_run": False},
                                    columns=["run_id", "record_key", "outcome"]).to_pylist()
        final = {(r["run_id"], r["record_key"]) for r in recorded if r["outcome"] != FAILED}
        committed = {(r["run_id"], r["record_key"]) for r in recorded}
    results: list[dict[str, Any]] = []
    run_rows: list[dict[str, Any]] = []
    journal_rows: list[dict[str, Any]] = []
    now = datetime.now(UTC)
    for attempt in attempts:
        mine = [r for r in rows if r["attempt_id"] == attempt]
        run_id = mine[0]["run_id"]
        outcomes = {r["record_key"]: r for r in mine if r["phase"] == OUTCOME}
        intents = {r["record_key"]: r for r in mine if r["phase"] == INTENT}
        before = (found.deleted, found.recovered, found.still_present)
        for key, row in outcomes.items():
            # Its answer lost, the ledger gone: that attempt's delete went through. Only where its driver never
            # committed the `failed` result: a committed one waits in the retry queue, whose next try is relabelled
            # from this same outcome row (`lost_answer_evidence`), so the deletion is recorded once.
            if (row["outcome"] == FAILED and row["detail"] == ANSWER_LOST and row["zk_path"]
                    and (run_id, key) not in committed and not exists(row["zk_path"])):
                found.recovered += 1
                found.settled.add(key)
                results.append(_result_row(row, DELETED, answer_lost_deleted(
                    f"it stopped before its retry; {row['zk_path']} is gone (resolved by {by_attempt})",
                    by=f"attempt {attempt}"), row["at"]))
                continue
            if row["outcome"] == DELETED:
                found.deleted += 1
            elif row["outcome"] in FINAL_OUTCOMES:
                found.other_outcomes += 1
            if row["outcome"] in FINAL_OUTCOMES:
                found.settled.add(key)
                if (run_id, key) not in final:
                    results.append(_result_row(row, row["outcome"], row["detail"] or "", row["at"]))
        for key, row in intents.items():
            if key in outcomes:
                continue
            if not row["zk_path"]:
                # An offloaded copy: the driver cannot look into the bucket here, so the re-verification does.
                # The attempt may have sent its DeleteObjects before it stopped: on record as an answer lost, so
                # that finding the objects gone files them `deleted` by that attempt (`lost_answer_evidence`),
                # never somebody else's `already_gone`.
                found.still_present += 1
                journal_rows.append({**{k: row[k] for k in _CARRIED}, "at": now, "phase": OUTCOME,
                                     "outcome": FAILED, "detail": ANSWER_LOST,
                                     "zk_version": None, "attempt": row["attempt"]})
                continue
            if not exists(row["zk_path"]):
                found.recovered += 1
                found.settled.add(key)
                if (run_id, key) not in final:
                    results.append(_result_row(
                        row, DELETED, f"deleted by attempt {attempt}, which stopped before recording it: its intent "
                                      f"is in {JOURNAL_TABLE} and {row['zk_path']} is gone (resolved by {by_attempt})",
                        row["at"]))
            else:
                found.still_present += 1
        deleted = found.deleted - before[0] + found.recovered - before[1]
        present = found.still_present - before[2]
        started = min(r["at"] for r in mine)
        last = max(r["at"] for r in mine)
        run_rows.append(journal.interrupted_row(
            run_id, "delete", started, last,
            {"deleted": deleted, "recovered_from_journal": found.recovered - before[1],
             "attempted_still_present": present},  # fields of run_result.DeleteCounts
            f"attempt {attempt} stopped before it finished: {deleted} deleted, {present} attempted and still present "
            f"(re-verified by {by_attempt})", store.engine))
        journal_rows.append({"run_id": run_id, "attempt_id": attempt, "at": now, "phase": CLOSED,
                             "detail": f"interrupted; resolved by {by_attempt}"})
        found.attempts.append(attempt)
    metadata = {"stage": "delete", "resolved_by": by_attempt}
    if results:
        store.append_rows("delete_results", results, DELETE_RESULTS, commit_metadata=metadata)
    journal.record_interrupted(store, "delete", run_rows, by_attempt)
    # Closed last: killed before this, the next attempt folds them again and the `final` check skips duplicates.
    store.append_rows(JOURNAL_TABLE, journal_rows, DELETE_JOURNAL, commit_metadata=metadata)
    return found


# The columns of an intent that a fold-in's outcome row for it repeats.
_CARRIED = ("run_id", "attempt_id", "record_key", "source", "origin_run_id", "ledger_id", "ledger_type", "zk_path")


def _result_row(row: Mapping[str, Any], outcome: str, detail: str, at: datetime) -> dict[str, Any]:
    return {"run_id": row["run_id"], "origin_run_id": row["origin_run_id"], "finished_at": at,
            "record_key": row["record_key"], "ledger_id": row["ledger_id"], "ledger_type": row["ledger_type"],
            "component": None, "topic_name": None, "outcome": outcome, "detail": detail[:2000], "error": None,
            "attempt": row["attempt"] or 1, "duration_ms": None, "zk_path": row["zk_path"],
            "zk_version": row["zk_version"], "s3_bucket": None, "s3_keys": [], "dry_run": False,
            "source": row["source"] or "emitted"}


# ---- lost answers ------------------------------------------------------------------------------------------------

def lost_answer_evidence(rows: Iterable[Mapping[str, Any]], attempt_id: str,
                         deleted_on_record: Iterable[str] = ()) -> dict[str, tuple[str, str]]:
    """Record key -> (the attempt that may have sent its delete, why it may have), from `delete_journal` rows
    (phase, attempt_id, record_key, outcome, detail, at) of the keys a result of attempt `attempt_id` found gone.
    Pure: the driver reads the rows (`relabel_lost_answers`), this judges them.

    Evidence, for a target now gone:
    - in attempt `attempt_id` itself, a task Spark ran again (a lost executor, `spark.task.maxFailures`): its first
      execution journalled an intent and no outcome (it may have sent the delete before it stopped), or an outcome
      `deleted` or answer-lost that never reached the driver: more intents than outcomes, or such an outcome;
    - in an earlier attempt (of any run: a record key names one ledger or one offloaded copy, whose ids are never
      reused), an answer-lost outcome that no later final outcome of the record closed.
    An intent alone in a finished attempt is no evidence: the intents of a chunk are written before its
    verification, so a ledger already gone then has one too. `deleted_on_record` (keys with a `deleted` row in
    `delete_results`) are left out: a deletion is recorded once.
    """
    skip = set(deleted_on_record)
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("record_key") and row["record_key"] not in skip:
            by_key.setdefault(row["record_key"], []).append(row)
    found: dict[str, tuple[str, str]] = {}
    for key, mine in by_key.items():
        now = [r for r in mine if r["attempt_id"] == attempt_id]
        intents = sum(1 for r in now if r["phase"] == INTENT)
        outcomes = [r for r in now if r["phase"] == OUTCOME]
        if any(r["outcome"] == DELETED for r in outcomes):
            found[key] = (attempt_id, "a task execution deleted it and was lost before its result reached the "
                                      "driver; Spark ran the task again")
            continue
        if any(r["outcome"] == FAILED and r["detail"] == ANSWER_LOST for r in outcomes):
            found[key] = (attempt_id, "a task execution recorded its answer lost and was lost itself; Spark ran "
                                      "the task again")
            continue
        if intents > len(outcomes):
            found[key] = (attempt_id, "a task execution journalled its intent, never its outcome, and Spark ran "
                                      "the task again")
            continue
        lost: Mapping[str, Any] | None = None
        for row in sorted((r for r in mine if r["attempt_id"] != attempt_id and r["phase"] == OUTCOME),
                          key=lambda r: r["at"]):
            if row["outcome"] == FAILED and row["detail"] == ANSWER_LOST:
                lost = row
            elif row["outcome"] in FINAL_OUTCOMES:
                lost = None
        if lost is not None:
            found[key] = (lost["attempt_id"], f"recorded in {JOURNAL_TABLE} at {lost['at']:%Y-%m-%d %H:%M:%S} UTC")
    return found


def relabel_lost_answers(store: TableStore, attempt_id: str, results: Sequence[tuple[str, DeleteResult]]) -> int:
    """Turn the `already_gone` results among `results` (record key, result) of attempt `attempt_id` into `deleted`
    where `lost_answer_evidence` finds that a delete of ours may have been sent; how many. Labels only: what was
    deleted stays as it is. Called by the driver before it commits the attempt's results."""
    gone = {key: result for key, result in results if result.outcome == ALREADY_GONE}
    if not gone or not store.exists(JOURNAL_TABLE):
        return 0
    keys = sorted(gone)
    rows = store.read_arrow(JOURNAL_TABLE, where={"record_key": keys},
                            columns=["attempt_id", "at", "phase", "record_key", "outcome", "detail"]).to_pylist()
    recorded: list[str] = []
    if store.exists("delete_results"):
        recorded = store.read_arrow("delete_results", where={"record_key": keys, "outcome": DELETED, "dry_run": False},
                                    columns=["record_key"]).column("record_key").to_pylist()
    evidence = lost_answer_evidence(rows, attempt_id, recorded)
    for key, (attempt, why) in evidence.items():
        result = gone[key]
        by = "this attempt" if attempt == attempt_id else f"attempt {attempt}"
        result.outcome, result.detail = DELETED, answer_lost_deleted(f"{why}; {result.detail}", by=by)
    return len(evidence)
