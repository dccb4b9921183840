"""What the sweeper did, read back from its tables for an operator: `sweeper runs` and `sweeper show` (issue 23).

Read-only, and without a Spark session: delta-rs reads the tables (whichever engine wrote them) on the
driver. The summaries are plain functions over plain rows; `read_store` and the readers of `runs`, the tables
and the journals are the only I/O.

An attempt killed outright (SIGKILL, a lost node) is folded into `runs` and `delete_results` only by the next
`delete --execute` (or emit) of its run, which needs the live store and the run lock. Until then these commands
read its journal (issue 34 item 7): `runs` shows it `interrupted`, `show RUN deletes` lists its journalled
outcomes and its intents without one, so "what did the sweeper delete?" never waits for another delete. A
fold-in writes its rows before it closes the attempt: rows already written are left out, so nothing shows twice.
A retention repair killed outright is read from `repair_journal` the same way until the next `retention
--execute` folds it in: `runs` shows it `interrupted`, `show RUN actions` lists each call it journalled and
recorded no action for as `intended`.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sweeper import journal, runs
from sweeper.config import SweeperConfig
from sweeper.errors import UsageError
from sweeper.tables.base import TableStore

FORMATS = ("table", "json", "csv")

# Where a `show RUN deletes|actions` row comes from: its table (`delete_results`, `retention_actions`), or the
# journal (`delete_journal`, `repair_journal`) of an attempt not yet folded in.
RECORDED_IN = "recorded_in"
# An intent without an outcome: the delete may or may not have happened (the next fold-in re-reads the ledger).
INTENDED = "intended"
IN_FLIGHT = "in flight when the attempt stopped: unknown until the next delete --execute re-reads it"
NOT_FOLDED = "not yet folded in: the next delete --execute records it"
# The same for an admin call of the retention repair.
REPAIR_IN_FLIGHT = ("in flight when the repair stopped: unknown until the next retention --execute settles it from "
                    "the metadata")
REPAIR_NOT_FOLDED = "not yet folded in: the next retention --execute records it"

# The worst status of a run's stages is the run's status.
_SEVERITY = {runs.SUCCEEDED: 0, runs.PARTIAL: 1, runs.REFUSED: 2, runs.FAILED: 3, runs.INTERRUPTED: 4}


@dataclass(frozen=True)
class View:
    """One `sweeper show` view: the table, its run column, the columns a table print shows, and which column
    each filter reads (a filter the table has no column for is refused)."""

    table: str
    run_column: str
    columns: tuple[str, ...]
    filters: Mapping[str, str]
    order: str


VIEWS: dict[str, View] = {
    "orphans": View("orphans", "run_id",
                    ("object_type", "ledger_id", "status", "reason", "tenant", "namespace", "topic", "size_bytes",
                     "detail"),
                    {"reason": "reason", "status": "status", "tenant": "tenant", "namespace": "namespace"},
                    "ledger_id"),
    "deletes": View("delete_results", "run_id",
                    ("finished_at", "ledger_type", "ledger_id", "outcome", "dry_run", "topic_name", "zk_path",
                     "detail"),
                    {"status": "outcome", "reason": "outcome"}, "finished_at"),
    "quarantine": View("quarantine", "run_id", ("source", "path", "ledger_id", "error_kind", "error"),
                       {"reason": "error_kind", "status": "error_kind"}, "path"),
    "retention": View("retention_debt", "run_id",
                      ("kind", "status", "reason", "tenant", "namespace", "topic_name", "cursor",
                       "reclaimable_bytes"),
                      {"reason": "reason", "status": "status", "tenant": "tenant", "namespace": "namespace"},
                      "topic_name"),
    "actions": View("retention_actions", "run_id",
                    ("finished_at", "action", "outcome", "dry_run", "topic_name", "cursor", "detail"),
                    {"status": "outcome", "reason": "action", "tenant": "tenant", "namespace": "namespace"},
                    "finished_at"),
    "dlq": View("dead_letter", "run_id", ("recorded_at", "record_key", "ledger_id", "state", "attempts",
                                          "last_error"),
                {"status": "state"}, "recorded_at"),
    # Every measurement of the run, oldest first: the last row per target is the current answer.
    "reclaim": View("reclaim", "run_id",
                    ("measured_at", "target", "verdict", "expected_bytes", "freed_bytes", "freed_lower_bytes",
                     "freed_upper_bytes", "pending_bytes", "action", "found_by", "why"),
                    {"status": "verdict", "reason": "verdict"}, "measured_at"),
}


def read_store(config: SweeperConfig) -> TableStore:
    """The tables of `config`, read by delta-rs without Spark; a root with no tables is the operator's mistake."""
    from sweeper.delete.journal import JOURNAL_TABLE as DELETE_JOURNAL
    from sweeper.emit.stage import JOURNAL_TABLE as EMIT_JOURNAL
    from sweeper.retention.journal import JOURNAL_TABLE as REPAIR_JOURNAL
    from sweeper.tables.delta_rs import DeltaRsTableStore
    from sweeper.tables.storage import TableStorage, delta_rs_options

    storage = TableStorage(config.tables.root, config.tables.s3_endpoint, config.tables.s3_region)
    if not storage.on_s3 and not Path(config.tables.root).is_dir():
        raise UsageError(f"no tables at {config.tables.root}: point --tables (or [tables] root in --config) at "
                         "the sweeper's tables, or run `sweeper sweep` first")
    store = DeltaRsTableStore(config.tables.root, None, delta_rs_options(storage))  # type: ignore[arg-type]
    # A first-ever delete killed outright leaves only its journal: that is something to show.
    if not any(store.exists(table) for table in (runs.TABLE, DELETE_JOURNAL, EMIT_JOURNAL, REPAIR_JOURNAL)):
        raise UsageError(f"no runs table under {config.tables.root}: nothing has run with these tables yet "
                         "(`sweeper sweep` writes them), or --tables names another directory")
    return store


def run_summaries(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per run id from its `runs` rows, newest first: when, how long, how it ended, what it did."""
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_run.setdefault(row["run_id"], []).append(row)
    out = []
    for run_id, stages in by_run.items():
        stages = sorted(stages, key=lambda r: (r["started_at"], r["finished_at"]))
        counts: dict[str, dict[str, int]] = {r["stage"]: dict(r["counts"] or {}) for r in stages}
        worst = max(stages, key=lambda r: _SEVERITY.get(r["status"], 5))
        executed = any(c.get("execute") for c in counts.values()) or "emit" in counts
        started, finished = stages[0]["started_at"], max(r["finished_at"] for r in stages)
        out.append({
            "run_id": run_id,
            "started": started,
            "duration_s": round((finished - started).total_seconds(), 1),
            "duration": human_duration((finished - started).total_seconds()),
            "status": worst["status"],
            "stages": " ".join(f"{r['stage']}:{r['status']}" for r in stages),
            "mode": "executed" if executed else "dry run",
            "candidates": counts.get("reconcile", {}).get("candidate"),
            "published": counts.get("emit", {}).get("published"),
            "deleted": _deleted(stages),
            "message": next((r["message"] for r in reversed(stages) if r["message"] and r["status"] != runs.SUCCEEDED),
                            ""),
        })
    return sorted(out, key=lambda r: r["started"], reverse=True)


_BYTE_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float | None) -> str:
    """`113,927,136` as `108.6 MiB`: binary units, as Pulsar's and BookKeeper's own tools print sizes."""
    value = float(n or 0)
    unit = 0
    while abs(value) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{int(value):,} bytes" if unit == 0 else f"{value:,.1f} {_BYTE_UNITS[unit]}"


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 orphan`, `2 orphans` (with `many` for words whose plural is not word + s)."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def human_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _deleted(stages: Sequence[Mapping[str, Any]]) -> int | None:
    """Everything the run deleted: each attempt's `runs` row counts its own deletions (an `interrupted` row what a
    stopped attempt did, the next attempt's row only what it did itself), so they add up."""
    for stage in ("delete", "retention_repair"):
        rows = [r for r in stages if r["stage"] == stage]
        if rows:
            return sum(int((r["counts"] or {}).get("deleted", 0)) for r in rows)
    return None


@dataclass(frozen=True)
class UnfoldedAttempt:
    """A `delete --execute` attempt with no `closed` row in its journal: it stopped (or is running now) and no
    later attempt has folded it in. Its outcomes, one per record (a re-run Spark task may journal a record twice:
    a `deleted` among them is the one kept, as the deletion happened), and its intents without an outcome.
    Also a `retention --execute` run left unclosed in `repair_journal` (`unfolded_repairs`): its own one attempt,
    its `retention_actions` rows as outcomes, and in flight the last intent of each action without a row
    (`repair_journal.unsettled`: what the fold-in will settle)."""

    run_id: str
    attempt_id: str
    started: datetime
    last: datetime
    outcomes: tuple[dict[str, Any], ...]
    in_flight: tuple[dict[str, Any], ...]


def unfolded_delete_attempts(store: TableStore, run_id: str | None = None) -> list[UnfoldedAttempt]:
    """The delete attempts (of `run_id`, or all) whose journal is not closed, oldest first."""
    from sweeper.delete.journal import CLOSED, INTENT, JOURNAL_TABLE, OUTCOME
    from sweeper.delete.results import DELETED

    if not store.exists(JOURNAL_TABLE):
        return []
    where = {"run_id": run_id} if run_id is not None else None
    # The phases per attempt first (a few columns), then the rows of the open attempts only: a journal holds two
    # rows per record ever deleted, the open attempts a few chunks.
    phases = store.aggregate_arrow(JOURNAL_TABLE, ["attempt_id", "phase"], [("run_id", "count")],
                                   where=where).to_pylist()
    closed = {r["attempt_id"] for r in phases if r["phase"] == CLOSED}
    open_ids = sorted({r["attempt_id"] for r in phases} - closed)
    if not open_ids:
        return []
    found = []
    rows = store.read_arrow(JOURNAL_TABLE, where={"attempt_id": open_ids}).to_pylist()
    for attempt_id in open_ids:
        mine = sorted((r for r in rows if r["attempt_id"] == attempt_id), key=lambda r: r["at"])
        outcomes: dict[str, dict[str, Any]] = {}
        for row in mine:
            if row["phase"] == OUTCOME and outcomes.get(row["record_key"], {}).get("outcome") != DELETED:
                outcomes[row["record_key"]] = row
        in_flight = {r["record_key"]: r for r in mine if r["phase"] == INTENT and r["record_key"] not in outcomes}
        found.append(UnfoldedAttempt(mine[0]["run_id"], attempt_id, mine[0]["at"], mine[-1]["at"],
                                     tuple(outcomes.values()), tuple(in_flight.values())))
    return sorted(found, key=lambda a: a.started)


def _recorded(attempt_row: Mapping[str, Any], run_rows: Sequence[Mapping[str, Any]], stage: str,
              attempt_id: str) -> bool:
    """Whether a fold-in already wrote the attempt's `interrupted` row (it was stopped before closing the
    attempt): the fold-in starts the row at the attempt's first journal row and names the attempt."""
    return any(r["run_id"] == attempt_row["run_id"] and r["stage"] == stage and r["status"] == runs.INTERRUPTED
               and (r["started_at"] == attempt_row["at"] or attempt_id in (r["message"] or ""))
               for r in run_rows)


def unfolded_run_rows(store: TableStore, recorded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`runs`-shaped rows, `interrupted`, for the delete and emit attempts whose journal is open and that no
    fold-in has recorded yet (`recorded`: the `runs` rows read). Shown, never written: the fold-in writes them."""
    from sweeper.delete.results import DELETED

    out = []
    for attempt in unfolded_delete_attempts(store):
        if _recorded({"run_id": attempt.run_id, "at": attempt.started}, recorded, "delete", attempt.attempt_id):
            continue
        by_outcome: dict[str, int] = {}
        for row in attempt.outcomes:
            by_outcome[row["outcome"]] = by_outcome.get(row["outcome"], 0) + 1
        others = ", ".join(f"{n:,} {outcome}" for outcome, n in sorted(by_outcome.items()) if outcome != DELETED)
        deleted = by_outcome.get(DELETED, 0)
        out.append(journal.interrupted_row(
            attempt.run_id, "delete", attempt.started, attempt.last,
            {**by_outcome, DELETED: deleted, INTENDED: len(attempt.in_flight), "execute": 1},
            f"attempt {attempt.attempt_id} stopped before it finished (or is running now); {NOT_FOLDED}. Its "
            f"journal records {plural(deleted, 'deletion')}{f' ({others})' if others else ''} and "
            f"{plural(len(attempt.in_flight), 'intent')} without an outcome (unknown until then): "
            f"`sweeper show {attempt.run_id} deletes` lists them"))
    out += _unfolded_emits(store, recorded)
    return out + _unfolded_repair_rows(store, recorded)


def _unfolded_emits(store: TableStore, recorded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The emit attempts with a `started` row and no `closed` one, counted as `emit.fold_interrupted` counts them
    (its `emitted` rows carry the attempt's start as `emitted_at`)."""
    from sweeper.emit.stage import CLOSED, INTENT, JOURNAL_TABLE, PUBLISHED, STARTED

    if not store.exists(JOURNAL_TABLE):
        return []
    phases = store.aggregate_arrow(JOURNAL_TABLE, ["attempt_id", "phase"], [("run_id", "count")]).to_pylist()
    closed = {r["attempt_id"] for r in phases if r["phase"] == CLOSED}
    open_ids = sorted({r["attempt_id"] for r in phases if r["phase"] == STARTED} - closed)
    if not open_ids:
        return []
    rows = store.read_arrow(JOURNAL_TABLE, where={"attempt_id": open_ids}).to_pylist()
    run_ids = sorted({r["run_id"] for r in rows})
    sent: list[dict[str, Any]] = []
    if store.exists("emitted"):
        sent = store.read_arrow("emitted", where={"run_id": run_ids},
                                columns=["run_id", "emitted_at", "producer_name", "status"]).to_pylist()
    out = []
    for attempt_id in open_ids:
        mine = [r for r in rows if r["attempt_id"] == attempt_id]
        started = next(r for r in mine if r["phase"] == STARTED)
        if _recorded(started, recorded, "emit", attempt_id):
            continue
        intents = [r for r in mine if r["phase"] == INTENT]
        done = [r for r in sent if r["run_id"] == started["run_id"] and r["emitted_at"] == started["at"]]
        unrecorded = [r for r in intents if r["producer_name"] not in {d["producer_name"] for d in done}]
        may_be_sent = sum(int(r["records"] or 0) for r in unrecorded)
        planned = int(started["records"] or 0)
        out.append(journal.interrupted_row(
            started["run_id"], "emit", started["at"], max(r["at"] for r in mine),
            {"planned": planned, "recorded": len(done), "published": sum(r["status"] == PUBLISHED for r in done),
             "producers_started": len(intents), "producers_unrecorded": len(unrecorded),
             "may_be_on_topic_unrecorded": may_be_sent},
            f"emit attempt {attempt_id} stopped before it finished (or is running now); not yet folded in: the next "
            f"emit of the run records it. {len(done):,} of {planned:,} records recorded in emitted; "
            f"{plural(len(unrecorded), 'producer')} ({plural(may_be_sent, 'record')}) may have sent without a record"))
    return out


def unfolded_repairs(store: TableStore, run_id: str | None = None) -> list[UnfoldedAttempt]:
    """The repair runs (`run_id`, or all) whose `repair_journal` is not closed, oldest first: each stopped (or is
    running now) and no later repair has folded it in."""
    from sweeper.retention.journal import JOURNAL_TABLE, unclosed_runs, unsettled

    pending = [r for r in unclosed_runs(store) if run_id in (None, r)]
    if not pending:
        return []
    written = store.read_arrow(JOURNAL_TABLE, where={"run_id": pending}).to_pylist()
    recorded: list[dict[str, Any]] = []
    if store.exists("retention_actions"):
        recorded = store.read_arrow("retention_actions", where={"run_id": pending, "dry_run": False}).to_pylist()
    found = []
    for run in pending:
        mine = sorted((r for r in written if r["run_id"] == run), key=lambda r: r["at"])
        own = [r for r in recorded if r["run_id"] == run]
        found.append(UnfoldedAttempt(run, run, mine[0]["at"], max([mine[-1]["at"], *(r["finished_at"] for r in own)]),
                                     tuple(own), tuple(unsettled(mine, own))))
    return sorted(found, key=lambda r: r.started)


def _unfolded_repair_rows(store: TableStore, recorded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """An `interrupted` row for each unfolded repair run with no `runs` row of its stage: the fold-in writes one
    only then (any row: its own, stopped before closing the journal, or the run's own stage wrapper's)."""
    from sweeper.retention.journal import STAGE

    out = []
    for repair in unfolded_repairs(store):
        if any(r["run_id"] == repair.run_id and r["stage"] == STAGE for r in recorded):
            continue
        by_outcome = Counter(r["outcome"] for r in repair.outcomes)
        done = ", ".join(f"{n:,} {outcome}" for outcome, n in sorted(by_outcome.items()))
        out.append(journal.interrupted_row(
            repair.run_id, STAGE, repair.started, repair.last,
            {**by_outcome, INTENDED: len(repair.in_flight), "recorded": len(repair.outcomes), "execute": 1},
            f"repair run {repair.run_id} stopped before it finished (or is running now); {REPAIR_NOT_FOLDED}. "
            f"{plural(len(repair.outcomes), 'row')} recorded in retention_actions{f' ({done})' if done else ''} and "
            f"{plural(len(repair.in_flight), 'call')} intended without a row (unknown until then): "
            f"`sweeper show {repair.run_id} actions` lists them"))
    return out


def run_rows(store: TableStore) -> list[dict[str, Any]]:
    """The `runs` rows, and an `interrupted` row for each attempt whose journal no fold-in has recorded yet."""
    recorded = runs.rows(store)
    return recorded + unfolded_run_rows(store, recorded)


def _journal_deletes(store: TableStore, run_id: str) -> list[dict[str, Any]]:
    """`delete_results`-shaped rows for what the run's unfolded attempts journalled and `delete_results` does not
    hold yet: each outcome as journalled (never re-decided here: the fold-in decides), each intent without an
    outcome as `intended`."""
    from sweeper.delete.journal import JOURNAL_TABLE
    from sweeper.delete.results import FAILED
    from sweeper.table_schemas import DELETE_RESULTS

    # An attempt whose fold-in wrote its `interrupted` row has all its results written too (they come first).
    recorded = runs.rows(store, run_id=run_id, stage="delete")
    attempts = [a for a in unfolded_delete_attempts(store, run_id)
                if not _recorded({"run_id": a.run_id, "at": a.started}, recorded, "delete", a.attempt_id)]
    if not attempts:
        return []
    # What a fold-in (or the attempt's own driver, stopped between its commit and its close) already wrote: the
    # fold-in itself skips a record with a result other than `failed`; a `failed` of the same attempt count is
    # the same outcome.
    written: list[dict[str, Any]] = []
    if store.exists("delete_results"):
        written = store.read_arrow("delete_results", where={"run_id": run_id, "dry_run": False},
                                   columns=["record_key", "outcome", "attempt"]).to_pylist()
    final = {r["record_key"] for r in written if r["outcome"] != FAILED}
    failed = {(r["record_key"], r["attempt"]) for r in written if r["outcome"] == FAILED}
    names = DELETE_RESULTS.fieldNames()
    out = []
    for attempt in attempts:
        mark = f"journal of attempt {attempt.attempt_id}, {NOT_FOLDED}"
        for row in attempt.outcomes:
            key = row["record_key"]
            if key in final or (row["outcome"] == FAILED and (key, row["attempt"]) in failed):
                continue
            out.append(_journalled(names, row, JOURNAL_TABLE, row["outcome"],
                                   f"{mark}: {row['detail']}" if row["detail"] else mark, s3_keys=[]))
        for row in attempt.in_flight:
            if row["record_key"] not in final:
                out.append(_journalled(names, row, JOURNAL_TABLE, INTENDED, f"{IN_FLIGHT} ({mark})", s3_keys=[]))
    return out


def _journal_actions(store: TableStore, run_id: str) -> list[dict[str, Any]]:
    """`retention_actions`-shaped rows, `intended`, for the calls the run's unfolded repair journalled and recorded
    no action for (a fold-in writes a row for each, so once folded in there are none)."""
    from sweeper.retention.journal import JOURNAL_TABLE
    from sweeper.table_schemas import RETENTION_ACTIONS

    names = RETENTION_ACTIONS.fieldNames()
    return [_journalled(names, row, JOURNAL_TABLE, INTENDED,
                        f"{REPAIR_IN_FLIGHT} (its {row['call']} call, in {JOURNAL_TABLE}; {REPAIR_NOT_FOLDED})")
            for repair in unfolded_repairs(store, run_id) for row in repair.in_flight]


def _journalled(names: Sequence[str], row: Mapping[str, Any], journal: str, outcome: str, detail: str,
                **values: Any) -> dict[str, Any]:
    """A journal row in its table's shape (`names`): the journal's `at` as `finished_at`, never a dry run."""
    values = {**row, "finished_at": row["at"], "outcome": outcome, "detail": detail, "dry_run": False, **values}
    return {**{name: values.get(name) for name in names}, RECORDED_IN: journal}


# The views that also list what a journal not yet folded in holds, by their table.
_JOURNALLED = {"delete_results": _journal_deletes, "retention_actions": _journal_actions}


def show_rows(store: TableStore, run_id: str, view_name: str, filters: Mapping[str, str | None],
              limit: int | None) -> tuple[list[dict[str, Any]], View]:
    """The view's rows of `run_id` matching `filters` (exact values), in the view's order, at most `limit`."""
    view = VIEWS[view_name]
    where: dict[str, Any] = {view.run_column: run_id}
    for name, value in filters.items():
        if value is None:
            continue
        if name not in view.filters:
            raise UsageError(f"`show {view_name}` has no --{name} filter (it has: "
                             f"{', '.join('--' + f for f in sorted(view.filters)) or 'none'})")
        where[view.filters[name]] = value
    # What the run's unfolded delete attempts or repair journalled: listed until the next one folds it in.
    from_journal = _JOURNALLED.get(view.table)
    journalled = from_journal(store, run_id) if from_journal else []
    if not journalled and not runs.rows(store, run_id=run_id) and not (store.exists(view.table) and store.read_arrow(
            view.table, where={view.run_column: run_id}, columns=[view.run_column]).num_rows) \
            and not unfolded_delete_attempts(store, run_id) and not unfolded_repairs(store, run_id):
        raise UsageError(f"no run {run_id} in {store.root}: `sweeper runs` lists the runs there")
    found = store.read_arrow(view.table, where=where).to_pylist() if store.exists(view.table) else []
    if from_journal:
        # Every row says where it is recorded, so a script reading json or csv sees one shape either way.
        found = [{**r, RECORDED_IN: view.table} for r in found]
        found += [r for r in journalled if all(r.get(column) == value for column, value in where.items())]
        if journalled:
            view = replace(view, columns=(*view.columns, RECORDED_IN))
    found.sort(key=lambda r: (r.get(view.order) is None, r.get(view.order)))
    return (found[:limit] if limit else found), view


def render(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], fmt: str) -> str:
    """Rows as an aligned table, JSON lines or CSV (json and csv keep every column; a table the chosen ones)."""
    if fmt == "json":
        return "".join(json.dumps({k: _plain(v) for k, v in r.items() if not isinstance(v, bytes)}) + "\n"
                       for r in rows)
    if fmt == "csv":
        buffer = io.StringIO()
        names = [k for k in (rows[0].keys() if rows else columns) if not (rows and isinstance(rows[0][k], bytes))]
        writer = csv.DictWriter(buffer, fieldnames=names, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _cell(r.get(k)) for k in names})
        return buffer.getvalue()
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    right = [all(isinstance(r.get(c), int | float) or r.get(c) is None for r in rows) and rows for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(v.rjust(w) if right[i] else v.ljust(w)
                               for i, (v, w) in enumerate(zip(row, widths, strict=True))).rstrip())
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return dict(value)  # an Arrow map
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
