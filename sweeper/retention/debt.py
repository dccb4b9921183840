"""The retention-debt step (after reconcile): expired ledgers nobody trims, and what idle cursors pin.

Each managed ledger's ledger list, cursors and znode times are brought together and `sweeper.rules.retention`'s
pure rules applied to each topic. Topics that cannot owe anything are left out first: `retention.may_owe`
decides from per-topic aggregates (each ledger list's count, lowest and highest id, total size and first
entry, grouped by the table engine; each topic's slowest and oldest cursor), whatever the namespace's policy.
When what remains is small it is judged on the driver, read straight from the tables
(`TableStore.read_arrow`); otherwise Spark semi-joins the names, shuffles by managed ledger and each task
judges its topics. The facts that are per namespace (policies, bundle ownership) and the few ledgers the
driver needs are small reads too; whether a namespace's topic-level policies may exist is settled on the
driver once the rows are back. One run's snapshot in; `retention_debt` (a row per topic that owes
something or cannot be judged, a row per idle cursor) and `reclaimable_report` (bytes by cause per tenant
and namespace, orphans included) out. Nothing here talks to a broker: a lookup would acquire bundles and
load topics, which is the repair (`sweeper.retention.repair`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

from sweeper import runs
from sweeper.config import RetentionConfig, SafetyConfig
from sweeper.errors import Refused
from sweeper.rules.protection import NONE, REPLICATED_SUBSCRIPTION_PROPERTY, Protected, Protection, describe
from sweeper.rules.retention import (
    MINUTE_MS,
    BrokerRetention,
    Cursor,
    CursorStatus,
    DebtReason,
    Ledger,
    NamespacePolicy,
    Policy,
    PolicyColumns,
    Position,
    TopicFacts,
    TopicStatus,
    TopicSummaries,
    assess_topic,
    bundle_owned,
    change_events_may_hold_policies,
    cursor_status,
    effective_policy,
    idle_seen_cutoff_ms,
    is_system_topic,
    last_possible_ack_ms,
    may_owe_each,
    topic_protection,
    topic_status,
)
from sweeper.rules.safety import Scope, retention_scope
from sweeper.table_schemas import ALL_TABLES, RECLAIMABLE_REPORT, RETENTION_DEBT, SNAPSHOT_TABLES
from sweeper.tables import TableStore
from sweeper.vocabulary import (
    CHANGE_EVENTS,
    COMPACTION_CURSOR,
    DAY_MS,
    NOT_SET,
    NOT_USED,
    RULED_OUT,
    SET,
    UNCHECKED,
    UNREAD,
)

TOPIC, CURSOR = "topic", "cursor"
# `topic_policy` values (see table_schemas.RETENTION_DEBT); UNCHECKED only between the tasks and finalize.
_ML, _CURSOR, _LEDGER = 0, 1, 2

# One frame for the three inputs, so one shuffle brings a managed ledger's rows together. The generic
# long columns mean, by kind: managed ledger (a=znode mtime, b=znode version); cursor (a=cursorsLedgerId,
# b/c=mark-delete ledger/entry, d=znode mtime, e=lastActive, f=znode version, h=replicated subscription);
# ledger (a=ledger id, b=entries, c=size, d=close timestamp, g=offloaded).
UNION = StructType([
    StructField("managed_ledger", StringType(), False),
    StructField("kind", IntegerType(), False),
    StructField("name", StringType()),
    StructField("tenant", StringType()),
    StructField("namespace", StringType()),
    StructField("topic_name", StringType()),
    StructField("shadow", BooleanType()),
    *(StructField(c, LongType()) for c in "abcdef"),
    StructField("g", BooleanType()),
    StructField("h", BooleanType()),
])


class RetentionDebtRefused(Refused):
    """The step will not run: no successful snapshot, or the run already has its retention debt."""


@dataclass(frozen=True)
class RetentionSettings:
    broker: BrokerRetention = field(default_factory=BrokerRetention)
    report_idle_ms: int = 7 * DAY_MS
    delete_after_ms: int = 0  # [retention] cursor_idle_days; 0: subscriptions are never deleted
    scope: Scope = field(default_factory=Scope)
    topic_policies: str = "system_topic"
    # Skip, before any per-topic pass, the topics `may_owe` rules out. Off only to check that skipping changes
    # nothing, and in benchmarks.
    skip_topics_that_cannot_owe: bool = True
    # Judge the selected topics on the driver when their ledger-list entries and cursors are at most this many
    # (some hundreds of MB of Python objects at worst); more go through a Spark shuffle.
    driver_assess_max_rows: int = 500_000
    protection: Protection = NONE  # [retention] protected_subscriptions / protected_topics

    @classmethod
    def from_config(cls, r: RetentionConfig, safety: SafetyConfig) -> RetentionSettings:
        broker = BrokerRetention(r.default_retention_minutes, r.default_retention_size_mb, r.default_ttl_seconds,
                                r.check_interval_seconds * 1000, r.expiry_check_minutes * MINUTE_MS,
                                r.cursor_rollover_seconds * 1000, r.untrimmed_margin_seconds * 1000)
        scope = retention_scope(r.allow, r.deny, safety.allow, safety.deny)
        return cls(broker, int(r.report_idle_days * DAY_MS), int(r.cursor_idle_days * DAY_MS), scope, r.topic_policies,
                   protection=Protection.of(r.protected_subscriptions, r.protected_topics))


@dataclass(frozen=True)
class _Context:
    """What every task needs: small and picklable."""

    run_id: str
    now_ms: int
    settings: RetentionSettings
    policies: dict[str, tuple[Policy | None, DebtReason | None, str]]
    owned: dict[str, tuple[tuple[int, int], ...]]
    ownership_readable: bool
    quarantined: frozenset[str]


@dataclass(frozen=True)
class RetentionDebtCounts(runs.StageCounts):
    """Topics and idle cursors by status, the bytes reclaimable by cause, and what the step had to read."""

    topics: Mapping[str, int] = runs.breakdown("topic.")  # candidate, unknown, awaiting_broker, protected, none...
    cursors: Mapping[str, int] = runs.breakdown("cursor.")  # candidate, idle, protected, out_of_scope, unknown
    orphan_bytes: int = runs.count("bytes.orphan")
    expired_unloaded_bytes: int = runs.count("bytes.expired_unloaded")
    idle_cursor_bytes: int = runs.count("bytes.idle_cursor")
    awaiting_broker_bytes: int = runs.count("bytes.awaiting_broker")
    topics_judged: int = 0
    ownership_readable: int = 0
    topic_policy_namespaces: int = 0
    topic_policy_calls: int = 0

    @property
    def idle_cursors(self) -> int:
        """The cursors found idle (a candidate, idle, or idle outside the repair's scope): not those the step could
        not judge (`unknown`) nor those Pulsar protects (compaction, replication: `protected`). The sweep's line
        and table agree."""
        return sum(n for status, n in self.cursors.items() if status not in ("unknown", "protected"))


@dataclass
class RetentionDebtResult:
    run_id: str
    counts: RetentionDebtCounts
    duration_s: float
    report: list[dict[str, Any]]  # reclaimable bytes by cause, per tenant/namespace, largest first


def _union(frames: dict[str, DataFrame]) -> DataFrame:
    nulls = {c: F.lit(None).cast(LongType()) for c in "abcdef"}

    def shaped(df: DataFrame, kind: int, **cols: Any) -> DataFrame:
        spec = {"managed_ledger": F.col("managed_ledger"), "kind": F.lit(kind), "name": F.lit(None).cast(StringType()),
                "tenant": F.lit(None).cast(StringType()), "namespace": F.lit(None).cast(StringType()),
                "topic_name": F.lit(None).cast(StringType()), "shadow": F.lit(None).cast(BooleanType()),
                **nulls, "g": F.lit(None).cast(BooleanType()), "h": F.lit(None).cast(BooleanType()), **cols}
        return df.select(*[spec[f.name].cast(f.dataType).alias(f.name) for f in UNION.fields])

    mls = shaped(frames["managed_ledgers"], _ML, name=F.col("topic"), tenant=F.col("tenant"),
                 namespace=F.col("namespace"), topic_name=F.col("topic_name"),
                 shadow=F.col("shadow_source").isNotNull(), a=F.col("zk_mtime_ms"), b=F.col("zk_version"))
    cursors = shaped(frames["ml_cursors"], _CURSOR, name=F.col("cursor"), a=F.col("cursors_ledger_id"),
                     b=F.col("mark_delete_ledger_id"), c=F.col("mark_delete_entry_id"), d=F.col("zk_mtime_ms"),
                     e=F.col("last_active_ms"), f=F.col("zk_version"), h=_replicated(F.col("long_properties")))
    ledgers = shaped(frames["ml_ledgers"], _LEDGER, a=F.col("ledger_id"), b=F.col("entries"), c=F.col("size"),
                     d=F.col("timestamp_ms"), g=F.col("offloaded"))
    return mls.unionByName(cursors).unionByName(ledgers)


def _replicated(long_properties: Any) -> Any:
    """A cursor's replicated-subscription flag from its `long_properties` map (no entry: not replicated)."""
    return F.coalesce(F.try_element_at(long_properties, F.lit(REPLICATED_SUBSCRIPTION_PROPERTY)) == 1, F.lit(False))


def _replicated_arrow(long_properties: pa.ChunkedArray) -> pa.ChunkedArray:
    """`_replicated` over an Arrow map column, for the driver's pass."""
    value = pc.map_lookup(long_properties, pa.scalar(REPLICATED_SUBSCRIPTION_PROPERTY), "first")
    return pc.fill_null(pc.equal(value, 1), False)


@dataclass(frozen=True)
class _Topics:
    """The run's managed ledgers, cursors and per-topic ledger-list facts as the driver needs them, read once."""

    managed_ledgers: pa.Table  # managed_ledger, tenant, namespace, topic, ledger_count
    cursors: pa.Table  # managed_ledger, cursor, cursors_ledger_id, mark-delete, zk_mtime_ms, last_active_ms
    lists: pa.Table  # managed_ledger, ledger_id_min, ledger_id_max, ledger_id_count, size_sum: per ledger list
    firsts: pa.Table  # managed_ledger, ledger_id, entries, size, timestamp_ms: each list's first entry
    captured_at: datetime | None  # the snapshot's capture time


def _read_topics(store: TableStore, run_id: str) -> _Topics:
    """What `retention.may_owe` needs of every topic, without a topic's rows brought together: the ledger lists
    only as aggregates (grouped by the table engine) and their first entries, the cursors as they are."""
    mls = _run_table(store, "managed_ledgers", run_id,
                     ["managed_ledger", "tenant", "namespace", "topic", "ledger_count", "captured_at"])
    cursors = _run_table(store, "ml_cursors", run_id,
                         ["managed_ledger", "cursor", "cursors_ledger_id", "mark_delete_ledger_id",
                          "mark_delete_entry_id", "zk_mtime_ms", "last_active_ms"])
    aggregates = [("ledger_id", "min"), ("ledger_id", "max"), ("ledger_id", "count"), ("size", "sum")]
    if store.exists("ml_ledgers"):
        lists = store.aggregate_arrow("ml_ledgers", ["managed_ledger"], aggregates, {"run_id": run_id})
    else:  # a store written before the table existed: no lists
        lists = pa.table({"managed_ledger": pa.array([], pa.string()),
                          **{f"{column}_{fn}": pa.array([], pa.int64()) for column, fn in aggregates}})
    firsts = _run_table(store, "ml_ledgers", run_id, ["managed_ledger", "ledger_id", "entries", "size", "timestamp_ms"],
                        {"position": 0})
    return _Topics(mls.drop_columns(["captured_at"]), cursors, lists, firsts, pc.max(mls["captured_at"]).as_py())


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


def _judge(batches: Iterator[pa.RecordBatch], ctx: _Context) -> Iterator[dict[str, Any]]:
    """The debt rows of the managed ledgers in `batches` (`UNION` rows, sorted by managed ledger, kind, `a`),
    every column of `retention_debt` present (None where a kind of row has none)."""
    blank = dict.fromkeys(RETENTION_DEBT.fieldNames())
    group: list[tuple[Any, ...]] = []
    key = None
    for batch in batches:
        columns = [batch.column(f.name).to_pylist() for f in UNION.fields]
        for row in zip(*columns, strict=True):
            if row[0] != key:
                if group:
                    yield from ({**blank, **r} for r in _topic_rows(group, ctx))
                key, group = row[0], []
            group.append(row)
    if group:
        yield from ({**blank, **r} for r in _topic_rows(group, ctx))


def _assess_partition(batches: Iterator[pa.RecordBatch], ctx: _Context) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the Spark pass: `_judge` in the tasks, rows back as Arrow."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(RETENTION_DEBT, timezone="UTC")
    out: list[dict[str, Any]] = []
    for row in _judge(batches, ctx):
        out.append(row)
        if len(out) >= 5000:
            yield pa.RecordBatch.from_pylist(out, schema=schema)
            out = []
    if out:
        yield pa.RecordBatch.from_pylist(out, schema=schema)


def _topic_rows(group: list[tuple[Any, ...]], ctx: _Context) -> list[dict[str, Any]]:
    """The debt rows of one managed ledger (rows sorted: itself, its cursors, its ledgers by id)."""
    head = group[0]
    if head[1] != _ML:
        return []  # cursors or ledgers without a decodable managed ledger: quarantined, reported there
    managed_ledger, _, local, tenant, namespace, topic_name, shadow = head[:7]
    ml_mtime, ml_version = head[7] or 0, head[8]
    if shadow:
        return []  # a shadow topic lists its source's ledgers; the source's retention frees them
    cursors, ledgers = [], []
    for row in group[1:]:
        if row[1] == _CURSOR:
            cursors.append((Cursor(row[2], Position(row[8] if row[8] is not None else -1,
                                                    row[9] if row[9] is not None else -1),
                                   row[7] if row[7] is not None else -1, row[10] or 0, row[11] or 0,
                                   replicated=bool(row[14])), row[12]))
        elif row[1] == _LEDGER:
            ledgers.append(Ledger(row[7], row[8] or 0, row[9] or 0, row[10] or 0, bool(row[13])))
    ns_key = f"{tenant}/{namespace}"
    policy, reason, detail = ctx.policies.get(ns_key, (None, DebtReason.POLICY_MISSING,
                                                       "no namespace policies in the configuration store"))
    topic_policy = NOT_USED if ctx.settings.topic_policies == "none" else RULED_OUT
    if managed_ledger in ctx.quarantined:
        policy, reason, detail = (None, DebtReason.METADATA_QUARANTINED,
                                  "its metadata (or a cursor's) could not be decoded")
    settings = ctx.settings
    system = is_system_topic(ns_key, local or "")
    protected = topic_protection(ns_key, local or "", settings.protection)
    owned = bundle_owned(topic_name, ctx.owned.get(ns_key, ())) if ctx.ownership_readable else None
    facts = TopicFacts(tuple(ledgers), tuple(c for c, _ in cursors), ml_mtime, policy, reason, detail, owned, system,
                       settings.protection)
    debt = assess_topic(facts, settings.broker, ctx.now_ms, settings.report_idle_ms)
    in_scope = settings.scope.permits(tenant, namespace)
    status = topic_status(debt, in_scope, protected)
    if debt.status is TopicStatus.NONE and not debt.cursors:
        return []
    captured_at = datetime.fromtimestamp(ctx.now_ms / 1000, UTC)
    base = {"run_id": ctx.run_id, "captured_at": captured_at, "tenant": tenant, "namespace": namespace,
            "topic": local, "topic_name": topic_name, "managed_ledger": managed_ledger,
            "policy_source": policy.source if policy else None,
            "retention_minutes": policy.retention_minutes if policy else None,
            "retention_size_mb": policy.retention_size_mb if policy else None,
            "ttl_seconds": policy.ttl_seconds if policy else None, "system_topic": system,
            # A protected row is never acted on, so whether a topic-level policy overrides the namespace's is
            # not asked (`mark_topic_policies_unchecked` leaves it alone): no broker call for Pulsar's own topics.
            "topic_policy": NOT_USED if protected else topic_policy}
    detail = debt.detail
    if debt.cursors and debt.status is TopicStatus.NONE:
        detail = (f"nothing past retention nobody trims; {len(debt.cursors)} idle cursor(s) pin "
                  f"{debt.idle_pinned.bytes:,} bytes")
    if protected is not None:
        detail = f"protected, never loaded nor trimmed by the repair: {_describe(protected)}; {detail}"
    rows = [{**base, "kind": TOPIC, "status": status.value, "reason": protected or debt.reason.value,
             "detail": detail,
             "ledgers": len(ledgers), "total_bytes": sum(x.size for x in ledgers),
             "reclaimable_ledgers": len(debt.trim.ledgers), "reclaimable_bytes": debt.trim.bytes,
             "reclaimable_offloaded_bytes": sum(x.size for x in debt.trim.ledgers if x.offloaded),
             "ledger_ids": [x.ledger_id for x in debt.trim.ledgers],
             "eligible_since_ms": debt.eligible_since_ms, "unloaded_evidence": debt.unloaded_evidence,
             "bundle_owned": owned, "idle_cursors": len(debt.cursors), "idle_pinned_bytes": debt.idle_pinned.bytes,
             "zk_mtime_ms": ml_mtime, "zk_version": ml_version}]
    versions = {c.name: version for c, version in cursors}
    for c in debt.cursors:
        cstatus = cursor_status(c, debt.status, settings.delete_after_ms, in_scope, protected)
        why_protected = c.protected or protected
        lag = " (ZooKeeper's position may lag an active cursor ledger: it may pin less)" if c.position_may_lag else ""
        why = {CursorStatus.CANDIDATE: "idle past [retention] cursor_idle_days: its subscription would be deleted",
               CursorStatus.IDLE: "idle: reported only (subscription deletion is off or not yet due)",
               CursorStatus.PROTECTED: f"protected, never deleted: {_describe(why_protected or '')}",
               CursorStatus.OUT_OF_SCOPE: "idle, outside the repair allow-list",
               CursorStatus.UNKNOWN: f"idle, on a topic that cannot be judged ({debt.reason.value})"}[cstatus]
        rows.append({**base, "kind": CURSOR, "cursor": c.name, "status": cstatus.value,
                     "topic_policy": NOT_USED if why_protected else base["topic_policy"],
                     "reason": why_protected or DebtReason.IDLE_CURSOR.value,
                     "detail": f"{why}; pins {c.pinned.bytes:,} bytes alone{lag}",
                     "reclaimable_ledgers": len(c.pinned.ledgers), "reclaimable_bytes": c.pinned.bytes,
                     "reclaimable_offloaded_bytes": sum(x.size for x in c.pinned.ledgers if x.offloaded),
                     "ledger_ids": [x.ledger_id for x in c.pinned.ledgers],
                     "idle_ms": c.idle_ms, "last_possible_ack_ms": last_possible_ack_ms(c.cursor, settings.broker),
                     "last_active_ms": c.cursor.last_active_ms or None, "position_may_lag": c.position_may_lag,
                     "mark_delete_ledger_id": c.cursor.mark_delete.ledger_id,
                     "mark_delete_entry_id": c.cursor.mark_delete.entry_id, "cursor_ledger_id": c.cursor.cursor_ledger,
                     "bundle_owned": owned, "zk_mtime_ms": c.cursor.zk_mtime_ms, "zk_version": versions.get(c.name)})
    return rows


def _describe(reason: str | None) -> str:
    """A protection reason in words (`sweeper.rules.protection.describe`, or retention's wider `system_topic`)."""
    try:
        return describe(Protected(reason))
    except ValueError:
        return "a system topic (a `__` name, or a `pulsar/*` namespace)"


def finalize_topic_policies(rows: list[dict[str, Any]], lookup: Callable[[str], tuple[str, str]] | None) -> int:
    """Rows judged under their namespace's policy while a topic-level one could not be ruled out: kept when the
    broker says the topic sets no retention or TTL of its own, else `unknown` (never "expired"). The broker is
    asked (`lookup`, [retention] topic_policies = "admin") only about topics whose bundle a live broker owns:
    for them the lookup behind the call acquires nothing and loads no topic. Returns the calls made."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("topic_policy") == UNCHECKED:
            groups.setdefault(r["managed_ledger"], []).append(r)
    calls = 0
    for group in groups.values():
        topic = next(r for r in group if r["kind"] == TOPIC)
        verdict, detail = UNREAD, (f"{topic['tenant']}/{topic['namespace']}/{CHANGE_EVENTS} may hold topic-level "
                                   "policies that override the namespace's")
        if lookup is not None:
            if topic["bundle_owned"] is True:
                calls += 1
                verdict, detail = lookup(topic["topic_name"])
            else:
                detail += ("; not asked: no live broker owns its bundle, and asking would make one acquire it "
                           "(loading its topics)")
        for r in group:
            r["topic_policy"] = verdict
            if verdict != NOT_SET:
                why = DebtReason.TOPIC_POLICY_SET if verdict == SET else DebtReason.TOPIC_POLICY_MAY_EXIST
                _make_unknown(r, why, detail)
    return calls


def _make_unknown(r: dict[str, Any], reason: DebtReason, detail: str) -> None:
    r.update(status=TopicStatus.UNKNOWN.value if r["kind"] == TOPIC else CursorStatus.UNKNOWN.value,
             detail=detail if r["kind"] == TOPIC else f"idle, on a topic that cannot be judged ({reason.value})",
             reclaimable_ledgers=0, reclaimable_bytes=0, reclaimable_offloaded_bytes=0, ledger_ids=[],
             policy_source=None, retention_minutes=None, retention_size_mb=None, ttl_seconds=None)
    if r["kind"] == TOPIC:
        r.update(reason=reason.value, eligible_since_ms=None, unloaded_evidence=None, idle_pinned_bytes=0)


def mark_topic_policies_unchecked(rows: list[dict[str, Any]], namespaces: frozenset[str]) -> None:
    """Rows judged under their namespace's policy in a namespace whose `__change_events` may hold topic-level
    policies: `finalize_topic_policies` decides them. Rows without a policy (unknown) stay as they are."""
    for r in rows:
        if r["status"] == CursorStatus.PROTECTED.value:
            continue  # never acted on: what overrides its policy changes nothing, and asking would be a call
        if (r["topic_policy"] == RULED_OUT and r["policy_source"] is not None
                and f"{r['tenant']}/{r['namespace']}" in namespaces):
            r["topic_policy"] = UNCHECKED


def _run_table(store: TableStore, name: str, run_id: str, columns: list[str],
               where: dict[str, Any] | None = None) -> pa.Table:
    """A run's rows of `name`, read on the driver (none when the table does not exist: a store written before
    it was added)."""
    if not store.exists(name):
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(ALL_TABLES[name], timezone="UTC").empty_table().select(columns)
    return store.read_arrow(name, {"run_id": run_id, **(where or {})}, columns)


def _run_columns(store: TableStore, name: str, run_id: str, columns: list[str],
                 where: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """`_run_table` as Python lists per column."""
    table = _run_table(store, name, run_id, columns, where)
    return {c: table.column(c).to_pylist() for c in columns}


def _policies(store: TableStore, run_id: str, settings: RetentionSettings) -> dict[
        str, tuple[Policy | None, DebtReason | None, str]]:
    columns = ["namespace", "readable", "error", "retention_minutes", "retention_size_mb", "ttl_seconds", "deleted"]
    read = _run_columns(store, "namespace_policies", run_id, columns)
    policies = {}
    for namespace, readable, error, minutes, size_mb, ttl, deleted in zip(*read.values(), strict=True):
        policies[namespace] = effective_policy(NamespacePolicy(readable, error, minutes, size_mb, ttl, bool(deleted)),
                                               settings.broker)
    return policies


def _owned_bundles(store: TableStore, run_id: str) -> tuple[dict[str, tuple[tuple[int, int], ...]], bool]:
    read = _run_columns(store, "bundle_owners", run_id, ["namespace", "lower", "upper"], {"ephemeral": True})
    owned: dict[str, list[tuple[int, int]]] = {}
    for namespace, lower, upper in zip(*read.values(), strict=True):
        owned.setdefault(namespace, []).append((lower, upper))
    return {ns: tuple(v) for ns, v in owned.items()}, bool(owned)


def _quarantined_owners(store: TableStore, run_id: str) -> frozenset[str]:
    read = _run_columns(store, "quarantine", run_id, ["owner"], {"source": ["managed_ledger", "cursor"]})
    return frozenset(owner for owner in read["owner"] if owner is not None)


@dataclass(frozen=True)
class _ChangeEvents:
    """Each namespace's `__change_events` partitions as listed: enough to rule topic-level policies out."""

    namespace_of: dict[str, str]  # managed ledger -> tenant/namespace
    listed: list[tuple[str, int, int]]  # (managed ledger, entries, ledger id)
    compacted: frozenset[str]  # managed ledgers with a `__compaction` cursor

    def bookkeeper_ids(self) -> set[int]:
        return {ledger_id for _, _, ledger_id in self.listed}

    def namespaces_that_may_hold_policies(self, bookkeeper: dict[int, tuple[str | None, int | None, int | None]]
                                          ) -> frozenset[str]:
        by_ml: dict[str, list[tuple[int, int, str | None, int | None]]] = {}
        for managed_ledger, entries, ledger_id in self.listed:
            state, last_entry_id, _ = bookkeeper.get(ledger_id, (None, None, None))
            by_ml.setdefault(managed_ledger, []).append((entries, ledger_id, state, last_entry_id))
        return frozenset(ns for managed_ledger, ns in self.namespace_of.items()
                         if change_events_may_hold_policies(by_ml.get(managed_ledger, []),
                                                            managed_ledger in self.compacted))


def _change_events(store: TableStore, run_id: str, topics: _Topics, settings: RetentionSettings) -> _ChangeEvents:
    if settings.topic_policies not in ("system_topic", "admin"):  # "admin" asks the broker only about these
        return _ChangeEvents({}, [], frozenset())
    mls = topics.managed_ledgers
    topic = mls["topic"]
    events = mls.filter(pc.fill_null(pc.or_(pc.equal(topic, CHANGE_EVENTS),
                                            pc.starts_with(topic, f"{CHANGE_EVENTS}-partition-")), False))
    namespace_of = {managed_ledger: f"{tenant}/{namespace}" for managed_ledger, tenant, namespace in zip(
        *(events[c].to_pylist() for c in ("managed_ledger", "tenant", "namespace")), strict=True)}
    if not namespace_of:
        return _ChangeEvents({}, [], frozenset())
    # A handful of `__change_events` topics: their ledgers and cursors are picked out of the big tables by name.
    ledgers = _run_columns(store, "ml_ledgers", run_id, ["managed_ledger", "entries", "ledger_id"],
                           {"managed_ledger": list(namespace_of)})
    listed = [(managed_ledger, entries or 0, ledger_id) for managed_ledger, entries, ledger_id
              in zip(*ledgers.values(), strict=True) if ledger_id is not None]
    compacted = _run_columns(store, "ml_cursors", run_id, ["managed_ledger"],
                             {"managed_ledger": list(namespace_of), "cursor": COMPACTION_CURSOR})
    return _ChangeEvents(namespace_of, listed, frozenset(compacted["managed_ledger"]))


def _bookkeeper_facts(store: TableStore, run_id: str, ids: set[int]) -> dict[int, tuple[str | None, int | None,
                                                                                         int | None]]:
    """(state, last entry id, length) of a few ledgers."""
    if not ids:
        return {}
    read = _run_columns(store, "bk_ledgers", run_id, ["ledger_id", "state", "last_entry_id", "length"],
                        {"ledger_id": sorted(ids)})
    return {ledger_id: (state, last_entry_id, length)
            for ledger_id, state, last_entry_id, length in zip(*read.values(), strict=True)}


def _with_cursor_ledger_bytes(rows: list[dict[str, Any]],
                              bookkeeper: dict[int, tuple[str | None, int | None, int | None]]) -> None:
    """The idle cursors' own cursor ledgers, as long as BookKeeper records them (0 while open)."""
    for r in rows:
        if r["kind"] == CURSOR and r.get("cursor_ledger_id") in bookkeeper:
            r["cursor_ledger_bytes"] = bookkeeper[r["cursor_ledger_id"]][2]


OrphanTotals = dict[tuple[str | None, str | None], tuple[int, int]]


def orphan_totals(store: TableStore, run_id: str) -> OrphanTotals:
    """(candidate ledgers, their bytes) per (tenant, namespace) of a run's orphans."""
    read = _run_columns(store, "orphans", run_id, ["tenant", "namespace", "size_bytes"], {"status": "candidate"})
    totals: dict[tuple[str | None, str | None], tuple[int, int]] = {}
    for tenant, namespace, size in zip(*read.values(), strict=True):
        count, total = totals.get((tenant, namespace), (0, 0))
        totals[(tenant, namespace)] = (count + 1, total + (size or 0))
    return totals


def reclaimable_report(rows: list[dict[str, Any]], orphans: OrphanTotals, run_id: str) -> list[dict[str, Any]]:
    """Bytes by cause per tenant/namespace: orphan candidates, expired-but-unloaded, pinned by idle cursors
    (what they pin together, plus their own cursor ledgers), and what loaded brokers should trim soon."""
    report: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(tenant: str | None, namespace: str | None) -> dict[str, Any]:
        key = (tenant or "(unknown)", namespace or "(unknown)")
        if key not in report:
            report[key] = {"run_id": run_id, "tenant": key[0], "namespace": key[1], "orphan_bytes": 0,
                           "orphan_ledgers": 0, "expired_unloaded_bytes": 0, "expired_unloaded_topics": 0,
                           "idle_cursor_bytes": 0, "idle_cursors": 0, "awaiting_broker_bytes": 0, "unknown_topics": 0}
        return report[key]

    for (tenant, namespace), (count, size) in orphans.items():
        e = entry(tenant, namespace)
        e["orphan_ledgers"], e["orphan_bytes"] = count, size
    for r in rows:
        e = entry(r["tenant"], r["namespace"])
        if r["kind"] == TOPIC:
            if r["reason"] == DebtReason.EXPIRED_UNLOADED.value:
                e["expired_unloaded_bytes"] += r["reclaimable_bytes"] or 0
                e["expired_unloaded_topics"] += 1
            elif r["status"] == TopicStatus.AWAITING_BROKER.value:
                e["awaiting_broker_bytes"] += r["reclaimable_bytes"] or 0
            elif r["status"] == TopicStatus.UNKNOWN.value:
                e["unknown_topics"] += 1
            e["idle_cursor_bytes"] += r["idle_pinned_bytes"] or 0
        else:
            e["idle_cursors"] += 1
            e["idle_cursor_bytes"] += r.get("cursor_ledger_bytes") or 0
    out = list(report.values())
    for e in out:
        e["total_bytes"] = e["orphan_bytes"] + e["expired_unloaded_bytes"] + e["idle_cursor_bytes"]
    return sorted(out, key=lambda e: (-e["total_bytes"], e["tenant"], e["namespace"]))


def _refuse_unless_ready(store: TableStore, run_id: str) -> None:
    runs.require(store, run_id, "snapshot", RetentionDebtRefused, f"no successful snapshot for run {run_id}")
    if _run_columns(store, "retention_debt", run_id, ["run_id"])["run_id"]:
        raise RetentionDebtRefused(f"run {run_id} already has its retention debt: start a new run")


def _assess(spark: SparkSession, store: TableStore, run_id: str, selection: _Selection,
            ctx: _Context) -> list[dict[str, Any]]:
    """The per-topic pass: on the driver when the selected topics are few, else one Spark shuffle by managed
    ledger with the pure rules in the tasks. Both feed `_judge` the same rows in the same order."""
    if selection.rows <= ctx.settings.driver_assess_max_rows:
        batches = _union_arrow(store, run_id, selection.assess).to_batches()
        return list(_judge(iter(batches), ctx))
    frames = _worth_assessing(spark, store.run_frames(SNAPSHOT_TABLES, run_id), selection)
    parallelism = spark.sparkContext.defaultParallelism
    union = _union(frames).repartition(
        max(2, 2 * parallelism), "managed_ledger").sortWithinPartitions("managed_ledger", "kind", "a")
    return union.mapInArrow(lambda b: _assess_partition(b, ctx), RETENTION_DEBT).toArrow().to_pylist()


def _union_arrow(store: TableStore, run_id: str, managed_ledgers: list[str] | None) -> pa.Table:
    """`_union` of the selected managed ledgers, read on the driver and sorted as the Spark pass sorts it
    (Spark puts nulls first)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(UNION)
    where = {} if managed_ledgers is None else {"managed_ledger": managed_ledgers}

    def shaped(table: str, kind: int, **sources: str) -> pa.Table:
        read = _run_table(store, table, run_id, ["managed_ledger", *sources.values()], where)
        arrays = []
        for f in schema:
            if f.name == "managed_ledger":
                arrays.append(read["managed_ledger"])
            elif f.name == "kind":
                arrays.append(pa.nulls(read.num_rows, f.type).fill_null(kind))
            elif f.name == "shadow" and "shadow" in sources:
                arrays.append(pc.is_valid(read[sources["shadow"]]))
            elif f.name == "h" and "h" in sources:
                arrays.append(_replicated_arrow(read[sources["h"]]))
            elif f.name in sources:
                arrays.append(read[sources[f.name]].cast(f.type))
            else:
                arrays.append(pa.nulls(read.num_rows, f.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    union = pa.concat_tables([
        shaped("managed_ledgers", _ML, name="topic", tenant="tenant", namespace="namespace", topic_name="topic_name",
               shadow="shadow_source", a="zk_mtime_ms", b="zk_version"),
        shaped("ml_cursors", _CURSOR, name="cursor", a="cursors_ledger_id", b="mark_delete_ledger_id",
               c="mark_delete_entry_id", d="zk_mtime_ms", e="last_active_ms", f="zk_version", h="long_properties"),
        shaped("ml_ledgers", _LEDGER, a="ledger_id", b="entries", c="size", d="timestamp_ms", g="offloaded"),
    ])
    return union.sort_by([(column, "ascending", "at_start") for column in ("managed_ledger", "kind", "a")])


def run_retention_debt(spark: SparkSession, store: TableStore, run_id: str,
                       settings: RetentionSettings | None = None, now_ms: int | None = None,
                       topic_policy_lookup: Callable[[str], tuple[str, str]] | None = None) -> RetentionDebtResult:
    """`topic_policy_lookup` (topic name -> (not_set | set | unread, detail)): the broker's answer about a topic's
    own policies, for [retention] topic_policies = "admin".

    Apart from the per-topic pass, the step is a handful of small reads; on the delta-rs engine they read the
    tables directly, on the others each is a Spark job, so the independent ones run side by side.
    """
    settings = settings or RetentionSettings()
    started = time.monotonic()
    _refuse_unless_ready(store, run_id)  # nothing else is read, or written, before the refusals are known
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="retention-debt") as pool:
        topics = pool.submit(_read_topics, store, run_id)
        policies = pool.submit(_policies, store, run_id, settings)
        owned = pool.submit(_owned_bundles, store, run_id)
        quarantined = pool.submit(_quarantined_owners, store, run_id)
        orphans = pool.submit(orphan_totals, store, run_id)
        captured = topics.result().captured_at
        if now_ms is None:
            now_ms = int(captured.timestamp() * 1000) if captured else int(time.time() * 1000)
        bundles, readable = owned.result()
        ctx = _Context(run_id, now_ms, settings, policies.result(), bundles, readable, quarantined.result())
        selection = _select(topics.result(), ctx)
        events = _change_events(store, run_id, topics.result(), settings)
        # BookKeeper's view of the few ledgers the driver needs (change events; cursor ledgers of cursors that
        # may be idle), read while the topics are judged.
        bookkeeper = pool.submit(_bookkeeper_facts, store, run_id, events.bookkeeper_ids() | selection.cursor_ledgers)
        rows = _assess(spark, store, run_id, selection, ctx)
        may_hold = events.namespaces_that_may_hold_policies(bookkeeper.result())
        totals = orphans.result()
    mark_topic_policies_unchecked(rows, may_hold)
    calls = finalize_topic_policies(rows, topic_policy_lookup if settings.topic_policies == "admin" else None)
    _with_cursor_ledger_bytes(rows, bookkeeper.result())
    meta = {"run_id": run_id, "stage": "retention_debt"}
    store.append_rows("retention_debt", rows, RETENTION_DEBT, commit_metadata=meta)
    report = reclaimable_report(rows, totals, run_id)
    store.append_rows("reclaimable_report", report, RECLAIMABLE_REPORT, commit_metadata=meta)
    judged = topics.result().managed_ledgers.num_rows if selection.assess is None else len(selection.assess)
    counts: dict[str, int] = {"ownership_readable": int(readable), "topic_policy_namespaces": len(may_hold),
                              "topic_policy_calls": calls, "topics_judged": judged}
    for r in rows:
        key = f"{r['kind']}.{r['status']}"
        counts[key] = counts.get(key, 0) + 1
    for cause in ("orphan_bytes", "expired_unloaded_bytes", "idle_cursor_bytes", "awaiting_broker_bytes"):
        counts[f"bytes.{cause.removesuffix('_bytes')}"] = sum(e[cause] for e in report)
    return RetentionDebtResult(run_id, RetentionDebtCounts.from_row(counts), time.monotonic() - started, report)
