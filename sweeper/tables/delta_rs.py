"""Delta tables written by Spark tasks with pyarrow and committed with delta-rs.

Runs anywhere pyspark does, with no Delta jars. A write is two steps:
1. every Spark task writes its partition's rows as Parquet file(s) straight into the table
   directory and returns one small record per file (path, size, stats);
2. the driver commits all those files as ONE Delta transaction with delta-rs.
Nothing big crosses to the driver, and the table changes atomically or not at all: a failed
job commits nothing, and files of failed or duplicate task attempts are never referenced.

Reading hands Spark the active file list of the wanted version, so time travel is a file list.
A table an earlier version wrote reads in the declared schema (schema.read_schema) by handing that schema to the
Parquet readers (Spark's and pyarrow's), which read a column a file lacks as nulls: no extra pass over the data.
Columns an upgrade declares are added with delta-rs's `alter.add_columns` (one ADD COLUMN commit).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from sweeper.tables.base import TableStore
from sweeper.tables.commits import (
    COMMIT_ID_KEY,
    FILES_KEY,
    ROWS_KEY,
    CommitResult,
    history_entry,
    parse_user_metadata,
)
from sweeper.tables.conditions import check_aggregates, filtered, is_value_list
from sweeper.tables.errors import TableNotFoundError, TableSchemaError
from sweeper.tables.files import (
    FILE_RECORD_ARROW,
    FILE_RECORD_DDL,
    TARGET_FILE_BYTES,
    TablesWriter,
    WriteSpec,
    current_task,
    filesystem,
    is_local,
    write_files,
    write_files_task,
)
from sweeper.tables.schema import arrow_schema, matches_nothing, read_schema, schema_problems
from sweeper.tables.storage import spark_uri

_FILE_COLUMN = "__sweeper_file"
CHECKPOINT_INTERVAL = 10
# Tables resolved or committed at once by task_writer / commit_written.
_COMMIT_THREADS = 4

log = logging.getLogger(__name__)


class DeltaRsTableStore(TableStore):
    engine = "delta-rs"

    def __init__(self, root: str, spark: SparkSession, storage_options: dict[str, str] | None = None,
                 target_file_bytes: int = TARGET_FILE_BYTES, *,
                 declared: Mapping[str, StructType] | None = None) -> None:
        super().__init__(root, spark, storage_options, declared=declared)
        self.target_file_bytes = target_file_bytes

    # ---- reading the log

    @property
    def _options(self) -> dict[str, str] | None:
        return self._storage_options or None

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.path(name), self._options)

    def _table(self, name: str, version: int | None = None) -> DeltaTable:
        path = self.path(name)
        if not self.exists(name):
            raise TableNotFoundError(f"no Delta table {name!r} at {path}")
        if version is None:
            return DeltaTable(path, storage_options=self._options)
        latest = DeltaTable(path, storage_options=self._options).version()
        if not 0 <= version <= latest:
            raise TableNotFoundError(f"Delta table {name!r} at {path} has no version {version} (latest is {latest})")
        return DeltaTable(path, version=version, storage_options=self._options)

    def version(self, name: str) -> int | None:
        if not self.exists(name):
            return None
        return DeltaTable(self.path(name), storage_options=self._options).version()

    def layout(self, name: str) -> tuple[StructType, list[str]] | None:
        if not self.exists(name):
            return None
        table = DeltaTable(self.path(name), storage_options=self._options)
        _refuse_unsupported(name, table, writing=True)
        return _spark_schema(table), list(table.metadata().partition_columns)

    def history(self, name: str) -> list[dict[str, Any]]:
        return [
            history_entry(version, c.get("timestamp"), c.get("operation"), c.get("operationParameters"),
                          c.get("operationMetrics"), c.get("userMetadata"), c.get("engineInfo"))
            for version, c in self._commit_infos(name, self._table(name).version())
        ]

    def _commit_infos(self, name: str, newest: int, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        """(version, commitInfo) from `newest` down, read from the commit files themselves.

        Not DeltaTable.history(): delta-rs lists every commit file from the first wanted one
        onwards, newer ones included, and numbers them down from the version it loaded, so a
        commit another writer lands meanwhile shifts every number (delta-rs Snapshot::commit_infos;
        seen with two writers on S3). Stops at a file log clean-up removed.
        """
        fs, base = filesystem(self.path(name), self._storage_options)
        oldest = 0 if limit is None else max(0, newest - limit + 1)
        for version in range(newest, oldest - 1, -1):
            try:
                with fs.open_input_stream(f"{base.rstrip('/')}/_delta_log/{version:020d}.json") as stream:
                    text = stream.read().decode("utf-8")
            except FileNotFoundError:
                return
            info = next((json.loads(line)["commitInfo"] for line in text.splitlines() if '"commitInfo"' in line), {})
            yield version, info

    # ---- reading data

    def read(self, name: str, version: int | None = None, where: Mapping[str, Any] | None = None,
             schema: StructType | None = None) -> DataFrame:
        table = self._table(name, version)
        _refuse_unsupported(name, table, writing=False)
        stored = _spark_schema(table)
        # Spark's Parquet reader gives a column no file has (one added since they were written) as nulls.
        schema = read_schema(stored, self._declared_schema(name, schema))
        if matches_nothing(where, stored, schema):
            return self.spark.createDataFrame([], schema)
        parts = list(table.metadata().partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True))
        kept = _files_that_may_match(actions, where)
        files = [self._spark_path(uri) for uri in _kept_uris(table.file_uris(), actions, kept)]
        if not files:
            return self.spark.createDataFrame([], schema)
        if not parts:
            return filtered(self.spark.read.schema(schema).parquet(*files), where)
        # Partition values come from the log, never from directory names: writers escape those
        # differently, and Delta-Spark leaves partition columns out of the files.
        data_schema = StructType([f for f in schema.fields if f.name not in parts])
        mapping = self.spark.createDataFrame(
            [
                (a["path"].rsplit("/", 1)[-1], *[_as_text(a.get(f"partition.{c}")) for c in parts])
                for a in actions.filter(kept).to_pylist()
            ],
            StructType([StructField(_FILE_COLUMN, StringType(), False),
                        *[StructField(c, StringType(), True) for c in parts]]),
        ).select(_FILE_COLUMN, *[F.col(c).cast(schema[c].dataType).alias(c) for c in parts])
        data = self.spark.read.schema(data_schema).parquet(*files).withColumn(
            _FILE_COLUMN, F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1))
        return filtered(data.join(F.broadcast(mapping), _FILE_COLUMN).select(*schema.fieldNames()), where)

    def read_arrow(self, name: str, where: Mapping[str, Any] | None = None,
                   columns: Sequence[str] | None = None, schema: StructType | None = None) -> pa.Table:
        """Straight from the version's Parquet files with pyarrow: a few milliseconds where a Spark job costs a
        few hundred. Not `DeltaTable.to_pyarrow_dataset()`: delta-rs 1.6 turns a column's missing min/max
        statistics (optional in Delta; our writer leaves them out for long strings) into `column >= null`
        guarantees, and a filter on that column then skips the file, silently dropping its rows
        (`tests/test_tables_contract.py::test_read_arrow_filters_on_the_driver` has such a column). Only the
        files' own Parquet statistics prune here."""
        import pyarrow.dataset as ds

        table = self._table(name)
        stored = _spark_schema(table)
        wanted = read_schema(stored, self._declared_schema(name, schema))
        if matches_nothing(where, stored, wanted):
            empty = arrow_schema(wanted).empty_table()
            return empty.select(list(columns)) if columns else empty
        actions = pa.table(table.get_add_actions(flatten=True))
        relative = actions.filter(_files_that_may_match(actions, where)).column("path").to_pylist()
        if table.metadata().partition_columns or any("://" in path for path in relative):
            # Partition values live in the log, files may be elsewhere: the Spark read handles both.
            return super().read_arrow(name, where, columns, wanted)
        _refuse_unsupported(name, table, writing=False)
        # The dataset's schema, not each file's: a column a file lacks (added since it was written) reads as nulls.
        arrow = arrow_schema(wanted)
        fs, base = filesystem(self.path(name), self._storage_options)
        paths = [f"{base.rstrip('/')}/{unquote(path)}" for path in relative]
        dataset = ds.dataset(paths, schema=arrow, format="parquet", filesystem=fs)
        condition = None
        for column, value in (where or {}).items():
            if is_value_list(value):  # typed as the column, so an empty choice is one too
                term = ds.field(column).isin(pa.array(list(value), type=arrow.field(column).type))
            else:
                term = ds.field(column) == value
            condition = term if condition is None else condition & term
        return dataset.to_table(columns=list(columns) if columns else None, filter=condition)

    def aggregate_arrow(self, name: str, keys: Sequence[str], aggregates: Sequence[tuple[str, str]],
                        where: Mapping[str, Any] | None = None, schema: StructType | None = None) -> pa.Table:
        # Grouped by pyarrow on the driver over only the columns needed: for a million rows a fraction of a
        # second, where a Spark job with its shuffle costs a few.
        check_aggregates(aggregates, self.AGGREGATES)
        needed = list(dict.fromkeys([*keys, *(column for column, _ in aggregates)]))
        table = self.read_arrow(name, where, needed, schema)
        return table.group_by(list(keys)).aggregate([(column, fn) for column, fn in aggregates])

    def _spark_path(self, uri: str) -> str:
        # Hadoop's S3 connector is s3a://, unless the cluster maps s3:// itself (EMR does).
        return uri if is_local(uri) else spark_uri(self.spark, uri)

    # ---- writing

    def _spec(self, name: str, schema: StructType, partition_by: list[str]) -> WriteSpec:
        return WriteSpec(
            table=name,
            table_uri=self.path(name),
            arrow_schema=arrow_schema(schema),
            partition_by=tuple(partition_by),
            storage_options=self._storage_options,
            target_file_bytes=self.target_file_bytes,
        )

    def _append_frame(self, name: str, df: DataFrame, schema: StructType, partition_by: list[str],
                      create: bool, metadata: dict[str, str]) -> CommitResult:
        spec = self._spec(name, schema, partition_by)

        def write_partition(batches):  # runs in the Spark tasks
            return write_files_task(spec, batches)

        # One job; collect() brings back only the file records of successful task attempts.
        records = [row.asDict() for row in df.mapInArrow(write_partition, FILE_RECORD_DDL).collect()]
        return self._commit(name, records, schema, partition_by, create, metadata)

    def append_arrow_frame(self, name: str, source: DataFrame,
                           to_batches: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
                           schema: StructType, *, commit_metadata: Mapping[str, Any] | None = None) -> CommitResult:
        # The tasks that make the batches write them: no Arrow -> JVM rows -> Arrow round trip.
        table_schema, parts, create = self._resolve(name, schema, schema, None, commit_metadata)
        spec = self._spec(name, table_schema, parts)

        def write_partition(batches):  # runs in the Spark tasks
            return write_files_task(spec, to_batches(batches))

        records = [row.asDict() for row in source.mapInArrow(write_partition, FILE_RECORD_DDL).collect()]
        return self._commit(name, records, table_schema, parts, create, self._metadata(name, commit_metadata))

    def append_arrow_frames(self, source: DataFrame, route: str,
                            to_batches: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
                            schemas: Mapping[str, StructType], *,
                            commit_metadata: Mapping[str, Any] | None = None) -> dict[str, CommitResult]:
        # One job writes every table's files (a job per table costs a scheduling round and a task per source
        # partition each, which is most of a small snapshot's commit time); then one commit per table.
        resolved = {name: self._resolve(name, schema, schema, None, commit_metadata)
                    for name, schema in schemas.items()}
        specs = {name: self._spec(name, table_schema, parts) for name, (table_schema, parts, _) in resolved.items()}

        def write_partition(batches):  # runs in the Spark tasks
            return _write_routed(specs, route, to_batches, batches)

        records: dict[str, list[dict[str, Any]]] = {name: [] for name in schemas}
        for row in source.mapInArrow(write_partition, _ROUTED_RECORD_DDL).collect():
            record = row.asDict()
            records[record.pop("table")].append(record)
        return {name: self._commit(name, records[name], table_schema, parts, create,
                                   self._metadata(name, commit_metadata))
                for name, (table_schema, parts, create) in resolved.items()}

    def task_writer(self, schemas: Mapping[str, StructType], *,
                    commit_metadata: Mapping[str, Any] | None = None) -> TablesWriter:
        # The tables resolved once, side by side (on an object store each look is a round trip or two), the columns
        # an upgrade declares added to them first; the resolution travels with the writer, so the commit needs no
        # second look.
        with ThreadPoolExecutor(max_workers=_COMMIT_THREADS) as pool:
            futures = {name: pool.submit(self._resolve, name, schema, schema, None, commit_metadata)
                       for name, schema in schemas.items()}
            resolved = {name: future.result() for name, future in futures.items()}
        return TablesWriter(
            specs={name: self._spec(name, table_schema, parts) for name, (table_schema, parts, _) in resolved.items()},
            tables=resolved)

    def commit_written(self, writer: TablesWriter, records: Mapping[str, Sequence[Mapping[str, Any]]], *,
                       commit_metadata: Mapping[str, Any] | None = None) -> dict[str, CommitResult]:
        unknown = sorted(set(records) - set(writer.tables))
        if unknown:
            raise TableSchemaError(f"file records of {unknown}, which are not tables of this writer")

        def commit(name: str) -> CommitResult:
            table_schema, parts, create = writer.tables[name]
            return self._commit(name, [dict(r) for r in records.get(name, ())], table_schema, parts, create,
                                self._metadata(name, commit_metadata))

        # Independent Delta logs: committed side by side (each commit is a few round trips to the store).
        with ThreadPoolExecutor(max_workers=_COMMIT_THREADS) as pool:
            futures = {name: pool.submit(commit, name) for name in writer.tables}
            return {name: future.result() for name, future in futures.items()}

    def _append_arrow(self, name: str, table: pa.Table, schema: StructType, partition_by: list[str],
                      create: bool, metadata: dict[str, str]) -> CommitResult:
        # Small driver-side data: write the file here, no Spark job needed.
        records = write_files(self._spec(name, schema, partition_by), table.to_batches())
        return self._commit(name, records, schema, partition_by, create, metadata)

    def _commit(self, name: str, records: list[dict[str, Any]], schema: StructType, partition_by: list[str],
                create: bool, metadata: dict[str, str]) -> CommitResult:
        path = self.path(name)
        delta_schema = DeltaSchema.from_json(schema.json())
        adds = [
            AddAction(
                path=r["path"],  # raw relative path; delta-rs URI-encodes it for the log
                size=int(r["size"]),
                partition_values=json.loads(r["partition_values"]),
                modification_time=int(r["modification_time"]),
                data_change=True,
                stats=r["stats"],
            )
            for r in records
        ]
        rows = sum(int(r["num_records"]) for r in records)
        # Add actions carry no operation metrics, so the counts go into the commit's metadata.
        metadata = {**metadata, ROWS_KEY: str(rows), FILES_KEY: str(len(adds))}
        properties = CommitProperties(custom_metadata={"userMetadata": json.dumps(metadata, sort_keys=True)})
        if create:
            try:
                if adds:
                    create_table_with_add_actions(path, delta_schema, adds, mode="error", partition_by=partition_by,
                                                  storage_options=self._options, commit_properties=properties)
                else:
                    DeltaTable.create(path, delta_schema, mode="error", partition_by=partition_by,
                                      storage_options=self._options, commit_properties=properties)
            except Exception:
                if not self.exists(name):
                    raise
                # Another writer created it first: append to it if it is the same table.
                self._check_same_layout(name, schema, partition_by)
                create = False
        if not create:
            if not adds:
                return CommitResult(name, self.version(name) or 0, 0, 0, self.engine)
            self._append_adds(name, adds, schema, partition_by, properties)
        version = self._commit_version(name, metadata[COMMIT_ID_KEY])
        self._checkpoint_if_due(name, version)
        return CommitResult(name, version, rows, len(adds), self.engine)

    def _log(self, name: str) -> DeltaTable:
        """The table's latest snapshot, which an append commits on top of."""
        return DeltaTable(self.path(name), storage_options=self._options)

    def _append_adds(self, name: str, adds: list[AddAction], schema: StructType, partition_by: list[str],
                     properties: CommitProperties) -> None:
        """Commit the written files to the existing table, once more if another writer's change of its columns came
        between our look and our commit: delta-rs refuses any commit behind a concurrent metadata change ("Metadata
        changed since last commit"), blind appends included, and an upgrade adding columns is one. Our files fit the
        table still when it has kept every column of theirs, with the type they were written in, and its
        partitioning (columns are only ever added, nullable: the files read as nulls there)."""
        for attempt in range(2):
            table = self._log(name)
            try:
                table.create_write_transaction(adds, mode="append", schema=table.schema(), partition_by=partition_by,
                                               commit_properties=properties)
                return
            except CommitFailedError as exc:
                if attempt or "metadata changed" not in str(exc).lower():
                    raise
                self._check_still_fits(name, schema, partition_by, exc)
                log.info("table %s: its metadata changed under our append (%s); committing again", name, exc)

    def _add_columns(self, name: str, fields: list[StructField], metadata: dict[str, str]) -> None:
        table = self._log(name)
        # Those another writer added since our look are left out: delta-rs would commit a column that is there
        # already as an ADD COLUMN of nothing, a metadata change that fails the other writers' concurrent appends.
        # Should another writer add them between this snapshot and our commit, delta-rs refuses the commit as
        # conflicting with that metadata change, and TableStore._evolve looks again.
        present = {f.name for f in table.schema().fields}
        missing = [f for f in fields if f.name not in present]
        if not missing:
            return
        properties = CommitProperties(custom_metadata={"userMetadata": json.dumps(metadata, sort_keys=True)})
        table.alter.add_columns(list(DeltaSchema.from_json(StructType(missing).json()).fields),
                                commit_properties=properties)

    def _checkpoint_if_due(self, name: str, version: int) -> None:
        """A checkpoint every CHECKPOINT_INTERVAL commits, as Delta-Spark writes one (its default interval).

        Without one every load of the table replays each commit file since the last checkpoint, and delta-rs
        checkpoints only every 100 (its default): a table of a run a day replays up to 99 files on each of the
        dozens of loads a run makes (46 ms a load at 99 commits, 5 ms after a checkpoint, measured). A checkpoint
        changes no data; one that fails is left to the next commit, never the commit's failure.
        """
        fs, base = filesystem(self.path(name), self._storage_options)
        try:
            with fs.open_input_stream(f"{base.rstrip('/')}/_delta_log/_last_checkpoint") as stream:
                last = int(json.loads(stream.read())["version"])
        except (FileNotFoundError, ValueError, KeyError, TypeError, OSError):
            last = 0  # none yet: the first at version 10, as Delta-Spark's
        if version - last < CHECKPOINT_INTERVAL:
            return
        try:
            DeltaTable(self.path(name), storage_options=self._options).create_checkpoint()
        except Exception as exc:  # a missed checkpoint costs reads, not data
            log.warning("no checkpoint for table %s at version %s: %s", name, version, exc)

    def _check_same_layout(self, name: str, schema: StructType, partition_by: list[str]) -> None:
        layout = self.layout(name)
        assert layout is not None
        problems = schema_problems(schema, layout[0])
        if problems or layout[1] != partition_by:
            raise TableSchemaError(f"table {name!r} was created concurrently with another layout: {problems}")

    def _commit_version(self, name: str, commit_id: str) -> int:
        # Find our own commit rather than trusting "latest": others may have committed since.
        latest = DeltaTable(self.path(name), storage_options=self._options).version()
        for version, info in self._commit_infos(name, latest, limit=100):
            if parse_user_metadata(info.get("userMetadata")).get(COMMIT_ID_KEY) == commit_id:
                return version
        return latest


_ROUTED_RECORD_DDL = f"table string, {FILE_RECORD_DDL}"


def _write_routed(specs: Mapping[str, WriteSpec], route: str,
                  to_batches: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
                  batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of append_arrow_frames: this partition's rows, split by table, written table by table
    (the source rows are held until then: the packed snapshot output is compact); file records tagged with
    their table. A row routed to no table of `specs` is an error, not a silent drop."""
    task = current_task()
    by_table: dict[str, list[pa.RecordBatch]] = {}
    for batch in batches:
        routes = batch.column(route)
        for name in pc.unique(routes).to_pylist():
            if name not in specs:
                raise TableSchemaError(f"rows routed to {name!r}, which is not one of the tables being written")
            by_table.setdefault(name, []).append(batch.filter(pc.equal(routes, name)))
    for name, held in by_table.items():
        records = write_files(specs[name], to_batches(iter(held)), task)
        if records:
            yield pa.RecordBatch.from_pylist([{"table": name, **r} for r in records],
                                             schema=pa.schema([pa.field("table", pa.string()), *FILE_RECORD_ARROW]))


def _refuse_unsupported(name: str, table: DeltaTable, writing: bool) -> None:
    """Tables written by other Delta writers may use features this engine would get wrong.

    Our own tables never have them; a table made by Delta-Spark with default settings neither.
    """
    config = table.metadata().configuration or {}
    schema_json = table.schema().to_json()
    problems = []
    if (config.get("delta.columnMapping.mode") or "none") != "none":
        problems.append("column mapping")  # physical column names differ from the schema's
    if "typeWidening" in (table.protocol().reader_features or []):
        problems.append("type widening")
    if writing:
        if any(key.startswith("delta.constraints.") for key in config):
            problems.append("CHECK constraints")  # we'd add files without evaluating them
        if "delta.generationExpression" in schema_json:
            problems.append("generated columns")
        if "delta.identity." in schema_json:
            problems.append("identity columns")
    elif _has_deletion_vectors(table):
        problems.append("deletion vectors")  # reading plain Parquet would resurrect deleted rows
    if problems:
        action = "append to" if writing else "read"
        raise NotImplementedError(
            f"the delta-rs engine cannot {action} table {name!r}: it uses {', '.join(problems)}; "
            "use engine='delta-spark'")


def _has_deletion_vectors(table: DeltaTable) -> bool:
    if "deletionVectors" not in (table.protocol().reader_features or []):
        return False
    return any(batch.num_rows for batch in pa.RecordBatchReader.from_stream(table.deletion_vectors()))


# String statistics may be truncated by their writer: Delta-Spark keeps a prefix (DeltaSQLConf
# DATA_SKIPPING_STRING_PREFIX_LENGTH, 32 by default, configurable) and appends a tie-breaker to a max; delta-rs and
# parquet-rs cut at a byte length and increment a max's last character (truncate_max_value). Both stay bounds when
# their writer gets it right; a bound as long as a truncated one is not trusted here all the same, so a writer that
# cut a max without raising it can only cost a read, never hide a row. Our own run ids (25 characters) are short.
_TRUSTED_STRING_STAT = 32


def _files_that_may_match(actions: pa.Table, where: Mapping[str, Any] | None) -> pa.Array:
    """Which of the add actions' files may hold a row matching `where` (as in read_arrow), by the min/max
    statistics each add action carries: a file is left out only when its statistics prove it holds no such row.
    Strings and integers only; a file without usable statistics for a column is kept. This is what lets a
    stage read one run's rows of a table that holds every run's, without Spark listing and opening them all.
    """
    keep = pa.array([True] * actions.num_rows, type=pa.bool_())
    for column, value in (where or {}).items():
        low, high = f"min.{column}", f"max.{column}"
        if low not in actions.column_names or high not in actions.column_names:
            continue
        values = [v for v in (value if is_value_list(value) else [value]) if v is not None]
        lows, highs = actions.column(low), actions.column(high)
        if not values or not (_stat_kind(lows.type, values) and _stat_kind(highs.type, values)):
            continue
        try:
            least, most = pa.scalar(min(values), type=lows.type), pa.scalar(max(values), type=highs.type)
        except (pa.ArrowInvalid, OverflowError):  # a value the column cannot hold: let the filter decide
            continue
        unknown = pc.or_kleene(pc.is_null(lows), pc.is_null(highs))
        if pa.types.is_string(lows.type) or pa.types.is_large_string(lows.type):
            unknown = pc.or_kleene(unknown, pc.or_kleene(pc.greater_equal(pc.utf8_length(lows), _TRUSTED_STRING_STAT),
                                             pc.greater_equal(pc.utf8_length(highs), _TRUSTED_STRING_STAT)))
        overlaps = pc.and_kleene(pc.less_equal(lows, most), pc.greater_equal(highs, least))
        keep = pc.and_kleene(keep, pc.fill_null(pc.or_kleene(unknown, overlaps), True))
    return keep


def _stat_kind(dtype: pa.DataType, values: list[Any]) -> bool:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return all(isinstance(v, str) for v in values)
    if pa.types.is_integer(dtype):
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return False


def _kept_uris(uris: list[str], actions: pa.Table, kept: pa.Array) -> list[str]:
    """The URIs of the kept files. delta-rs lists file_uris() and the add actions from one snapshot in one order;
    should that ever not hold, every file is read (the filter still applies), never a wrong subset."""
    paths = actions.column("path").to_pylist()
    if len(uris) != len(paths) or not all(uri.endswith(unquote(path)) for uri, path in zip(uris, paths, strict=True)):
        return uris
    return [uri for uri, keep in zip(uris, kept.to_pylist(), strict=True) if keep]


def _spark_schema(table: DeltaTable) -> StructType:
    # Delta's schema JSON is Spark's StructType JSON, so this is exact (nullability included).
    return StructType.fromJson(json.loads(table.schema().to_json()))


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
