"""Data-quality gates on a snapshot, with great-expectations, before anything is planned.

A snapshot that is empty, partial, or much smaller than the last good one means the scan (or
the metadata store) went wrong: planning deletions from it would turn every ledger it missed
into an "orphan". Gates fail the run with a readable list of what failed.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sweeper import runs
from sweeper.broker.liveness import Liveness, liveness_problems
from sweeper.config import GatesConfig, SweeperConfig
from sweeper.rules.references import PEER_OWNER, PEER_REFERENCE
from sweeper.tables import TableStore
from sweeper.vocabulary import LISTING_FAILED

log = logging.getLogger(__name__)
logging.getLogger("great_expectations").setLevel(logging.WARNING)


@dataclass
class GateResult:
    run_id: str
    failures: list[str] = field(default_factory=list)
    checked: int = 0
    baseline: str | None = None  # the run whose snapshot the shrink gate compared with (None: no earlier good run)
    on_driver: bool = False  # validated on the driver (a snapshot of at most [gates] driver_rows), else Spark jobs
    driver_rows: int = 0  # the limit that chose the engine ([gates] driver_rows, or what "auto" made of it)

    @property
    def passed(self) -> bool:
        return not self.failures


def _runs(store: TableStore) -> list[dict[str, Any]]:
    return runs.rows(store, stage="snapshot", status=runs.SUCCEEDED)


def baseline(snapshots: list[dict[str, Any]], reconciles: list[dict[str, Any]],
             run_id: str) -> dict[str, Any] | None:
    """The snapshot row the shrink gate compares `run_id`'s with: the newest earlier snapshot whose run's reconcile
    passed the gates (`runs.gates_passed`). A snapshot the gates refused, one reconciled with --skip-gates, and one
    never reconciled are no baseline: a second bad snapshot compared with the first would pass. A run the breaker
    or the missing-reference gate refused after its gates passed is none either (its snapshot may be the broken one
    those caught). `snapshots`: succeeded snapshot rows, oldest first."""
    this = next((r for r in snapshots if r["run_id"] == run_id), None)
    if this is None:
        return None
    good = {r["run_id"] for r in reconciles if runs.gates_passed(r)}
    earlier = [r for r in snapshots if r["started_at"] < this["started_at"] and r["run_id"] in good]
    return earlier[-1] if earlier else None


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


# The tables the gates read, and the columns they need (the driver reads no others).
GATED: dict[str, tuple[str, ...]] = {
    "bk_ledgers": ("ledger_id", "path", "zk_version", "created_ms", "is_pulsar", "component", "cursor",
                   "managed_ledger"),
    "managed_ledgers": ("managed_ledger", "zk_mtime_ms"),
    "ml_ledgers": ("managed_ledger", "ledger_id"),
    "ml_cursors": ("managed_ledger", "cursor", "cursors_ledger_id", "zk_mtime_ms"),
    "schema_ledgers": ("ledger_id",),
    "quarantine": ("path", "error_kind"),
    # Whose data ledgers measure this cluster's lag (`newest_data_ledger`).
    "namespaces": ("namespace",),
    "peer_references": ("kind", "ledger_id", "owner"),
}
VALIDATED = ("bk_ledgers", "managed_ledgers", "ml_ledgers", "ml_cursors", "schema_ledgers")
# Only a topic's data ledgers measure the metadata lag. The broker tags them `application=pulsar`,
# `component=managed-ledger` (LedgerMetadataUtils.buildBaseManagedLedgerMetadata); a cursor's ledger carries the
# same plus `pulsar/cursor` (buildAdditionalMetadataForCursor), so a data ledger is one without a cursor. Both
# engines below apply this one predicate, each in its own expression language.
DATA_LEDGER_COMPONENT = "managed-ledger"
# And only this cluster's: BookKeeper's ledger metadata names no cluster (LedgerMetadataFormat has no such field), so on
# bookies shared with a peer (`[safety] peer_metadata`) the peer's fresh ledgers say nothing about this cluster's
# metadata. A data ledger is this cluster's unless the snapshot proves otherwise: a peer references it; its
# `pulsar/managed-ledger` exists at a peer and not here; or that name's namespace is not one this cluster's metadata
# knows (`namespaces`: /managed-ledgers and /admin/policies; skipped on a dedicated BookKeeper). A ledger whose
# managed ledger is missing or does not parse is counted: an owner nobody can name must not let a stale store pass.
# The namespace of `tenant/ns/persistent/<topic>` (or old `tenant/cluster/ns/persistent/<topic>`), as
# names.parse_managed_ledger splits it; the same pattern for Java's regex (Spark) and RE2 (Arrow).
NAMESPACE_OF_MANAGED_LEDGER = r"^([^/]+/[^/]+(?:/[^/]+)?)/persistent/[^/]+$"


class _SparkRows:
    """The run's rows as Spark frames, for a snapshot too large for the driver. Each frame is held once for every
    check (a count, GX's many small jobs, the liveness maxima); otherwise each job reads the table's files again."""

    def __init__(self, store: TableStore, run_id: str) -> None:
        self.frames: dict[str, DataFrame] = {
            table: store.read(table, where={"run_id": run_id}).persist(StorageLevel.MEMORY_AND_DISK)
            for table in GATED if store.exists(table)}

    def has(self, table: str) -> bool:
        return table in self.frames

    def count(self, table: str) -> int:
        return self.frames[table].count() if table in self.frames else 0

    def newest(self, table: str, column: str) -> int | None:
        if table not in self.frames:
            return None
        value = self.frames[table].agg(F.max(column)).first()[0]
        return int(value) if value is not None else None

    def newest_data_ledger(self, dedicated: bool) -> int | None:
        """When this cluster's newest data ledger was created (see DATA_LEDGER_COMPONENT); None: it has none."""
        if "bk_ledgers" not in self.frames:
            return None
        spark = self.frames["bk_ledgers"].sparkSession
        frame = self.frames["bk_ledgers"].where((F.col("component") == DATA_LEDGER_COMPONENT)
                                                & F.col("cursor").isNull() & F.col("is_pulsar"))
        if not dedicated:
            peers = self.frames.get("peer_references")
            if peers is not None:
                frame = frame.join(peers.where((F.col("kind") == PEER_REFERENCE) & F.col("ledger_id").isNotNull())
                                   .select("ledger_id").distinct(), "ledger_id", "left_anti")
                peer_only = (peers.where((F.col("kind") == PEER_OWNER) & F.col("owner").isNotNull())
                             .select(F.col("owner").alias("managed_ledger")).distinct())
                if "managed_ledgers" in self.frames:
                    peer_only = peer_only.join(self.frames["managed_ledgers"].select("managed_ledger"),
                                               "managed_ledger", "left_anti")
                frame = frame.join(peer_only, "managed_ledger", "left_anti")  # a null name matches nothing: kept
            known = (self.frames["namespaces"].select(F.col("namespace").alias("_ns")).distinct()
                     if "namespaces" in self.frames else spark.createDataFrame([], "_ns string"))
            ml = F.col("managed_ledger")
            namespace = F.when(ml.rlike(NAMESPACE_OF_MANAGED_LEDGER),
                               F.regexp_extract(ml, NAMESPACE_OF_MANAGED_LEDGER, 1))
            frame = (frame.withColumn("_of", namespace)
                     .join(known.withColumn("_known", F.lit(True)), F.col("_of") == F.col("_ns"), "left")
                     .where(F.col("_of").isNull() | F.col("_known").isNotNull()))
        value = frame.agg(F.max("created_ms")).first()[0]
        return int(value) if value is not None else None

    def unlisted_buckets(self) -> list[str]:
        if "quarantine" not in self.frames:
            return ["?"]
        return sorted(r["path"] for r in self.frames["quarantine"].where(F.col("error_kind") == LISTING_FAILED)
                      .select("path").distinct().collect())

    def batch(self, context: Any, table: str) -> tuple[Any, Any]:
        asset = context.data_sources.add_spark("snapshot").add_dataframe_asset(table)
        return asset.add_batch_definition_whole_dataframe("run"), self.frames[table]

    def release(self) -> None:
        for frame in self.frames.values():
            frame.unpersist()


class _DriverRows:
    """The run's rows on the driver (Arrow, then pandas for GX): a sandbox's or a small cluster's snapshot is
    validated in well under a second, where GX's Spark jobs cost 5-15 s of small-job latency a run. The checks
    and expectations are the same; `tests/test_gates.py` runs both engines on the same snapshots."""

    def __init__(self, store: TableStore, run_id: str) -> None:
        self.tables: dict[str, pa.Table] = {
            table: store.read_arrow(table, where={"run_id": run_id}, columns=list(columns))
            for table, columns in GATED.items() if store.exists(table)}

    def has(self, table: str) -> bool:
        return table in self.tables

    def count(self, table: str) -> int:
        return self.tables[table].num_rows if table in self.tables else 0

    def newest(self, table: str, column: str) -> int | None:
        if table not in self.tables:
            return None
        rows = self.tables[table]
        value = pc.max(rows[column]).as_py() if rows.num_rows else None
        return int(value) if value is not None else None

    def newest_data_ledger(self, dedicated: bool) -> int | None:
        """As `_SparkRows.newest_data_ledger`, with Arrow: the same predicate, the same null handling."""
        if "bk_ledgers" not in self.tables:
            return None
        rows = self.tables["bk_ledgers"]
        keep = pc.and_kleene(pc.and_kleene(pc.equal(rows["component"], DATA_LEDGER_COMPONENT),
                                           pc.is_null(rows["cursor"])), rows["is_pulsar"])
        rows = rows.filter(keep)  # a null in the mask drops the row, as Spark's where does
        if not dedicated and rows.num_rows:
            peers = self.tables.get("peer_references")
            if peers is not None:
                refs = peers.filter(pc.equal(peers["kind"], PEER_REFERENCE))["ledger_id"].drop_null()
                owners = set(peers.filter(pc.equal(peers["kind"], PEER_OWNER))["owner"].drop_null().to_pylist())
                ours = (set(self.tables["managed_ledgers"]["managed_ledger"].drop_null().to_pylist())
                        if "managed_ledgers" in self.tables else set())
                rows = rows.filter(pc.invert(pc.is_in(rows["ledger_id"], value_set=refs.combine_chunks())))
                # is_in: a null name is in no set without nulls, so it is kept (as by Spark's anti-join)
                rows = rows.filter(pc.invert(pc.is_in(rows["managed_ledger"],
                                                      value_set=pa.array(sorted(owners - ours), pa.string()))))
            known = (self.tables["namespaces"]["namespace"].drop_null().combine_chunks()
                     if "namespaces" in self.tables else pa.array([], pa.string()))
            pattern = NAMESPACE_OF_MANAGED_LEDGER.replace("^(", "^(?P<namespace>", 1)
            # A struct that is null where the name does not match; flatten() carries that null to the field.
            namespace = pc.extract_regex(rows["managed_ledger"].combine_chunks(), pattern).flatten()[0]
            rows = rows.filter(pc.or_(pc.is_null(namespace), pc.is_in(namespace, value_set=known)))
        value = pc.max(rows["created_ms"]).as_py() if rows.num_rows else None
        return int(value) if value is not None else None

    def unlisted_buckets(self) -> list[str]:
        if "quarantine" not in self.tables:
            return ["?"]
        rows = self.tables["quarantine"]
        return sorted(set(rows.filter(pc.equal(rows["error_kind"], LISTING_FAILED))["path"].to_pylist()))

    def batch(self, context: Any, table: str) -> tuple[Any, Any]:
        asset = context.data_sources.add_pandas("snapshot").add_dataframe_asset(table)
        return asset.add_batch_definition_whole_dataframe("run"), self.tables[table].to_pandas()

    def release(self) -> None:
        self.tables.clear()


def snapshot_liveness(rows: _SparkRows | _DriverRows, recorded: dict[str, int], dedicated: bool = False) -> Liveness:
    """What the run's snapshot says about this cluster's metadata being live (see sweeper.broker.liveness): its own
    managed-ledger and cursor changes against its own newest data ledger, never a peer's on shared bookies."""
    changes = [v for v in (rows.newest("managed_ledgers", "zk_mtime_ms"), rows.newest("ml_cursors", "zk_mtime_ms"))
               if v is not None]
    return Liveness(int(recorded.get("live_brokers", 0)), max(changes) if changes else None,
                    rows.newest_data_ledger(dedicated))


# What the driver engine holds a gated row at, at its peak: Arrow, pandas' copy of one table at a time and GX's
# own objects; bench/bench_gates.py measured 178 B at 0.46M rows and 258 B at 2.3M, budgeted with room to spare.
DRIVER_BYTES_PER_ROW = 400
# The share of the memory still free that the gates may take: the JVM, the Python workers and the next stage's
# reads need the rest (a local-mode driver shares the machine with its executors).
DRIVER_MEMORY_SHARE = 4
# When nothing says how much memory is free (not Linux): a 1 GiB driver's worth, spark-submit's default.
DRIVER_ROWS_FALLBACK = 1_000_000


def driver_row_limit(setting: int | str, available_bytes: int | None) -> int:
    """The most gated rows validated on the driver: [gates] driver_rows as set, or for "auto" as many as a quarter
    of `available_bytes` holds. On this project's 24 GiB bench machine that is 8-16M rows, so a million-ledger
    snapshot (2.5M rows) is validated in ~5 s on the driver, where GX's ~30 Spark jobs took ~23 s; a driver with
    1 GiB still free gets ~650k rows, one whose container is nearly full (its JVM's heap) far fewer."""
    if setting != "auto":
        return int(setting)
    if available_bytes is None:
        return DRIVER_ROWS_FALLBACK
    return max(0, available_bytes) // DRIVER_MEMORY_SHARE // DRIVER_BYTES_PER_ROW


def memory_available(proc: str = "/proc", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes this process can still get: the kernel's MemAvailable, or less where its cgroup's limit (a driver
    container's) leaves less; None when neither can be read."""
    found: list[int] = []
    try:
        for line in Path(proc, "meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError):
        pass
    for limit_file, usage_file in (("memory.max", "memory.current"),  # cgroup v2
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):  # v1
        try:
            limit = Path(cgroup, limit_file).read_text(encoding="ascii").strip()
            usage = int(Path(cgroup, usage_file).read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's huge number: no limit
            found.append(max(0, int(limit) - usage))
        break
    return min(found) if found else None


@dataclass(frozen=True)
class GateSettings:
    """What the gates read of the config, narrowed once (issue 46's stage contract)."""

    gates: GatesConfig
    brokers_path: str = "/loadbalance/brokers"
    dedicated: bool = False  # [safety] bookkeeper_dedicated: every ledger is ours

    @classmethod
    def from_config(cls, config: SweeperConfig) -> GateSettings:
        return cls(config.gates, config.pulsar.brokers_path, config.safety.bookkeeper_dedicated)


def run(store: TableStore, run_id: str, settings: GateSettings) -> GateResult:
    """The gates on `run_id`'s snapshot, as the reconcile stage runs them."""
    return run_gates(store, run_id, settings.gates, settings.brokers_path, dedicated=settings.dedicated)


def run_gates(store: TableStore, run_id: str, config: GatesConfig,
              brokers_path: str = "/loadbalance/brokers", dedicated: bool = False) -> GateResult:
    """The gates on `run_id`'s snapshot. `dedicated`: `[safety] bookkeeper_dedicated`, every ledger is ours."""
    result = GateResult(run_id)
    good_runs = _runs(store)
    this = next((r for r in good_runs if r["run_id"] == run_id), None)
    if this is None:
        result.failures.append(f"no successful snapshot recorded for run {run_id}")
        return result
    previous = baseline(good_runs, runs.rows(store, stage="reconcile", status=runs.SUCCEEDED), run_id)
    result.baseline = previous["run_id"] if previous else None
    recorded = this["counts"] or {}
    # The engine is chosen by what the snapshot recorded, before anything is read.
    result.driver_rows = driver_row_limit(config.driver_rows, memory_available())
    on_driver = sum(int(recorded.get(table, 0)) for table in GATED) <= result.driver_rows
    result.on_driver = on_driver
    rows = _DriverRows(store, run_id) if on_driver else _SparkRows(store, run_id)
    try:
        _check(rows, result, recorded, previous, config, brokers_path, dedicated)
    finally:
        rows.release()
    return result


def _check(rows: _SparkRows | _DriverRows, result: GateResult, recorded: dict[str, int],
           previous: dict[str, Any] | None, config: GatesConfig, brokers_path: str, dedicated: bool) -> None:
    import great_expectations as gx

    run_id = result.run_id
    # A partial or mixed snapshot: what the tables hold for the run must be what the scan counted.
    for table in GATED:
        actual = rows.count(table)
        if actual != recorded.get(table, 0):
            result.failures.append(f"{table} holds {actual} rows for run {run_id}, the snapshot recorded "
                                   f"{recorded.get(table, 0)}: partial or mixed snapshot")
    bk_count = recorded.get("bk_ledgers", 0)
    quarantined = recorded.get("quarantine", 0) - recorded.get("quarantine.pending_delete", 0)
    if bk_count and quarantined > max(10, 0.01 * bk_count):
        result.failures.append(f"{quarantined} znodes quarantined against {bk_count} ledgers: the scan is partial")
    unlisted = recorded.get("quarantine.offload_listing", 0)
    if unlisted and not config.allow_offload_listing_errors:
        buckets = ", ".join(rows.unlisted_buckets())
        result.failures.append(
            f"{unlisted} slice(s) of the offload buckets could not be listed ({buckets}): a partial listing "
            "cannot tell what tiered storage holds. Fix access, or set [gates] allow_offload_listing_errors = true")
    result.failures += liveness_problems(snapshot_liveness(rows, recorded, dedicated), brokers_path,
                                         config.max_metadata_lag_minutes, config.require_live_brokers)

    from great_expectations.data_context.types.base import ProgressBarsConfig

    # It sets its own loggers' levels on import; its INFO lines would fill a scheduler's log.
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)

    pulsar_expected = bool(rows.has("bk_ledgers") and bk_count)
    suites: list[tuple[str, list[Any]]] = []
    for table in VALIDATED:
        floor = 0
        if table == "bk_ledgers" and not config.allow_empty:
            floor = 1
        if table == "managed_ledgers" and pulsar_expected and not config.allow_empty:
            floor = 1
        if previous is not None:
            before = (previous["counts"] or {}).get(table, 0)
            floor = max(floor, int(before * (1 - config.max_drop_fraction)))
        if not rows.has(table):
            if floor:
                result.failures.append(f"{table} does not exist but at least {floor} rows were expected")
            continue
        suites.append((table, _expectations(table, floor)))

    def validate(table: str, expectations: list[Any]) -> list[Any]:
        # A context per table: the suites share nothing, so their Spark jobs can run side by side.
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False)  # a scheduler's log is no terminal
        suite = context.suites.add(gx.ExpectationSuite(name=f"{table}-{run_id}"))
        for expectation in expectations:
            suite.add_expectation(expectation)
        batch, data = rows.batch(context, table)
        validation = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"{table}-{run_id}", data=batch, suite=suite))
        return list(validation.run(batch_parameters={"dataframe": data}).results)

    # Most of a Spark validation's time is the latency of its many small jobs, not work; on the driver, threads
    # gain nothing (pandas holds the GIL).
    workers = len(suites) if isinstance(rows, _SparkRows) else 1
    with ThreadPoolExecutor(max_workers=workers or 1, thread_name_prefix="gates") as pool:
        outcomes = [(table, pool.submit(validate, table, expectations)) for table, expectations in suites]
        for table, outcome in outcomes:
            results = outcome.result()
            result.checked += len(results)
            result.failures += [f"{table}: {_describe(r)}" for r in results if not r.success]
