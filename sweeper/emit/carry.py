"""What the later stages need of a candidate, carried from its `orphans` rows into its `emitted` row (issue 46).

Reconcile puts in each orphan row what it read of the ledger (`bk_layout`) or of the offloaded object's bucket
(`offload_bucket`, `offload_region`, `offload_endpoint`), so emit builds its records, and the delete and reclaim
their inputs, without going back to the snapshot tables. The record on the system topic keeps PIP-186's schema: the
values travel in our tables only. They are a plan, never proof: the delete re-reads the live metadata of everything
it deletes (DESIGN.md invariant 5).

A run an older version reconciled has no carried values (`carried` is null): its offload buckets are read from
`ml_ledgers`, as that version did (`snapshot_offload_targets`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pyspark.sql import functions as F

from sweeper.table_schemas import CARRIED_COLUMNS
from sweeper.tables import TableStore
from sweeper.vocabulary import CANDIDATE

CARRIED_NAMES = [name for name, _ in CARRIED_COLUMNS]
OFFLOAD_OBJECT = "offload_object"


def snapshot_offload_targets(store: TableStore, run_id: str) -> dict[str, tuple[str, str]]:
    """bucket -> (region, endpoint) of the run's offload contexts (a handful of buckets), read from the snapshot's
    `ml_ledgers`: the fallback for a run whose orphan rows carry none (reconciled by an older version)."""
    targets: dict[str, tuple[str, str]] = {}
    if store.exists("ml_ledgers"):
        for r in (store.read("ml_ledgers", where={"run_id": run_id}).where(F.col("offload_bucket").isNotNull())
                  .select("offload_bucket", "offload_region", "offload_endpoint").distinct().collect()):
            targets[r["offload_bucket"]] = (r["offload_region"] or "", r["offload_endpoint"] or "")
    return targets


def uncarried_offload_targets(store: TableStore, run_id: str) -> dict[str, tuple[str, str]] | None:
    """None when every candidate offloaded object of the run carries its bucket's region and endpoint (each task then
    takes them from its own rows, `row_targets`); else the snapshot's, as an older version read them."""
    groups = store.aggregate_arrow("orphans", ["object_type", "carried"], [("run_id", "count")],
                                   where={"run_id": run_id, "status": CANDIDATE}).to_pylist()
    if any(g["object_type"] == OFFLOAD_OBJECT and g["carried"] is None for g in groups):
        return snapshot_offload_targets(store, run_id)
    return None


def row_targets(rows: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """bucket -> (region, endpoint) as the orphan rows carry them: for the buckets of these rows, what
    `snapshot_offload_targets` says (reconcile joined the same contexts)."""
    return {r["s3_bucket"]: (r["offload_region"] or "", r["offload_endpoint"] or "") for r in rows
            if r.get("object_type") == OFFLOAD_OBJECT and r.get("offload_bucket") is not None}


class CarriedIndex:
    """The carried values of one task's orphan rows, by the record each becomes (records_for_orphans)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.ledgers: dict[int, Mapping[str, Any]] = {}
        self.objects: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
        for r in rows:
            if r.get("object_type") == "ledger":
                self.ledgers[int(r["ledger_id"])] = r
            elif r.get("object_type") == OFFLOAD_OBJECT:
                self.objects.setdefault((r["s3_bucket"], r["offload_uuid"], int(r["ledger_id"])), []).append(r)

    def of(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The record's carried columns of `emitted`; all null (not carried) when a row of it carries none."""
        none = dict.fromkeys(CARRIED_NAMES)
        context = record.get("offloadContext")
        if context is None:
            row = self.ledgers.get(int(record["ledgerId"]))
            if row is None or not row.get("carried"):
                return none
            return {**none, "carried": True, "bk_layout": row.get("bk_layout")}
        rows = self.objects.get((context["bucket"], context["uuid"], int(record["ledgerId"]))) or []
        if not rows or not all(r.get("carried") for r in rows):
            return none
        first = rows[0]  # one bucket: the same context for every key
        return {**none, "carried": True, "offload_bucket": first.get("offload_bucket"),
                "offload_region": first.get("offload_region"), "offload_endpoint": first.get("offload_endpoint"),
                "offload_driver": first.get("offload_driver")}
