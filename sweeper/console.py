"""What the sweeper did, read back from its tables for an operator: `sweeper runs` and `sweeper show` (issue 23).

Read-only, and without a Spark session: delta-rs reads the tables (whichever engine wrote them) on the
driver. The summaries are plain functions over plain rows; `read_store` is the only I/O.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sweeper import runs
from sweeper.config import SweeperConfig
from sweeper.errors import UsageError
from sweeper.tables.base import TableStore

FORMATS = ("table", "json", "csv")

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
}


def read_store(config: SweeperConfig) -> TableStore:
    """The tables of `config`, read by delta-rs without Spark; a root with no tables is the operator's mistake."""
    from sweeper.tables.delta_rs import DeltaRsTableStore
    from sweeper.tables.storage import TableStorage, delta_rs_options

    storage = TableStorage(config.tables.root, config.tables.s3_endpoint, config.tables.s3_region)
    if not storage.on_s3 and not Path(config.tables.root).is_dir():
        raise UsageError(f"no tables at {config.tables.root}: point --tables (or [tables] root in --config) at "
                         "the sweeper's tables, or run `sweeper sweep` first")
    store = DeltaRsTableStore(config.tables.root, None, delta_rs_options(storage))  # type: ignore[arg-type]
    if not store.exists(runs.TABLE):
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
            "deleted": _deleted(counts),
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


def _deleted(counts: Mapping[str, Mapping[str, int]]) -> int | None:
    for stage in ("delete", "retention_repair"):
        if stage in counts:
            return int(counts[stage].get("deleted", 0))
    return None


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
    if not runs.rows(store, run_id=run_id) and not (store.exists(view.table) and store.read_arrow(
            view.table, where={view.run_column: run_id}, columns=[view.run_column]).num_rows):
        raise UsageError(f"no run {run_id} in {store.root}: `sweeper runs` lists the runs there")
    if not store.exists(view.table):
        return [], view
    found = store.read_arrow(view.table, where=where).to_pylist()
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
