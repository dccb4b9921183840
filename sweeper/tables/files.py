"""Writing Delta data files with pyarrow, in a Spark task or on the driver.

Each call writes the rows it is given as Parquet files under the table directory and returns one
small record per file (what a Delta `add` action needs). Nothing here touches the Delta log: the
driver commits the records of all tasks in one transaction, so a file whose record never reaches
the driver (failed or duplicate task attempt) is never part of the table. Such orphans are
harmless and `VACUUM` removes them.

This module runs on executors: keep its imports to pyarrow and the standard library.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sweeper.tables.errors import NotNullViolation

# What one file record looks like, as Spark sees it (mapInArrow output) and as Arrow builds it.
FILE_RECORD_DDL = (
    "path string, size long, num_records long, modification_time long, stats string, partition_values string"
)
FILE_RECORD_ARROW = pa.schema([
    ("path", pa.string()),
    ("size", pa.int64()),
    ("num_records", pa.int64()),
    ("modification_time", pa.int64()),
    ("stats", pa.string()),
    ("partition_values", pa.string()),
])

TARGET_FILE_BYTES = 128 * 1024 * 1024
# Spark hands Arrow batches of 10k rows; buffering them into larger row groups keeps scans fast.
ROW_GROUP_ROWS = 128 * 1024
ROW_GROUP_BYTES = 64 * 1024 * 1024
# Delta collects statistics for the first 32 leaf columns unless the table says otherwise.
STATS_COLUMNS = 32
# Delta (Spark) truncates string statistics to a 32-character prefix; a longer max would need a
# tie-breaker, so we leave such columns without min/max (readers then simply don't skip).
STATS_STRING_PREFIX = 32
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True)
class WriteSpec:
    """Everything a task needs to write files for one table; pickled into each task."""

    table: str
    table_uri: str
    arrow_schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    target_file_bytes: int = TARGET_FILE_BYTES


# --------------------------------------------------------------------------- filesystems


def is_local(uri: str) -> bool:
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/"))  # C:\ on Windows


def _option(options: dict[str, str], *names: str) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    for name in names:
        if name in lowered and lowered[name] not in (None, ""):
            return lowered[name]
    return None


def filesystem(uri: str, storage_options: dict[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """pyarrow filesystem and path for a table URI; S3 takes the same storage options as delta-rs."""
    options = storage_options or {}
    parsed = urlparse(uri)
    if is_local(uri):
        return pafs.LocalFileSystem(), parsed.path if parsed.scheme == "file" else uri
    if parsed.scheme in ("s3", "s3a") and options:
        endpoint = _option(options, "aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")
        allow_http = (_option(options, "aws_allow_http", "allow_http") or "").lower() == "true"
        fs = pafs.S3FileSystem(
            access_key=_option(options, "aws_access_key_id", "access_key_id"),
            secret_key=_option(options, "aws_secret_access_key", "secret_access_key"),
            session_token=_option(options, "aws_session_token", "session_token"),
            region=_option(options, "aws_region", "aws_default_region", "region"),
            endpoint_override=endpoint,
            scheme="http" if allow_http else "https",
            force_virtual_addressing=(_option(options, "aws_virtual_hosted_style_request") or "").lower() == "true",
        )
        return fs, f"{parsed.netloc}{parsed.path}"
    if parsed.scheme == "s3a":
        uri = "s3" + uri[3:]
    return pafs.FileSystem.from_uri(uri)


# --------------------------------------------------------------------------- partitions


def partition_value_string(value: Any) -> str | None:
    """A partition value as Delta's `partitionValues` spells it (null stays None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, date):
        return value.isoformat()
    text = str(value)
    if text == "":
        # Delta reads an empty partition value as null, which would silently change the data.
        raise ValueError("empty string in a partition column; Delta would read it back as null")
    return text


def partition_dir(partition_by: tuple[str, ...], values: tuple[str | None, ...]) -> str:
    # Directory names are for humans only: readers take values from the log, not from the path.
    return "/".join(
        f"{quote(col, safe='')}={HIVE_NULL if v is None else quote(v, safe='')}"
        for col, v in zip(partition_by, values, strict=True)
    )


def _split_by_partition(batch: pa.RecordBatch, partition_by: tuple[str, ...]
                        ) -> Iterator[tuple[tuple[str | None, ...], pa.RecordBatch]]:
    if not partition_by:
        yield (), batch
        return
    keys = pa.Table.from_batches([batch]).select(list(partition_by)).group_by(list(partition_by)).aggregate([])
    for key in keys.to_pylist():
        mask = None
        for col in partition_by:
            value = key[col]
            column = batch.column(col)
            match = pc.is_null(column) if value is None else pc.fill_null(pc.equal(column, value), False)
            mask = match if mask is None else pc.and_(mask, match)
        yield tuple(partition_value_string(key[c]) for c in partition_by), batch.filter(mask)


# --------------------------------------------------------------------------- validation


def check_not_null(array: pa.Array, fld: pa.Field, path: str, table: str) -> None:
    if not fld.nullable and array.null_count:
        raise NotNullViolation(
            f"table {table!r}: column {path!r} is NOT NULL but {array.null_count} row(s) have null there"
        )
    dtype = fld.type
    if pa.types.is_struct(dtype):
        for i in range(dtype.num_fields):
            child = dtype.field(i)
            # Nulls of the parent are not the child's: only rows where the parent is set count.
            values = array.field(i)
            if array.null_count:
                values = values.filter(pc.is_valid(array))
            check_not_null(values, child, f"{path}.{child.name}", table)
    elif pa.types.is_map(dtype):
        check_not_null(array.items, dtype.item_field, f"{path}.value", table)
    elif pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        check_not_null(array.flatten(), dtype.value_field, f"{path}.element", table)


def conform(batch: pa.RecordBatch, spec: WriteSpec) -> pa.RecordBatch:
    """The batch in the table's exact Arrow types (Spark may send large/other variants) and column order."""
    schema = spec.arrow_schema
    if batch.schema.names != schema.names:
        if sorted(batch.schema.names) != sorted(schema.names):
            raise ValueError(
                f"table {spec.table!r}: batch columns {batch.schema.names} != table columns {schema.names}")
        # A producer makes its rows in its declared schema's order; a table that gained columns by an upgrade has
        # them at its end (Delta's ADD COLUMNS), wherever they are declared. Same columns: matched by name.
        batch = batch.select(schema.names)
    for i, fld in enumerate(schema):
        check_not_null(batch.column(i), fld, fld.name, spec.table)
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    return batch.cast(schema)


def padded(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """`table`'s rows in `schema`, a table's schema that has every column of theirs and maybe more (columns an
    upgrade added since the rows were made): those as nulls, as Delta reads them in older files."""
    unknown = [name for name in table.column_names if schema.get_field_index(name) < 0]
    if unknown:
        raise ValueError(f"table at {where} lacks the column(s) {', '.join(unknown)} its rows have")
    return pa.Table.from_arrays(
        [table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type) for f in schema],
        names=schema.names)


# --------------------------------------------------------------------------- statistics


def _stats_leaves(schema: pa.Schema, skip: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Paths of the leaf columns Delta indexes (structs are walked; lists and maps are leaves)."""
    leaves: list[tuple[str, ...]] = []

    def walk(fld: pa.Field, prefix: tuple[str, ...]) -> None:
        path = (*prefix, fld.name)
        if pa.types.is_struct(fld.type):
            for i in range(fld.type.num_fields):
                walk(fld.type.field(i), path)
        else:
            leaves.append(path)

    for fld in schema:
        if fld.name not in skip:
            walk(fld, ())
    return leaves[:STATS_COLUMNS]


def _leaf_array(batch: pa.RecordBatch, path: tuple[str, ...]) -> pa.Array:
    array = batch.column(path[0])
    for name in path[1:]:
        # flatten() folds the parent's nulls into the children, which is what Delta counts.
        idx = array.type.get_field_index(name)
        array = array.flatten()[idx]
    return array


def _stat_json(value: Any, dtype: pa.DataType, upper: bool) -> Any:
    if isinstance(value, datetime):
        millis = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if upper and millis != value:
            # Stats are millisecond precision; round a max up so it stays an upper bound.
            millis += timedelta(milliseconds=1)
        text = millis.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis.microsecond // 1000:03d}"
        return text + "Z" if dtype.tz is not None else text
    if isinstance(value, date):
        return value.isoformat()
    return value


def _min_max_supported(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(dtype)
        or pa.types.is_date32(dtype)
        or (pa.types.is_timestamp(dtype) and dtype.unit == "us")
        or pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
    )


class _Stats:
    """Per-file Delta statistics, accumulated batch by batch."""

    def __init__(self, schema: pa.Schema, skip: tuple[str, ...]) -> None:
        self.leaves = _stats_leaves(schema, skip)
        self.rows = 0
        self.nulls: dict[tuple[str, ...], int] = dict.fromkeys(self.leaves, 0)
        self.mins: dict[tuple[str, ...], Any] = {}
        self.maxs: dict[tuple[str, ...], Any] = {}
        self.unusable: set[tuple[str, ...]] = set()

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        for path in self.leaves:
            array = _leaf_array(batch, path)
            self.nulls[path] += array.null_count
            if path in self.unusable or not _min_max_supported(array.type) or array.null_count == len(array):
                continue
            result = pc.min_max(array)
            lo, hi = result["min"].as_py(), result["max"].as_py()
            if isinstance(hi, str) and len(hi) > STATS_STRING_PREFIX:
                self.unusable.add(path)
                continue
            self.mins[path] = lo if path not in self.mins else min(self.mins[path], lo)
            self.maxs[path] = hi if path not in self.maxs else max(self.maxs[path], hi)

    def to_json(self, schema: pa.Schema) -> str:
        def put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
            for name in path[:-1]:
                tree = tree.setdefault(name, {})
            tree[path[-1]] = value

        def leaf_type(path: tuple[str, ...]) -> pa.DataType:
            dtype = schema.field(path[0]).type
            for name in path[1:]:
                dtype = dtype.field(name).type
            return dtype

        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for path in self.leaves:
            put(nulls, path, self.nulls[path])
            if path in self.mins and path not in self.unusable:
                dtype = leaf_type(path)
                put(mins, path, _stat_json(self.mins[path], dtype, upper=False))
                put(maxs, path, _stat_json(self.maxs[path], dtype, upper=True))
        return json.dumps({"numRecords": self.rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
                          separators=(",", ":"), allow_nan=False)


# --------------------------------------------------------------------------- the writer


class _OpenFile:
    def __init__(self, fs: pafs.FileSystem, base: str, rel_dir: str, task: int, seq: int, spec: WriteSpec,
                 partition_values: tuple[str | None, ...]) -> None:
        name = f"part-{task:05d}-{uuid.uuid4()}-c{seq:03d}.snappy.parquet"
        self.rel_path = f"{rel_dir}/{name}" if rel_dir else name
        self.full_path = f"{base}/{self.rel_path}"
        self.fs = fs
        self.spec = spec
        self.partition_values = dict(zip(spec.partition_by, partition_values, strict=True))
        if isinstance(fs, pafs.LocalFileSystem):
            # Object stores have no directories; creating one would leave a marker object behind.
            fs.create_dir(self.full_path.rsplit("/", 1)[0], recursive=True)
        self.sink = fs.open_output_stream(self.full_path)
        # Partition columns stay in the files too (as Iceberg-compatible Delta writers do): the
        # log's partitionValues remain the truth, and the files are self-describing.
        self.writer = pq.ParquetWriter(self.sink, spec.arrow_schema, compression="snappy")
        self.stats = _Stats(spec.arrow_schema, spec.partition_by)
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.stats.add(batch)
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.pending_bytes += batch.nbytes
        if self.pending_rows >= ROW_GROUP_ROWS or self.pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            table = pa.Table.from_batches(self.pending, schema=self.spec.arrow_schema)
            self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    @property
    def approx_bytes(self) -> int:
        return self.sink.tell() + self.pending_bytes

    def close(self) -> dict[str, Any]:
        self._flush()
        self.writer.close()
        size = self.sink.tell()
        self.sink.close()
        return {
            "path": self.rel_path,
            "size": size,
            "num_records": self.stats.rows,
            "modification_time": int(time.time() * 1000),
            "stats": self.stats.to_json(self.spec.arrow_schema),
            "partition_values": json.dumps(self.partition_values, separators=(",", ":")),
        }

    def abort(self) -> None:
        try:
            self.writer.close()
            self.sink.close()
        finally:
            self.fs.delete_file(self.full_path)


class FileWriter:
    """One table's rows streamed into Parquet files under the table directory, a new file past the spec's target
    size (and one per partition value); `close()` returns one add-record per file. What a failed writer leaves
    behind is never committed: `abort()` removes it as far as it can."""

    def __init__(self, spec: WriteSpec, task: int = 0) -> None:
        self.spec, self.task = spec, task
        self.fs, base = filesystem(spec.table_uri, spec.storage_options)
        self.base = base.rstrip("/")
        self.open_files: dict[tuple[str | None, ...], _OpenFile] = {}
        self.written: list[dict[str, Any]] = []
        self.seq = 0

    def write(self, raw: pa.RecordBatch) -> None:
        if raw.num_rows == 0:
            return
        spec = self.spec
        batch = conform(raw, spec)
        for key, part in _split_by_partition(batch, spec.partition_by):
            handle = self.open_files.get(key)
            if handle is None:
                handle = _OpenFile(self.fs, self.base, partition_dir(spec.partition_by, key), self.task, self.seq,
                                   spec, key)
                self.seq += 1
                self.open_files[key] = handle
            handle.write(part)
            if handle.approx_bytes >= spec.target_file_bytes:
                self.written.append(handle.close())
                del self.open_files[key]

    def close(self) -> list[dict[str, Any]]:
        for key in list(self.open_files):
            self.written.append(self.open_files.pop(key).close())
        return self.written

    def abort(self) -> None:
        # Best effort only: whatever stays behind is never committed, so it is merely clutter.
        for handle in self.open_files.values():
            with contextlib.suppress(Exception):
                handle.abort()
        self.open_files.clear()
        for record in self.written:
            with contextlib.suppress(Exception):
                self.fs.delete_file(f"{self.base}/{record['path']}")
        self.written = []


def write_files(spec: WriteSpec, batches: Iterable[pa.RecordBatch], task: int = 0) -> list[dict[str, Any]]:
    """Write `batches` as Parquet files of the table; return one add-record per file."""
    writer = FileWriter(spec, task)
    try:
        for batch in batches:
            writer.write(batch)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


@dataclass(frozen=True)
class TablesWriter:
    """The data files of several tables, written from Spark tasks (or the driver) as their rows come: picklable,
    and small (a WriteSpec per table). Each `open()` is one writer's share, whose `close()` gives the file records
    that the table store's `commit_written` turns into one Delta commit per table; files whose records never
    reach that commit (a failed or duplicate task attempt) are never part of any table.

    `tables` is the store's own note of each table (its schema and whether the commit creates it), carried
    along so the commit needs no second look at the tables."""

    specs: dict[str, WriteSpec]
    tables: dict[str, Any] = field(default_factory=dict, repr=False)

    def open(self, task: int | None = None) -> TablesWriting:
        return TablesWriting(self.specs, current_task() if task is None else task)


class TablesWriting:
    """One task's files of several tables (TablesWriter.open). A row of a table it was not given is an error,
    never a silent drop."""

    def __init__(self, specs: dict[str, WriteSpec], task: int) -> None:
        self.specs, self.task = specs, task
        self.writers: dict[str, FileWriter] = {}

    def write(self, table: str, batch: pa.RecordBatch) -> None:
        writer = self.writers.get(table)
        if writer is None:
            if table not in self.specs:
                raise ValueError(f"rows of table {table!r}, which is not one of the tables being written")
            writer = self.writers[table] = FileWriter(self.specs[table], self.task)
        writer.write(batch)

    def close(self) -> list[tuple[str, dict[str, Any]]]:
        """(table, file record) of every file written, all files closed."""
        try:
            return [(table, record) for table, writer in self.writers.items() for record in writer.close()]
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()


def current_task() -> int:
    """The Spark task's partition, which names its files apart from its siblings' (0 outside a task)."""
    from pyspark import TaskContext  # in a task pyspark is loaded already

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def write_files_task(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: write this partition's rows, yield its file records (a few bytes each)."""
    records = write_files(spec, batches, current_task())
    if records:
        yield pa.RecordBatch.from_pylist(records, schema=FILE_RECORD_ARROW)
