"""Which topics the retention-debt step judges one by one (sweeper.retention.debt): `retention.may_owe_each` over
per-topic summaries computed column-wise from the tables' aggregates, and the Spark inputs cut down to them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sweeper.retention.debt_reads import _Topics
from sweeper.retention.debt_types import _Context
from sweeper.rules.retention import PolicyColumns, TopicSummaries, idle_seen_cutoff_ms, may_owe_each
from sweeper.vocabulary import COMPACTION_CURSOR


def _int_column(table: pa.Table, name: str, fill: int) -> np.ndarray:
    return pc.fill_null(table[name], fill).to_numpy().astype(np.int64, copy=False)


def _cursor_seen_ms(cursors: pa.Table) -> np.ndarray:
    """Each cursor's max(znode mtime, lastActive), nulls as 0: what `Cursor` holds and `idle_seen_cutoff_ms` bounds."""
    return np.maximum(_int_column(cursors, "zk_mtime_ms", 0), _int_column(cursors, "last_active_ms", 0))


def _first_per_topic(rows: np.ndarray, *order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(topic indices, row positions) of each topic's least row by `order` (most significant key first)."""
    sort = np.lexsort((*reversed(order), rows))
    first = np.ones(len(sort), dtype=np.bool_)
    first[1:] = rows[sort][1:] != rows[sort][:-1]
    return rows[sort][first], sort[first]


def _summaries(topics: _Topics) -> TopicSummaries:
    """`retention.summarize` of every managed ledger of `topics.managed_ledgers`, row for row, computed column-wise
    from the tables' aggregates; values coalesced as `_topic_rows` coalesces them, so `may_owe_each` sees what
    `assess_topic` will. Cursors and lists of managed ledgers without a row are left out, as `_topic_rows` does."""
    names = topics.managed_ledgers["managed_ledger"].combine_chunks()
    n = len(names)

    def index(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        at = pc.index_in(table["managed_ledger"], value_set=names)
        keep = pc.is_valid(at).to_numpy(zero_copy_only=False)
        return pc.fill_null(at, 0).to_numpy().astype(np.int64)[keep], keep

    def zeros() -> np.ndarray:
        return np.zeros(n, dtype=np.int64)

    lists = topics.lists
    ledger_count, lowest, current, total = zeros(), zeros(), np.full(n, -1, dtype=np.int64), zeros()
    at, keep = index(lists)
    ledger_count[at] = _int_column(lists, "ledger_id_count", 0)[keep]
    lowest[at] = _int_column(lists, "ledger_id_min", 0)[keep]
    current[at] = _int_column(lists, "ledger_id_max", -1)[keep]
    total[at] = _int_column(lists, "size_sum", 0)[keep]
    firsts = topics.firsts
    first_known = np.zeros(n, dtype=np.bool_)
    first_id, first_entries, first_size, first_closed = zeros(), zeros(), zeros(), zeros()
    at, keep = index(firsts)
    first_known[at] = True
    first_id[at] = _int_column(firsts, "ledger_id", 0)[keep]
    first_entries[at] = _int_column(firsts, "entries", 0)[keep]
    first_size[at] = _int_column(firsts, "size", 0)[keep]
    first_closed[at] = _int_column(firsts, "timestamp_ms", 0)[keep]
    # Two first entries for one list, or a first entry that is not the lowest id: not a list as Pulsar writes it
    # (in id order), so not summarized; `trimmable` sorts it and the topic is judged in full.
    first_known &= (np.bincount(at, minlength=n) == 1) & (first_id == lowest)
    cursors = topics.cursors
    at, keep = index(cursors)
    has_cursor, has_compaction = np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
    slowest_ledger, slowest_entry, compaction_ledger, compaction_entry = zeros(), zeros(), zeros(), zeros()
    oldest = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    if len(at):
        ledger = _int_column(cursors, "mark_delete_ledger_id", -1)[keep]
        entry = _int_column(cursors, "mark_delete_entry_id", -1)[keep]
        seen = _cursor_seen_ms(cursors)[keep]
        has_cursor[at] = True
        np.minimum.at(oldest, at, seen)
        topic, row = _first_per_topic(at, ledger, entry)
        slowest_ledger[topic], slowest_entry[topic] = ledger[row], entry[row]
        compaction = pc.fill_null(pc.equal(cursors["cursor"], COMPACTION_CURSOR), False).to_numpy(
            zero_copy_only=False)[keep]
        if compaction.any():
            topic, row = _first_per_topic(at[compaction], ledger[compaction], entry[compaction])
            has_compaction[topic] = True
            compaction_ledger[topic], compaction_entry[topic] = ledger[compaction][row], entry[compaction][row]
    oldest[~has_cursor] = 0
    return TopicSummaries(ledger_count, first_known, first_id, first_entries, first_size, first_closed, current,
                          total, has_cursor, slowest_ledger, slowest_entry, has_compaction, compaction_ledger,
                          compaction_entry, oldest)


@dataclass(frozen=True)
class _Selection:
    """The topics the per-topic pass judges (`retention.may_owe_each`) and what that costs."""

    assess: list[str] | None  # managed ledgers to judge; None: every one
    rows: int  # ledger-list entries and cursors of the judged topics
    cursor_ledgers: frozenset[int]  # cursor ledgers of the cursors that may be idle (their bytes are reported)


def _select(topics: _Topics, ctx: _Context) -> _Selection:
    """`may_owe_each` for every topic under its namespace's policy (none known: judged, and `unknown`), from the
    summaries; the cost counted from the lists' lengths and the cursors."""
    cursors = topics.cursors
    cutoff = idle_seen_cutoff_ms(ctx.now_ms, ctx.settings.report_idle_ms)
    cursor_ledgers = frozenset(x for x in cursors.filter(pa.array(_cursor_seen_ms(cursors) <= cutoff))[
        "cursors_ledger_id"].to_pylist() if x is not None and x >= 0)
    mls = topics.managed_ledgers
    n = mls.num_rows
    if ctx.settings.skip_topics_that_cannot_owe:
        namespaces = sorted(ctx.policies)
        # The key `_topic_rows` looks policies up by (f"{tenant}/{namespace}"); no policy: the last, unknown, one.
        keys = pc.binary_join_element_wise(mls["tenant"], mls["namespace"], "/")
        which = pc.fill_null(pc.index_in(keys, value_set=pa.array(namespaces, pa.string())), len(namespaces))
        policies = PolicyColumns.of([*(ctx.policies[ns][0] for ns in namespaces), None]).take(which.to_numpy())
        quarantined = pc.is_in(mls["managed_ledger"], value_set=pa.array(sorted(ctx.quarantined), pa.string()))
        owing = may_owe_each(policies, pc.fill_null(quarantined, False).to_numpy(zero_copy_only=False),
                             _summaries(topics), ctx.now_ms, ctx.settings.report_idle_ms)
    else:
        owing = np.ones(n, dtype=np.bool_)
    judged = pa.array(owing)
    names = mls["managed_ledger"].filter(judged).combine_chunks()
    rows = ((pc.sum(pc.fill_null(mls["ledger_count"].filter(judged), 0)).as_py() or 0)
            + (pc.sum(pc.is_in(cursors["managed_ledger"], value_set=names)).as_py() or 0))
    return _Selection(None if owing.all() else names.to_pylist(), rows, cursor_ledgers)


def _worth_assessing(spark: SparkSession, frames: dict[str, DataFrame], selection: _Selection
                     ) -> dict[str, DataFrame]:
    """The Spark pass's three inputs without the topics `_select` left out, filtered before the shuffle by a
    semi-join with the judged names (broadcast: a name per judged topic, however many)."""
    if selection.assess is None:
        return frames
    judged = F.broadcast(spark.createDataFrame(pa.table({"managed_ledger": pa.array(selection.assess, pa.string())})))
    return {**frames, **{name: frames[name].join(judged, "managed_ledger", "left_semi")
                         for name in ("managed_ledgers", "ml_cursors", "ml_ledgers")}}
