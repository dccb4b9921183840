"""What every table engine shares: the store's contract (TableStore) and its write path, which enforces the schema
(its helpers: sweeper.tables.schema; the errors: sweeper.tables.errors; a commit's result: sweeper.tables.commits).

Schema rules are checked here, before any engine writes, so both engines accept and refuse the
same appends: columns are matched by name (order does not matter, the table's order is used),
types must be equal, and nullability is not a type difference: a NOT NULL column accepts a
nullable column whose rows hold no nulls, and fails the write otherwise.

Upgrades (schema evolution): a write that declares its table's schema (`schema=`) to an existing table that
lacks some of the declared columns first adds them, nullable, in one Delta commit of their own (`evolution`),
then appends; the table keeps its old columns first and gains the new ones at its end, whatever their place in
the declared schema (Delta's ADD COLUMNS appends; columns are matched by name anyway). Nothing else changes a
table's schema: a declared schema that leaves out, renames or retypes a column, or adds a NOT NULL one, is a
TableSchemaError. Reads return the declared schema's columns, in its order (`read_schema`): a table an earlier
version wrote reads with nulls in the columns added since, as it would once evolved.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from sweeper.table_schemas import ALL_TABLES
from sweeper.tables.arrow_rows import columns_to_arrow, rows_to_arrow
from sweeper.tables.commits import ADDED_KEY, COMMIT_ID_KEY, ENGINE_KEY, TABLE_KEY, CommitResult
from sweeper.tables.conditions import check_aggregates
from sweeper.tables.errors import TableNotFoundError, TableSchemaError
from sweeper.tables.files import TablesWriter, is_local, padded
from sweeper.tables.schema import conformed, evolution, loose_type, schema_problems

log = logging.getLogger(__name__)

PARTITION_TYPES = (StringType, IntegerType, LongType, ShortType, ByteType, BooleanType, DateType)
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class TaskAppender:
    """Appends rows to one table from any process (a Spark task, its driver), each call one small Delta commit
    through delta-rs, whatever engine the store uses: for what must be on record before the driver hears of it.
    Blind appends of concurrent writers do not conflict (delta-rs retries the commit on the next version).

    The table has every column of `schema` (TableStore.task_appender created or evolved it). Should another writer
    add columns to it while the tasks append (an upgraded version's run), an append that finds the table changed
    is made once more with nulls in the columns added, as Delta reads older rows."""

    uri: str
    schema: pa.Schema
    storage_options: dict[str, str]

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        from deltalake.exceptions import CommitFailedError, SchemaMismatchError

        data = pa.Table.from_pylist(list(rows), schema=self.schema)
        try:
            self._write(data)
        except (CommitFailedError, SchemaMismatchError) as exc:
            # Columns added since this appender was made: before our look at the table, its writer refuses rows
            # without them (SchemaMismatchError); between our look and our commit, Delta refuses the commit as
            # one conflicting with that metadata change (CommitFailedError). Our rows still fit, with nulls there.
            from deltalake import DeltaTable

            current = pa.schema(DeltaTable(self.uri, storage_options=self.storage_options or None).schema().to_arrow())
            if isinstance(exc, SchemaMismatchError) and set(current.names) == set(self.schema.names):
                raise  # the same columns: not a change a second try would mend
            log.info("table at %s changed its columns under a task appender (%s): appending once more", self.uri, exc)
            self._write(padded(data, current, self.uri))

    def _write(self, data: pa.Table) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.uri, data, mode="append", storage_options=self.storage_options or None)


def normalize_root(root: str) -> str:
    if not root:
        raise ValueError("table root is empty")
    if is_local(root):
        local = urlparse(root).path if root.startswith("file:") else root
        return os.path.abspath(os.path.expanduser(local))
    return root.rstrip("/")


# --------------------------------------------------------------------------- the API


@dataclass(frozen=True)
class _Target:
    """What a write will append to, before anything is committed (TableStore._target)."""

    schema: StructType  # the table's columns once `added` are (the created table's, for a new one)
    parts: list[str]
    create: bool
    declared: StructType | None = None  # the schema the writer declared, when it declared one
    added: tuple[StructField, ...] = ()  # declared columns the existing table lacks: added before the append


class TableStore(ABC):
    """Named Delta tables under one root; `name` lives at f"{root}/{name}".

    Every append is one atomic Delta commit (or none), preceded, when it declares columns its existing table lacks,
    by the commit that adds them (module doc). History of each commit carries the caller's `commit_metadata` plus
    `sweeper.commit_id`, `sweeper.table` and `sweeper.engine` (and `sweeper.added_columns` on a commit adding some).

    `declared`: each table's schema as this version declares it, which reads return (`read_schema`) unless the
    call names its own; by default the product's tables (sweeper.table_schemas.ALL_TABLES). A table not in it,
    read without `schema=`, reads as it is.
    """

    engine: ClassVar[str] = ""

    def __init__(self, root: str, spark: SparkSession, storage_options: dict[str, str] | None = None, *,
                 declared: Mapping[str, StructType] | None = None) -> None:
        self.root = normalize_root(root)
        self.spark = spark
        # Credentials may be in here: never log or repr them.
        self._storage_options = dict(storage_options or {})
        self.declared: dict[str, StructType] = dict(ALL_TABLES if declared is None else declared)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r}, engine={self.engine!r})"

    def path(self, name: str) -> str:
        if not _TABLE_NAME.match(name or ""):
            raise ValueError(f"bad table name {name!r}: letters, digits, '_', '.', '-' only")
        return f"{self.root}/{name}"

    def task_appender(self, name: str, schema: StructType, *,
                      commit_metadata: Mapping[str, Any] | None = None) -> TaskAppender:
        """A picklable appender for `name` (created here, empty, when it does not exist yet, so concurrent
        tasks never race to create it; given here the columns `schema` declares and it lacks, so the tasks'
        appends find them). Raises TableSchemaError, before any task runs, for a schema the table cannot take."""
        from pyspark.sql.pandas.types import to_arrow_schema

        appender = TaskAppender(self.path(name), to_arrow_schema(schema, timezone="UTC"), dict(self._storage_options))
        if self.exists(name):
            self._resolve(name, schema, schema, None, commit_metadata)
        else:
            from deltalake import write_deltalake

            write_deltalake(appender.uri, appender.schema.empty_table(), mode="append",
                            storage_options=appender.storage_options or None)
        return appender

    def evolve(self, name: str, schema: StructType, *, commit_metadata: Mapping[str, Any] | None = None) -> list[str]:
        """Give the existing table `name` the nullable columns `schema` declares and it lacks, in one commit: what
        every write that declares `schema` does first. Returns the columns the table gained ([] when it had them
        all). Raises TableNotFoundError without the table, TableSchemaError for a change an upgrade may not make."""
        layout = self.layout(name)
        if layout is None:
            raise TableNotFoundError(f"no Delta table {name!r} at {self.path(name)}")
        before = set(layout[0].fieldNames())
        table_schema, _, _ = self._resolve(name, schema, schema, None, commit_metadata)
        return [column for column in table_schema.fieldNames() if column not in before]

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
    def read(self, name: str, version: int | None = None, where: Mapping[str, Any] | None = None,
             schema: StructType | None = None) -> DataFrame:
        """The table (or an earlier version of it) as a Spark DataFrame; with `where` (as in read_arrow), only the
        rows matching it. Give the condition here rather than filtering the frame: an engine that knows which
        files can hold such rows hands Spark only those (a table of a run a day holds a year of runs).

        Its columns are those of `schema` (default: the store's declared schema of `name`) as `read_schema` says:
        a table an earlier version wrote has nulls in the columns added since, and a condition on one of those
        matches no row."""

    def _declared_schema(self, name: str, schema: StructType | None) -> StructType | None:
        return schema if schema is not None else self.declared.get(name)

    def run_frames(self, tables: Mapping[str, StructType], run_id: str) -> dict[str, DataFrame]:
        """Each table's rows of one run, in the schema `tables` gives it. A table a store written by an earlier
        version does not have yet reads as empty, and one that lacks columns added since reads with nulls there,
        so a stage reading a run's tables need not know which version wrote them."""
        from concurrent.futures import ThreadPoolExecutor

        def frame(name: str, schema: StructType) -> DataFrame:
            return (self.read(name, where={"run_id": run_id}, schema=schema) if self.exists(name)
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
                   columns: Sequence[str] | None = None, schema: StructType | None = None) -> pa.Table:
        """The latest version's rows matching `where`, as Arrow on the driver: for the small reads around a
        stage (a run's policies, a few ledgers by id), which do not need a Spark job each.

        `where` maps a column to a value (equal to it) or to a list, tuple, set or frozenset (one of them;
        an empty one matches nothing); conditions are ANDed, and a null never matches. `columns`: those
        only, in that order (default: all). `schema`: as in read(), so a column added since the table was
        written reads as nulls. This default runs the filter as a Spark job; an engine that reads the table
        itself overrides it.
        """
        df = self.read(name, where=where, schema=schema)
        return df.select(*(columns or df.columns)).toArrow()

    AGGREGATES: ClassVar[frozenset[str]] = frozenset({"min", "max", "sum", "count"})

    def aggregate_arrow(self, name: str, keys: Sequence[str], aggregates: Sequence[tuple[str, str]],
                        where: Mapping[str, Any] | None = None, schema: StructType | None = None) -> pa.Table:
        """The latest version's rows matching `where` (as in read_arrow), grouped by `keys`, as Arrow on the
        driver: one row per group, the keys then a column `<column>_<function>` per aggregate, for the per-group
        facts of a table too large to bring to the driver itself. Functions: min, max, sum, count (of non-null
        values; min, max and sum skip nulls and are null for a group with none). Groups come in no set order.
        `schema`: as in read(). This default is a Spark job; an engine that reads the table itself overrides it.
        """
        from pyspark.sql import functions as F

        check_aggregates(aggregates, self.AGGREGATES)
        df = self.read(name, where=where, schema=schema)
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
        A `schema` that adds nullable columns to the existing table adds them first (module doc).
        """
        target = self._target(name, schema, df.schema, partition_by)
        problems = schema_problems(df.schema, target.schema)
        if problems:
            raise TableSchemaError(f"cannot append to table {name!r} at {self.path(name)}: " + "; ".join(problems))
        table_schema, parts, create = self._prepare(name, target, commit_metadata)
        # By name, in the table's order (columns another writer added meanwhile are null in these rows).
        aligned = conformed(df, table_schema)
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

    def task_writer(self, schemas: Mapping[str, StructType], *,
                    commit_metadata: Mapping[str, Any] | None = None) -> TablesWriter | None:
        """A picklable writer of these tables' data files, for the Spark tasks that make the rows (and for the
        driver), whose file records `commit_written` commits: a producer then writes as it goes, in its own job,
        with nothing cached or read twice. Missing tables are created by that commit; existing ones are given here
        the nullable columns their schema adds (`commit_metadata` goes on that commit). None (this default) when
        the engine writes only through Spark: the producer then hands its rows to `append_arrow_frames`.
        Raises TableSchemaError, before anything is written, when a table exists with a schema `schemas` may not
        change into (module doc)."""
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
        rows = list(rows)
        target = self._target(name, schema, schema, None)
        table = rows_to_arrow(name, rows, target.schema)  # bad rows fail here, before any commit (evolution's too)
        table_schema, parts, create = self._prepare(name, target, commit_metadata)
        if table_schema != target.schema:  # another writer changed the table meanwhile: its columns, as they are
            table = rows_to_arrow(name, rows, table_schema)
        return self._append_arrow(name, table, table_schema, parts, create, self._metadata(name, commit_metadata))

    def append_columns(self, name: str, columns: Mapping[str, Sequence[Any]], schema: StructType, *,
                       commit_metadata: Mapping[str, Any] | None = None) -> CommitResult:
        """append_rows() for many driver-side rows held as columns (name -> values; missing columns are
        null): one Arrow conversion per column instead of one per value. Datetimes must be timezone-aware."""
        target = self._target(name, schema, schema, None)
        table = columns_to_arrow(name, columns, target.schema)  # bad columns fail before any commit
        table_schema, parts, create = self._prepare(name, target, commit_metadata)
        if table_schema != target.schema:  # another writer changed the table meanwhile: its columns, as they are
            table = columns_to_arrow(name, columns, table_schema)
        return self._append_arrow(name, table, table_schema, parts, create, self._metadata(name, commit_metadata))

    def _resolve(self, name: str, schema: StructType | None, fallback: StructType,
                 partition_by: list[str] | None,
                 commit_metadata: Mapping[str, Any] | None = None) -> tuple[StructType, list[str], bool]:
        """(schema, partition columns, whether the table must be created), the declared columns the existing table
        lacked added to it already: for writers that check their rows only as they write them."""
        return self._prepare(name, self._target(name, schema, fallback, partition_by), commit_metadata)

    def _prepare(self, name: str, target: _Target,
                 commit_metadata: Mapping[str, Any] | None) -> tuple[StructType, list[str], bool]:
        """_resolve's second half: the columns `target` adds, added (one commit), and the table's layout then."""
        if not target.added:
            return target.schema, target.parts, target.create
        assert target.declared is not None
        table_schema, parts = self._evolve(name, target.declared, list(target.added), commit_metadata)
        return table_schema, parts, False

    def _evolve(self, name: str, declared: StructType, added: list[StructField],
                commit_metadata: Mapping[str, Any] | None) -> tuple[StructType, list[str]]:
        """Add `added` to the table (one commit), and return its layout then.

        Two writers may add the same columns at once (two runs of an upgraded version, two tasks' appenders):
        Delta commits the first and refuses the other (a metadata change conflicting with the winner's, or on
        delta-spark a column that exists by now). What matters is whether the table has the columns then, so the
        loser looks again and has nothing left to add; a failure that leaves them missing is tried once more.
        """
        failure: Exception | None = None
        for _ in range(2):
            metadata = {**self._metadata(name, commit_metadata), ADDED_KEY: ",".join(f.name for f in added)}
            try:
                self._add_columns(name, added, metadata)
            except Exception as exc:  # judged by the look below, raised if that finds the columns still missing
                failure = exc
            layout = self.layout(name)
            if layout is None:
                raise TableNotFoundError(f"Delta table {name!r} at {self.path(name)} disappeared while adding columns")
            added = evolution(name, self.path(name), layout[0], declared)
            if not added:
                if failure is not None:
                    log.info("table %s: another writer added columns at the same time (%s)", name, failure)
                return layout[0], list(layout[1])
        assert failure is not None  # a commit that succeeded leaves nothing to add
        raise failure

    def _check_still_fits(self, name: str, schema: StructType, partition_by: list[str], cause: Exception) -> None:
        """After another writer changed the table under an append of rows written in `schema`: do they fit it still?
        They do when it kept each of their columns with its type, and its partitioning (an upgrade only adds
        nullable columns, which read as nulls in them); TableSchemaError otherwise."""
        layout = self.layout(name)
        if layout is None:
            raise cause
        have = {f.name: f.dataType for f in layout[0].fields}
        lost = [f.name for f in schema.fields
                if f.name not in have or loose_type(have[f.name]) != loose_type(f.dataType)]
        if lost or list(layout[1]) != list(partition_by):
            raise TableSchemaError(
                f"table {name!r} at {self.path(name)} changed while we appended to it: its column(s) {lost} or "
                f"partitioning {layout[1]} no longer fit our rows; nothing was committed") from cause

    @abstractmethod
    def _add_columns(self, name: str, fields: list[StructField], metadata: dict[str, str]) -> None:
        """Append these nullable columns to the existing table's schema, in one commit carrying `metadata`."""

    def _target(self, name: str, schema: StructType | None, fallback: StructType,
                partition_by: list[str] | None) -> _Target:
        """What a write of `schema` (the data's own, `fallback`, when the writer declares none) goes to, with nothing
        committed yet: the existing table, with the columns `schema` adds to it (evolution), or a new one."""
        layout = self.layout(name)
        if layout is not None:
            table_schema, table_parts = layout
            added: list[StructField] = []
            if schema is not None:
                added = evolution(name, self.path(name), table_schema, schema)
            if partition_by is not None and list(partition_by) != list(table_parts):
                raise TableSchemaError(
                    f"table {name!r} is partitioned by {table_parts}, not {list(partition_by)}")
            # Delta appends added columns at the end of the table's schema: the table's shape once they are in.
            return _Target(StructType([*table_schema.fields, *added]), list(table_parts), False, schema, tuple(added))
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
        return _Target(table_schema, parts, True, schema)

    def _metadata(self, name: str, commit_metadata: Mapping[str, Any] | None) -> dict[str, str]:
        metadata = {str(k): str(v) for k, v in (commit_metadata or {}).items()}
        metadata.update({COMMIT_ID_KEY: uuid.uuid4().hex, TABLE_KEY: name, ENGINE_KEY: self.engine})
        return metadata


__all__ = ["CommitResult", "TableStore"]  # the store's errors: sweeper.tables.errors
