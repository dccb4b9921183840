"""Data-quality gates on a snapshot, with great-expectations, before anything is planned.

A snapshot that is empty, partial, or much smaller than the last good one means the scan (or
the metadata store) went wrong: planning deletions from it would turn every ledger it missed
into an "orphan". Gates fail the run with a readable list of what failed.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sweeper import runs
from sweeper.config import GatesConfig
from sweeper.errors import Refused
from sweeper.liveness import Liveness, liveness_problems
from sweeper.tables import TableStore

log = logging.getLogger(__name__)
logging.getLogger("great_expectations").setLevel(logging.WARNING)


@dataclass
class GateResult:
    run_id: str
    failures: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def passed(self) -> bool:
        return not self.failures


class GateFailed(Refused):
    def __init__(self, result: GateResult) -> None:
        lines = "\n".join(f"  - {failure}" for failure in result.failures)
        super().__init__(f"data-quality gates failed for snapshot {result.run_id}:\n{lines}")
        self.result = result


def _runs(store: TableStore) -> list[dict[str, Any]]:
    return runs.rows(store, stage="snapshot", status=runs.SUCCEEDED)


def _expectations(table: str, count_floor: int) -> list[Any]:
    import great_expectations.expectations as gxe

    rows = [gxe.ExpectTableRowCountToBeBetween(min_value=count_floor)]
    if table == "bk_ledgers":
        return [*rows, gxe.ExpectColumnValuesToBeUnique(column="ledger_id"),
                gxe.ExpectColumnValuesToBeBetween(column="ledger_id", min_value=0),
                *[gxe.ExpectColumnValuesToNotBeNull(column=c) for c in ("ledger_id", "path", "zk_version",
                                                                        "created_ms", "is_pulsar")]]
    if table == "managed_ledgers":
        return [*rows, gxe.ExpectColumnValuesToBeUnique(column="managed_ledger"),
                gxe.ExpectColumnValuesToNotBeNull(column="managed_ledger")]
    if table == "ml_ledgers":
        return [*rows, gxe.ExpectCompoundColumnsToBeUnique(column_list=["managed_ledger", "ledger_id"]),
                gxe.ExpectColumnValuesToBeBetween(column="ledger_id", min_value=0),
                gxe.ExpectColumnValuesToNotBeNull(column="ledger_id")]
    if table == "ml_cursors":
        return [*rows, gxe.ExpectCompoundColumnsToBeUnique(column_list=["managed_ledger", "cursor"]),
                gxe.ExpectColumnValuesToNotBeNull(column="cursors_ledger_id")]
    if table == "schema_ledgers":
        return [*rows, gxe.ExpectColumnValuesToBeBetween(column="ledger_id", min_value=0)]
    return rows


def _describe(result: Any) -> str:
    config = result.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k not in ("batch_id",)}
    observed = result.result.get("observed_value", result.result.get("unexpected_count"))
    return f"{config.type}({', '.join(f'{k}={v}' for k, v in kwargs.items())}): observed {observed}"


def _max(frame: DataFrame | None, column: str) -> int | None:
    if frame is None:
        return None
    value = frame.agg(F.max(column)).first()[0]
    return int(value) if value is not None else None


def snapshot_liveness(frames: dict[str, DataFrame | None], recorded: dict[str, int]) -> Liveness:
    """What the run's snapshot says about the metadata being live (see sweeper.liveness)."""
    changes = [v for v in (_max(frames.get("managed_ledgers"), "zk_mtime_ms"),
                           _max(frames.get("ml_cursors"), "zk_mtime_ms")) if v is not None]
    bk = frames.get("bk_ledgers")
    data_ledgers = None if bk is None else bk.where(
        (F.col("component") == "managed-ledger") & F.col("cursor").isNull() & F.col("is_pulsar"))
    return Liveness(int(recorded.get("live_brokers", 0)), max(changes) if changes else None,
                    _max(data_ledgers, "created_ms"))


def run_gates(store: TableStore, run_id: str, config: GatesConfig,
              brokers_path: str = "/loadbalance/brokers") -> GateResult:
    import great_expectations as gx

    result = GateResult(run_id)
    good_runs = _runs(store)
    this = next((r for r in good_runs if r["run_id"] == run_id), None)
    if this is None:
        result.failures.append(f"no successful snapshot recorded for run {run_id}")
        return result
    previous = [r for r in good_runs if r["started_at"] < this["started_at"]]
    recorded = this["counts"] or {}
    frames: dict[str, DataFrame] = {}
    for table in ("bk_ledgers", "managed_ledgers", "ml_ledgers", "ml_cursors", "schema_ledgers", "quarantine"):
        frames[table] = store.read(table).where(F.col("run_id") == run_id) if store.exists(table) else None

    # A partial or mixed snapshot: what the tables hold for the run must be what the scan counted.
    for table, frame in frames.items():
        actual = frame.count() if frame is not None else 0
        if actual != recorded.get(table, 0):
            result.failures.append(f"{table} holds {actual} rows for run {run_id}, the snapshot recorded "
                                   f"{recorded.get(table, 0)}: partial or mixed snapshot")
    bk_count = recorded.get("bk_ledgers", 0)
    quarantined = recorded.get("quarantine", 0) - recorded.get("quarantine.pending_delete", 0)
    if bk_count and quarantined > max(10, 0.01 * bk_count):
        result.failures.append(f"{quarantined} znodes quarantined against {bk_count} ledgers: the scan is partial")
    unlisted = recorded.get("quarantine.offload_listing", 0)
    if unlisted and not config.allow_offload_listing_errors:
        buckets = ", ".join(sorted(r["path"] for r in frames["quarantine"].where(
            F.col("error_kind") == "listing_failed").select("path").distinct().collect())) if frames[
            "quarantine"] is not None else "?"
        result.failures.append(
            f"{unlisted} slice(s) of the offload buckets could not be listed ({buckets}): a partial listing "
            "cannot tell what tiered storage holds. Fix access, or set [gates] allow_offload_listing_errors = true")
    result.failures += liveness_problems(snapshot_liveness(frames, recorded), brokers_path,
                                         config.max_metadata_lag_minutes, config.require_live_brokers)

    from great_expectations.data_context.types.base import ProgressBarsConfig

    # It sets its own loggers' levels on import; its INFO lines would fill a scheduler's log.
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)

    pulsar_expected = bool(frames["bk_ledgers"] is not None and bk_count)
    suites: list[tuple[str, DataFrame, list[Any]]] = []
    for table in ("bk_ledgers", "managed_ledgers", "ml_ledgers", "ml_cursors", "schema_ledgers"):
        frame = frames[table]
        floor = 0
        if table == "bk_ledgers" and not config.allow_empty:
            floor = 1
        if table == "managed_ledgers" and pulsar_expected and not config.allow_empty:
            floor = 1
        if previous:
            before = (previous[-1]["counts"] or {}).get(table, 0)
            floor = max(floor, int(before * (1 - config.max_drop_fraction)))
        if frame is None:
            if floor:
                result.failures.append(f"{table} does not exist but at least {floor} rows were expected")
            continue
        suites.append((table, frame, _expectations(table, floor)))

    def validate(table: str, frame: DataFrame, expectations: list[Any]) -> list[Any]:
        # A context per table: the suites share nothing, so their Spark jobs can run side by side.
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False)  # a scheduler's log is no terminal
        suite = context.suites.add(gx.ExpectationSuite(name=f"{table}-{run_id}"))
        for expectation in expectations:
            suite.add_expectation(expectation)
        batch = context.data_sources.add_spark("snapshot").add_dataframe_asset(table)\
            .add_batch_definition_whole_dataframe("run")
        validation = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"{table}-{run_id}", data=batch, suite=suite))
        return list(validation.run(batch_parameters={"dataframe": frame}).results)

    # Most of a validation's time is the latency of its many small Spark jobs, not work.
    with ThreadPoolExecutor(max_workers=len(suites) or 1, thread_name_prefix="gates") as pool:
        outcomes = [(table, pool.submit(validate, table, frame, expectations))
                    for table, frame, expectations in suites]
        for table, outcome in outcomes:
            results = outcome.result()
            result.checked += len(results)
            result.failures += [f"{table}: {_describe(r)}" for r in results if not r.success]
    return result
