"""The audit notebook's figures (issue 23), as functions an operator can read and a test can check.

Each function takes the frame the notebook already has and returns a `matplotlib.figure.Figure`: no pyplot state,
so a figure is shown only where the caller displays or saves it, and a test can render it with the Agg backend.
Figures made of bytes pick one unit for the whole figure from its largest value (`bytes_unit`) and name it on the
axis; namespaces are labelled `tenant/namespace`; an empty input gives a figure saying "nothing to show", since a
run with no candidates is a normal outcome, not an error.

matplotlib is imported inside the functions: it is a dev/notebook dependency, and the sweeper itself never plots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from sweeper.vocabulary import DAY_MS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.dates import AutoDateFormatter, AutoDateLocator
    from matplotlib.figure import Figure

UNITS: tuple[tuple[str, int], ...] = (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))
NOTHING_TO_SHOW = "nothing to show"
TOP = 20
WIDTH = 8.0
# The reclaimable_report's columns and the words the notebook's markdown uses for them (the lifecycle blog's three
# reasons storage is never reclaimed).
CAUSES: dict[str, str] = {
    "orphan_bytes": "orphans",
    "expired_unloaded_bytes": "expired, unloaded",
    "idle_cursor_bytes": "pinned by idle cursors",
}


def bytes_unit(max_bytes: float | None) -> tuple[str, int]:
    """The largest binary unit that `max_bytes` reaches, as (name, bytes per unit); "B" for nothing or NaN.

    One unit per figure: the operator's complaint was bars in GiB next to a table in MiB."""
    if max_bytes is None or not math.isfinite(max_bytes) or max_bytes < 1:
        return UNITS[0]
    for name, size in reversed(UNITS):
        if max_bytes >= size:
            return name, size
    return UNITS[0]


def namespace_labels(frame: pd.DataFrame) -> pd.Series:
    """`tenant/namespace` per row. A ledger whose topic is unknown has neither, and groupby would silently drop
    its bytes on a null key, so it gets a label of its own instead."""
    tenant = frame["tenant"].astype("string")
    namespace = frame["namespace"].astype("string")
    label = tenant.fillna("?") + "/" + namespace.fillna("?")
    return label.mask(tenant.isna() & namespace.isna(), "(no namespace)").astype(object)


def bytes_by_namespace(candidates: pd.DataFrame, top: int = TOP) -> pd.Series:
    """Candidate bytes per `tenant/namespace`, largest first, the `top` largest. A flat string index, not the
    (tenant, namespace) tuples a two-column groupby gives."""
    if candidates.empty:
        return pd.Series(dtype="float64", name="size_bytes")
    sizes = candidates["size_bytes"].fillna(0).astype("float64")
    return sizes.groupby(namespace_labels(candidates)).sum().sort_values(ascending=False).head(top)


def bytes_by_cause(causes: pd.DataFrame, top: int = TOP) -> pd.DataFrame:
    """Bytes per cause (columns named as in `CAUSES`) per `tenant/namespace`, namespaces with something to reclaim
    only, largest total first."""
    if causes.empty:
        return pd.DataFrame(columns=list(CAUSES.values()), dtype="float64")
    table = causes[list(CAUSES)].fillna(0).astype("float64").rename(columns=CAUSES)
    table.index = pd.Index(namespace_labels(causes), name="tenant/namespace")
    table = table.groupby(level=0).sum()
    totals = table.sum(axis=1)
    return table.loc[totals[totals > 0].sort_values(ascending=False).index].head(top)


def reclaimable_by_namespace(candidates: pd.DataFrame, top: int = TOP) -> Figure:
    """Horizontal bars of candidate bytes per `tenant/namespace`, the largest on top."""
    title = f"Reclaimable bytes by tenant/namespace (top {top})"
    by_ns = bytes_by_namespace(candidates, top)
    if by_ns.empty:
        return _empty(title, "no candidates in this run")
    unit, scale = bytes_unit(by_ns.max())
    fig = _figure(_bar_height(len(by_ns)))
    ax = fig.add_subplot()
    _barh(ax, list(by_ns.index), by_ns.to_numpy() / scale)
    ax.set_title(title)
    ax.set_xlabel(f"reclaimable ({unit})")
    ax.set_ylabel("tenant/namespace")
    return fig


def age_histogram(candidates: pd.DataFrame, bins: int = 30) -> Figure:
    """How old the candidate ledgers are, in days since creation."""
    title = "Orphan age"
    # A column of nothing but nulls arrives from Spark as objects; numbers or nothing from here on.
    ages = pd.to_numeric(candidates.get("age_ms", pd.Series(dtype="float64")), errors="coerce").dropna() / DAY_MS
    if ages.empty:
        return _empty(title, "no candidate ages")
    from matplotlib.ticker import MaxNLocator

    fig = _figure(4.0)
    ax = fig.add_subplot()
    ax.hist(ages.to_numpy(), bins=bins, color="tab:blue", edgecolor="white")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    # Headroom above the tallest bin for the median's label.
    ax.margins(y=0.12)
    # The median says more than the mean here: a few very old leaks would drag the mean far right.
    median = float(ages.median())
    ax.axvline(median, color="tab:red", linestyle="--", linewidth=1)
    ax.annotate(f"median {median:,.1f} d", xy=(median, 1), xycoords=("data", "axes fraction"),
                xytext=(4, -4), textcoords="offset points", va="top", color="tab:red")
    ax.set_title(title)
    ax.set_xlabel("age (days since creation)")
    ax.set_ylabel("candidate ledgers")
    return fig


def candidates_by_reason(candidates: pd.DataFrame) -> Figure:
    """Candidate count per classification reason, the most frequent on top."""
    title = "Candidates by reason"
    reasons = candidates.groupby("reason").size().sort_values(ascending=False) if not candidates.empty else None
    if reasons is None or reasons.empty:
        return _empty(title, "no candidates, so no reasons")
    fig = _figure(_bar_height(len(reasons)))
    ax = fig.add_subplot()
    _barh(ax, [str(r) for r in reasons.index], reasons.to_numpy(), integer=True)
    ax.set_title(title)
    ax.set_xlabel("candidates")
    ax.set_ylabel("reason")
    return fig


def reclaimable_by_cause(causes: pd.DataFrame, top: int = TOP) -> Figure:
    """One panel per cause, side by side over the same `tenant/namespace` rows.

    Separate panels rather than stacked bars: orphans are often a hundred times the other causes, and on one scale
    the others were invisible. Each panel has its own scale but the figure has one unit, and every bar carries its
    value, so panels stay comparable by reading the numbers rather than the lengths."""
    title = "Reclaimable bytes by cause, per tenant/namespace (each panel has its own scale)"
    table = bytes_by_cause(causes, top)
    if table.empty:
        return _empty(title, "nothing reclaimable by any cause")
    unit, scale = bytes_unit(float(table.to_numpy().max()))
    fig = _figure(_bar_height(len(table)), width=WIDTH + 2)
    axes = fig.subplots(1, len(CAUSES), sharey=True)
    labels = list(table.index)
    for i, (ax, cause) in enumerate(zip(axes, CAUSES.values(), strict=True)):
        values = table[cause].to_numpy() / scale
        _barh(ax, labels, values, color=f"C{i}")
        ax.set_title(cause)
        ax.set_xlabel(f"reclaimable ({unit})")
        if not values.any():
            # An all-zero panel would get matplotlib's default -0.05..0.05 range, which reads as "some, but tiny".
            ax.set_xlim(0, 1)
            ax.set_xticks([])
            ax.text(0.5, 0.5, "none", transform=ax.transAxes, ha="center", va="center", color="grey")
    axes[0].set_ylabel("tenant/namespace")
    fig.suptitle(title)
    return fig


def candidates_per_run(trend: pd.DataFrame) -> Figure:
    """Candidates found by each reconcile run, against the run's start (UTC)."""
    from matplotlib import dates as mdates
    from matplotlib.ticker import MaxNLocator

    title = "Candidates per run"
    if trend.empty:
        return _empty(title, "no reconcile runs recorded")
    # The runs table keeps UTC instants; naive UTC datetime64 is what matplotlib's date converter takes reliably.
    started = pd.to_datetime(trend["started_at"], utc=True).dt.tz_convert(None)
    points = pd.DataFrame({"started": started, "candidates": trend["candidates"].fillna(0)}).sort_values("started")
    fig = _figure(4.0)
    ax = fig.add_subplot()
    ax.plot(points["started"].to_numpy(), points["candidates"].to_numpy(), marker="o")
    first, last = points["started"].min(), points["started"].max()
    if first == last:
        # matplotlib widens a single date by years, and ticks then read "01 Jan" with no year: a day either side.
        ax.set_xlim(first - pd.Timedelta(days=1), last + pd.Timedelta(days=1))
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(_dated(locator))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.tick_params(axis="x", labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.set_title(title)
    ax.set_xlabel("run started (UTC)")
    ax.set_ylabel("candidates")
    return fig


def _dated(locator: AutoDateLocator) -> AutoDateFormatter:
    """Tick labels as precise as the tick spacing, always with the month: runs are days apart in production but
    minutes apart in a sandbox, and a bare "03:20" or "15" says nothing about when."""
    from matplotlib import dates as mdates

    formatter = mdates.AutoDateFormatter(locator, defaultfmt="%d %b %H:%M:%S")
    # Keyed by tick spacing in days; the smallest key at least the spacing wins.
    formatter.scaled = {
        365.0: "%b %Y",
        30.0: "%b %Y",
        1.0: "%d %b %Y",
        1 / 24: "%d %b %H:%M",
        1 / (24 * 60): "%d %b %H:%M",
        1 / (24 * 60 * 60): "%d %b %H:%M:%S",
    }
    return formatter


def _figure(height: float, width: float = WIDTH) -> Figure:
    from matplotlib.figure import Figure

    # Constrained layout keeps long `tenant/namespace` labels and titles inside the image without tight_layout.
    return Figure(figsize=(width, height), layout="constrained")


def _bar_height(rows: int) -> float:
    """Room for every label: a fixed height squeezed twenty namespaces into overlapping text."""
    return min(max(3.0, 1.4 + 0.3 * rows), 9.0)


def _barh(ax: Axes, labels: Sequence[str], values: Sequence[float], *, color: str = "C0",
          integer: bool = False) -> None:
    """Bars from top to bottom in the given order, each labelled with its value at its end."""
    positions = range(len(labels))
    bars = ax.barh(positions, values, color=color)
    if integer:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yticks(list(positions), labels=list(labels))
    # Idempotent, unlike invert_yaxis(), which would flip the shared axis back on every other panel.
    ax.yaxis.set_inverted(True)
    ax.bar_label(bars, labels=[_value(v, integer) for v in values], padding=3, fontsize="small")
    # Headroom for the value printed past the longest bar.
    ax.margins(x=0.18)


def _value(value: float, integer: bool) -> str:
    if integer:
        return f"{int(value):,}"
    if value == 0:
        return "0"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


def _empty(title: str, why: str) -> Figure:
    fig = _figure(2.0)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"{NOTHING_TO_SHOW}: {why}", transform=ax.transAxes, ha="center", va="center", fontsize="large")
    return fig


# The reclaim table's verdicts (sweeper.reclaim.decide) as the figure writes them, and their colours.
VERDICT_WORDS: dict[str, str] = {
    "freed": "freed",
    "pending_compaction": "waits for compaction",
    "pending_gc": "waits for the GC",
    "shared_window": "a bound: others' deletions too",
    "restarted": "restarted: a lower bound",
    "unknown": "unknown",
    "not_measured": "not measured",
}
VERDICT_COLORS: dict[str, str] = {
    "freed": "tab:green",
    "pending_compaction": "tab:orange",
    "pending_gc": "tab:orange",
    "shared_window": "tab:gray",
    "restarted": "tab:gray",
    "unknown": "tab:gray",
    "not_measured": "tab:red",
}
NO_RECLAIM = "no reclaim measured: a dry run, or [reclaim] enabled = false"


def reclaim_by_bookie(rows: pd.DataFrame, run_id: str | None = None) -> Figure:
    """What each bookie (then each offload bucket) gave back after a run's deletes, next to what was expected.

    `rows` are the run's current `reclaim` rows (`sweeper.reclaim.stage.latest_rows`). Per target two bars: the
    expected bytes, and the freed bytes split into what the garbage collector freed by deleting whole entry logs
    (for a bucket: the deleted objects listed gone) and what compaction freed by rewriting logs shared with live
    data. The freed bar ends with the verdict, and
    with the bytes still pending when some are: freed is what the bookie's own counters say, and it lags the
    delete by the bookie's gcWaitTime or until a compaction (so a short bar is not an error by itself). A target
    that was not measured has no freed bar, only its verdict."""
    if run_id is None and not rows.empty and "run_id" in rows and rows["run_id"].nunique() == 1:
        run_id = str(rows["run_id"].iloc[0])
    title = "Space given back per bookie" + (f" (run {run_id})" if run_id else "")
    if rows.empty:
        return _empty(title, NO_RECLAIM)
    table = _reclaim_table(rows)
    freed = table["deletion"] + table["compaction"]
    unit, scale = bytes_unit(float(max(table["expected"].max(), freed.max())))
    table[["expected", "deletion", "compaction", "pending"]] /= scale
    freed = freed / scale

    fig = _figure(min(max(3.2, 2.0 + 0.6 * len(table)), 12.0))
    ax = fig.add_subplot()
    positions = range(len(table))
    height = 0.38
    expected_y = [p - height / 2 for p in positions]
    freed_y = [p + height / 2 for p in positions]
    expected = ax.barh(expected_y, table["expected"], height, color="0.7", label="expected")
    ax.barh(freed_y, table["deletion"], height, color="tab:blue", label="freed by deletion")
    ax.barh(freed_y, table["compaction"], height, left=table["deletion"], color="tab:cyan",
            label="freed by compaction")
    ax.bar_label(expected, labels=[_value(v, False) for v in table["expected"]], padding=3, fontsize="small")
    for y, total, row in zip(freed_y, freed, table.itertuples(index=False), strict=True):
        words = VERDICT_WORDS.get(row.verdict, row.verdict)
        if row.verdict == "not_measured":
            text = words
        else:
            text = f"{_value(total, False)}: {words}"
            if row.pending > 0 and row.verdict != "freed":
                text += f" ({_value(row.pending, False)} pending)"
        ax.annotate(text, xy=(total, y), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize="small", color=VERDICT_COLORS.get(row.verdict, "black"))
    widest = float(max(table["expected"].max(), freed.max()))
    # Room past the longest bar for its verdict; all zero would get matplotlib's -0.05..0.05, read as "tiny".
    ax.set_xlim(0, widest * 1.6 if widest > 0 else 1)
    ax.set_yticks(list(positions), labels=list(table["label"]))
    ax.yaxis.set_inverted(True)
    ax.set_title(title)
    ax.set_xlabel(f"space ({unit})")
    ax.set_ylabel("bookie, then offload bucket")
    fig.legend(loc="outside lower center", ncols=3, fontsize="small", frameon=False)
    return fig


def _reclaim_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per target, bookies first then offload buckets, each by name: label, verdict and the byte columns
    as floats (a target that was not measured has null freed bytes: nothing freed is drawn for it)."""

    def column(name: str) -> pd.Series:
        values = rows[name] if name in rows else pd.Series(index=rows.index, dtype="float64")
        return pd.to_numeric(values, errors="coerce").fillna(0).clip(lower=0).astype("float64")

    kind = rows["target_kind"].fillna("bookie").astype(str)
    target = rows["target"].astype(str)
    deletion, compaction = column("freed_deletion_bytes"), column("freed_compaction_bytes")
    # A row with a total but no split (written by hand, or by an older step) counts the total as deletion.
    deletion = deletion.where(deletion + compaction > 0, column("freed_bytes"))
    table = pd.DataFrame({
        "order": (kind != "bookie").astype(int), "target": target,
        "label": target.where(kind == "bookie", target + " (offload)"),
        "verdict": rows["verdict"].fillna("not_measured").astype(str),
        "expected": column("expected_bytes"), "deletion": deletion, "compaction": compaction,
        "pending": column("pending_bytes"),
    })
    return table.sort_values(["order", "target"], kind="stable").reset_index(drop=True)
