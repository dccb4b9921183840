"""What every table engine shares: the errors, the result type, and schema enforcement.

Schema rules are checked here, before any engine writes, so both engines accept and refuse the
same appends: columns are matched by name (order does not matter, the table's order is used),
types must be equal, and nullability is not a type difference: a NOT NULL column accepts a
nullable column whose rows hold no nulls, and fails the write otherwise.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from sweeper.tables.files import NotNullViolation, TablesWriter, check_not_null, is_local

# Keys we add to every commit's metadata (user keys cannot override them).
COMMIT_ID_KEY = "sweeper.commit_id"
TABLE_KEY = "sweeper.table"
ENGINE_KEY = "sweeper.engine"
ROWS_KEY = "sweeper.rows"
FILES_KEY = "sweeper.files"

PARTITION_TYPES = (StringType, IntegerType, LongType, ShortType, ByteType, BooleanType, DateType)
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class TableNotFoundError(LookupError):
    """No Delta table (or no such version of it) at the path."""


class TableSchemaError(ValueError):
    """Data whose columns or types don't match the table's; nothing was committed."""


@dataclass(frozen=True)
class TaskAppender:
    """Appends rows to one table from any process (a Spark task, its driver), each call one small Delta commit
    through delta-rs, whatever engine the store uses: for what must be on record before the driver hears of it.
    Blind appends of concurrent writers do not conflict (delta-rs retries the commit on the next version)."""

    uri: str
    schema: pa.Schema
    storage_options: dict[str, str]

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        from deltalake import write_deltalake

        write_deltalake(self.uri, pa.Table.from_pylist(list(rows), schema=self.schema), mode="append",
                        storage_options=self.storage_options or None)


@dataclass(frozen=True)
class CommitResult:
    table: str
    version: int  # Delta table version created by this commit (the current one when nothing was committed)
    rows: int
    files: int
    engine: str


# --------------------------------------------------------------------------- schema helpers


def loose_type(dtype: DataType) -> DataType:
    """The type with nullability and field metadata erased: what "same type" means here."""
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, loose_type(f.dataType), True) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(loose_type(dtype.elementType), True)
    if isinstance(dtype, MapType):
        return MapType(loose_type(dtype.keyType), loose_type(dtype.valueType), True)
    return dtype


def schema_problems(actual: StructType, expected: StructType) -> list[str]:
    """Differences between `actual` (the data) and `expected` (the table), as readable lines."""
    have = {f.name: f.dataType for f in actual.fields}
    want = {f.name: f.dataType for f in expected.fields}
    problems = []
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    if missing:
        problems.append(f"missing column(s): {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected column(s): {', '.join(extra)}")
    for name, dtype in want.items():
        if name in have and loose_type(have[name]) != loose_type(dtype):
            problems.append(f"column {name!r}: data has {have[name].simpleString()}, table has {dtype.simpleString()}")
    if len(have) != len(actual.fields):
        problems.append("duplicate column names in the data")
    return problems


def arrow_schema(schema: StructType) -> pa.Schema:
    """Arrow schema of the table's Parquet files, exactly as Delta maps the Spark/Delta types
    (timestamp -> timestamp[us, tz=UTC], timestamp_ntz -> timestamp[us], map entries key/value)."""
    from deltalake import Schema as DeltaSchema

    return pa.schema(DeltaSchema.from_json(schema.json()).to_arrow())


def check_aggregates(aggregates: Sequence[tuple[str, str]], known: frozenset[str]) -> None:
    unknown = sorted({fn for _, fn in aggregates} - known)
    if unknown or not aggregates:
        raise ValueError(f"aggregate_arrow: unknown functions {unknown} (known: {sorted(known)})" if unknown
                         else "aggregate_arrow: no aggregates")


def is_value_list(value: Any) -> bool:
    """Whether a `read_arrow` condition is a choice of values rather than one value."""
    return isinstance(value, list | tuple | set | frozenset)


def filtered(df: DataFrame, where: Mapping[str, Any] | None) -> DataFrame:
    """`df`'s rows matching `where` (as in TableStore.read_arrow) as a Spark filter."""
    from pyspark.sql import functions as F

    for column, value in (where or {}).items():
        df = df.where(F.col(column).isin(list(value)) if is_value_list(value) else F.col(column) == value)
    return df


_SCALAR_TYPES = frozenset({str, int, float, bool, bytes, type(None), datetime})


def _plain(value: Any) -> Any:
    if type(value) in _SCALAR_TYPES:  # most values: nothing to unwrap
        return value
    if isinstance(value, list) and all(type(v) in _SCALAR_TYPES for v in value):
        return value
    if isinstance(value, Row) and hasattr(value, "__fields__"):
        return value.asDict(recursive=True)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and not isinstance(value, Row):
        return [_plain(v) for v in value]
    return value


def rows_to_arrow(name: str, rows: Sequence[Mapping[str, Any] | Row | tuple], schema: StructType) -> pa.Table:
    """Driver-side rows as an Arrow table of the table's types. Naive datetimes are taken as UTC."""
    names = schema.fieldNames()
    known = set(names)
    records = []
    for i, row in enumerate(rows):
        if isinstance(row, Row) and hasattr(row, "__fields__"):
            record = row.asDict(recursive=True)
        elif isinstance(row, Mapping):
            record = {k: _plain(v) for k, v in row.items()}
        elif isinstance(row, tuple | list):
            if len(row) != len(names):
                raise TableSchemaError(f"table {name!r}: row {i} has {len(row)} values for {len(names)} columns")
            record = {k: _plain(v) for k, v in zip(names, row, strict=True)}
        else:
            raise TableSchemaError(f"table {name!r}: row {i} is a {type(row).__name__}, not a dict or Row")
        unknown = [k for k in record if k not in known]
        if unknown:
            # Silently dropping a misspelt key would store a null where the caller meant a value.
            raise TableSchemaError(f"table {name!r}: row {i} has unknown column(s) {', '.join(map(str, unknown))}")
        records.append(record)
    target = arrow_schema(schema)
    try:
        table = pa.Table.from_pylist(records, schema=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise TableSchemaError(f"table {name!r}: rows don't fit the table schema: {exc}") from exc
    for i, fld in enumerate(target):
        check_not_null(table.column(i).combine_chunks(), fld, fld.name, name)
    return table


def to_millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def parse_user_metadata(value: Any) -> dict[str, str]:
    if not value:
        return {}
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return {"userMetadata": str(value)}
    if not isinstance(parsed, dict):
        return {"userMetadata": str(value)}
    return {str(k): str(v) for k, v in parsed.items()}


def history_entry(version: int, timestamp: Any, operation: Any, parameters: Any, metrics: Any,
                  user_metadata: Any, engine_info: Any) -> dict[str, Any]:
    """One commit, in the same shape for both engines."""
    metadata = parse_user_metadata(user_metadata)
    metrics = dict(metrics or {})
    # Rows added: our delta-rs commits record it in their metadata, Delta-Spark and delta-rs's own
    # writer in their operation metrics.
    rows = metadata.get(ROWS_KEY, metrics.get("numOutputRows", metrics.get("num_added_rows")))
    return {
        "version": int(version),
        "timestamp": to_millis(timestamp),  # ms since the epoch, UTC
        "operation": operation,
        "rows": int(rows) if rows is not None else None,
        "operation_parameters": dict(parameters or {}),
        "operation_metrics": metrics,
        "metadata": metadata,  # what append(commit_metadata=...) recorded, plus sweeper.* keys
        "engine_info": engine_info,
    }


def normalize_root(root: str) -> str:
    if not root:
        raise ValueError("table root is empty")
    if is_local(root):
        local = urlparse(root).path if root.startswith("file:") else root
        return os.path.abspath(os.path.expanduser(local))
    return root.rstrip("/")


# --------------------------------------------------------------------------- the API


class TableStore(ABC):
    """Named Delta tables under one root; `name` lives at f"{root}/{name}".

    Every append is one atomic Delta commit (or none). History of each commit carries the
    caller's `commit_metadata` plus `sweeper.commit_id`, `sweeper.table` and `sweeper.engine`.
    """

    engine: ClassVar[str] = ""

    def __init__(self, root: str, spark: SparkSession, storage_options: dict[str, str] | None = None) -> None:
        self.root = normalize_root(root)
        self.spark = spark
        # Credentials may be in here: never log or repr them.
        self._storage_options = dict(storage_options or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r}, engine={self.engine!r})"

    def path(self, name: str) -> str:
        if not _TABLE_NAME.match(name or ""):
            raise ValueError(f"bad table name {name!r}: letters, digits, '_', '.', '-' only")
        return f"{self.root}/{name}"

    def task_appender(self, name: str, schema: StructType) -> TaskAppender:
        """A picklable appender for `name` (created here, empty, when it does not exist yet, so concurrent
        tasks never race to create it)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        appender = TaskAppender(self.path(name), to_arrow_schema(schema, timezone="UTC"), dict(self._storage_options))
        if not self.exists(name):
            from deltalake import write_deltalake

            write_deltalake(appender.uri, appender.schema.empty_table(), mode="append",
                            storage_options=appender.storage_options or None)
        return appender

    # ---- per-engine

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    @abstractmethod
    def version(self, name: str) -> int | None:
        """Latest version, or None when there is no table."""

    @abstractmethod
    def history(self, name: str) -> list[dict[str, Any]]:
        """Commits newest first: version, timestamp (ms), operation, rows (added, when known),
        operation_parameters, operation_metrics, metadata (the commit_metadata given to append,
        plus sweeper.commit_id/table/engine), engine_info."""

    @abstractmethod
    def read(self, name: str, version: int | None = None, where: Mapping[str, Any] | None = None) -> DataFrame:
        """The table (or an earlier version of it) as a Spark DataFrame; with `where` (as in read_arrow), only the
        rows matching it. Give the condition here rather than filtering the frame: an engine that knows which
        files can hold such rows hands Spark only those (a table of a run a day holds a year of runs)."""

    def run_frames(self, tables: Mapping[str, StructType], run_id: str) -> dict[str, DataFrame]:
        """Each table's rows of one run. A table a store written by an earlier version does not have yet reads as
        empty, in its schema, so a stage reading a run's tables need not know which version wrote them."""
        from concurrent.futures import ThreadPoolExecutor


        def frame(name: str, schema: StructType) -> DataFrame:
            return (self.read(name, where={"run_id": run_id}) if self.exists(name)
                    else self.spark.createDataFrame([], schema))

        # A read is mostly the JVM resolving the table's files and schema, a round trip each: a dozen tables side
        # by side instead of one after the other (each thread has its own JVM thread, PySpark's pinned threads).
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {name: pool.submit(frame, name, schema) for name, schema in tables.items()}
            return {name: future.result() for name, future in futures.items()}

    @abstractmethod
    def layout(self, name: str) -> tuple[StructType, list[str]] | None:
        """(schema, partition columns) of the table, or None when there is none."""

    def read_arrow(self, name: str, where: Mapping[str, Any] | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """The latest version's rows matching `where`, as Arrow on the driver: for the small reads around a
        stage (a run's policies, a few ledgers by id), which do not need a Spark job each.

        `where` maps a column to a value (equal to it) or to a list, tuple, set or frozenset (one of them;
        an empty one matches nothing); conditions are ANDed, and a null never matches. `columns`: those
        only, in that order (default: all). This default runs the filter as a Spark job; an engine that
        reads the table itself overrides it.
        """
        df = self.read(name, where=where)
        return df.select(*(columns or df.columns)).toArrow()

    AGGREGATES: ClassVar[frozenset[str]] = frozenset({"min", "max", "sum", "count"})

    def aggregate_arrow(self, name: str, keys: Sequence[str], aggregates: Sequence[tuple[str, str]],
                        where: Mapping[str, Any] | None = None) -> pa.Table:
        """The latest version's rows matching `where` (as in read_arrow), grouped by `keys`, as Arrow on the
        driver: one row per group, the keys then a column `<column>_<function>` per aggregate, for the per-group
        facts of a table too large to bring to the driver itself. Functions: min, max, sum, count (of non-null
        values; min, max and sum skip nulls and are null for a group with none). Groups come in no set order.
        This default is a Spark job; an engine that reads the table itself overrides it.
        """
        from pyspark.sql import functions as F

        check_aggregates(aggregates, self.AGGREGATES)
        df = self.read(name, where=where)
        functions = {"min": F.min, "max": F.max, "sum": F.sum, "count": F.count}
        columns = [functions[fn](column).alias(f"{column}_{fn}") for column, fn in aggregates]
        return df.groupBy(*keys).agg(*columns).toArrow()

    @abstractmethod
    def _append_frame(self, name: str, df: DataFrame, schema: StructType, partition_by: list[str],
                      create: bool, metadata: dict[str, str]) -> CommitResult: ...

    @abstractmethod
    def _append_arrow(self, name: str, table: pa.Table, schema: StructType, partition_by: list[str],
                      create: bool, metadata: dict[str, str]) -> CommitResult: ...

    # ---- shared

    def append(self, name: str, df: DataFrame, schema: StructType | None = None,
               partition_by: list[str] | None = None, *,
               commit_metadata: Mapping[str, Any] | None = None) -> CommitResult:
        """Append all rows of `df` in ONE Delta commit, creating the table (with `schema`, else
        df.schema, and `partition_by`) when missing.

        A df with zero rows creates a missing table (that commit is the result) and otherwise
        commits nothing: the result then carries the current version and rows=0, files=0.
        Raises TableSchemaError, before anything is written, when the columns or types differ
        from the table's (or from `schema`); rows with nulls in NOT NULL columns fail the write.
        """
        table_schema, parts, create = self._resolve(name, schema, df.schema, partition_by)
        problems = schema_problems(df.schema, table_schema)
        if problems:
            raise TableSchemaError(f"cannot append to table {name!r} at {self.path(name)}: " + "; ".join(problems))
        aligned = df.select(*[df[c] for c in table_schema.fieldNames()])
        return self._append_frame(name, aligned, table_schema, parts, create, self._metadata(name, commit_metadata))

    def append_arrow_frame(self, name: str, source: DataFrame,
                           to_batches: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
                           schema: StructType, *, commit_metadata: Mapping[str, Any] | None = None) -> CommitResult:
        """append() of the rows `to_batches` makes, inside the Spark tasks, from `source`'s Arrow batches.

        For producers that already hold Arrow (the snapshot's packed scan output). This default
        turns them into a DataFrame and appends it; an engine that writes Arrow itself can skip
        the round trip through the JVM.
        """
        return self.append(name, source.mapInArrow(to_batches, schema), schema, commit_metadata=commit_metadata)

    def append_arrow_frames(self, source: DataFrame, route: str,
                            to_batches: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
                            schemas: Mapping[str, StructType], *,
                            commit_metadata: Mapping[str, Any] | None = None) -> dict[str, CommitResult]:
        """append_arrow_frame() into several tables at once: `source`'s column `route` names the table of each
        row, and `to_batches` makes that table's rows from its rows of `source`. One commit per table (each
        table is its own Delta log, so the tables are not committed atomically together); a table of
        `schemas` with no rows is created when missing. This default runs a job per table, from a few driver
        threads so that Spark runs them side by side; an engine that writes Arrow itself does it in one job.
        """
        from concurrent.futures import ThreadPoolExecutor

        from pyspark.sql import functions as F

        with ThreadPoolExecutor(max_workers=4) as pool:
            commits = {name: pool.submit(self.append_arrow_frame, name, source.where(F.col(route) == name),
                                         to_batches, schema, commit_metadata=commit_metadata)
                       for name, schema in schemas.items()}
            return {name: future.result() for name, future in commits.items()}

    def task_writer(self, schemas: Mapping[str, StructType]) -> TablesWriter | None:
        """A picklable writer of these tables' data files, for the Spark tasks that make the rows (and for the
        driver), whose file records `commit_written` commits: a producer then writes as it goes, in its own job,
        with nothing cached or read twice. Missing tables are created by that commit. None (this default) when
        the engine writes only through Spark: the producer then hands its rows to `append_arrow_frames`.
        Raises TableSchemaError, before anything is written, when a table exists with another schema."""
        return None

    def commit_written(self, writer: TablesWriter, records: Mapping[str, Sequence[Mapping[str, Any]]], *,
                       commit_metadata: Mapping[str, Any] | None = None) -> dict[str, CommitResult]:
        """One Delta commit per table of `writer` (each table its own log, so not atomically together) of the
        file records its writers returned (table -> records; a table without records is created when missing
        and otherwise gets no commit, as append_arrow_frames). Only for a store whose task_writer gave one."""
        raise NotImplementedError(f"the {self.engine} engine writes through Spark only (task_writer is None)")

    def append_rows(self, name: str, rows: Sequence[Mapping[str, Any] | Row], schema: StructType, *,
                    commit_metadata: Mapping[str, Any] | None = None) -> CommitResult:
        """append() for a few rows built on the driver (runs, quarantine): dicts keyed by column
        (missing keys are null, unknown keys are an error) or Rows. Naive datetimes mean UTC."""
        table_schema, parts, create = self._resolve(name, schema, schema, None)
        table = rows_to_arrow(name, list(rows), table_schema)
        return self._append_arrow(name, table, table_schema, parts, create, self._metadata(name, commit_metadata))

    def append_columns(self, name: str, columns: Mapping[str, Sequence[Any]], schema: StructType, *,
                       commit_metadata: Mapping[str, Any] | None = None) -> CommitResult:
        """append_rows() for many driver-side rows held as columns (name -> values; missing columns are
        null): one Arrow conversion per column instead of one per value. Datetimes must be timezone-aware."""
        table_schema, parts, create = self._resolve(name, schema, schema, None)
        unknown = set(columns) - set(table_schema.fieldNames())
        if unknown:
            raise TableSchemaError(f"table {name!r}: unknown column(s) {', '.join(sorted(unknown))}")
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise TableSchemaError(f"table {name!r}: columns of different lengths {sorted(lengths)}")
        rows = lengths.pop() if lengths else 0
        target = arrow_schema(table_schema)
        try:
            arrays = [pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(rows, f.type)
                      for f in target]
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise TableSchemaError(f"table {name!r}: columns don't fit the table schema: {exc}") from exc
        table = pa.Table.from_arrays(arrays, schema=target)
        for i, fld in enumerate(target):
            check_not_null(table.column(i).combine_chunks(), fld, fld.name, name)
        return self._append_arrow(name, table, table_schema, parts, create, self._metadata(name, commit_metadata))

    def _resolve(self, name: str, schema: StructType | None, fallback: StructType,
                 partition_by: list[str] | None) -> tuple[StructType, list[str], bool]:
        """(schema, partition columns, whether the table must be created)."""
        layout = self.layout(name)
        if layout is not None:
            table_schema, table_parts = layout
            if schema is not None:
                problems = schema_problems(schema, table_schema)
                if problems:
                    raise TableSchemaError(
                        f"table {name!r} at {self.path(name)} has another schema than the one given: "
                        + "; ".join(problems))
            if partition_by is not None and list(partition_by) != list(table_parts):
                raise TableSchemaError(
                    f"table {name!r} is partitioned by {table_parts}, not {list(partition_by)}")
            return table_schema, list(table_parts), False
        table_schema = schema if schema is not None else fallback
        parts = list(partition_by or [])
        for col in parts:
            if col not in table_schema.fieldNames():
                raise TableSchemaError(f"table {name!r}: partition column {col!r} is not in the schema")
            if not isinstance(table_schema[col].dataType, PARTITION_TYPES):
                raise TableSchemaError(
                    f"table {name!r}: partition column {col!r} has type {table_schema[col].dataType.simpleString()}; "
                    "use string, integral, boolean or date")
        if len(set(table_schema.fieldNames())) != len(table_schema.fields):
            raise TableSchemaError(f"table {name!r}: duplicate column names in {table_schema.fieldNames()}")
        return table_schema, parts, True

    def _metadata(self, name: str, commit_metadata: Mapping[str, Any] | None) -> dict[str, str]:
        metadata = {str(k): str(v) for k, v in (commit_metadata or {}).items()}
        metadata.update({COMMIT_ID_KEY: uuid.uuid4().hex, TABLE_KEY: name, ENGINE_KEY: self.engine})
        return metadata


__all__ = [
    "CommitResult",
    "NotNullViolation",
    "TableNotFoundError",
    "TableSchemaError",
    "TableStore",
]
