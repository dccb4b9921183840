"""The peer clusters ([safety] peer_metadata) that share our BookKeeper: each one's references, owners and namespaces
scanned by the same tasks as ours into `peer_references`, or recorded unread with why."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from sweeper.rules.references import PEER_NAMESPACE, PEER_READ, PEER_UNREAD, peer_rows
from sweeper.snapshot.packer import table_frame
from sweeper.snapshot.planning import PeerPlan
from sweeper.snapshot.scanners import _counts, scan_dataframe, zookeeper_task_error
from sweeper.snapshot.settings import ScanTarget, SnapshotSettings
from sweeper.spark import task_error
from sweeper.table_schemas import PEER_REFERENCES
from sweeper.tables import TableStore

log = logging.getLogger(__name__)


PEER_TABLES = ("managed_ledgers", "ml_ledgers", "ml_cursors", "cursor_ledger_refs", "schema_ledgers", "quarantine")


def snapshot_peers(spark: SparkSession, settings: SnapshotSettings, store: TableStore, target: ScanTarget,
                   peers: list[PeerPlan], commit_metadata: dict[str, str]) -> dict[str, int]:
    """Each peer's references, owners and namespaces into `peer_references`, scanned by the same tasks as ours.

    A peer that cannot be read (or whose scan fails) is recorded as `peer_unread` with why: reconcile then
    treats the BookKeeper as unverified, so nothing is a candidate, and the run still completes.
    """
    frames: list[DataFrame] = []
    notes: list[dict[str, Any]] = []
    cached: list[DataFrame] = []
    for peer in peers:
        problem = peer.problem
        if problem is None:
            peer_target = dataclasses.replace(target, pulsar=target.pulsar.elsewhere(peer.cluster))
            packed = scan_dataframe(spark, settings, peer_target, peer.tasks).persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(packed)
            try:
                _counts(packed)
            except Exception as exc:
                failure = zookeeper_task_error(exc)
                problem = str(failure) if failure is not None else f"the scan failed: {task_error(exc, ())}"
        if problem is not None:
            log.warning("peer metadata %s unread: %s", peer.cluster, problem)
            notes.append({"cluster": peer.cluster, "kind": PEER_UNREAD, "referrer": problem[:2000]})
            continue
        frames.append(peer_rows({t: table_frame(packed, t) for t in PEER_TABLES}, peer.cluster))
        notes.append({"cluster": peer.cluster, "kind": PEER_READ})
        notes += [{"cluster": peer.cluster, "kind": PEER_NAMESPACE, "owner": ns} for ns in peer.namespaces]
    columns = ("cluster", "kind", "ledger_id", "ref_kind", "owner", "referrer")
    rows = spark.createDataFrame([tuple(n.get(c) for c in columns) for n in notes],
                                 "cluster string, kind string, ledger_id long, ref_kind string, owner string, "
                                 "referrer string")
    for frame in frames:
        rows = rows.unionByName(frame)
    rows = rows.select(F.lit(target.run_id).alias("run_id"),
                       F.lit(target.captured_at).cast("timestamp").alias("captured_at"), *columns)
    try:
        commit = store.append("peer_references", rows, PEER_REFERENCES, commit_metadata=commit_metadata)
    finally:
        for frame in cached:
            frame.unpersist()
    written = getattr(commit, "rows", None)
    return {"peer_references": int(written) if written is not None else rows.count(),
            "peers_read": sum(1 for n in notes if n["kind"] == PEER_READ),
            "peers_unread": sum(1 for n in notes if n["kind"] == PEER_UNREAD)}

