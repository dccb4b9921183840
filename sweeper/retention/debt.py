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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql import SparkSession

from sweeper import runs
from sweeper.retention.debt_reads import (
    OrphanTotals,
    _bookkeeper_facts,
    _change_events,
    _owned_bundles,
    _policies,
    _quarantined_owners,
    _read_topics,
    _run_columns,
    orphan_totals,
)
from sweeper.retention.debt_rows import _assess_partition, _judge, _union, _union_arrow
from sweeper.retention.debt_select import _select, _Selection, _worth_assessing
from sweeper.retention.debt_types import (
    CURSOR,
    TOPIC,
    RetentionDebtCounts,
    RetentionDebtResult,
    RetentionSettings,
    _Context,
)
from sweeper.retention.errors import RetentionDebtRefused
from sweeper.rules.retention import CursorStatus, DebtReason, TopicStatus
from sweeper.table_schemas import RECLAIMABLE_REPORT, RETENTION_DEBT, SNAPSHOT_TABLES
from sweeper.tables import TableStore
from sweeper.vocabulary import CHANGE_EVENTS, NOT_SET, RULED_OUT, SET, UNCHECKED, UNREAD


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


def _with_cursor_ledger_bytes(rows: list[dict[str, Any]],
                              bookkeeper: dict[int, tuple[str | None, int | None, int | None]]) -> None:
    """The idle cursors' own cursor ledgers, as long as BookKeeper records them (0 while open)."""
    for r in rows:
        if r["kind"] == CURSOR and r.get("cursor_ledger_id") in bookkeeper:
            r["cursor_ledger_bytes"] = bookkeeper[r["cursor_ledger_id"]][2]


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
