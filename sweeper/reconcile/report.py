"""What reconcile reports of its orphan rows: the per-topic report (`orphan_report`, read back for the worst topics)
and the tally by status, object type and reason that the run's counts and the breakers use."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sweeper.table_schemas import ORPHAN_REPORT
from sweeper.vocabulary import CANDIDATE, DAY_MS


def build_report(orphans: DataFrame, run_id: str) -> DataFrame:
    """Per tenant / namespace / topic: candidates, reclaimable bytes, and how old they are."""
    candidates = orphans.where(F.col("status") == CANDIDATE)
    day = float(DAY_MS)
    return (
        candidates.groupBy("tenant", "namespace", "topic")
        .agg(
            F.count("*").alias("orphans"),
            F.sum(F.coalesce("size_bytes", F.lit(0))).alias("reclaimable_bytes"),
            (F.min("age_ms") / day).alias("min_age_days"),
            (F.expr("percentile_approx(age_ms, 0.5)") / day).alias("median_age_days"),
            (F.max("age_ms") / day).alias("max_age_days"),
            F.sort_array(F.collect_set("reason")).alias("reasons"),
        )
        .withColumn("run_id", F.lit(run_id))
        .select(*ORPHAN_REPORT.fieldNames())
    )


@dataclass(frozen=True)
class OrphanTally:
    """The orphan rows counted by status, by status and object type, and the candidates by reason, with the
    candidate offloaded objects' count and bytes (for the object breaker)."""

    counts: Mapping[str, int]
    candidate_objects: int = 0
    candidate_object_bytes: int = 0


def orphan_tally(groups: Iterable[Mapping[str, Any]]) -> OrphanTally:
    """From rows of (object_type, status, reason, rows, bytes): a pure function, so the counts the run reports are
    tested without Spark."""
    counts: dict[str, int] = {}
    objects = object_bytes = 0
    for group in groups:
        status, kind, rows = group["status"], group["object_type"], int(group["rows"])
        counts[status] = counts.get(status, 0) + rows
        counts[f"{status}.{kind}"] = counts.get(f"{status}.{kind}", 0) + rows
        if status == CANDIDATE:
            counts[f"reason.{group['reason']}"] = counts.get(f"reason.{group['reason']}", 0) + rows
            if kind == "offload_object":
                objects += rows
                object_bytes += int(group["bytes"] or 0)
    return OrphanTally(counts, objects, object_bytes)
