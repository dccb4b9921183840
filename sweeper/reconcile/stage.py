"""The reconcile action: anti-join a snapshot into orphans, with reasons, gates and a report.

Spark does the set work (which ledger ids nothing references, which owners exist); the verdict
for each unreferenced ledger comes from `sweeper.rules.classify`, a pure function; the safety rules
from `sweeper.rules.safety`. One run's snapshot in, one run's `orphans` and `orphan_report` out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sweeper import runs
from sweeper.config import SweeperConfig
from sweeper.reconcile.errors import ReconcileRefused
from sweeper.reconcile.frames import _facts_frame, _object_facts_frame, snapshot_frames
from sweeper.reconcile.report import build_report, orphan_tally
from sweeper.rules.classify import (
    CompactionPointer,
    LedgerFacts,
    ObjectFacts,
    Sharing,
    Verdict,
    classify,
    classify_object,
)
from sweeper.rules.owner import Owner, owner_scope, protection_of
from sweeper.rules.protection import NONE as NO_EXTRA_PROTECTION
from sweeper.rules.protection import Protection
from sweeper.rules.references import PEER_NAMESPACE, PEER_READ, PEER_REFERENCE, PEER_UNREAD
from sweeper.rules.references import references as references
from sweeper.rules.references import released_from_bookkeeper as released_from_bookkeeper
from sweeper.rules.safety import CircuitBreaker, GracePeriod, Scope, offload_in_flight
from sweeper.scan.pulsar import COMPACTED, COMPACTED_LAGGING, COMPACTED_UNREADABLE, COMPACTED_UNRECORDED
from sweeper.table_schemas import ORPHAN_REPORT, ORPHANS, PENDING_DELETE_STATUS
from sweeper.tables import TableStore
from sweeper.vocabulary import CANDIDATE, HOUR_MS

# Orphan row statuses: only `candidate` may ever be emitted or deleted.
YOUNG = "young"
OUT_OF_SCOPE = "out_of_scope"
UNKNOWN = "unknown"
MISSING = "missing"
STALE_POINTER = "stale_pointer"  # named only by a compaction pointer ZooKeeper may hold stale: not lost data
OTHER_CLUSTER = "other_cluster"  # another Pulsar cluster's data: an offloaded object, a peer's ledger
PROTECTED = "protected"  # Pulsar (or the operator) protects its owner: sweeper.rules.protection


@dataclass(frozen=True)
class SafetySettings:
    grace: GracePeriod = field(default_factory=GracePeriod)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    scope: Scope = field(default_factory=Scope)
    local_cluster: str = ""  # [pulsar] cluster_name: offloaded objects of other clusters are never candidates
    bookkeeper_dedicated: bool = False  # [safety] bookkeeper_dedicated
    peer_metadata: tuple[str, ...] = ()  # [safety] peer_metadata: every other cluster writing to these bookies
    protection: Protection = NO_EXTRA_PROTECTION  # [retention] protected_subscriptions / protected_topics
    ledgers_root: str = "/ledgers"  # named when the missing-reference gate refuses
    max_missing_reference_fraction: float = 1.0  # [gates]; 1.0: off (the CLI passes the configured value)
    missing_reference_allowance: int = 10

    @classmethod
    def from_config(cls, config: SweeperConfig) -> SafetySettings:
        """The rules of `config`, narrowed once; the delete re-applies the same ones (delete.stage.acting_rules)."""
        return cls(
            grace=GracePeriod.of(int(config.safety.min_age_hours * HOUR_MS), force=config.safety.force_min_age),
            breaker=CircuitBreaker(config.safety.max_orphan_fraction),
            scope=Scope.of(config.safety.allow, config.safety.deny),
            local_cluster=config.pulsar.cluster_name,
            bookkeeper_dedicated=config.safety.bookkeeper_dedicated,
            peer_metadata=config.safety.peer_metadata,
            protection=Protection.of(config.retention.protected_subscriptions, config.retention.protected_topics),
            ledgers_root=config.bookkeeper.ledgers_root,
            max_missing_reference_fraction=config.gates.max_missing_reference_fraction,
            missing_reference_allowance=config.gates.missing_reference_allowance,
        )


_ORPHAN_STATUSES = (CANDIDATE, YOUNG, OUT_OF_SCOPE, UNKNOWN, MISSING, STALE_POINTER, OTHER_CLUSTER, PROTECTED)


@dataclass(frozen=True)
class ReconcileCounts(runs.StageCounts):
    """Orphan rows by status (ledgers and offloaded objects together), the same split by object type, the
    candidates by reason, the pending deletes by state, and the totals the gates and breakers weighed."""

    candidate: int = 0
    young: int = 0
    out_of_scope: int = 0
    unknown: int = 0
    missing: int = 0
    stale_pointer: int = 0
    other_cluster: int = 0
    protected: int = 0
    by_status_and_type: Mapping[str, int] = runs.breakdown(*(f"{s}." for s in _ORPHAN_STATUSES), whole_keys=True)
    by_reason: Mapping[str, int] = runs.breakdown("reason.")
    pending_deletes: Mapping[str, int] = runs.breakdown("pending_delete.")  # stuck, in_use, done
    pulsar_ledgers: int = 0
    non_pulsar_ledgers: int = 0
    referenced_ledgers: int = 0
    offload_objects: int = 0
    shared_bookkeeper_unverified: int = 0
    peer_clusters_read: int = 0
    live_brokers_required: int = runs.count("gate.live_brokers_required")  # set by the stage's gates
    # 1 when the data-quality gates ran and passed (0: --skip-gates): what emit, delete and the next run's shrink
    # gate ask of this row (runs.gates_passed).
    gates_passed: int = runs.count(runs.GATES_PASSED)
    # The gates' own time, before the stage's (its duration_s is the anti-joins' alone), and where they ran
    # (1: on the driver, 0: as Spark jobs, above [gates] driver_rows): at a million ledgers the gates are most of it.
    gates_ms: int = runs.count("gate.ms")
    gates_on_driver: int = runs.count("gate.on_driver")
    # The limit that chose (see sweeper.reconcile.gates.driver_row_limit).
    gates_driver_rows: int = runs.count("gate.driver_rows")


@dataclass
class ReconcileResult:
    run_id: str
    counts: ReconcileCounts
    duration_s: float
    report: list[dict[str, Any]]
    sharing: str = ""  # whether every cluster writing to the bookies was read, in one line


def compaction_pointer(kind: str | None, zk_ledger: int | None) -> CompactionPointer | None:
    """The `__compaction` cursor's state from its `cursor_ledger_refs` row (None: no such cursor)."""
    if kind is None:
        return None
    if kind not in (COMPACTED, COMPACTED_LAGGING, COMPACTED_UNREADABLE, COMPACTED_UNRECORDED):
        raise ValueError(f"unknown compaction reference kind {kind!r}")
    return CompactionPointer(zk_ledger, cursor_ledger_active=kind in (COMPACTED_LAGGING, COMPACTED_UNREADABLE))


def plan_status(verdict: Verdict, created_ms: int | None, now_ms: int, tenant: str | None, namespace: str | None,
                settings: SafetySettings, protected: bool = False) -> str:
    """Whether an orphan or unknown verdict may be acted on: only `candidate` ever is. The delete stage asks
    the same question of every record it is given (sweeper.delete.rules), whatever planned it."""
    if verdict is Verdict.UNKNOWN:
        return UNKNOWN
    if verdict is Verdict.OTHER_CLUSTER:
        return OTHER_CLUSTER
    if verdict is not Verdict.ORPHAN:
        raise ValueError(f"no plan for verdict {verdict!r}")
    if protected:
        return PROTECTED
    if not settings.grace.is_old_enough(created_ms, now_ms):
        return YOUNG
    if not settings.scope.permits(tenant, namespace):
        return OUT_OF_SCOPE
    return CANDIDATE


def sharing_state(settings: SafetySettings, peers: list[dict[str, Any]]) -> tuple[Sharing, str]:
    """Who else writes to these bookies as far as this run's snapshot knows, and a line saying why."""
    if settings.bookkeeper_dedicated:
        return Sharing.DEDICATED, "[safety] bookkeeper_dedicated = true"
    if not settings.peer_metadata:
        return Sharing.UNVERIFIED, ("shared BookKeeper unverified: no ledger is a candidate. Set [safety] "
                                    "bookkeeper_dedicated = true if only this cluster writes to these bookies, else "
                                    "list every other cluster's metadata store in [safety] peer_metadata")
    read = {p["cluster"] for p in peers if p["kind"] == PEER_READ}
    unread = {p["cluster"]: p["referrer"] for p in peers if p["kind"] == PEER_UNREAD}
    missing = [peer for peer in settings.peer_metadata if peer not in read]
    if missing:
        why = "; ".join(f"{peer}: {unread.get(peer, 'not in this snapshot')}" for peer in missing)
        return Sharing.UNVERIFIED, ("shared BookKeeper unverified, no ledger is a candidate: peer metadata unread "
                                    f"({why})")
    return Sharing.PEERS_READ, f"references of {len(read)} peer cluster(s) read: {', '.join(sorted(read))}"


def _classify_partition(
    batches: Iterator[pa.RecordBatch], run_id: str, now_ms: int, settings: SafetySettings,
    known_namespaces: frozenset[str] = frozenset(), sharing: Sharing = Sharing.UNVERIFIED,
    peer_namespaces: frozenset[str] = frozenset(),
) -> Iterator[pa.RecordBatch]:
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(ORPHANS, timezone="UTC")
    captured_at = datetime.fromtimestamp(now_ms / 1000, UTC)
    for batch in batches:
        out = []
        for r in batch.to_pylist():
            component = r["component"]
            owner_exists = r["schema_exists"] if component == "schema" else r["ml_exists"]
            tenant, namespace, topic = owner_scope(r["owner_ml"] if component != "schema" else None,
                                                   r["schema_id"], r["owner_topic"])
            facts = LedgerFacts(
                is_pulsar=True,
                referenced=False,
                component=component,
                managed_ledger=r["owner_ml"] if component != "schema" else None,
                cursor=r["cursor"],
                schema_id=r["schema_id"],
                owner_topic=r["owner_topic"],
                listed_as_bookkeeper_deleted=r["bk_deleted"],
                offloaded_copy_verified=r["copy_verified"],
                owner_exists=owner_exists,
                owner_quarantined=r["owner_quarantined"],
                cursor_exists=r["cursor_exists"],
                ledger_id=r["ledger_id"],
                compaction=compaction_pointer(r["compaction_kind"], r["compaction_ledger"]),
                namespace_known=f"{tenant}/{namespace}" in known_namespaces,
                sharing=sharing,
                owner_at_peer=r["owner_at_peer"],
                namespace_at_peer=f"{tenant}/{namespace}" in peer_namespaces,
            )
            verdict = classify(facts)
            # Protection keeps a live topic's (or subscription's) state; a deleted topic's ledgers protect nothing.
            protected = protection_of(Owner(tenant, namespace, topic, r["cursor"]),
                                      settings.protection) if owner_exists else None
            status = plan_status(verdict.verdict, r["created_ms"], now_ms, tenant, namespace, settings,
                                 protected is not None)
            detail = f"{verdict.detail}; {protected}" if status == PROTECTED else verdict.detail
            out.append(
                {
                    "run_id": run_id,
                    "captured_at": captured_at,
                    "object_type": "ledger",
                    "ledger_id": r["ledger_id"],
                    "status": status,
                    "verdict": verdict.verdict.value,
                    "reason": verdict.reason.value,
                    "detail": detail,
                    "component": component,
                    "tenant": tenant,
                    "namespace": namespace,
                    "topic": topic,
                    "managed_ledger": facts.managed_ledger,
                    "cursor": r["cursor"],
                    "schema_id": r["schema_id"],
                    "bucket_key": r["bucket_key"],
                    "size_bytes": r["length"],
                    "created_ms": r["created_ms"],
                    "age_ms": now_ms - r["created_ms"] if r["created_ms"] else None,
                    "created_source": r["created_source"],
                    "zk_path": r["path"],
                    "zk_version": r["zk_version"],
                    "carried": True,
                    "bk_layout": r["bk_layout"],
                }
            )
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=schema)


def _classify_objects(batches: Iterator[pa.RecordBatch], run_id: str, now_ms: int,
                      settings: SafetySettings) -> Iterator[pa.RecordBatch]:
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(ORPHANS, timezone="UTC")
    captured_at = datetime.fromtimestamp(now_ms / 1000, UTC)
    for batch in batches:
        out = []
        for r in batch.to_pylist():
            referenced = r["ref_ml"] is not None
            facts = ObjectFacts(
                referenced=referenced,
                offload_complete=r["complete"],
                offload_in_flight=referenced and offload_in_flight(r["complete"], r["offload_ts"], now_ms,
                                                                   settings.grace),
                owner_quarantined=r["owner_quarantined"],
                metadata_read=r["metadata_read"],
                cluster_name=r["cluster_name"],
                managed_ledger=r["managed_ledger"],
                local_cluster=settings.local_cluster,
            )
            verdict, reason = classify_object(facts)
            if verdict is Verdict.IN_USE:
                continue
            owner = r["ref_ml"] or r["managed_ledger"]
            tenant, namespace, topic = owner_scope(owner, None, None)
            status = plan_status(verdict, r["last_modified_ms"], now_ms, tenant, namespace, settings)
            out.append({
                "run_id": run_id, "captured_at": captured_at, "object_type": "offload_object",
                "ledger_id": r["ledger_id"], "status": status, "verdict": verdict.value, "reason": reason.value,
                "detail": f"s3://{r['bucket']}/{r['key']}" + (
                    f" (pulsarClusterName {r['cluster_name']!r})" if verdict is Verdict.OTHER_CLUSTER else ""),
                "tenant": tenant, "namespace": namespace,
                "topic": topic, "managed_ledger": owner, "size_bytes": r["size"],
                "created_ms": r["last_modified_ms"],
                "age_ms": now_ms - r["last_modified_ms"] if r["last_modified_ms"] else None,
                "created_source": "s3_last_modified", "s3_bucket": r["bucket"], "s3_key": r["key"],
                "offload_uuid": r["uuid"], "carried": True, "offload_bucket": r["offload_bucket"],
                "offload_region": r["offload_region"], "offload_endpoint": r["offload_endpoint"],
                "offload_driver": r["offload_driver"],
            })
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=schema)


def missing_ledgers(frames: dict[str, DataFrame], refs: DataFrame, run_id: str, now_ms: int) -> DataFrame:
    """Referenced ledgers absent from BookKeeper: data loss to report, never anything to delete."""
    known = (
        frames["bk_ledgers"]
        .select("ledger_id")
        .unionByName(frames["quarantine"].where(F.col("ledger_id").isNotNull()).select("ledger_id"))
    )
    missing = refs.join(known, "ledger_id", "left_anti")
    grouped = missing.groupBy("ledger_id").agg(
        F.first("ref_kind").alias("ref_kind"), F.first("owner").alias("owner"), F.first("referrer").alias("referrer"),
        # A ledger named only by a compaction pointer that may lag was most likely deleted by a newer
        # compaction whose pointer lives in the cursor ledger: report it, but not as data loss.
        F.min(F.col("ref_kind") == COMPACTED_LAGGING).alias("only_lagging"),
    )
    stale = F.col("only_lagging")
    columns = {f.name: F.lit(None).cast(f.dataType) for f in ORPHANS.fields}
    columns.update(
        {
            "run_id": F.lit(run_id),
            "captured_at": F.lit(datetime.fromtimestamp(now_ms / 1000, UTC)).cast("timestamp"),
            "object_type": F.lit("missing_ledger"),
            "ledger_id": F.col("ledger_id"),
            "status": F.when(stale, F.lit(STALE_POINTER)).otherwise(F.lit(MISSING)),
            "verdict": F.when(stale, F.lit(STALE_POINTER)).otherwise(F.lit("missing")),
            "reason": F.when(stale, F.lit("compaction_pointer_may_lag")).otherwise(
                F.concat(F.lit("referenced_by_"), F.col("ref_kind"))),
            "detail": F.when(stale, F.concat(
                F.lit("named by "), F.col("referrer"),
                F.lit(" in ZooKeeper, which may lag the cursor ledger: likely replaced by a newer compaction")))
            .otherwise(F.concat(F.lit("referenced by "), F.col("referrer"), F.lit(" but absent from BookKeeper"))),
            "managed_ledger": F.when(F.col("ref_kind") != "schema", F.col("owner")),
            "schema_id": F.when(F.col("ref_kind") == "schema", F.col("owner")),
            "carried": F.lit(True),  # nothing to carry: never emitted
        }
    )
    return grouped.select(*[columns[f.name].alias(f.name) for f in ORPHANS.fields])


# Pending-delete states (PIP-186 records found on the system topic, against this snapshot).
STUCK, IN_USE, DONE = "stuck", "in_use", "done"


def pending_delete_states(frames: dict[str, DataFrame], refs: DataFrame, run_id: str) -> DataFrame:
    """Each distinct pending delete: stuck (still there, unreferenced), in use (referenced), done (gone)."""
    pending = frames["pending_deletes"]
    grouped = pending.groupBy("record_key").agg(
        F.first("ledger_id").alias("ledger_id"), F.first("ledger_type").alias("ledger_type"),
        F.first("component").alias("component"), F.first("topic_name").alias("topic_name"),
        F.first("source_run_id").alias("source_run_id"), F.first("offload_uuid").alias("offload_uuid"),
        F.first("s3_bucket").alias("s3_bucket"), F.count("*").alias("messages"),
        F.min("publish_time_ms").alias("first_publish_time_ms"))
    bk = frames["bk_ledgers"].select("ledger_id", F.lit(True).alias("_on_bk"))
    unreadable = (frames["quarantine"].where(F.col("ledger_id").isNotNull() & (F.col("source") == "bookkeeper"))
                  .select("ledger_id").distinct().withColumn("_unreadable", F.lit(True)))
    referenced = (refs.groupBy("ledger_id").agg(F.first("referrer").alias("_referrer")))
    objects = (frames["offload_objects"].groupBy(F.col("bucket").alias("s3_bucket"),
                                                  F.col("uuid").alias("offload_uuid"), "ledger_id")
               .agg(F.count("*").alias("_objects")))
    contexts = (frames["ml_ledgers"].where(F.col("offload_uuid").isNotNull())
                .groupBy("offload_uuid", "ledger_id").agg(F.first("managed_ledger").alias("_offload_referrer")))
    # A bucket any slice of which could not be listed: absence from the listing proves nothing there.
    unlisted = (frames["quarantine"].where((F.col("source") == "offload")
                                           & F.col("error_kind").isin("listing_failed", "bucket_unavailable"))
                .select(F.regexp_extract("path", r"^s3://([^/]+)/", 1).alias("s3_bucket")).distinct()
                .withColumn("_bucket_unlisted", F.lit(True)))
    joined = (grouped.join(bk, "ledger_id", "left").join(unreadable, "ledger_id", "left")
              .join(referenced, "ledger_id", "left")
              .join(objects, ["s3_bucket", "offload_uuid", "ledger_id"], "left")
              .join(contexts, ["offload_uuid", "ledger_id"], "left")
              .join(unlisted, "s3_bucket", "left"))
    is_ledger = F.col("ledger_type") == "LEDGER"
    exists = F.when(is_ledger, F.col("_on_bk").isNotNull()).otherwise(F.col("_objects").isNotNull())
    unknown = F.when(is_ledger, F.col("_unreadable").isNotNull()).otherwise(
        F.col("_bucket_unlisted").isNotNull() | F.col("s3_bucket").isNull())
    referrer = F.when(is_ledger, F.col("_referrer")).otherwise(F.col("_offload_referrer"))
    state = (F.when(exists & referrer.isNotNull(), F.lit(IN_USE)).when(exists, F.lit(STUCK))
             .when(unknown, F.lit(UNKNOWN)).otherwise(F.lit(DONE)))
    detail = (F.when(exists & referrer.isNotNull(),
                     F.concat(F.lit("still referenced by "), referrer,
                              F.lit(": phase 1 was sent but the metadata update never happened; never delete")))
              .when(exists, F.lit("still exists and nothing references it: phase 2 never ran or failed"))
              .when(unknown, F.lit("could not be read in this snapshot"))
              .otherwise(F.lit("gone: the delete was carried out")))
    return joined.select(F.lit(run_id).alias("run_id"), "record_key", "ledger_id", "ledger_type", "component",
                         "topic_name", "source_run_id", "messages", "first_publish_time_ms", state.alias("state"),
                         detail.alias("detail"))


def _few_rows(store: TableStore, table: str, where: Mapping[str, Any], columns: list[str]) -> list[dict[str, Any]]:
    """A run's few rows of a snapshot table, on the driver; none when a store written by an earlier version has no
    such table yet (as `run_frames` reads it)."""
    if not store.exists(table):
        return []
    return store.read_arrow(table, where=where, columns=columns).to_pylist()


def _bookkeeper_totals(store: TableStore, run_id: str) -> dict[str, Any]:
    """The run's Pulsar and other ledgers, and its capture time (None without rows): one aggregation, on the
    driver from the table's files where the engine can (two columns of a million rows: ~0.1 s, where the Spark
    job on a fresh JVM took 2 s before reconcile's own query could start)."""
    if not store.exists("bk_ledgers"):  # read as empty, as run_frames reads a table an earlier version lacked
        return {"pulsar": 0, "non_pulsar": 0, "captured": None}
    groups = store.aggregate_arrow("bk_ledgers", ["is_pulsar"], [("ledger_id", "count"), ("captured_at", "max")],
                                   where={"run_id": run_id}).to_pylist()
    return {"pulsar": sum(g["ledger_id_count"] for g in groups if g["is_pulsar"] is True),
            "non_pulsar": sum(g["ledger_id_count"] for g in groups if g["is_pulsar"] is False),
            "captured": max((g["captured_at_max"] for g in groups if g["captured_at_max"] is not None), default=None)}


def check_snapshot_run(store: TableStore, run_id: str) -> dict[str, int]:
    """The run's snapshot must have succeeded, be complete, and not be reconciled already.

    A run is reconciled once: a second reconcile (gated after `--skip-gates`, or the reverse) would leave two plans
    under one run id, and emit could not tell which one the gates passed. A succeeded reconcile with no orphan rows
    (an empty snapshot) counts too."""
    counts = runs.require(store, run_id, "snapshot", ReconcileRefused, f"no successful snapshot for run {run_id}")
    if runs.succeeded(store, run_id, "reconcile") is not None or (
            _few_rows(store, "orphans", {"run_id": run_id}, ["run_id"])):
        raise ReconcileRefused(f"run {run_id} is already reconciled (a run is reconciled once, with or without "
                               "--skip-gates): take a new snapshot for a new run")
    return counts


def run_reconcile(
    spark: SparkSession,
    store: TableStore,
    run_id: str,
    settings: SafetySettings | None = None,
    now_ms: int | None = None,
) -> ReconcileResult:
    settings = settings or SafetySettings()
    started = time.monotonic()
    snapshot_counts = check_snapshot_run(store, run_id)
    frames = snapshot_frames(store, run_id)
    peers = frames["peer_references"]
    # Peer status rows and namespaces are few: read on the driver (from the table's files, not by a Spark job, where
    # the engine can).
    peer_notes = _few_rows(store, "peer_references", {"run_id": run_id, "kind": [PEER_READ, PEER_UNREAD,
                                                                                 PEER_NAMESPACE]},
                           ["cluster", "kind", "owner", "referrer"])
    sharing, sharing_note = sharing_state(settings, peer_notes)
    peer_namespaces = frozenset(p["owner"] for p in peer_notes if p["kind"] == PEER_NAMESPACE)
    local_refs = references(frames).cache()
    # This cluster's referenced ledger ids, once: the anti-join below and the missing-reference gate both need them.
    local_ids = local_refs.select("ledger_id").distinct().cache()
    refs, ref_ids = local_refs, local_ids
    if sharing is Sharing.PEERS_READ:
        refs = local_refs.unionByName(peers.where(F.col("kind") == PEER_REFERENCE)
                                      .select("ledger_id", "ref_kind", "owner", "referrer")).cache()
        ref_ids = None
    facts = _facts_frame(frames, refs, settings.local_cluster, ref_ids)
    bk_totals = _bookkeeper_totals(store, run_id)
    if now_ms is None:
        captured = bk_totals["captured"]
        now_ms = int(captured.timestamp() * 1000) if captured else int(time.time() * 1000)
    # Namespaces are few (thousands at most): a set on the driver, shipped with the classifier.
    known = frozenset(r["namespace"] for r in _few_rows(store, "namespaces", {"run_id": run_id}, ["namespace"]))
    classified = facts.mapInArrow(
        lambda b: _classify_partition(b, run_id, now_ms, settings, known, sharing, peer_namespaces), ORPHANS)
    objects = _object_facts_frame(frames).mapInArrow(lambda b: _classify_objects(b, run_id, now_ms, settings),
                                                     ORPHANS)
    # Only this cluster's references can be missing from its BookKeeper snapshot (the gate below).
    orphans = classified.unionByName(objects).unionByName(missing_ledgers(frames, local_refs, run_id,
                                                                          now_ms)).cache()
    # Every breakdown the run reports and the breakers weigh, from one aggregation (a few dozen rows).
    tally = orphan_tally(orphans.groupBy("object_type", "status", "reason")
                         .agg(F.count("*").alias("rows"), F.sum(F.coalesce("size_bytes", F.lit(0))).alias("bytes"))
                         .collect())
    counts: dict[str, int] = dict(tally.counts)  # the rows of ReconcileCounts, typed once complete
    pulsar_ledgers = bk_totals["pulsar"]
    counts["pulsar_ledgers"] = pulsar_ledgers
    counts["non_pulsar_ledgers"] = bk_totals["non_pulsar"]
    counts["shared_bookkeeper_unverified"] = int(sharing is Sharing.UNVERIFIED)
    counts["peer_clusters_read"] = sum(1 for p in peer_notes if p["kind"] == PEER_READ)
    referenced = local_ids.count()
    counts["referenced_ledgers"] = referenced
    # Before anything may be a candidate: Pulsar's references must be in this BookKeeper snapshot.
    tripped = missing_reference_problem(counts.get(f"{MISSING}.missing_ledger", 0), referenced, settings)
    # The breaker weighs ledgers against ledgers, and offloaded objects (count and bytes) against objects.
    tripped = tripped or settings.breaker.tripped(counts.get(f"{CANDIDATE}.ledger", 0), pulsar_ledgers)
    if not tripped:
        objects_total = frames["offload_objects"].agg(F.count("*"), F.sum(F.coalesce("size", F.lit(0)))).first()
        counts["offload_objects"] = int(objects_total[0] or 0)
        tripped = settings.breaker.tripped_objects(tally.candidate_objects, counts["offload_objects"],
                                                   tally.candidate_object_bytes, int(objects_total[1] or 0))
    if tripped:
        refs.unpersist()
        local_refs.unpersist()
        local_ids.unpersist()
        orphans.unpersist()
        raise ReconcileRefused(tripped, [tripped])
    store.append("orphans", orphans, ORPHANS, commit_metadata={"run_id": run_id, "stage": "reconcile"})
    report = build_report(orphans, run_id)
    store.append("orphan_report", report, ORPHAN_REPORT, commit_metadata={"run_id": run_id, "stage": "reconcile"})
    # The worst topics, from the rows just committed (one per topic with candidates), read back on the driver where
    # the engine can: the aggregation is not run a second time.
    report_rows = (store.read_arrow("orphan_report", where={"run_id": run_id})
                   .sort_by([("reclaimable_bytes", "descending")]).slice(0, 20).to_pylist())
    if snapshot_counts.get("pending_deletes", 1):
        states = pending_delete_states(frames, refs, run_id).cache()
        for row in states.groupBy("state").count().collect():
            counts[f"pending_delete.{row['state']}"] = int(row["count"])
        store.append("pending_delete_status", states, PENDING_DELETE_STATUS,
                     commit_metadata={"run_id": run_id, "stage": "reconcile"})
        states.unpersist()
    else:
        # The snapshot read no pending delete (its count says so): nothing to join, and no Spark job for it.
        store.append_rows("pending_delete_status", [], PENDING_DELETE_STATUS,
                          commit_metadata={"run_id": run_id, "stage": "reconcile"})
    refs.unpersist()
    local_refs.unpersist()
    local_ids.unpersist()
    orphans.unpersist()
    return ReconcileResult(run_id, ReconcileCounts.from_row(counts), time.monotonic() - started, report_rows,
                           sharing_note)


def missing_reference_problem(missing: int, referenced: int, settings: SafetySettings) -> str | None:
    """Why the run must stop because the BookKeeper snapshot lacks what Pulsar references, or None.

    A healthy cluster misses a handful (the missing-ledger report). Many mean the snapshot read another
    BookKeeper than this Pulsar writes to: a wrong ledgers_root or chroot, or another cluster's metadata
    given as ours. Its ledgers would then all look unreferenced.
    """
    if missing <= settings.missing_reference_allowance or referenced <= 0:
        return None
    fraction = missing / referenced
    if fraction <= settings.max_missing_reference_fraction:
        return None
    return (f"{missing:,} of the {referenced:,} ledgers Pulsar references ({fraction:.1%}) are not under "
            f"BookKeeper's {settings.ledgers_root}, above [gates] max_missing_reference_fraction "
            f"{settings.max_missing_reference_fraction:.1%}: check [bookkeeper] ledgers_root and the chroot in "
            "[bookkeeper] zookeeper, and that [pulsar] names this cluster's metadata")
