"""notebooks/audit.ipynb runs top to bottom on a fresh sandbox (through `sweeper audit`), so it cannot rot.

Its reclaim panel (issue 35) is also run on its own, without Spark or a kernel, over `reclaim` rows written by
delta-rs: the sandbox's own run is a dry run and never has any."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")  # before anything imports pyplot

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.sandbox import PORT_SPAN, sandbox_down
from harness.zkserver import free_port_block
from sweeper.cli import EXIT_OK, main
from sweeper.report import plots
from sweeper.table_schemas import RECLAIM
from sweeper.tables.delta_rs import DeltaRsTableStore
from tests.support.config import SHORT_LIVED_SPARK_ENV

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "audit.ipynb"
MiB = 2**20
T0 = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


# A sandbox, a sweep and the notebook's own kernel with its own Spark.
@pytest.mark.slow
def test_audit_notebook_executes_and_plots(tmp_path: Path) -> None:
    home = tmp_path / "sandbox"
    env = {"SWEEPER_SANDBOX_HOME": str(home), "SWEEPER_SANDBOX_PORT": str(free_port_block(PORT_SPAN)),
           "SWEEPER_TOPICS": "40", "PYSPARK_PYTHON": sys.executable, **SHORT_LIVED_SPARK_ENV}
    # `sweeper audit` sets the others for the kernel; all are restored afterwards.
    saved = {k: os.environ.get(k) for k in (*env, "SWEEPER_REPO", "SWEEPER_CONFIG", "SWEEPER_TABLES")}
    os.environ.update(env)
    os.environ.pop("SWEEPER_CONFIG", None)
    out = tmp_path / "reports" / "audit.ipynb"
    try:
        assert main(["audit", "--out", str(out), "--tables", str(tmp_path / "tables")]) == EXIT_OK
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sandbox_down(home, wipe=True)
    notebook = nbformat.read(out, as_version=4)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 6  # bytes by namespace, ages, reasons, bytes by cause, space given back, trend
    text = "".join(o.get("text", "") for o in outputs)
    assert "candidates" in text and "GiB reclaimable" in text
    assert "reclaimable by cause: orphans" in text and "pinned by idle cursors" in text
    # The notebook's own run is a dry run: its reclaim panel says so, and still draws (the empty figure).
    assert "no reclaim rows for run" in text and "own run is a dry run" in text
    panel = _reclaim_cell(notebook)
    assert [o for o in panel.outputs if "image/png" in o.get("data", {})]


def _reclaim_cell(notebook: Any) -> Any:
    (cell,) = [c for c in notebook.cells if c.cell_type == "code" and "plots.reclaim_by_bookie(" in c.source]
    return cell


def _run_panel(store: DeltaRsTableStore, run_id: str, *, existing_run: bool) -> list[Any]:
    """The panel's cell as the notebook runs it, with the names earlier cells define; what it displays."""
    shown: list[Any] = []
    names = {"store": store, "run_id": run_id, "RUN_ID": run_id if existing_run else None, "plots": plots,
             "display": shown.append}
    exec(compile(_reclaim_cell(nbformat.read(NOTEBOOK, as_version=4)).source, "audit.ipynb:reclaim", "exec"), names)
    return shown


def _reclaim_rows(store: DeltaRsTableStore) -> None:
    """An executed run measured twice (`sweeper reclaim --run-id` appends): the panel shows the newest per target."""
    def row(at: datetime, target: str, verdict: str, freed: int | None, pending: int, kind: str = "bookie",
            why: str = "") -> dict[str, Any]:
        return {"run_id": "night-1", "measured_at": at, "target_kind": kind, "target": target,
                "url": "http://127.0.0.1:8000" if kind == "bookie" else "", "found_by": "registration",
                "expected_bytes": 20 * MiB, "expected_ledgers": 4, "freed_deletion_bytes": freed,
                "freed_compaction_bytes": 0 if freed is not None else None, "freed_bytes": freed,
                "pending_bytes": pending, "verdict": verdict, "why": why, "action": "measured only"}

    later = T0 + timedelta(hours=1)
    store.append_rows("reclaim", [
        row(T0, "bookie-1:3181", "pending_gc", 0, 20 * MiB),
        row(T0, "bookie-2:3181", "not_measured", None, 0, why="connection refused"),
        row(T0, "offload-bucket", "freed", 20 * MiB, 0, kind="offload"),
    ], RECLAIM)
    store.append_rows("reclaim", [row(later, "bookie-1:3181", "pending_compaction", 18 * MiB, 2 * MiB)], RECLAIM)


def test_the_reclaim_panel_explains_freed_against_reclaimable() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cells = notebook.cells
    at = cells.index(_reclaim_cell(notebook))
    markdown = cells[at - 1]
    assert markdown.cell_type == "markdown" and markdown.source.startswith("## Space given back")
    for words in ("**reclaimable**", "**Freed**", "gcWaitTime", "15 minutes", "compaction", "pending_gc",
                  "pending_compaction", "not_measured", "sweeper reclaim --run-id"):
        assert words in markdown.source, words


def test_the_reclaim_panel_draws_a_run_s_newest_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = DeltaRsTableStore(str(tmp_path / "tables"), None)  # type: ignore[arg-type]  # reads need no Spark
    _reclaim_rows(store)
    shown = _run_panel(store, "night-1", existing_run=True)
    out = capsys.readouterr().out
    assert out.startswith("run night-1: bookies gave back 18.0 MiB of 20.0 MiB expected; 2.0 MiB waits for "
                          "compaction on bookie-1:3181"), out
    fig, table = shown
    assert isinstance(fig, Figure)
    FigureCanvasAgg(fig).draw()
    (ax,) = fig.axes
    assert ax.get_title() == "Space given back per bookie (run night-1)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["bookie-1:3181", "bookie-2:3181",
                                                            "offload-bucket (offload)"]
    assert "18.0: waits for compaction (2.0 pending)" in [t.get_text() for t in ax.texts]
    assert list(table.target) == ["bookie-1:3181", "bookie-2:3181", "offload-bucket"]
    assert list(table.verdict) == ["pending_compaction", "not_measured", "freed"]
    assert list(table["freed (MiB)"].fillna(-1)) == [18.0, -1, 20.0]
    assert list(table["pending (MiB)"]) == [2.0, 0.0, 0.0]
    assert table.why.iloc[1] == "connection refused"


@pytest.mark.parametrize("existing_run", [False, True], ids=["notebook-run", "run-id"])
def test_the_reclaim_panel_says_plainly_when_a_run_has_no_rows(tmp_path: Path, existing_run: bool,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = DeltaRsTableStore(str(tmp_path / "tables"), None)  # type: ignore[arg-type]
    shown = _run_panel(store, "dry-1", existing_run=existing_run)  # no reclaim table at all
    _reclaim_rows(store)
    shown += _run_panel(store, "dry-1", existing_run=existing_run)  # a table, but not a row of this run's
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    for out in lines:
        assert out.startswith("no reclaim rows for run dry-1, so no space given back to show: "), out
        assert ("own run is a dry run" in out) is not existing_run, out
    assert len(shown) == 2  # one figure each, no table
    for fig in shown:
        FigureCanvasAgg(fig).draw()
        (ax,) = fig.axes
        assert ax.get_title() == "Space given back per bookie (run dry-1)"
        assert [t.get_text() for t in ax.texts] == [f"{plots.NOTHING_TO_SHOW}: {plots.NO_RECLAIM}"]
