"""The retention-debt step's per-topic rows (sweeper.retention.debt): a managed ledger's ledger list, cursors and
znode times brought together (one `UNION` frame, by Spark or read on the driver), the pure rules applied, and the
`retention_debt` rows made. `_assess_partition` is the Spark pass's mapInArrow body."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

from sweeper.retention.debt_reads import _run_table
from sweeper.retention.debt_types import CURSOR, TOPIC, _Context
from sweeper.rules.protection import REPLICATED_SUBSCRIPTION_PROPERTY, Protected, describe
from sweeper.rules.retention import (
    Cursor,
    CursorStatus,
    DebtReason,
    Ledger,
    Position,
    TopicFacts,
    TopicStatus,
    assess_topic,
    bundle_owned,
    cursor_status,
    is_system_topic,
    last_possible_ack_ms,
    topic_protection,
    topic_status,
)
from sweeper.table_schemas import RETENTION_DEBT
from sweeper.tables import TableStore
from sweeper.vocabulary import NOT_USED, RULED_OUT

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
