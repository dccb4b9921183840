"""The audit notebook's figures (sweeper.report.plots, issue 23) read without the notebook: labelled axes, one byte
unit per figure that matches the data, `tenant/namespace` labels, small causes visible next to large ones,
dated trend ticks.

No Spark and no servers: small frames, rendered with Agg. `SWEEPER_WRITE_DOC_PLOTS=1` also writes the figures to
docs/img/ for docs/operations.md.
"""

from __future__ import annotations

import ast
import calendar
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")  # before anything imports pyplot: no display, the same pixels everywhere

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sweeper.report import plots

REPO = Path(__file__).resolve().parents[1]
DOC_IMG = REPO / "docs" / "img"
MiB = 2**20
GiB = 2**30
DAY_MS = 86_400_000
UNIT_RE = re.compile(r"\((B|KiB|MiB|GiB|TiB)\)")
MONTHS = tuple(m for m in calendar.month_abbr if m)


def _candidates(sizes: dict[tuple[str, str], list[int]]) -> pd.DataFrame:
    """One candidate per size, with ages and reasons spread deterministically (no random seed to keep in step)."""
    rows = []
    reasons = ("topic_deleted", "dropped_from_list", "cursor_ledger_replaced", "schema_version_deleted")
    n = 0
    for (tenant, namespace), per_ledger in sizes.items():
        for size in per_ledger:
            rows.append({"tenant": tenant, "namespace": namespace, "size_bytes": size,
                         "age_ms": (3 + (n * 37) % 41 + (n * 13) % 17) * DAY_MS,
                         "reason": reasons[min(n % 7, n % 5, 3)], "status": "candidate"})
            n += 1
    return pd.DataFrame(rows)


def _causes() -> pd.DataFrame:
    """600 MiB of orphans next to 1 MiB expired-unloaded and 2 MiB idle-cursor bytes: the operator's case."""
    return pd.DataFrame([
        {"tenant": "tenant-0", "namespace": "ns-1", "orphan_bytes": 600 * MiB, "expired_unloaded_bytes": 1 * MiB,
         "idle_cursor_bytes": 0, "unknown_topics": 0},
        {"tenant": "tenant-1", "namespace": "ns-0", "orphan_bytes": 40 * MiB, "expired_unloaded_bytes": 0,
         "idle_cursor_bytes": 2 * MiB, "unknown_topics": 1},
        {"tenant": "tenant-2", "namespace": "ns-3", "orphan_bytes": 5 * MiB, "expired_unloaded_bytes": MiB // 2,
         "idle_cursor_bytes": MiB, "unknown_topics": 0},
        {"tenant": "tenant-3", "namespace": "ns-2", "orphan_bytes": 0, "expired_unloaded_bytes": 0,
         "idle_cursor_bytes": 0, "unknown_topics": 2},
    ])


def _trend(days: int = 6) -> pd.DataFrame:
    start = datetime(2025, 3, 28, 3, 20, tzinfo=UTC)
    return pd.DataFrame({"started_at": [start + timedelta(days=d) for d in range(days)],
                         "candidates": [120, 118, 131, 97, 64, 66][:days]})


def _reclaim(run_id: str = "night-1") -> pd.DataFrame:
    """A run's current `reclaim` rows (sweeper.reclaim.stage.latest_rows), one of each verdict, in no order."""
    def row(kind: str, target: str, expected: int, deletion: int | None, compaction: int | None, pending: int,
            verdict: str) -> dict:
        freed = None if deletion is None else deletion + (compaction or 0)
        return {"run_id": run_id, "target_kind": kind, "target": target, "expected_bytes": expected,
                "freed_deletion_bytes": deletion, "freed_compaction_bytes": compaction, "freed_bytes": freed,
                "pending_bytes": pending, "verdict": verdict, "why": "", "action": "measured only"}

    return pd.DataFrame([
        row("offload", "pulsar-offload", 30 * MiB, 30 * MiB, 0, 0, "freed"),
        row("bookie", "bookie-2:3181", 20 * MiB, 16 * MiB, 2 * MiB, 2 * MiB, "pending_compaction"),
        row("bookie", "bookie-1:3181", 20 * MiB, 21 * MiB, 0, 0, "freed"),
        row("bookie", "bookie-4:3181", 8 * MiB, None, None, 0, "not_measured"),
        row("bookie", "bookie-3:3181", 12 * MiB, 0, 0, 12 * MiB, "pending_gc"),
    ])


def _figures() -> dict[str, Figure]:
    """One of each figure, over data shaped like the operator's report (the PNGs in docs/img/ are these)."""
    candidates = _candidates({
        ("tenant-0", "ns-1"): [5 * MiB] * 120,
        ("tenant-1", "ns-0"): [MiB] * 48,
        ("tenant-2", "ns-3"): [MiB] * 5,
        ("tenant-0", "ns-2"): [MiB // 2] * 3,
    })
    return {
        "audit-by-namespace": plots.reclaimable_by_namespace(candidates),
        "audit-age": plots.age_histogram(candidates),
        "audit-reasons": plots.candidates_by_reason(candidates),
        "audit-by-cause": plots.reclaimable_by_cause(_causes()),
        "audit-trend": plots.candidates_per_run(_trend()),
        "audit-reclaim": plots.reclaim_by_bookie(_reclaim()),
    }


def _draw(fig: Figure) -> Figure:
    FigureCanvasAgg(fig).draw()  # tick labels and extents exist only once drawn
    return fig


def _axes(fig: Figure) -> Iterator[Axes]:
    yield from (ax for ax in fig.axes if ax.axison)


def _ylabel(ax: Axes) -> str:
    """The y label, or that of an axes sharing this y axis (side-by-side panels label the first only)."""
    return next((a.get_ylabel() for a in ax.get_shared_y_axes().get_siblings(ax) if a.get_ylabel()), "")


def _overlaps(a, b) -> bool:  # two display-space Bboxes
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _units(fig: Figure) -> set[str]:
    return {u for ax in _axes(fig) for u in UNIT_RE.findall(ax.get_xlabel())}


@pytest.fixture(scope="module")
def figures() -> dict[str, Figure]:
    return {name: _draw(fig) for name, fig in _figures().items()}


def test_every_figure_has_titles_and_axis_labels(figures: dict[str, Figure]) -> None:
    for name, fig in figures.items():
        axes = list(_axes(fig))
        assert axes, name
        for ax in axes:
            assert ax.get_title() or fig.get_suptitle(), name
            assert ax.get_xlabel().strip(), name
            assert _ylabel(ax).strip(), name


def test_one_byte_unit_per_figure_matching_the_magnitude(figures: dict[str, Figure]) -> None:
    assert _units(figures["audit-by-namespace"]) == {"MiB"}  # 600 MiB at most
    assert _units(figures["audit-by-cause"]) == {"MiB"}
    assert _units(figures["audit-reclaim"]) == {"MiB"}  # 30 MiB at most
    big = _draw(plots.reclaimable_by_namespace(_candidates({("t", "a"): [2 * GiB, GiB], ("t", "b"): [3 * MiB]})))
    assert _units(big) == {"GiB"}
    (ax,) = _axes(big)
    widths = [p.get_width() for p in ax.patches]
    assert widths == pytest.approx([3.0, 3 / 1024])  # in the axis's unit, largest first
    for name in ("audit-age", "audit-reasons", "audit-trend"):
        assert not _units(figures[name]), name


def test_bytes_unit_boundaries() -> None:
    assert plots.bytes_unit(0) == ("B", 1)
    assert plots.bytes_unit(float("nan")) == ("B", 1)
    assert plots.bytes_unit(1023) == ("B", 1)
    assert plots.bytes_unit(1024) == ("KiB", 2**10)
    assert plots.bytes_unit(600 * MiB) == ("MiB", MiB)
    assert plots.bytes_unit(1023.9 * MiB) == ("MiB", MiB)
    assert plots.bytes_unit(3 * GiB) == ("GiB", GiB)
    assert plots.bytes_unit(5 * 2**50) == ("TiB", 2**40)


def test_namespaces_are_labelled_tenant_slash_namespace(figures: dict[str, Figure]) -> None:
    for name in ("audit-by-namespace", "audit-by-cause"):
        # Side-by-side panels share their rows: only the first shows the labels.
        labels = [t.get_text() for ax in _axes(figures[name]) for t in ax.get_yticklabels()]
        assert labels, name
        assert all("/" in t and "(" not in t for t in labels), (name, labels)
    (ax,) = _axes(figures["audit-by-namespace"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["tenant-0/ns-1", "tenant-1/ns-0", "tenant-2/ns-3",
                                                            "tenant-0/ns-2"]


def test_small_causes_are_visible_next_to_600_mib_of_orphans(figures: dict[str, Figure]) -> None:
    fig = figures["audit-by-cause"]
    panels = {ax.get_title(): ax for ax in _axes(fig)}
    assert set(panels) == {"orphans", "expired, unloaded", "pinned by idle cursors"}
    for title, ax in panels.items():
        left, right = ax.get_xlim()
        widest = max(p.get_width() for p in ax.patches)
        # Its own scale: the largest bar of every panel spans most of it, 1 MiB as much as 600 MiB.
        assert widest > 0 and widest / (right - left) > 0.5, title
    # The namespace with nothing reclaimable is left out, not drawn as empty bars.
    assert "tenant-3/ns-2" not in {t.get_text() for t in panels["orphans"].get_yticklabels()}


def test_legends_stay_off_the_data(figures: dict[str, Figure]) -> None:
    renderer = FigureCanvasAgg(Figure()).get_renderer()
    for name, fig in figures.items():
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in _axes(fig):
                assert not _overlaps(box, ax.get_window_extent(renderer)), name


def test_trend_ticks_name_the_month(figures: dict[str, Figure]) -> None:
    (ax,) = _axes(figures["audit-trend"])
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) >= 2
    assert all(any(m in t for m in MONTHS) for t in labels), labels
    assert len(set(labels)) == len(labels), labels


@pytest.mark.parametrize("offsets", [
    [timedelta(0)],  # the notebook on fresh tables: one run, which matplotlib would widen by years
    [timedelta(minutes=m) for m in (0, 7, 15)],  # a sandbox: runs minutes apart
    [timedelta(0), timedelta(minutes=1)],
    [timedelta(days=d) for d in range(0, 400, 30)],
], ids=["one-run", "minutes", "one-minute", "a-year"])
def test_trend_ticks_are_dated_at_any_spacing(offsets: list[timedelta]) -> None:
    start = datetime(2025, 4, 2, 10, 0, tzinfo=UTC)
    # Arrow gives the runs table's timestamps as microseconds, UTC.
    started = pd.Series([start + o for o in offsets]).astype("datetime64[us, UTC]")
    (ax,) = _axes(_draw(plots.candidates_per_run(pd.DataFrame({"started_at": started,
                                                                "candidates": range(len(offsets))}))))
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) >= 2, labels
    assert all(any(m in t for m in MONTHS) for t in labels), labels
    assert len(set(labels)) == len(labels), labels  # precise enough that no two ticks read alike
    left, right = ax.get_xlim()
    assert right - left <= max(3.0, 1.2 * (offsets[-1] - offsets[0]).days + 3)  # days around the runs, not years


@pytest.mark.parametrize("draw", [
    lambda: plots.reclaimable_by_namespace(_candidates({}).reindex(columns=["tenant", "namespace", "size_bytes"])),
    lambda: plots.age_histogram(pd.DataFrame(columns=["age_ms"])),
    lambda: plots.age_histogram(pd.DataFrame({"age_ms": [None, None]})),
    lambda: plots.candidates_by_reason(pd.DataFrame(columns=["reason"])),
    lambda: plots.reclaimable_by_cause(_causes().iloc[0:0]),
    lambda: plots.reclaimable_by_cause(_causes().iloc[3:]),  # rows, but nothing reclaimable
    lambda: plots.candidates_per_run(pd.DataFrame()),  # no runs rows at all: not even columns
    lambda: plots.reclaim_by_bookie(pd.DataFrame()),  # no `reclaim` table at all: latest_rows gives []
    lambda: plots.reclaim_by_bookie(_reclaim().iloc[0:0]),
])
def test_empty_inputs_say_nothing_to_show(draw) -> None:
    fig = _draw(draw())
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(plots.NOTHING_TO_SHOW in t for t in texts), texts
    assert all(ax.get_title() for ax in fig.axes)


def test_reclaim_shows_expected_and_freed_per_bookie_then_offload_with_verdicts(figures: dict[str, Figure]) -> None:
    fig = figures["audit-reclaim"]
    (ax,) = _axes(fig)
    assert ax.get_title() == "Space given back per bookie (run night-1)"
    # Bookies by id, then the offload buckets; the first on top.
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "bookie-1:3181", "bookie-2:3181", "bookie-3:3181", "bookie-4:3181", "pulsar-offload (offload)"]
    assert ax.yaxis.get_inverted()
    # Per target: expected, freed by deletion, freed by compaction (stacked on the deletion bar), in MiB.
    expected, deletion, compaction = (ax.containers[i] for i in range(3))
    assert [p.get_width() for p in expected] == pytest.approx([20, 20, 12, 8, 30])
    assert [p.get_width() for p in deletion] == pytest.approx([21, 16, 0, 0, 30])
    assert [p.get_width() for p in compaction] == pytest.approx([0, 2, 0, 0, 0])
    assert [p.get_x() for p in compaction] == pytest.approx([21, 16, 0, 0, 30])
    for e, d in zip(expected, deletion, strict=True):  # the two bars of a target sit side by side
        assert d.get_y() == pytest.approx(e.get_y() + e.get_height())
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["expected", "freed by deletion", "freed by compaction"]
    # Each expected bar ends with its value; each freed bar with its value, its verdict, and what is still pending.
    texts = [t.get_text() for t in ax.texts]
    assert texts[:5] == ["20.0", "20.0", "12.0", "8.0", "30.0"]
    assert texts[5:] == ["21.0: freed", "18.0: waits for compaction (2.0 pending)",
                        "0: waits for the GC (12.0 pending)", "not measured", "30.0: freed"]
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    for text in ax.texts:  # room for them inside the axes, past the longest bar
        extent = text.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, text.get_text()


def test_reclaim_of_a_run_without_rows_says_why() -> None:
    fig = _draw(plots.reclaim_by_bookie(pd.DataFrame(), run_id="dry-1"))
    (ax,) = fig.axes
    assert ax.get_title() == "Space given back per bookie (run dry-1)"
    assert [t.get_text() for t in ax.texts] == [f"{plots.NOTHING_TO_SHOW}: {plots.NO_RECLAIM}"]
    assert "a dry run" in plots.NO_RECLAIM and "[reclaim] enabled = false" in plots.NO_RECLAIM


def test_reclaim_with_only_unmeasured_bookies_or_a_freed_total_without_split() -> None:
    # The sandbox's bookies run without their HTTP server: every row is not_measured, with no freed bytes.
    rows = _reclaim().iloc[[3]].assign(expected_bytes=3 * GiB)
    (ax,) = _axes(_draw(plots.reclaim_by_bookie(rows)))
    assert _units(ax.figure) == {"GiB"}
    assert [t.get_text() for t in ax.texts] == ["3.0", "not measured"]
    assert [p.get_width() for p in ax.containers[1]] == [0]
    # A row with a freed total but no split draws the total as freed by deletion.
    rows = _reclaim().iloc[[2]].assign(freed_deletion_bytes=None, freed_compaction_bytes=None)
    (ax,) = _axes(_draw(plots.reclaim_by_bookie(rows)))
    assert [p.get_width() for p in ax.containers[1]] == pytest.approx([21])
    # Nothing expected and nothing freed: an axis from zero, not matplotlib's -0.05..0.05.
    rows = _reclaim().iloc[[0]].assign(expected_bytes=0, freed_deletion_bytes=0, freed_bytes=0)
    (ax,) = _axes(_draw(plots.reclaim_by_bookie(rows)))
    assert ax.get_xlim() == (0, 1)


def test_empty_candidates_aggregate_to_empty_tables() -> None:
    empty = pd.DataFrame(columns=["tenant", "namespace", "size_bytes", "age_ms", "reason"])
    assert plots.bytes_by_namespace(empty).empty
    assert plots.bytes_by_cause(_causes().iloc[0:0]).empty


def test_plots_never_import_spark() -> None:
    tree = ast.parse((REPO / "sweeper" / "report" / "plots.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [n for n in names if n.split(".")[0] in {"pyspark", "delta"}], names


@pytest.mark.skipif(os.environ.get("SWEEPER_WRITE_DOC_PLOTS") != "1", reason="SWEEPER_WRITE_DOC_PLOTS=1 writes them")
def test_write_doc_plots() -> None:
    DOC_IMG.mkdir(parents=True, exist_ok=True)
    for name, fig in _figures().items():
        fig.savefig(DOC_IMG / f"{name}.png", dpi=80)
        assert (DOC_IMG / f"{name}.png").stat().st_size > 0
