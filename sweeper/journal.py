"""The one journal of the acting stages (issue 46): what every journal shares, and the only builder of the
`interrupted` rows of `runs`.

The emit, the delete and the retention repair act on a live cluster, so each writes a journal table before it acts
(`emit_journal`, `delete_journal`, `repair_journal`): an *intent* before each action, an *outcome* after it where
the stage records one, and a *closed* row when the attempt ends. An attempt with no closed row stopped (it was
killed, or it lost its run lock); the next holder of the stage's lock *folds* it in: it settles each intent
against the live cluster, records what was done as the stopped attempt's own, and writes one `interrupted` row
to `runs` for it. What each stage reads back to settle an intent is its own (a ledger znode, a cursor's version,
the `emitted` table); the phases, the marker below, the search for attempts that closed without their `runs`
row, and the row itself are here, once.

The read side: `sweeper runs` and `sweeper show` show attempts not folded yet from these same tables
(report.console), with rows built by `interrupted_row` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sweeper import runs
from sweeper.runs import ConfigHash
from sweeper.tables import TableStore

STARTED = "started"
INTENT = "intent"
OUTCOME = "outcome"
CLOSED = "closed"

# The detail a journal's closed row starts with when the stage wrapper writes the attempt's `runs` row right after:
# a closed attempt with no row of its stage recorded since was killed between the two, and the next attempt records
# it (`unrecorded`), so no attempt is left without a status.
RUNS_ROW_FOLLOWS = "closed; its runs row follows"


@dataclass(frozen=True)
class Declared:
    """A stage's journal, as the stage declares it: its table and the `runs` stage its attempts are recorded as."""

    stage: str
    table: str


EMIT = Declared("emit", "emit_journal")
DELETE = Declared("delete", "delete_journal")
REPAIR = Declared("retention_repair", "repair_journal")


@dataclass(frozen=True)
class PlainInterrupt:
    """A stage that writes no journal (the snapshot, reconcile, ...): its interrupt is a plain row, with `message`."""

    message: str = ""

    def record_interrupt(self, store: TableStore, run_id: str, stage: str, started: datetime,
                         config: ConfigHash | None) -> None:
        said = self.message or f"interrupted during {stage}; re-run the stage (or the sweep) to do it again"
        runs.record(store, run_id, stage, runs.INTERRUPTED, started, {}, config, said)


@dataclass(frozen=True)
class FoldedNow:
    """A stage that folds its own stopped attempt from its journal as it stops (the emit: what the broker
    acknowledged is in `emitted`): `fold(started)` records the row and says whether it found an attempt; if it
    found none (stopped before its journal began), a plain row with `before_journal`."""

    fold: Callable[[datetime], int]
    before_journal: str

    def record_interrupt(self, store: TableStore, run_id: str, stage: str, started: datetime,
                         config: ConfigHash | None) -> None:
        if not self.fold(started):
            PlainInterrupt(self.before_journal).record_interrupt(store, run_id, stage, started, config)


@dataclass(frozen=True)
class FoldedByNext:
    """A stage whose next attempt folds a stopped one, holding the lock (the delete): it must re-read the cluster
    to know what the stopped attempt did, which a process being stopped cannot do. Nothing is recorded now."""

    def record_interrupt(self, store: TableStore, run_id: str, stage: str, started: datetime,
                         config: ConfigHash | None) -> None:
        return None


def closed_detail(detail: str, runs_row_follows: bool) -> str:
    """The detail of an attempt's closed row: marked when the stage wrapper writes its `runs` row next."""
    if not runs_row_follows:
        return detail
    return RUNS_ROW_FOLLOWS + (f": {detail}" if detail else "")


def unrecorded(store: TableStore, stage: str, closed: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Of `closed` (journal rows: `run_id`, `detail`, and `at`, the close), those closed under the stage wrapper
    with no `stage` row of their run finished at or after the close."""
    waiting = [dict(r) for r in closed if str(r.get("detail") or "").startswith(RUNS_ROW_FOLLOWS)]
    wanted = sorted({r["run_id"] for r in waiting})
    if not wanted:
        return []
    ended: dict[str, list[datetime]] = {}
    if store.exists(runs.TABLE):
        for row in store.read_arrow(runs.TABLE, where={"stage": stage, "run_id": wanted},
                                    columns=["run_id", "finished_at"]).to_pylist():
            ended.setdefault(row["run_id"], []).append(row["finished_at"])
    return [r for r in waiting if not any(at >= r["at"] for at in ended.get(r["run_id"], ()))]


def interrupted_row(run_id: str, stage: str, started: datetime, finished: datetime, counts: Mapping[str, Any],
                    message: str, engine: str | None = None) -> dict[str, Any]:
    """The `runs` row of an attempt that stopped: the only place such a row is built."""
    return {"run_id": run_id, "stage": stage, "status": runs.INTERRUPTED, "started_at": started,
            "finished_at": finished, "duration_s": (finished - started).total_seconds(), "counts": dict(counts),
            "config_hash": None, "engine": engine, "message": message}


def record_interrupted(store: TableStore, stage: str, rows: list[dict[str, Any]], resolved_by: str) -> None:
    """The folded attempts' `interrupted` rows, in one commit that names who folded them."""
    runs.record_rows(store, rows, {"stage": stage, "resolved_by": resolved_by})


__all__ = ["CLOSED", "DELETE", "EMIT", "INTENT", "OUTCOME", "REPAIR", "RUNS_ROW_FOLLOWS", "STARTED", "Declared",
           "FoldedByNext", "FoldedNow", "PlainInterrupt", "closed_detail", "interrupted_row", "record_interrupted",
           "unrecorded"]
