"""The data-quality gates on both of their engines: what a test checks, it checks on each."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime

from sweeper import runs
from sweeper.config import GatesConfig
from sweeper.reconcile.gates import GateResult, run_gates
from sweeper.tables import TableStore


def gates_on_both_engines(store: TableStore, run_id: str, config: GatesConfig) -> GateResult:
    """The gates on the driver (a test's snapshot is small) and with Spark jobs (`driver_rows = 0`, as a large
    snapshot is); the two must agree on every failure and on how many expectations ran."""
    on_driver = run_gates(store, run_id, dataclasses.replace(config, driver_rows=10**9))
    with_spark = run_gates(store, run_id, dataclasses.replace(config, driver_rows=0))
    assert on_driver.failures == with_spark.failures, (on_driver.failures, with_spark.failures)
    assert on_driver.checked == with_spark.checked
    return on_driver


def record_gated_reconcile(store: TableStore, run_id: str, counts: runs.StageCounts | Mapping[str, int],
                           config: runs.ConfigHash | None, started: datetime | None = None) -> None:
    """The `runs` row of a reconcile a test ran itself (`run_reconcile` with its own clock or settings) where the
    gates are not what it tests, as `pipeline.reconcile_stage` records a gated one: emit and delete act only on a
    run whose gates passed (`runs.gates_passed`)."""
    row = counts.as_row() if isinstance(counts, runs.StageCounts) else dict(counts)
    runs.record(store, run_id, "reconcile", runs.SUCCEEDED, started or datetime.now(UTC),
                {**row, runs.GATES_PASSED: 1}, config)
